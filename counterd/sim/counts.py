"""What a simulation counts: per cache level, per memory bank, per processor.

:class:`ProcessorCounts` (with its :class:`LevelCounts` and :class:`BankCounts`) are the
cumulative counts of one processor, :class:`SimResult` what :func:`counterd.sim.simulate`
returns, and :func:`canonical_values` turns counts into canonical counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from counterd.data.events import CounterValue, Source, check_names
from counterd.machine.geometry import Geometry
from counterd.machine.memory import BankMap

# Which engine counted (counterd.sim.engines): the compiled one, or the Python reference.
EngineName = Literal["native", "python"]
UNSUPPORTED_REASON = "simulation counts memory accesses, not time or instructions"
_LEVEL_PREFIX = {1: "l1d", 2: "l2", 3: "l3"}
# Canonical counters simulation gives: per cache level (when the geometry has it) and these.
_LEVEL_COUNTERS = {f"{p}_{what}": lv for lv, p in _LEVEL_PREFIX.items()
                   for what in ("misses", "writebacks")}


@dataclass(frozen=True)
class LevelCounts:
    """Counts of one cache level. ``hits``/``misses``: demand requests (loads and stores at L1,
    fills from the level above below it); ``wb_hits``/``wb_misses``: writebacks arriving from
    the level above; ``writebacks``: dirty lines this level evicted (or flushed), in its lines.
    ``skipped``/``wb_skipped``: demand requests and writebacks that arrived in a set a
    set-sampled simulation does not simulate (:mod:`counterd.sim.sampling`; else 0)."""

    level: int
    hits: int = 0
    misses: int = 0
    wb_hits: int = 0
    wb_misses: int = 0
    writebacks: int = 0
    skipped: int = 0
    wb_skipped: int = 0

    @property
    def total_misses(self) -> int:
        """Lines allocated on a miss, demand or writeback: canonical ``lN_misses``."""
        return self.misses + self.wb_misses

    def __sub__(self, other: LevelCounts) -> LevelCounts:
        return LevelCounts(self.level, *(getattr(self, f) - getattr(other, f) for f in
                                         LEVEL_COUNT_FIELDS))


# LevelCounts' counts, in order (cachesim.c's per-level counters).
LEVEL_COUNT_FIELDS = ("hits", "misses", "wb_hits", "wb_misses", "writebacks", "skipped",
                      "wb_skipped")


@dataclass(frozen=True)
class BankCounts:
    """Seed 004's LM(b) (last-level misses served by bank b) and WB(b) (last-level writebacks
    to bank b), in last-level lines."""

    lm: tuple[int, ...]
    wb: tuple[int, ...]

    def touched(self) -> frozenset[int]:
        """Banks that served a miss or received a writeback."""
        return frozenset(b for b, (m, w) in enumerate(zip(self.lm, self.wb, strict=True))
                         if m or w)

    def __add__(self, other: BankCounts) -> BankCounts:
        return BankCounts(tuple(a + b for a, b in zip(self.lm, other.lm, strict=True)),
                          tuple(a + b for a, b in zip(self.wb, other.wb, strict=True)))

    def __sub__(self, other: BankCounts) -> BankCounts:
        return BankCounts(tuple(a - b for a, b in zip(self.lm, other.lm, strict=True)),
                          tuple(a - b for a, b in zip(self.wb, other.wb, strict=True)))


@dataclass(frozen=True)
class ProcessorCounts:
    """Cumulative simulated counts of one processor. ``coherence_misses`` (demand misses served
    by a cache-to-cache transfer of another processor's dirty copy) and ``invalidations``
    (times another processor's store removed a line from this one's private levels) are
    counted by coherent systems only (:class:`CoherentSim`); they are not canonical counters:
    the misses they explain are already in ``lN_misses``."""

    loads: int
    stores: int
    dtlb_misses: int
    levels: tuple[LevelCounts, ...]
    banks: BankCounts
    coherence_misses: int = 0
    invalidations: int = 0

    def __sub__(self, other: ProcessorCounts) -> ProcessorCounts:
        """What happened between snapshot ``other`` and this one."""
        return ProcessorCounts(
            self.loads - other.loads, self.stores - other.stores,
            self.dtlb_misses - other.dtlb_misses,
            tuple(a - b for a, b in zip(self.levels, other.levels, strict=True)),
            self.banks - other.banks, self.coherence_misses - other.coherence_misses,
            self.invalidations - other.invalidations)

    def canonical(self) -> dict[str, int]:
        """Canonical counter name -> value (levels beyond L3 have no canonical name)."""
        out = {"loads": self.loads, "stores": self.stores, "dtlb_misses": self.dtlb_misses}
        for lv in self.levels:
            prefix = _LEVEL_PREFIX.get(lv.level)
            if prefix:
                out[f"{prefix}_misses"] = lv.total_misses
                out[f"{prefix}_writebacks"] = lv.writebacks
        return out


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` returns: per-processor counts and the per-bank totals."""

    processors: tuple[ProcessorCounts, ...]
    banks: BankCounts
    engine: EngineName
    geometry: Geometry
    bankmap: BankMap


def canonical_values(counts: ProcessorCounts,
                     events: Sequence[str] | None = None
                     ) -> tuple[dict[str, CounterValue], dict[str, str]]:
    """Canonical counters as ``CounterValue(source=SIMULATED)``, and the reasons for the asked
    ones that simulation cannot give. ``events=None``: every counter it can give."""
    known = counts.canonical()
    values: dict[str, CounterValue] = {}
    unsupported: dict[str, str] = {}
    for name in check_names(tuple(events) if events is not None else tuple(known)):
        if name in known:
            v = known[name]
            values[name] = CounterValue(float(v), Source.SIMULATED, 1.0, v)
        elif name in _LEVEL_COUNTERS:
            unsupported[name] = f"the simulated geometry has no L{_LEVEL_COUNTERS[name]}"
        else:
            unsupported[name] = UNSUPPORTED_REASON
    return values, unsupported
