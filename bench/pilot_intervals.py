"""Fit the pilot forecast's interval model (``predictor.pilot.choice.interval_half``) on kept
outside-suite campaigns, and measure its coverage on programs left out of the fit.

The model: the log error of a superstep's forecast at the target is normal with standard
deviation sqrt((A * d)^2 + (B * s)^2), d = log(target / largest pilot), s one run's timing
spread at the pilots (``timing_spread``). A and B are fitted by maximum likelihood (scipy) on
every superstep of every kept campaign at 4x and 16x (``bench/outside_suite.py --refit``'s
forecasts: this tree's code on the campaigns' records, against their checking runs; nothing
runs). ``--short-term`` fits a third constant C: sqrt((A d)^2 + (B s)^2 + (C d short)^2),
short = log(SHORT_S / the largest pilot's work) where that work is under SHORT_S (the code's
model). Printed: the constants fitted with the code's beside them; the 90 % intervals'
coverage and median width (upper / lower) at 4x and 16x with the fitted constants, fitted on
all programs (in sample) and leaving each program out of the fit in turn (out of sample: what
a program nobody fitted on would see); and the same with the code's constants.

    .venv/bin/python bench/pilot_intervals.py [--work out/outside-suite [--work DIR2 ...]]
        [--test DIR ...] [--short-term] [--profile P]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import guarded, host_line  # noqa: E402
from bench.outside_suite import PROGRAMS, TARGETS, refit  # noqa: E402
from predictor.costs.profile import load_profile  # noqa: E402
from predictor.pilot.choice import (  # noqa: E402
    DRIFT_PER_EFOLD,
    NOISE_FACTOR,
    SHORT_DRIFT,
    SHORT_S,
)

LEVEL = 0.9
CODE = (DRIFT_PER_EFOLD, NOISE_FACTOR, SHORT_DRIFT)  # the constants in the code


@dataclass(frozen=True)
class Point:
    program: str
    label: str
    error: float  # log(forecast / measured work)
    spread: float  # one run's timing spread at the pilots (log scale)
    distance: float  # log(target / largest pilot)
    short: float  # log(SHORT_S / work at the largest pilot), 0 where that work is longer


def points(works: Sequence[Path], profile: str | None) -> list[Point]:
    """Every superstep of every kept campaign at each target, in every work directory (a
    program's campaigns in two directories count as two programs' for leaving one out: the
    same program, so both are left out together)."""
    out = []
    for work in works:
        prof = load_profile(profile or str(work / "node-quick.toml"))
        out += _points(work, prof)
    return out


def _points(work: Path, prof: Any) -> list[Point]:
    out = []
    for p in PROGRAMS:
        d = work / p.name / "c1"
        if not (d / "forecast.json").exists():
            print(f"pilot_intervals: {p.name}: no kept campaign in {d}, left out",
                  file=sys.stderr)
            continue
        for label in TARGETS:
            data = refit(p, label, d, 5, prof, label == "4x")
            dist = math.log(data["target"] / data["sizes"][-1])
            for s in data["supersteps"]:
                if s["check"] is None or s["choice"] is None:
                    continue
                top = next(iter(s["choice"]["holdout"].values()))["measured_s"][-1]
                out.append(Point(p.name, label,
                                 math.log(s["predicted_s"] / s["check"]["work"]["measured_s"]),
                                 s["choice"]["timing_spread"], dist,
                                 max(0.0, math.log(SHORT_S / top))))
    return out


def sigma(ab: Sequence[float], pts: Sequence[Point]) -> np.ndarray:
    """sqrt((A d)^2 + (B s)^2 [+ (C d short)^2]): with a third constant, the error also grows
    with the distance where the largest pilot's work is under ``SHORT_S`` (mostly fixed
    cost there, as ``advise`` warns)."""
    d = np.array([p.distance for p in pts])
    out = np.hypot(ab[0] * d, ab[1] * np.array([p.spread for p in pts]))
    if len(ab) > 2:
        out = np.hypot(out, ab[2] * d * np.array([p.short for p in pts]))
    return out


def fit(pts: Sequence[Point], k: int = 2) -> tuple[float, ...]:
    """A and B (and C with ``k`` 3) by maximum likelihood (normal log errors, sigma as the
    model says)."""
    from scipy import optimize, stats

    e = np.array([p.error for p in pts])

    def nll(x: np.ndarray) -> float:
        s = sigma(np.exp(x), pts)
        return float(-np.sum(stats.norm.logpdf(e / s) - np.log(s)))

    r = optimize.minimize(nll, np.log([0.1, 1.0, 0.1][:k]), method="Nelder-Mead",
                          options={"xatol": 1e-6, "fatol": 1e-9, "maxiter": 4000})
    return tuple(float(x) for x in np.exp(r.x))


def judged(pts: Sequence[Point], ab: Sequence[float]) -> list[tuple[bool, float]]:
    """Per point: whether its error lies inside the 90 % interval of constants ``ab``, and
    that interval's width (upper / lower)."""
    from scipy import stats

    half = float(stats.norm.ppf((1 + LEVEL) / 2)) * sigma(ab, pts)
    return [(abs(p.error) <= h, math.exp(2 * h)) for p, h in zip(pts, half, strict=True)]


def _line(got: Sequence[tuple[bool, float]]) -> str:
    return (f"cover {np.mean([x for x, _ in got]):.0%}, median width "
            f"{np.median([w for _, w in got]):.2f}x")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, action="append", default=None,
                    help="the outside suite's kept campaigns (default out/outside-suite); "
                         "give it again to pool several sets of campaigns")
    ap.add_argument("--test", type=Path, action="append", default=None,
                    help="campaigns to judge the constants fitted on --work with (another set "
                         "of campaigns: out of sample)")
    ap.add_argument("--short-term", action="store_true",
                    help="fit a third constant: the error growing with the distance where the "
                         "largest pilot is short")
    ap.add_argument("--profile", default=None,
                    help="machine profile (default: the suite's node-quick.toml)")
    a = ap.parse_args(argv)
    works = a.work or [ROOT / "out" / "outside-suite"]
    pts = points(works, a.profile)
    if not pts:
        print(f"pilot_intervals: no kept campaigns in {', '.join(map(str, works))}: run "
              "bench/outside_suite.py first", file=sys.stderr)
        return 2
    k = 3 if a.short_term else 2
    ab = fit(pts, k)
    programs = sorted({p.program for p in pts})
    print(host_line())
    print(f"{len(programs)} programs, {len(pts)} forecasts (supersteps x targets) from "
          f"{', '.join(map(str, works))}")
    print(f"fitted: A (drift per e-fold) {ab[0]:.3f}, B (x timing spread) {ab[1]:.3f}"
          + (f", C (drift per e-fold per e-fold of shortness) {ab[2]:.3f}" if k > 2 else "")
          + f"; in the code: {DRIFT_PER_EFOLD}, {NOISE_FACTOR}, {SHORT_DRIFT}")
    # leave one program out: fit on the others, judge the one left out
    left_out: dict[str, list[tuple[bool, float]]] = {t: [] for t in TARGETS}
    for prog in programs:
        ab_rest = fit([p for p in pts if p.program != prog], k)
        for t in TARGETS:
            left_out[t] += judged([p for p in pts if p.program == prog and p.label == t],
                                  ab_rest)
    for t in TARGETS:
        mine = [p for p in pts if p.label == t]
        print(f"at {t} ({len(mine)} supersteps), 90 % intervals: fitted on all: "
              f"{_line(judged(mine, ab))}; each program left out of the fit: "
              f"{_line(left_out[t])}; the code's constants: "
              f"{_line(judged(mine, CODE))}")
    if a.test:
        test = points(a.test, a.profile)
        for t in TARGETS:
            mine = [p for p in test if p.label == t]
            print(f"at {t}, on {', '.join(map(str, a.test))} ({len(mine)} supersteps): the "
                  f"constants fitted here: {_line(judged(mine, ab))}; the code's: "
                  f"{_line(judged(mine, CODE))}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
