"""The cache geometry valgrind is given (``--I1``/``--D1``/``--LL``): the host's, from the machine
description, adjusted to what valgrind accepts (:func:`adjust_cache`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from counterd.data.errors import BadInput
from counterd.machine import current as current_machine
from counterd.machine.description import Machine


@dataclass(frozen=True)
class CacheSpec:
    """One cache as valgrind's ``--I1/--D1/--LL=size,assoc,line`` takes it."""

    size_bytes: int
    ways: int
    line_bytes: int

    def __post_init__(self) -> None:
        if self.size_bytes <= 0 or self.ways <= 0 or self.line_bytes <= 0:
            raise ValueError(f"invalid cache {self}")

    @property
    def sets(self) -> float:
        return self.size_bytes / (self.ways * self.line_bytes)

    def option(self) -> str:
        return f"{self.size_bytes},{self.ways},{self.line_bytes}"

    def valid_for_valgrind(self) -> bool:
        sets = self.sets
        return (sets == int(sets) and _is_pow2(int(sets)) and _is_pow2(self.line_bytes)
                and self.line_bytes >= 16 and self.size_bytes < 2**31)


@dataclass(frozen=True)
class CacheAdjustment:
    """A host cache changed to one valgrind accepts, and why."""

    level: str  # "I1", "D1" or "LL"
    host: CacheSpec
    simulated: CacheSpec
    reason: str

    def describe(self) -> str:
        h, s = self.host, self.simulated
        return (f"{self.level}: host {h.size_bytes} B {h.ways}-way {h.line_bytes} B lines "
                f"-> simulated {s.size_bytes} B {s.ways}-way ({self.reason})")


@dataclass(frozen=True)
class CallgrindGeometry:
    """The three caches Callgrind simulates, with the host level the LL stands for."""

    i1: CacheSpec
    d1: CacheSpec
    ll: CacheSpec
    last_level: int  # 2 or 3: which canonical l<N>_* counters the LL feeds
    adjustments: tuple[CacheAdjustment, ...] = ()
    # Valgrind's hardware prefetcher on the LL (``--simulate-hwpref=yes``, ``counterd record
    # --prefetch``): a line of an ascending or descending stream within a page is fetched into
    # the LL before its miss, so the LL misses are those a stream prefetcher does not cover.
    # Valgrind simulates it only without write-backs (callgrind/sim.c picks one simulator:
    # with ``--simulate-wb=yes`` the prefetcher is ignored, its misses unchanged), so no
    # write-backs are counted with it.
    prefetch: bool = False

    def __post_init__(self) -> None:
        if self.last_level not in (2, 3):
            raise ValueError(f"last level {self.last_level} is not 2 or 3")
        for spec in (self.i1, self.d1, self.ll):
            if not spec.valid_for_valgrind():
                raise ValueError(f"{spec} is not a geometry valgrind accepts; "
                                 "build it with valgrind_geometry()")

    @classmethod
    def from_machine(cls, machine: Machine | None = None) -> CallgrindGeometry:
        """The L1i, L1d and last level of ``machine`` (default: :func:`counterd.machine.
        current`), adjusted with :func:`valgrind_geometry`. Raises BadInput, naming where the
        machine came from, when it lacks them or valgrind cannot simulate them."""
        m = machine if machine is not None else current_machine()
        where = m.caches_source
        fix = ("pass the geometry explicitly: CallgrindGeometry(i1=..., d1=..., ll=..., "
               "last_level=...) built with valgrind_geometry(), or describe the machine in a "
               "file (--machine FILE or COUNTERD_MACHINE) with an L1 instruction cache")
        if not m.caches_known or m.l1i is None or len(m.levels) < 2:
            raise BadInput(f"{where} does not describe an L1i, an L1d and a last-level cache",
                           fix)
        level = m.levels[-1].level
        if level not in (2, 3):
            raise BadInput(f"the last-level cache in {where} is L{level}",
                           "pass the geometry explicitly with last_level=2 or 3")
        spec = [CacheSpec(lv.size_bytes, lv.ways, lv.line_bytes)
                for lv in (m.l1i, m.levels[0], m.levels[-1])]
        try:
            return valgrind_geometry(spec[0], spec[1], spec[2], last_level=level)
        except BadInput as exc:
            raise BadInput(f"{where}: {exc.what}", exc.fix) from None


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def adjust_cache(level: str, host: CacheSpec) -> tuple[CacheSpec, CacheAdjustment | None]:
    """A cache valgrind accepts, as close as possible to ``host`` (see the module docstring).

    Keeps the line size; rounds the set count to the nearest power of two (ties up); picks the
    associativity that brings the capacity closest to the host's (ties to more ways). Raises
    BadInput for a line size valgrind cannot simulate (not a power of two, or below 16 B).
    """
    if host.valid_for_valgrind():
        return host, None
    line = host.line_bytes
    if not _is_pow2(line) or line < 16:
        raise BadInput(f"{level} cache line of {line} B cannot be simulated by valgrind",
                       "valgrind needs a power-of-two line of at least 16 B; pass a geometry")
    sets_exact = host.size_bytes / (host.ways * line)
    lo = 1 << max(0, math.floor(math.log2(sets_exact)))
    sets = lo if sets_exact - lo < 2 * lo - sets_exact else 2 * lo
    ways_exact = host.size_bytes / (sets * line)
    ways = max(1, math.floor(ways_exact + 0.5))
    while sets * ways * line >= 2**31 and ways > 1:  # valgrind holds cache sizes in an int
        ways -= 1
    sim = CacheSpec(sets * ways * line, ways, line)
    change = 100 * (sim.size_bytes / host.size_bytes - 1)
    reason = (f"valgrind needs a power-of-two set count; {sets_exact:g} sets -> {sets}, "
              f"{host.ways} -> {ways} ways (capacity {change:+.1f} %)")
    return sim, CacheAdjustment(level, host, sim, reason)


def valgrind_geometry(i1: CacheSpec, d1: CacheSpec, ll: CacheSpec,
                      last_level: int) -> CallgrindGeometry:
    """Host caches -> a :class:`CallgrindGeometry`, every adjustment recorded."""
    specs = []
    adjustments = []
    for level, spec in (("I1", i1), ("D1", d1), ("LL", ll)):
        sim, adj = adjust_cache(level, spec)
        specs.append(sim)
        if adj is not None:
            adjustments.append(adj)
    return CallgrindGeometry(specs[0], specs[1], specs[2], last_level, tuple(adjustments))
