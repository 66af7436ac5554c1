"""Table 4 of Amato et al. on this host: forecasting the BSP sorts' supersteps from pilot runs.

N. M. Amato et al., "Predicting Performance on SMPs. A Case Study: The SGI Power Challenge",
section 5.4: counters measured at small input sizes, extrapolated to larger ones and fed to F.
Here, for radix, sample and column sort (``examples/bsp_sort.py``, p = 2, n/p keys each):

1. The pilot campaign is ``predict --pilot`` itself, at n/p = 1e5 * i for i = 1..5 (timed runs
   with markers only, one counted run per size from Callgrind), timed as a user would see it:
   natively, or with ``--cpu-features as-counted`` the code Callgrind counts (AVX-512 hidden
   from code dispatch), the target runs alike.
2. Targets: n/p = 1e5 * i for i = 6..10 (the paper's) and 16x the largest pilot. At each:
   ``--target-repeat`` timed runs (their median is the measured time, work and span apart; the
   two halves of the runs, compared, give the noise floor: what no forecast can beat) and,
   unless
   ``--no-target-counts``, one counted run for F with measured counts.
3. Per superstep and target, E = max(T, P) / min(T, P) against the measured work (the slowest
   processor's own time, ``counterd.data.records.Superstep.slowest_work_ns``) of: F with measured
   counts, F with extrapolated counts, scaled (the largest pilot's work time per instruction
   times the instructions extrapolated), time-only extrapolation of the work time, the
   forecast ``predict --pilot`` prints (its ``basis``), and Extra-P (``extrap`` 4.2.5, default
   modeler, on the same pilot work times; installed into ``bench/.extrap-venv`` on first use);
   and of the span forecast (the work forecast plus the pilots' extra of the span over the
   work, not scaled with n) against the measured span (last end minus first begin). Reported:
   median, average and maximum E, the share within 10 %, and how often the 90 % intervals
   cover the measured time.
4. ``--suite others``: the same for four numpy/scipy programs outside the project
   (``bench/pilot_programs.py``: FFT, dense linear algebra, sparse iterations, sorting and
   counting), pilots at 1e5..5e5 (dense: matrix order 100..500; sparse: 2e4..1e5) and a
   target at 4x the largest pilot: forecasts must not be tuned to the sorts.

    .venv/bin/python bench/pilot_forecast.py [--suite sorts|others] [--only radix,...]
        [--work DIR] [--profile P] [--no-target-counts] [--no-extrap] [--repeat 10]
        [--target-repeat 10] [--cpu-features native|as-counted] [--json OUT]

Quicker: ``--repeat 5 --target-repeat 5 --no-target-counts --no-extrap`` (half the timed
runs, no Callgrind runs at the targets: no "F measured" and no Extra-P column).

Records are kept under ``--work`` (default ``out/pilot-forecast-SUITE``, with
``-as-counted`` after it for ``--cpu-features as-counted``); runs whose records
exist are not run again (delete the directory for a fresh measurement), so an interrupted run
resumes and the analysis can be repeated without measuring.

Targets (issue 15): at the paper's targets, median E <= 1.10, maximum E <= 1.50, 90 % of
supersteps within 10 %, 90 % intervals covering >= 85 %; a campaign of <= 5 minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import host_line  # noqa: E402
from predictor.costs.profile import MachineProfile, load_profile  # noqa: E402
from predictor.inputs import load_counters  # noqa: E402
from predictor.pilot.campaign import TIMING_FEATURES, load_campaign, record_path, record_run  # noqa: E402
from predictor.pilot.forecast import forecast  # noqa: E402
from predictor.pilot.runs import PilotRun, load_timings  # noqa: E402

PILOTS = tuple(1e5 * i for i in range(1, 6))


@dataclass(frozen=True)
class Case:
    """One program: its command (``{n}`` for the size), pilot sizes, targets by group."""

    name: str
    template: str
    pilots: tuple[float, ...]
    targets: dict[str, tuple[float, ...]]

    def sizes(self) -> tuple[float, ...]:
        return tuple(n for group in self.targets.values() for n in group)


def sort_case(algo: str) -> Case:
    return Case(algo, f"{sys.executable} {ROOT / 'examples' / 'bsp_sort.py'} {algo} "
                      "--keys {n} -p 2", PILOTS,
                {"paper's targets": tuple(1e5 * i for i in range(6, 11)),
                 "16x": (16 * PILOTS[-1],)})


def other_case(program: str) -> Case:
    """A program outside the project, forecast at 4x its largest pilot."""
    step = {"dense": 100.0, "sparse": 2e4}.get(program, 1e5)  # largest pilot ~0.1-0.3 s
    pilots = tuple(step * i for i in range(1, 6))
    return Case(program, f"{sys.executable} {ROOT / 'bench' / 'pilot_programs.py'} {program} "
                         "{n}", pilots, {"4x": (4 * pilots[-1],)})


SUITES = {"sorts": [sort_case(a) for a in ("radix", "sample", "column")],
          "others": [other_case(p) for p in ("fft", "dense", "sparse", "stats")]}
EXTRAP_VENV = ROOT / "bench" / ".extrap-venv"
METHODS = ("F measured", "F extrap", "scaled", "fit", "time-only", "forecast", "Extra-P",
           "span")  # all against the measured work but "span", against the measured span
VENV_BIN = Path(sys.executable).parent


def log(msg: str) -> None:
    print(f"pilot_forecast: {msg}", file=sys.stderr, flush=True)


def ensure_profile(arg: str | None, work: Path) -> MachineProfile:
    """The profile given, else one calibrated here as ``make demo`` does (quick suite)."""
    if arg:
        return load_profile(arg)
    path = work / "node-quick.toml"
    if not path.exists():
        log("no --profile: calibrating one with the quick microbench suite")
        subprocess.run([str(VENV_BIN / "microbench"), "run", "--quick", "--out",
                        str(work / "quick.json"), "--force"], check=True)
        subprocess.run([str(VENV_BIN / "predict"), "calibrate", "--results",
                        str(work / "quick.json"), "--out", str(path), "--force"], check=True)
    return load_profile(str(path))


def run_pilots(case: Case, work: Path, repeat: int, features: str) -> float | None:
    """``predict --pilot`` for one program, keeping its records; its wall time (None if the
    records were there already)."""
    d = work / case.name / "pilot"
    if record_path(d, "counted", case.pilots[-1]).exists():
        return None
    t0 = time.monotonic()
    subprocess.run([str(VENV_BIN / "predict"), "--pilot", case.template, "--sizes",
                    ",".join(f"{s:g}" for s in case.pilots), "--target",
                    f"{case.sizes()[0]:g}", "--repeat", str(repeat), "--cpu-features", features,
                    "--keep", str(d), "--json"],
                   check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def run_targets(case: Case, work: Path, repeat: int, counts: bool, features: str) -> None:
    d = work / case.name / "target"
    d.mkdir(parents=True, exist_ok=True)
    for n in case.sizes():
        for r in range(repeat):
            out = record_path(d, "timed", n, r)
            if not out.exists():
                log(f"{case.name} n = {n:g}: timed run {r + 1}/{repeat}")
                record_run(case.template, n, "none", out, what="timed target run",
                           cpu_features=features)
        out = record_path(d, "counted", n)
        if counts and not out.exists():
            log(f"{case.name} n = {n:g}: counted run (callgrind)")
            record_run(case.template, n, "callgrind", out, what="counted target run")


def extrap_python() -> Path:
    py = EXTRAP_VENV / "bin" / "python"
    if not py.exists():
        log(f"installing extrap 4.2.5 into {EXTRAP_VENV} (a bench dependency)")
        subprocess.run(["python3", "-m", "venv", str(EXTRAP_VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "extrap==4.2.5"], check=True)
    return py


def extrap_forecasts(runs: Sequence[PilotRun], targets: Sequence[float], work: Path
                     ) -> dict[str, dict[str, Any]]:
    """Extra-P's model of every superstep's work time on the same pilot timings."""
    path = work / "extrap-in.jsonl"
    with path.open("w") as f:
        for r in runs:
            for i, s in enumerate(r.steps):
                for t in r.step_work(i):
                    f.write(json.dumps({"params": {"n": r.size}, "callpath": s.name,
                                        "metric": "time", "value": t * 1e-9}) + "\n")
    out = subprocess.run([str(extrap_python()), str(ROOT / "bench" / "_extrap_forecast.py"),
                          str(path), *(f"{t:g}" for t in targets)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def e_of(t: float, p: float | None) -> float | None:
    """E of a forecast p of the time t; inf for a forecast of zero or less (Extra-P's models
    can fall below zero outside the pilot range)."""
    if p is None or not t > 0:
        return None
    return max(t, p) / min(t, p) if p > 0 else math.inf


def _medians(values: Sequence[float]) -> tuple[float, float | None]:
    """The median of ``values`` and the noise floor: E between the medians of its halves."""
    return (float(np.median(values)),
            e_of(float(np.median(values[0::2])), float(np.median(values[1::2]))))


def rows_for(case: Case, work: Path, profile: MachineProfile, repeat: int,
             target_repeat: int, extrap: bool) -> list[dict[str, Any]]:
    """One row per (target, superstep): measured work and span, their floors, each method's
    E (the work's forecasts against the work, the span's against the span)."""
    runs = load_campaign(work / case.name / "pilot", case.pilots, repeat)
    ex = extrap_forecasts(runs, case.sizes(), work / case.name) if extrap else {}
    group = {n: g for g, sizes in case.targets.items() for n in sizes}
    fm = {}
    memo: dict[Any, Any] = {}  # the held-out predictions, the same at every target
    rows = []
    for n in case.sizes():
        tdir = work / case.name / "target"
        timed = [{t.key: t for t in load_timings(record_path(tdir, "timed", n, r))}
                 for r in range(target_repeat)]
        counted_path = record_path(tdir, "counted", n)
        counted = load_counters(counted_path) if counted_path.exists() else None
        fc = forecast(runs, n, profile, memo=memo)
        for i, s in enumerate(fc.steps):
            key = runs[0].steps[i].name  # "index:name", as Extra-P saw it
            ex_at = ex.get(key, {}).get("at", {}).get(f"{n:g}")
            mine = [t[(s.index, s.name)] for t in timed]
            t, floor = _medians([float(x.work_ns or 0) * 1e-9 for x in mine])
            span, span_floor = _medians([float(x.span_ns or 0) * 1e-9 for x in mine])
            f_meas = None
            if counted is not None and s.variant is not None:
                fm.setdefault(s.variant, profile.f_model(s.variant))
                f_meas = fm[s.variant].evaluate(counted[i]).f * 1e-9
            lo, hi = s.interval_s
            slo, shi = s.span_interval_s
            rows.append({
                "algo": case.name, "n": n, "group": group[n], "step": f"{s.index}:{s.name}",
                "measured_s": t, "measured_span_s": span,
                "skew_s": float(np.median([x.skew_ns for x in mine])) * 1e-9,
                "floor": floor, "span_floor": span_floor, "basis": s.basis,
                "forecast_s": s.predicted_s, "span_forecast_s": s.span_s,
                "extra_s": s.extra.value if s.extra else None,
                "extra_model": s.extra.how if s.extra else None,
                "E": {"F measured": e_of(t, f_meas), "F extrap": e_of(t, s.f_s),
                      "scaled": e_of(t, s.scaled.value if s.scaled else None),
                      "fit": e_of(t, s.fit.value if s.fit else None),
                      "time-only": e_of(t, s.time_only.value),
                      "forecast": e_of(t, s.predicted_s),
                      "Extra-P": e_of(t, ex_at),
                      "span": e_of(span, s.span_s)},
                "inside": {"forecast": lo <= t <= hi,
                           "scaled": s.scaled.lower <= t <= s.scaled.upper if s.scaled
                           else None,
                           "time-only": s.time_only.lower <= t <= s.time_only.upper,
                           "F extrap": (s.f_interval_s[0] <= t <= s.f_interval_s[1]
                                        if s.f_interval_s else None),
                           "span": slo <= span <= shi},
                "width": {"forecast": s.width,
                          "span": shi / slo if slo > 0 else None},
                "holdout": ({b: {"errors": h.errors.tolist(), "sizes": list(h.sizes)}
                             for b, h in s.choice.holdouts.items()} if s.choice else {}),
                "time_only_model": s.time_only.how,
                "extrap_model": ex.get(key, {}).get("model")})
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = [f"{'method':<11} {'steps':>5} {'median E':>8} {'mean E':>7} {'max E':>6} "
           f"{'<=10%':>6} {'90% int.':>8} {'width':>6}   (against the measured work; span: "
           "against the measured span; width: the 90 % interval's median upper / lower)"]
    for m in METHODS:
        es = [r["E"][m] for r in rows if r["E"][m] is not None]
        if not es:
            out.append(f"{m:<11} {0:>5}  (not measured)")
            continue
        cover = [r["inside"].get(m) for r in rows if r["inside"].get(m) is not None]
        finite = [e for e in es if math.isfinite(e)]
        out.append(f"{m:<11} {len(es):>5} {statistics.median(es):>8.3f} {np.mean(finite):>7.3f} "
                   f"{max(es):>6.2f} {np.mean([e <= 1.1 for e in es]):>6.0%} "
                   + (f"{np.mean(cover):>8.0%}" if cover else f"{'-':>8}")
                   + (f" {statistics.median(ws):>6.2f}" if (ws := [
                       r["width"][m] for r in rows
                       if r.get("width", {}).get(m) is not None]) else "")
                   + (f"  ({len(es) - len(finite)} forecasts <= 0, mean without them)"
                      if len(finite) < len(es) else ""))
    for what, key in (("work", "floor"), ("span", "span_floor")):
        floor = [r[key] for r in rows if r[key] is not None]
        if floor:
            out.append(f"{'floor ' + what:<11} {len(floor):>5} {statistics.median(floor):>8.3f} "
                       f"{np.mean(floor):>7.3f} {max(floor):>6.2f} "
                       f"{np.mean([e <= 1.1 for e in floor]):>6.0%}    (half the target runs "
                       f"against the other half, {what})")
    return out


def per_algo(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Table 4's layout: average E per program, and where the printed forecast came from."""
    out = [f"{'program':<8} " + " ".join(f"{m:>10}" for m in METHODS) + "  forecast from"]
    left_out = False
    for algo in dict.fromkeys(r["algo"] for r in rows):
        cells = []
        for m in METHODS:
            es = [r["E"][m] for r in rows if r["algo"] == algo and r["E"][m] is not None]
            finite = [e for e in es if math.isfinite(e)]
            left_out |= len(finite) < len(es)
            cells.append(f"{np.mean(finite):>9.3f}{'*' if len(finite) < len(es) else ' '}"
                         if es else f"{'-':>10}")
        basis = [r["basis"] for r in rows if r["algo"] == algo]
        out.append(f"{algo:<8} " + " ".join(cells) + "  " + ", ".join(
            f"{b} {basis.count(b)}" for b in sorted(set(basis))))
    if left_out:
        out.append("(*: forecasts <= 0 left out of the average)")
    return out


def worst(rows: Sequence[dict[str, Any]], most: int = 5) -> list[str]:
    """The largest E of the work forecasts and of the span forecasts, with what they were."""
    out = []
    for what, method, fields in (("work", "forecast", ("forecast_s", "measured_s", "floor")),
                                 ("span", "span", ("span_forecast_s", "measured_span_s",
                                                   "span_floor"))):
        out.append(f"worst {what} forecasts:")
        for r in sorted(rows, key=lambda r: -(r["E"][method] or 0))[:most]:
            forecast, measured, floor = (r[f] for f in fields)
            out.append(f"  {r['algo']} n={r['n']:g} {r['step']}: E {r['E'][method]:.2f} "
                       f"(forecast {forecast:.4g} s, measured {measured:.4g} s; extra "
                       f"{r['extra_s'] or 0:.3g} s; from {r['basis']}; floor "
                       + (f"{floor:.2f})" if floor is not None else "-)"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", choices=sorted(SUITES), default="sorts",
                    help="sorts: the BSP sorts at Table 4's targets and 16x (default); "
                    "others: numpy/scipy programs outside the project at 4x")
    ap.add_argument("--only", default=None, help="comma-separated programs of the suite")
    ap.add_argument("--work", type=Path, default=None,
                    help="where records are kept (default out/pilot-forecast-SUITE)")
    ap.add_argument("--profile", default=None, help="machine profile (default: calibrate one)")
    ap.add_argument("--repeat", type=int, default=10, help="timed runs per pilot size")
    ap.add_argument("--target-repeat", type=int, default=10, help="timed runs per target")
    ap.add_argument("--no-target-counts", action="store_true",
                    help="no counted runs at the targets (no 'F measured' column)")
    ap.add_argument("--no-extrap", action="store_true", help="leave Extra-P out")
    ap.add_argument("--cpu-features", choices=TIMING_FEATURES, default="native",
                    help="how the timed runs run (predict --pilot --cpu-features; default "
                    "native, as the programs run without counterd)")
    ap.add_argument("--json", type=Path, default=None, help="write every row to this file")
    a = ap.parse_args(argv)
    cases = [c for c in SUITES[a.suite] if a.only is None or c.name in a.only.split(",")]
    work = a.work or ROOT / "out" / (f"pilot-forecast-{a.suite}"
                                     + ("-as-counted" if a.cpu_features == "as-counted" else ""))
    work.mkdir(parents=True, exist_ok=True)
    profile = ensure_profile(a.profile, work)
    counts = not a.no_target_counts and a.suite == "sorts"
    campaign = {}
    for case in cases:
        log(f"{case.name}: pilot campaign (predict --pilot)")
        campaign[case.name] = run_pilots(case, work, a.repeat, a.cpu_features)
        run_targets(case, work, a.target_repeat, counts, a.cpu_features)
    rows = [r for case in cases
            for r in rows_for(case, work, profile, a.repeat, a.target_repeat, not a.no_extrap)]
    print(host_line())
    print(f"programs {', '.join(c.name for c in cases)}; {a.repeat} timed runs + 1 counted run "
          f"(callgrind) per pilot size, {a.target_repeat} timed runs per target, timed runs "
          f"{a.cpu_features}; profile {profile.name}")
    for c in cases:
        s = campaign[c.name]
        print(f"  {c.name}: {c.template}; pilots {', '.join(f'{x:g}' for x in c.pilots)}; "
              + (f"campaign {s:.0f} s (predict --pilot, wall)" if s is not None
                 else "records reused, campaign not timed"))
    for g in dict.fromkeys(r["group"] for r in rows):
        mine = [r for r in rows if r["group"] == g]
        print(f"\nat {g}, n = {', '.join(f'{n:g}' for n in dict.fromkeys(r['n'] for r in mine))}:")
        print("\n".join(summary(mine)))
        print("\naverage E per program (Table 4's layout):")
        print("\n".join(per_algo(mine)))
        print("\n".join(worst(mine)))
    if a.json:
        a.json.write_text(json.dumps({"host": host_line(), "campaign_s": campaign,
                                      "cpu_features": a.cpu_features, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
