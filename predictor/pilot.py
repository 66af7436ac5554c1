"""Pilot forecasts: from runs of a program at small input sizes, what each superstep of a run at
a large size will cost, and why (seed 004, Amato et al., section 5.4 and Table 4: counters
measured at small sizes, extrapolated to the target, fed to F).

This module is the pure part: it takes the supersteps of pilot runs (:class:`PilotRun`, read
from ``counterd record`` files), checks that they line up, fits one growth model per superstep
for every counter and for the work time with the modelling toolkit, extrapolates them to the
target size with prediction intervals, and evaluates F with a machine profile on the
extrapolated counters. Running the pilots is the caller's business.

Choices, each stated where a forecast is printed:

- Growth models come from the toolkit's ``single`` modeler by default: a constant plus the one
  growth term n^a log2(n)^b (Extra-P's normal form) with the best cross-validated MRE, both
  coefficients >= 0. Pilot campaigns have few sizes (3 to 5), too few for t-tests over a long
  term list.
- Counters are extrapolated as their sum over processors; each processor's share is the one it
  had in the largest pilot run (balanced SPMD programs keep their shares as n grows). F1 takes
  the maximum over processors, so the shares matter; F2 and F3 read sums.
- A counter that is zero in every pilot run is zero at the target (it was counted, and never
  happened). One with fewer than three non-zero pilot values is scaled linearly from the
  largest pilot run, and says so.
- F's interval is F evaluated on the counters' interval bounds (F does not decrease in any
  counter: its costs are >= 0). It covers the extrapolation, not F's own error on this host,
  which the profile's accuracy gives.
- Two times per superstep, as :class:`counterd.records.Superstep` gives them from every timed
  run: the *work*, the slowest processor's own time (its end minus its begin,
  ``slowest_work_ns``), which is what F and the counters predict, and the *span*, last end minus
  first begin (``time_ns``). What lies between them, the *extra* (start skew and the waits of
  whichever processor ended last), is its own term (:func:`extrapolate_extra`): it does not
  scale with the work (a process's first superstep begins after its own start-up, tens of
  milliseconds apart from another's, whatever n is), so it is forecast as the median of the
  pilot runs' extras with their spread as the interval, unless the pilot runs show it growing
  with n (Kendall's tau, one-sided p < :data:`GROWTH_P`), when it is extrapolated with a growth
  model and a note says so. The forecast printed first is the work's; the span's is the
  work's plus the extra, its interval the sum of their bounds.
- Beside F, three forecasts of the work time itself: *scaled*, the largest pilot's work time
  per instruction times the instructions extrapolated (:func:`scale_by_work`); *fit*, a fixed
  cost plus the counted work fitted on the pilot runs with the toolkit's term search
  (:func:`fit_work`); and *time-only*, a growth model of the work time (what a user would do
  without counters). On the BSP sorts (``bench/pilot_forecast.py``) scaling by the counted
  instructions brought the median E at the paper's targets from 1.23 (time-only) to 1.08:
  pilot sizes that cross a cache level bend the time curve, and a growth model of the time
  extrapolates the bend, while the counted instructions grow as the algorithm does. Scaling
  is a line through the origin, though, and multiplies a fixed cost with the work: the fit
  keeps it apart.
- Which one is printed (:attr:`StepForecast.basis`, :func:`choose`): each predicts the pilot
  sizes from the third on from the sizes below them (:func:`holdout_forecasts`); the one that
  missed the largest pilot least replaces the standing one (scaled where counted) where it
  missed less by more than a held-out error's timing noise. The interval comes from the same
  held-out errors and the timing spread (:func:`interval_of`); :func:`advise` warns of pilots
  too short or too noisy and proposes sizes that would do.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from counterd.units import seconds
from predictor import modeling as md
from predictor import terms as tm
from predictor.errors import BadInput, PredictorError
from predictor.inputs import Step
from predictor.model import Breakdown
from predictor.profile import MachineProfile

PARAM = "n"


@dataclass(frozen=True)
class Timing:
    """One superstep of one timed run, its times as :class:`counterd.records.Superstep` gives
    them (ns; None where a processor never ended it)."""

    index: int
    name: str
    span_ns: int | None  # Superstep.time_ns: the last processor's end minus the first's begin
    work_ns: int | None  # Superstep.slowest_work_ns: the slowest processor's own time
    skew_ns: int  # Superstep.skew_ns: the last processor's begin minus the first's

    @property
    def key(self) -> tuple[int, str]:
        return self.index, self.name


def load_timings(path: Any) -> list[Timing]:
    """The supersteps of a ``counterd record`` file with their span, work and start skew, by
    index (:meth:`counterd.records.Superstep.group`); BadInput names a malformed line."""
    from pathlib import Path

    from counterd.errors import BadInput as CounterdBadInput
    from counterd.records import Superstep, read_jsonl

    try:
        steps = Superstep.group(read_jsonl(Path(path)))
    except CounterdBadInput as exc:  # the predictor's own error type, for its CLI
        raise BadInput(exc.what, exc.fix) from None
    return [Timing(s.index, s.name, s.time_ns, s.slowest_work_ns, s.skew_ns) for s in steps]


@dataclass(frozen=True)
class PilotRun:
    """The supersteps of one run of the program at input size ``size``."""

    size: float
    steps: tuple[Step, ...]
    source: str = "<run>"
    # Per step, the span (ns) of every timed run at this size, when the counted run's steps
    # carry their median: the span's extra over the work is taken from these.
    times_ns: tuple[tuple[float, ...], ...] = ()
    # Per step and timed run as in times_ns, the slowest processor's own time (ns): the work
    # time the growth models are fitted on (more samples, the real spread).
    work_ns: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.work_ns and [len(w) for w in self.work_ns] != [len(t) for t in self.times_ns]:
            raise ValueError("work_ns must have one time per timed run, as times_ns")

    def step_times(self, i: int) -> list[float]:
        """The spans of superstep ``i`` (ns), one per timed run."""
        if self.times_ns:
            return list(self.times_ns[i])
        t = self.steps[i].time_ns
        return [float(t)] if t is not None else []

    def step_work(self, i: int) -> list[float]:
        """The slowest processor's own time in superstep ``i`` (ns), one per timed run as
        :meth:`step_times`. Where the run does not have it (a table without begin and end
        times), the span stands for it."""
        if self.work_ns:
            return list(self.work_ns[i])
        w = self.steps[i].meta.get("work_ns")
        if self.times_ns or w is None:
            return self.step_times(i)
        return [float(w)] if self.steps[i].time_ns is not None else []


def split_name(step: Step) -> tuple[int, str]:
    """(index, name) of a recorded step named ``"index:name"``."""
    head, _, tail = step.name.partition(":")
    return (int(head), tail) if head.isdecimal() else (-1, step.name)


def check_runs(runs: Sequence[PilotRun]) -> list[tuple[int, str]]:
    """The supersteps every run has, as (index, name), after checking what a forecast needs:
    sizes > 0 and not decreasing, three or more distinct sizes, every run with supersteps, and
    the same supersteps (index and name) in every run; BadInput names the run that differs."""
    if not runs:
        raise BadInput("no pilot runs", "give pilot sizes and the runs' records")
    sizes = [r.size for r in runs]
    bad = [r for r in runs if not (math.isfinite(r.size) and r.size > 0)]
    if bad:
        raise BadInput(f"pilot size {bad[0].size!r} of {bad[0].source} is not a size > 0",
                       "give sizes as positive numbers")
    if any(b < a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise BadInput(f"pilot sizes {', '.join(f'{s:g}' for s in sizes)} are not increasing",
                       "give the sizes in increasing order")
    if len(set(sizes)) < 3:
        raise BadInput(f"{len(set(sizes))} distinct pilot sizes; a growth model with a constant "
                       "and one term needs three or more", "give three or more pilot sizes")
    empty = [r for r in runs if not r.steps]
    if empty:
        raise BadInput(f"pilot run {empty[0].source} (n = {empty[0].size:g}) recorded no "
                       "supersteps", "check that the command ran and marks its supersteps")
    first = [split_name(s) for s in runs[0].steps]
    for r in runs[1:]:
        mine = [split_name(s) for s in r.steps]
        if mine != first:
            diff = next((i for i, (a, b) in enumerate(zip(first, mine, strict=False)) if a != b),
                        min(len(first), len(mine)))
            have = mine[diff] if diff < len(mine) else "nothing"
            want = first[diff] if diff < len(first) else "nothing"
            raise BadInput(f"pilot run {r.source} (n = {r.size:g}) has superstep {have} where "
                           f"{runs[0].source} (n = {runs[0].size:g}) has {want}",
                           "pilot runs must have the same supersteps at every size")
    return first


@dataclass(frozen=True)
class Extrapolated:
    """One quantity at the target size, with its prediction interval and how it was got."""

    value: float
    lower: float
    upper: float
    how: str  # the fitted formula, or why there is none
    pilot_mre: float | None = None  # MRE on the pilot samples (toolkit's: 1 is perfect)

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "interval": [self.lower, self.upper], "how": self.how,
                "pilot_mre": self.pilot_mre}


def extrapolate(ns: Sequence[float], values: Sequence[float], target: float, *,
                level: float = 0.9, modeler: str = "single",
                terms: Sequence[tm.Term] | None = None, where: str = "") -> Extrapolated:
    """A growth model of ``values`` in n fitted with the toolkit, evaluated at ``target``."""
    n = np.asarray(ns, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(y)) or np.any(y < 0):
        raise BadInput(f"{where}: pilot values must be finite and >= 0",
                       "check the pilot runs' records")
    if not np.any(y):
        return Extrapolated(0.0, 0.0, 0.0, "zero in every pilot run")
    positive = y > 0
    if len(set(n[positive].tolist())) < 3:
        last = n == n.max()
        v = float(np.mean(y[last])) * target / float(n.max())
        return Extrapolated(v, v, v, "scaled linearly from the largest pilot run (fewer than "
                                     "three sizes with a non-zero value)")
    # Costs >= 0: a time or a count does not shrink as the input grows, and a model that
    # does would extrapolate below zero.
    model = md.fit_model(terms or tm.growth_terms(PARAM), {PARAM: n[positive]}, y[positive],
                         modeler=modeler, nonnegative=True, where=where or "growth model")
    p = model.interval({PARAM: np.array([float(target)])}, level)
    mean = float(p.mean[0])
    return Extrapolated(mean, max(0.0, float(p.lower[0])), float(p.upper[0]),
                        model.formula(), None if model.validation is None
                        else model.validation.mre)


WORK = "instructions"  # the counted work a superstep's time is scaled by


def scale_by_work(ns: Sequence[float], times: Sequence[float], work: Sequence[float],
                  at_target: Extrapolated, *, level: float = 0.9) -> Extrapolated | None:
    """The time at the target as the largest pilot's time per unit of counted work (seconds
    per instruction) times the work extrapolated to the target; None without work counted.

    ``ns`` are the distinct pilot sizes, increasing; ``times`` the measured time at each (the
    median of its timed runs) and ``work`` the counted work there. The pilot runs test the
    assumption on themselves: scaling each pilot's time by the work ratio to the next size
    misses by e_k = log(T_k / (T_{k-1} W_k / W_{k-1})). The interval is the forecast times
    exp(+-t * sqrt(mean(e_k^2) + s_W^2)), t Student's at ``level`` with one degree of freedom
    per e_k, s_W the log-scale spread of the extrapolated work; its ``pilot_mre`` is the
    toolkit's MRE of those one-step predictions (1 is perfect), comparable to a growth model's
    cross-validated MRE and to F's average E on the pilots. With independent noise
    of log-variance s^2 on every time, e_k and the forecast's error (the largest pilot's noise
    and the target's) both have variance 2 s^2: the pilots' own misses estimate the forecast's,
    and a bend in the time per instruction inside the pilot range widens the interval."""
    from scipy import stats

    t = np.asarray(times, dtype=np.float64)
    w = np.asarray(work, dtype=np.float64)
    if len(t) < 3 or not (np.all(w > 0) and np.all(t > 0) and at_target.value > 0):
        return None
    e = np.log(t[1:] / (t[:-1] * w[1:] / w[:-1]))
    z_norm = stats.norm.ppf((1 + level) / 2)
    s_w = math.log(at_target.upper / at_target.value) / z_norm if at_target.upper > 0 else 0.0
    half = stats.t.ppf((1 + level) / 2, len(e)) * math.sqrt(float(np.mean(e * e)) + s_w ** 2)
    v = float(t[-1] * at_target.value / w[-1])
    return Extrapolated(v, v * math.exp(-half), v * math.exp(half),
                        f"work time at n = {ns[-1]:g} x {WORK} at the target / {WORK} there "
                        f"({WORK}: {at_target.how})",
                        md.mre(t[1:], t[:-1] * w[1:] / w[:-1]))


GROWTH_P = 0.01  # one-sided p of Kendall's tau below which the extra is taken to grow with n


def extrapolate_extra(ns: Sequence[float], extras: Sequence[float], target: float, *,
                      level: float = 0.9, modeler: str = "single", where: str = "",
                      work_growth: float | None = None) -> tuple[Extrapolated, bool]:
    """The span's extra over the work (span minus the slowest processor's own time: start skew
    and waiting) at ``target``, and whether it grows with n.

    ``ns`` and ``extras`` are one pair per timed pilot run. The extra is not the superstep's
    work and is not scaled with it: it is the median of the pilot runs' extras, its interval
    their spread (the (1 - level)/2 and (1 + level)/2 quantiles: what one run's extra ranges
    over). Only where the pilot runs show it growing with n (Kendall's tau between n and the
    extra, one-sided p < :data:`GROWTH_P`) and a growth model of its median at each pilot size
    (:func:`extrapolate`; medians, because a start skew is heavy-tailed and a relative-error
    fit of every run's extra follows its smallest values) grows past the largest of those
    medians is it extrapolated, and the second value is True.

    ``work_growth``, the work's own growth from the largest pilot size to the target (its
    forecast there over its median at that size), caps that extrapolation: the waiting in a
    span is the other processors' lead over the slowest one, a share of the work, and a start
    skew does not grow with n at all, so the extra grows no faster than the work. A growth
    model through three or four noisy medians can put n^3 through them (the prefix sum's
    "local scan": a span forecast of 20.0 ms against 3.2 ms measured)."""
    from scipy import stats

    n = np.asarray(ns, dtype=np.float64)
    x = np.asarray(extras, dtype=np.float64)
    if len(n) != len(x) or not len(x) or not np.all(np.isfinite(x)) or np.any(x < 0):
        raise BadInput(f"{where}: the span's extra over the work must be one finite value "
                       ">= 0 per pilot run", "check the pilot runs' records")
    if not np.any(x):
        return Extrapolated(0.0, 0.0, 0.0, "zero in every pilot run"), False
    if np.ptp(x) > 0 and np.ptp(n) > 0:
        tau = stats.kendalltau(n, x, alternative="greater")
        test = f"Kendall's tau with n {tau.statistic:.2f}, one-sided p = {tau.pvalue:.2g}"
        if tau.pvalue < GROWTH_P and len(set(n.tolist())) >= 3:
            sizes = sorted(set(n.tolist()))
            medians = [float(np.median(x[n == m])) for m in sizes]
            e = extrapolate(sizes, medians, target, level=level, modeler=modeler, where=where)
            if e.value > max(medians):
                how = f"grows with n ({test}); its median at each pilot size extrapolated: {e.how}"
                cap = None if work_growth is None else medians[-1] * max(work_growth, 1.0)
                if cap is not None and e.value > cap:
                    # the interval scaled with it: the same relative spread, around the cap
                    e = Extrapolated(cap, min(e.lower, cap), cap * e.upper / e.value, e.how,
                                     e.pilot_mre)
                    how += (f"; capped at its median at n = {sizes[-1]:g} times the work's "
                            f"growth to the target ({work_growth:.3g}x): the extra grows no "
                            "faster than the work")
                return replace(e, how=how), True
            test += ", but no growth model of its medians grows"
    else:
        test = "the same in every pilot run" if np.ptp(x) == 0 else "one size"
    lo, mid, hi = np.quantile(x, [(1 - level) / 2, 0.5, (1 + level) / 2])
    return Extrapolated(float(mid), float(lo), float(hi),
                        f"median of {len(x)} pilot runs, not scaled with n ({test}); "
                        f"interval: their {level:.0%} spread"), False


# -- fixed cost and work apart; the basis chosen by leave-the-largest-out; intervals from it ------

# The counted work a superstep's time is fitted on beside its fixed cost (:func:`fit_work`),
# in the order the term search is offered them (a counter that adds nothing to the ones before
# it on the pilot sizes is not offered).
FIT_COUNTERS = (WORK, "l1d_misses", "l2_misses", "l3_misses", "page_faults")
# The work forecasts the pilot runs choose among, in the order a tie goes.
BASES = ("fit", "scaled", "F", "time")
BASIS_TEXT = {"fit": "fit (fixed cost + counted work)", "scaled": "scaled", "F": "F",
              "time": "time-only"}
# How many held-out errors the timing spread of the pilot runs counts as (:func:`interval_of`):
# with three or four held-out predictions per superstep, their errors alone are too few to
# trust, and no forecast is surer than the noise of the times it was fitted on.
PRIOR_WEIGHT = 2.0
SHORT_S = 1e-3  # a superstep's work at the largest pilot below this is mostly fixed cost


@dataclass(frozen=True)
class WorkFit:
    """A superstep's work time as a fixed cost (the intercept) plus the counted work: a model
    fitted with the toolkit's term search on every timed pilot run, evaluated on the counts
    extrapolated to the target."""

    value: float  # seconds at the target
    fixed_s: float  # the intercept: the fixed cost (0 where the search dropped it)
    how: str
    counters: tuple[str, ...]  # the counters the model kept


def fit_work(times_s: Sequence[float], counts: Mapping[str, Sequence[float]],
             at: Mapping[str, float], *, where: str = "") -> WorkFit | None:
    """The work time as ``a + sum_c b_c * count_c`` (a, b >= 0) at the counts ``at``.

    ``times_s``: one work time per timed pilot run; ``counts[c]``: counter c of the counted run
    at that run's size (summed over processors), one value per timed run as ``times_s``. The
    candidates are the constant and the :data:`FIT_COUNTERS` that vary over the pilot sizes,
    each offered only if it is not a linear combination of the ones before it there; the
    toolkit's Brewer search (t-tests at 95 % on the runs, cross-validation where they are too
    few) keeps what the times support, with costs >= 0 and relative errors. None where no
    counter is usable or the fit fails."""
    y = np.asarray(times_s, dtype=np.float64)
    cols: list[str] = []
    for c in FIT_COUNTERS:
        x = np.asarray(counts.get(c, ()), dtype=np.float64)
        if len(x) != len(y) or not np.all(np.isfinite(x)) or np.ptp(x) == 0 or c not in at:
            continue
        trial = np.column_stack([np.ones(len(y)), *(counts[k] for k in cols), x])
        if np.linalg.matrix_rank(trial / np.linalg.norm(trial, axis=0), tol=1e-9) \
                == trial.shape[1]:
            cols.append(c)
    if not cols or len(y) < len(cols) + 2:
        return None
    try:
        model = md.fit_model(["1", *cols], {c: np.asarray(counts[c], float) for c in cols}, y,
                             modeler="brewer", nonnegative=True, where=where or "work fit")
    except BadInput:
        return None
    kept = tuple(str(t) for t in model.terms if not isinstance(t, tm.Const))
    value = float(model.predict({c: np.array([float(at[c])]) for c in cols})[0])
    fixed = float(sum(c for t, c in zip(model.terms, model.coef, strict=True)
                      if isinstance(t, tm.Const)))
    return WorkFit(value, fixed, f"{model.formula()} (seconds; {model.decided_by})", kept)


@dataclass(frozen=True)
class Holdout:
    """One work forecast predicting pilot sizes from the smaller ones: at each pilot size from
    the third on, the forecast from the runs below it (``predicted``, s) against the median work
    time measured there; the last is the largest pilot left out."""

    basis: str
    sizes: tuple[float, ...]
    predicted: tuple[float, ...]
    measured: tuple[float, ...]
    leverage: tuple[float, ...]  # :func:`leverage` of each prediction

    @property
    def errors(self) -> np.ndarray:
        """log(predicted / measured) of each prediction."""
        return np.log(np.asarray(self.predicted) / np.asarray(self.measured))

    @property
    def largest_e(self) -> float:
        """E at the largest pilot (max(T, P) / min(T, P))."""
        return float(math.exp(abs(float(self.errors[-1]))))

    def to_json(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "predicted_s": list(self.predicted),
                "measured_s": list(self.measured), "largest_E": self.largest_e}


def leverage(sizes: Sequence[float], at: float) -> float:
    """How far ``at`` lies from ``sizes`` in log n, as a regression's prediction variance
    grows: 1 + 1/k + (log at - mean log n)^2 / sum (log n - mean log n)^2 (k sizes)."""
    x = np.log(np.asarray(sizes, dtype=np.float64))
    sxx = float(np.sum((x - x.mean()) ** 2))
    return 1 + 1 / len(x) + ((math.log(at) - float(x.mean())) ** 2 / sxx if sxx > 0 else 0.0)


def timing_spread(ns: Sequence[float], times: Sequence[float]) -> float:
    """The spread of one run's time, robustly: per size, 1.4826 times the median absolute
    deviation of log time from its median (the standard deviation where the noise is
    log-normal, and not blown up by one run that a busy host slowed down), pooled over the
    sizes as a root mean square (0 with one run per size)."""
    n = np.asarray(ns, dtype=np.float64)
    t = np.log(np.asarray(times, dtype=np.float64))
    vs = [(1.4826 * float(np.median(np.abs(t[n == m] - np.median(t[n == m]))))) ** 2
          for m in sorted(set(n.tolist())) if np.sum(n == m) > 1]
    return math.sqrt(float(np.mean(vs))) if vs else 0.0


def holdout_noise(spread: float) -> float:
    """The standard deviation (log scale) that timing noise alone gives a held-out error: one
    run's ``spread`` at each end, sqrt(2) * spread. Not the noise of two medians (spread /
    sqrt(runs) each): the runs at one size are taken back to back and share the host's state,
    so their medians move together (on the sorts' records of 2026-11-26 the per-size medians of
    10 runs lay 20-50 % off a smooth curve, with runs 13-63 % apart within a size)."""
    return math.sqrt(2) * spread


def interval_of(h: Holdout, sizes: Sequence[float], target: float, spread: float,
                level: float = 0.9) -> float:
    """The half-width (log scale) of the ``level`` interval of the forecast ``h`` judged.

    Each held-out error e_k is divided by the square root of its :func:`leverage`, so that
    errors made at different distances are comparable, and the forecast at the target is as
    far from the pilot sizes as its own leverage says. The variance is the held-out errors'
    mean square pooled with 2 * ``spread``^2 (one run's :func:`timing_spread` at each end: what
    a held-out error of single runs would have from noise alone) weighted as
    :data:`PRIOR_WEIGHT` errors; the quantile is Student's t with as many degrees of freedom as
    errors plus that weight. Scaling the noise with the leverage too is what keeps the interval
    covering where the forecast drifts from the truth more slowly than the pilots' noise can
    show (tests/predictor/test_pilot_choice.py measures both cases)."""
    from scipy import stats

    e = h.errors
    lev = np.asarray(h.leverage)
    ss = float(np.sum(e * e / lev)) + PRIOR_WEIGHT * holdout_noise(spread) ** 2
    s2 = ss / (len(e) + PRIOR_WEIGHT)
    t = float(stats.t.ppf((1 + level) / 2, len(e) + PRIOR_WEIGHT))
    return t * math.sqrt(s2 * leverage(sizes, target))


@dataclass(frozen=True)
class Choice:
    """Which work forecast a superstep prints, and why: each candidate's held-out predictions
    (:class:`Holdout`), the one chosen by them (:func:`choose`), and the interval from its
    held-out errors and the timing noise."""

    basis: str
    why: str
    holdouts: Mapping[str, Holdout]
    spread: float  # :func:`timing_spread` of the work time: one run's
    noise: float  # :func:`holdout_noise`: a held-out error's, from timing noise alone
    half: float  # :func:`interval_of`: the interval is the forecast times exp(+-half)

    def to_json(self) -> dict[str, Any]:
        return {"basis": self.basis, "why": self.why, "timing_spread": self.spread,
                "holdout_noise": self.noise, "interval_half_log": self.half,
                "holdout": {b: h.to_json() for b, h in self.holdouts.items()}}


# Which forecast stands until another predicts the largest pilot better by more than the
# noise: the counted instructions' scaling, measured best on the BSP sorts
# (``bench/pilot_forecast.py``), then the fit, time-only and F.
INCUMBENT = ("scaled", "fit", "time", "F")


def choose(holdouts: Mapping[str, Holdout], sizes: Sequence[float], target: float,
           spread: float, level: float = 0.9) -> Choice | None:
    """The forecast printed, by how each predicted the largest pilot from the smaller ones.

    The one that missed least replaces the first of :data:`INCUMBENT` that could predict it
    where it missed less by more than one :func:`holdout_noise` (``spread``: one run's): a
    difference timing noise alone would make is not taken for one (on noisy pilots, choosing
    the least miss outright made the sorts' forecasts worse).
    None if no forecast predicted the largest pilot."""
    have = [b for b in BASES if b in holdouts and holdouts[b].sizes
            and holdouts[b].sizes[-1] == sizes[-1]]
    if not have:
        return None
    noise = holdout_noise(spread)
    miss = {b: abs(float(holdouts[b].errors[-1])) for b in have}
    best = min(have, key=lambda b: (miss[b], BASES.index(b)))
    incumbent = next(b for b in INCUMBENT if b in have)
    margin = f"the noise of a held-out prediction, {_pct(math.exp(noise))}"
    if best == incumbent:
        how = "missed least"
    elif miss[incumbent] - miss[best] > noise:
        how = (f"missed less than {BASIS_TEXT[incumbent]} by more than {margin}")
    else:
        how = (f"kept: {BASIS_TEXT[best]} missed less, but by no more than {margin}")
        best = incumbent
    others = ", ".join(f"{BASIS_TEXT[b]} {_pct(math.exp(miss[b]))}" for b in have if b != best)
    why = (f"{BASIS_TEXT[best]} predicted the largest pilot (n = {sizes[-1]:g}) from the "
           f"smaller ones within {_pct(math.exp(miss[best]))} and {how}"
           + (f" (others: {others})" if others else " (the only forecast that could)"))
    return Choice(best, why, holdouts, spread, noise,
                  interval_of(holdouts[best], sizes, target, spread, level))


def _pct(e: float) -> str:
    return f"{(e - 1) * 100:.1f} %" if math.isfinite(e) else "inf"


def _growth(sizes: Sequence[float], medians: Sequence[float]) -> float:
    """The exponent b of a power law T ~ n^b through the medians (least squares in log-log)."""
    return float(np.polyfit(np.log(sizes), np.log(medians), 1)[0])


@dataclass(frozen=True)
class PilotAdvice:
    """What the pilot runs say of themselves: one line per problem, and pilot sizes that would
    do (None where none is needed or none below the target would)."""

    warnings: tuple[str, ...]
    sizes: tuple[float, ...] | None


def advise(steps: Sequence[tuple[str, Sequence[float], Sequence[float], float]],
           sizes: Sequence[float], target: float, total_s: float) -> PilotAdvice:
    """Warnings for pilots too short or too noisy to extrapolate, and sizes that would do.

    ``steps``: per superstep (name, the size of every timed run, its work time, its forecast
    at the target). Too short: the median work at the largest pilot under :data:`SHORT_S`
    (mostly fixed cost there). Too noisy: the 90 % range of one run's time (3.29 times
    :func:`timing_spread`, log scale) above the change of its median across the pilot sizes,
    for a superstep carrying 1 % or more of the forecast total. The sizes proposed keep the
    smallest pilot and the shape of the given sizes, and stretch the largest until every
    flagged superstep that grows with n (exponent b >= 0.1 over the pilots) reaches
    :data:`SHORT_S` and a change across the sizes of twice its range."""
    short, noisy, flat = [], [], []
    top = float(sizes[-1])
    need = top
    for name, ns, times, at_target in steps:
        n = np.asarray(ns, dtype=np.float64)
        t = np.asarray(times, dtype=np.float64)
        med = [float(np.median(t[n == m])) for m in sizes]
        b = _growth(sizes, med)
        rng = 3.29 * timing_spread(ns, times)
        change = abs(math.log(med[-1] / med[0]))
        flagged = False
        if med[-1] < SHORT_S:
            short.append(f"{name} ({seconds(med[-1])})")
            flagged = True
            if b >= 0.1:
                need = max(need, top * (SHORT_S / med[-1]) ** (1 / b))
        if rng > change and at_target >= 0.01 * total_s:
            noisy.append(f"{name} (spread {_pct(math.exp(rng))}, change {_pct(math.exp(change))})")
            flagged = True
            if b >= 0.1:
                need = max(need, sizes[0] * math.exp(2 * rng / b))
        if flagged and b < 0.1:
            flat.append(name)
    out = []
    if short:
        out.append(f"pilots too short: at n = {top:g} under {seconds(SHORT_S)} of work, "
                   f"mostly fixed cost: {', '.join(short)}")
    if noisy:
        out.append("pilots too noisy to extrapolate (90 % range of a run's time above the "
                   f"change across the pilot sizes): {', '.join(noisy)}")
    if flat:
        out.append(f"not growing with n over the pilots (larger pilots will not help): "
                   f"{', '.join(flat)}")
    proposed = None
    if need > top:
        lo = float(sizes[0])
        new = [lo + (need - lo) * (s - lo) / (top - lo) for s in sizes]
        new = [float(f"{x:.2g}") for x in new]
        if new[-1] >= target:
            out.append(f"no pilot sizes below the target would do (the largest would be about "
                       f"{need:.2g}): forecast with care, or run the target itself")
        elif len(set(new)) == len(new):
            proposed = tuple(new)
            out.append("pilot sizes that would do: --sizes " + ",".join(f"{x:g}" for x in new))
    return PilotAdvice(tuple(out), proposed)


@dataclass(frozen=True)
class Measured:
    """One superstep at the target as the checking runs measured it: medians over the runs
    (ns) of the slowest processor's own time, of the span and of the start skew."""

    work_ns: float
    span_ns: float
    skew_ns: float

    def to_json(self) -> dict[str, float]:
        return {"work_s": self.work_ns * 1e-9, "span_s": self.span_ns * 1e-9,
                "skew_s": self.skew_ns * 1e-9}


@dataclass(frozen=True)
class Comparison:
    """A forecast (seconds, with its interval) against the time measured for it."""

    forecast_s: float
    lower_s: float
    upper_s: float
    measured_s: float

    @property
    def e(self) -> float | None:
        """E = max(T, P) / min(T, P) (1 is perfect); None unless both are > 0."""
        t, p = self.measured_s, self.forecast_s
        return max(t, p) / min(t, p) if t > 0 and p > 0 else None

    @property
    def inside(self) -> bool:
        return self.lower_s <= self.measured_s <= self.upper_s

    def to_json(self) -> dict[str, Any]:
        return {"forecast_s": self.forecast_s, "interval_s": [self.lower_s, self.upper_s],
                "measured_s": self.measured_s, "E": self.e, "inside": self.inside}


@dataclass(frozen=True)
class StepForecast:
    """One superstep at the target. The forecast (:attr:`predicted_s`, :attr:`interval_s`) is
    of its work, the slowest processor's own time; :attr:`span_s` adds the span's extra
    (start skew and waiting), forecast on its own (:attr:`extra`)."""

    index: int
    name: str
    time_only: Extrapolated  # seconds: a growth model of the work time
    counters: Mapping[str, Extrapolated]  # summed over processors
    variant: str | None = None
    f: Breakdown | None = None  # ns
    f_interval_ns: tuple[float, float] | None = None
    why: str | None = None  # why there is no F
    pilot_f_error: float | None = None  # average E of F on the pilot runs' own work times
    bsp_ns: Mapping[str, float] = field(default_factory=dict)
    scaled: Extrapolated | None = None  # seconds: work time scaled by the counted work
    extra: Extrapolated | None = None  # seconds: the span less the work (None: not measured)

    fit: WorkFit | None = None  # seconds: fixed cost + counted work, fitted on the pilots
    choice: Choice | None = None  # which forecast is printed, why, and its interval

    @property
    def basis(self) -> str:
        """The work forecast printed: the :attr:`choice` (the one that predicted the largest
        pilot from the smaller ones best: ``"fit"``, ``"scaled"``, ``"F"`` or ``"time"``).
        Without a choice (a forecast built by hand), the older rule: ``"F"`` when F's average
        E on the pilot runs' own work times is at most the other forecast's MRE on the pilots,
        else ``"scaled"`` where instructions were counted, else ``"time"``."""
        if self.choice is not None:
            return self.choice.basis
        other = self.scaled or self.time_only
        if self.f is not None and self.pilot_f_error is not None and (
                other.pilot_mre is None or self.pilot_f_error <= other.pilot_mre):
            return "F"
        return "scaled" if self.scaled is not None else "time"

    def _basis(self) -> Extrapolated | None:
        return {"scaled": self.scaled, "time": self.time_only}.get(self.basis)

    @property
    def f_s(self) -> float | None:
        return self.f.f * 1e-9 if self.f is not None else None

    @property
    def predicted_s(self) -> float:
        """The work time forecast by :attr:`basis`."""
        if self.basis == "fit" and self.fit is not None:
            return self.fit.value
        e = self._basis()
        return e.value if e is not None else self.f.f * 1e-9 if self.f is not None else 0.0

    @property
    def interval_s(self) -> tuple[float, float]:
        """The interval: with a :attr:`choice`, the forecast times exp(+-half), half from the
        held-out errors and the timing spread (:func:`interval_of`); else the basis's own."""
        if self.choice is not None:
            p = self.predicted_s
            return p * math.exp(-self.choice.half), p * math.exp(self.choice.half)
        e = self._basis()
        if e is not None or self.f_interval_ns is None:
            e = e or self.time_only
            return e.lower, e.upper
        return self.f_interval_ns[0] * 1e-9, self.f_interval_ns[1] * 1e-9

    @property
    def width(self) -> float | None:
        """How wide the interval is: upper / lower (None where lower is 0)."""
        lo, hi = self.interval_s
        return hi / lo if lo > 0 else None

    @property
    def span_s(self) -> float:
        """The span forecast: the work's plus the extra's (the work's where no extra)."""
        return self.predicted_s + (self.extra.value if self.extra is not None else 0.0)

    @property
    def span_interval_s(self) -> tuple[float, float]:
        """The work's interval plus the extra's, bound by bound."""
        lo, hi = self.interval_s
        if self.extra is None:
            return lo, hi
        return lo + self.extra.lower, hi + self.extra.upper

    @property
    def f_interval_s(self) -> tuple[float, float] | None:
        if self.f_interval_ns is None:
            return None
        return self.f_interval_ns[0] * 1e-9, self.f_interval_ns[1] * 1e-9

    def compare(self, m: Measured) -> dict[str, Comparison]:
        """``--check``: the work forecast against the measured work, the span forecast
        against the measured span."""
        return {"work": Comparison(self.predicted_s, *self.interval_s, m.work_ns * 1e-9),
                "span": Comparison(self.span_s, *self.span_interval_s, m.span_ns * 1e-9)}

    def to_json(self) -> dict[str, Any]:
        fi = self.f_interval_s
        x = self.extra
        return {"index": self.index, "name": self.name,
                "predicted_s": self.predicted_s, "interval_s": list(self.interval_s),
                "basis": self.basis,
                "span_s": self.span_s, "span_interval_s": list(self.span_interval_s),
                "extra_s": x.value if x else None,
                "extra_interval_s": [x.lower, x.upper] if x else None,
                "extra_model": x.how if x else None,
                "F_s": self.f_s, "F_interval_s": list(fi) if fi else None,
                "dominating": self.f.dominant if self.f is not None else None,
                "variant": self.variant, "why": self.why,
                "time_only_s": self.time_only.value,
                "time_only_interval_s": [self.time_only.lower, self.time_only.upper],
                "time_only_model": self.time_only.how,
                "time_only_pilot_mre": self.time_only.pilot_mre,
                "scaled_s": self.scaled.value if self.scaled else None,
                "scaled_interval_s": [self.scaled.lower, self.scaled.upper]
                if self.scaled else None,
                "scaled_model": self.scaled.how if self.scaled else None,
                "scaled_pilot_mre": self.scaled.pilot_mre if self.scaled else None,
                "pilot_f_error": self.pilot_f_error,
                "fit_s": self.fit.value if self.fit else None,
                "fit_fixed_s": self.fit.fixed_s if self.fit else None,
                "fit_model": self.fit.how if self.fit else None,
                "fit_counters": list(self.fit.counters) if self.fit else None,
                "interval_width": self.width,
                "choice": self.choice.to_json() if self.choice else None,
                "counters": {k: v.value for k, v in self.counters.items()},
                "counter_models": {k: v.how for k, v in self.counters.items()},
                "bsp_s": {k: v * 1e-9 for k, v in self.bsp_ns.items()}}


@dataclass(frozen=True)
class Forecast:
    target: float
    sizes: tuple[float, ...]
    profile: str | None
    steps: tuple[StepForecast, ...]
    notes: tuple[str, ...] = ()
    advice: PilotAdvice | None = None  # warnings on the pilots, and sizes that would do

    def total(self) -> tuple[float, float, float]:
        """Predicted work in all (seconds), and the interval (the supersteps' bounds
        summed)."""
        return (sum(s.predicted_s for s in self.steps),
                sum(s.interval_s[0] for s in self.steps),
                sum(s.interval_s[1] for s in self.steps))

    def span_total(self) -> tuple[float, float, float]:
        """Predicted span in all (seconds), and the interval (the supersteps' bounds
        summed)."""
        return (sum(s.span_s for s in self.steps),
                sum(s.span_interval_s[0] for s in self.steps),
                sum(s.span_interval_s[1] for s in self.steps))

    def compare(self, measured: Mapping[tuple[int, str], Measured]
                ) -> tuple[dict[tuple[int, str], dict[str, Comparison]], dict[str, Comparison]]:
        """``--check``: per superstep measured at the target, :meth:`StepForecast.compare`;
        and in all, the forecasts summed against the measured times summed (a superstep the
        checking runs lack counts in the forecast only)."""
        per = {(s.index, s.name): s.compare(measured[(s.index, s.name)])
               for s in self.steps if (s.index, s.name) in measured}
        totals = {"work": self.total(), "span": self.span_total()}
        whole = {k: Comparison(*totals[k], sum(c[k].measured_s for c in per.values()))
                 for k in ("work", "span")}
        return per, whole

    def to_json(self) -> dict[str, Any]:
        p, lo, hi = self.total()
        sp, slo, shi = self.span_total()
        return {"target": self.target, "sizes": list(self.sizes), "profile": self.profile,
                "variant": next((s.variant for s in self.steps if s.variant), None),
                "supersteps": [s.to_json() for s in self.steps],
                "total": {"predicted_s": p, "interval_s": [lo, hi],
                          "span_s": sp, "span_interval_s": [slo, shi],
                          "F_s": _sum_or_none([s.f_s for s in self.steps]),
                          "scaled_s": _sum_or_none([s.scaled.value if s.scaled else None
                                                    for s in self.steps]),
                          "time_only_s": sum(s.time_only.value for s in self.steps),
                          "fit_s": _sum_or_none([s.fit.value if s.fit else None
                                                 for s in self.steps]),
                          "interval_width": hi / lo if lo > 0 else None},
                "notes": list(self.notes),
                "pilot_warnings": list(self.advice.warnings) if self.advice else [],
                "proposed_sizes": list(self.advice.sizes) if self.advice and self.advice.sizes
                else None}


def _sum_or_none(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _at_target(template: Step, totals: Mapping[str, float], shares: Mapping[str, np.ndarray]
               ) -> Step:
    return Step(template.name, {c: shares[c] * totals[c] for c in totals}, template.ranks)


def _shares(steps: Sequence[Step], counters: Sequence[str]) -> dict[str, np.ndarray]:
    """Each processor's share of each counter in these (largest-size) steps, averaged."""
    out = {}
    for c in counters:
        v = np.mean([s.counter(c) for s in steps], axis=0)
        total = float(v.sum())
        out[c] = v / total if total > 0 else np.full(len(v), 1.0 / len(v))
    return out


def forecast(runs: Sequence[PilotRun], target: float, profile: MachineProfile | None, *,
             level: float = 0.9, modeler: str = "single", variant: str | None = None,
             progress: md.Progress = md.no_progress,
             memo: dict[Any, dict[str, Holdout]] | None = None) -> Forecast:
    """Every superstep at ``target``: counters and work time extrapolated, F on the
    counters, the span's extra over the work forecast on its own (:func:`extrapolate_extra`),
    the fit of fixed cost and counted work, and the forecast printed chosen by predicting the
    largest pilot from the smaller ones (:func:`holdout_forecasts`, :func:`choose`).

    ``memo``: a dict kept between forecasts of the same ``runs`` at other targets (the held-out
    predictions do not depend on the target)."""
    keys = check_runs(runs)
    if not (math.isfinite(target) and target > 0):
        raise BadInput(f"target {target!r} is not a size > 0", "give the target size n")
    sizes = tuple(sorted({r.size for r in runs}))
    notes = []
    if target <= sizes[-1]:
        notes.append(f"the target {target:g} is inside the pilot range "
                     f"[{sizes[0]:g}, {sizes[-1]:g}]: interpolated, not extrapolated")
    ns = [r.size for r in runs]
    largest = [r for r in runs if r.size == sizes[-1]]
    bsp = profile.bsp_model() if profile is not None else None
    out = []
    for i, (index, name) in enumerate(keys):
        where = f"superstep {index}:{name}"
        progress(f"{where}: fitting growth models")
        steps = [r.steps[i] for r in runs]
        # (size, work, span) of every timed run: work is the slowest processor's own time
        tws = [(r.size, w, t) for r in runs
               for w, t in zip(r.step_work(i), r.step_times(i), strict=True)]
        if any(not (w > 0 and t > 0) for _, w, t in tws) or any(not r.step_times(i)
                                                                for r in runs):
            raise BadInput(f"{where}: a pilot run has no time for it",
                           "give complete records (no incomplete supersteps)")
        if any(w > t for _, w, t in tws):
            raise BadInput(f"{where}: a pilot run's slowest processor worked longer than the "
                           "superstep's span", "give the runs' own records (counterd record)")
        time_only = extrapolate([n for n, _, _ in tws], [w * 1e-9 for _, w, _ in tws], target,
                                level=level, modeler=modeler, where=f"{where}: work time")
        n_top = max(n for n, _, _ in tws)
        work_there = float(np.median([w * 1e-9 for n, w, _ in tws if n == n_top]))
        extra, grows = extrapolate_extra([n for n, _, _ in tws],
                                         [(t - w) * 1e-9 for _, w, t in tws], target,
                                         level=level, modeler=modeler,
                                         where=f"{where}: span less work",
                                         work_growth=time_only.value / work_there)
        if grows:
            notes.append(f"{where}: the span's extra over the work (start skew, waiting) is "
                         f"not held constant: it {extra.how}")
        names = sorted(set.intersection(*(set(s.counters) for s in steps)))
        counters = {c: extrapolate(ns, [float(s.counter(c).sum()) for s in steps], target,
                                   level=level, modeler=modeler, where=f"{where}: {c}")
                    for c in names}
        scaled = None
        if WORK in counters:
            scaled = scale_by_work(
                sizes, [float(np.median([w for n, w, _ in tws if n == m])) * 1e-9
                        for m in sizes],
                [float(np.mean([s.counter(WORK).sum() for r, s in zip(runs, steps, strict=True)
                                if r.size == m])) for m in sizes],
                counters[WORK], level=level)
        sf = StepForecast(index, name, time_only, counters)
        if profile is not None and counters:
            shares = _shares([r.steps[i] for r in largest], names)
            mid = _at_target(steps[-1], {c: e.value for c, e in counters.items()}, shares)
            try:
                v = variant or profile.select_model(mid.counters, where=where)
                fm = profile.f_model(v)
                lo = fm.evaluate(_at_target(steps[-1], {c: e.lower for c, e in counters.items()},
                                            shares)).f
                hi = fm.evaluate(_at_target(steps[-1], {c: e.upper for c, e in counters.items()},
                                            shares)).f
                # F predicts the work: it is judged on the pilot runs' work times
                pilot_e = [max(t, p) / min(t, p) for t, p in
                           ((float(np.median(r.step_work(i))), fm.evaluate(s).f)
                            for r, s in zip(runs, steps, strict=True)) if p > 0]
                sf = StepForecast(index, name, time_only, counters, v, fm.evaluate(mid),
                                  (lo, hi), None,
                                  float(np.mean(pilot_e)) if pilot_e else None,
                                  bsp.evaluate(mid) if bsp is not None else {})
            except PredictorError as exc:
                sf = StepForecast(index, name, time_only, counters, why=str(exc))
        elif profile is None:
            sf = StepForecast(index, name, time_only, counters, why="no profile given")
        else:
            sf = StepForecast(index, name, time_only, counters, why="no counters recorded")
        fit = _fit_step(runs, i, {c: e.value for c, e in counters.items()}, where=where)
        f_model = (profile.f_model(sf.variant) if profile is not None and sf.f is not None
                   and sf.variant is not None else None)
        progress(f"{where}: predicting the larger pilots from the smaller ones")
        key = (i, sf.variant, modeler)
        if memo is not None and key in memo:
            holdouts = memo[key]
        else:
            holdouts = holdout_forecasts(runs, i, f_model, modeler=modeler,
                                         names=names if f_model is not None else None)
            if memo is not None:
                memo[key] = holdouts
        spread = timing_spread([n for n, _, _ in tws], [w for _, w, _ in tws])
        have = {b for b, ok in (("fit", fit), ("scaled", scaled), ("F", sf.f),
                                ("time", time_only)) if ok is not None}
        choice = choose({b: h for b, h in holdouts.items() if b in have}, sizes, target,
                        spread, level)
        out.append(replace(sf, scaled=scaled, extra=extra, fit=fit, choice=choice))
    total = sum(s.predicted_s for s in out)
    advice = advise([(f"{s.index}:{s.name}", [r.size for r in runs for _ in r.step_work(i)],
                      [w * 1e-9 for r in runs for w in r.step_work(i)], s.predicted_s)
                     for i, s in enumerate(out)], sizes, target, total)
    return Forecast(float(target), sizes, profile.name if profile else None, tuple(out),
                    tuple(notes), advice)


def _fit_step(runs: Sequence[PilotRun], i: int, at: Mapping[str, float], *, where: str = ""
              ) -> WorkFit | None:
    """:func:`fit_work` of superstep ``i`` over every timed run of ``runs``, each with the
    counts of its size's counted run, at the counts ``at``."""
    times = [w * 1e-9 for r in runs for w in r.step_work(i)]
    counts = {c: [float(r.steps[i].counter(c).sum()) for r in runs for _ in r.step_work(i)]
              for c in FIT_COUNTERS if c in at and all(c in r.steps[i].counters for r in runs)}
    return fit_work(times, counts, at, where=f"{where}: work fit")


def point_forecasts(runs: Sequence[PilotRun], i: int, at: float, fm: Any = None, *,
                    modeler: str = "single", names: Sequence[str] | None = None
                    ) -> dict[str, float]:
    """Each work forecast of superstep ``i`` at size ``at`` from ``runs`` (seconds; a forecast
    that cannot be made, or is not > 0, is left out): time-only, scaled, the fit of fixed cost
    and counted work and, with ``fm`` (an F model) and ``names`` (the counters to extrapolate
    for it), F."""
    sizes = sorted({r.size for r in runs})
    tws = [(r.size, w * 1e-9) for r in runs for w in r.step_work(i)]
    steps = [r.steps[i] for r in runs]
    ns = [r.size for r in runs]
    wanted = [c for c in FIT_COUNTERS if all(c in s.counters for s in steps)]
    wanted += [c for c in names or () if c not in wanted]
    out: dict[str, float] = {}
    try:
        out["time"] = extrapolate([n for n, _ in tws], [w for _, w in tws], at,
                                  modeler=modeler).value
        counts = {c: extrapolate(ns, [float(s.counter(c).sum()) for s in steps], at,
                                 modeler=modeler).value for c in wanted}
    except PredictorError:
        return out
    top = sizes[-1]
    if counts.get(WORK, 0) > 0:
        there = float(np.mean([s.counter(WORK).sum() for r, s in zip(runs, steps, strict=True)
                               if r.size == top]))
        if there > 0:
            out["scaled"] = float(np.median([w for n, w in tws if n == top])) \
                * counts[WORK] / there
    fit = _fit_step(runs, i, counts)
    if fit is not None:
        out["fit"] = fit.value
    if fm is not None and names:
        largest = [r.steps[i] for r in runs if r.size == top]
        try:
            out["F"] = fm.evaluate(_at_target(steps[-1], {c: counts[c] for c in names},
                                              _shares(largest, names))).f * 1e-9
        except PredictorError:
            pass
    return {b: v for b, v in out.items() if math.isfinite(v) and v > 0}


def holdout_forecasts(runs: Sequence[PilotRun], i: int, fm: Any = None, *,
                      modeler: str = "single", names: Sequence[str] | None = None
                      ) -> dict[str, Holdout]:
    """Each work forecast of superstep ``i`` predicting every pilot size from the third on
    from the runs below it (:func:`point_forecasts`), against the median work time measured
    there; the last prediction is the largest pilot left out."""
    sizes = sorted({r.size for r in runs})
    got: dict[str, list[tuple[float, float, float, float]]] = {}
    for k in range(2, len(sizes)):
        below = [r for r in runs if r.size < sizes[k]]
        measured = float(np.median([w * 1e-9 for r in runs if r.size == sizes[k]
                                    for w in r.step_work(i)]))
        lev = leverage(sizes[:k], sizes[k])
        if not measured > 0:
            continue
        for b, p in point_forecasts(below, i, sizes[k], fm, modeler=modeler,
                                    names=names).items():
            got.setdefault(b, []).append((sizes[k], p, measured, lev))
    return {b: Holdout(b, tuple(x[0] for x in v), tuple(x[1] for x in v),
                       tuple(x[2] for x in v), tuple(x[3] for x in v)) for b, v in got.items()}


# -- running a pilot campaign ---------------------------------------------------------------------

def _counterd() -> list[str]:
    """The ``counterd`` command of this installation (beside this Python, else on PATH)."""
    import shutil
    import sys
    from pathlib import Path

    here = Path(sys.executable).parent / "counterd"
    if here.exists():
        return [str(here)]
    found = shutil.which("counterd")
    if found is None:
        raise BadInput("the counterd command is not installed", "install this package")
    return [found]


def _size_text(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else repr(float(n))


def command_for(template: str, n: float) -> list[str]:
    """The command line of one run: ``{n}`` in ``template`` replaced by the size."""
    import shlex

    if "{n}" not in template:
        raise BadInput(f"the pilot command {template!r} has no {{n}}",
                       "write {n} where the command takes its input size")
    try:
        return shlex.split(template.replace("{n}", _size_text(n)))
    except ValueError as exc:
        raise BadInput(f"cannot split the pilot command {template!r}: {exc}",
                       "quote it as a shell would") from None


# ``predict --pilot --cpu-features``: how the timed runs (pilots and checking runs) run.
# native (the default): as the program runs without counterd, so the forecast and the check
# are of the program the user runs. as-counted: with the CPU features valgrind lacks (AVX-512)
# hidden from run-time code dispatch (``counterd record --cpu-features as-counted``), so the
# timed code is the code Callgrind counts. The counted runs are as-counted either way with
# Callgrind (valgrind has no AVX-512), and with any backend when as-counted is asked for.
TIMING_FEATURES = ("native", "as-counted")


def _timing_features(cpu_features: str) -> str:
    """``cpu_features`` checked: one of :data:`TIMING_FEATURES`, else a BadInput."""
    if cpu_features not in TIMING_FEATURES:
        raise BadInput(f"--cpu-features {cpu_features!r}",
                       "choose " + " or ".join(TIMING_FEATURES))
    return cpu_features


def counting_features(cpu_features: str) -> str:
    """``counterd record --cpu-features`` for the counted runs beside timed runs run with
    ``cpu_features``: as-counted when the timed runs hide features (whatever the backend),
    else record's own default (auto: the run under valgrind, which cannot run AVX-512, counts
    the code it dispatches to; only its counts are used)."""
    return "as-counted" if _timing_features(cpu_features) == "as-counted" else "auto"


def _record(template: str, n: float, backend: str, out: Any, *, what: str,
            cpu_features: str) -> None:
    """One run of the command at size ``n`` under ``counterd record``; BadInput naming the run
    if it fails."""
    import subprocess

    cmd = [*_counterd(), "record", "--backend", backend, "--cpu-features", cpu_features,
           "--out", str(out), "--", *command_for(template, n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BadInput(f"{what} (n = {_size_text(n)}) failed with exit code "
                       f"{proc.returncode}: {tail}", "run the command by hand at that size")


_NO_SUPERSTEPS = "mark the program's supersteps with counterd.superstep"


def record_run(template: str, n: float, backend: str, out: Any, *, what: str,
               cpu_features: str = "auto") -> list[Step]:
    """One run of the command at size ``n`` under ``counterd record --backend backend
    --cpu-features cpu_features``; its supersteps. A failed run or one without supersteps is
    a BadInput naming the run."""
    from predictor.inputs import load_counters

    _record(template, n, backend, out, what=what, cpu_features=cpu_features)
    steps = load_counters(out)
    if not steps:
        raise BadInput(f"{what} (n = {_size_text(n)}) recorded no supersteps", _NO_SUPERSTEPS)
    return steps


def record_timed(template: str, n: float, out: Any, *, what: str,
                 cpu_features: str = "auto") -> list[Timing]:
    """One timed run (``--backend none``) of the command at size ``n``; its supersteps' times
    (:func:`load_timings`). A failed run or one without supersteps is a BadInput naming it."""
    _record(template, n, "none", out, what=what, cpu_features=cpu_features)
    timings = load_timings(out)
    if not timings:
        raise BadInput(f"{what} (n = {_size_text(n)}) recorded no supersteps", _NO_SUPERSTEPS)
    return timings


def record_path(workdir: Any, kind: str, n: float, r: int | None = None) -> Any:
    """Where a campaign keeps one run's records: ``timed-N-R.jsonl`` or ``counted-N.jsonl``."""
    from pathlib import Path

    return Path(workdir) / (f"{kind}-{n:g}-{r}.jsonl" if r is not None else f"{kind}-{n:g}.jsonl")


def load_campaign(workdir: Any, sizes: Sequence[float], repeat: int) -> list[PilotRun]:
    """The pilot runs a campaign kept in ``workdir`` (``predict --pilot --keep DIR``)."""
    from predictor.inputs import load_counters

    return [pilot_run(n, load_counters(record_path(workdir, "counted", n)),
                      [load_timings(record_path(workdir, "timed", n, r)) for r in range(repeat)])
            for n in sizes]


def pilot_run(n: float, counted: Sequence[Step], timed: Sequence[Sequence[Timing]]
              ) -> PilotRun:
    """The pilot run at size ``n``: the counted run's steps, each with the median span and
    work of the timed runs (a counting source such as Callgrind slows the program down; times
    are always measured without it), and every timed run's span and work for the models."""
    what = f"n = {_size_text(n)}"
    keys = [split_name(s) for s in counted]
    by_key = []
    for t in timed:
        mine = {x.key: x for x in t}
        if sorted(mine) != sorted(keys) or len(mine) != len(t):
            raise BadInput(f"{what}: the timed and the counted runs have different supersteps",
                           "pilot runs must have the same supersteps every time")
        by_key.append(mine)
    spans = tuple(tuple(float(m[k].span_ns or 0) for m in by_key) for k in keys)
    work = tuple(tuple(float(m[k].work_ns or 0) for m in by_key) for k in keys)
    steps = tuple(Step(s.name, s.counters, s.ranks, s.bank_lm, s.bank_wb, s.k, s.m_b,
                       float(np.median(spans[i])),
                       {**s.meta, "work_ns": float(np.median(work[i]))})
                  for i, s in enumerate(counted))
    return PilotRun(float(n), steps, f"the run at {what}", spans, work)


# Counting sources whose counts a run beside it cannot change: Callgrind simulates the
# caches of its own process, sim those of the streams a superstep feeds, none counts nothing.
# Their counted runs run side by side; perf's and PAPI's (a shared L3, one PMU) one at a time.
SIDE_BY_SIDE = frozenset({"callgrind", "sim", "none"})


# A counted run's time over a timed run's at the same size, until the campaign has measured
# its own: Callgrind runs a program 50-100 times slower than natively (the middle taken); the
# other counting sources count as the program runs.
COUNTED_SLOWDOWN = {"callgrind": 75.0}


class Eta:
    """The time left of a campaign: its timed, counted and checking runs. A timed run at size
    n takes a + b n seconds (non-negative least squares through the timed runs so far; in
    proportion to n after the first); a counted run that times the slowdown its backend's
    first counted run measured (:data:`COUNTED_SLOWDOWN` until then), ``width`` of them at
    once; a checking run, as a timed one at the target."""

    def __init__(self, backend: str = "none", width: int = 1) -> None:
        self.backend, self.width = backend, max(1, width)
        self.timed: list[tuple[float, float]] = []  # (n, seconds)
        self.counted: list[tuple[float, float]] = []

    def run_s(self, n: float) -> float | None:
        """A timed run's seconds at size ``n``; None before the first."""
        if not self.timed:
            return None
        ns = np.array([x for x, _ in self.timed])
        ts = np.array([t for _, t in self.timed])
        if np.ptp(ns) == 0:
            return float(np.mean(ts)) * n / float(ns[0])
        a, b = md.nnls(np.column_stack([np.ones(len(ns)), ns]), ts)
        return float(a + b * n)

    def slowdown(self) -> float:
        """A counted run's time over a timed run's: measured where one has ended."""
        got = [t / r for n, t in self.counted if (r := self.run_s(n))]
        return (float(np.mean(got)) if got
                else COUNTED_SLOWDOWN.get(self.backend, 1.0))

    def left(self, timed: Sequence[float] = (), counted: Sequence[float] = (),
             checking: Sequence[float] = ()) -> float | None:
        """Seconds left for the runs at these sizes; None before any timed run."""
        if not self.timed:
            return None
        run = self.run_s
        waves = sorted(counted, reverse=True)[::self.width]  # the longest of each wave
        return (sum(run(n) or 0.0 for n in [*timed, *checking])
                + self.slowdown() * sum(run(n) or 0.0 for n in waves))

    @staticmethod
    def text(left: float | None) -> str:
        return "" if left is None else f", about {left:.0f} s left"


def budget_sizes(sizes: Sequence[float], budget_s: float, probes: Sequence[tuple[float, float]],
                 *, repeat: int, backend: str, target: float, check: bool,
                 width: int = 1) -> tuple[tuple[float, ...], float]:
    """Pilot sizes within ``budget_s`` seconds, and the campaign's estimated time.

    ``probes``: (size, seconds) of timed runs already made (their time counts against the
    budget). A run at n takes a + b n (:class:`Eta`); the campaign is ``repeat`` timed runs and
    a counted run (its backend's slowdown, ``width`` at once) per size, plus ``repeat``
    checking runs at the target with ``check``. The sizes are the given ones times the largest
    factor that fits, at most the one that puts the largest pilot at half the target (larger
    pilots extrapolate less, and the pilots must stay below the target); rounded to two
    significant digits. BadInput where none fits."""
    if not (math.isfinite(budget_s) and budget_s > 0):
        raise BadInput(f"--budget {budget_s:g} is not a time > 0", "give seconds, e.g. "
                       "--budget 120")
    eta = Eta(backend, width)
    eta.timed = list(probes)
    spent = sum(t for _, t in probes)
    checking = [target] * repeat if check else []

    def cost(f: float) -> float:
        ns = [n * f for n in sizes]
        return eta.left([n for n in ns for _ in range(repeat)], ns, checking) or 0.0

    room = budget_s - spent
    hi = target / 2 / sizes[-1]
    lo = hi * 1e-6
    if cost(lo) > room:
        raise BadInput(f"--budget {budget_s:g}: the campaign needs about {cost(lo) + spent:.0f} "
                       f"s at any pilot size ({spent:.0f} s spent measuring the program's time; "
                       f"{repeat} timed runs and a counted run per size"
                       + (f", {repeat} checking runs at the target" if check else "") + ")",
                       "give a larger --budget, or a smaller --repeat")
    if cost(hi) > room:
        for _ in range(60):  # bisection in log: cost grows with the factor
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if cost(mid) <= room else (lo, mid)
        hi = lo
    out = tuple(float(f"{max(1.0, n * hi):.2g}") for n in sizes)
    if len(set(out)) < 3 or any(b <= a for a, b in zip(out, out[1:], strict=False)):
        raise BadInput(f"--budget {budget_s:g}: pilot sizes within it are too small to tell "
                       f"apart ({', '.join(f'{x:g}' for x in out)})",
                       "give a larger --budget or larger --sizes")
    return out, cost(hi) + spent


def run_campaign(template: str, sizes: Sequence[float], *, repeat: int = 3,
                 backend: str = "callgrind", workdir: Any, cpu_features: str = "native",
                 progress: md.Progress = md.no_progress, parallel: int | None = None,
                 eta: Eta | None = None, checking: Sequence[float] = ()) -> list[PilotRun]:
    """At every size: ``repeat`` timed runs (markers only, ``--backend none``, run with
    ``cpu_features``, :data:`TIMING_FEATURES`) and one counted run (``backend``,
    :func:`counting_features`); records under ``workdir``. Progress says what runs and the
    time left (:class:`Eta`, kept in ``eta`` when given), of the counted runs too and of the
    ``checking`` runs to come (their sizes).

    The timed runs go first, one at a time (they are the times). The counted runs follow, up to
    ``parallel`` at once (default: the CPUs this process may use) where ``backend`` is in
    :data:`SIDE_BY_SIDE`, else one at a time: under Callgrind each takes 20-100 times the
    program's time, and nothing of theirs is timed."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    if repeat < 1:
        raise BadInput(f"--repeat {repeat}", "give 1 or more")
    counting = counting_features(cpu_features)
    work = Path(workdir)
    width = 1
    if backend in SIDE_BY_SIDE:
        width = max(1, min(len(sizes), parallel or len(os.sched_getaffinity(0))))
    eta = eta if eta is not None else Eta(backend, width)
    eta.backend, eta.width = backend, width
    timed: list[list[list[Timing]]] = []
    for i, n in enumerate(sizes):
        timed.append([])
        for r in range(repeat):
            rest = [n] * (repeat - r) + [m for m in sizes[i + 1:] for _ in range(repeat)]
            progress(f"n = {_size_text(n)}: timed run {r + 1}/{repeat}"
                     + Eta.text(eta.left(rest, sizes, checking)))
            t0 = time.monotonic()
            timed[i].append(record_timed(template, n, record_path(work, "timed", n, r),
                                         what=f"timed pilot run {r + 1}",
                                         cpu_features=cpu_features))
            eta.timed.append((float(n), time.monotonic() - t0))
    progress(f"counted runs ({backend}) at n = {', '.join(map(_size_text, sizes))}"
             + (f", {width} at a time" if width > 1 else "")
             + Eta.text(eta.left((), sizes, checking)))
    lock = threading.Lock()
    pending = list(sizes)

    def counted(n: float) -> list[Step]:
        t0 = time.monotonic()
        steps = record_run(template, n, backend, record_path(work, "counted", n),
                           what=f"counted pilot run ({backend})", cpu_features=counting)
        with lock:
            eta.counted.append((float(n), time.monotonic() - t0))
            pending.remove(n)
            left = eta.left((), pending, checking)
        progress(f"n = {_size_text(n)}: counted run ({backend}) done" + Eta.text(left))
        return steps

    with ThreadPoolExecutor(max_workers=width) as pool:
        counts = list(pool.map(counted, sizes))
    return [pilot_run(n, c, t) for n, c, t in zip(sizes, counts, timed, strict=True)]


def measure_target(template: str, target: float, *, repeat: int, workdir: Any,
                   cpu_features: str = "native", progress: md.Progress = md.no_progress,
                   eta: Eta | None = None) -> dict[tuple[int, str], Measured]:
    """``--check``: ``repeat`` timed runs at the target size (``check-R.jsonl`` in
    ``workdir``), run with ``cpu_features`` as the timed pilots were; what they measured
    (:func:`measured`). Progress gives the time left: from ``eta`` (the campaign's) before
    the first checking run has ended, then from the checking runs' own times."""
    import time
    from pathlib import Path

    _timing_features(cpu_features)
    timed: list[list[Timing]] = []
    took: list[float] = []
    for r in range(repeat):
        left = (float(np.mean(took)) * (repeat - r) if took
                else eta.left(checking=[target] * (repeat - r)) if eta is not None else None)
        progress(f"n = {_size_text(target)}: checking run {r + 1}/{repeat}" + Eta.text(left))
        t0 = time.monotonic()
        timed.append(record_timed(template, target, Path(workdir) / f"check-{r}.jsonl",
                                  what="checking run", cpu_features=cpu_features))
        took.append(time.monotonic() - t0)
    return measured(timed)


def measured(timed: Sequence[Sequence[Timing]]) -> dict[tuple[int, str], Measured]:
    """The supersteps of the first of the ``timed`` runs, each with the medians over the runs
    of its work (the slowest processor's own time), span and start skew; a superstep that
    some run lacks or did not end is left out."""
    runs = [{t.key: t for t in ts} for ts in timed]
    out = {}
    for k in runs[0] if runs else {}:
        got = [t for t in (m.get(k) for m in runs)
               if t is not None and t.span_ns is not None and t.work_ns is not None]
        if len(got) == len(runs):
            out[k] = Measured(float(np.median([t.work_ns or 0 for t in got])),
                              float(np.median([t.span_ns or 0 for t in got])),
                              float(np.median([t.skew_ns for t in got])))
    return out
