"""The modelling toolkit of seed 003 (Brewer, "High-level optimization via automated statistical
modeling", section 2 and its footnote 1), on statsmodels, scipy and scikit-learn.

Given terms (:mod:`predictor.terms`), inputs and measured times, :func:`fit_model`

1. fits the coefficients by least squares "using weights that minimize relative rather than
   absolute error": weighted least squares with weights 1/y^2 (statsmodels ``WLS``), or, for
   cost functions whose coefficients are costs per event, non-negative least squares
   (``scipy.optimize.nnls``) on the same weighted system;
2. "throws out statistically insignificant terms and recomputes the remaining coefficients":
   the term with the largest p-value above 0.05 (t-test of the null hypothesis that its
   coefficient is 0, i.e. outside the 95% confidence interval) is dropped and the rest refitted,
   until every term is significant. Where the samples are too few for a t-test (fewer than
   ``min_dof`` residual degrees of freedom), cross-validation decides instead, and the model says
   which (``decided_by``). The search is pluggable (:class:`Modeler`, :data:`MODELERS`);
3. "validates the model against an independent set of profile samples": the MRE on samples held
   apart (``validation=`` or ``holdout=``), else on k-fold cross-validation, and says which.

The MRE is 003's equation 1, the geometric mean of (y + |y - y_hat|) / y: 1.0 is perfect, and
003 quotes (MRE - 1) as a percentage.

The :class:`Model` keeps its terms, coefficients, standard errors, p-values, covariance,
diagnostics and the data it was fitted on, and predicts with a prediction interval. The interval
is computed here from the stored covariance (a model loaded from a file has no statsmodels
results object): for a new point x0 with prediction y0, Var = x0 Cov x0' + scale * y0^2 (the
variance of one observation under relative weights 1/y^2), times Student's t at the residual
degrees of freedom. ``tests/predictor/test_modeling.py`` checks it against statsmodels' own
``get_prediction`` on the same fit.
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from predictor import terms as tm
from predictor.errors import BadInput

Array = NDArray[np.float64]
Progress = Callable[[str], None]
T = TypeVar("T")
# What least squares minimises: relative errors (weights 1/y^2, seed 003's choice and the
# default) or absolute ones (ordinary least squares, the memory-lines-touched paper's eq. 9).
Errors = Literal["relative", "absolute"]
ERRORS: tuple[str, ...] = ("relative", "absolute")


def no_progress(message: str) -> None:
    """The default progress sink: library code never prints (STYLE.md)."""


# -- measures -------------------------------------------------------------------------------

def mre(t: ArrayLike, p: ArrayLike) -> float:
    """Brewer's mean relative error (seed 003 eq. 1): the geometric mean of
    (y + |y - y_hat|) / y over the samples; 1.0 is perfect."""
    ta, pa = np.asarray(t, dtype=np.float64), np.asarray(p, dtype=np.float64)
    return float(np.exp(np.mean(np.log((ta + np.abs(ta - pa)) / ta))))


def check_times(y: ArrayLike, *, where: str) -> Array:
    """Measured times for a relative-error fit: finite and > 0, else a BadInput naming the
    first bad sample."""
    a = np.asarray(y, dtype=np.float64).ravel()
    bad = np.flatnonzero(~np.isfinite(a) | (a <= 0))
    if bad.size:
        raise BadInput(f"{where}: sample {int(bad[0])} has time {float(a[bad[0]])!r}; a "
                       "relative-error "
                       "fit needs finite times > 0",
                       "drop failed or unmeasured runs from the samples")
    return a


# -- cross-validation and least squares (the libraries) ---------------------------------------

def cv_splits(n: int, folds: int = 5, seed: int = 0) -> list[tuple[NDArray[np.intp],
                                                                    NDArray[np.intp]]]:
    """(train, test) index pairs: scikit-learn's shuffled KFold, leave-one-out when
    ``folds >= n``."""
    from sklearn.model_selection import KFold, LeaveOneOut

    if n < 2:
        raise BadInput(f"cross-validation needs two or more samples (have {n})",
                       "profile more runs")
    splitter = (LeaveOneOut() if folds >= n
                else KFold(n_splits=max(2, folds), shuffle=True, random_state=seed))
    return [(np.asarray(a), np.asarray(b)) for a, b in splitter.split(np.zeros((n, 1)))]


def nnls(a: ArrayLike, b: ArrayLike) -> Array:
    """argmin ||A x - b|| subject to x >= 0 (``scipy.optimize.nnls``). Columns are scaled to
    unit norm first, so terms of very different magnitude (accesses vs a constant) converge
    alike; zero columns get a zero coefficient."""
    from scipy.optimize import nnls as _nnls

    A = np.asarray(a, dtype=np.float64)
    if A.ndim != 2 or A.shape[1] == 0:
        # scipy 1.17.1's nnls aborts the process (a double free) on a matrix with no columns
        return np.zeros(A.shape[1] if A.ndim == 2 else 0)
    norms = np.linalg.norm(A, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    x, _ = _nnls(A / scale, np.asarray(b, dtype=np.float64), maxiter=50 * max(1, A.shape[1]))
    return np.where(norms > 0, x / scale, 0.0)


def relative_nnls(a: ArrayLike, t: ArrayLike, offset: ArrayLike | None = None) -> Array:
    """Non-negative least squares on T-normalised residuals: minimise sum ((A x + o - T) / T)^2
    (seed 003 footnote 1: weights that minimise relative rather than absolute error); ``o``,
    the ``offset``, is a known part of every prediction (default 0)."""
    A = np.asarray(a, dtype=np.float64)
    tt = np.asarray(t, dtype=np.float64)
    rhs = np.ones_like(tt) if offset is None else 1.0 - np.asarray(offset, float) / tt
    return nnls(A / tt[:, None], rhs)


@dataclass(frozen=True)
class _Wls:
    coef: Array
    stderr: Array
    pvalues: Array
    cov: Array
    scale: float
    dof: int
    r2: float


def _wls(X: Array, y: Array, offset: Array | None = None, errors: Errors = "relative") -> _Wls:
    """statsmodels WLS of y - offset on X with weights 1/y^2 (the error stays relative to y),
    or 1 for ``errors="absolute"`` (OLS): t-tests, covariance, residual scale."""
    import statsmodels.api as sm

    # Columns scaled to unit weighted norm: growth terms span many decades (n^3 log^2 n beside
    # a constant), and statsmodels' pseudo-inverse would call such a design rank-deficient.
    k = X.shape[1]
    w = 1.0 / y ** 2 if errors == "relative" else np.ones_like(y)
    norms = np.linalg.norm(X * np.sqrt(w)[:, None], axis=0)
    s = np.where(norms > 0, norms, 1.0)
    with warnings.catch_warnings():
        # dof 0 (as many samples as terms) makes statsmodels warn about division by zero;
        # the caller decides by cross-validation there, and the intervals say infinite.
        warnings.simplefilter("ignore", RuntimeWarning)
        r = sm.WLS(y if offset is None else y - offset, X / s, weights=w).fit()
        dof = int(round(r.df_resid))
        if dof <= 0:
            return _Wls(np.asarray(r.params, float) / s, np.full(k, np.inf),
                        np.full(k, np.nan), np.full((k, k), np.inf), np.inf, dof, float("nan"))
        return _Wls(np.asarray(r.params, float) / s, np.asarray(r.bse, float) / s,
                    np.asarray(r.pvalues, float),
                    np.asarray(r.cov_params(), float) / np.outer(s, s), float(r.scale), dof,
                    float(r.rsquared))


def _fit_columns(X: Array, y: Array, nonnegative: bool, offset: Array | None = None,
                 errors: Errors = "relative") -> tuple[_Wls, NDArray[np.bool_]]:
    """The fit on the columns of X, and which columns it used. Non-negative: scipy's NNLS on
    the relative-error system finds the columns with a positive cost; the unconstrained WLS on
    those columns has the same solution (the NNLS optimality conditions) and gives the
    statistics."""
    used = np.ones(X.shape[1], dtype=bool)
    if nonnegative:
        used = (relative_nnls(X, y, offset) if errors == "relative"
                else nnls(X, y if offset is None else y - offset)) > 0
        if not used.any():
            raise BadInput("no term has a positive cost on these samples",
                           "check that the times grow with the terms")
    return _wls(X[:, used], y, offset, errors), used


def fit_columns(X: Array, y: Array, nonnegative: bool = False, offset: Array | None = None,
                errors: Errors = "relative") -> Array:
    """Coefficients only (zeros for unused columns): the inner fit of cross-validation."""
    r, used = _fit_columns(X, y, nonnegative, offset, errors)
    out = np.zeros(X.shape[1])
    out[used] = r.coef
    return out


def cv_mre(X: Array, y: Array, *, folds: int, seed: int, nonnegative: bool = False,
           offset: Array | None = None, errors: Errors = "relative") -> float:
    """Cross-validated MRE of the linear fit on X's columns (plus ``offset``, a known part of
    every prediction); inf for no columns, or where a fold has fewer training samples than
    columns."""
    if X.shape[1] == 0:
        return float("inf")  # no terms: not a model
    off = np.zeros(len(y)) if offset is None else np.asarray(offset, float)
    pred = np.zeros(len(y))
    for train, test in cv_splits(len(y), folds, seed):
        if len(train) < X.shape[1]:
            return float("inf")
        pred[test] = X[test] @ fit_columns(X[train], y[train], nonnegative,
                                           None if offset is None else off[train],
                                           errors) + off[test]
    return mre(y, pred)


# -- term selection: the modelers ------------------------------------------------------------

@dataclass(frozen=True)
class Dropped:
    term: tm.Term
    reason: str


@dataclass(frozen=True)
class Selection:
    """What a term search kept (indices into the candidate terms), what it dropped and why,
    and what decided."""

    kept: tuple[int, ...]
    dropped: tuple[Dropped, ...]
    decided_by: str


class Modeler(ABC):
    """A term search with a name (as Extra-P's modelers): which of the candidate terms a model
    keeps. ``fit_model`` fits, validates and packages what the search keeps."""

    name: ClassVar[str]
    # Whether the search fits every candidate at once (then they must be independent).
    fits_all: ClassVar[bool] = True

    @abstractmethod
    def select(self, terms: Sequence[tm.Term], X: Array, y: Array, *, nonnegative: bool,
               keep: frozenset[tm.Term], progress: Progress,
               offset: Array | None = None, errors: Errors = "relative") -> Selection:
        """Indices of the terms to keep. ``offset``: a known part of every prediction, not
        fitted (the predicted times are ``X @ coef + offset``); ``errors``: what the fits
        minimise."""


@dataclass(frozen=True)
class Elimination(Generic[T]):
    kept: tuple[T, ...]
    dropped: tuple[tuple[T, float], ...]  # in order, with the score after each drop
    start: float  # the score with every item
    score: float  # the score of the kept items


def backward_eliminate(base: Sequence[T], optional: Sequence[T],
                       score: Callable[[Sequence[T]], float], tol: float = 0.005,
                       floor: float = 0.0) -> Elimination[T]:
    """Drop optional items one at a time while the model does not get worse.

    ``score(items)`` is a cross-validated error (lower is better, e.g. MRE). Each round tries
    removing every remaining optional item and removes the one whose absence scores best, if
    that score's excess over ``floor`` (the perfect score: 1 for MRE) is at most ``(1 + tol)``
    times the current excess. Written here, not taken from scikit-learn: its
    SequentialFeatureSelector cannot hold base terms fixed and needs a column-linear
    estimator, and the F model (a max of three sums) is not one.
    """
    current = list(optional)
    best = start = score([*base, *current])
    dropped: list[tuple[T, float]] = []
    while current:
        trials = [(score([*base, *(t for t in current if t is not cand)]), i)
                  for i, cand in enumerate(current)]
        s, i = min(trials)
        if s - floor > (best - floor) * (1 + tol):
            break
        dropped.append((current.pop(i), s))
        best = s
    return Elimination(tuple(current), tuple(dropped), start, best)


@dataclass
class CrossValidated(Modeler):
    """Backward elimination by k-fold cross-validated MRE: a term stays only if removing it
    makes the cross-validated relative error (MRE - 1) worse by more than ``tol``."""

    name: ClassVar[str] = "cv"
    folds: int = 5
    seed: int = 0
    tol: float = 0.02

    def select(self, terms: Sequence[tm.Term], X: Array, y: Array, *, nonnegative: bool,
               keep: frozenset[tm.Term], progress: Progress,
               offset: Array | None = None, errors: Errors = "relative") -> Selection:
        base = [j for j, t in enumerate(terms) if t in keep]
        optional = [j for j, t in enumerate(terms) if t not in keep]

        def score(cols: Sequence[int]) -> float:
            return cv_mre(X[:, sorted(cols)], y, folds=self.folds, seed=self.seed,
                          nonnegative=nonnegative, offset=offset, errors=errors)

        e = backward_eliminate(base, optional, score, self.tol, floor=1.0)
        kept, dropped = list(e.kept), e.dropped
        for j, s in dropped:
            progress(f"dropped {terms[j]} (cross-validated MRE {s:.4f})")
        k = min(self.folds, len(y))
        how = "leave-one-out" if k >= len(y) else f"{k}-fold"
        reasons = []
        before = e.start
        for j, s in dropped:
            reasons.append(Dropped(terms[j], (
                f"{how} cross-validated MRE without it {s:.4f}, within {self.tol:.0%} of "
                f"with it ({before:.4f})" if math.isfinite(before) else
                f"too few samples to cross-validate a model with it ({how}: a fold has fewer "
                f"samples than terms); without it {s:.4f}")))
            before = s
        return Selection(tuple(sorted(base + kept)), tuple(reasons),
                         f"cross-validation ({how}, MRE)")


@dataclass
class Significance(Modeler):
    """Brewer's search (seed 003 footnote 1): drop the least significant term while its
    p-value exceeds ``alpha`` (0.05: outside the 95% confidence interval), refitting after each
    drop. With fewer than ``min_dof`` residual degrees of freedom a t-test says little, and
    :class:`CrossValidated` decides instead."""

    name: ClassVar[str] = "brewer"
    alpha: float = 0.05
    min_dof: int = 3
    folds: int = 5
    seed: int = 0

    def select(self, terms: Sequence[tm.Term], X: Array, y: Array, *, nonnegative: bool,
               keep: frozenset[tm.Term], progress: Progress,
               offset: Array | None = None, errors: Errors = "relative") -> Selection:
        if len(y) - X.shape[1] < self.min_dof:
            progress(f"{len(y)} samples for {X.shape[1]} terms: too few for a t-test, "
                     "cross-validation decides")
            return CrossValidated(self.folds, self.seed).select(
                terms, X, y, nonnegative=nonnegative, keep=keep, progress=progress,
                offset=offset, errors=errors)
        cols = list(range(len(terms)))
        dropped: list[Dropped] = []
        while True:
            r, used = _fit_columns(X[:, cols], y, nonnegative, offset, errors)
            negative = [c for c, u in zip(cols, used, strict=True)
                        if not u and terms[c] not in keep]
            if negative:  # bound at zero by the non-negativity: out first, then refit
                for c in negative:
                    dropped.append(Dropped(terms[c], "its least-squares cost is negative "
                                                     "(costs are kept >= 0)"))
                    cols.remove(c)
                continue
            fitted = [c for c, u in zip(cols, used, strict=True) if u]
            p = dict(zip(fitted, r.pvalues, strict=True))
            candidates = [(p[c], c) for c in fitted if terms[c] not in keep]
            if len(cols) < 2 or not candidates:
                break
            worst, c = max(candidates)
            if not worst > self.alpha:
                break
            dropped.append(Dropped(terms[c], f"not significant: p = {worst:.3g} > {self.alpha}"))
            progress(f"dropped {terms[c]} (p = {worst:.3g})")
            cols.remove(c)
        return Selection(tuple(cols), tuple(dropped),
                         f"t-test at {1 - self.alpha:.0%} confidence")


@dataclass
class SingleTerm(Modeler):
    """A baseline: the constant (where it is a candidate) plus the one other term with the best
    cross-validated MRE -- Extra-P's normal form with one term. Where the constant is a
    candidate, the term stays only if its coefficient is significant (t-test, ``alpha``): a
    quantity that is flat up to noise (a superstep's fixed work counted as 158,030 to 158,426
    instructions over the pilot sizes) is otherwise fitted by a steep term with a tiny
    coefficient, and extrapolated 14-fold at 16 times the largest size."""

    name: ClassVar[str] = "single"
    fits_all: ClassVar[bool] = False
    folds: int = 5
    seed: int = 0
    alpha: float = 0.05

    def select(self, terms: Sequence[tm.Term], X: Array, y: Array, *, nonnegative: bool,
               keep: frozenset[tm.Term], progress: Progress,
               offset: Array | None = None, errors: Errors = "relative") -> Selection:
        base = [j for j, t in enumerate(terms) if isinstance(t, tm.Const) or t in keep]
        scored = [(cv_mre(X[:, sorted([*base, j])], y, folds=self.folds, seed=self.seed,
                          nonnegative=nonnegative, offset=offset, errors=errors), j)
                  for j in range(len(terms)) if j not in base]
        if not scored:
            return Selection(tuple(base), (), "no candidate besides the constant")
        best, j = min(scored)
        kept = sorted([*base, j])
        if base and len(y) > len(kept):
            r, used = _fit_columns(X[:, kept], y, nonnegative, offset, errors)
            p = dict(zip([c for c, u in zip(kept, used, strict=True) if u], r.pvalues,
                         strict=True)).get(j, 0.0)
            if p > self.alpha:
                return Selection(tuple(base), tuple(
                    Dropped(terms[i], f"not significant: p = {p:.3g} > {self.alpha}"
                            if i == j else "a single-term model keeps one term")
                    for i in range(len(terms)) if i not in base),
                    f"t-test at {1 - self.alpha:.0%} confidence (the best term by "
                    f"cross-validation, {terms[j]}, is not significant)")
        return Selection(tuple(kept),
                         tuple(Dropped(terms[i], "a single-term model keeps one term")
                               for i in range(len(terms)) if i not in kept),
                         f"cross-validation (one term, MRE {best:.4f})")


@dataclass
class Fixed(Modeler):
    """No search: every candidate term stays (a model whose form is given, as the six
    regression models of the memory-lines-touched paper's Table 1)."""

    name: ClassVar[str] = "fixed"
    folds: int = 5
    seed: int = 0

    def select(self, terms: Sequence[tm.Term], X: Array, y: Array, *, nonnegative: bool,
               keep: frozenset[tm.Term], progress: Progress,
               offset: Array | None = None, errors: Errors = "relative") -> Selection:
        return Selection(tuple(range(len(terms))), (), "fixed terms (no search)")


MODELERS: dict[str, type[Modeler]] = {m.name: m for m in (Significance, CrossValidated,
                                                           SingleTerm, Fixed)}


def make_modeler(name: str | Modeler = "brewer", **settings: Any) -> Modeler:
    """A modeler by name (``brewer``, ``cv``, ``single``, ``fixed``) with its settings."""
    if isinstance(name, Modeler):
        return name
    if name not in MODELERS:
        raise BadInput(f"no modeler named {name!r}",
                       "choose one of " + ", ".join(sorted(MODELERS)))
    return MODELERS[name](**settings)


# -- the fitted model -------------------------------------------------------------------------

@dataclass(frozen=True)
class Validation:
    on: str  # "independent samples" or "<k>-fold cross-validation"
    n: int
    mre: float


@dataclass(frozen=True)
class Prediction:
    mean: Array
    lower: Array
    upper: Array
    level: float


@dataclass(frozen=True)
class Model:
    """Terms with fitted coefficients, their standard errors and p-values, the fit's
    diagnostics and the data it was fitted on. ``predict`` and ``interval`` take a table of
    inputs (name -> array)."""

    terms: tuple[tm.Term, ...]
    coef: Array
    stderr: Array
    pvalues: Array
    cov: Array
    scale: float  # residual variance of the relative errors
    dof: int
    mre: float  # on the fitting samples
    r2: float  # of the weighted fit
    decided_by: str
    modeler: str
    dropped: tuple[Dropped, ...] = ()
    validation: Validation | None = None
    n: int = 0  # samples fitted
    errors: Errors = "relative"  # what the fit minimised
    inputs: Mapping[str, Array] = field(default_factory=dict, repr=False)
    times: Array = field(default_factory=lambda: np.zeros(0), repr=False)

    @property
    def needs(self) -> tuple[str, ...]:
        return tm.needs(self.terms)

    def predict(self, table: tm.Table) -> Array:
        return tm.design(self.terms, table) @ self.coef

    def interval(self, table: tm.Table, level: float = 0.95) -> Prediction:
        """The prediction and its ``level`` prediction interval for one new observation."""
        from scipy.stats import t as student_t

        X = tm.design(self.terms, table)
        mean = X @ self.coef
        if self.dof <= 0 or not np.isfinite(self.scale):
            inf = np.full_like(mean, np.inf)
            return Prediction(mean, -inf, inf, level)
        # One observation's variance: scale times its weight's inverse (y^2 or 1).
        noise = self.scale * (mean ** 2 if self.errors == "relative" else np.ones_like(mean))
        var = np.einsum("ij,jk,ik->i", X, self.cov, X) + noise
        half = float(student_t.ppf(0.5 + level / 2, self.dof)) * np.sqrt(var)
        return Prediction(mean, mean - half, mean + half, level)

    def validate(self, table: tm.Table, y: ArrayLike) -> float:
        """The MRE on other samples than those fitted."""
        return mre(check_times(y, where="validation"), self.predict(table))

    def formula(self, digits: int = 4) -> str:
        """``9.04 + 6.186*w - 0.04406*i*w*h``, as 003 prints its models."""
        parts: list[str] = []
        for t, c in zip(self.terms, self.coef, strict=True):
            v = f"{abs(c):.{digits}g}" + ("" if isinstance(t, tm.Const) else f"*{t}")
            sign = ("-" if c < 0 else "") if not parts else ("- " if c < 0 else "+ ")
            parts.append(sign + v)
        return " ".join(parts) or "0"

    def to_dict(self) -> dict[str, Any]:
        """The model as JSON-ready data (what predicting and intervals need, and the
        diagnostics; not the data)."""
        return {"terms": [str(t) for t in self.terms], "coef": self.coef.tolist(),
                "stderr": self.stderr.tolist(), "pvalues": self.pvalues.tolist(),
                "cov": self.cov.tolist(), "scale": self.scale, "dof": self.dof,
                "n": self.n, "mre": self.mre, "r2": self.r2, "decided_by": self.decided_by,
                "modeler": self.modeler, "errors": self.errors, "formula": self.formula(),
                "dropped": [{"term": str(d.term), "reason": d.reason} for d in self.dropped],
                "validation": None if self.validation is None else {
                    "on": self.validation.on, "n": self.validation.n,
                    "mre": self.validation.mre}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Model:
        try:
            v = d.get("validation")
            k = len(d["terms"])
            model = cls(tm.parse_all(d["terms"]), _vec(d["coef"], k), _vec(d["stderr"], k),
                        _vec(d["pvalues"], k), np.array(d["cov"], dtype=float).reshape(k, k),
                        float(d["scale"]), int(d["dof"]), float(d["mre"]), float(d["r2"]),
                        str(d["decided_by"]), str(d["modeler"]),
                        tuple(Dropped(tm.parse(x["term"]), str(x["reason"]))
                              for x in d.get("dropped", ())),
                        None if v is None else Validation(str(v["on"]), int(v["n"]),
                                                          float(v["mre"])), int(d["n"]),
                        _errors(d.get("errors", "relative")))
        except (KeyError, TypeError, ValueError) as e:
            raise BadInput(f"not a fitted model ({type(e).__name__}: {e})",
                           "use a file written by this tool") from None
        return model


def _errors(x: Any) -> Errors:
    if x not in ERRORS:
        raise ValueError(f"errors {x!r} is not one of {ERRORS}")
    return "relative" if x == "relative" else "absolute"


def _vec(x: Any, k: int) -> Array:
    a = np.array(x, dtype=float).ravel()
    if a.size != k:
        raise ValueError(f"{a.size} values for {k} terms")
    return a


def _table(table: tm.Table) -> dict[str, Array]:
    return {k: np.asarray(v, dtype=np.float64) for k, v in table.items()}


def fit_model(terms: Sequence[str | tm.Term], table: tm.Table, times: ArrayLike, *,
              modeler: str | Modeler = "brewer", nonnegative: bool = False,
              keep: Sequence[str | tm.Term] = (), validation: tuple[tm.Table, ArrayLike]
              | None = None, holdout: float | None = None, folds: int = 5, seed: int = 0,
              where: str = "fit", progress: Progress = no_progress,
              errors: Errors = "relative") -> Model:
    """Fit ``times`` on ``terms`` evaluated on ``table`` (seed 003 section 2).

    ``errors``: what least squares minimises, relative (the default) or absolute errors.
    ``keep``: terms never dropped. ``validation``: independent samples to report the MRE on;
    else ``holdout`` (a fraction, scikit-learn's ``train_test_split``) of the samples is held
    apart for it; else the MRE is cross-validated. Bad input (fewer samples than terms, a term
    zero or constant everywhere, NaN or non-positive times) raises :class:`BadInput`.
    """
    if errors not in ERRORS:
        raise BadInput(f"{where}: errors {errors!r}", "choose relative or absolute")
    cand = tm.parse_all(terms)
    if not cand:
        raise BadInput(f"{where}: no terms to fit", "list one or more terms")
    y = check_times(times, where=where)
    data = _table(table)
    X = tm.design(cand, data)
    if X.shape[0] != len(y):
        raise BadInput(f"{where}: {X.shape[0]} input samples but {len(y)} times",
                       "give one time per sample")
    if holdout and validation is None:
        from sklearn.model_selection import train_test_split

        tr, te = train_test_split(np.arange(len(y)), test_size=holdout, random_state=seed)
        validation = ({k: v[te] if v.ndim else v for k, v in data.items()}, y[te])
        data = {k: v[tr] if v.ndim else v for k, v in data.items()}
        X, y = X[tr], y[tr]
    search = make_modeler(modeler, folds=folds, seed=seed)
    # A search that fits every candidate at once needs a sample per candidate; one that fits a
    # constant and one term at a time (single), three (two, and one to cross-validate).
    need = len(cand) if search.fits_all else min(len(cand), 3)
    if len(y) < need:
        raise BadInput(f"{where}: {len(y)} samples for {len(cand)} terms",
                       f"profile at least {need} runs, or list fewer terms")
    tm.check_design(cand, X, where=where, independent=search.fits_all)
    # A search written before ``errors`` existed still serves relative fits.
    extra: dict[str, Any] = {} if errors == "relative" else {"errors": errors}
    sel = search.select(cand, X, y, nonnegative=nonnegative,
                        keep=frozenset(tm.parse(k) for k in keep), progress=progress, **extra)
    cols = list(sel.kept)
    r, used = _fit_columns(X[:, cols], y, nonnegative, errors=errors)
    dropped = list(sel.dropped) + [Dropped(cand[c], "its least-squares cost is negative")
                                   for c, u in zip(cols, used, strict=True) if not u]
    cols = [c for c, u in zip(cols, used, strict=True) if u]
    kept = tuple(cand[c] for c in cols)
    fitted = X[:, cols] @ r.coef
    if validation is not None:
        vy = check_times(validation[1], where=f"{where}: validation")
        vx = tm.design(kept, _table(validation[0]))
        val: Validation | None = Validation("independent samples", len(vy),
                                            mre(vy, vx @ r.coef))
    elif len(y) > len(cols) + 1:
        k = min(folds, len(y))
        val = Validation("leave-one-out cross-validation" if k >= len(y)
                         else f"{k}-fold cross-validation", len(y),
                         cv_mre(X[:, cols], y, folds=folds, seed=seed, nonnegative=nonnegative,
                                errors=errors))
    else:
        val = None
    progress(f"kept {len(kept)} of {len(cand)} terms; MRE {mre(y, fitted):.4f}")
    return Model(kept, r.coef, r.stderr, r.pvalues, r.cov, r.scale, r.dof, mre(y, fitted),
                 r.r2, sel.decided_by, search.name, tuple(dropped), val, len(y), errors, data, y)
