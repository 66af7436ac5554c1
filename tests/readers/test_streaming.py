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
from counterd.data.records import SHARED_OVERLAP, Superstep, SuperstepRecord, shared_cpus

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


def _brute_shared(spans: list[tuple[int | None, int, int | None]]) -> frozenset[int]:
    """:func:`shared_cpus` by its definition, pair by pair."""
    out = set()
    for k, (c1, b1, e1) in enumerate(spans):
        for c2, b2, e2 in spans[k + 1:]:
            if (c1 is None or c1 < 0 or c1 != c2 or e1 is None or e2 is None
                    or e1 <= b1 or e2 <= b2):
                continue
            if min(e1, e2) - max(b1, b2) >= SHARED_OVERLAP * min(e1 - b1, e2 - b2):
                out.add(c1)
    return frozenset(out)


@settings(max_examples=500, deadline=None)
@given(spans=st.lists(st.tuples(st.none() | st.integers(-1, 2), st.integers(0, 100),
                                st.none() | st.integers(0, 60)), max_size=8))
def test_shared_cpus_is_its_definition(spans: list[tuple[int | None, int, int | None]]
                                       ) -> None:
    """Every pair on one known CPU whose times overlap by a quarter of the shorter one's or
    more, whatever the order; unknown CPUs (None, -1), open and empty times share nothing."""
    given_ = [(c, b, None if d is None else b + d) for c, b, d in spans]
    assert shared_cpus(given_) == _brute_shared(given_)


def test_shared_cpus_at_the_quarter_and_at_its_edges() -> None:
    assert shared_cpus([(0, 0, 100), (0, 75, 175)]) == frozenset({0})  # 25 of 100: shared
    assert shared_cpus([(0, 0, 100), (0, 76, 176)]) == frozenset()  # 24 of 100
    assert shared_cpus([(0, 0, 100), (0, 99, 104)]) == frozenset()  # 1 of the shorter one's 5
    assert shared_cpus([(0, 0, 100), (0, 98, 102)]) == frozenset({0})  # 2 of 4
    assert shared_cpus([(0, 75, 175), (0, 0, 100)]) == frozenset({0})  # either order
    assert shared_cpus([(-1, 0, 100), (-1, 0, 100)]) == frozenset()  # CPU unknown
    assert shared_cpus([(0, 50, 50), (0, 0, 100)]) == frozenset()  # an empty time


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
