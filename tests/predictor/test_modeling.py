"""The seed-003 modelling toolkit (predictor/toolkit/fitting.py, modelers.py, modeling.py) on known
answers: Brewer's MRE by its definition, NNLS against brute force, coefficients of synthetic
data with known values and relative noise recovered within their standard errors, significance
pruning, prediction intervals whose coverage is measured by replication and matches
statsmodels, validation, the modelers, and the refusals of bad input."""

from __future__ import annotations

import itertools
import json
from functools import cache

import numpy as np
import pytest

from predictor.errors import BadInput
from predictor.toolkit.fitting import check_times, cv_mre, cv_splits, mre, nnls, relative_nnls
from predictor.toolkit.model import Model, fit_model
from predictor.toolkit.modelers import backward_eliminate, make_modeler
from predictor.toolkit.terms import Const, Power, growth_terms, parse, parse_all

GROWTH = ["1", "n", "n*log(n)"]
TRUE = np.array([20.0, 0.5, 0.05])  # y = 20 + 0.5 n + 0.05 n log2(n)


def _mu(n):
    return TRUE[0] + TRUE[1] * n + TRUE[2] * n * np.log2(n)


def _samples(count, noise, seed):
    """n log-uniform on [8, 4096]; y with relative Gaussian noise of sd ``noise``."""
    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(np.log(8), np.log(4096), count))
    return n, _mu(n) * (1 + noise * rng.standard_normal(count))


def _design(n):  # by hand, not through predictor.toolkit.terms
    return np.column_stack([np.ones_like(n), n, n * np.log2(n)])


# -- measures ---------------------------------------------------------------------------------

def test_mre_is_the_geometric_mean_of_relative_errors():
    # (1 + 0)/1 and (2 + 1)/2: sqrt(1 * 1.5)
    assert mre([1.0, 2.0], [1.0, 1.0]) == pytest.approx(np.sqrt(1.5), rel=1e-12)
    # over- and under-prediction count alike: (4 + 1)/4, (4 + 1)/4, (10 + 0)/10
    assert mre([4.0, 4.0, 10.0], [5.0, 3.0, 10.0]) == pytest.approx(1.25 ** (2 / 3), rel=1e-12)
    y = np.array([0.5, 3.0, 1e6])
    assert mre(y, y) == 1.0


def test_check_times_passes_positive_times_and_refuses_the_rest():
    np.testing.assert_array_equal(check_times([[1.0, 2.0]], where="w"), [1.0, 2.0])
    for bad in ([1.0, 0.0, -1.0], [1.0, -1.0], [np.nan, 1.0], [1.0, np.inf]):
        with pytest.raises(BadInput) as e:
            check_times(bad, where="here")
        assert str(e.value).startswith("here: sample ")
        assert "needs finite times > 0" in str(e.value)


def test_check_times_names_the_first_bad_sample_and_its_time():
    with pytest.raises(BadInput) as e:
        check_times([1.0, 0.0, -1.0], where="here")
    assert str(e.value).startswith("here: sample 1 has time 0.0;")


# -- NNLS against brute force -----------------------------------------------------------------

def _brute_nnls(A, b):
    """The best unconstrained least-squares fit over all column subsets whose solution is
    non-negative: the NNLS optimum is one of them, and every one is feasible."""
    k = A.shape[1]
    best, best_x = np.sum(b ** 2), np.zeros(k)
    for r in range(1, k + 1):
        for S in itertools.combinations(range(k), r):
            xs = np.linalg.lstsq(A[:, S], b, rcond=None)[0]
            if np.all(xs >= 0):
                res = np.sum((A[:, S] @ xs - b) ** 2)
                if res < best:
                    x = np.zeros(k)
                    x[list(S)] = xs
                    best, best_x = res, x
    return best_x


def test_nnls_equals_the_brute_force_best_feasible_active_set():
    rng = np.random.default_rng(7)
    A = rng.uniform(0.0, 1.0, (30, 4)) * np.array([1.0, 1e3, 1e-2, 10.0])  # mixed scales
    x_true = np.array([1.0, -0.002, 50.0, 0.3])  # column 1 negative
    b = A @ x_true + 0.01 * rng.standard_normal(30)
    want = _brute_nnls(A, b)
    got = nnls(A, b)
    assert got[1] == 0.0
    assert np.all(got >= 0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
    # a zero column gets a zero coefficient
    Az = np.column_stack([A, np.zeros(30)])
    assert nnls(Az, b)[4] == 0.0


def test_relative_nnls_minimises_relative_error_and_recovers_exact_costs():
    rng = np.random.default_rng(3)
    A = rng.uniform(1.0, 100.0, (25, 3))
    x = np.array([2.0, 0.0, 0.5])
    np.testing.assert_allclose(relative_nnls(A, A @ x), x, rtol=1e-9, atol=1e-12)
    t = A @ np.array([2.0, -0.4, 0.5]) + 60.0
    want = _brute_nnls(A / t[:, None], np.ones_like(t))
    np.testing.assert_allclose(relative_nnls(A, t), want, rtol=1e-6, atol=1e-12)


# -- cross-validation splits and backward elimination -----------------------------------------

def test_cv_splits_test_folds_partition_the_samples():
    splits = cv_splits(23, folds=5, seed=1)
    assert len(splits) == 5
    tests = np.concatenate([te for _, te in splits])
    np.testing.assert_array_equal(np.sort(tests), np.arange(23))
    for tr, te in splits:
        assert sorted([*tr, *te]) == list(range(23))
        assert 4 <= len(te) <= 5
    assert not np.array_equal(splits[0][1], np.arange(5))  # shuffled
    again = cv_splits(23, folds=5, seed=1)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(splits, again, strict=True))


@pytest.mark.parametrize(("n", "folds"), [(4, 5), (5, 5), (2, 10)])
def test_cv_splits_leave_one_out_when_folds_reach_the_samples(n, folds):
    splits = cv_splits(n, folds=folds)
    assert len(splits) == n
    assert sorted(int(te[0]) for _, te in splits) == list(range(n))
    assert all(len(te) == 1 and len(tr) == n - 1 for tr, te in splits)


@pytest.mark.parametrize("n", [0, 1])
def test_cv_splits_refuses_fewer_than_two_samples(n):
    with pytest.raises(BadInput) as e:
        cv_splits(n)
    assert f"two or more samples (have {n})" in str(e.value)


def test_backward_eliminate_keeps_what_matters_on_a_scripted_score():
    calls = []

    def score(items):
        calls.append(list(items))
        s = 1.1 + 1e-4 * ("b" in items) + 2e-4 * ("c" in items)
        return s + (0.9 if "a" not in items else 0.0)  # "a" matters; b, c cost a little

    e = backward_eliminate(["base"], ["a", "b", "c"], score, tol=0.005, floor=1.0)
    assert e.kept == ("a",)
    assert [d for d, _ in e.dropped] == ["c", "b"]  # the better drop first
    assert [s for _, s in e.dropped] == pytest.approx([1.1001, 1.1], rel=1e-12)
    assert e.start == pytest.approx(1.1003, rel=1e-12)
    assert e.score == pytest.approx(1.1, rel=1e-12)
    assert all(c[0] == "base" for c in calls)  # base items are always scored, never dropped


def test_backward_eliminate_stops_where_a_drop_costs_more_than_tol():
    # dropping x raises the excess over the floor from 0.100 to 0.104: 4% > tol 2%, kept;
    # at tol 5% it goes
    def score(items):
        return 1.1 + (0.004 if "x" not in items else 0.0)

    assert backward_eliminate([], ["x"], score, tol=0.02, floor=1.0).kept == ("x",)
    e = backward_eliminate([], ["x"], score, tol=0.05, floor=1.0)
    assert e.kept == () and e.score == pytest.approx(1.104)


# -- known coefficients -----------------------------------------------------------------------

@pytest.mark.parametrize(("noise", "rtol"), [(0.01, (0.02, 0.06, 0.06)),
                                             (0.05, (0.10, 0.30, 0.30))])
def test_known_coefficients_are_recovered_within_their_standard_errors(noise, rtol):
    """y = 20 + 0.5 n + 0.05 n log2 n, 150 samples, relative Gaussian noise of 1% and 5%."""
    n, y = _samples(150, noise, seed=11)
    m = fit_model(GROWTH, {"n": n}, y)
    assert m.terms == parse_all(GROWTH)  # every term matters at both noise levels
    for c, se, want, tol in zip(m.coef, m.stderr, TRUE, rtol, strict=True):
        assert c == pytest.approx(want, rel=tol)
        assert abs(c - want) < 3 * se
    # the standard errors are of the size the noise implies (the relative residual sd)
    assert np.sqrt(m.scale) == pytest.approx(noise, rel=0.15)
    assert m.dof == 150 - 3
    assert m.mre == pytest.approx(np.exp(np.mean(np.log(1 + np.abs(y - _design(n) @ m.coef)
                                                        / y))), rel=1e-12)


def test_noise_free_data_is_fitted_exactly():
    n = np.arange(2.0, 40.0)
    m = fit_model(GROWTH, {"n": n}, _mu(n))
    np.testing.assert_allclose(m.coef, TRUE, rtol=1e-8)
    assert m.mre == pytest.approx(1.0, abs=1e-10)


# -- significance pruning ---------------------------------------------------------------------

def _wls_pvalues(X, y):
    import statsmodels.api as sm

    return np.asarray(sm.WLS(y, X, weights=1.0 / y ** 2).fit().pvalues)


def test_a_term_without_effect_is_dropped_naming_its_p_value():
    """Candidate n^2 has true coefficient 0; 1% noise, 150 samples."""
    n, y = _samples(150, 0.01, seed=5)
    m = fit_model([*GROWTH, "n^2"], {"n": n}, y)
    assert m.terms == parse_all(GROWTH)
    assert m.decided_by == "t-test at 95% confidence"
    assert m.modeler == "brewer"
    (d,) = m.dropped
    assert d.term == parse("n^2")
    p = _wls_pvalues(np.column_stack([_design(n), n ** 2]), y)
    assert p[3] == max(p) and p[3] > 0.05
    assert d.reason == f"not significant: p = {p[3]:.3g} > 0.05"
    assert all(pv < 0.05 for pv in m.pvalues)


@pytest.mark.parametrize("noise", [0.01, 0.02, 0.05])
def test_a_term_with_a_small_effect_is_kept_and_a_useless_one_dropped(noise):
    """y = 100 + 10 w, w in [0, 1], so w contributes about 5% of y; z has no effect.
    At 1%, 2% and 5% noise (120 samples) w is kept and z dropped. (A useless term survives a
    95% test in 5% of samples by construction: the seed is fixed; the rate is measured by
    the next test.)"""
    rng = np.random.default_rng(21)
    w, z = rng.uniform(0, 1, 120), rng.uniform(1, 2, 120)
    y = (100 + 10 * w) * (1 + noise * rng.standard_normal(120))
    m = fit_model(["1", "w", "z"], {"w": w, "z": z}, y)
    assert m.terms == parse_all(["1", "w"])
    assert [d.term for d in m.dropped] == [parse("z")]
    assert m.dropped[0].reason.startswith("not significant: p = ")
    p_w = m.pvalues[1]
    assert p_w < 1e-6
    assert m.coef[1] == pytest.approx(10.0, abs=3 * m.stderr[1])


def test_a_useless_term_survives_the_t_test_at_its_nominal_rate():
    """200 replications of the fit above at 2% noise: z (no effect) is kept where its
    p-value is below 0.05, so in 5% of them (binomial sd 0.015; bounds about 3 sd)."""
    rng = np.random.default_rng(77)
    w, z = rng.uniform(0, 1, 60), rng.uniform(1, 2, 60)
    mu = 100 + 10 * w
    reps, kept_z = 200, 0
    for _ in range(reps):
        y = mu * (1 + 0.02 * rng.standard_normal(60))
        m = fit_model(["1", "w", "z"], {"w": w, "z": z}, y, validation=({"w": w, "z": z}, y))
        assert parse("w") in m.terms
        kept_z += parse("z") in m.terms
    assert 0.01 <= kept_z / reps <= 0.10, kept_z


def test_too_few_samples_for_a_t_test_are_decided_by_cross_validation():
    n = np.array([4.0, 16.0, 64.0, 256.0, 1024.0])  # 5 samples, 3 terms: 2 dof < 3
    m = fit_model(GROWTH, {"n": n}, _mu(n))
    assert m.decided_by.startswith("cross-validation")
    assert "leave-one-out" in m.decided_by
    np.testing.assert_allclose(m.coef, TRUE, rtol=1e-8)
    # one more sample: 3 dof, the t-test decides
    n6 = np.append(n, 2048.0)
    rng = np.random.default_rng(0)
    y6 = _mu(n6) * (1 + 0.001 * rng.standard_normal(6))
    assert fit_model(GROWTH, {"n": n6}, y6).decided_by == "t-test at 95% confidence"


# -- prediction intervals ---------------------------------------------------------------------

COVER_N = np.geomspace(8, 4096, 40)  # fixed design
COVER_NEW = np.array([12.0, 100.0, 700.0, 3000.0])  # new points, inside the range
COVER_NOISE = 0.03
COVER_REPS = 300


@cache
def _coverage():
    """Measured coverage of 95% and 80% prediction intervals: COVER_REPS fits on fresh
    relative noise at a fixed design, each checked on a fresh observation at each new point.
    Also the spread of the fitted coefficients and the mean reported standard errors."""
    rng = np.random.default_rng(2024)
    mu, mu0 = _mu(COVER_N), _mu(COVER_NEW)
    inside = {0.95: 0, 0.80: 0}
    coefs, ses = [], []
    for _ in range(COVER_REPS):
        y = mu * (1 + COVER_NOISE * rng.standard_normal(len(mu)))
        m = fit_model(GROWTH, {"n": COVER_N}, y, keep=GROWTH, validation=({"n": COVER_N}, y))
        y0 = mu0 * (1 + COVER_NOISE * rng.standard_normal(len(mu0)))
        for level in inside:
            iv = m.interval({"n": COVER_NEW}, level)
            inside[level] += int(np.sum((iv.lower <= y0) & (y0 <= iv.upper)))
        coefs.append(m.coef)
        ses.append(m.stderr)
    total = COVER_REPS * len(COVER_NEW)
    return ({k: v / total for k, v in inside.items()}, np.std(coefs, axis=0, ddof=1),
            np.mean(ses, axis=0))


def test_prediction_intervals_cover_at_the_nominal_rate(capsys):
    """1200 fresh observations: a binomial sd of 0.006 at 95% and 0.012 at 80%; the bounds
    allow about 5 sd (observations of one replication share a fit)."""
    cover, _, _ = _coverage()
    assert 0.92 <= cover[0.95] <= 0.98, cover
    assert 0.74 <= cover[0.80] <= 0.86, cover
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_reported_standard_errors_match_the_spread_over_replications():
    _, spread, mean_se = _coverage()
    np.testing.assert_allclose(mean_se, spread, rtol=0.15)


@pytest.mark.parametrize("level", [0.95, 0.80])
def test_interval_equals_statsmodels_get_prediction(level):
    import statsmodels.api as sm

    n, y = _samples(60, 0.03, seed=9)
    m = fit_model(GROWTH, {"n": n}, y, keep=GROWTH)
    n0 = np.array([10.0, 333.0, 4000.0, 9000.0])
    X0 = _design(n0)
    r = sm.WLS(y, _design(n), weights=1.0 / y ** 2).fit()
    yhat0 = X0 @ r.params
    frame = r.get_prediction(X0, weights=1.0 / yhat0 ** 2).summary_frame(alpha=1 - level)
    iv = m.interval({"n": n0}, level)
    np.testing.assert_allclose(iv.mean, frame["mean"], rtol=1e-8)
    np.testing.assert_allclose(iv.lower, frame["obs_ci_lower"], rtol=1e-8)
    np.testing.assert_allclose(iv.upper, frame["obs_ci_upper"], rtol=1e-8)
    np.testing.assert_allclose(m.coef, r.params, rtol=1e-8)
    np.testing.assert_allclose(m.stderr, r.bse, rtol=1e-8)
    np.testing.assert_allclose(m.pvalues, r.pvalues, rtol=1e-6)
    assert iv.level == level


def test_a_model_without_residual_dof_has_infinite_intervals():
    n = np.array([4.0, 32.0, 256.0])
    m = fit_model(GROWTH, {"n": n}, _mu(n), keep=GROWTH)
    assert m.dof == 0
    iv = m.interval({"n": np.array([10.0])})
    assert iv.lower[0] == -np.inf and iv.upper[0] == np.inf
    assert iv.mean[0] == pytest.approx(_mu(10.0), rel=1e-8)


# -- files ------------------------------------------------------------------------------------

def test_to_dict_from_dict_round_trip_predicts_the_same():
    n, y = _samples(80, 0.02, seed=4)
    m = fit_model([*GROWTH, "n^2"], {"n": n}, y)
    d = json.loads(json.dumps(m.to_dict()))
    back = Model.from_dict(d)
    n0 = {"n": np.array([9.0, 500.0, 5000.0])}
    assert back.terms == m.terms
    np.testing.assert_array_equal(back.predict(n0), m.predict(n0))
    a, b = m.interval(n0, 0.9), back.interval(n0, 0.9)
    np.testing.assert_array_equal(a.lower, b.lower)
    np.testing.assert_array_equal(a.upper, b.upper)
    assert back.dropped == m.dropped
    assert back.validation == m.validation
    assert back.formula() == m.formula() == d["formula"]
    assert (back.decided_by, back.modeler, back.dof) == (m.decided_by, m.modeler, m.dof)


def test_a_loaded_model_keeps_its_sample_count():
    n, y = _samples(40, 0.02, seed=4)
    d = fit_model(GROWTH, {"n": n}, y).to_dict()
    assert Model.from_dict(d).n == 40
    assert Model.from_dict(d).to_dict() == d


@pytest.mark.parametrize("mangle", [
    lambda d: d.pop("coef"),
    lambda d: d.update(coef=d["coef"][:-1]),
    lambda d: d.update(cov=[[1.0]]),
    lambda d: d.update(dof="many"),
    lambda d: d.update(terms=None),
    lambda d: d.update(terms=["1", "n", "n"]),
    lambda d: d.update(terms=["1", "n", "n^^2"]),
    lambda d: d.update(dropped=[{"reason": "x"}]),
    lambda d: d.update(validation={"on": "x"}),
], ids=["no coef", "short coef", "bad cov", "bad dof", "no terms", "twice", "unreadable",
        "bad dropped", "bad validation"])
def test_a_mangled_model_dict_is_refused(mangle):
    n, y = _samples(40, 0.02, seed=4)
    d = fit_model(GROWTH, {"n": n}, y).to_dict()
    mangle(d)
    with pytest.raises(BadInput):
        Model.from_dict(d)


# -- formula ----------------------------------------------------------------------------------

def _model(terms, coef):
    k = len(coef)
    return Model(parse_all(terms), np.array(coef, float), np.zeros(k), np.zeros(k),
                 np.zeros((k, k)), 0.0, 10, 1.0, 1.0, "by hand", "brewer")


def test_formula_prints_signs_as_003_does():
    assert _model(["1", "x"], [3.0, -2.0]).formula() == "3 - 2*x"
    assert _model(["1", "x"], [-3.0, 2.0]).formula() == "-3 + 2*x"
    assert _model(["1", "w", "i*w*h"], [9.04, 6.186, -0.04406]).formula() == \
        "9.04 + 6.186*w - 0.04406*h*i*w"
    assert _model(["x"], [1.23456789]).formula(digits=3) == "1.23*x"
    x = np.linspace(1.0, 10.0, 20)
    fitted = fit_model(["1", "x"], {"x": x}, 12.0 - 0.5 * x)
    assert fitted.formula() == "12 - 0.5*x"


# -- validation -------------------------------------------------------------------------------

def test_validation_on_independent_samples_reports_their_mre():
    n, y = _samples(100, 0.02, seed=1)
    vn, vy = _samples(30, 0.02, seed=2)
    m = fit_model(GROWTH, {"n": n}, y, validation=({"n": vn}, vy))
    assert m.validation is not None
    assert m.validation.on == "independent samples"
    assert m.validation.n == 30
    p = _design(vn) @ m.coef
    want = np.exp(np.mean(np.log((vy + np.abs(vy - p)) / vy)))
    assert m.validation.mre == pytest.approx(want, rel=1e-12)
    assert m.validation.mre == pytest.approx(mre(vy, m.predict({"n": vn})), rel=1e-12)
    assert m.validate({"n": vn}, vy) == pytest.approx(want, rel=1e-12)
    assert 1.0 < m.validation.mre < 1.05  # 2% noise


def test_holdout_holds_out_a_quarter_of_the_samples():
    n, y = _samples(100, 0.02, seed=1)
    m = fit_model(GROWTH, {"n": n}, y, holdout=0.25)
    assert m.validation is not None
    assert m.validation.on == "independent samples"
    assert m.validation.n == 25
    assert m.n == 75
    fitted = set(m.inputs["n"].tolist())
    assert len(fitted) == 75 and fitted <= set(n.tolist())
    held = np.array(sorted(set(n.tolist()) - fitted))
    held_y = np.array([y[np.flatnonzero(n == v)[0]] for v in held])
    assert m.validation.mre == pytest.approx(m.validate({"n": held}, held_y), rel=1e-12)


def test_without_validation_samples_the_mre_is_cross_validated():
    n, y = _samples(100, 0.02, seed=1)
    m = fit_model(GROWTH, {"n": n}, y)
    assert m.validation is not None
    assert m.validation.on == "5-fold cross-validation"
    assert m.validation.n == 100
    assert m.validation.mre >= m.mre * 0.999  # out-of-sample is no better than in-sample
    small = fit_model(GROWTH, {"n": n[:5]}, y[:5])
    assert small.validation is not None
    assert small.validation.on == "leave-one-out cross-validation"


# -- modelers ---------------------------------------------------------------------------------

def test_single_term_modeler_picks_the_generating_growth_term():
    rng = np.random.default_rng(8)
    n = np.geomspace(4, 512, 40)
    y = (50 + 0.2 * n ** 2) * (1 + 0.01 * rng.standard_normal(40))
    m = fit_model(growth_terms("n"), {"n": n}, y, modeler="single")
    assert m.terms == (Const(), Power("n", 2.0))
    assert m.modeler == "single"
    assert m.coef[1] == pytest.approx(0.2, rel=0.02)
    assert len(m.dropped) == len(growth_terms("n")) - 2
    assert m.decided_by.startswith("cross-validation (one term")


def test_cv_modeler_drops_a_useless_term():
    rng = np.random.default_rng(12)
    n, z = rng.uniform(10, 1000, 80), rng.uniform(1, 2, 80)
    y = (5 + 0.3 * n) * (1 + 0.01 * rng.standard_normal(80))
    m = fit_model(["1", "n", "z"], {"n": n, "z": z}, y, modeler="cv")
    assert m.terms == parse_all(["1", "n"])
    assert [d.term for d in m.dropped] == [parse("z")]
    assert "5-fold cross-validated MRE without it" in m.dropped[0].reason
    assert m.decided_by == "cross-validation (5-fold, MRE)"
    assert m.modeler == "cv"


def test_make_modeler_refuses_an_unknown_name_listing_the_names():
    with pytest.raises(BadInput) as e:
        make_modeler("nope")
    assert "'nope'" in str(e.value)
    assert e.value.fix == "choose one of brewer, cv, fixed, single"
    assert make_modeler("cv", folds=3).folds == 3


@pytest.mark.parametrize(("modeler", "keep", "reason"), [
    ("brewer", (), "its least-squares cost is negative (costs are kept >= 0)"),
    # cv: with b's cost held at 0 in every fold, removing b costs nothing, so cv drops it
    ("cv", (), "cross-validated MRE without it"),
    # kept from the search, b still cannot have a cost below 0: the final fit drops it
    ("cv", ("b",), "its least-squares cost is negative"),
])
def test_nonnegative_drops_a_term_whose_cost_would_be_negative(modeler, keep, reason):
    """y = 50 + 2 a - 1 b (0.5% noise): unconstrained, b's cost is -1."""
    rng = np.random.default_rng(13)
    a, b = rng.uniform(10, 20, 60), rng.uniform(0, 10, 60)
    y = (50 + 2 * a - 1 * b) * (1 + 0.005 * rng.standard_normal(60))
    free = fit_model(["1", "a", "b"], {"a": a, "b": b}, y, modeler=modeler)
    assert free.coef[2] == pytest.approx(-1.0, rel=0.1)
    m = fit_model(["1", "a", "b"], {"a": a, "b": b}, y, modeler=modeler, nonnegative=True,
                  keep=keep)
    assert parse("b") not in m.terms
    assert parse("a") in m.terms
    assert np.all(m.coef >= 0)
    (d,) = [d for d in m.dropped if d.term == parse("b")]
    assert reason in d.reason


# -- bad input --------------------------------------------------------------------------------

N10 = np.arange(1.0, 11.0)

def _bad(terms, table, times, what, fix, id, marks=()):
    return pytest.param(terms, table, times, what, fix, id=id, marks=marks)


@pytest.mark.parametrize(("terms", "table", "times", "what", "fix"), [
    _bad(["1", "n", "n^2"], {"n": N10[:2]}, [1.0, 2.0], "2 samples for 3 terms",
         "profile at least 3 runs", "fewer samples than terms"),
    _bad(GROWTH, {"n": N10}, [*N10[:9], np.nan], "job: sample 9 has time", "drop failed",
         "nan time"),
    _bad(GROWTH, {"n": N10}, [*N10[:4], -1.0, *N10[5:]], "job: sample 4 has time",
         "drop failed", "negative time"),
    _bad(GROWTH, {"n": N10}, [0.0, *N10[1:]], "job: sample 0 has time", "drop failed",
         "zero time"),
    _bad(GROWTH, {"n": N10}, [*N10[:9], np.nan], "sample 9 has time nan;", "drop failed",
         "nan time printed"),
    _bad(GROWTH, {"n": N10}, [*N10[:4], -1.0, *N10[5:]], "sample 4 has time -1.0;",
         "drop failed", "negative time printed"),
    _bad(["1", "n"], {"n": np.full(10, 8.0)}, N10,
         "the term n takes one value on every sample", "profile over more than one value of n",
         "parameter grid with one value"),
    _bad(["1", "n", "acc"], {"n": N10, "loads": np.zeros(10), "stores": np.zeros(10)}, N10,
         "the term acc is zero on every sample", "drop it", "all-zero column"),
    _bad(GROWTH, {"n": N10}, N10[:8], "10 input samples but 8 times", "one time per sample",
         "times and inputs differ in length"),
    _bad(["n", "m"], {"n": N10, "m": N10[:7]}, N10, "different numbers of samples",
         "one value per sample", "inputs differ in length"),
    _bad(["1", "n", "m"], {"n": N10, "m": N10[:7]}, N10, "different numbers of samples",
         "one value per sample", "inputs differ in length, constant first"),
    _bad([], {"n": N10}, N10, "no terms to fit", "list one or more terms", "no terms"),
    _bad(["1", "n", "n"], {"n": N10}, N10, "the term n is listed twice",
         "list every term once", "duplicate term"),
])
def test_bad_input_is_refused_saying_what_and_the_fix(terms, table, times, what, fix):
    with pytest.raises(BadInput) as e:
        fit_model(terms, table, times, where="job")
    assert what in e.value.what
    assert e.value.fix and fix in e.value.fix
    assert what in str(e.value) and fix in str(e.value)


def test_bad_validation_times_are_refused():
    with pytest.raises(BadInput) as e:
        fit_model(GROWTH, {"n": N10}, _mu(N10), validation=({"n": N10[:2]}, [1.0, -1.0]))
    assert str(e.value).startswith("fit: validation: sample 1 has time ")


# -- progress ---------------------------------------------------------------------------------

def test_progress_goes_to_the_injected_callback_and_nowhere_by_default(capsys):
    n, y = _samples(150, 0.01, seed=5)
    messages: list[str] = []
    fit_model([*GROWTH, "n^2"], {"n": n}, y, progress=messages.append)
    assert len(messages) == 2
    assert messages[0].startswith("dropped n^2 (p = ")
    assert messages[1].startswith("kept 3 of 4 terms; MRE ")
    few: list[str] = []
    fit_model(GROWTH, {"n": n[:5]}, y[:5], progress=few.append)
    assert "too few for a t-test, cross-validation decides" in few[0]
    capsys.readouterr()
    fit_model([*GROWTH, "n^2"], {"n": n}, y)
    fit_model(GROWTH, {"n": n[:5]}, y[:5])
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_a_new_modeler_plugs_in_without_touching_callers():
    """A term search is one class with a name: an instance goes wherever a name does (here a
    search that keeps the first two candidates), and callers see its name and decision."""
    from dataclasses import dataclass
    from typing import ClassVar

    from predictor.toolkit.modelers import Modeler, Selection

    @dataclass
    class FirstTwo(Modeler):
        name: ClassVar[str] = "first-two"

        def select(self, terms, X, y, *, nonnegative, keep, progress):
            progress("keeping the first two")
            return Selection((0, 1), (), "the first two, by fiat")

    n = np.linspace(10.0, 100.0, 30)
    seen: list[str] = []
    m = fit_model(["1", "n", "n^2"], {"n": n}, 5.0 + 2.0 * n + 0.01 * n ** 2,
                  modeler=FirstTwo(), progress=seen.append)
    assert [str(t) for t in m.terms] == ["1", "n"]
    assert m.modeler == "first-two" and m.decided_by == "the first two, by fiat"
    assert "keeping the first two" in seen


def test_a_model_with_no_terms_is_never_chosen_and_nnls_survives_no_columns():
    """scipy 1.17.1's nnls aborts the process on a matrix with no columns: ours answers, and
    the cv modeler, free to drop the constant of a constant model, keeps it."""
    assert nnls(np.ones((4, 0)), np.ones(4)).shape == (0,)
    assert cv_mre(np.ones((5, 0)), np.ones(5), folds=5, seed=0) == float("inf")
    y = np.array([158246.0, 158030.0, 158226.0, 158114.0, 158426.0])
    m = fit_model([Const()], {"n": np.arange(1.0, 6.0)}, y, modeler="cv", nonnegative=True)
    assert m.formula().startswith("1.582e+05") and len(m.terms) == 1


def test_absolute_errors_are_ordinary_least_squares_and_fixed_keeps_every_term():
    """errors="absolute" minimises the absolute residuals (numpy's lstsq is the reference);
    the fixed modeler keeps a term that a search would drop; the model remembers and reloads
    what it minimised, and its interval's noise is then the residual variance, not relative."""
    rng = np.random.default_rng(7)
    x = rng.uniform(1.0, 100.0, 80)
    z = rng.uniform(1.0, 100.0, 80)
    y = 50.0 + 2.0 * x + 0.001 * z + rng.normal(0.0, 5.0, 80)
    m = fit_model(["1", "x", "z"], {"x": x, "z": z}, y, modeler="fixed", errors="absolute")
    ref, *_ = np.linalg.lstsq(np.column_stack([np.ones(80), x, z]), y, rcond=None)
    assert m.coef == pytest.approx(ref, rel=1e-9)
    assert [str(t) for t in m.terms] == ["1", "x", "z"] and m.decided_by.startswith("fixed")
    rel = fit_model(["1", "x", "z"], {"x": x, "z": z}, y, modeler="fixed")
    assert not np.allclose(rel.coef, ref)  # relative weights give another fit
    pruned = fit_model(["1", "x", "z"], {"x": x, "z": z}, y, errors="absolute")
    assert "z" not in [str(t) for t in pruned.terms]  # z's effect is far below the noise
    back = Model.from_dict(m.to_dict())
    assert back.errors == "absolute" and back.coef == pytest.approx(m.coef)
    iv = m.interval({"x": np.array([50.0]), "z": np.array([50.0])})
    half = float(iv.upper[0] - iv.mean[0])
    assert 5.0 < half < 15.0  # about t * 5 (the noise), not proportional to y ~ 150
    with pytest.raises(BadInput):
        fit_model(["1", "x"], {"x": x}, y, errors="squared")  # type: ignore[arg-type]
