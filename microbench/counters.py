"""Simulated counters of a pattern, from the same plans the timed run executes.

Every processor's private hierarchy (``counterd.backends.sim.CacheSim``) is fed, in order,
exactly what that worker executes (:func:`microbench.runner.plans`): its pre-fault stores,
then for every warm-up superstep its coherence set-up kernels and its main kernel, then the
set-up of the first measured superstep; the counters reported are the difference across the
first measured main kernel: one superstep, with caches as warm as in the timed run. Later
measured supersteps repeat the same sweep over the same addresses (DESIGN.md section 4).

What the simulation cannot see (said in the results): coherence (a store by one processor does
not invalidate another's copy, so concurrent and coherence patterns show their sharing in time
only), line flushes of the coherence set-up, prefetching, and hashed set indexing of real
last-level caches. Shared levels: exclusive patterns give each processor its share of the
ways (``Geometry.split_shared``); concurrent ones, whose processors use the same lines, give
each the whole level.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from counterd.backends.sim import BankMap, CacheSim, Geometry, ProcessorCounts, Stream
from microbench.kernels import KernelCall
from microbench.patterns import Pattern
from microbench.runner import WorkerPlan, plans

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


def _delta(after: ProcessorCounts, before: ProcessorCounts) -> SimulatedSuperstep:
    a, b = after.canonical(), before.canonical()
    counters = {k: a[k] - b.get(k, 0) for k in a}
    lm = tuple(x - y for x, y in zip(after.banks.lm, before.banks.lm, strict=True))
    wb = tuple(x - y for x, y in zip(after.banks.wb, before.banks.wb, strict=True))
    return SimulatedSuperstep(counters, lm, wb)


def _streams(calls: Sequence[KernelCall]) -> list[Stream]:
    return [s for s in (c.stream() for c in calls) if s is not None]


def shared_policy(pattern: Pattern) -> Literal["split", "copy"]:
    return "copy" if pattern.mode == "concurrent" else "split"


def sim_geometry(pattern: Pattern, geometry: Geometry) -> Geometry:
    if shared_policy(pattern) == "split":
        return geometry.split_shared(pattern.procs)
    return geometry


@lru_cache(maxsize=64)
def _simulate_plan(plan: WorkerPlan, warmup: int, geometry: Geometry, bank_map: BankMap,
                   engine: Literal["auto", "native", "python"]) -> SimulatedSuperstep:
    """Memoised: processors of a concurrent pattern often run identical plans (same bases)."""
    sim = CacheSim(geometry, bank_map, engine)
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
    return _delta(sim.counts(), before)


def _plan_key(plan: WorkerPlan) -> WorkerPlan:
    # The slot does not change what is simulated: processors with equal calls share a result.
    return WorkerPlan(0, plan.timed, plan.prefault, plan.setup, plan.main)


def simulate_pattern(pattern: Pattern, geometry: Geometry, bank_map: BankMap, *, warmup: int,
                     page_bytes: int = 4096,
                     engine: Literal["auto", "native", "python"] = "auto"
                     ) -> tuple[SimulatedSuperstep, ...]:
    """Per timed processor (rank order): simulated counters of one measured superstep after
    the pre-fault and ``warmup`` warm-up supersteps the runner executes."""
    g = sim_geometry(pattern, geometry)
    out = []
    for plan in plans(pattern, page_bytes):
        if plan.timed:
            out.append(_simulate_plan(_plan_key(plan), warmup, g, bank_map, engine))
    return tuple(out)


def clear_cache() -> None:
    _simulate_plan.cache_clear()


__all__ = ["SIM_COUNTERS", "SimulatedSuperstep", "clear_cache", "shared_policy",
           "sim_geometry", "simulate_pattern"]
