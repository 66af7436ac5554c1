"""Where a program's records go when no daemon takes them: memory or a spool file."""

from __future__ import annotations

import atexit
import collections
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd import spool
from counterd.env import ENV_SPOOL
from counterd.errors import BadInput
from counterd.markers import identity
from counterd.records import SuperstepRecord

if TYPE_CHECKING:
    from counterd.markers.recorder import Step


def _as_record(item: SuperstepRecord | Step) -> SuperstepRecord:
    return item if isinstance(item, SuperstepRecord) else item.record()


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
        os._exit, so an end-of-run message would never be written."""
        del self.record, self.closed  # back to the class's plain append
        self.record(rec)
        if getattr(rec, "rank", 0) in (0, None):
            print(f"counterd: supersteps are kept in this process's memory only and are lost "
                  f"at exit ({self.unkept}); run the program under `counterd record --out FILE "
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

    def begin(self, line: Mapping[str, Any]) -> None:  # begins need no durability in memory
        pass

    def record(self, rec: SuperstepRecord | Step) -> None:
        self._items.append(rec)  # list.append is atomic under the GIL

    closed = record


class SpoolSink:
    """Appends one JSON line per begin and per record to ``<spool>/<pid>.jsonl``.

    Each line is one ``write(2)`` on an O_APPEND descriptor, so a process killed at any point
    leaves whole lines only; a ``begin`` line with no matching record becomes an ``incomplete``
    record when the spool is collected. A write that fails (a full disk) never raises into the
    program: the line waits in a backlog of at most :data:`BACKLOG_LINES` lines, written
    before the next line once the disk takes it again; lines pushed out of a full backlog are
    counted in ``lost`` and reported once on stderr.
    """

    BACKLOG_LINES = 65536

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._fd: int | None = None
        self._pid = -1
        self._backlog: collections.deque[bytes] = collections.deque()
        self.lost = 0

    def _descriptor(self) -> int:
        pid = identity.pid
        if self._fd is None or self._pid != pid:  # first use, or we are a forked child
            path = spool.path_for(self.directory, pid)
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                                   0o644)
            except OSError as exc:
                raise BadInput(f"cannot write the marker spool {path}: {exc.strerror}",
                               f"make {self.directory} writable or unset {ENV_SPOOL}") from exc
            self._pid = pid
        return self._fd

    def _descriptor_fast(self) -> int:
        fd = self._fd
        return fd if fd is not None and self._pid == identity.pid else self._descriptor()

    def _write(self, line: bytes) -> None:
        fd = self._descriptor_fast()
        if not self._backlog:
            try:
                os.write(fd, line)
                return
            except OSError as exc:
                self._failed(exc)
        self._backlog.append(line)
        try:  # oldest first, so the file keeps the program's order
            while self._backlog:
                os.write(fd, self._backlog[0])
                self._backlog.popleft()
        except OSError:
            if len(self._backlog) > self.BACKLOG_LINES:
                self._backlog.popleft()
                self.lost += 1

    def _failed(self, exc: OSError) -> None:
        if not self._backlog and self.lost == 0:
            print(f"counterd: cannot write the marker spool {self.directory}: {exc.strerror}; "
                  f"keeping up to {self.BACKLOG_LINES} lines in memory until it can",
                  file=sys.stderr)
            atexit.register(self._report_loss)

    def _report_loss(self) -> None:
        if self.lost or self._backlog:
            print(f"counterd: {self.lost + len(self._backlog)} marker spool lines were not "
                  f"written to {self.directory} (disk full?): those supersteps have no record",
                  file=sys.stderr)

    def begin(self, line: Mapping[str, Any]) -> None:
        self._write(spool.encode_line(spool.BEGIN, line))

    def record(self, rec: SuperstepRecord | Step) -> None:
        self._write(spool.encode_line(spool.RECORD, _as_record(rec).to_json()))

    closed = record
