"""Model variants by counter set: calibration fits one F per counter set, each needs only its
set's counters, and prediction picks the most complete variant whose counters are present."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.costs.calibrate import calibrate, forecast
from predictor.costs.costfuncs import predict_superstep
from predictor.costs.variants import BY_NAME, distinct_sets
from predictor.errors import NoVariant
from predictor.inputs import Step, results_from_json
from predictor.synthetic import make_results, reference_model

LEVELS = (1, 2, 3)
CALLGRIND = ("loads", "stores", "l1d_misses", "l3_misses", "l3_writebacks", "instructions",
             "task_clock_ns", "page_faults")
ZEN = ("loads", "stores", "l1d_misses", "l2_misses", "l3_misses", "dtlb_misses", "cycles")
EVERY = ("loads", "stores", "l1d_misses", "l2_misses", "l3_misses", "l1d_writebacks",
         "l2_writebacks", "l3_writebacks", "dtlb_misses")


@pytest.fixture(scope="module")
def profile():  # type: ignore[no-untyped-def]
    doc = make_results(reference_model(levels=LEVELS), levels=LEVELS, noise=0.01, seed=3)
    return calibrate(results_from_json(doc, "synthetic"))


def _step(counters: tuple[str, ...], n: int = 2) -> Step:
    rng = np.random.default_rng(1)
    return Step("s", {c: rng.uniform(1e3, 1e5, n) for c in counters})


def test_one_model_per_counter_set_and_fit_needs_only_its_counters(profile) -> None:  # type: ignore[no-untyped-def]
    for cs in distinct_sets(LEVELS):
        for fit in ("paper", "improved"):
            key = fit if cs.name == "full" else f"{fit}.{cs.name}"
            model = profile.models[key]
            assert model["counter_set"] == cs.name
            assert set(model["needs"]) <= cs.counters(LEVELS)
            acc = model["accuracy"]
            assert acc["on"] == "validation patterns" and acc["n"] > 0
            assert 1.0 <= acc["avg_error"] <= acc["max_error"]
    # The full variant recovers the synthetic truth; the restricted ones cannot do better.
    full = profile.models["improved"]["accuracy"]["avg_error"]
    assert full < 1.05
    assert profile.models["improved.l1_llc"]["accuracy"]["avg_error"] >= full - 1e-9


def test_selection_by_counters_present(profile) -> None:  # type: ignore[no-untyped-def]
    assert profile.select_model(EVERY) == "improved"
    assert profile.select_model(CALLGRIND) == "improved.l1_llc"
    assert profile.select_model(ZEN) == "improved.misses"
    assert profile.select_model(EVERY, family="paper") == "paper"


def test_software_events_only_raise_the_action_that_supplies_memory_counters(profile) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(NoVariant) as err:
        profile.select_model(("task_clock_ns", "page_faults", "context_switches"))
    assert not err.value.memory
    assert "no memory-hierarchy counters" in str(err.value)
    assert "counterd record --backend callgrind" in str(err.value)
    with pytest.raises(NoVariant, match="counter 'l1d_misses' is missing") as err:
        profile.select_model(("loads", "stores"))
    assert err.value.memory


def test_predict_superstep_and_forecast_say_which_variant(profile) -> None:  # type: ignore[no-untyped-def]
    s = _step(CALLGRIND)
    out = predict_superstep(profile, s.counters)
    assert out["model"] == "improved.l1_llc" and out["F"] > 0
    assert out["accuracy"]["avg_error"] >= 1.0
    rows = forecast(profile, [s, _step(("task_clock_ns",))])
    assert rows[0]["model"] == "improved.l1_llc" and rows[0]["F_ns"] > 0
    assert rows[1]["F_ns"] is None and "no memory-hierarchy counters" in rows[1]["why"]
    with pytest.raises(NoVariant):
        forecast(profile, [_step(("task_clock_ns",))])


def test_counter_sets_are_what_their_sources_give() -> None:
    assert BY_NAME["l1_llc"].counters(LEVELS) <= set(CALLGRIND)
    assert BY_NAME["misses"].counters(LEVELS) <= set(ZEN)
    assert BY_NAME["full"].counters(LEVELS) == set(EVERY)


def test_callgrind_counters_on_the_built_in_profile_say_what_is_missing() -> None:
    """Issue 34: Callgrind's records on the built-in profile were told to re-calibrate the
    built-in profile or to record with Callgrind, which they were. The counters are there; the
    profile has no model of them: the fix is a profile of this host."""
    from predictor.costs.profile import sgi_power_challenge

    with pytest.raises(NoVariant) as err:
        sgi_power_challenge().select_model(CALLGRIND)
    msg = str(err.value)
    assert err.value.memory and err.value.builtin
    assert "no model of profile sgi-power-challenge uses only the counters recorded" in msg
    assert "predict calibrate --results R.json --out P.toml" in msg
    assert "--backend callgrind" not in msg and "re-calibrate" not in msg
    assert "\n" not in msg


def test_a_calibrated_profile_without_the_variant_is_not_called_built_in(profile) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(NoVariant) as err:
        profile.select_model(("loads", "stores"))
    assert not err.value.builtin and "calibrate the profile again" in str(err.value)
    assert "counterd probe" in str(err.value)
