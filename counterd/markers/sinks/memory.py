"""Records kept in the process's memory (the default when nothing else is configured)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.data.records import Param, SuperstepRecord
from counterd.markers import identity

if TYPE_CHECKING:
    from counterd.markers.sinks.base import Sink
    from counterd.markers.step import Step


class MemorySink:
    """Keeps records in the process (the default when nothing else is configured).

    A superstep ended by the marker is kept as its closed :class:`Step`; the record is built
    when :attr:`records` is read (building and validating a record costs more than the rest of
    a marker pair). The records are identical to ones built at the end marker.
    """

    def __init__(self, unkept: str | None = None) -> None:
        self._items: list[SuperstepRecord | Step] = []
        if unkept:  # no sink was configured at all: say so at the first record, on rank 0
            self.unkept = unkept
            self.record = self.closed = self._first  # type: ignore[method-assign]

    def _first(self, rec: SuperstepRecord | Step) -> None:
        """The first record of a sink nobody configured: one line on stderr (from processor
        0, so once per run), then plain appends. A multiprocessing worker ends with
        os._exit, so an end-of-run message would never be written. (A compiled lane that took
        this method before the first record calls it again: it appends then.)"""
        vars(self).pop("record", None)  # back to the class's plain append
        vars(self).pop("closed", None)
        self._items.append(rec)
        unkept, self.unkept = self.unkept, ""
        if unkept and getattr(rec, "rank", 0) in (0, None):
            print(f"counterd: supersteps are kept in this process's memory only and are lost "
                  f"at exit ({unkept}); run the program under `counterd record --out FILE "
                  "-- CMD`, or start the daemon, to keep them", file=sys.stderr, flush=True)

    @property
    def records(self) -> list[SuperstepRecord]:
        items = self._items
        n = len(items)  # appended concurrently beyond n: left for the next read
        for i in range(n):
            item = items[i]
            if not isinstance(item, SuperstepRecord):
                items[i] = item.record()  # assignment of one element is atomic under the GIL
        return items[:n]  # type: ignore[return-value]

    # -- the sink interface (counterd.markers.sinks.base.Sink) ----------------------------
    takes_scratch = True  # a scratch_sink() of it keeps nothing
    durable = False
    daemon = False
    degraded: str | None = None

    def open(self, ctx: identity.Ctx, index: int, name: str, rank: int, cpu: int,
             begin_ns: int, params: dict[str, Param]) -> int:
        return 0  # begins need no durability in memory (the recorder does not call it)

    def begin(self, line: Mapping[str, Any], count: Sequence[str] | None = None) -> None:
        pass  # begins need no durability in memory

    def record(self, rec: SuperstepRecord | Step) -> None:
        self._items.append(rec)  # list.append is atomic under the GIL

    closed = record

    def flush(self, timeout_s: float | None = None) -> bool:
        return True

    def close(self, timeout_s: float | None = None) -> None:
        pass

    def release(self, timeout_s: float | None = None) -> None:
        pass

    def prepare(self, ctx: identity.Ctx) -> None:
        pass

    def lane_args(self, ctx: identity.Ctx, names: tuple[str, ...]) -> dict[str, Any] | None:
        # The plain sink appends the step; one nobody configured says so at its first record.
        plain = "closed" not in vars(self)
        return dict(on_closed=self._items.append if plain else self.closed, writer=None,
                    sink_open=None, sink_closed=None, c_open=0, c_close=0)

    def lane_made(self, lane: Any) -> None:
        pass

    def kept(self) -> list[SuperstepRecord]:
        return list(self.records)

    def where(self) -> tuple[Path | None, Path | str]:
        return None, "off"

    def in_child(self, fresh: Sink) -> Sink:
        return self  # the child's copy of the parent's list, in the child

    def scratch_sink(self, wait_s: float) -> MemorySink:
        return MemorySink()

    def discard(self, wait_s: float) -> None:
        pass
