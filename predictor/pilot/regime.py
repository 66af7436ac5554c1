"""The L2 at the target: how much more often each superstep will miss it there than at the
pilots, and what that costs (:func:`plan`, :func:`load_regime`, :func:`l2_extra`; the runs
are made by :func:`predictor.pilot.campaign.cache_runs`).

Why. The pilots are small, and their data often fit the L2 where the target's do not. The
work basis holds the time per instruction at the largest pilot's, so it misses the cost of
the L2 misses the target adds: on the outside suite's held-out programs pagerank's
supersteps came out at 0.83-0.96 of the measured, bfs_python's "bfs" at 0.57-0.65. The
counted runs cannot show it: Callgrind simulates two levels, the L1 and the last one (the
L3 where there is one), and the pilots' counts extrapolate what the pilots did.

How. Two more counted runs at the largest pilot size, each under Callgrind with the L2 as its
last level (``counterd record --machine FILE``): one with the host's L2, one with the L2
shrunk by the factor ``g`` the program's footprint grows from that size to the target
(:func:`footprint_growth`): data ``g`` times smaller in a cache ``g`` times smaller fill it as
the target's data fill the full one, so for data that grow in proportion the misses per load
are the target's). Both simulate
valgrind's hardware prefetcher (``--prefetch``): a streamed array that outgrows the L2 is
prefetched and costs little, and the misses that cost are those no stream prefetcher covers.
At the target each superstep then misses the L2 ``(r_t - r_p) x loads`` times more than the
largest pilot's rate would have it (``r``: misses per load, ``t`` the shrunk cache, ``p`` the
host's; loads extrapolated), on its busiest processor in its share of the loads, each at the
profile's cost of an L2 miss (the calibrated F1 coefficient of ``l2_misses``).

Checked on 2026-11-28 (predictor/NOTES.md): the shrunk cache's miss rates at pagerank's
largest pilot (16,000) matched a simulation of the target (64,000) with the full L2 within
1 % (graph, normalise) and 14 % (power iteration). The cost is the weak part: one
coefficient for every miss the prefetcher leaves, whatever the access pattern's overlap of
misses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from predictor.errors import BadInput, PredictorError
from predictor.inputs import Step
from predictor.pilot.runs import PilotRun, check_runs, split_name

LEVEL = 2  # the level simulated: the L2, the one Callgrind's two levels skip where there is an L3


@dataclass(frozen=True)
class Plan:
    """The two L2 runs for a target: at the largest pilot ``size``, the L2 of ``host_bytes``
    and of ``scaled_bytes``, ``growth`` the footprint's growth between them."""

    size: float
    target: float
    growth: float
    host_bytes: int
    scaled_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "target": self.target, "growth": self.growth,
                "host_bytes": self.host_bytes, "scaled_bytes": self.scaled_bytes}

    @classmethod
    def from_json(cls, d: Any) -> Plan:
        """A plan as :meth:`to_json` wrote it; ValueError, KeyError or TypeError if not."""
        return cls(float(d["size"]), float(d["target"]), float(d["growth"]),
                   int(d["host_bytes"]), int(d["scaled_bytes"]))


@dataclass(frozen=True)
class Regime:
    """The two counted runs of a :class:`Plan`: per superstep (index, name) the L2 misses per
    load in each (host L2, shrunk L2; summed over processors), and the busiest processor's
    share of the loads."""

    plan: Plan
    ratios: Mapping[tuple[int, str], tuple[float, float]]
    load_share: Mapping[tuple[int, str], float]

    @property
    def target(self) -> float:
        return self.plan.target


@dataclass(frozen=True)
class L2Extra:
    """A superstep's L2 misses at the target beyond the largest pilot's rate, and their cost."""

    pilot_rate: float  # L2 misses per load at the largest pilot (host L2)
    target_rate: float  # at the target (the shrunk L2 at the largest pilot)
    misses: float  # on the busiest processor, at the target
    cost_ns: float | None  # the profile's cost of an L2 miss; None without one
    seconds: float  # misses x cost (0 without a cost)

    def to_json(self) -> dict[str, Any]:
        return {"pilot_misses_per_load": self.pilot_rate,
                "target_misses_per_load": self.target_rate, "extra_misses": self.misses,
                "cost_ns": self.cost_ns, "extra_s": self.seconds}


def _last_level_misses(steps: Sequence[Step]) -> str | None:
    """The deepest ``l<N>_misses`` counter (N >= 2) every one of ``steps`` has."""
    common = set.intersection(*(set(s.counters) for s in steps)) if steps else set()
    levels = [int(c[1]) for c in common
              if len(c) == len("l2_misses") and c.startswith("l") and c.endswith("_misses")
              and c[1].isdigit() and int(c[1]) >= 2]
    return f"l{max(levels)}_misses" if levels else None


def footprint_growth(runs: Sequence[PilotRun], target: float) -> float:
    """How many times the program's data grow from the largest pilot to ``target``: the
    counted runs' last-level misses (with an L3 of megabytes, almost all first touches),
    summed over the supersteps, each superstep's extrapolated to the target as the forecast
    extrapolates it, over their sum at the largest pilot; at least 1. Where no run counted
    them (or none missed), the sizes' ratio: data in proportion to n."""
    from predictor.pilot.extrapolation import extrapolate_count

    sizes = sorted({r.size for r in runs})
    top = sizes[-1]
    fallback = max(1.0, target / top)
    name = _last_level_misses([s for r in runs for s in r.steps])
    if name is None:
        return fallback
    ns = [r.size for r in runs]
    there = at = 0.0
    for i in range(len(runs[0].steps)):
        counts = [float(r.steps[i].counter(name).sum()) for r in runs]
        there += float(np.mean([c for r, c in zip(runs, counts, strict=True) if r.size == top]))
        try:
            at += max(extrapolate_count(ns, counts, target).value, 0.0)
        except PredictorError:
            return fallback
    return max(1.0, at / there) if there > 0 and math.isfinite(at) else fallback


def scaled_l2(host: Any, growth: float, l1d_bytes: int) -> int:
    """The L2 that stands for the target's: the host's (a counterd.machine CacheLevel) with its
    set count divided by ``growth``, rounded to a power of two (valgrind's sets are), ways and
    line kept; no smaller than twice the L1d."""
    line_ways = host.ways * host.line_bytes
    sets = max(1, host.size_bytes // line_ways)
    want = 2 ** round(math.log2(max(sets / growth, 1.0)))
    floor = 2 ** math.ceil(math.log2(max(1, 2 * l1d_bytes // line_ways)))
    return int(max(want, floor, 1) * line_ways)


def machine_text(machine: Any, l2_bytes: int) -> str:
    """A machine file (counterd/machine/files.py) of ``machine``'s L1i, L1d and an L2 of
    ``l2_bytes`` as its last level (its ways and line kept), for Callgrind's two levels."""
    from predictor.costs.profile import dumps

    l1i, l1d, l2 = machine.l1i, machine.levels[0], machine.levels[1]

    def table(level: int, kind: str, size: int, c: Any) -> dict[str, Any]:
        return {"level": level, "type": kind, "size": size, "ways": c.ways,
                "line_bytes": c.line_bytes, "shared_cpus": list(c.shared_cpus)}

    return dumps({"format": "counterd-machine", "version": 2,
                  "caches": [table(1, "instruction", l1i.size_bytes, l1i),
                             table(1, "data", l1d.size_bytes, l1d),
                             table(2, "unified", l2_bytes, l2)]},
                 "the host's L1i, L1d and L2 (predict --pilot's L2 runs, predictor/pilot/"
                 "regime.py)")


def _l2_of(machine: Any) -> Any | None:
    """``machine``'s L2 (a counterd.machine CacheLevel), None without an L1i and an L2."""
    levels: Sequence[Any] = tuple(getattr(machine, "levels", ()))
    if machine.l1i is None or len(levels) < 2 or levels[1].level != LEVEL:
        return None
    return levels[1]


def run_path(workdir: Any, size: float, l2_bytes: int) -> Path:
    """Where a campaign keeps one L2 run: ``l2-BYTES-N.jsonl``."""
    return Path(workdir) / f"l2-{l2_bytes}-{size:g}.jsonl"


def plan_path(workdir: Any, target: float) -> Path:
    """Where a campaign keeps what its L2 runs for ``target`` were: ``l2-for-T.json``."""
    return Path(workdir) / f"l2-for-{target:g}.json"


def plan(runs: Sequence[PilotRun], target: float, machine: Any) -> Plan | None:
    """The L2 runs ``runs`` need for ``target`` on ``machine`` (a counterd.machine Machine):
    None where it has no L2 below an L1 pair. :func:`predictor.pilot.campaign.cache_runs`
    runs them."""
    l2 = _l2_of(machine)
    if l2 is None:
        return None
    growth = footprint_growth(runs, target)
    return Plan(max(r.size for r in runs), target, growth, l2.size_bytes,
                scaled_l2(l2, growth, machine.levels[0].size_bytes))


def ours(path: Path) -> bool:
    """Whether ``path`` is a regular file of this user (not a link, not another user's): a run
    kept in a directory others can write is run again, not trusted."""
    import os
    import stat

    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def load_regime(workdir: Any, runs: Sequence[PilotRun], target: float) -> Regime | None:
    """The :class:`Regime` of the L2 runs for ``target`` kept in ``workdir`` by
    :func:`predictor.pilot.campaign.cache_runs` (None where there are none)."""
    import json

    from predictor.inputs import load_counters

    kept = plan_path(workdir, target)
    if not ours(kept):
        return None
    try:
        p = Plan.from_json(json.loads(kept.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{kept} is not what predict --pilot kept ({exc})",
                       "remove it; the L2 runs will be run again") from None
    size = p.size
    if size != max(r.size for r in runs):
        raise BadInput(f"{kept}: the L2 runs were at n = {size:g}, not at the largest pilot",
                       "remove it; the L2 runs will be run again")
    paths = [run_path(workdir, size, b) for b in (p.host_bytes, p.scaled_bytes)]
    if not all(ours(x) for x in paths):
        return None
    host, scaled = ({split_name(s): s for s in load_counters(x)} for x in paths)
    keys = check_runs(runs)
    if sorted(host) != sorted(keys) or sorted(scaled) != sorted(keys):
        raise BadInput(f"the L2 runs at n = {size:g} have other supersteps than the pilots",
                       "pilot runs must have the same supersteps every time")

    def rate(s: Step) -> float:
        loads = float(s.counter("loads").sum())
        return float(s.counter("l2_misses").sum()) / loads if loads > 0 else 0.0

    ratios, share = {}, {}
    for k in keys:
        h, s = host[k], scaled[k]
        if not all(c in x.counters for x in (h, s) for c in ("loads", "l2_misses")):
            continue
        ratios[k] = (rate(h), rate(s))
        loads = h.counter("loads")
        share[k] = float(loads.max() / loads.sum()) if loads.sum() > 0 else 1.0
    return Regime(p, ratios, share)


def l2_cost_ns(profile: Any) -> float | None:
    """The profile's cost of an L2 miss: its default model's F1 coefficient of ``l2_misses``
    (None where it has none, or a profile is not given)."""
    if profile is None:
        return None
    cost = profile.models.get(profile.default_model, {}).get("F1", {}).get("l2_misses")
    return float(cost) if isinstance(cost, (int, float)) and cost > 0 else None


def l2_extra(regime: Regime, key: tuple[int, str], loads_at_target: float,
             cost_ns: float | None) -> L2Extra | None:
    """Superstep ``key``'s L2 misses at the target beyond the largest pilot's rate (none
    fewer), on its busiest processor, and their cost; None where the runs lack it."""
    if key not in regime.ratios:
        return None
    rp, rt = regime.ratios[key]
    misses = max(0.0, rt - rp) * max(loads_at_target, 0.0) * regime.load_share.get(key, 1.0)
    return L2Extra(rp, rt, misses, cost_ns, misses * cost_ns * 1e-9 if cost_ns else 0.0)
