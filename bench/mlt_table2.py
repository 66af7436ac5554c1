"""Table 2 of Hur and Lin's memory-lines-touched paper, for this host (Model families issue).

Runs ``microbench transfer`` twice, one run after the other (300 row and 300 column messages
of 8-byte words between two processes, matrix sides up to 4000, d up to 200, three passes),
unless two results files are given; fits the six regression models of the paper's Table 1 on
100 messages of run A and prints R^2 and MS_E on the rest (``predict mlt --results A``), then
the floor no model can beat: the same test messages' times of run B taken as the prediction of
run A's ("between-run R^2"). The target: for column messages, S1's R^2 at least twice M1's
(the paper's factor 2-6).

    .venv/bin/python bench/mlt_table2.py [--runs A.json B.json] [--work DIR]
                                         [--d-dist log|uniform] [--quick]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import guarded, host_line  # noqa: E402
from predictor.cli import render_table2  # noqa: E402
from predictor.errors import BadInput  # noqa: E402
from predictor.families import mlt  # noqa: E402
from predictor.inputs import read_json  # noqa: E402


def measure(out: Path, d_dist: str, quick: bool) -> float:
    """One run; every run draws the same cases (--seed 0) and times them in its own random
    orders."""
    t0 = time.monotonic()
    subprocess.run([str(Path(sys.executable).parent / "microbench"), "transfer", "--out",
                    str(out), "--force", "--d-dist", d_dist, "--seed", "0",
                    *(["--quick"] if quick else [])],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0


def between_runs(a: mlt.Transfers, b: mlt.Transfers, test: np.ndarray) -> tuple[float, float]:
    """R^2 (eq. 11) of run B's times as the prediction of run A's, on the test messages, and
    on the narrow ones among them."""
    if a.times.size != b.times.size or not np.array_equal(a.n, b.n):
        raise BadInput("the two runs did not measure the same messages",
                       "give runs of the same --seed and --cases")
    narrow = a.narrow[test]
    r_all = mlt.r_squared(a.times[test], b.times[test])
    r_narrow = (mlt.r_squared(a.times[test][narrow], b.times[test][narrow])
                if narrow.sum() > 1 else float("nan"))
    return r_all, r_narrow


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs=2, type=Path, default=None, metavar=("A", "B"),
                    help="two results files of microbench transfer with the same cases "
                    "(default: measure them)")
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "mlt-table2")
    ap.add_argument("--d-dist", choices=("log", "uniform"), default="log")
    ap.add_argument("--quick", action="store_true", help="microbench transfer --quick")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here too")
    a = ap.parse_args()
    if a.runs:
        paths, took = list(a.runs), None
    else:
        a.work.mkdir(parents=True, exist_ok=True)
        paths = [a.work / f"transfer-{a.d_dist}-{x}.json" for x in "ab"]
        took = [measure(p, a.d_dist, a.quick) for p in paths]
    docs = [read_json(p, "microbench transfer") for p in paths]
    print(host_line())
    print(f"runs {paths[0]} and {paths[1]}"
          + (f" ({took[0]:.0f} s and {took[1]:.0f} s)" if took else "")
          + f"; d drawn {docs[0].get('config', {}).get('d_dist', '?')}, "
          f"source lines {docs[0].get('state', '?')} before each exchange")
    fits: dict[str, tuple[mlt.RegressionFit, ...]] = {}
    got: dict[str, mlt.Transfers] = {}
    figures: dict[str, dict[str, Any]] = {}
    for kind in mlt.TRANSFER_KINDS:
        ta, tb = (mlt.transfers(d, kind, str(p)) for d, p in zip(docs, paths, strict=True))
        got[kind] = ta
        fits[kind] = mlt.fit_table1(ta.table, ta.times, narrow=ta.narrow)
        _, test = mlt.split(ta.times.size)
        floor_all, floor_narrow = between_runs(ta, tb, test)
        by = {f.name: f for f in fits[kind]}
        figures[kind] = {"models": [f.to_json() for f in fits[kind]],
                         "between_run_r2": floor_all, "between_run_r2_narrow": floor_narrow,
                         "s1_over_m1": by["S1"].r2 / by["M1"].r2}
    print()
    print(render_table2(fits, got))
    print()
    for kind, f in figures.items():
        print(f"{kind}: between-run R^2 (run B's times as the prediction of run A's, same test "
              f"messages): {f['between_run_r2'] * 1e3:.2f} x 1e-3"
              + (f"; narrower than a line: {f['between_run_r2_narrow'] * 1e3:.2f} x 1e-3"
                 if kind == "cols" else ""))
    ratio = figures["cols"]["s1_over_m1"]
    by = {f.name: f for f in fits["cols"]}
    narrow = (by["S1"].narrow_r2 / by["M1"].narrow_r2
              if by["S1"].narrow_r2 and by["M1"].narrow_r2 else float("nan"))
    print(f"target, column messages: S1's R^2 / M1's >= 2: {ratio:.2f}, "
          + ("met" if ratio >= 2 else "MISSED")
          + f" (narrower than a line: {narrow:.2f})")
    if a.json:
        a.json.write_text(json.dumps({"host": host_line(), "runs": [str(p) for p in paths],
                                      "kinds": figures}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(guarded(main))
