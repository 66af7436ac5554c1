"""Per-superstep aggregation of records: the table ``counterd summary`` prints.

Superstep time = max over processors of end minus min over processors of begin (DESIGN.md
section 3); per counter, the max and the sum over processors and the imbalance max/mean.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from counterd.records import SuperstepRecord


@dataclass(frozen=True)
class SuperstepSummary:
    index: int
    name: str
    processors: int
    time_ns: int | None  # None if any processor never ended
    counters_max: dict[str, float]
    counters_sum: dict[str, float]
    sources: dict[str, str]
    flags: frozenset[str]

    def imbalance(self, counter: str) -> float | None:
        total = self.counters_sum.get(counter)
        if not total or self.processors == 0:
            return None
        return self.counters_max[counter] / (total / self.processors)


def summarize(records: Iterable[SuperstepRecord]) -> list[SuperstepSummary]:
    groups: dict[tuple[int, str], list[SuperstepRecord]] = defaultdict(list)
    for rec in records:
        groups[(rec.index, rec.name)].append(rec)
    out = []
    for (index, name), recs in sorted(groups.items()):
        ends = [r.end_ns for r in recs]
        time_ns = None if any(e is None for e in ends) else (
            max(e for e in ends if e is not None) - min(r.begin_ns for r in recs))
        cmax: dict[str, float] = {}
        csum: dict[str, float] = {}
        sources: dict[str, str] = {}
        for r in recs:
            for k, cv in r.counters.items():
                cmax[k] = max(cmax.get(k, cv.value), cv.value)
                csum[k] = csum.get(k, 0.0) + cv.value
                sources[k] = cv.source.value
        flags = frozenset().union(*(r.flags for r in recs))
        out.append(SuperstepSummary(index, name, len({r.rank for r in recs}), time_ns, cmax,
                                    csum, sources, flags))
    return out


DEFAULT_COLUMNS = ("task_clock_ns", "loads", "stores", "l1d_misses", "l3_misses", "page_faults")


def render(summaries: Sequence[SuperstepSummary], columns: Sequence[str] = DEFAULT_COLUMNS) -> str:
    present = [c for c in columns if any(c in s.counters_max for s in summaries)]
    head = f"{'#':>3} {'superstep':<22} {'p':>2} {'time_ms':>10} " + " ".join(
        f"{c + ' max':>18}" for c in present) + "  flags"
    lines = [head]
    for s in summaries:
        t = f"{s.time_ns / 1e6:10.3f}" if s.time_ns is not None else f"{'-':>10}"
        vals = " ".join(f"{s.counters_max[c]:>18,.0f}" if c in s.counters_max else f"{'-':>18}"
                        for c in present)
        lines.append(f"{s.index:>3} {s.name[:22]:<22} {s.processors:>2} {t} {vals}  "
                     + ",".join(sorted(s.flags)))
    sources = sorted({f"{k}={v}" for s in summaries for k, v in s.sources.items() if k in present})
    if sources:
        lines.append("sources: " + ", ".join(sources))
    return "\n".join(lines)
