"""The forecast of every superstep at the target from the pilot runs (:func:`forecast`): counters
and work time extrapolated, F on the counters, the forecast printed chosen by held-out errors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from counterd.data.units import seconds
from predictor.costs.costmodel import Breakdown
from predictor.costs.profile import MachineProfile
from predictor.errors import BadInput, PredictorError
from predictor.inputs import Step
from predictor.pilot.check import Comparison, Measured
from predictor.pilot.choice import (
    Choice,
    Holdout,
    PilotAdvice,
    advise,
    choose,
    timing_spread,
)
from predictor.pilot.extrapolation import (
    FIT_COUNTERS,
    WORK,
    Extrapolated,
    WorkFit,
    extrapolate,
    extrapolate_count,
    extrapolate_extra,
    fit_work,
    scale_by_work,
)
from predictor.pilot.mixed import SHARED_CPU_ADVICE, jump_below, shared_cpu_note, work_per_size
from predictor.pilot.regime import L2Extra, Regime, l2_cost_ns, l2_extra
from predictor.pilot.runs import PilotRun, check_runs
from predictor.toolkit import fitting


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
    # seconds: where some timed pilot runs' processors took turns on one CPU, the interval of
    # the forecast from the others, its upper bound plus their wait (:func:`reach_apart`)
    reach_s: tuple[float, float] | None = None
    # the L2 misses the target adds beyond the largest pilot's rate (predictor.pilot.regime):
    # their cost is in :attr:`scaled` and :attr:`fit`
    l2: L2Extra | None = None
    # seconds: where the pilots straddle a rise of the time per instruction that processes
    # sharing a CPU do not explain (:func:`jump_below`), the target's counted work at the
    # rate below the rise; the forecast is the geometric mean of it and the basis's, its
    # interval reaches over both
    below_s: float | None = None

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

    def _chosen_s(self) -> float:
        if self.basis == "fit" and self.fit is not None:
            return self.fit.value
        e = self._basis()
        return e.value if e is not None else self.f.f * 1e-9 if self.f is not None else 0.0

    @property
    def predicted_s(self) -> float:
        """The work time forecast by :attr:`basis`; where :attr:`below_s` is set, the
        geometric mean of the two."""
        p = self._chosen_s()
        if self.below_s is not None and p > 0:
            return math.sqrt(p * self.below_s)
        return p

    @property
    def interval_s(self) -> tuple[float, float]:
        """The interval: with a :attr:`choice`, the forecast times exp(+-half), half from the
        timing spread, the distance to the target, the largest pilot's shortness, the
        forecast's held-out miss and its counts' hinge on the largest pilot
        (:func:`interval_half`); else the basis's own. Widened to :attr:`reach_s` where that
        is set."""
        lo, hi = self._own_interval()
        if self.reach_s is not None:
            return min(lo, self.reach_s[0]), max(hi, self.reach_s[1])
        return lo, hi

    @property
    def reached(self) -> bool:
        """Whether :attr:`reach_s` widened the interval."""
        return self.interval_s != self._own_interval()

    def _own_interval(self) -> tuple[float, float]:
        if self.choice is not None:
            p, half = self.predicted_s, self.choice.half
            if self.below_s is not None and p > 0:
                # reaches at least both forecasts, as a count's hinge does (interval_half)
                half = math.hypot(half, math.log(self._chosen_s() / self.below_s) / 2)
            lo, hi = p * math.exp(-half), p * math.exp(half)
        elif (e := self._basis()) is not None or self.f_interval_ns is None:
            e = e or self.time_only
            lo, hi = e.lower, e.upper
        else:
            lo, hi = self.f_interval_ns[0] * 1e-9, self.f_interval_ns[1] * 1e-9
        return lo, hi

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
                "shared_cpu_reach_s": list(self.reach_s) if self.reach_s else None,
                "basis_s": self._chosen_s(), "below_jump_s": self.below_s,
                "l2": self.l2.to_json() if self.l2 else None,
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
             progress: fitting.Progress = fitting.no_progress,
             memo: dict[Any, dict[str, Holdout]] | None = None,
             regime: Regime | None = None) -> Forecast:
    """Every superstep at ``target``: counters and work time extrapolated, F on the
    counters, the span's extra over the work forecast on its own (:func:`extrapolate_extra`),
    the fit of fixed cost and counted work, and the forecast printed chosen by predicting the
    largest pilot from the smaller ones (:func:`holdout_forecasts`, :func:`choose`).

    ``memo``: a dict kept between forecasts of the same ``runs`` at other targets (the held-out
    predictions do not depend on the target). ``regime``: the L2 runs for this target
    (:func:`predictor.pilot.regime.load_regime`): the cost of the L2 misses the target adds
    goes into the work forecasts from counts (scaled, fit)."""
    if regime is not None and regime.target != target:
        raise BadInput(f"the L2 runs were for the target {regime.target:g}, not {target:g}",
                       "run them for this target (predictor.pilot.campaign.cache_runs)")
    keys = check_runs(runs)
    if not (math.isfinite(target) and target > 0):
        raise BadInput(f"target {target!r} is not a size > 0", "give the target size n")
    sizes = tuple(sorted({r.size for r in runs}))
    notes = []
    if target <= sizes[-1]:
        notes.append(f"the target {target:g} is inside the pilot range "
                     f"[{sizes[0]:g}, {sizes[-1]:g}]: interpolated, not extrapolated")
    out = []
    shared_any = False
    for i, key in enumerate(keys):
        where = f"superstep {key[0]}:{key[1]}"
        sf, step_notes = _step_forecast(runs, i, key, target, profile, level=level,
                                        modeler=modeler, variant=variant, progress=progress,
                                        memo=memo, regime=regime)
        notes += step_notes
        shared = shared_cpu_note(runs, i)
        if shared:
            reach = reach_apart(runs, i, key, target, profile, level=level, modeler=modeler,
                                variant=variant, regime=regime)
            if reach is not None:
                sf = replace(sf, reach_s=reach)
                shared += (f"; its interval reaches over the forecast from the runs that did "
                           f"not share, {seconds(reach[0])} to {seconds(reach[1])} with "
                           "their wait")
            notes.append(f"{where}: {shared}")
            shared_any = True
        out.append(sf)
    if shared_any:
        notes.append(SHARED_CPU_ADVICE)
    total = sum(s.predicted_s for s in out)
    advice = advise([(f"{s.index}:{s.name}", [r.size for r in runs for _ in r.step_work(i)],
                      [w * 1e-9 for r in runs for w in r.step_work(i)], s.predicted_s)
                     for i, s in enumerate(out)], sizes, target, total,
                    work={f"{s.index}:{s.name}": work_per_size(runs, i)
                          for i, s in enumerate(out) if WORK in s.counters})
    return Forecast(float(target), sizes, profile.name if profile else None, tuple(out),
                    tuple(notes), advice)


# A superstep's note on the L2 misses the target adds: where they cost more than this share of
# its time-only forecast (the JSON has every superstep's).
L2_NOTE = 0.05


def _step_forecast(runs: Sequence[PilotRun], i: int, key: tuple[int, str], target: float,
                   profile: MachineProfile | None, *, level: float, modeler: str,
                   variant: str | None, progress: fitting.Progress,
                   memo: dict[Any, dict[str, Holdout]] | None, regime: Regime | None = None
                   ) -> tuple[StepForecast, list[str]]:
    """Superstep ``i`` (``key``: its index and name) at ``target`` from ``runs``
    (:func:`forecast`), and its notes."""
    index, name = key
    where = f"superstep {index}:{name}"
    sizes = tuple(sorted({r.size for r in runs}))
    ns = [r.size for r in runs]
    largest = [r for r in runs if r.size == sizes[-1]]
    bsp = profile.bsp_model() if profile is not None else None
    notes: list[str] = []
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
    counters = {c: extrapolate_count(ns, [float(s.counter(c).sum()) for s in steps],
                                     target, level=level, modeler=modeler,
                                     where=f"{where}: {c}")
                for c in names}
    scaled = None
    if WORK in counters:
        scaled = scale_by_work(
            sizes, [float(np.median([w for n, w, _ in tws if n == m])) * 1e-9
                    for m in sizes], work_per_size(runs, i), counters[WORK], level=level)
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
    memo_key = (i, sf.variant, modeler)
    if memo is not None and memo_key in memo:
        holdouts = memo[memo_key]
    else:
        holdouts = holdout_forecasts(runs, i, f_model, modeler=modeler,
                                     names=names if f_model is not None else None)
        if memo is not None:
            memo[memo_key] = holdouts
    spread = timing_spread([n for n, _, _ in tws], [w for _, w, _ in tws])
    have = {b for b, ok in (("fit", fit), ("scaled", scaled), ("F", sf.f),
                            ("time", time_only)) if ok is not None}
    # the fit's fixed cost as a share of the largest pilot's work, where the fit is that
    # cost plus the instructions (scaled's work): see :func:`choose`
    share = (fit.fixed_s / work_there if fit is not None and fit.counters == (WORK,)
             and fit.fixed_s > 0 else None)
    # how far each count-based forecast's counts hinge on the largest pilot
    # (:func:`extrapolate_count`): the interval reaches over it. Each its own counts:
    # scaled the instructions, the fit those it kept, F those its model reads
    used = {"scaled": (WORK,), "fit": fit.counters if fit is not None else (),
            "F": tuple(f_model.needs()) if f_model is not None else ()}
    hinges = {b: max([counters[c].hinge for c in cs if c in counters], default=0.0)
              for b, cs in used.items()}
    choice = choose({b: h for b, h in holdouts.items() if b in have}, sizes, target,
                    spread, level, fixed_share=share, hinges=hinges)
    if choice is not None and choice.hinge > 0:
        which = ", ".join(c for c in used[choice.basis]
                          if c in counters and counters[c].hinge > 0)
        notes.append(f"{where}: the growth of its {which} hinges on the largest pilot's "
                     f"count (the fit with it {math.exp(choice.hinge):.3g} times the fit "
                     "without it, taken no lower than that count, at the target): the "
                     "forecast takes their geometric mean "
                     "and its interval reaches over both; a counted run's count can jump "
                     "in one run: another campaign, or another pilot size, will tell")
    l2 = (l2_extra(regime, key, counters["loads"].value, l2_cost_ns(profile))
          if regime is not None and "loads" in counters else None)
    if l2 is not None and l2.seconds > 0:
        d = l2.seconds
        if scaled is not None:
            scaled = replace(scaled, value=scaled.value + d, lower=scaled.lower + d,
                             upper=scaled.upper + d)
        if fit is not None:
            fit = replace(fit, value=fit.value + d)
    if l2 is not None and l2.seconds > L2_NOTE * sf.time_only.value:
        notes.append(f"{where}: at the target it misses the L2 {l2.target_rate:.3g} times a "
                     f"load where the largest pilot missed it {l2.pilot_rate:.3g} times "
                     f"(misses no prefetcher covers, the L2 simulated shrunk with the data): "
                     f"{l2.misses:.3g} misses more, {seconds(l2.seconds)} at the profile's "
                     f"{l2.cost_ns:.3g} ns a miss, in the forecasts from counts")
    # the mean across a rise moves the printed forecast: only where there is one (a choice)
    below = (jump_below(runs, i, sizes, counters[WORK].value)
             if WORK in counters and choice is not None else None)
    below_s = None
    if below is not None:
        below_s, (n_below, n_above, rise) = below
        if l2 is not None and l2.seconds > 0:
            below_s += l2.seconds
        notes.append(f"{where}: its time per counted instruction rose {rise:.2g}x between n = "
                     f"{n_below:g} and {n_above:g}, and processes taking turns on one CPU do "
                     "not explain it: which regime the target runs in, or how far into it, "
                     "the pilots cannot say; the forecast is the geometric mean of the work "
                     f"at the rate below the rise ({seconds(below_s)}) and the forecast from "
                     "above it, and its interval reaches over both")
    return replace(sf, scaled=scaled, extra=extra, fit=fit, choice=choice, l2=l2,
                   below_s=below_s), notes


def reach_apart(runs: Sequence[PilotRun], i: int, key: tuple[int, str], target: float,
                profile: MachineProfile | None, *, level: float, modeler: str,
                variant: str | None, regime: Regime | None = None
                ) -> tuple[float, float] | None:
    """Where some but not all of superstep ``i``'s timed pilot runs had processors taking
    turns on one CPU: the interval of its forecast from the runs that did not (sizes without
    one left out; three sizes or more kept), its upper bound plus the shared runs' wait (the
    median of their work less the median of the others' at the same size), in seconds; None
    where there is no such forecast.

    Why: a scheduler separates the processes after a time that does not follow n, so a run at
    the target may share a CPU or not, whatever the pilots' mix; the printed forecast follows
    that mix and its interval reaches over both. Forecasting from the separate runs alone,
    with or without the wait, was tried and left (results page, 2026-11-28): the targets of
    the outside suite's stencil "init" and prefix "fill" share for longer than their pilots."""
    apart = [s for r in runs if (s := r.separate(i)) is not None]
    if len({r.size for r in apart}) < 3:
        return None
    waits = [(w - float(np.median(apart_ns))) * 1e-9 for shared_ns, apart_ns in
             (r.split_work(i) for r in runs) if shared_ns and apart_ns for w in shared_ns]
    try:
        sf, _ = _step_forecast(apart, i, key, target, profile, level=level, modeler=modeler,
                               variant=variant, progress=fitting.no_progress, memo=None,
                               regime=regime)
    except PredictorError:
        return None
    lo, hi = sf.interval_s
    return lo, hi + max(float(np.median(waits)) if waits else 0.0, 0.0)


def _fit_step(runs: Sequence[PilotRun], i: int, at: Mapping[str, float], *, where: str = ""
              ) -> WorkFit | None:
    """:func:`fit_work` of superstep ``i`` over every timed run of ``runs``, each with the
    counts of its size's counted run, at the counts ``at``."""
    times = [w * 1e-9 for r in runs for w in r.step_work(i)]
    counts = {c: [float(r.steps[i].counter(c).sum()) for r in runs for _ in r.step_work(i)]
              for c in FIT_COUNTERS if c in at and all(c in r.steps[i].counters for r in runs)}
    return fit_work(times, counts, at, ns=[r.size for r in runs for _ in r.step_work(i)],
                    where=f"{where}: work fit")


def point_forecasts(runs: Sequence[PilotRun], i: int, at: float, fm: Any = None, *,
                    modeler: str = "single", names: Sequence[str] | None = None
                    ) -> dict[str, float]:
    """Each work forecast of superstep ``i`` at size ``at`` from ``runs`` (seconds; a forecast
    that cannot be made, or is not > 0, is left out): time-only, scaled, the fit of fixed cost
    and counted work and, with ``fm`` (an F model) and ``names`` (the counters to extrapolate
    for it), F. The counts go through :func:`extrapolate_count` as at the target, so with five
    pilot sizes or more a held-out prediction has the check of its largest size too."""
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
        counts = {c: extrapolate_count(ns, [float(s.counter(c).sum()) for s in steps], at,
                                       modeler=modeler).value for c in wanted}
    except PredictorError:
        return out
    top = sizes[-1]
    if counts.get(WORK, 0) > 0:
        there = work_per_size(runs, i)[-1]
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
    got: dict[str, list[tuple[float, float, float]]] = {}
    for k in range(2, len(sizes)):
        below = [r for r in runs if r.size < sizes[k]]
        measured = float(np.median([w * 1e-9 for r in runs if r.size == sizes[k]
                                    for w in r.step_work(i)]))
        if not measured > 0:
            continue
        for b, p in point_forecasts(below, i, sizes[k], fm, modeler=modeler,
                                    names=names).items():
            got.setdefault(b, []).append((sizes[k], p, measured))
    return {b: Holdout(b, tuple(x[0] for x in v), tuple(x[1] for x in v),
                       tuple(x[2] for x in v)) for b, v in got.items()}


# -- running a pilot campaign ---------------------------------------------------------------------
