"""The toolkit's numerics (seed 003, Brewer, "High-level optimization via automated statistical
modeling", section 2 and its footnote 1): the MRE (003's equation 1), cross-validation splits,
and least squares weighted for relative error, non-negative where coefficients are costs
(statsmodels ``WLS``, ``scipy.optimize.nnls``). :mod:`predictor.toolkit.modelers` searches terms
with
them; :mod:`predictor.toolkit.model` fits the :class:`~predictor.toolkit.model.Model`.

What a term search works on is an :class:`Estimator` (scikit-learn's shape: ``fit(X, y)``,
``predict(X)``): its candidate terms, the same family on a subset of them, and the design on
which its fit is linear (:class:`Linear`, the t-tests' input). :class:`LinearEstimator` is the
model linear in its columns that every family but F is; the improved F (a constant plus the
larger of three sums, not linear in its columns) is one too, linearised at its fit
(:class:`predictor.costs.joint.FEstimator`). :func:`cross_validated_mre` scores either.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from predictor.errors import BadInput

Array = NDArray[np.float64]
Progress = Callable[[str], None]
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
    # The one module WLS is in: statsmodels.api imports every model family besides (0.9 s
    # more of each predicting command's start on the 2-CPU test host, measured with -X
    # importtime: 2.7 against 1.8 s there, loaded).
    from statsmodels.regression.linear_model import WLS

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
        r = WLS(y if offset is None else y - offset, X / s, weights=w).fit()
        dof = int(round(r.df_resid))
        if dof <= 0:
            return _Wls(np.asarray(r.params, float) / s, np.full(k, np.inf),
                        np.full(k, np.nan), np.full((k, k), np.inf), np.inf, dof, float("nan"))
        return _Wls(np.asarray(r.params, float) / s, np.asarray(r.bse, float) / s,
                    np.asarray(r.pvalues, float),
                    np.asarray(r.cov_params(), float) / np.outer(s, s), float(r.scale), dof,
                    float(r.rsquared))


def fit_used_columns(X: Array, y: Array, nonnegative: bool, offset: Array | None = None,
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
    r, used = fit_used_columns(X, y, nonnegative, offset, errors)
    out = np.zeros(X.shape[1])
    out[used] = r.coef
    return out


def cv_mre(X: Array, y: Array, *, folds: int, seed: int, nonnegative: bool = False,
           offset: Array | None = None, errors: Errors = "relative") -> float:
    """Cross-validated MRE of the linear fit on X's columns (plus ``offset``, a known part of
    every prediction); inf for no columns, or where a fold has fewer training samples than
    columns."""
    est = LinearEstimator(tuple(range(X.shape[1])), nonnegative, errors)
    return cross_validated_mre(est, LinearSamples(X, offset), y, folds=folds, seed=seed)


# -- what a term search works on ---------------------------------------------------------------

@dataclass(frozen=True)
class Linear:
    """A model linear in its coefficients (at its fit, for one that is not): the design, the
    term of each column, and how its least squares weighs -- what the t-tests read."""

    X: Array
    terms: tuple[Any, ...]
    nonnegative: bool = False
    offset: Array | None = None
    errors: Errors = "relative"


class Estimator(Protocol):
    """A model family a term search (:class:`predictor.toolkit.modelers.Modeler`) chooses terms for.

    ``terms``: the candidate terms. ``n_params``: the coefficients a fit on all of them has
    (what a t-test's degrees of freedom count). ``linear``: whether the design is the same at
    every fit (a model linear in its columns: one round of t-tests settles it; F's dominating
    terms move with its coefficients, so its search refits and tests again). ``restricted``:
    the same family on the candidates at these indices. ``can_fit``: whether n samples are
    enough to fit (cross-validation scores a fold without enough as inf). ``fit``/``predict``
    as scikit-learn's, on samples ``X`` (rows of an array, or a list). ``linearised``: the
    design at the fit on ``X``, ``y``."""

    @property
    def terms(self) -> tuple[Any, ...]: ...
    @property
    def n_params(self) -> int: ...
    @property
    def linear(self) -> bool: ...
    def restricted(self, cols: Sequence[int]) -> Estimator: ...
    def can_fit(self, n: int) -> bool: ...
    def fit(self, X: Any, y: Array) -> Estimator: ...
    def predict(self, X: Any) -> Array: ...
    def linearised(self, X: Any, y: Array) -> Linear: ...


@dataclass(frozen=True)
class LinearSamples:
    """Samples of a linear model: their design rows and the known part of each prediction
    (``offset``, None for none); indexing by an index array takes rows of both."""

    X: Array
    offset: Array | None = None

    def __len__(self) -> int:
        return len(self.X)

    def __getitem__(self, idx: NDArray[np.intp]) -> LinearSamples:
        return LinearSamples(self.X[idx], None if self.offset is None else self.offset[idx])


@dataclass
class LinearEstimator:
    """The model linear in its columns, ``X[:, cols] @ coef + offset``: least squares weighted
    for relative (or absolute) error, non-negative where coefficients are costs. ``terms``
    names the columns of the samples' design; ``cols`` (None: all) the ones this model uses."""

    terms: tuple[Any, ...]
    nonnegative: bool = False
    errors: Errors = "relative"
    cols: tuple[int, ...] | None = None
    linear = True

    def _cols(self) -> list[int]:
        return list(range(len(self.terms))) if self.cols is None else list(self.cols)

    @property
    def n_params(self) -> int:
        return len(self._cols())

    def restricted(self, cols: Sequence[int]) -> LinearEstimator:
        have = self._cols()
        return LinearEstimator(self.terms, self.nonnegative, self.errors,
                               tuple(have[c] for c in cols))

    def can_fit(self, n: int) -> bool:
        return 0 < self.n_params <= n

    def fit(self, X: LinearSamples, y: Array) -> LinearEstimator:
        self.coef_ = fit_columns(X.X[:, self._cols()], y, self.nonnegative, X.offset,
                                 self.errors)
        return self

    def predict(self, X: LinearSamples) -> Array:
        off = np.zeros(len(X)) if X.offset is None else np.asarray(X.offset, float)
        return np.asarray(X.X[:, self._cols()] @ self.coef_ + off, dtype=np.float64)

    def linearised(self, X: LinearSamples, y: Array) -> Linear:
        cols = self._cols()
        return Linear(X.X[:, cols], tuple(self.terms[c] for c in cols), self.nonnegative,
                      X.offset, self.errors)


def take(X: Any, idx: NDArray[np.intp]) -> Any:
    """The samples at ``idx``: rows of an array or of :class:`LinearSamples`, else a list."""
    if isinstance(X, np.ndarray | LinearSamples):
        return X[idx]
    return [X[int(i)] for i in idx]


def cross_validated_mre(est: Estimator, X: Any, y: Array, *, folds: int, seed: int) -> float:
    """k-fold cross-validated MRE of the estimator (shuffled folds, :func:`cv_splits`); inf
    where it cannot fit a training fold."""
    if est.n_params == 0:
        return float("inf")  # no terms: not a model
    pred = np.zeros(len(y))
    for train, test in cv_splits(len(y), folds, seed):
        if not est.can_fit(len(train)):
            return float("inf")
        pred[test] = est.fit(take(X, train), y[train]).predict(take(X, test))
    return mre(y, pred)
