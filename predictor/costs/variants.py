"""Model variants by counter set: which counters a cost model may use.

No counter source gives every counter on every host (DESIGN.md section 8, "Model variants by
counter set"): the cache simulator gives all of them for the address streams it is shown;
Callgrind simulates two levels (L1 and a last level, with last-level writebacks only); PMUs
differ (AMD Zen has no writeback events, Skylake-SP none for the last level); a host without a
PMU has software events only. Calibration therefore fits F once per counter set below, on the
same patterns (the simulated counters of the microbenchmarks carry them all), and keeps each
variant's accuracy; prediction uses the most complete variant whose counters a superstep
carries and says which (:meth:`predictor.costs.profile.MachineProfile.select_model`).

A counter set is a rule over the host's cache levels, so one table serves every depth:

- ``full``: accesses, the misses of every level and the writebacks of every level (the paper's
  F1 generalised; sim, or a PMU with every event);
- ``misses``: accesses and the misses of every level, no writebacks (PMUs without writeback
  events, e.g. AMD Zen);
- ``l1_llc``: accesses, L1 misses, last-level misses and last-level writebacks -- Callgrind's
  two levels, and the paper's own two-level form on a two-level machine.

Time is never an input: no variant predicts time from time (``task_clock_ns``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from predictor.inputs import miss_counter, writeback_counter

ACCESS_COUNTERS = ("loads", "stores")


@dataclass(frozen=True)
class CounterSet:
    name: str
    sources: str  # which counter sources supply it, in words

    def counters(self, levels: Sequence[int]) -> frozenset[str]:
        """The counters a model of this set may use on a host with these cache levels (a
        fitted model needs only those of the terms it kept)."""
        llc = max(levels)
        if self.name == "full":
            extra = [*map(miss_counter, levels), *map(writeback_counter, levels), "dtlb_misses"]
        elif self.name == "misses":
            extra = [*map(miss_counter, levels), "dtlb_misses"]
        elif self.name == "l1_llc":
            extra = [miss_counter(min(levels)), miss_counter(llc), writeback_counter(llc)]
        else:  # pragma: no cover - the table below is closed
            raise ValueError(self.name)
        return frozenset((*ACCESS_COUNTERS, *extra))


COUNTER_SETS: tuple[CounterSet, ...] = (
    CounterSet("full", "the cache simulator (sim); a PMU with every miss and writeback event"),
    CounterSet("misses", "PMUs without writeback events (e.g. AMD Zen)"),
    CounterSet("l1_llc", "Callgrind (L1 and last level; counterd record --backend callgrind)"),
)
BY_NAME = {s.name: s for s in COUNTER_SETS}


def model_key(fit: str, counter_set: str) -> str:
    """The profile's name for a fitted variant: ``improved`` and ``paper`` for the full set
    (as before variants existed), ``improved.misses``, ``paper.l1_llc``... for the others."""
    return fit if counter_set == "full" else f"{fit}.{counter_set}"


def distinct_sets(levels: Sequence[int]) -> list[CounterSet]:
    """The counter sets that differ on this host, in order of completeness."""
    seen: set[frozenset[str]] = set()
    out = []
    for cs in COUNTER_SETS:
        key = cs.counters(levels)
        if key not in seen:
            seen.add(key)
            out.append(cs)
    return out
