"""The improved F as an estimator of the toolkit (issue 30: one selection path): linearised at
its fit it is the linear model the t-tests read, and the toolkit's cross-validation search
chooses its terms as it chooses a linear family's."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.costs.calibrate import split_suites
from predictor.costs.fit import ImprovedFit, base_f1_terms
from predictor.costs.joint import LM, WB
from predictor.inputs import results_from_json
from predictor.synthetic import make_results, reference_model
from predictor.toolkit.terms import Const
from predictor.toolkit.terms import parse as term


@pytest.fixture(scope="module")
def noisy():  # type: ignore[no-untyped-def]
    r = results_from_json(make_results(reference_model(processors=2, dtlb=40.0, const=2000.0),
                                       processors=2, noise=0.01, seed=3))
    fit, _ = split_suites(r.patterns)
    return r, fit, np.array([s.time_ns for s in fit])


def test_f_linearised_at_its_fit_is_its_prediction(noisy) -> None:  # type: ignore[no-untyped-def]
    """Given which of F1, F2, F3 dominates each pattern, F is linear in its coefficients:
    the design at the fit times the fitted coefficients gives F's own prediction back."""
    r, fit, t = noisy
    terms = [Const(), *base_f1_terms(r.levels), term("dtlb_misses")]
    est = ImprovedFit(levels=r.levels, processors=2, banks=8).estimator(terms)
    lin = est.linearised(fit, t)
    m = est.model_
    assert lin.terms[0] == Const() and lin.terms[-2:] == (LM, WB) and lin.nonnegative
    c = np.array([m.const, *(m.f1[x] for x in terms[1:]), *m.f2.values(),
                  *(m.f3.get(x, 0.0) for x in (LM, WB))])
    assert lin.X.shape == (len(fit), len(c))
    assert np.allclose(lin.X @ c, est.predict(fit), rtol=1e-12)
    assert set(np.unique(est.dominant_)) <= {0, 1, 2}


def test_the_cross_validation_search_on_f_drops_a_term_that_costs_nothing(noisy) -> None:  # type: ignore[no-untyped-def]
    """select="cv": the toolkit's CrossValidated search on the F estimator; the store
    surcharge (0 in the truth) goes, the constant (paid) stays."""
    r, fit, _ = noisy
    f = ImprovedFit(levels=r.levels, processors=2, banks=8, select="cv",
                    optional_terms=["const", "stores"], base_terms=[
                        *map(str, base_f1_terms(r.levels)), "dtlb_misses"]).fit(fit)
    assert f.dropped_ == [term("stores")]
    assert Const() in f.terms_ and term("dtlb_misses") in f.terms_
    assert f.reasons_[term("stores")].startswith("cross-validated MRE without it")
    assert f.decided_by_ == f"cross-validation (5-fold, MRE; {len(fit)} patterns)"
    assert 1.0 < f.cv_mre_ < 1.05


def test_too_few_patterns_for_a_t_test_hand_f_to_cross_validation(noisy) -> None:  # type: ignore[no-untyped-def]
    r, fit, _ = noisy
    few = fit[:12]  # 7 base terms + 3 optional + F2's and F3's two: too few for a t-test
    f = ImprovedFit(levels=r.levels, processors=2, banks=8,
                    optional_terms=["const", "dtlb_misses", "stores"]).fit(few)
    assert f.decided_by_.startswith("cross-validation") and "12 patterns" in f.decided_by_
    g = ImprovedFit(levels=r.levels, processors=2, banks=8,
                    optional_terms=["const", "dtlb_misses", "stores"]).fit(fit)
    assert g.decided_by_ == f"t-test at 95% confidence ({len(fit)} patterns)"


def test_a_modeler_that_only_selects_says_it_searches_linear_designs_only():
    """A plug-in modeler defining ``select`` alone, given an estimator (as ImprovedFit gives
    F): one typed line naming the modelers that do search, not a NotImplementedError."""
    from dataclasses import dataclass as _dataclass

    from predictor.errors import BadInput
    from predictor.toolkit import modelers

    @_dataclass
    class OnlySelect(modelers.Modeler):
        name = "only-select"

        def select(self, terms, X, y, **kw):  # type: ignore[override]
            return None

    with pytest.raises(BadInput) as got:
        OnlySelect().search(None, np.zeros((2, 1)), np.ones(2), keep=frozenset(),
                            progress=lambda _: None)
    assert "searches linear designs only" in str(got.value)
    assert "brewer" in str(got.value) and "\n" not in str(got.value)
