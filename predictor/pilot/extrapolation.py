"""One quantity extrapolated from the pilot sizes to the target: a growth model fitted with the
toolkit (:func:`extrapolate`), the work time scaled by the counted work (:func:`scale_by_work`),
the span's extra over the work (:func:`extrapolate_extra`), and a fixed cost plus the counted
work (:func:`fit_work`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from predictor.errors import BadInput
from predictor.toolkit import fitting
from predictor.toolkit import model as md
from predictor.toolkit import terms as tm

PARAM = "n"


@dataclass(frozen=True)
class Extrapolated:
    """One quantity at the target size, with its prediction interval and how it was got."""

    value: float
    lower: float
    upper: float
    how: str  # the fitted formula, or why there is none
    pilot_mre: float | None = None  # MRE on the pilot samples (toolkit's: 1 is perfect)
    # log of the forecast with the largest pilot over the one without it (taken no lower than
    # the largest pilot's count), where the two were averaged (:func:`extrapolate_count`);
    # else 0
    hinge: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "interval": [self.lower, self.upper], "how": self.how,
                "pilot_mre": self.pilot_mre, "hinge": self.hinge}


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


# A count that moves by less than this across the pilot sizes (relative to its largest) grows
# at most linearly: such a change may be a count's run-to-run variation (Python's hash seeds
# and allocator; the two processes of the outside suite's histogram reduce, the same work,
# counted 0.4 % apart at one size), and the full set of growth terms can put a steep one
# through it: the reduce's instructions rose 0.8 % over the pilots, a term in n^3 log(n)^2
# was fitted, and its forecast at 16x the largest pilot was 43x the time measured. Not held
# constant: a large fixed count plus a small exact term in n (Callgrind counts exactly) moves
# as little, and a line still extrapolates it.
COUNT_NOISE = 0.01


# Where the count's forecast at the target with the largest pilot is more than this factor above
# the forecast without it, its growth hinges on one pilot's count. A counted run is one run, and
# a Python program's count can jump in one of them: the outside suite's splu "assemble" counted
# 7.29, 7.93, 8.55 and 10.60 million instructions at its four pilots in two sets of campaigns
# and 9.14-9.38 million at the largest in four others, and seven counted runs at that size
# afterwards 9.15-9.18 million (the cyclic garbage collector on or off: the cause is not pinned
# down); the growth terms fitted through the jump gave n^3 log(n)^2 and 26.9 times the largest
# pilot's count at 4x, the three smaller pilots 1.6 times, the time measured 2.3 times. cg's
# "assemble" jumped at its smallest pilot instead (6.8x with it, under 1x without). Such a
# jump adds work to one run, and the growth terms come out steeper through it; the other way
# round (the largest pilot bending the growth down) is the program's own: pandas' groups
# saturating, where the fit with the largest pilot forecast better. Only the steeper side is
# averaged.
HINGE = 1.5
# ... and only where the largest pilot's count leaves the line of the smaller pilots' fit by more
# than this (log, above it). A smooth program's count keeps to it within a few per cent
# (Callgrind counts exactly): the held-out dense_solve's QR by 0.054, PageRank's "normalise" by
# 0.075, whose fits with and without the largest pilot differ by 1.4-2.3x at 4x-16x and whose
# forecasts with the largest pilot were the better ones; the jumps above left it by 0.14-0.29.
DEPART = 0.1


def extrapolate_count(ns: Sequence[float], values: Sequence[float], target: float, *,
                      level: float = 0.9, modeler: str = "single",
                      where: str = "") -> Extrapolated:
    """A count (instructions, misses, ...) at ``target``: :func:`extrapolate` over every growth
    term, or, where it moves by less than :data:`COUNT_NOISE` across the pilots, over a
    constant and terms growing no faster than n (log n, n^0.5, n).

    With four pilot sizes or more, the same is done without the largest; where the forecast
    with it is more than :data:`HINGE` times the one without it at the target, and the largest
    pilot's count lies more than :data:`DEPART` (log) above what the smaller pilots' fit
    predicts there, the growth hinges on one pilot's count, and the forecast is their
    geometric mean, its interval spanning both (the forecast without the largest pilot taken
    no lower than the largest pilot's count: a count does not shrink as n grows)."""
    e = _count(ns, values, target, level=level, modeler=modeler, where=where)
    sizes = sorted(set(ns))
    if len(sizes) < 4 or not e.value > 0:
        return e
    below = [k for k, n in enumerate(ns) if n < sizes[-1]]
    part = _count([ns[k] for k in below], [values[k] for k in below], target, level=level,
                  modeler=modeler, where=f"{where} (without the largest pilot)")
    top = float(np.mean([v for n, v in zip(ns, values, strict=True) if n == sizes[-1]]))
    if not top > 0:  # nothing counted at the largest pilot: no line to leave
        return e
    other = max(part.value, top)
    ratio = e.value / other
    if ratio <= HINGE:  # only a steeper growth hinges: see HINGE
        return e
    seen = _count([ns[k] for k in below], [values[k] for k in below], sizes[-1], level=level,
                  modeler=modeler, where=f"{where} (without the largest pilot)").value
    if seen > 0 and math.log(top / seen) <= DEPART:  # the largest pilot on the others' line
        return e
    v = math.sqrt(e.value * other)
    lower, upper = min(e.lower, max(part.lower, top)), max(e.upper, other, part.upper)
    without = (part.how if part.value >= top
               else f"the largest pilot's count {top:.4g} ({part.how} was lower)")
    return Extrapolated(v, lower, upper,
                        f"the geometric mean of {e.how} and, without the largest pilot, "
                        f"{without}: {ratio:.3g} times apart at the target, the growth hinges "
                        "on one pilot's count", e.pilot_mre, math.log(ratio))


def _count(ns: Sequence[float], values: Sequence[float], target: float, *, level: float,
           modeler: str, where: str) -> Extrapolated:
    """:func:`extrapolate_count` without the check of the largest pilot."""
    y = np.asarray(values, dtype=np.float64)
    top = float(np.max(y)) if len(y) else 0.0
    if top > 0 and np.all(np.isfinite(y)) and np.all(y >= 0) \
            and (top - float(np.min(y))) / top < COUNT_NOISE:
        e = extrapolate(ns, values, target, level=level, modeler=modeler, where=where,
                        terms=(tm.Const(), tm.Power(PARAM, 0.0, 1.0), tm.Power(PARAM, 0.5, 0.0),
                               tm.Power(PARAM, 1.0, 0.0)))
        return replace(e, how=f"{e.how} (at most linear: it moved by less than "
                              f"{COUNT_NOISE:.0%} over the pilots)")
    return extrapolate(ns, values, target, level=level, modeler=modeler, where=where)


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
                        fitting.mre(t[1:], t[:-1] * w[1:] / w[:-1]))


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


# The counted work a superstep's time is fitted on beside its fixed cost (:func:`fit_work`),
# in the order the term search is offered them (a counter that adds nothing to the ones before
# it on the pilot sizes is not offered).
FIT_COUNTERS = (WORK, "l1d_misses", "l2_misses", "l3_misses", "page_faults")
# A superstep whose instructions have a fixed part of at least this share of the largest
# pilot's (:func:`fixed_work_share`) does set-up work whatever n, and its fixed cost is fitted
# on the instructions (:func:`fit_work`).
FIXED_WORK = 0.25

@dataclass(frozen=True)
class WorkFit:
    """A superstep's work time as a fixed cost (the intercept) plus the counted work: a model
    fitted with the toolkit's term search on every timed pilot run, evaluated on the counts
    extrapolated to the target."""

    value: float  # seconds at the target
    fixed_s: float  # the intercept: the fixed cost (0 where the search dropped it)
    how: str
    counters: tuple[str, ...]  # the counters the model kept


def fixed_work_share(ns: Sequence[float], counts: Sequence[float]) -> float:
    """The share of the largest pilot's count that does not grow with n over the pilots: the
    intercept of the least-squares line through the counts over n, over the mean count at the
    largest size, at most 1. 0 where that line meets n = 0 at or below zero (a count that grows
    as n or faster), where it does not rise (a count that falls or stays is no work that
    grows), and where the sizes are fewer than two, not finite or not one per count. A count
    growing slower than n (sqrt(n), log n) has a part of it look fixed over the pilots'
    range: that is what the line sees, and what scaled would multiply too."""
    n = np.asarray(ns, dtype=np.float64)
    y = np.asarray(counts, dtype=np.float64)
    if (len(n) != len(y) or not (np.all(np.isfinite(n)) and np.all(np.isfinite(y)))
            or len(set(n.tolist())) < 2):
        return 0.0
    b, a = np.polyfit(n, y, 1)
    top = float(np.mean(y[n == n.max()]))
    if not (b > 0 and a > 0 and top > 0):
        return 0.0
    return min(1.0, float(a) / top)


def fit_work(times_s: Sequence[float], counts: Mapping[str, Sequence[float]],
             at: Mapping[str, float], *, ns: Sequence[float] | None = None,
             where: str = "") -> WorkFit | None:
    """The work time as ``a + sum_c b_c * count_c`` (a, b >= 0) at the counts ``at``.

    ``times_s``: one work time per timed pilot run; ``counts[c]``: counter c of the counted run
    at that run's size (summed over processors), one value per timed run as ``times_s``. The
    candidates are the constant and the :data:`FIT_COUNTERS` that vary over the pilot sizes,
    each offered only if it is not a linear combination of the ones before it there; the
    toolkit's Brewer search (t-tests at 95 % on the runs, cross-validation where they are too
    few) keeps what the times support, with costs >= 0 and relative errors. None where no
    counter is usable or the fit fails.

    With ``ns`` (each timed run's size), where the search kept other counters than the
    instructions, or a constant alone, and the instructions have a fixed part
    (:func:`fixed_work_share`, at least :data:`FIXED_WORK`), the fit is searched again on a
    constant and the instructions, and taken where it keeps both (its formula says so): such a
    superstep's fixed cost goes with its set-up work, and the miss counters that grow with n as
    the instructions do stand in for the same work, which of them the search keeps being decided
    by the runs' noise (the outside suite's histogram "draw", a forked worker's first superstep,
    46 % of its instructions fixed: of eight sets of campaigns the search kept a constant plus
    the instructions on two, a constant plus the L3 misses on two, the L1 misses alone on three,
    a constant alone on one; a constant plus the instructions forecast 4x its largest pilot
    within 1.16-1.27 where scaled was 1.52-1.91, and pandas' merge within 1.29-1.39 against
    1.56-1.65)."""
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
    where = where or "work fit"
    fit = _search(y, counts, at, cols, where)
    if fit is None or ns is None or WORK not in cols or fit.counters == (WORK,):
        return fit
    share = fixed_work_share(ns, counts[WORK])
    if share < FIXED_WORK:
        return fit
    again = _search(y, counts, at, [WORK], where)
    if again is None or not (again.fixed_s > 0 and again.counters == (WORK,)):
        return fit
    first = " + ".join((["a constant"] if fit.fixed_s > 0 else []) + list(fit.counters))
    return replace(again, how=f"{again.how}; searched again on a constant and the "
                              f"instructions, {share * 100:.0f} % of which do not grow with n "
                              f"(the first search kept {first})")


def _search(y: np.ndarray, counts: Mapping[str, Sequence[float]], at: Mapping[str, float],
            cols: Sequence[str], where: str) -> WorkFit | None:
    """:func:`fit_work`'s term search over a constant and ``cols``."""
    if not cols or len(y) < len(cols) + 2:
        return None
    try:
        model = md.fit_model(["1", *cols], {c: np.asarray(counts[c], float) for c in cols}, y,
                             modeler="brewer", nonnegative=True, where=where)
    except BadInput:
        return None
    kept = tuple(str(t) for t in model.terms if not isinstance(t, tm.Const))
    value = float(model.predict({c: np.array([float(at[c])]) for c in cols})[0])
    fixed = float(sum(c for t, c in zip(model.terms, model.coef, strict=True)
                      if isinstance(t, tm.Const)))
    return WorkFit(value, fixed, f"{model.formula()} (seconds; {model.decided_by})", kept)
