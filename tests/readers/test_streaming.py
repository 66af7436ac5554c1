"""Readers stream (issue 14, item 6): the report folds records as they come and holds per
superstep and rank, not per record; its numbers are the ones :class:`Superstep` defines."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from counterd import report
from counterd.backends.base import CounterValue
from counterd.data.events import Source
from counterd.data.records import Superstep, SuperstepRecord

NAMES = ("loads", "stores", "l1d_misses")


@st.composite
def records(draw: st.DrawFn) -> list[SuperstepRecord]:
    out = []
    for _ in range(draw(st.integers(1, 12))):
        begin = draw(st.integers(0, 10**6))
        dur = draw(st.none() | st.integers(0, 10**6))
        out.append(SuperstepRecord(
            run_id="r", index=draw(st.integers(0, 2)), name="s", rank=draw(st.integers(0, 3)),
            pid=1, cpu=draw(st.integers(0, 1)), begin_ns=begin,
            end_ns=None if dur is None else begin + dur,
            counters={n: CounterValue(float(draw(st.integers(0, 1000))), Source.SIMULATED)
                      for n in draw(st.sets(st.sampled_from(NAMES)))},
            flags=frozenset({"incomplete"}) if dur is None
            else frozenset({"migrated"}) if draw(st.booleans()) else frozenset()))
    return out


@settings(max_examples=200, deadline=None)
@given(recs=records())
def test_streamed_aggregate_is_the_superstep_one(recs: list[SuperstepRecord]) -> None:
    rep = report.build(iter(recs))
    steps = {s.index: s for s in Superstep.group(recs)}
    assert [r.index for r in rep.rows] == sorted(steps)
    for row in rep.rows:
        step = steps[row.index]
        assert row.time_ns == step.time_ns
        assert row.work_ns == step.work_ns
        assert row.slowest_work_ns == step.slowest_work_ns
        assert row.skew_ns == step.skew_ns
        assert row.shared_cpus == step.shared_cpus
        assert row.processors == len({r.rank for r in step.records})
        assert row.flags == frozenset().union(*(r.flags for r in step.records))
        for name, c in row.counters.items():
            per_rank: dict[int, float] = {}
            for r in step.records:
                if name in r.counters:
                    per_rank[r.rank] = per_rank.get(r.rank, 0.0) + r.counters[name].value
            assert c.sum == pytest.approx(sum(per_rank.values()))
            assert c.max == pytest.approx(max(per_rank.values()))
        assert set(row.counters) == {n for r in step.records for n in r.counters}


def _many(n: int) -> Iterator[SuperstepRecord]:
    """``n`` records of 4 supersteps on 4 ranks, made one at a time."""
    for i in range(n):
        yield SuperstepRecord(
            run_id=f"run-{i // 16}", index=i % 4, name="step", rank=(i // 4) % 4, pid=1,
            cpu=0, begin_ns=1000 + i, end_ns=2000 + i,
            counters={n: CounterValue(float(i), Source.SIMULATED) for n in NAMES})


def test_report_memory_is_per_superstep_not_per_record() -> None:
    n = 20_000
    tracemalloc.start()
    try:
        rep = report.build(_many(n))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(rep.rows) == 4 and rep.rows[0].processors == 4
    assert rep.rows[0].counters["loads"].sum == pytest.approx(
        sum(float(i) for i in range(0, n, 4)))
    # Holding the records would take > 20 MB (about 1.5 kB each); the fold holds 16 rows
    # and the run ids (1,250 distinct: the report lists them).
    assert peak < 2 * 2**20, peak
