"""Simulated counters of a pattern, from the same plans the timed run executes.

Every processor's private hierarchy (``counterd.sim.CacheSim``) is fed, in order,
exactly what that worker executes (:func:`microbench.plans.plans`): its pre-fault stores,
then for every warm-up superstep its coherence set-up kernels and its main kernel, then the
set-up of the first measured superstep; the counters reported are the difference across the
first measured main kernel: one superstep, with caches as warm as in the timed run. Later
measured supersteps repeat the same sweep over the same addresses (DESIGN.md section 4).

Patterns whose processors touch each other's data (mode ``concurrent``, and every coherence
variant, whose preparer writes another rank's data) are simulated as one coherent system
(``counterd.sim.CoherentSim``): every participant, the helper included, in one
simulation; each barrier-separated phase (pre-fault, each set-up step, the main kernel) is fed
as one phase in which the workers' streams interleave in turns of ``chunk`` accesses; private
levels are kept coherent by invalidation and the shared levels (sysfs) are one cache. Their
per-level misses then include coherence misses, as a PMU's would; ``coherence_misses`` and
``invalidations`` say how many. Exclusive patterns without a coherence variant share nothing,
so each processor is simulated alone, its share of the shared levels' ways given to it
(``Geometry.split_shared``), and memoised per plan up to a shift that cannot change its counts
(:func:`plan_key`): processors whose sub-arrays start on the same bank are simulated once.

``sampling`` (:mod:`counterd.sim.sampling`; the quick calibration's on a last level larger
than 64 MiB): the last level is simulated on a sample of its sets, and its counts and the
memory's (LM(b), WB(b)) are scaled from the sample: estimates, said so in the results.

What the simulation cannot see (said in the results): line flushes of the coherence set-up
(so the ``clean`` and ``shared`` variants start from the preparer's copy still dirty), the
timing of the interleaving (a fixed round-robin, not a race), prefetching, hashed set
indexing of real last-level caches, and (with the default ``exclusive="split"``) that exclusive
processors whose lines fall in different sets do not compete for the shared level's ways
(``exclusive="shared"`` simulates them in one shared level; predictor/NOTES.md, "Finding 2
followed").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

from counterd.machine.geometry import Geometry
from counterd.machine.memory import BankMap
from counterd.sim import DEFAULT_CHUNK, CacheSim, CoherentSim, ProcessorCounts, Stream
from counterd.sim.sampling import SetSampling, estimate, period_lcm
from microbench.kernels import Call, KernelCall
from microbench.patterns import Pattern
from microbench.plans import WorkerPlan, plans

SIM_COUNTERS: tuple[str, ...] = (
    "loads", "stores", "l1d_misses", "l2_misses", "l3_misses", "l1d_writebacks",
    "l2_writebacks", "l3_writebacks", "dtlb_misses")


@dataclass(frozen=True)
class SimulatedSuperstep:
    """One processor's simulated counters for one measured superstep, and its per-bank counts
    (seed 004's LM(b), WB(b), in last-level lines)."""

    counters: dict[str, int]
    lm: tuple[int, ...]
    wb: tuple[int, ...]
    coherence_misses: int = 0  # not canonical: already inside l1d_misses/l2_misses
    invalidations: int = 0


def _delta(after: ProcessorCounts, before: ProcessorCounts, sampling: SetSampling | None,
           geometry: Geometry) -> SimulatedSuperstep:
    """What the superstep between the two snapshots counted (estimated from the sample when
    ``sampling``: the difference is scaled, not each snapshot)."""
    d = estimate(after - before, sampling, geometry)
    return SimulatedSuperstep(d.canonical(), d.banks.lm, d.banks.wb, d.coherence_misses,
                              d.invalidations)


def _streams(calls: Sequence[Call]) -> list[Stream]:
    return [s for s in (c.stream() for c in calls) if s is not None]


ExclusivePolicy = Literal["split", "shared"]


def uses_coherence(pattern: Pattern) -> bool:
    """Whether the pattern's processors share data, so it is simulated as a coherent system."""
    return pattern.mode == "concurrent" or pattern.coherence is not None


def shared_policy(pattern: Pattern) -> Literal["split", "coherent"]:
    """How shared levels are simulated: ``coherent`` (one cache, see the module doc) or
    ``split`` (each exclusive processor alone with its share of the ways)."""
    return "coherent" if uses_coherence(pattern) else "split"


def sim_geometry(pattern: Pattern, geometry: Geometry) -> Geometry:
    if shared_policy(pattern) == "split":
        return geometry.split_shared(pattern.procs)
    return geometry


@lru_cache(maxsize=64)
def _simulate_plan(plan: WorkerPlan, warmup: int, geometry: Geometry, bank_map: BankMap,
                   engine: Literal["auto", "native", "python"],
                   sampling: SetSampling | None = None) -> SimulatedSuperstep:
    """Memoised: processors of a concurrent pattern often run identical plans (same bases)."""
    sim = CacheSim(geometry, bank_map, engine, sampling=sampling)
    sim.feed(_streams(plan.prefault))
    setup = [c for step in plan.setup for c in step]
    for _ in range(warmup):
        sim.feed(_streams(setup))
        if plan.main is not None:
            sim.feed(_streams([plan.main]))
    sim.feed(_streams(setup))
    before = sim.counts()
    if plan.main is not None:
        sim.feed(_streams([plan.main]))
    return _delta(sim.counts(), before, sampling, geometry)


@lru_cache(maxsize=64)
def _simulate_system(plans_: tuple[WorkerPlan, ...], warmup: int, geometry: Geometry,
                     bank_map: BankMap, engine: Literal["auto", "native", "python"],
                     chunk: int, snoop: bool = True, sampling: SetSampling | None = None
                     ) -> tuple[SimulatedSuperstep, ...]:
    """Every participant in one coherent simulation, phase by phase as the runner's barriers
    separate them; per timed processor, the delta across the first measured main kernel.
    Memoised on the plans (e.g. coherence variants that differ only in timing repeat)."""
    sim = CoherentSim(geometry, len(plans_), bank_map, engine, chunk=chunk, snoop=snoop,
                      sampling=sampling)
    sim.feed([_streams(p.prefault) for p in plans_])
    steps = max((len(p.setup) for p in plans_), default=0)
    main = [_streams([p.main]) if p.main is not None else [] for p in plans_]

    def setup() -> None:
        for k in range(steps):
            sim.feed([_streams(p.setup[k]) if k < len(p.setup) else [] for p in plans_])

    for _ in range(warmup):
        setup()
        sim.feed(main)
    setup()
    before = sim.counts()
    sim.feed(main)
    after = sim.counts()
    return tuple(_delta(a, b, sampling, geometry)
                 for a, b, p in zip(after, before, plans_, strict=True) if p.timed)


def translation_period(geometry: Geometry, bank_map: BankMap, page_bytes: int,
                       sampling: SetSampling | None = None) -> int:
    """The shifts of a processor's whole address stream that leave its simulated counts
    unchanged when it runs alone: multiples of every line, page (the DTLB's and the run's)
    and bank cycle. Such a shift moves every line to another set of each cache and TLB by the
    same rotation of set numbers, and every address to the same bank, so the caches see the
    same sequence of hits, misses and writebacks (tests/microbench: every rank of every
    exclusive pattern gives equal counts shifted or not). A level whose set index is hashed
    (``CacheLevel.index`` not modulo) has no such shift: then the period is 2**62 (no shift;
    only identical plans share a simulation). With ``sampling``, also a multiple of the
    sample's period, so that the shifted stream meets the same sampled sets."""
    if any(lv.index != "modulo" for lv in geometry.levels):
        return 1 << 62
    return period_lcm(math.lcm(page_bytes, geometry.page_bytes,
                               bank_map.banks * bank_map.interleave_bytes,
                               *(lv.line_bytes for lv in geometry.levels)), sampling, geometry)


def _shifted(call: Call, by: int) -> Call:
    if isinstance(call, KernelCall):
        return replace(call, offset_bytes=call.offset_bytes - by)
    return replace(call, dst_offset=call.dst_offset - by, src_offset=call.src_offset - by)


def _offsets(call: Call) -> tuple[int, ...]:
    return (call.offset_bytes,) if isinstance(call, KernelCall) else (call.dst_offset,
                                                                      call.src_offset)


def plan_key(plan: WorkerPlan, period: int) -> WorkerPlan:
    """What a processor running alone simulates, up to what cannot change its counts: the
    slot, and a shift of all its calls by a multiple of ``period``
    (:func:`translation_period`), down to the lowest such offset. The exclusive processors of
    a pattern whose sub-arrays start on the same bank get one key: on 128 processors, at most
    as many simulations as banks."""
    calls = [*plan.prefault, *(c for step in plan.setup for c in step),
             *((plan.main,) if plan.main is not None else ())]
    low = min((o for c in calls for o in _offsets(c)), default=0)
    by = low // period * period
    return WorkerPlan(0, plan.timed,
                      tuple(replace(c, offset_bytes=c.offset_bytes - by) for c in plan.prefault),
                      tuple(tuple(_shifted(c, by) for c in step) for step in plan.setup),
                      _shifted(plan.main, by) if plan.main is not None else None)


def simulate_pattern(pattern: Pattern, geometry: Geometry, bank_map: BankMap, *, warmup: int,
                     page_bytes: int = 4096,
                     engine: Literal["auto", "native", "python"] = "auto",
                     chunk: int = DEFAULT_CHUNK, coherent: bool | None = None,
                     exclusive: ExclusivePolicy = "split", sampling: SetSampling | None = None
                     ) -> tuple[SimulatedSuperstep, ...]:
    """Per timed processor (rank order): simulated counters of one measured superstep after
    the pre-fault and ``warmup`` warm-up supersteps the runner executes. Patterns that share
    data (:func:`uses_coherence`) are simulated coherently, interleaved in turns of ``chunk``
    accesses. ``coherent=False`` forces the independent per-processor simulation (each
    concurrent processor with the whole shared levels, as if alone: where its accesses would
    be served without sharing); None: :func:`uses_coherence`. ``exclusive``: how the
    processors of a pattern that shares no data meet in the shared levels: ``split`` (each
    alone with its share of the ways) or ``shared`` (one cache, the processors interleaved as
    in a coherent system but without snooping: processors whose lines fall in different sets
    do not compete at all, as on hardware). ``sampling``: the last level simulated on a sample
    of its sets and its counts (and the memory's) estimated from it (module doc)."""
    if uses_coherence(pattern) if coherent is None else coherent:
        return _simulate_system(plans(pattern, page_bytes), warmup, geometry, bank_map, engine,
                                chunk, sampling=sampling)
    if exclusive == "shared" and pattern.mode == "exclusive" and pattern.procs > 1:
        return _simulate_system(plans(pattern, page_bytes), warmup, geometry, bank_map, engine,
                                chunk, snoop=False, sampling=sampling)
    g = geometry if pattern.mode == "concurrent" else geometry.split_shared(pattern.procs)
    period = translation_period(g, bank_map, page_bytes, sampling)
    out = []
    for plan in plans(pattern, page_bytes):
        if plan.timed:
            out.append(_simulate_plan(plan_key(plan, period), warmup, g, bank_map, engine,
                                      sampling))
    return tuple(out)


def simulations(pattern: Pattern, geometry: Geometry, bank_map: BankMap, *,
                page_bytes: int = 4096, sampling: SetSampling | None = None
                ) -> tuple[WorkerPlan, ...]:
    """What :func:`simulate_pattern` feeds the simulator, as plans: the distinct
    processors' plans of a pattern simulated per processor, every participant's of one
    simulated as a coherent system (what its cost follows)."""
    if uses_coherence(pattern):
        return plans(pattern, page_bytes)
    g = geometry if pattern.mode == "concurrent" else geometry.split_shared(pattern.procs)
    period = translation_period(g, bank_map, page_bytes, sampling)
    keys = dict.fromkeys(plan_key(p, period) for p in plans(pattern, page_bytes) if p.timed)
    return tuple(keys)


def clear_cache() -> None:
    _simulate_plan.cache_clear()
    _simulate_system.cache_clear()


__all__ = ["SIM_COUNTERS", "ExclusivePolicy", "SimulatedSuperstep", "clear_cache", "plan_key",
           "shared_policy", "sim_geometry", "simulate_pattern", "simulations",
           "translation_period", "uses_coherence"]
