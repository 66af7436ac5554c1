"""The per-superstep report model (``counterd report``): :class:`Report`, its rows and counters.

Per superstep: measured time (max end - min begin over processors, DESIGN.md section 3); per
counter the max and sum over processors and the imbalance max/mean; and, when a machine profile
is configured, the predicted F1 (hierarchy), F2 (bus), F3 (bank), F = max(F1, F2, F3), the BSP
bounds the profile provides, the dominating term and seed 004's error ratio
E = max(T, P) / min(T, P).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from counterd.errors import BadInput
from counterd.events import NAMES
from counterd.prediction import PredictFn, Prediction, error_ratio
from counterd.records import Superstep, SuperstepRecord


@dataclass(frozen=True)
class CounterStats:
    max: float
    sum: float
    imbalance: float | None  # max / mean over processors (1 = balanced)
    source: str


@dataclass(frozen=True)
class StepRow:
    index: int
    name: str
    processors: int
    time_ns: int | None
    work_ns: dict[int, int]  # rank -> that processor's own duration
    counters: dict[str, CounterStats]
    flags: frozenset[str]
    prediction: Prediction | None = None

    @property
    def error_ratio(self) -> float | None:
        if self.prediction is None or self.time_ns is None:
            return None
        return error_ratio(self.time_ns / 1e9, self.prediction.total_s)

    @property
    def dominating(self) -> str | None:
        return None if self.prediction is None else self.prediction.dominating

    @property
    def slowest_rank(self) -> int | None:
        return max(self.work_ns, key=lambda r: self.work_ns[r]) if self.work_ns else None

    @property
    def time_imbalance(self) -> float | None:
        vals = list(self.work_ns.values())
        if len(vals) < 2 or sum(vals) <= 0:
            return None
        return max(vals) / (sum(vals) / len(vals))


@dataclass(frozen=True)
class Report:
    source: str
    runs: tuple[str, ...]
    hosts: tuple[str, ...]
    backends: tuple[str, ...]
    rows: tuple[StepRow, ...]
    prediction_note: str
    counters: tuple[str, ...] = field(default=())

    @property
    def predicted(self) -> bool:
        return any(r.prediction is not None for r in self.rows)

    def error_summary(self) -> tuple[float, float] | None:
        errs = [e for r in self.rows if (e := r.error_ratio) is not None]
        return (sum(errs) / len(errs), max(errs)) if errs else None


def records_from_store(path: Path, run: str | None) -> tuple[list[SuperstepRecord], str]:
    from counterd.daemon.store import open_readonly

    store = open_readonly(path)
    try:
        run_id = run or store.latest_run()
        if run_id is None:
            raise BadInput(f"the store {path} holds no runs",
                           "send supersteps to counterd run first, or pass --records FILE")
        records = store.records(run_id)
    finally:
        store.close()
    if not records:
        raise BadInput(f"no run {run_id!r} in {path}", "see counterd runs for the run ids")
    return records, f"{path} run {run_id}"


def build(records: Iterable[SuperstepRecord], *, predict: PredictFn | None = None,
          prediction_note: str = "", source: str = "") -> Report:
    recs = list(records)
    if not recs:
        raise BadInput("no superstep records to report", "record a run first")
    groups: dict[tuple[int, str], list[SuperstepRecord]] = defaultdict(list)
    for r in recs:
        groups[(r.index, r.name)].append(r)
    rows = []
    failures: dict[str, list[int]] = defaultdict(list)
    for (index, name), group in sorted(groups.items()):
        step = Superstep(group[0].run_id, index, name, tuple(group))
        complete, time_ns, work = step.complete, step.time_ns, step.work_ns
        per_rank: dict[int, dict[str, float]] = defaultdict(dict)
        sources: dict[str, str] = {}
        for r in group:
            for k, cv in r.counters.items():
                per_rank[r.rank][k] = per_rank[r.rank].get(k, 0.0) + cv.value
                sources[k] = cv.source.value
        counters = {}
        for k in sorted(sources, key=_counter_order):
            vals = [v[k] for v in per_rank.values() if k in v]
            total = sum(vals)
            mean = total / len(vals) if vals else 0.0
            counters[k] = CounterStats(max(vals), total, max(vals) / mean if mean > 0 else None,
                                       sources[k])
        pred = None
        if predict is not None and complete:
            try:
                pred = predict(group)
            except Exception as exc:  # a failing prediction is a missing column, said once
                failures[str(exc)].append(index)
        rows.append(StepRow(index, name, len({r.rank for r in group}), time_ns, work, counters,
                            frozenset().union(*(r.flags for r in group)), pred))
    present = tuple(sorted({k for row in rows for k in row.counters}, key=_counter_order))
    note = prediction_note if predict is None else (
        prediction_note or "predictions from the configured profile")
    used = sorted({r.prediction.accuracy_note for r in rows if r.prediction is not None} - {""})
    if used:  # which model variant predicted (chosen by the counters present) and how well
        note += "; model " + "; ".join(used)
    for why, steps in failures.items():
        note += f"; no prediction for supersteps {', '.join(map(str, steps))}: {why}"
    return Report(source, tuple(sorted({r.run_id for r in recs})),
                  tuple(sorted({r.host for r in recs if r.host})),
                  tuple(sorted({r.backend for r in recs})), tuple(rows), note, present)


def _counter_order(name: str) -> tuple[int, str]:
    return (NAMES.index(name) if name in NAMES else len(NAMES), name)
