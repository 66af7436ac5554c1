"""The automated-modelling toolkit of seed 003 (Brewer, "High-level optimization via automated
statistical modeling"): term lists, non-negative least squares weighted for relative error,
pruning, k-fold cross-validation and the mean relative error (MRE).

Seed 003 section 2: the toolkit "uses linear regression to find coefficients for each term,
throws out statistically insignificant terms and recomputes the remaining coefficients, and
validates the model against an independent set of profile samples"; its footnote 1: "fitting
is done via chi^2 using weights that minimize relative rather than absolute error". Here a term
is kept only if removing it makes the cross-validated MRE worse by more than a tolerance
(backward elimination), which is the "earns its place" rule of DESIGN.md section 8.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]


def nnls(a: ArrayLike, b: ArrayLike, max_iter: int | None = None) -> Array:
    """argmin ||A x - b||_2 subject to x >= 0 (Lawson and Hanson's active-set method,
    "Solving Least Squares Problems", 1974, chapter 23). Columns are scaled to unit norm
    first, so terms of very different magnitude (accesses vs a constant) converge alike."""
    A = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    m, n = A.shape
    norms = np.linalg.norm(A, axis=0)
    live = norms > 0
    scale = np.where(live, norms, 1.0)
    As = A / scale
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(1.0, float(np.abs(As).sum(axis=0).max()))
    max_iter = max_iter or 3 * n + 10
    w = As.T @ (y - As @ x)
    it = 0
    while it < max_iter:
        cand = ~passive & live & (w > tol)
        if not cand.any():
            break
        j = int(np.argmax(np.where(cand, w, -np.inf)))
        passive[j] = True
        while True:
            it += 1
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(As[:, passive], y, rcond=None)[0]
            if s[passive].min() > 0 or it > max_iter:
                break
            neg = passive & (s <= 0)
            alpha = np.min(x[neg] / (x[neg] - s[neg]))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                s = np.zeros(n)
                break
        x = np.where(passive, np.maximum(s, 0.0), 0.0)
        w = As.T @ (y - As @ x)
    return x / scale


def relative_nnls(a: ArrayLike, t: ArrayLike) -> Array:
    """Non-negative least squares on T-normalised residuals: minimise sum ((A x - T) / T)^2
    (seed 003 footnote 1: weights that minimise relative rather than absolute error)."""
    A = np.asarray(a, dtype=np.float64)
    tt = np.asarray(t, dtype=np.float64)
    return nnls(A / tt[:, None], np.ones_like(tt))


def mre(t: ArrayLike, p: ArrayLike) -> float:
    """Brewer's mean relative error (seed 003 eq. 1): the geometric mean of
    (y + |y - y_hat|) / y; 1.0 is perfect (report (MRE - 1) as a percentage)."""
    ta, pa = np.asarray(t, dtype=np.float64), np.asarray(p, dtype=np.float64)
    return float(np.exp(np.mean(np.log((ta + np.abs(ta - pa)) / ta))))


def kfold(n: int, k: int, seed: int = 0) -> list[Array]:
    """Test-index sets of k-fold cross-validation (k >= n: leave-one-out)."""
    k = max(2, min(k, n))
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(order[i::k]) for i in range(k)]


@dataclass(frozen=True)
class Selection:
    kept: tuple[str, ...]
    dropped: tuple[str, ...]
    score: float  # cross-validated score of the kept set
    history: tuple[tuple[str, float], ...]  # (term dropped or "-", score after), in order


def backward_eliminate(base: Sequence[str], optional: Sequence[str],
                       score: Callable[[Sequence[str]], float], tol: float = 0.005,
                       floor: float = 0.0) -> Selection:
    """Drop optional terms one at a time while the model does not get worse.

    ``score(terms)`` is a cross-validated error (lower is better, e.g. MRE). Each round tries
    removing every remaining optional term and removes the one whose absence scores best, if
    that score's excess over ``floor`` (the perfect score: 1 for MRE) is at most ``(1 + tol)``
    times the current excess: a term stays only when keeping it reduces the cross-validated
    error by more than the fraction ``tol``.
    """
    current = list(optional)
    best = score([*base, *current])
    history: list[tuple[str, float]] = [("-", best)]
    dropped: list[str] = []
    while current:
        trials = [(score([*base, *(t for t in current if t != cand)]), cand)
                  for cand in current]
        s, cand = min(trials)
        if s - floor > (best - floor) * (1 + tol):
            break
        current.remove(cand)
        dropped.append(cand)
        best = s
        history.append((cand, s))
    return Selection(tuple(current), tuple(dropped), best, tuple(history))
