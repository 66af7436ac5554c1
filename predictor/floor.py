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

from predictor.errors import BadInput
from predictor.fit import split_suites
from predictor.inputs import Results, Step


def _trimmed(x: np.ndarray) -> float:
    from scipy.stats import trim_mean

    return float(trim_mean(x, 0.2))


SUMMARIES: dict[str, Callable[[np.ndarray], float]] = {
    "median": lambda x: float(np.median(x)), "minimum": lambda x: float(np.min(x)),
    "trimmed mean": _trimmed, "mean": lambda x: float(np.mean(x))}
# microbench's flags of a disturbed measurement (microbench.runner.DISTURBED, the ones it
# takes again; the predictor reads results files and does not import microbench)
DISTURBED = frozenset({"unstable", "steal", "preempted"})


@dataclass(frozen=True)
class Floor:
    """E between two measurements of the same patterns, summarised one way."""

    summary: str
    how: str  # "two runs" or "halves of one run"
    names: tuple[str, ...]
    e: tuple[float, ...]
    disturbed: tuple[bool, ...]  # a measurement flagged unstable, steal or preempted

    @property
    def average(self) -> float:
        return float(np.mean(self.e))

    @property
    def maximum(self) -> float:
        return float(np.max(self.e))

    def worst(self, k: int = 3) -> list[tuple[str, float]]:
        order = np.argsort(self.e)[::-1][:k]
        return [(self.names[i], self.e[i]) for i in order]

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
