"""Pilot forecasts: from runs of a program at small input sizes, what each superstep of a run at
a large size will cost, and why (seed 004, Amato et al., section 5.4 and Table 4: counters
measured at small sizes, extrapolated to the target, fed to F).

This module is the pure part: it takes the supersteps of pilot runs (:class:`PilotRun`, read
from ``counterd record`` files), checks that they line up, fits one growth model per superstep
for every counter and for the time with the modelling toolkit, extrapolates them to the target
size with prediction intervals, and evaluates F with a machine profile on the extrapolated
counters. Running the pilots is the caller's business.

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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from predictor import modeling as md
from predictor import terms as tm
from predictor.errors import BadInput, PredictorError
from predictor.inputs import Step
from predictor.model import Breakdown
from predictor.profile import MachineProfile

PARAM = "n"


@dataclass(frozen=True)
class PilotRun:
    """The supersteps of one run of the program at input size ``size``."""

    size: float
    steps: tuple[Step, ...]
    source: str = "<run>"
    # Per step, the times (ns) of every timed run at this size, when the counted run's steps
    # carry their median: the time model is fitted on these (more samples, the real spread).
    times_ns: tuple[tuple[float, ...], ...] = ()

    def step_times(self, i: int) -> list[float]:
        if self.times_ns:
            return list(self.times_ns[i])
        t = self.steps[i].time_ns
        return [float(t)] if t is not None else []


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
    pilot_mre: float | None = None  # cross-validated MRE on the pilot samples

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


@dataclass(frozen=True)
class StepForecast:
    index: int
    name: str
    time_only: Extrapolated  # seconds
    counters: Mapping[str, Extrapolated]  # summed over processors
    variant: str | None = None
    f: Breakdown | None = None  # ns
    f_interval_ns: tuple[float, float] | None = None
    why: str | None = None  # why there is no F
    pilot_f_error: float | None = None  # average E of F on the pilot runs' own counters
    bsp_ns: Mapping[str, float] = field(default_factory=dict)

    @property
    def predicted_s(self) -> float:
        return self.f.f * 1e-9 if self.f is not None else self.time_only.value

    @property
    def interval_s(self) -> tuple[float, float]:
        """F's interval where there is F, else the time-only one."""
        if self.f_interval_ns is not None:
            return self.f_interval_ns[0] * 1e-9, self.f_interval_ns[1] * 1e-9
        return self.time_only.lower, self.time_only.upper

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "predicted_s": self.predicted_s,
                "interval_s": list(self.interval_s),
                "dominating": self.f.dominant if self.f is not None else None,
                "variant": self.variant, "why": self.why,
                "time_only_s": self.time_only.value,
                "time_only_interval_s": [self.time_only.lower, self.time_only.upper],
                "time_only_model": self.time_only.how,
                "time_only_pilot_mre": self.time_only.pilot_mre,
                "pilot_f_error": self.pilot_f_error,
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

    def total(self) -> tuple[float, float, float]:
        """Predicted seconds in all, and the interval (the supersteps' bounds summed)."""
        return (sum(s.predicted_s for s in self.steps),
                sum(s.interval_s[0] for s in self.steps),
                sum(s.interval_s[1] for s in self.steps))

    def to_json(self) -> dict[str, Any]:
        p, lo, hi = self.total()
        return {"target": self.target, "sizes": list(self.sizes), "profile": self.profile,
                "variant": next((s.variant for s in self.steps if s.variant), None),
                "supersteps": [s.to_json() for s in self.steps],
                "total": {"predicted_s": p, "interval_s": [lo, hi],
                          "time_only_s": sum(s.time_only.value for s in self.steps)},
                "notes": list(self.notes)}


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
             progress: md.Progress = md.no_progress) -> Forecast:
    """Every superstep at ``target``: counters and time extrapolated, F on the counters."""
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
        tn = [(r.size, t) for r in runs for t in r.step_times(i)]
        if any(not t > 0 for _, t in tn) or any(not r.step_times(i) for r in runs):
            raise BadInput(f"{where}: a pilot run has no time for it",
                           "give complete records (no incomplete supersteps)")
        time_only = extrapolate([n for n, _ in tn], [t * 1e-9 for _, t in tn], target,
                                level=level, modeler=modeler, where=f"{where}: time")
        names = sorted(set.intersection(*(set(s.counters) for s in steps)))
        counters = {c: extrapolate(ns, [float(s.counter(c).sum()) for s in steps], target,
                                   level=level, modeler=modeler, where=f"{where}: {c}")
                    for c in names}
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
                pilot_e = [max(t, p) / min(t, p) for t, p in
                           ((float(s.time_ns or 0), fm.evaluate(s).f) for s in steps) if p > 0]
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
        out.append(sf)
    return Forecast(float(target), sizes, profile.name if profile else None, tuple(out),
                    tuple(notes))


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


def record_run(template: str, n: float, backend: str, out: Any, *, what: str) -> list[Step]:
    """One run of the command at size ``n`` under ``counterd record --backend backend``; its
    supersteps. A failed run or one without supersteps is a BadInput naming the run."""
    import subprocess

    from predictor.inputs import load_counters

    cmd = [*_counterd(), "record", "--backend", backend, "--out", str(out), "--",
           *command_for(template, n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BadInput(f"{what} (n = {_size_text(n)}) failed with exit code "
                       f"{proc.returncode}: {tail}", "run the command by hand at that size")
    steps = load_counters(out)
    if not steps:
        raise BadInput(f"{what} (n = {_size_text(n)}) recorded no supersteps",
                       "mark the program's supersteps with counterd.superstep")
    return steps


def _with_times(counted: Sequence[Step], timed: Sequence[Sequence[Step]], what: str
                ) -> tuple[Step, ...]:
    """The counted run's steps with the median time of the timed runs (a counting source such
    as Callgrind slows the program down; times are always measured without it)."""
    keys = [split_name(s) for s in counted]
    for t in timed:
        if [split_name(s) for s in t] != keys:
            raise BadInput(f"{what}: the timed and the counted runs have different supersteps",
                           "pilot runs must have the same supersteps every time")
    return tuple(Step(s.name, s.counters, s.ranks, s.bank_lm, s.bank_wb, s.k, s.m_b,
                      float(np.median([float(t[i].time_ns or 0) for t in timed])), s.meta)
                 for i, s in enumerate(counted))


def run_campaign(template: str, sizes: Sequence[float], *, repeat: int = 3,
                 backend: str = "callgrind", workdir: Any,
                 progress: md.Progress = md.no_progress) -> list[PilotRun]:
    """At every size: ``repeat`` timed runs (markers only, ``--backend none``) and one counted
    run (``backend``); records under ``workdir``. Progress says what runs and the time left."""
    import time
    from pathlib import Path

    if repeat < 1:
        raise BadInput(f"--repeat {repeat}", "give 1 or more")
    work = Path(workdir)
    runs = []
    spent = {"timed": [0.0, 0], "counted": [0.0, 0]}  # seconds, runs

    def left(i: int, timed_done: int) -> str:
        """Time left: each kind of run at its mean so far, scaled by size (runs grow with n;
        linear scaling is the cautious guess)."""
        est = 0.0
        for kind, count in (("timed", repeat), ("counted", 1)):
            s_, k_ = spent[kind]
            if not k_:
                return ""
            per_n = s_ / k_ / float(np.mean(sizes[:i + 1]))
            todo = [(m, count) for m in sizes[i + 1:]]
            if kind == "timed":
                todo.append((sizes[i], repeat - timed_done))
            est += sum(per_n * m * c for m, c in todo)
        return f", about {est:.0f} s left"

    for i, n in enumerate(sizes):
        timed = []
        for r in range(repeat):
            progress(f"n = {_size_text(n)}: timed run {r + 1}/{repeat}{left(i, r)}")
            t1 = time.monotonic()
            timed.append(record_run(template, n, "none", work / f"timed-{n:g}-{r}.jsonl",
                                    what=f"timed pilot run {r + 1}"))
            spent["timed"][0] += time.monotonic() - t1
            spent["timed"][1] += 1
        progress(f"n = {_size_text(n)}: counted run ({backend}){left(i, repeat)}")
        t1 = time.monotonic()
        counted = record_run(template, n, backend, work / f"counted-{n:g}.jsonl",
                             what=f"counted pilot run ({backend})")
        spent["counted"][0] += time.monotonic() - t1
        spent["counted"][1] += 1
        runs.append(PilotRun(float(n), _with_times(counted, timed, f"n = {_size_text(n)}"),
                             f"the run at n = {_size_text(n)}",
                             tuple(tuple(float(t[i].time_ns or 0) for t in timed)
                                   for i in range(len(counted)))))
    return runs


def measure_target(template: str, target: float, *, repeat: int, workdir: Any,
                   progress: md.Progress = md.no_progress) -> list[tuple[tuple[int, str], float]]:
    """``--check``: the target size's supersteps and their median measured time (ns)."""
    from pathlib import Path

    timed = []
    for r in range(repeat):
        progress(f"n = {_size_text(target)}: checking run {r + 1}/{repeat}")
        timed.append(record_run(template, target, "none",
                                Path(workdir) / f"check-{r}.jsonl", what="checking run"))
    keys = [split_name(s) for s in timed[0]]
    return [(k, float(np.median([float(t[i].time_ns or 0) for t in timed])))
            for i, k in enumerate(keys)]
