"""The modelling toolkit of seed 003 (Brewer, "High-level optimization via automated statistical
modeling", section 2 and its footnote 1), on statsmodels, scipy and scikit-learn.

Given terms (:mod:`predictor.toolkit.terms`), inputs and measured times, :func:`fit_model`

1. fits the coefficients by least squares "using weights that minimize relative rather than
   absolute error": weighted least squares with weights 1/y^2 (statsmodels ``WLS``), or, for
   cost functions whose coefficients are costs per event, non-negative least squares
   (``scipy.optimize.nnls``) on the same weighted system;
2. "throws out statistically insignificant terms and recomputes the remaining coefficients":
   the term with the largest p-value above 0.05 (t-test of the null hypothesis that its
   coefficient is 0, i.e. outside the 95% confidence interval) is dropped and the rest refitted,
   until every term is significant. Where the samples are too few for a t-test (fewer than
   ``min_dof`` residual degrees of freedom), cross-validation decides instead, and the model says
   which (``decided_by``). The search is pluggable (:class:`~predictor.toolkit.modelers.Modeler`,
   :data:`~predictor.toolkit.modelers.MODELERS`);
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

One module for each part: the numerics (MRE, cross-validation, least squares) are
:mod:`predictor.toolkit.fitting`, the term searches :mod:`predictor.toolkit.modelers`; here the
fitted
:class:`Model` and :func:`fit_model`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from predictor.errors import BadInput
from predictor.toolkit import terms as tm
from predictor.toolkit.fitting import (
    ERRORS,
    Array,
    Errors,
    Progress,
    check_times,
    cv_mre,
    fit_used_columns,
    mre,
    no_progress,
)
from predictor.toolkit.modelers import Dropped, Modeler, make_modeler


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
    r, used = fit_used_columns(X[:, cols], y, nonnegative, errors=errors)
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
