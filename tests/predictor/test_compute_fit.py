"""The compute terms of F: the toolkit's offset, ComputeFit, and calibration with compute
patterns (microbench/compute.py) beside the memory ones."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest

from predictor.costs.calibrate import (
    ComputeFit,
    calibrate,
    compute_cv,
    compute_patterns,
    split_suites,
    validate,
)
from predictor.costs.costmodel import FModel, coefficients
from predictor.errors import InsufficientPatterns
from predictor.inputs import _pattern_step, results_from_json
from predictor.synthetic import make_results, reference_model
from predictor.toolkit import fitting, modelers
from predictor.toolkit import terms as tm

# The truth the compute patterns follow, on top of the memory model's prediction.
TRUE = {"instructions": 0.08, "branch_misses": 9.0, "page_faults": 1500.0}


def _memory_model() -> FModel:
    """A two-level (L1, last level) model, as Callgrind's counters allow."""
    return FModel(coefficients({"acc": 0.3, "l1d_misses": 0.4, "l3_misses": 4.0,
                                "l3_writebacks": 1.0}),
                  coefficients({"l3_misses": 0.0}), coefficients({}), 0.0, 3, 2, 8, "mem")


def _compute_pattern(i: int, counters: dict[str, float], t: float) -> dict[str, Any]:
    return {"mnemonic": f"compute.k{i}.n1", "suite": "compute", "procs": 1,
            "time_ns": {"samples": [t], "median": t},
            "processors": [{"rank": 0, "cpu": 0, "counters": {
                k: {"value": v, "source": "simulated"} for k, v in counters.items()}}]}


def _compute_patterns(base: FModel, n: int = 16, noise: float = 0.0, seed: int = 0,
                      truth: dict[str, float] = TRUE) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        c = {"instructions": float(rng.uniform(1e5, 4e7)),
             "branch_misses": float(rng.uniform(0, 3e5)),
             "page_faults": float(rng.choice([0, 0, 0, 300, 1000])),
             "loads": float(rng.uniform(1e5, 1e7)), "stores": float(rng.uniform(1e4, 5e6)),
             "l1d_misses": float(rng.uniform(0, 5e5)), "l3_misses": float(rng.uniform(0, 1e4)),
             "l3_writebacks": 0.0}
        step = _pattern_step(i, _compute_pattern(i, c, 1.0))
        t = float(base.predict([step])[0]) + sum(v * c[k] for k, v in truth.items())
        out.append(_compute_pattern(i, c, t * float(np.exp(noise * rng.normal()))))
    return out


def _steps(pats: list[dict[str, Any]]) -> list[Any]:
    return [_pattern_step(i, p) for i, p in enumerate(pats)]


def test_relative_nnls_with_an_offset_fits_only_the_rest() -> None:
    rng = np.random.default_rng(1)
    X = rng.uniform(1, 10, size=(20, 2))
    offset = rng.uniform(5, 50, size=20)
    t = X @ np.array([2.0, 0.5]) + offset
    assert np.allclose(fitting.relative_nnls(X, t, offset), [2.0, 0.5])
    # Without the offset the same columns must absorb it: a different answer.
    assert not np.allclose(fitting.relative_nnls(X, t), [2.0, 0.5], atol=0.05)
    assert np.allclose(fitting.fit_columns(X, t, nonnegative=True, offset=offset), [2.0, 0.5])


def test_significance_with_an_offset_drops_a_term_the_rest_does_not_need() -> None:
    rng = np.random.default_rng(2)
    X = np.column_stack([rng.uniform(1, 10, 40), rng.uniform(1, 10, 40)])
    offset = rng.uniform(5, 50, 40)
    t = (X[:, 0] * 3.0 + offset) * np.exp(0.01 * rng.normal(size=40))
    sel = modelers.Significance().select([tm.Power("a"), tm.Power("b")], X, t, nonnegative=True,
                                         keep=frozenset(), progress=fitting.no_progress,
                                         offset=offset)
    assert [tm.Power("a"), tm.Power("b")][sel.kept[0]] == tm.Power("a") and len(sel.kept) == 1
    assert np.isclose(fitting.cv_mre(X[:, :1], t, folds=5, seed=0, offset=offset), 1.0, atol=0.02)


def test_compute_fit_recovers_the_costs_on_top_of_a_fixed_memory_model() -> None:
    base = _memory_model()
    fit = ComputeFit().fit(base, _steps(_compute_patterns(base)))
    got = {str(k): v for k, v in fit.model_.f1.items()}
    for k, v in TRUE.items():
        assert got[k] == pytest.approx(v, rel=1e-6), k
    # The memory model's miss costs are kept as they were; its access cost is refitted with
    # the compute terms (the microbenchmarks' per-access cost holds their loops' instructions)
    # and comes out as the truth's; the constant, which the truth lacks, goes.
    assert got["l1d_misses"] == 0.4 and got["l3_misses"] == 4.0
    assert got["acc"] == pytest.approx(0.3, rel=1e-6)
    assert set(fit.reasons_) == {tm.Const()}
    assert fit.model_.name == "mem.compute"


def test_compute_fit_with_noise_keeps_the_true_terms_near_their_costs() -> None:
    base = _memory_model()
    fit = ComputeFit().fit(base, _steps(_compute_patterns(base, n=40, noise=0.05)))
    got = {str(k): v for k, v in fit.model_.f1.items()}
    for k, v in {**TRUE, "acc": 0.3}.items():
        assert got[k] == pytest.approx(v, rel=0.25), k  # 5 % noise on every time


def test_compute_fit_refuses_patterns_without_counted_instructions() -> None:
    base = _memory_model()
    pats = _compute_patterns(base)
    for p in pats:
        del p["processors"][0]["counters"]["instructions"]
    with pytest.raises(InsufficientPatterns, match="counted instructions"):
        ComputeFit().fit(base, _steps(pats))


def _results_with_compute(noise: float = 0.0) -> dict[str, Any]:
    doc = make_results(reference_model(levels=(1, 2, 3), processors=2), levels=(1, 2, 3),
                       processors=2, n=20000)
    steps = [_pattern_step(i, p) for i, p in enumerate(doc["patterns"])]
    prof = calibrate(results_from_json(doc))
    base = prof.f_model("improved.l1_llc")
    assert steps
    doc["compute"] = {"backend": "callgrind", "patterns": _compute_patterns(base, n=20,
                                                                           noise=noise)}
    return doc


def test_calibration_adds_a_compute_variant_that_prediction_prefers() -> None:
    doc = _results_with_compute()
    res = results_from_json(json.loads(json.dumps(doc)))
    assert len(compute_patterns(res.patterns)) == 20
    fit_steps, val = split_suites(res.patterns)
    assert all(s.meta.get("suite") != "compute" for s in (*fit_steps, *val))
    prof = calibrate(res)
    assert "improved.l1_llc.compute" in prof.models
    m = prof.models["improved.l1_llc.compute"]
    assert set(m["terms"]) == {*TRUE, "acc"} and m["counter_set"] == "l1_llc+compute"
    assert m["accuracy"]["avg_error"] == pytest.approx(1.0, abs=1e-6)
    # A superstep with Callgrind's counters and instructions gets the compute variant; one
    # without instructions the memory one.
    counted = {"loads", "stores", "l1d_misses", "l3_misses", "l3_writebacks",
               "instructions", "branch_misses", "page_faults"}
    assert prof.select_model(counted) == "improved.l1_llc.compute"
    assert prof.select_model(counted - {"instructions"}) == "improved.l1_llc"
    table = validate(res, prof)
    assert all(not r.function.endswith(".compute)") for r in table.rows)
    rows = {r.function: r for r in table.compute_rows}
    assert rows["F (improved.l1_llc.compute)"].avg_error == pytest.approx(1.0, abs=1e-6)
    assert table.compute_patterns == 20


def test_the_compute_variant_is_chosen_even_where_it_needs_fewer_counters() -> None:
    # As a quick calibration gave on a busy host: the memory model keeps the accesses at a
    # cost of zero, the compute fit (which tries them again) drops them, so the compute
    # variant needs neither loads nor stores. It is still the memory model and more, and a
    # superstep that has its counters gets it; one without page faults the memory model.
    prof = calibrate(results_from_json(_results_with_compute()))
    m = dict(prof.models["improved.l1_llc.compute"])
    m["F1"] = {k: v for k, v in m["F1"].items() if k not in ("acc", "instructions",
                                                             "branch_misses")}
    prof = dataclasses.replace(prof, models={**prof.models, "improved.l1_llc.compute": m})
    assert set(prof.f_model("improved.l1_llc").needs()) - set(
        prof.f_model("improved.l1_llc.compute").needs()) == {"loads", "stores"}
    counted = {"loads", "stores", "l1d_misses", "l3_misses", "l3_writebacks", "page_faults"}
    assert prof.select_model(counted) == "improved.l1_llc.compute"
    assert prof.select_model(counted - {"page_faults"}) == "improved.l1_llc"
    names = prof.variants()
    assert names.index("improved.l1_llc.compute") + 1 == names.index("improved.l1_llc")


def test_a_compute_fit_that_keeps_no_term_leaves_a_note_and_the_memory_variant() -> None:
    # Compute patterns timed below what the memory model alone prices them at (as on a
    # loaded host): no compute term can be positive, so there is no compute variant, the
    # profile says why, and prediction falls back to the memory variant.
    doc = _results_with_compute()
    for p in doc["compute"]["patterns"]:
        p["time_ns"] = {k: (v * 0.01 if k == "median" else [x * 0.01 for x in v])
                        for k, v in p["time_ns"].items()}
    prof = calibrate(results_from_json(doc))
    assert not any(k.endswith(".compute") for k in prof.models)
    notes = [n for n in prof.notes if n.startswith("no improved.l1_llc.compute: ")]
    assert len(notes) == 1 and "no term has a positive cost" in notes[0]
    counted = {"loads", "stores", "l1d_misses", "l3_misses", "l3_writebacks",
               "instructions", "branch_misses", "page_faults"}
    assert prof.select_model(counted) == "improved.l1_llc"


def test_compute_cv_predicts_each_fold_without_it() -> None:
    base = _memory_model()
    steps = _steps(_compute_patterns(base, n=20, noise=0.1, seed=3))
    t = np.array([s.time_ns for s in steps])
    cv = compute_cv(base, steps)
    fitted = ComputeFit().fit(base, steps).model_.predict(steps)
    # Held-out predictions are worse than in-sample ones, never better on the whole.
    assert fitting.mre(t, cv) >= fitting.mre(t, fitted)


def test_validate_without_validation_patterns_cross_validates_on_the_fitting_ones() -> None:
    """The quick suite (make demo) has no validation patterns: `predict validate` judges F's
    variants on the fitting patterns by cross-validation and says so, instead of failing."""
    doc = make_results(reference_model(levels=(1, 2, 3), processors=2), levels=(1, 2, 3),
                       processors=2, n=20000, noise=0.05)
    doc["patterns"] = [p for p in doc["patterns"] if p["suite"] != "validation"]
    res = results_from_json(doc)
    prof = calibrate(res)
    table = validate(res, prof)
    assert table.on.startswith("fitting patterns") and "cross-validated" in table.on
    assert table.patterns == len(split_suites(res.patterns)[0])
    rows = {r.function: r for r in table.rows}
    assert not any(k.startswith(("QSM", "EBSP", "DXBSP")) for k in rows)  # in-sample: left out
    f = rows["F (improved)"]
    # Each fold refitted without its patterns: close to the 5 % noise, yet not in-sample.
    assert 1.0 < f.avg_error < 1.2
    assert f.avg_error == pytest.approx(prof.accuracy("improved")["avg_error"], rel=1e-9)
    assert table.to_json()["on"] == table.on
