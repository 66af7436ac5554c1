"""Canonical counter names: the contract between counter sources, records and cost models.

Every backend maps its own event names onto these. Units are part of the definition:
writebacks are counted in cache lines of the level they leave (DESIGN.md section 3; the seed
paper 004 counted L2->memory writebacks in 16-byte quadwords, which the predictor converts).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple


class Source(enum.StrEnum):
    """Where a counter value came from. Every value in a record carries one."""

    MEASURED = "measured"  # read from hardware or kernel counters while the program ran
    SIMULATED = "simulated"  # produced by a cache simulator from an address stream
    EXTRAPOLATED = "extrapolated"  # forecast from pilot runs at smaller sizes
    ASSUMED = "assumed"  # filled in from a declared assumption (e.g. uniform over banks)
    # Not read for this superstep (1-in-k sampling of short supersteps): the last measured
    # superstep of the same name and processor, scaled by the ratio of their times.
    SAMPLED = "sampled"


class CounterValue(NamedTuple):
    """One counter's value with its provenance.

    ``value`` is scaled for multiplexing (raw * enabled / running); ``ratio`` is
    time_running / time_enabled (1.0 when the counter ran all the time, or for simulation).
    A NamedTuple, not a dataclass: two are built per counter per superstep on the marker's hot
    path, and records validate them (ratio within [0, 1], finite value) on construction.
    """

    value: float
    source: Source
    ratio: float = 1.0
    raw: int | None = None


def scale(raw: int, enabled: int, running: int) -> tuple[float, float]:
    """Multiplexing correction: ``(raw * enabled / running, running / enabled)``.

    A counter that was never on the PMU (``running == 0``) gives ``(0.0, 0.0)``: nothing can be
    extrapolated from it. ``running > enabled`` (clock skew) is clamped to ratio 1.
    """
    if running <= 0:
        return 0.0, 0.0
    if running >= enabled:
        return float(raw), 1.0
    return raw * enabled / running, running / enabled


def measured(raw: int, enabled: int, running: int) -> CounterValue:
    """A counter the kernel counted ``raw`` while ``running`` of the ``enabled`` ns: its value
    corrected for multiplexing (:func:`scale`)."""
    value, ratio = scale(raw, enabled, running)
    return CounterValue(value, Source.MEASURED, ratio, raw)


@dataclass(frozen=True)
class Counter:
    name: str
    unit: str
    description: str
    # Seed 004 section 4.2: the R10000 counter this corresponds to, where there is one.
    r10000: str | None = None


COUNTERS: tuple[Counter, ...] = (
    Counter("loads", "instructions", "load instructions retired", "C0E2"),
    Counter("stores", "instructions", "store instructions retired", "C0E3"),
    Counter("l1d_misses", "lines", "L1 data cache misses (loads and stores)", "C1E9"),
    Counter("l2_misses", "lines", "L2 cache misses (data)", "C1EA"),
    Counter("l3_misses", "lines", "last-level (L3) cache misses (data)"),
    Counter("l1d_writebacks", "lines", "dirty lines written back from L1 to L2", "C1E6"),
    Counter("l2_writebacks", "lines", "dirty lines written back from L2 to the next level",
            "C0E7 (counted there in 16-byte quadwords)"),
    Counter("l3_writebacks", "lines", "dirty lines written back from L3 to memory"),
    Counter("dtlb_misses", "misses", "data TLB misses"),
    Counter("cycles", "cycles", "CPU cycles while the target ran"),
    Counter("instructions", "instructions", "instructions retired"),
    Counter("branch_misses", "instructions", "branch instructions mispredicted"),
    Counter("task_clock_ns", "ns", "CPU time of the target (kernel task clock)"),
    Counter("page_faults", "faults", "page faults (minor and major)"),
    Counter("context_switches", "switches", "context switches of the target"),
)

BY_NAME: dict[str, Counter] = {c.name: c for c in COUNTERS}
NAMES: tuple[str, ...] = tuple(c.name for c in COUNTERS)

# Memory-hierarchy counters the cost function F needs, in cache-level order.
MISS_COUNTERS = ("l1d_misses", "l2_misses", "l3_misses")
WRITEBACK_COUNTERS = ("l1d_writebacks", "l2_writebacks", "l3_writebacks")


def check_names(names: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Validate canonical counter names; raise UnknownCounter naming the bad one and the choices."""
    from counterd.data.errors import UnknownCounter

    for name in names:
        if name not in BY_NAME:
            raise UnknownCounter(name, NAMES)
    return tuple(names)
