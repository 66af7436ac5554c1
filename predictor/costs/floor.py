"""The noise floor of a validation: how well one measurement of a pattern predicts another.

No cost function can predict a pattern's time better than a second measurement of the same
pattern does. Two runs of the microbench suite (or the two halves of one run's repetitions)
give, per pattern, E = max(T_a, T_b) / min(T_a, T_b); its average and maximum over the
validation patterns are the floor printed beside every accuracy table (seed 004's E, section
5.1). How a pattern's repetitions are summarised changes the floor, so every summary is
available: the median (what ``microbench run`` records), the minimum (the least disturbed
repetition), a 20 % trimmed mean (scipy's ``trim_mean``) and the mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from predictor.costs.calibrate import split_suites
from predictor.costs.costmodel import proc_features
from predictor.errors import BadInput
from predictor.inputs import Results, Step
from predictor.toolkit.fitting import relative_nnls
from predictor.toolkit.terms import Term, needs, parse_all


def _trimmed(x: np.ndarray) -> float:
    from scipy.stats import trim_mean

    return float(trim_mean(x, 0.2))


SUMMARIES: dict[str, Callable[[np.ndarray], float]] = {
    "median": lambda x: float(np.median(x)), "minimum": lambda x: float(np.min(x)),
    "trimmed mean": _trimmed, "mean": lambda x: float(np.mean(x))}
# microbench's flags of a disturbed measurement (microbench.repetition.DISTURBED, the ones it
# takes again; the predictor reads results files and does not import microbench)
DISTURBED = frozenset({"unstable", "steal", "preempted"})


class _Ratios:
    """Average, maximum and worst of a set of error ratios ``e`` named by ``names``."""

    names: tuple[str, ...]
    e: tuple[float, ...]

    @property
    def average(self) -> float:
        return float(np.mean(self.e))

    @property
    def maximum(self) -> float:
        return float(np.max(self.e))

    def worst(self, k: int = 3) -> list[tuple[str, float]]:
        order = np.argsort(self.e)[::-1][:k]
        return [(self.names[i], self.e[i]) for i in order]


@dataclass(frozen=True)
class Floor(_Ratios):
    """E between two measurements of the same patterns, summarised one way."""

    summary: str
    how: str  # "two runs" or "halves of one run"
    names: tuple[str, ...]
    e: tuple[float, ...]
    disturbed: tuple[bool, ...]  # a measurement flagged unstable, steal or preempted

    def undisturbed(self) -> Floor:
        """The floor over the patterns neither measurement flagged as disturbed
        (unstable, steal or preempted)."""
        keep = [i for i, d in enumerate(self.disturbed) if not d]
        return Floor(self.summary, self.how, tuple(self.names[i] for i in keep),
                     tuple(self.e[i] for i in keep), tuple(False for _ in keep))


def _samples(s: Step, where: str) -> np.ndarray:
    x = np.asarray(s.meta.get("time_samples") or (), dtype=np.float64)
    if x.size == 0 or not np.all(x > 0):
        raise BadInput(f"{where}: pattern {s.name} has no repetition times",
                       "give results written by `microbench run` (they keep every repetition)")
    return x


def _validation(r: Results) -> dict[str, Step]:
    return {s.name: s for s in split_suites(r.patterns)[1]}


def _disturbed(*steps: Step) -> bool:
    return any(DISTURBED & set(s.meta.get("flags") or ()) for s in steps)


def _floor(summary: str, how: str, pairs: Sequence[tuple[str, float, float, bool]]) -> Floor:
    if not pairs:
        raise BadInput("no validation pattern was measured twice",
                       "give two results of the same suite, or one with 2+ repetitions each")
    return Floor(summary, how, tuple(p[0] for p in pairs),
                 tuple(max(a, b) / min(a, b) for _, a, b, _ in pairs),
                 tuple(p[3] for p in pairs))


def between_runs(a: Results, b: Results, summary: str = "median") -> Floor:
    """The floor from two runs of the suite: the validation patterns both measured."""
    f = SUMMARIES[summary]
    va, vb = _validation(a), _validation(b)
    pairs = [(n, f(_samples(va[n], a.path)), f(_samples(vb[n], b.path)),
              _disturbed(va[n], vb[n])) for n in va if n in vb]
    return _floor(summary, "two runs", pairs)


def within_run(a: Results, summary: str = "median") -> Floor:
    """The floor from one run: odd against even repetitions of each validation pattern with
    two or more (repetitions back to back agree better than runs minutes apart: a lower
    bound on the floor between runs)."""
    f = SUMMARIES[summary]
    pairs = []
    for n, s in _validation(a).items():
        x = _samples(s, a.path)
        if x.size >= 2:
            pairs.append((n, f(x[0::2]), f(x[1::2]), _disturbed(s)))
    return _floor(summary, "halves of one run", pairs)


def for_validation(results: Results, second: Results | None = None) -> Floor | None:
    """The floor printed beside an accuracy table: between ``results`` and a second run of
    the suite when given (BadInput if they share no pattern), else within ``results`` (None
    where no validation pattern has two repetitions)."""
    if second is not None:
        return between_runs(results, second)
    try:
        return within_run(results)
    except BadInput:
        return None


# -- what counts can explain ------------------------------------------------------------------

@dataclass(frozen=True)
class Explained(_Ratios):
    """E of the best nonnegative sum of ``terms`` fitted on the very steps it is judged on."""

    terms: tuple[str, ...]
    costs: tuple[float, ...]  # per event, the steps' time unit
    names: tuple[str, ...]
    e: tuple[float, ...]
    converged: bool


def _ratios(X: list[np.ndarray], t: np.ndarray, c: np.ndarray
            ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per step: prediction / time with F1's form (the slowest processor's sum), and the
    feature row of that processor divided by the time."""
    r, rows = np.empty(len(t)), []
    for i, x in enumerate(X):
        v = c @ x
        j = int(np.argmax(v))
        r[i] = v[j] / t[i]
        rows.append(x[:, j] / t[i])
    return r, rows


def explained(steps: Sequence[Step], terms: Sequence[str | Term]) -> Explained:
    """The least average E that F1's form -- per processor a nonnegative sum of ``terms``,
    the slowest processor's sum the prediction -- reaches on ``steps`` when its costs are
    fitted on those same steps: what these counts can explain of these times at best.

    A diagnostic, never a model: it sees the times it is judged on. Where it is above a
    target, no F1 on these terms meets the target on these steps, whatever the fitting
    patterns. The mean of E = max(P/T, T/P) is convex in the costs when every processor of a
    step has the same counts (the optimum is then global); otherwise it is the lowest found
    from the relative least-squares fit (the toolkit's ``relative_nnls``) and a flat start.
    BadInput when a step lacks a time or a counter a term needs."""
    from scipy.optimize import minimize

    ts = parse_all(terms)
    if not steps or not ts:
        raise BadInput("nothing to explain: no steps or no terms", "give steps and terms")
    for s in steps:
        miss = s.missing(needs(ts))
        if miss or not (s.time_ns or 0) > 0:
            raise BadInput(f"step {s.name} has no {', '.join(miss) or 'time'}",
                           "give timed steps with every counter the terms need")
    t = np.array([float(s.time_ns or 0.0) for s in steps])
    X = [proc_features(s, ts) for s in steps]
    top = np.max([x.max(axis=1) for x in X], axis=0)  # each term's largest value
    scale = np.where(top > 0, top / np.median(t), 1.0)
    Xs = [x / scale[:, None] for x in X]

    def mean_e(c: np.ndarray) -> tuple[float, np.ndarray]:
        r, rows = _ratios(Xs, t, c)
        r = np.maximum(r, 1e-9)
        g = np.zeros_like(c)
        for ri, row in zip(r, rows, strict=True):
            g += row if ri >= 1 else -row / ri ** 2
        return float(np.mean(np.maximum(r, 1 / r))), g / len(t)

    # starts: the relative least-squares fit on the busiest processor, and equal costs
    busiest = np.array([x[:, int(np.argmax(x.sum(axis=0)))] for x in Xs])
    starts = [relative_nnls(busiest, t) + 1e-6, np.ones(len(ts))]
    best = None
    for c0 in starts:
        c0 = c0 * np.median(t / np.maximum(busiest @ c0, 1e-300))
        res = minimize(mean_e, c0, jac=True, method="L-BFGS-B",
                       bounds=[(0.0, None)] * len(ts))
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None
    r, _ = _ratios(Xs, t, best.x)
    return Explained(tuple(str(x) for x in ts),
                     tuple(map(float, np.where(top > 0, best.x / scale, 0.0))),
                     tuple(s.name for s in steps), tuple(map(float, np.maximum(r, 1 / r))),
                     bool(best.success))
