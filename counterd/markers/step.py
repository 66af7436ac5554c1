"""An open superstep and how its record is built: the level below the recorder and the sinks.

A :class:`Step` is what ``begin()`` returns; once ended it holds what its record is built from,
and :func:`materialise` builds the record, off the marker's hot path, from the step and the
:class:`Context` every record of its process shares. The sinks (which keep closed steps and build
records or CLOSE frames when they need them) and the compiled lane (whose steps read as a
``Step``) use these functions: none of them reaches into the recorder to build a record.
:class:`Owner` is what a step, a thread's state and a lane need of their recorder.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from counterd.backends.base import CounterGroup, CounterValue, Reading
from counterd.data.records import (
    INT64_MAX,
    INT64_MIN,
    MAX_NAME_CHARS,
    MAX_PARAMS,
    MAX_VALUE_CHARS,
    Param,
    SuperstepRecord,
    exception_text,
)
from counterd.markers import identity, sampling


@dataclass(frozen=True, slots=True)
class Context:
    """What every record of one recorder shares, fixed where its counters are resolved (a new
    one replaces it: at each thread's first marker, after the calibration).

    ``uncounted`` is why nothing was counted where a backend that counts in the process could
    not (each record without counters then names it under ``"*"``); None otherwise."""

    run_id: str
    pid: int
    host: str
    backend: str  # the label the records carry
    marker_ns: int | None  # the calibrated cost of one marker pair (None: not measured)
    uncounted: str | None = None
    # The tuple the sinks declare (a daemon CONTEXT, a spool's) and the lanes carry.
    key: identity.Ctx = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.run_id, self.pid, self.host, self.backend,
                                         self.marker_ns))


class Owner(Protocol):
    """What a step, a thread's state and a lane need of the recorder they belong to
    (:class:`counterd.markers.recorder.Recorder`)."""

    run_id: str
    pid: int
    context: Context

    def _state(self) -> ThreadState: ...

    def _end(self, step: Step | None, name: str | None) -> SuperstepRecord | Step: ...

    def _orphan(self, lane: Any) -> None: ...


class Step:
    """An open superstep, returned by ``begin()`` and by ``with superstep(...) as step``.

    Once ended it also holds what its record is built from (``end_ns``, ``stop``, ``end_cpu``,
    ``unsupported``): sinks keep the closed step and build the record only when it is needed
    (:meth:`record`), off the marker's hot path.
    """

    __slots__ = ("recorder", "index", "name", "rank", "cpu", "begin_ns", "params", "start",
                 "flags", "closed", "streams", "end_ns", "stop", "end_cpu", "unsupported",
                 "sent", "_record", "delta", "dropped", "basis", "sample_state", "state",
                 "exception")

    def __init__(self, recorder: Owner, index: int, name: str, rank: int, cpu: int,
                 begin_ns: int, params: dict[str, Param], start: Any,
                 flags: frozenset[str]) -> None:
        self.recorder = recorder
        self.index = index
        self.name = name
        self.rank = rank
        self.cpu = cpu
        self.begin_ns = begin_ns
        self.params = params
        self.start = start
        self.flags = flags
        self.closed = False
        self.streams: list[Any] = []
        self.end_ns: int | None = None
        self.stop: Any = None  # the group's read at the end (raw tuple or Reading)
        self.end_cpu = -1
        self.unsupported: Mapping[str, str] | None = None  # the thread's, at the end
        self.sent = 0  # SocketSink connection number its OPEN went on (0: none)
        self.dropped: Mapping[str, str] | None = None  # params (and name) that were not JSON
        self._record: SuperstepRecord | None = None
        # Sampling (counterd.markers.sampling): what a superstep whose counters were not read
        # is estimated from, or the state a measured one updates at its end.
        self.basis: sampling.Basis | None = None
        self.sample_state: sampling.NameState | None = None
        self.state: ThreadState | None = None  # the thread state it began in
        self.exception: str | None = None  # what its body raised (records.exception_text)
        # Turns (start, stop) into (counter values, unsupported): the group's raw decoder.
        self.delta: Callable[[Any, Any], tuple[dict[str, CounterValue], Mapping[str, str]]] \
            = reading_delta

    def record(self) -> SuperstepRecord:
        """The record of this (ended) superstep, built once."""
        rec = self._record
        if rec is None:
            rec = self._record = materialise(self, self.recorder.context)
        return rec

    def feed(self, stream: Any) -> None:
        """Declare an address stream this superstep executes (used by the ``sim`` backend; a
        no-op for backends that count real hardware). The stream is simulated when the
        superstep ends, after its end time is taken: simulation is never part of the time."""
        if getattr(self.recorder._state().group, "feed", None) is not None:
            self.streams.append(stream)

    def __enter__(self) -> Step:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.flags = self.flags | {"exception"}
            if self.exception is None:  # its text: type and message, never the traceback
                self.exception = exception_text(exc if exc is not None else exc_type)
        self.recorder._end(self, None)


def reading_delta(start: Reading, stop: Reading
                  ) -> tuple[dict[str, CounterValue], Mapping[str, str]]:
    return stop.delta(start), stop.unsupported


class ThreadState:
    """What one thread of one process needs on the marker's hot path, found with one lookup."""

    __slots__ = ("pid", "stack", "group", "unsupported", "rank", "daemon_counts", "read",
                 "delta", "lane", "sampling", "owner", "__weakref__")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stack: list[Step] = []
        self.group: CounterGroup | None = None
        self.unsupported: dict[str, str] = {}
        self.rank: int | None = None
        self.daemon_counts: bool | None = None  # decided at this thread's first begin
        # The group's cheapest read and its decoder (perf: raw tuples, decoded lazily).
        self.read: Callable[[], Any] | None = None
        self.delta: Callable[[Any, Any], tuple[dict[str, CounterValue], Mapping[str, str]]] \
            = reading_delta
        # The compiled hot path for this thread (counterd.markers.native), or None.
        self.lane: Any = None
        self.sampling: dict[str, sampling.NameState] = {}  # superstep name -> its sampling
        self.owner: Callable[[], Owner | None] | None = None  # its recorder, weakly

    def __del__(self) -> None:
        # The thread is gone: its lane's open steps stay for the recorder's at-exit sweep, as
        # the Python path's do (a weak reference: a replaced recorder is not kept alive).
        rec = self.owner() if self.owner is not None else None
        if self.lane is not None:
            # Its group goes with this state: the lane's pages would keep the counters open.
            self.lane.unmap()
            if rec is not None:
                rec._orphan(self.lane)


NO_FLAGS: frozenset[str] = frozenset()
NESTED = frozenset({"nested"})
_INCOMPLETE = frozenset({"incomplete"})
_MIGRATED = frozenset({"migrated"})
_MULTIPLEXED = frozenset({"multiplexed"})
_UNSUPPORTED = frozenset({"unsupported_counters"})
_DROPPED = frozenset({"dropped_params"})
_SAMPLED = frozenset({"sampled"})


def parts(step: Any, ctx: Context) -> tuple[dict[str, CounterValue], frozenset[str],
                                             dict[str, str]]:
    """A closed step's counters, flags and unsupported counters (end_ns None: it never
    ended). ``step``: a :class:`Step`, or a compiled lane's step, which reads as one."""
    counters: dict[str, CounterValue] = {}
    unsupported = dict(step.unsupported) if step.unsupported else {}
    if step.dropped:
        unsupported.update(step.dropped)
        flags_dropped = True
    else:
        flags_dropped = False
    start, stop = step.start, step.stop
    flags = step.flags
    if start is not None and stop is not None:
        counters, group_unsupported = step.delta(start, stop)
        if group_unsupported:
            unsupported.update(group_unsupported)
    elif step.basis is not None and step.end_ns is not None:
        counters = step.basis.estimate(step.end_ns - step.begin_ns)
        unsupported.update(step.basis.unsupported)
        flags = flags | _SAMPLED
    elif ctx.uncounted:
        unsupported.setdefault("*", ctx.uncounted)
    if step.end_ns is None:
        flags = flags | _INCOMPLETE
    elif step.end_cpu != step.cpu:
        flags = flags | _MIGRATED
    for cv in counters.values():
        if cv.ratio < 1.0:
            flags = flags | _MULTIPLEXED
            break
    if len(unsupported) > len(step.dropped or ()):
        flags = flags | _UNSUPPORTED
    if flags_dropped:
        flags = flags | _DROPPED
    return counters, flags, unsupported


def materialise(step: Any, ctx: Context) -> SuperstepRecord:
    """The record of a closed step (a :class:`Step` or a lane's) of the recorder whose
    context is ``ctx``."""
    counters, flags, unsupported = parts(step, ctx)
    return SuperstepRecord(
        run_id=ctx.run_id, index=step.index, name=step.name, rank=step.rank,
        pid=ctx.pid, cpu=step.cpu, begin_ns=step.begin_ns, end_ns=step.end_ns,
        counters=counters, params=step.params, flags=flags,
        unsupported=unsupported, backend=ctx.backend, host=ctx.host,
        marker_ns=ctx.marker_ns, exception=step.exception)


def clean_marker(name: str, params: dict[str, Any]
                 ) -> tuple[str, dict[str, Param], dict[str, str] | None]:
    """The name and params of a marker as every sink can encode them (JSON: finite numbers,
    valid UTF-8), and what was dropped or replaced, for the record's ``unsupported``
    (``param:<key>`` or ``name`` -> why). A marker never raises for its params: the issue
    found a NaN param raising ValueError inside the user's program and losing the record."""
    if name.__class__ is str and name.isascii() and len(name) <= MAX_NAME_CHARS \
            and len(params) <= MAX_PARAMS:  # the common case, on the marker's path
        for key, value in params.items():
            t = value.__class__
            if not (key.__class__ is str and key.isascii() and len(key) <= MAX_NAME_CHARS and (
                    (t is int and INT64_MIN <= value <= INT64_MAX) or t is bool
                    or (t is str and value.isascii() and len(value) <= MAX_VALUE_CHARS)
                    or (t is float and value - value == 0.0))):  # inf - inf, nan - nan: nan
                break
        else:
            return name, params, None
    dropped: dict[str, str] = {}
    if not isinstance(name, str):
        dropped["name"] = f"a {type(name).__name__}, not a string"
        name = str(name)
    if not name.isascii() and not _utf8(name):
        dropped["name"] = "not valid UTF-8 (lone surrogates replaced)"
        name = name.encode("utf-8", "replace").decode()
    if len(name) > MAX_NAME_CHARS:
        dropped["name"] = f"{len(name)} characters, cut to {MAX_NAME_CHARS}"
        name = name[:MAX_NAME_CHARS]
    clean: dict[str, Param] = {}
    for key, value in params.items():
        why = None
        if not isinstance(key, str) or not _utf8(key) or len(key) > MAX_NAME_CHARS:
            why = f"the key is not valid UTF-8 text of at most {MAX_NAME_CHARS} characters"
        elif len(clean) >= MAX_PARAMS:
            why = f"more than {MAX_PARAMS} params"
        elif isinstance(value, bool):
            pass
        elif isinstance(value, str):
            if not value.isascii() and not _utf8(value):
                why = "not valid UTF-8 (a lone surrogate)"
            elif len(value) > MAX_VALUE_CHARS:
                why = f"a string of {len(value)} characters, more than {MAX_VALUE_CHARS}"
        elif isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                why = "an integer beyond 64 bits"
        elif isinstance(value, float):
            if not math.isfinite(value):
                why = f"not finite: {value}"
        elif isinstance(value, numbers.Integral):
            value = int(value)
        elif isinstance(value, numbers.Real) and math.isfinite(float(value)):
            value = float(value)
        else:
            why = f"a {type(value).__name__}, not a finite int, float, str or bool"
        if why is None:
            clean[key] = value
        else:
            dropped[f"param:{_printable(key)}"] = why
    return name, clean, dropped or None


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _printable(key: Any) -> str:
    return str(key).encode("utf-8", "replace").decode()
