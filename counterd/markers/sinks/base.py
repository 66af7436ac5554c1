"""What every sink is: the :class:`Sink` interface, and what the binary-frame sinks share.

A sink is where one process's markers go: :mod:`~counterd.markers.sinks.memory`,
:mod:`~counterd.markers.sinks.spool` (the spool file ``counterd record`` reads) or
:mod:`~counterd.markers.sinks.socket` (the daemon's socket).
:func:`counterd.markers.sinks.make_sink` chooses one, once; the recorder, the API and the
compiled lane use it through this interface alone, never by its type, as
prometheus/client_python's metrics use the value class its ``values.get_value_class()`` chose.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from counterd.data.records import Param, SuperstepRecord
from counterd.markers import identity
from counterd.markers.step import Step, parts
from counterd.wire import framing as protocol  # the framing, not the typed frames: cheap to import


class Sink(Protocol):
    """Where a process's supersteps go. What the recorder asks of every sink:

    * at a begin: :meth:`open` (a durable sink: an OPEN frame or a begin line, the record's
      half that survives a kill; returns what :attr:`Step.sent` holds, 0 if its end must go as
      a whole record) or :meth:`begin` (a begin line; ``count``: the daemon counts the
      superstep's thread, and the call waits for its reply);
    * at an end: :meth:`closed` (the closed step, whose record is built when needed) or
      :meth:`record` (a record built already: an unmatched end, an incomplete one at exit);
    * :meth:`flush` (True once all it was given is where it goes), :meth:`close`
      (its files or connection closed) and :meth:`release` (the process lets go of it: at
      exit, or when its recorder is replaced);
    * for the compiled lane (:mod:`counterd.markers.native`): :meth:`lane_args`, what a lane
      writing into it is given, and :meth:`lane_made`;
    * :meth:`prepare` (its file or connection and the context declared now, before the
      program's first barrier), :meth:`kept` (the records it holds in memory),
      :meth:`where` and :meth:`in_child` (what a forked child's recorder goes to), and
      :meth:`scratch_sink` (a sink of the same kind that keeps nothing, for the calibration, let go
      of by :meth:`discard`).
    """

    durable: bool  # a begin leaves a trace that survives a kill (memory: no)
    daemon: bool  # records go to the daemon, which can count the process's threads
    degraded: str | None  # why the daemon is not reachable now; None where connected or no daemon

    @property
    def takes_scratch(self) -> bool: ...  # scratch_sink() can make one

    def open(self, ctx: identity.Ctx, index: int, name: str, rank: int, cpu: int,
             begin_ns: int, params: dict[str, Param]) -> int: ...

    def begin(self, line: Mapping[str, Any], count: Sequence[str] | None = None) -> Any: ...

    def closed(self, step: Step) -> None: ...

    def record(self, rec: SuperstepRecord) -> None: ...

    def flush(self, timeout_s: float | None = None) -> bool: ...

    def close(self, timeout_s: float | None = None) -> None: ...

    def release(self, timeout_s: float | None = None) -> None: ...

    def prepare(self, ctx: identity.Ctx) -> None: ...

    def lane_args(self, ctx: identity.Ctx, names: tuple[str, ...]) -> dict[str, Any] | None: ...

    def lane_made(self, lane: Any) -> None: ...

    def kept(self) -> list[SuperstepRecord]: ...

    def where(self) -> tuple[Path | None, Path | str]: ...

    def in_child(self, fresh: Sink) -> Sink: ...

    def scratch_sink(self, wait_s: float) -> Sink | None: ...

    def discard(self, wait_s: float) -> None: ...


def as_record(item: SuperstepRecord | Step) -> SuperstepRecord:
    return item if isinstance(item, SuperstepRecord) else item.record()


# What the binary-frame sinks (the spool's mapped file, the daemon's socket) send alike.

def context_payload(seq: int, c: int, ctx: identity.Ctx, names: Sequence[str],
                    scratch: bool = False) -> dict[str, Any]:
    """The CONTEXT frame's payload declaring ``ctx`` with counter ``names`` as ``c`` (a
    ``scratch`` one: of a calibration, nothing kept; see docs/protocol.md)."""
    return {"s": seq, "c": c, "run_id": ctx[0], "pid": ctx[1], "host": ctx[2],
            "backend": ctx[3], "counters": list(names),
            **({} if ctx[4] is None else {"marker_ns": ctx[4]}),
            **({"scratch": True} if scratch else {})}


def begin_line(ctx: identity.Ctx, index: int, name: str, rank: int, cpu: int, begin_ns: int,
               params: Mapping[str, Any]) -> dict[str, Any]:
    """The begin line of a superstep of ``ctx`` (what an OPEN stands for)."""
    return {"run_id": ctx[0], "index": index, "name": name, "rank": rank, "pid": ctx[1],
            "cpu": cpu, "begin_ns": begin_ns, "params": params, "backend": ctx[3],
            "host": ctx[2], "marker_ns": ctx[4]}


def close_frame(step: Step, context_id: Callable[[identity.Ctx, tuple[str, ...]], int | None],
                next_seq: Callable[[], int]) -> bytes | None:
    """The CLOSE frame of an ended ``step``, its counters named by the context
    ``context_id`` gives (declaring it if new), numbered ``next_seq()``; None when it does not
    fit one (an unknown flag or source, a value out of range, no context, the text of an
    exception: a CLOSE has no room for it, the RECORD sent instead carries it; the compiled
    lane hands such a step to the Python path alike)."""
    if step.end_ns is None or step.exception is not None:
        return None
    ctx = step.recorder.context
    counters, flags, unsupported = parts(step, ctx)
    bits = protocol.flag_bits(flags)
    if bits is None:
        return None
    try:
        c = context_id(ctx.key, tuple(counters))
        if c is None:
            return None
        return protocol.encode_close(next_seq(), c, step.index, step.begin_ns, step.end_ns,
                                     bits, counters.values(), unsupported)
    except (KeyError, struct.error, ValueError):
        return None
