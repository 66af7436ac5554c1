"""The noise floor of the validation patterns on this host (Accuracy issue, item 1).

Runs the validation suite twice (``microbench run --suite validation``, one run after the
other) unless two results files are given, and prints, for every way of summarising a
pattern's repetitions (median, minimum, 20 % trimmed mean, mean), the E between the two
runs' times of each pattern: average and maximum, the worst patterns, and the same without
the patterns either run flagged ``unstable``, ``steal`` or ``preempted``; beside it, the floor
within one run (odd against even repetitions). No cost function can beat the floor between
runs.

    .venv/bin/python bench/noise_floor.py [--runs A.json B.json] [--work DIR] [--quick]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import host_line  # noqa: E402
from predictor.costs import floor  # noqa: E402
from predictor.inputs import load_results  # noqa: E402


def run_suite(out: Path, quick: bool) -> float:
    t0 = time.monotonic()
    subprocess.run([str(Path(sys.executable).parent / "microbench"), "run", "--suite",
                    "validation", "--out", str(out), "--force", *(["--quick"] if quick else [])],
                   check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def row(f: floor.Floor) -> str:
    worst = ", ".join(f"{n} {e:.2f}" for n, e in f.worst(3))
    return (f"{f.summary:<13} {len(f.e):>8} {f.average:>9.3f} {f.maximum:>9.2f}   {worst}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs=2, type=Path, default=None, metavar=("A", "B"),
                    help="two results files of the same suite (default: run it twice)")
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "noise-floor")
    ap.add_argument("--quick", action="store_true", help="microbench's --quick repetitions")
    a = ap.parse_args()
    if a.runs:
        paths = list(a.runs)
        took = None
    else:
        a.work.mkdir(parents=True, exist_ok=True)
        paths = [a.work / "validation-a.json", a.work / "validation-b.json"]
        took = [run_suite(p, a.quick) for p in paths]
    ra, rb = (load_results(p) for p in paths)
    print(host_line())
    print(f"runs {paths[0]} and {paths[1]}"
          + (f" ({took[0]:.0f} s and {took[1]:.0f} s)" if took else ""))
    head = f"{'summary':<13} {'patterns':>8} {'average E':>9} {'max E':>9}   worst"
    for title, make in (("between the two runs", lambda s: floor.between_runs(ra, rb, s)),
                        ("within run A (odd against even repetitions)",
                         lambda s: floor.within_run(ra, s))):
        print(f"\nnoise floor {title}:")
        print(head)
        floors = [make(s) for s in floor.SUMMARIES]
        for f in floors:
            print(row(f))
        print("the same without patterns flagged unstable, steal or preempted:")
        for f in floors:
            u = f.undisturbed()
            print(row(u) if u.e else f"{f.summary:<13} (every pattern was flagged)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
