"""Fitting: synthetic results generated from known coefficients are recovered; cross-validation
keeps a term that matters and drops one that does not; the 003 toolkit on known answers."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.costs.calibrate import fit_all, split_suites
from predictor.costs.fit import ImprovedFit, PaperFit, fit_bsp
from predictor.errors import InsufficientPatterns, NotFittedError
from predictor.inputs import results_from_json
from predictor.synthetic import make_results, reference_model
from predictor.toolkit.terms import parse as term


def _results(model, **kw):
    return results_from_json(make_results(model, **kw))


def test_paper_fit_recovers_paper_form_coefficients():
    truth = reference_model()  # paper form: no constant, no TLB term; noise-free
    r = _results(truth)
    fit_steps, _ = split_suites(r.patterns)
    pf = PaperFit(levels=r.levels, processors=r.processors, banks=8).fit(fit_steps)
    for k, v in truth.f1.items():
        assert pf.model_.f1[k] == pytest.approx(v, rel=1e-6), k
    for k, v in truth.f2.items():
        assert pf.model_.f2[k] == pytest.approx(v, rel=1e-6), k
    for k, v in truth.f3.items():
        assert pf.model_.f3[k] == pytest.approx(v, rel=1e-6), k
    assert any(".mem." in n and n.startswith("p4.") for n in pf.patterns_["F3"])
    assert all(n.startswith("p1.") for n in pf.patterns_["F1"])


def test_improved_fit_keeps_terms_that_matter_and_drops_the_rest():
    truth = reference_model(dtlb=40.0, const=2000.0)
    r = _results(truth, noise=0.01, seed=3)
    fit_steps, val = split_suites(r.patterns)
    est = ImprovedFit(levels=r.levels, processors=r.processors, banks=8,
                      optional_terms=["const", "dtlb_misses", "stores"], folds=5)
    assert est.fit(fit_steps) is est
    assert term("dtlb_misses") in est.terms_ and term("const") in est.terms_
    assert term("stores") in est.dropped_  # true store surcharge is 0
    m = est.model_
    assert m.const == pytest.approx(2000.0, rel=0.05)
    assert m.f1[term("dtlb_misses")] == pytest.approx(40.0, rel=0.1)
    assert m.f1[term("l3_misses")] == pytest.approx(40.0, rel=0.05)
    assert m.f2[term("l3_misses")] == pytest.approx(60.0, rel=0.05)
    assert m.f3[term("lm")] == pytest.approx(30.0, rel=0.05)
    # Held-out patterns: the error the noise allows, no more.
    t = np.array([s.time_ns for s in val])
    e = np.maximum(t, est.predict(val)) / np.minimum(t, est.predict(val))
    assert e.mean() < 1.03 and e.max() < 1.10


def test_improved_beats_paper_when_the_host_has_a_constant():
    r = _results(reference_model(const=3000.0), noise=0.01, seed=5)
    out = fit_all(r.patterns, levels=r.levels, processors=r.processors, banks=8)
    d = out["diagnostics"]
    assert d["improved"]["max_error"] < 1.1 < d["paper"]["max_error"]


def test_predict_before_fit_raises():
    with pytest.raises(NotFittedError):
        ImprovedFit().predict([])
    with pytest.raises(NotFittedError):
        PaperFit().predict([])
    assert issubclass(NotFittedError, AttributeError)


def test_missing_patterns_are_named():
    d = make_results(reference_model())
    d["patterns"] = [p for p in d["patterns"] if not (p["procs"] == 1 and p["level"] == "L2")]
    r = results_from_json(d)
    with pytest.raises(InsufficientPatterns, match="F1.*level L2"):
        PaperFit(levels=r.levels, processors=r.processors, banks=8).fit(r.patterns)
    d = make_results(reference_model())
    d["patterns"] = [p for p in d["patterns"] if p["procs"] < 4]
    r = results_from_json(d)
    with pytest.raises(InsufficientPatterns, match="F2"):
        PaperFit(levels=r.levels, processors=4, banks=8).fit(r.patterns)


def test_bsp_parameters_come_from_the_extreme_patterns():
    r = _results(reference_model())
    fit_steps, _ = split_suites(r.patterns)
    b = fit_bsp(fit_steps, processors=4, banks=8)
    per_access = {s.name: s.time_ns / s.meta["H"] for s in fit_steps}
    lo, hi = min(per_access, key=per_access.get), max(per_access, key=per_access.get)
    assert b.params["QSM"]["min"][0] == pytest.approx(per_access[lo])
    assert b.params["QSM"]["max"][0] == pytest.approx(per_access[hi])
    # The pattern named as the source attains the maximum (ties: any of them).
    assert per_access[b.patterns["QSM"]["max_patterns"][0]] == pytest.approx(per_access[hi])
    # No hot-word pattern in the synthetic suite: g2 = g1 / p, as the paper's numbers satisfy.
    assert b.params["QSM"]["max"][1] == pytest.approx(per_access[hi] / 4)
    # EBSP g1 only from one-processor patterns.
    assert b.patterns["EBSP"]["max_patterns"][0].startswith("p1.")


