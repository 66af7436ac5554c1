"""The ``sim`` backend: count what a known address stream does to a cache hierarchy.

DESIGN.md section 4 ("sim"): for programs whose address stream is known (every microbenchmark),
simulate the host's cache hierarchy, count per processor and per memory bank, and mark every
value ``simulated``. This module adapts the simulator (:mod:`counterd.sim`) and the machine it
simulates (:mod:`counterd.machine`) to the Backend interface (counterd/backends/base.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from counterd.backends.base import THIS_THREAD, Capability, CounterValue, Reading, Target
from counterd.data.errors import BadInput
from counterd.data.events import NAMES, Source, check_names
from counterd.machine import current
from counterd.machine.geometry import Geometry
from counterd.machine.memory import BankMap
from counterd.sim import (
    BankCounts,
    CacheSim,
    EngineName,
    ProcessorCounts,
    Stream,
    canonical_values,
    native_status,
)
from counterd.sim.counts import _LEVEL_COUNTERS, UNSUPPORTED_REASON

_OTHER_MEMORY_COUNTERS = ("loads", "stores", "dtlb_misses")
NO_STREAM_REASON = ("no address stream was declared for this superstep: use step.feed(...) "
                    "or another backend")


@dataclass
class SimGroup:
    """An open sim counter group: the program declares with :meth:`feed` the stream it
    executes; :meth:`read` returns the cumulative simulated counters."""

    events: tuple[str, ...]
    target: Target
    sim: CacheSim
    _closed: bool = field(default=False, repr=False)
    _fed: int = field(default=0, repr=False)  # feed() calls so far
    # The last reading and the feed() count it was taken at: the simulated counts change only
    # by feed() and flush(), so a marker reading again with nothing fed between (an empty
    # superstep, the marker-cost calibration) costs a comparison, not the ~40 us of building
    # the counts anew.
    _last: tuple[int, Reading] | None = field(default=None, repr=False)

    def _check_open(self) -> None:
        if self._closed:
            raise BadInput("this sim counter group is closed", "open a new one with open()")

    def feed(self, stream: Stream | Iterable[Stream]) -> None:
        self._check_open()
        self.sim.feed(stream)
        self._fed += 1

    def flush(self) -> None:
        self._check_open()
        self.sim.flush()
        self._last = None

    def read(self) -> Reading:
        self._check_open()
        last = self._last
        if last is not None and last[0] == self._fed:
            return last[1]
        values, unsupported = canonical_values(self.sim.counts(), self.events)
        reading = Reading(values, 0, 0, unsupported)
        self._last = (self._fed, reading)
        return reading

    def read_raw(self) -> tuple[int, Reading]:
        """A reading with the number of streams fed so far (the markers' read)."""
        return self._fed, self.read()

    def delta_raw(self, start: tuple[int, Reading], stop: tuple[int, Reading]
                  ) -> tuple[dict[str, CounterValue], dict[str, str]]:
        """A superstep's counters and what it could not count. A superstep that declared no
        stream simulated nothing: its counters are absent with the reason, never 0."""
        (fed0, r0), (fed1, r1) = start, stop
        if fed1 == fed0:
            return {}, {**r1.unsupported, **{e: NO_STREAM_REASON for e in r1.values}}
        return r1.delta(r0), dict(r1.unsupported)

    def bank_counts(self) -> BankCounts:
        return self.sim.counts().banks

    def counts(self) -> ProcessorCounts:
        """Everything counted, beyond the canonical counters (per-level hits, wb_misses)."""
        return self.sim.counts()

    def close(self) -> None:
        self._closed = True


class SimBackend:
    """Counter source that simulates declared address streams (DESIGN.md section 4, "sim").

    ``geometry`` and ``bankmap`` default to this process's machine (:func:`counterd.machine.
    current`: sysfs with a documented fallback, or a machine file), whose bank map is declared
    (and marked assumed) unless a machine file gives it.
    """

    name = "sim"
    source = Source.SIMULATED

    def __init__(self, geometry: Geometry | None = None, bankmap: BankMap | None = None,
                 engine: Literal["auto", "native", "python"] = "auto") -> None:
        self._bank_note = ""
        if geometry is None or bankmap is None:
            machine = current()
            geometry = geometry if geometry is not None else machine.geometry
            if bankmap is None:
                bankmap = machine.bank_map
                self._bank_note = (" (assumed: not discoverable)" if machine.bank_map_assumed
                                   else f" ({machine.bank_provenance})")
        self.geometry: Geometry = geometry
        self.bankmap: BankMap = bankmap
        self.engine = engine

    def engine_name(self) -> EngineName:
        ok, _ = native_status()
        return "native" if ok and self.engine != "python" else "python"

    def available(self) -> Capability:
        ok, why = native_status()
        engine = self.engine_name()
        note = "" if engine == "native" else f" ({why})" if not ok else ""
        reason = (f"simulates {self.geometry.spec()} with the {engine} engine{note}; "
                  f"geometry from {self.geometry.source}; banks: {self.bankmap.banks} x "
                  f"{self.bankmap.interleave_bytes} B{self._bank_note}")
        depth = {lv.level for lv in self.geometry.levels}
        counters: dict[str, str | None] = {}
        for name in NAMES:
            if name in _LEVEL_COUNTERS and _LEVEL_COUNTERS[name] not in depth:
                counters[name] = f"the simulated geometry has no L{_LEVEL_COUNTERS[name]}"
            elif name in _LEVEL_COUNTERS or name in _OTHER_MEMORY_COUNTERS:
                counters[name] = None
            else:  # cycles, instructions, task_clock_ns, page_faults, and any added later
                counters[name] = UNSUPPORTED_REASON
        return Capability(self.name, True, reason, counters)

    def open(self, events: Sequence[str], target: Target = THIS_THREAD) -> SimGroup:
        return SimGroup(check_names(tuple(events)), target,
                        CacheSim(self.geometry, self.bankmap, self.engine))



__all__ = ["SimBackend", "SimGroup"]
