"""The L2 at the target (predictor.pilot.regime): the shrunk L2 that stands for the target's, the
machine file of the L2 runs, the footprint's growth, the extra misses and their cost, and the
forecast that carries them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from counterd.machine.description import CacheLevel
from predictor.errors import BadInput
from predictor.inputs import Step
from predictor.pilot.forecast import L2_NOTE, forecast
from predictor.pilot.regime import (
    Plan,
    Regime,
    footprint_growth,
    l2_cost_ns,
    l2_extra,
    load_regime,
    machine_text,
    plan_path,
    run_path,
    scaled_l2,
)
from predictor.pilot.runs import PilotRun
from tests import machine_files
from tests.predictor.test_pilot import PROFILE, SIZES, P, _run

L2 = CacheLevel(2, 2 * 1024 * 1024, 16, 64, (0,))


@pytest.mark.parametrize("growth, want", [
    (1.0, 2 * 1024 * 1024),  # no growth: the host's
    (4.0, 512 * 1024),  # the sets divided by 4
    (3.0, 512 * 1024),  # 2048 / 3 = 683 sets -> 512 (log2 683 = 9.4)
    (1e6, 128 * 1024),  # never below twice the L1d (96 KiB -> 128 sets of 1 KiB)
])
def test_the_shrunk_l2_divides_the_sets_by_the_growth(growth, want):
    got = scaled_l2(L2, growth, 48 * 1024)
    assert got == want
    sets = got // (L2.ways * L2.line_bytes)
    assert sets & (sets - 1) == 0  # a power of two: valgrind takes it as it is


@pytest.mark.parametrize("name", machine_files.NAMES)
def test_the_l2_runs_machine_file_is_the_hosts_l1_pair_over_the_l2_given(tmp_path, name):
    """Written, it loads back as a machine whose last level is an L2 of the size given, the
    L1i and L1d the host's (any host: each machine file in turn)."""
    from counterd.machine.files import load_file

    m = machine_files.load(name)
    size = scaled_l2(m.levels[1], 4.0, m.levels[0].size_bytes)
    assert size < m.levels[1].size_bytes
    path = tmp_path / "l2.toml"
    path.write_text(machine_text(m, size), encoding="utf-8")
    got = load_file(path)
    assert [lv.level for lv in got.levels] == [1, 2]
    assert got.levels[1].size_bytes == size
    assert (got.levels[1].ways, got.levels[1].line_bytes) == (m.levels[1].ways,
                                                              m.levels[1].line_bytes)
    assert got.levels[0].size_bytes == m.levels[0].size_bytes
    assert got.l1i is not None and m.l1i is not None
    assert got.l1i.size_bytes == m.l1i.size_bytes


def _with(r: PilotRun, counter: str, per_n: float) -> PilotRun:
    """``r`` with ``counter`` in every superstep, growing as ``per_n`` x n."""
    return PilotRun(r.size, tuple(Step(s.name, {**s.counters,
                                                counter: np.full(P, per_n * r.size / P)},
                                       s.ranks, time_ns=s.time_ns) for s in r.steps), r.source)


def _runs_with(counter: str | None, per_n: float) -> list[PilotRun]:
    """Pilot runs of two supersteps whose ``counter`` grows as ``per_n`` x n (none: absent)."""
    rng = np.random.default_rng(3)
    return [_with(_run(n, rng), counter, per_n) if counter else _run(n, rng)
            for n in SIZES[:4]]


def test_the_footprint_grows_as_the_last_levels_misses_extrapolate():
    runs = _runs_with("l3_misses", 0.05)
    assert footprint_growth(runs, 1.6e6) == pytest.approx(4.0, rel=0.02)
    # a target below the largest pilot: no shrinking (at least 1)
    assert footprint_growth(runs, 1e5) == 1.0


def test_without_a_deeper_level_the_footprint_grows_as_n():
    """The synthetic runs count an L2 (the paper machine's last level): that is the deepest
    l<N>_misses, its growth is taken; without any, the sizes' ratio."""
    runs = _runs_with(None, 0.0)
    assert footprint_growth(runs, 1.6e6) == pytest.approx(4.0, rel=0.05)
    stripped = [PilotRun(r.size, tuple(Step(s.name, {k: v for k, v in s.counters.items()
                                                     if not k.endswith("_misses")},
                                            s.ranks, time_ns=s.time_ns) for s in r.steps),
                         r.source) for r in runs]
    assert footprint_growth(stripped, 3.2e6) == pytest.approx(8.0)


def _regime(target: float, ratios: dict, share: float = 0.5) -> Regime:
    return Regime(Plan(4e5, target, 4.0, 2 << 20, 512 << 10), ratios,
                  {k: share for k in ratios})


def test_the_extra_misses_are_the_rise_in_rate_times_the_loads_on_the_busiest_processor():
    reg = _regime(1.6e6, {(0, "a"): (0.01, 0.05), (1, "b"): (0.05, 0.01)}, share=0.6)
    got = l2_extra(reg, (0, "a"), 1e8, 2.5)
    assert got is not None
    assert got.misses == pytest.approx(0.04 * 1e8 * 0.6)
    assert got.seconds == pytest.approx(got.misses * 2.5e-9)
    fewer = l2_extra(reg, (1, "b"), 1e8, 2.5)  # a rate that falls adds nothing
    assert fewer is not None and fewer.misses == 0 and fewer.seconds == 0
    free = l2_extra(reg, (0, "a"), 1e8, None)  # no cost known: counted, not priced
    assert free is not None and free.misses > 0 and free.seconds == 0
    assert l2_extra(reg, (2, "c"), 1e8, 2.5) is None


def test_the_cost_of_an_l2_miss_is_the_profiles_f1_coefficient():
    assert l2_cost_ns(PROFILE) == PROFILE.models[PROFILE.default_model]["F1"]["l2_misses"]
    assert l2_cost_ns(None) is None


def test_the_forecast_from_counts_carries_the_l2_cost():
    rng = np.random.default_rng(11)
    runs = [_with(_run(n, rng), "instructions", 40.0) for n in SIZES for _ in range(2)]
    target = 2e6
    plain = forecast(runs, target, PROFILE)
    reg = Regime(Plan(SIZES[-1], target, 4.0, 2 << 20, 512 << 10),
                 {(0, "count elements"): (0.001, 0.021), (1, "move elements"): (0.01, 0.01)},
                 {(0, "count elements"): 0.25, (1, "move elements"): 0.25})
    fc = forecast(runs, target, PROFILE, regime=reg)
    cost = l2_cost_ns(PROFILE)
    assert cost is not None
    a0, a1 = plain.steps[0], fc.steps[0]
    loads = a1.counters["loads"].value
    extra = 0.02 * loads * 0.25 * cost * 1e-9
    assert a1.l2 is not None and a1.l2.seconds == pytest.approx(extra)
    assert a0.scaled is not None and a1.scaled is not None
    assert a1.scaled.value == pytest.approx(a0.scaled.value + extra)
    assert a0.fit is not None and a1.fit is not None
    assert a1.fit.value == pytest.approx(a0.fit.value + extra)
    assert a1.time_only.value == a0.time_only.value  # the time-only fit is the pilots' own
    assert a1.basis == a0.basis and a1.basis in ("scaled", "fit") and a1.choice is not None
    assert a1.predicted_s == pytest.approx(a0.predicted_s + extra)
    lo, hi = a1.interval_s  # the interval is the error model's around the forecast
    assert (lo, hi) == pytest.approx((a1.predicted_s * math.exp(-a1.choice.half),
                                      a1.predicted_s * math.exp(a1.choice.half)))
    # the second superstep's rate does not rise: unchanged, and no note of it
    b0, b1 = plain.steps[1], fc.steps[1]
    assert b1.l2 is not None and b1.l2.seconds == 0 and b1.predicted_s == b0.predicted_s
    said = [n for n in fc.notes if "misses the L2" in n]
    assert len(said) == (1 if extra > L2_NOTE * a1.time_only.value else 0)
    assert all("0:count elements" in n for n in said)
    assert fc.to_json()["supersteps"][0]["l2"]["extra_s"] == pytest.approx(extra)
    with pytest.raises(BadInput, match="not 3e"):
        forecast(runs, 3e6, PROFILE, regime=reg)


def _kept(tmp_path, runs, target, plan) -> None:
    plan_path(tmp_path, target).write_text(plan, encoding="utf-8")


@pytest.mark.parametrize("plan, says", [
    ("not json", "is not what predict --pilot kept"),
    ("[1, 2]", "is not what predict --pilot kept"),
    ('{"size": 1, "target": 2}', "is not what predict --pilot kept"),
    ('{"size": 5, "target": 2e6, "growth": 4, "host_bytes": 1, "scaled_bytes": 1}',
     "not at the largest pilot"),
])
def test_a_damaged_l2_plan_is_one_clear_error(tmp_path, plan, says):
    rng = np.random.default_rng(1)
    runs = [_run(n, rng) for n in SIZES]
    _kept(tmp_path, runs, 2e6, plan)
    with pytest.raises(BadInput, match=says):
        load_regime(tmp_path, runs, 2e6)


def test_without_l2_runs_there_is_no_regime(tmp_path):
    rng = np.random.default_rng(1)
    runs = [_run(n, rng) for n in SIZES]
    assert load_regime(tmp_path, runs, 2e6) is None  # no plan
    _kept(tmp_path, runs, 2e6, json.dumps({"size": SIZES[-1], "target": 2e6, "growth": 4,
                                           "host_bytes": 1024, "scaled_bytes": 256}))
    assert not run_path(tmp_path, SIZES[-1], 1024).exists()
    assert load_regime(tmp_path, runs, 2e6) is None  # a plan without its runs
