"""The improved F, ``F = const + max(F1, F2, F3)``, as an estimator the toolkit's term
searches work on (:class:`predictor.toolkit.fitting.Estimator`;
:class:`predictor.costs.fit.ImprovedFit`
chooses its terms with :mod:`predictor.toolkit.modelers` through it).

F is not linear in its columns, but it is once it is known which of F1, F2, F3 dominates each
pattern (and at which processor and bank): the fit alternates between assigning each pattern
to its dominating term and fitting every coefficient at once by non-negative least squares on
relative errors (seed 003 footnote 1), and the t-tests read the design at that fit
(:meth:`FEstimator.linearised`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from predictor.costs.costmodel import FModel, bank_features, bus_features, proc_features
from predictor.errors import NotFittedError
from predictor.inputs import Step
from predictor.toolkit import fitting
from predictor.toolkit import terms as tm

Array = NDArray[np.float64]

# F3's terms: last-level misses and writebacks per bank.
LM, WB = tm.Power("lm"), tm.Power("wb")


@dataclass
class _Design:
    """Per-step features of one term list, precomputed once per fit."""

    pf: list[Array]  # (K1, n) per step
    s2: Array  # (S, K2)
    bf: list[Array]  # (2, B) per step
    t: Array  # (S,)


def _design(steps: Sequence[Step], f1_terms: Sequence[tm.Term], f2_t: Sequence[tm.Term],
            llc: int,
            P: int, banks: int, t: Array, wb: bool = True) -> _Design:
    bf = [bank_features(s, llc, banks)[0] for s in steps]
    if not wb:  # a counter set without last-level writebacks: F3 charges misses only
        bf = [np.vstack([b[:1], np.zeros_like(b[:1])]) for b in bf]
    return _Design([proc_features(s, f1_terms) for s in steps],
                   np.array([bus_features(s, f2_t, P) for s in steps]).reshape(
                       len(steps), len(f2_t)), bf, t)


def _components(d: _Design, c: Array, k1: int, k2: int, const: bool
                ) -> tuple[Array, Array, list[Array], list[Array]]:
    """Values (S, 3) of F1, F2, F3 under coefficients c, and the F1/F3 feature rows at the
    maximising processor / bank."""
    o = 1 if const else 0
    c1, c2, c3 = c[o:o + k1], c[o + k1:o + k1 + k2], c[o + k1 + k2:]
    vals = np.zeros((len(d.t), 3))
    rows1, rows3 = [], []
    for i, (pf, bf) in enumerate(zip(d.pf, d.bf, strict=True)):
        v1 = c1 @ pf
        j = int(np.argmax(v1))
        v3 = c3 @ bf
        b = int(np.argmax(v3))
        vals[i] = (v1[j], d.s2[i] @ c2, v3[b])
        rows1.append(pf[:, j])
        rows3.append(bf[:, b])
    return vals, np.full(len(d.t), c[0] if const else 0.0), rows1, rows3


def _assigned(d: _Design, assign: NDArray[np.int64], rows1: Sequence[Array],
              rows3: Sequence[Array], k1: int, k2: int, const: bool) -> Array:
    """The design on which F is linear once each step's dominating term is fixed: per step,
    the features of its term (F1 at ``rows1[i]``, F2, F3 at ``rows3[i]``), zeros elsewhere."""
    o = 1 if const else 0
    A = np.zeros((len(d.t), o + k1 + k2 + 2))
    if const:
        A[:, 0] = 1.0
    for i, a in enumerate(assign):
        if a == 0:
            A[i, o:o + k1] = rows1[i]
        elif a == 1:
            A[i, o + k1:o + k1 + k2] = d.s2[i]
        else:
            A[i, o + k1 + k2:] = rows3[i]
    return A


def _joint_fit(d: _Design, k1: int, k2: int, const: bool, init: NDArray[np.int64],
               max_iter: int
               ) -> tuple[Array, NDArray[np.int64], float]:
    """Alternate: assign every step to the term that dominates it, then fit all coefficients
    at once by relative NNLS on the assigned rows; keep the best objective seen."""
    ncol = (1 if const else 0) + k1 + k2 + 2
    assign = init.copy()
    # Initial rows: the processor with the most accesses-weighted features, the busiest bank.
    rows1 = [pf[:, int(np.argmax(pf.sum(axis=0)))] for pf in d.pf]
    rows3 = [bf[:, int(np.argmax(bf.sum(axis=0)))] for bf in d.bf]
    best: tuple[float, Array, NDArray[np.int64]] = (np.inf, np.zeros(ncol), assign)
    seen: set[bytes] = set()
    for _ in range(max_iter):
        c = fitting.relative_nnls(_assigned(d, assign, rows1, rows3, k1, k2, const), d.t)
        vals, cst, rows1, rows3 = _components(d, c, k1, k2, const)
        pred = vals.max(axis=1) + cst
        obj = float(np.sum(((pred - d.t) / d.t) ** 2))
        new = vals.argmax(axis=1).astype(np.int64)
        if obj < best[0]:
            best = (obj, c, new)
        key = new.tobytes()
        if np.array_equal(new, assign) or key in seen:
            break
        seen.add(key)
        assign = new
    return best[1], best[2], best[0]


@dataclass
class FEstimator:
    """F with F1's candidate ``terms`` (the constant among them, where it is one) and the given
    F2 and F3 terms on a machine (``llc`` level, ``processors``, ``banks``); ``init`` gives
    the first assignment of patterns to F1, F2, F3 (0, 1, 2) for the steps being fitted.

    After ``fit``: ``model_`` (:class:`predictor.costs.costmodel.FModel`), ``dominant_`` (per step:
    0,
    1, 2 for F1, F2, F3)."""

    terms: tuple[tm.Term, ...]
    f2: tuple[tm.Term, ...]
    f3: tuple[tm.Term, ...]
    llc: int
    processors: int
    banks: int
    init: Callable[[Sequence[Step]], NDArray[np.int64]]
    max_iter: int = 30
    name: str = "improved"
    linear = False  # which term dominates a pattern moves with the coefficients

    @property
    def n_params(self) -> int:
        """F1's terms, and F2's two and F3's two (counted two each even where a counter set
        has one: the rule the improved fit has always used for a t-test's samples)."""
        return len(self.terms) + 4

    def restricted(self, cols: Sequence[int]) -> FEstimator:
        return replace(self, terms=tuple(self.terms[c] for c in cols))

    def can_fit(self, n: int) -> bool:
        return True  # the non-negative fit takes any number of patterns

    def _setup(self, steps: Sequence[Step], t: Array) -> tuple[bool, list[tm.Term], _Design]:
        """(constant?, F1's other terms, the design)."""
        t1 = [x for x in self.terms if not isinstance(x, tm.Const)]
        return (tm.Const() in self.terms, t1,
                _design(steps, t1, self.f2, self.llc, self.processors, self.banks, t,
                        WB in self.f3))

    def fit(self, steps: Sequence[Step], y: Array) -> FEstimator:
        steps = list(steps)
        const, t1, d = self._setup(steps, y)
        k1, k2 = len(t1), len(self.f2)
        c, dom, _ = _joint_fit(d, k1, k2, const, self.init(steps), self.max_iter)
        o = 1 if const else 0
        self.model_ = FModel(dict(zip(t1, map(float, c[o:o + k1]), strict=True)),
                             dict(zip(self.f2, map(float, c[o + k1:o + k1 + k2]), strict=True)),
                             dict(zip(self.f3, map(float, c[o + k1 + k2:]), strict=False)),
                             float(c[0]) if const else 0.0, self.llc, self.processors,
                             self.banks, self.name)
        self.dominant_ = dom
        return self

    def predict(self, steps: Sequence[Step]) -> Array:
        if not hasattr(self, "model_"):
            raise NotFittedError("FEstimator")
        return self.model_.predict(steps)

    def linearised(self, steps: Sequence[Step], y: Array) -> fitting.Linear:
        """The design on which the fitted F is linear: per pattern, the features of its
        dominating term at its processor or bank; the constant, F1's, F2's and F3's columns
        (both of F3's always: lm and wb). Fits first."""
        steps = list(steps)
        model = self.fit(steps, y).model_
        const, t1, d = self._setup(steps, y)
        c = np.array(([model.const] if const else []) + [model.f1[x] for x in t1]
                     + [model.f2[x] for x in self.f2] + [model.f3.get(x, 0.0) for x in (LM, WB)])
        vals, _, rows1, rows3 = _components(d, c, len(t1), len(self.f2), const)
        A = _assigned(d, vals.argmax(axis=1).astype(np.int64), rows1, rows3, len(t1),
                      len(self.f2), const)
        cols = ([tm.Const()] if const else []) + t1 + list(self.f2) + [LM, WB]
        return fitting.Linear(A, tuple(cols), nonnegative=True)
