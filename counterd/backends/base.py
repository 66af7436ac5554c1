"""The one interface every counter source implements (DESIGN.md section 4).

A backend answers ``available()`` with a :class:`Capability` (never raises) and ``open()`` s a
:class:`CounterGroup` for a set of canonical counters on one :class:`Target`. A group is read
as a whole (``read()`` returns a :class:`Reading`, cumulative since open) and closed once.
Backends translate OS errors into :mod:`counterd.data.errors` at this boundary.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from counterd.data.events import CounterValue, Source


@dataclass(frozen=True)
class Target:
    """What to count. ``pid=0, tid=0``: the calling thread. ``cpu=-1``: on whichever CPU it runs.

    ``tid`` names one thread of ``pid``; when only ``pid`` is given, the backend counts that
    process's main thread (and, with ``inherit``, threads it creates after open).
    ``pid=-1`` with ``cpu>=0``: everything on that CPU (system-wide; needs privileges).
    """

    pid: int = 0
    tid: int = 0
    cpu: int = -1
    inherit: bool = False

    def __post_init__(self) -> None:
        if self.pid < -1 or self.tid < 0 or self.cpu < -1:
            raise ValueError(f"invalid target {self}")
        if self.pid == -1 and self.cpu < 0:
            raise ValueError("a system-wide target (pid=-1) needs a cpu")

    @classmethod
    def this_thread(cls) -> Target:
        return cls()

    @property
    def kernel_tid(self) -> int:
        """The id perf_event_open takes: 0 for the caller, else the tid or pid."""
        return self.tid or self.pid

    def describe(self) -> str:
        if self.pid == -1:
            return f"cpu {self.cpu}"
        if self.pid == 0 and self.tid == 0:
            return f"this thread (pid {os.getpid()})"
        who = f"tid {self.tid}" if self.tid else f"pid {self.pid}"
        return who if self.cpu < 0 else f"{who} on cpu {self.cpu}"


THIS_THREAD = Target()


@dataclass(frozen=True)
class Reading:
    """A snapshot of a group: cumulative values since the group was opened."""

    values: Mapping[str, CounterValue]
    time_enabled_ns: int = 0
    time_running_ns: int = 0
    # Counters that were asked for but could not be counted, with the reason.
    unsupported: Mapping[str, str] = field(default_factory=dict)
    # Per counter, its own (time_enabled, time_running) where the counters come from several
    # kernel groups that the kernel multiplexes separately; a counter not here has the
    # reading's times (for several groups, those of the most multiplexed one).
    times: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def delta(self, earlier: Reading) -> dict[str, CounterValue]:
        """Per-counter difference ``self - earlier`` (a superstep's counts), each measured
        counter scaled by its own group's span and carrying that span's ratio."""
        out: dict[str, CounterValue] = {}
        default_now = (self.time_enabled_ns, self.time_running_ns)
        default_then = (earlier.time_enabled_ns, earlier.time_running_ns)
        for name, now in self.values.items():
            before = earlier.values.get(name)
            if before is None:
                continue
            if now.source is Source.MEASURED and now.raw is not None and before.raw is not None:
                # Scale the raw delta by the span's own enabled/running times: the difference of
                # two cumulatively scaled values is not the scaled difference.
                en, run = self.times.get(name, default_now)
                en0, run0 = earlier.times.get(name, default_then)
                de, dr = en - en0, run - run0
                raw = now.raw - before.raw
                if de > 0 and dr > 0:
                    out[name] = CounterValue(raw * de / dr, now.source, min(1.0, dr / de), raw)
                elif de > 0:  # enabled but never scheduled on the PMU during the span
                    out[name] = CounterValue(0.0, now.source, 0.0, raw)
                else:
                    out[name] = CounterValue(float(raw), now.source, 1.0, raw)
            else:
                out[name] = CounterValue(now.value - before.value, now.source,
                                         min(now.ratio, before.ratio), None)
        return out


@dataclass(frozen=True)
class Capability:
    """What a backend can do on this host. ``counters`` maps each canonical counter it knows to
    ``None`` (supported) or the reason it is not."""

    backend: str
    available: bool
    reason: str
    counters: Mapping[str, str | None] = field(default_factory=dict)

    def supports(self, counter: str) -> bool:
        return self.available and counter in self.counters and self.counters[counter] is None


@runtime_checkable
class CounterGroup(Protocol):
    """An open set of counters on one target, read atomically as a whole."""

    events: tuple[str, ...]
    target: Target

    def read(self) -> Reading: ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """A counter source. Implementations live in ``counterd/backends/<name>.py``."""

    name: str
    source: Source

    def available(self) -> Capability: ...

    def open(self, events: Sequence[str], target: Target = THIS_THREAD) -> CounterGroup: ...
