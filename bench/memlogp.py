"""Memory logP on this host (Cameron, Sun, Byna and Ge, "Predicting and Evaluating Memory
Communication Performance"): fit on one run, predict a second, independent run.

Runs ``microbench memlogp`` twice, one run after the other (unless two results files are
given), fits alpha and the ell(s, d) curves on the first (``predict memlogp``) and prints the
predicted against measured cost per byte of every (operation, s, d) of the second, the worst
error, whether every point is within +-25 % (the target; the paper reached +80 % / -60 %),
the point-to-point transfers on two CPUs, and beside it the noise floor: how far the two runs'
own measurements of the same points are apart (no model fitted on one run can beat that on the
other).

    .venv/bin/python bench/memlogp.py [--runs A.json B.json] [--work DIR] [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import guarded, host_line  # noqa: E402
from predictor.cli import main as predict_main  # noqa: E402
from predictor.errors import BadInput  # noqa: E402
from predictor.families import memlogp as ml  # noqa: E402

TARGET = 0.25


def run(out: Path, quick: bool) -> float:
    t0 = time.monotonic()
    subprocess.run([str(Path(sys.executable).parent / "microbench"), "memlogp", "--out",
                    str(out), "--force", *(["--quick"] if quick else [])],
                   check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", nargs=2, type=Path, default=None, metavar=("FIT", "CHECK"),
                    help="two results files (default: run microbench memlogp twice)")
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "memlogp")
    ap.add_argument("--quick", action="store_true", help="the quick plan (a smoke test)")
    a = ap.parse_args()
    if a.runs:
        paths, took = list(a.runs), None
    else:
        a.work.mkdir(parents=True, exist_ok=True)
        paths = [a.work / "fit.json", a.work / "check.json"]
        took = [run(p, a.quick) for p in paths]
    print(host_line())
    print(f"fit on {paths[0]}, predict {paths[1]}"
          + (f" (measured in {took[0]:.0f} s and {took[1]:.0f} s)" if took else ""))
    sys.stdout.flush()
    code = predict_main(["memlogp", "--results", str(paths[0]), "--validate", str(paths[1])])
    if code:
        return code
    fit_m, check_m = ml.load_measurements(paths[0]), ml.load_measurements(paths[1])
    model = ml.fit(fit_m)
    cmp = ml.compare(model, check_m, str(paths[1]))
    errors = np.array([r.error for r in cmp.rows])
    first = {(p.op, p.s_bytes, p.d_bytes): p.per_byte_s for p in fit_m.points}
    floor = np.array([first[(r.op, r.s_bytes, r.d_bytes)] / r.measured_s_per_byte - 1
                      for r in cmp.rows if (r.op, r.s_bytes, r.d_bytes) in first])
    if floor.size != errors.size:
        raise BadInput(f"{paths[0]} and {paths[1]} measured different points",
                       "give two runs of the same plan (both --quick or neither)")
    worst = cmp.worst
    print()
    print(f"{'':34} {'points':>6} {'mean |err|':>10} {'worst':>8} {'range':>17} "
          f"{'within 25%':>10}")
    for name, e in (("memory logP, out of sample", errors),
                    ("noise floor (run 1 / run 2 - 1)", floor)):
        w = 100 * e[np.argmax(np.abs(e))]
        print(f"{name:34} {e.size:>6} {100 * np.mean(np.abs(e)):>9.1f}% {w:>+7.1f}% "
              f"{100 * e.min():>+7.1f}..{100 * e.max():>+6.1f}% "
              f"{int(np.sum(np.abs(e) <= TARGET)):>5}/{e.size}")
    print(f"worst prediction: {worst.op} s={worst.s_bytes} d={worst.d_bytes} "
          f"{100 * worst.error:+.1f}%; target +-25% on every (s, d): "
          + ("MET" if cmp.within(TARGET) else "MISSED"))
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
