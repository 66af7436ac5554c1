"""Where the outside suite's forecast errors come from: the counts' extrapolation, or the time
per unit of work drifting past the pilots (issue 36, analysis).

For every program of an ``outside_suite.py`` work directory whose 4x campaign is there, one
more counted run (Callgrind, as the campaign counts) at the target, kept beside the campaign's
records as ``counted-target.jsonl`` and reused. Per superstep:

- ``I extr/true``: the instructions the campaign extrapolated to the target over the
  instructions counted there (1 is a perfect extrapolation);
- ``E``: the printed forecast against the checking runs' median work;
- ``E oracle``: the scaled forecast with the counted instructions in place of the extrapolated
  ones (the largest pilot's time per instruction times the instructions at the target): what
  the forecast would miss by if the counts' extrapolation were perfect;
- ``tpi``: the time per instruction at the target over the largest pilot's (measured work /
  counted instructions, both sizes): the drift no count extrapolation can fix;
- ``fixed``: the intercept of a least-squares line of the pilots' median work time on their
  counted instructions, over the largest pilot's time: the share of it a line through the
  origin (scaled) multiplies with the work (noisy: four points).

The counted runs are Callgrind's simulated counts (labelled so in the records); the times are
the campaign's timed and checking runs. Nothing is timed here.

    .venv/bin/python bench/outside_counts.py --work out/outside-suite [--held-out] [--only a,b]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import guarded, host_line  # noqa: E402
from bench.outside_suite import HELD_OUT, PROGRAMS, Program  # noqa: E402
from bench.pilot_forecast import e_of  # noqa: E402
from predictor.inputs import load_counters  # noqa: E402
from predictor.pilot.campaign import (  # noqa: E402
    counting_features,
    load_campaign,
    load_checks,
    record_run,
)
from predictor.pilot.extrapolation import WORK  # noqa: E402
from predictor.pilot.runs import split_name  # noqa: E402


def counted_at_target(prog: Program, d: Path) -> dict[tuple[int, str], float]:
    """The instructions of every superstep (summed over processors) in one Callgrind run at
    the 4x target (run once, kept as ``d/counted-target.jsonl``)."""
    out = d / "counted-target.jsonl"
    if out.exists():
        steps = load_counters(out)
    else:
        print(f"outside_counts: {prog.name}: counted run at n = {prog.target('4x'):g}",
              file=sys.stderr, flush=True)
        steps = record_run(prog.template, prog.target("4x"), "callgrind", out,
                           what="counted run at the target",
                           cpu_features=counting_features("native"))
    return {split_name(s): float(s.counter(WORK).sum()) for s in steps}


def rows(prog: Program, d: Path, repeat: int) -> list[dict[str, float | str]]:
    data = json.loads((d / "forecast.json").read_text())
    true = counted_at_target(prog, d)
    runs = load_campaign(d, prog.pilots, repeat)
    checks = load_checks(d, repeat)
    top = runs[-1]
    out = []
    for i, s in enumerate(data["supersteps"]):
        key = (s["index"], s["name"])
        if key not in checks or key not in true or WORK not in s["counters"]:
            continue
        t_p = float(statistics.median(top.step_work(i))) * 1e-9
        i_p = float(top.steps[i].counter(WORK).sum())
        m = checks[key].work_ns * 1e-9
        oracle = t_p * true[key] / i_p
        med = [float(statistics.median(r.step_work(i))) * 1e-9 for r in runs]
        ins = [float(r.steps[i].counter(WORK).sum()) for r in runs]
        _, icpt = np.polyfit(ins, med, 1)
        e, e_oracle = e_of(m, s["predicted_s"]), e_of(m, oracle)
        if e is None or e_oracle is None:  # no time measured at the target
            continue
        out.append({"step": f"{s['index']}:{s['name']}", "basis": s["basis"],
                    "count": s["counters"][WORK] / true[key], "E": e, "oracle": e_oracle,
                    "tpi": (m / true[key]) / (t_p / i_p), "fixed": float(icpt) / t_p,
                    "log_e": math.log(s["predicted_s"] / m)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "outside-suite")
    ap.add_argument("--held-out", action="store_true", help="the held-out programs")
    ap.add_argument("--only", default=None, help="comma-separated program names")
    ap.add_argument("--repeat", type=int, default=5, help="the campaigns' --repeat")
    a = ap.parse_args(argv)
    pool = HELD_OUT if a.held_out else PROGRAMS
    only = set(a.only.split(",")) if a.only else {p.name for p in pool}
    kept = [p for p in pool
            if p.name in only and (a.work / p.name / "c1" / "forecast.json").exists()]
    if not kept:
        print(f"outside_counts: no kept 4x campaign of {', '.join(sorted(only))} in {a.work}: "
              "run bench/outside_suite.py --work DIR first (with --held-out for those)",
              file=sys.stderr)
        return 2
    print(host_line())
    print(f"{'program':15s} {'superstep':16s} {'basis':6s} {'I extr/true':>11s} "
          f"{'E':>6s} {'E oracle':>8s} {'tpi':>6s} {'fixed':>6s}")
    every: list[dict[str, float | str]] = []
    for prog in kept:
        for r in rows(prog, a.work / prog.name / "c1", a.repeat):
            every.append(r)
            print(f"{prog.name:15s} {r['step']!s:16.16s} {r['basis']!s:6s} {r['count']:11.3f} "
                  f"{r['E']:6.2f} {r['oracle']:8.2f} {r['tpi']:6.2f} {r['fixed']:6.2f}")
    if every:
        def med(k: str) -> float:
            return statistics.median(float(r[k]) for r in every)

        counts = [abs(math.log(float(r["count"]))) for r in every]
        print(f"{len(every)} supersteps: median E {med('E'):.3f}, with the counted instructions "
              f"{med('oracle'):.3f}; count extrapolation median |log error| "
              f"{statistics.median(counts):.3f} (E {math.exp(statistics.median(counts)):.3f}), "
              f"over 10 %: {sum(c > math.log(1.1) for c in counts)}; time per instruction at the "
              f"target over the largest pilot's: median {med('tpi'):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
