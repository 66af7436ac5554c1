"""The noise floor: E between two measurements of the same validation patterns, by each way of
summarising repetitions, checked against hand-computed values."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from predictor.costs import floor
from predictor.errors import BadInput
from predictor.inputs import Step, results_from_json
from predictor.synthetic import make_results, reference_model

DOC = make_results(reference_model(processors=2), processors=2)


def _with_samples(samples_by_index, flags_by_index=None):
    """DOC with the validation patterns' repetitions set; the i-th validation pattern gets
    samples_by_index[i] (cycled)."""
    d = copy.deepcopy(DOC)
    val = [p for p in d["patterns"] if p["suite"] == "validation"]
    for i, p in enumerate(val):
        x = samples_by_index[i % len(samples_by_index)]
        p["time_ns"] = {"samples": list(x), "median": sorted(x)[len(x) // 2]}
        p["flags"] = (flags_by_index or {}).get(i % len(samples_by_index), [])
    return results_from_json(d, "<test>"), len(val)


def test_between_runs_by_each_summary():
    a, n = _with_samples([[100, 110, 400]])
    b, _ = _with_samples([[120, 100, 105]])
    med = floor.between_runs(a, b, "median")
    assert len(med.e) == n and med.average == pytest.approx(110 / 105)
    assert floor.between_runs(a, b, "minimum").maximum == pytest.approx(1.0)
    assert floor.between_runs(a, b, "mean").average == pytest.approx((610 / 3) / (325 / 3))
    # trimmed 20 % of 3 samples trims nothing (int(0.2 * 3) = 0): the mean
    assert floor.between_runs(a, b, "trimmed mean").average == pytest.approx(610 / 325)
    assert med.how == "two runs" and med.worst(1)[0][1] == pytest.approx(110 / 105)


def test_within_run_splits_odd_and_even_repetitions():
    a, _ = _with_samples([[100, 200, 100, 200]])
    f = floor.within_run(a, "median")
    assert f.maximum == pytest.approx(2.0) and f.how == "halves of one run"


def test_disturbed_patterns_can_be_left_out():
    a, n = _with_samples([[100, 100], [100, 100]], {1: ["steal"]})
    b, _ = _with_samples([[100, 100], [300, 300]])
    f = floor.between_runs(a, b)
    assert f.maximum == pytest.approx(3.0)
    u = f.undisturbed()
    assert len(u.e) == n - n // 2 and u.maximum == pytest.approx(1.0)


def test_results_without_repetitions_or_in_common_are_refused():
    d = copy.deepcopy(DOC)
    for p in d["patterns"]:
        p["time_ns"] = {"median": 5.0}
    r = results_from_json(d, "bare.json")
    with pytest.raises(BadInput, match="no repetition times"):
        floor.between_runs(r, r)
    t = copy.deepcopy(DOC)
    t["patterns"] = [p for p in t["patterns"] if p["suite"] != "validation"]
    with pytest.raises(BadInput, match="no validation pattern was measured twice"):
        floor.between_runs(results_from_json(t), results_from_json(t))


def test_the_floor_beside_an_accuracy_table(tmp_path, capsys):
    """``predict validate``: within-run floor by default, between runs with --floor, none
    (and no failure) for results with one repetition per pattern."""
    import json

    from predictor.cli import main
    from predictor.costs.calibrate import calibrate
    from predictor.costs.profile import save_profile

    a, _ = _with_samples([[100, 110, 120, 130]])
    b, _ = _with_samples([[150, 160, 170, 180]])
    prof = save_profile(calibrate(a), tmp_path / "p.toml")
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    for f, doc in ((fa, a), (fb, b)):
        d = copy.deepcopy(DOC)
        by_name = {s.name: s for s in doc.patterns}
        for p in d["patterns"]:
            x = by_name[p["mnemonic"]].meta.get("time_samples")
            if x:
                p["time_ns"] = {"samples": list(x), "median": sorted(x)[len(x) // 2]}
        f.write_text(json.dumps(d))
    assert main(["validate", "--results", str(fa), "--profile", str(prof), "--json"]) == 0
    nf = json.loads(capsys.readouterr().out)["noise_floor"]
    assert nf["how"] == "halves of one run" and nf["maximum"] == pytest.approx(120 / 110)
    assert main(["validate", "--results", str(fa), "--profile", str(prof), "--floor",
                 str(fb)]) == 0
    out = capsys.readouterr().out
    assert "noise floor" in out and "two runs" in out and f"{165 / 115:.2f}" in out
    one = tmp_path / "one.json"
    one.write_text(json.dumps(DOC))
    assert main(["validate", "--results", str(one), "--profile", str(prof), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["noise_floor"] is None


# -- what counts can explain (floor.explained) ------------------------------------------------

def _step(name, loads, misses, time_ns, procs=1):
    return Step(name, {"loads": np.full(procs, float(loads)),
                       "l1d_misses": np.full(procs, float(misses))}, time_ns=float(time_ns))


def test_times_that_are_a_sum_of_the_counts_are_explained_exactly():
    # T = 2 ns per load + 30 ns per miss: the in-sample fit finds it (E 1 everywhere)
    steps = [_step(f"s{i}", n, m, 2 * n + 30 * m)
             for i, (n, m) in enumerate([(100, 0), (100, 10), (50, 50), (200, 5)])]
    x = floor.explained(steps, ["loads", "l1d_misses"])
    assert x.maximum == pytest.approx(1.0, abs=1e-3)
    assert x.costs == pytest.approx((2.0, 30.0), rel=1e-2) and x.converged


def test_the_same_counts_at_two_times_cannot_be_explained_better_than_their_geometric_mean():
    # identical counts measured at T and 2T: any prediction P gives max(P/T, T/P) and
    # max(P/2T, 2T/P), whose mean is least (sqrt 2) at P = sqrt(2) T
    steps = [_step("a", 100, 10, 1000), _step("b", 100, 10, 2000, procs=2)]
    x = floor.explained(steps, ["loads", "l1d_misses"])
    assert x.average == pytest.approx(2 ** 0.5, rel=1e-3)
    assert x.worst(1)[0][1] == pytest.approx(2 ** 0.5, rel=1e-3)


def test_explained_refuses_steps_without_a_counter_or_time():
    with pytest.raises(BadInput, match="l2_misses"):
        floor.explained([_step("a", 1, 1, 5)], ["l2_misses"])
    with pytest.raises(BadInput, match="time"):
        floor.explained([_step("a", 1, 1, 0)], ["loads"])
