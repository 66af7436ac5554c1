"""Fit the pilot forecast's interval model (``predictor.pilot.choice.interval_half``) on kept
outside-suite campaigns, and measure its coverage on programs left out of the fit.

The model (the code's): the log error of a superstep's forecast at the target is normal with
standard deviation sqrt((A d)^2 + (B s)^2 + (C d short)^2 + (D d h)^2), d = log(target /
largest pilot), s one run's timing spread at the pilots (``timing_spread``), short =
log(SHORT_S / the largest pilot's work) where that work is under SHORT_S (else 0), h the
printed forecast's held-out miss (root mean square of its log errors predicting the larger
pilots from the smaller ones); plus, not fitted, the counts' hinge on the largest pilot
(``extrapolate_count``). The constants are fitted by maximum likelihood (scipy) on every
superstep of every kept campaign at 4x and 16x (``bench/outside_suite.py --refit``'s
forecasts: this tree's code on the campaigns' records, against their checking runs; nothing
runs). ``--terms 2`` or ``3`` fits the model's first two or three terms only. Printed: the
nested models' Akaike information criterion (2, 3 and 4 terms, each fitted on the same
forecasts); the constants fitted with the code's beside them; the 90 % intervals' coverage and
median width (upper / lower) at 4x and 16x with the fitted constants, fitted on all programs
(in sample) and leaving each program out of the fit in turn (out of sample: what a program
nobody fitted on would see); and the same with the code's constants.

    .venv/bin/python bench/pilot_intervals.py [--work out/outside-suite [--work DIR2 ...]]
        [--test DIR ...] [--terms 2|3|4] [--profile P]
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
from bench.outside_suite import HELD_OUT, PROGRAMS, TARGETS, refit  # noqa: E402
from predictor.costs.profile import load_profile  # noqa: E402
from predictor.pilot.choice import (  # noqa: E402
    DRIFT_PER_EFOLD,
    HELDOUT_DRIFT,
    NOISE_FACTOR,
    SHORT_DRIFT,
    SHORT_S,
    Holdout,
)

LEVEL = 0.9
CODE = (DRIFT_PER_EFOLD, NOISE_FACTOR, SHORT_DRIFT, HELDOUT_DRIFT)  # the constants in the code
TERMS = ("A (drift per e-fold)", "B (x timing spread)",
         "C (drift per e-fold per e-fold of shortness)",
         "D (drift per e-fold per unit of held-out miss)")


@dataclass(frozen=True)
class Point:
    program: str
    label: str
    error: float  # log(forecast / measured work)
    spread: float  # one run's timing spread at the pilots (log scale)
    distance: float  # log(target / largest pilot)
    short: float  # log(SHORT_S / work at the largest pilot), 0 where that work is longer
    heldout: float  # the printed forecast's held-out miss (root mean square, log scale)
    where: str = ""  # the work directory of its campaign (one set of campaigns)
    hinge: float = 0.0  # its counts' hinge on the largest pilot (a fixed term, not fitted)


def points(works: Sequence[Path], profile: str | None) -> list[Point]:
    """Every superstep of every kept campaign at each target, in every work directory (a
    program's campaigns in several directories are one program's: leaving it out of the fit
    leaves out all of them). Directories without a kept campaign give none."""
    out = []
    for work in works:
        if any((work / p.name / "c1" / "forecast.json").exists()
               for p in PROGRAMS + HELD_OUT):
            out += _points(work, load_profile(profile or str(work / "node-quick.toml")))
    return out


def _points(work: Path, prof: Any) -> list[Point]:
    out = []
    for p in PROGRAMS + HELD_OUT:  # those with a kept campaign in ``work``
        d = work / p.name / "c1"
        if not (d / "forecast.json").exists():
            continue
        for label in TARGETS:
            data = refit(p, label, d, 5, prof, label == "4x")
            dist = math.log(data["target"] / data["sizes"][-1])
            for s in data["supersteps"]:
                if s["check"] is None or s["choice"] is None:
                    continue
                held = s["choice"]["holdout"][s["choice"]["basis"]]
                miss = Holdout(s["choice"]["basis"], tuple(held["sizes"]),
                               tuple(held["predicted_s"]), tuple(held["measured_s"])).miss
                out.append(Point(p.name, label,
                                 math.log(s["predicted_s"] / s["check"]["work"]["measured_s"]),
                                 s["choice"]["timing_spread"], dist,
                                 max(0.0, math.log(SHORT_S / held["measured_s"][-1])),
                                 miss, str(work), s["choice"].get("hinge", 0.0)))
    return out


def sigma(ab: Sequence[float], pts: Sequence[Point]) -> np.ndarray:
    """sqrt((A d)^2 + (B s)^2 [+ (C d short)^2 [+ (D d h)^2]]): the first ``len(ab)`` terms.
    The third: the error also grows with the distance where the largest pilot's work is under
    ``SHORT_S`` (mostly fixed cost there, as ``advise`` warns); the fourth: it grows with the
    distance in proportion to how far the printed forecast missed the held-out pilots. Plus,
    not fitted, (hinge / 2z)^2, z the 90 % quantile: a count that hinges on the largest pilot
    (``interval_half``)."""
    from scipy import stats

    d = np.array([p.distance for p in pts])
    terms = [d, np.array([p.spread for p in pts]), d * np.array([p.short for p in pts]),
             d * np.array([p.heldout for p in pts])]
    z = float(stats.norm.ppf((1 + LEVEL) / 2))
    fixed = (np.array([p.hinge for p in pts]) / (2 * z)) ** 2
    return np.sqrt(sum((c * t) ** 2 for c, t in zip(ab, terms, strict=False)) + fixed)


def fit(pts: Sequence[Point], k: int = 4) -> tuple[tuple[float, ...], float]:
    """The model's first ``k`` constants by maximum likelihood (normal log errors, sigma as
    the model says), and the negative log likelihood they reach."""
    from scipy import optimize, stats

    e = np.array([p.error for p in pts])

    def nll(x: np.ndarray) -> float:
        s = sigma(np.exp(x), pts)
        return float(-np.sum(stats.norm.logpdf(e / s) - np.log(s)))

    r = optimize.minimize(nll, np.log([0.1, 1.0, 0.1, 0.5][:k]), method="Nelder-Mead",
                          options={"xatol": 1e-7, "fatol": 1e-10, "maxiter": 8000})
    return tuple(float(x) for x in np.exp(r.x)), float(r.fun)


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
    ap.add_argument("--terms", type=int, choices=(2, 3, 4), default=4,
                    help="fit the model's first 2, 3 or all 4 terms (default 4, the code's)")
    ap.add_argument("--profile", default=None,
                    help="machine profile (default: the suite's node-quick.toml)")
    a = ap.parse_args(argv)
    works = a.work or [ROOT / "out" / "outside-suite"]
    pts = points(works, a.profile)
    if not pts:
        print(f"pilot_intervals: no kept campaigns in {', '.join(map(str, works))}: run "
              "bench/outside_suite.py first", file=sys.stderr)
        return 2
    k = a.terms
    programs = sorted({p.program for p in pts})
    print(host_line())
    print(f"{len(programs)} programs, {len(pts)} forecasts (supersteps x targets) from "
          f"{', '.join(map(str, works))}")
    nested = {j: fit(pts, j) for j in (2, 3, 4)}
    print("Akaike information criterion (lower is better), the first 2, 3 and 4 terms: "
          + ", ".join(f"{j}: {2 * nested[j][1] + 2 * j:.1f}" for j in nested))
    ab = nested[k][0]
    print("fitted: " + ", ".join(f"{t} {c:.3f}" for t, c in zip(TERMS, ab, strict=False))
          + "; in the code: " + ", ".join(f"{c}" for c in CODE))
    # leave one program out: fit on the others, judge the one left out
    left_out: dict[str, list[tuple[bool, float]]] = {t: [] for t in TARGETS}
    for prog in programs:
        ab_rest = fit([p for p in pts if p.program != prog], k)[0]
        for t in TARGETS:
            left_out[t] += judged([p for p in pts if p.program == prog and p.label == t],
                                  ab_rest)
    sets = sorted({p.where for p in pts})
    if len(sets) > 1:  # leave one set out: what a fresh set of campaigns would see
        for t in TARGETS:
            line = []
            for w in sets:
                ab_rest = fit([p for p in pts if p.where != w], k)[0]
                mine = [p for p in pts if p.where == w and p.label == t]
                line.append(f"{w}: {_line(judged(mine, ab_rest))}")
            print(f"at {t}, each set left out of the fit and judged: " + "; ".join(line))
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
