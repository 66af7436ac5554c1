"""The toolkit's term searches (:class:`Modeler`, :data:`MODELERS`; seed 003, Brewer,
"High-level optimization via automated statistical modeling", section 2): drop statistically
insignificant terms by t-tests, or let cross-validation decide where the samples are too few,
or pick the one growth term with the best cross-validated MRE; :func:`make_modeler` chooses.
"""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from predictor.errors import BadInput
from predictor.toolkit import terms as tm
from predictor.toolkit.fitting import (
    Array,
    Errors,
    Estimator,
    Linear,
    LinearEstimator,
    LinearSamples,
    Progress,
    cross_validated_mre,
    fit_used_columns,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Dropped:
    term: tm.Term
    reason: str
    # The cross-validated MRE without it, where cross-validation dropped it.
    score: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Selection:
    """What a term search kept (indices into the candidate terms), what it dropped and why,
    what decided, and the name of the search that decided (a t-test search hands over to
    cross-validation where the samples are too few)."""

    kept: tuple[int, ...]
    dropped: tuple[Dropped, ...]
    decided_by: str
    modeler: str = ""


class Modeler(ABC):
    """A term search with a name (as Extra-P's modelers): which of the candidate terms a model
    keeps. ``search`` works on any :class:`~predictor.toolkit.fitting.Estimator` (a model linear in
    its columns, or the improved F linearised at its fit); ``select`` is the same search on a
    linear design. ``fit_model`` fits, validates and packages what the search keeps."""

    name: ClassVar[str]
    # Whether the search fits every candidate at once (then they must be independent).
    fits_all: ClassVar[bool] = True

    def search(self, est: Estimator, X: Any, y: Array, *, keep: frozenset[tm.Term],
               progress: Progress) -> Selection:
        """Indices of ``est.terms`` to keep, the estimator fitted on samples ``X``, times
        ``y``; ``keep``: terms never dropped. A modeler that overrides only :meth:`select`
        searches linear designs only: given another estimator (the improved F), it says so."""
        raise BadInput(f"the {self.name} modeler searches linear designs only (it defines "
                       "select, not search)", "choose one of " + ", ".join(sorted(MODELERS)))

    def select(self, terms: Sequence[tm.Term], X: Array, y: Array, *, nonnegative: bool,
               keep: frozenset[tm.Term], progress: Progress,
               offset: Array | None = None, errors: Errors = "relative") -> Selection:
        """Indices of the terms to keep, on the design X (column j: terms[j]). ``offset``: a
        known part of every prediction, not fitted (the predicted times are
        ``X @ coef + offset``); ``errors``: what the fits minimise."""
        return self.search(LinearEstimator(tuple(terms), nonnegative, errors),
                           LinearSamples(X, offset), y, keep=keep, progress=progress)


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

    def search(self, est: Estimator, X: Any, y: Array, *, keep: frozenset[tm.Term],
               progress: Progress) -> Selection:
        terms = est.terms
        base = [j for j, t in enumerate(terms) if t in keep]
        optional = [j for j, t in enumerate(terms) if t not in keep]

        def score(cols: Sequence[int]) -> float:
            return cross_validated_mre(est.restricted(sorted(cols)), X, y, folds=self.folds,
                                       seed=self.seed)

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
                f"samples than terms); without it {s:.4f}"), s))
            before = s
        return Selection(tuple(sorted(base + kept)), tuple(reasons),
                         f"cross-validation ({how}, MRE)", self.name)


@dataclass
class Significance(Modeler):
    """Brewer's search (seed 003 footnote 1): drop the least significant term while its
    p-value exceeds ``alpha`` (0.05: outside the 95% confidence interval), refitting after each
    drop. With fewer than ``min_dof`` residual degrees of freedom a t-test says little, and
    :class:`CrossValidated` decides instead (with ``tol``).

    The t-tests are on the design at the fit
    (:meth:`~predictor.toolkit.fitting.Estimator.linearised`):
    for a model linear in its columns that is its design, and one round settles it; for one
    that is not (the improved F), the terms that round rejects go, the model is refitted
    (its design may change with its coefficients) and tested again, until nothing more goes."""

    name: ClassVar[str] = "brewer"
    alpha: float = 0.05
    min_dof: int = 3
    folds: int = 5
    seed: int = 0
    tol: float = 0.02

    def search(self, est: Estimator, X: Any, y: Array, *, keep: frozenset[tm.Term],
               progress: Progress) -> Selection:
        if len(y) - est.n_params < self.min_dof:
            progress(f"{len(y)} samples for {est.n_params} terms: too few for a t-test, "
                     "cross-validation decides")
            return CrossValidated(self.folds, self.seed, self.tol).search(
                est, X, y, keep=keep, progress=progress)
        terms = est.terms
        kept = list(range(len(terms)))
        dropped: list[Dropped] = []
        for _ in range(len(terms) + 1):
            free = {terms[j] for j in kept if terms[j] not in keep}
            lin = est.restricted(kept).linearised(X, y)
            out = [d for d in self._prune(lin, y, frozenset(lin.terms) - free, progress)
                   if d.term in free]
            for d in out:
                kept.remove(next(j for j in kept if terms[j] == d.term))
            dropped += out
            if not out or est.linear:
                break
        return Selection(tuple(kept), tuple(dropped),
                         f"t-test at {1 - self.alpha:.0%} confidence", self.name)

    def _prune(self, lin: Linear, y: Array, keep: frozenset[tm.Term], progress: Progress
               ) -> list[Dropped]:
        """One round on a linear design: drop the least significant term (or every term whose
        cost the non-negative fit holds at zero), refit, until every term not in ``keep`` is
        significant."""
        terms, X = lin.terms, lin.X
        cols = list(range(len(terms)))
        dropped: list[Dropped] = []
        while True:
            r, used = fit_used_columns(X[:, cols], y, lin.nonnegative, lin.offset,
                                       lin.errors)
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
        return dropped


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

    def search(self, est: Estimator, X: Any, y: Array, *, keep: frozenset[tm.Term],
               progress: Progress) -> Selection:
        terms = est.terms
        base = [j for j, t in enumerate(terms) if isinstance(t, tm.Const) or t in keep]
        scored = [(cross_validated_mre(est.restricted(sorted([*base, j])), X, y,
                                       folds=self.folds, seed=self.seed), j)
                  for j in range(len(terms)) if j not in base]
        if not scored:
            return Selection(tuple(base), (), "no candidate besides the constant", self.name)
        best, j = min(scored)
        kept = sorted([*base, j])
        if base and len(y) > len(kept):
            lin = est.restricted(kept).linearised(X, y)
            r, used = fit_used_columns(lin.X, y, lin.nonnegative, lin.offset, lin.errors)
            col = lin.terms.index(terms[j])
            p = dict(zip([c for c, u in enumerate(used) if u], r.pvalues,
                         strict=True)).get(col, 0.0)
            if p > self.alpha:
                return Selection(tuple(base), tuple(
                    Dropped(terms[i], f"not significant: p = {p:.3g} > {self.alpha}"
                            if i == j else "a single-term model keeps one term")
                    for i in range(len(terms)) if i not in base),
                    f"t-test at {1 - self.alpha:.0%} confidence (the best term by "
                    f"cross-validation, {terms[j]}, is not significant)", self.name)
        return Selection(tuple(kept),
                         tuple(Dropped(terms[i], "a single-term model keeps one term")
                               for i in range(len(terms)) if i not in kept),
                         f"cross-validation (one term, MRE {best:.4f})", self.name)


@dataclass
class Fixed(Modeler):
    """No search: every candidate term stays (a model whose form is given, as the six
    regression models of the memory-lines-touched paper's Table 1)."""

    name: ClassVar[str] = "fixed"
    folds: int = 5
    seed: int = 0

    def search(self, est: Estimator, X: Any, y: Array, *, keep: frozenset[tm.Term],
               progress: Progress) -> Selection:
        return Selection(tuple(range(len(est.terms))), (), "fixed terms (no search)",
                         self.name)


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
