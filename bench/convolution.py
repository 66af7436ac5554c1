"""Conv-Shift or Conv-Scan: which is faster, and where the crossover lies, predicted by the
standard model (S1) and the memory-lines-touched model (M1), against measured times.

I. Hur and C. Lin, "Incorporating Cache Effects into a Model of Interprocessor Communication",
section 7 (Figures 14-17): two programs computing the same uniform convolution of an L x L
image with block b (examples/convolution.py); the ratio of Conv-Shift time over Conv-Scan time
per (b, L), measured and predicted; the crossover is the smallest b at which Conv-Scan is
faster. Here, on this host, with a 1 x p mesh of worker processes (p = 2):

1. Calibration (no program run): every operation kind the programs use (copy, fill, add,
   addcol, cumsum_row, cumsum_col, bzyx: the numpy calls themselves, over random shapes,
   pitches and offsets, run by every processor at once) and row and column transfers of the
   native copy kernel (d rows or columns of a b_r x b_c matrix just written by the other
   processor) -- or, with ``--transfers FILE``, the cases of ``microbench transfer --out``.
   Computation kinds are timed cold (each run after reading 32 MiB per processor, so every
   line the operation touches is a miss, the regime MLT counts) unless ``--warm``.
   Each kind gets the paper's Table 1 models S1 (alpha + beta n) and M1 (alpha + beta n +
   gamma MLT), fitted by predictor.mlt.fit_table1; R^2 (eq. 11) and MS_E (eq. 10) on samples
   kept out of the fit.
2. Measurement: both programs at every (b, L), ``--repeats`` timed runs each after a warm-up,
   in ``--rounds`` launches; in each launch the programs and a share of the calibration run in a
   fresh random order, so a slow spell of the host falls on calibration and measurement alike.
   A run's time is the BSP one (per superstep the slowest processor's own work, summed); per
   round the median over repeats; the measured ratio is the median over rounds of the per-round
   ratio (shift and scan measured in the same launch).
3. Prediction: per program, from predictor.convolution's operation accounting (n and MLT of
   every operation from L, b and the layout), the sum over supersteps of the slowest
   processor's summed operation predictions, with the S1 fits and with the M1 fits.

    .venv/bin/python bench/convolution.py [--quick] [--sizes 200,400,700,1000] [--blocks 1-10]
        [--rounds 7] [--repeats 5] [--transfers FILE] [--json OUT]

Target (issue 12): the convolution crossover predicted at the measured block size.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._host import host_line  # noqa: E402
from predictor import convolution as cv  # noqa: E402
from predictor.errors import PredictorError  # noqa: E402

MODELS = ("S1", "M1")


def _load_programs() -> Any:
    """examples/convolution.py, under another name than this script's own."""
    spec = importlib.util.spec_from_file_location("convolution_programs",
                                                  ROOT / "examples" / "convolution.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # before running it: its dataclasses look it up
    spec.loader.exec_module(module)
    return module


prog = _load_programs()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- calibration shapes ------------------------------------------------------------------------

def _logint(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(round(np.exp(rng.uniform(np.log(lo), np.log(hi)))))


def _pitch(rng: np.random.Generator, cols: int, hi: int) -> int:
    """Contiguous, nearly contiguous or wide, a third each."""
    u = rng.integers(3)
    if u == 0:
        return cols
    if u == 1:
        return cols + int(rng.integers(1, 9))
    return max(cols, _logint(rng, max(cols, 8), hi))


def compute_shapes(rng: np.random.Generator, per_kind: int, max_rows: int
                   ) -> list[cv.Shape]:
    """Random shapes per kind: rows 64..max_rows, widths 1..700 (30 % of them 1..16: the
    programs' column unpacks and fluff), pitches contiguous to 1200, any line offset."""
    out = []
    for kind in cv.COMPUTE_KINDS:
        for _ in range(per_kind):
            rows = _logint(rng, 64, max_rows)
            cols = _logint(rng, 1, 16) if rng.random() < 0.3 else _logint(rng, 32, 700)
            dst = _pitch(rng, cols, 1200)
            src = _pitch(rng, cols, 1200)
            out.append(cv.Shape(kind, rows, cols, dst, src, int(rng.integers(0, cv.LINE)),
                                int(rng.integers(1, 13))))
    return out


def transfer_cases(rng: np.random.Generator, count: int, max_rows: int
                   ) -> list[tuple[str, int, int, int]]:
    """(kind, b_r, b_c, d): rows or columns, half each; matrices 16..max_rows square-ish."""
    out = []
    for i in range(count):
        kind = "rows" if i % 2 else "cols"
        b_r, b_c = _logint(rng, 16, max_rows), _logint(rng, 16, max_rows)
        d = _logint(rng, 1, 16)
        d = min(d, b_r if kind == "rows" else b_c)
        out.append((kind, b_r, b_c, d))
    return out


def load_transfers(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n, MLT, seconds) of the cases of a ``microbench transfer --out`` file; n and MLT are
    recounted here (:func:`predictor.convolution.transfer_case`) so they mean what the
    programs' transfers mean."""
    data = json.loads(path.read_text())
    rows = []
    for c in data["cases"]:
        op = cv.transfer_case(c["kind"], int(c["b_r"]), int(c["b_c"]), int(c["d"]))
        if int(c.get("n_bytes", op.n)) != op.n:
            raise SystemExit(f"convolution: {path}: case {c} has n_bytes {c['n_bytes']}, "
                             f"expected {op.n} (8-byte elements)")
        rows.append((op.n, op.mlt, float(c["time_s"])))
    a = np.array(rows, dtype=float)
    return a[:, 0], a[:, 1], a[:, 2]


# -- measurement -------------------------------------------------------------------------------

def measure(args: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    """Run every round; return the calibration samples and the per-round program times."""
    p = args.p
    shapes = compute_shapes(rng, args.per_kind, max(args.sizes) + 100)
    xfers = [] if args.transfers else transfer_cases(rng, args.transfer_cases,
                                                     max(args.sizes) + 100)
    calib: list[Any] = [prog.OpJob(s, args.calib_repeats, not args.warm) for s in shapes]
    calib += [prog.TransferJob(k, r, c, d, args.calib_repeats) for k, r, c, d in xfers]
    order = rng.permutation(len(calib))
    shares = np.array_split(order, args.rounds)
    configs = [(n, L, b) for L in args.sizes for b in args.blocks for n in cv.PROGRAMS]
    times: dict[tuple[str, int, int], list[float]] = {c: [] for c in configs}
    calib_t: dict[int, float] = {}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        jobs: list[Any] = [prog.ProgramJob(n, L, b, args.repeats, check=(r == 0))
                                for n, L, b in configs]
        jobs += [calib[i] for i in shares[r]]
        perm = rng.permutation(len(jobs))
        jobs = [jobs[i] for i in perm]
        res = prog.run_jobs(jobs, p, markers=False)
        index = {id(calib[i]): int(i) for i in shares[r]}
        for job, t in zip(jobs, res, strict=True):
            if isinstance(job, prog.ProgramJob):
                times[(job.name, job.size, job.block)].append(
                    float(np.median(t.max(axis=2).sum(axis=1))) / 1e9)
            else:
                calib_t[index[id(job)]] = float(np.median(t.max(axis=2)[:, 0])) / 1e9
        log(f"  round {r + 1}/{args.rounds} ({time.perf_counter() - t0:.0f} s)")
    return {"shapes": shapes, "xfers": xfers, "calib": calib_t, "times": times,
            "configs": configs, "n_shapes": len(shapes)}


def samples(meas: dict[str, Any], transfers: Path | None
            ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    out: dict[str, list[tuple[int, int, float]]] = {}
    shapes: list[cv.Shape] = meas["shapes"]
    for i, s in enumerate(shapes):
        op = cv.calibration_op(s)
        out.setdefault(s.kind, []).append((op.n, op.mlt, meas["calib"][i]))
    for j, (k, r, c, d) in enumerate(meas["xfers"]):
        op = cv.transfer_case(k, r, c, d)
        out.setdefault(cv.TRANSFER, []).append((op.n, op.mlt, meas["calib"][len(shapes) + j]))
    table = {}
    for kind, rows in out.items():
        a = np.array(rows, dtype=float)
        table[kind] = (a[:, 0], a[:, 1], a[:, 2])
    if transfers is not None:
        table[cv.TRANSFER] = load_transfers(transfers)
    return table


# -- report ------------------------------------------------------------------------------------

def _blocks(text: str) -> list[int]:
    if "-" in text:
        a, b = text.split("-")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (about a minute)")
    ap.add_argument("--sizes", default=None, help="image sizes L (default 200,400,700,1000)")
    ap.add_argument("--blocks", default="1-10", help="block sizes b (default 1-10)")
    ap.add_argument("--rounds", type=int, default=None, help="launches (default 7)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per launch")
    ap.add_argument("--per-kind", type=int, default=None,
                    help="calibration shapes per computation kind (default 60)")
    ap.add_argument("--transfer-cases", type=int, default=None,
                    help="calibration transfers (default 200; 100 train, as the paper)")
    ap.add_argument("--calib-repeats", type=int, default=3)
    ap.add_argument("--transfers", type=Path, default=None,
                    help="calibrate transfers from a `microbench transfer --out` file instead")
    ap.add_argument("--warm", action="store_true",
                    help="time the computation kinds on cached data (default: after evicting "
                    "the caches, each run's lines come from memory)")
    ap.add_argument("-p", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write everything here")
    args = ap.parse_args(argv)
    args.sizes = [int(x) for x in (args.sizes or ("200,400" if args.quick
                                                  else "200,400,700,1000")).split(",")]
    args.blocks = _blocks(args.blocks)
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.per_kind = args.per_kind or (24 if args.quick else 60)
    args.transfer_cases = args.transfer_cases or (120 if args.quick else 200)
    if args.quick:
        args.repeats = min(args.repeats, 3)
    rng = np.random.default_rng(args.seed)

    print(host_line())
    print(f"Conv-Shift vs Conv-Scan on a 1 x {args.p} mesh: L in {args.sizes}, b in "
          f"{args.blocks[0]}..{args.blocks[-1]}, {args.rounds} rounds x {args.repeats} runs, "
          "BSP time (per superstep the slowest processor's own work, summed)")
    t0 = time.perf_counter()
    try:
        meas = measure(args, rng)
    except (prog.ConvolutionError, prog.BadArgument) as exc:
        print(f"convolution: {exc}", file=sys.stderr)
        return 1
    table = samples(meas, args.transfers)
    try:
        fits = cv.fit_kinds(table, models=MODELS, seed=args.seed)
    except PredictorError as exc:
        print(f"convolution: {exc}", file=sys.stderr)
        return 1
    src = (f"the cases of {args.transfers}" if args.transfers else
           "this run's own transfers (the native copy kernel, p = 2)")
    print(f"\nCalibration ({time.perf_counter() - t0:.0f} s so far; computation "
          f"{'warm' if args.warm else 'cold'}; transfers: {src}). "
          "R^2 = eq. 11 (0 exact, 1 = the mean), MS_E = eq. 10 in us^2, on held-out samples")
    print(f"  {'kind':<11} {'n':>4} {'S1 R^2':>8} {'M1 R^2':>8} {'S1 MS_E':>10} {'M1 MS_E':>10}"
          "   M1 (seconds; n loads+stores or bytes, mlt lines)")
    for kind in cv.KINDS:
        s1, m1 = fits["S1"][kind], fits["M1"][kind]
        print(f"  {kind:<11} {s1.n_train + s1.n_test:>4} {s1.r2:>8.4f} {m1.r2:>8.4f} "
              f"{s1.mse * 1e12:>10.3g} {m1.mse * 1e12:>10.3g}   {m1.model.formula(3)}")

    models = {m: {k: f.model for k, f in fits[m].items()} for m in MODELS}
    rows = []
    for L in args.sizes:
        for b in args.blocks:
            row: dict[str, Any] = {"L": L, "b": b}
            per_round = np.array(meas["times"][("shift", L, b)]) / \
                np.array(meas["times"][("scan", L, b)])
            row["shift_s"] = float(np.median(meas["times"][("shift", L, b)]))
            row["scan_s"] = float(np.median(meas["times"][("scan", L, b)]))
            row["ratio"] = float(np.median(per_round))
            row["ratio_rounds"] = per_round.tolist()
            # The share of rounds that agree with the median's verdict: how firm it is.
            row["agree"] = float(np.mean((per_round > 1) == (row["ratio"] > 1)))
            for m in MODELS:
                sh = cv.predict(cv.shift_program(L, b, args.p), models[m])
                sc = cv.predict(cv.scan_program(L, b, args.p), models[m])
                row[f"{m}_shift_s"], row[f"{m}_scan_s"], row[f"{m}_ratio"] = sh, sc, sh / sc
            rows.append(row)

    print("\nRatio Conv-Shift / Conv-Scan (> 1: Conv-Scan faster); times in ms, measured "
          "(median over rounds) and predicted")
    print(f"  {'L':>5} {'b':>3} {'shift':>8} {'scan':>8} {'ratio':>7} {'firm':>5} "
          f"{'S1 ratio':>9} {'M1 ratio':>9}   {'S1 shift':>8} {'S1 scan':>8} "
          f"{'M1 shift':>8} {'M1 scan':>8}")
    for r in rows:
        print(f"  {r['L']:>5} {r['b']:>3} {r['shift_s'] * 1e3:>8.3f} {r['scan_s'] * 1e3:>8.3f} "
              f"{r['ratio']:>7.3f} {r['agree']:>5.2f} {r['S1_ratio']:>9.3f} "
              f"{r['M1_ratio']:>9.3f}   {r['S1_shift_s'] * 1e3:>8.3f} "
              f"{r['S1_scan_s'] * 1e3:>8.3f} {r['M1_shift_s'] * 1e3:>8.3f} "
              f"{r['M1_scan_s'] * 1e3:>8.3f}")

    print("\nCrossover (smallest b at which Conv-Scan is faster) and choices")
    print(f"  {'L':>5} {'measured':>9} {'S1':>4} {'M1':>4}   {'S1 right':>9} {'M1 right':>9}"
          f"   {'S1 ratio err':>12} {'M1 ratio err':>12}")
    summary = []
    for L in args.sizes:
        sub = [r for r in rows if r["L"] == L]
        bs = [r["b"] for r in sub]
        meas_x = cv.crossover(bs, [r["ratio"] for r in sub])
        line: dict[str, Any] = {"L": L, "measured": meas_x}
        for m in MODELS:
            line[m] = cv.crossover(bs, [r[f"{m}_ratio"] for r in sub])
            line[f"{m}_right"] = sum((r[f"{m}_ratio"] > 1) == (r["ratio"] > 1) for r in sub)
            line[f"{m}_err"] = float(np.median([abs(r[f"{m}_ratio"] / r["ratio"] - 1)
                                                for r in sub]))
        summary.append(line)

        def show(x: int | None) -> str:
            return "-" if x is None else str(x)
        print(f"  {L:>5} {show(meas_x):>9} {show(line['S1']):>4} {show(line['M1']):>4}   "
              f"{line['S1_right']:>5}/{len(sub):<3} {line['M1_right']:>5}/{len(sub):<3}   "
              f"{line['S1_err'] * 100:>11.1f}% {line['M1_err'] * 100:>11.1f}%")
    hit = {m: sum(s[m] == s["measured"] for s in summary) for m in MODELS}
    print(f"\nTarget: crossover predicted at the measured block size: S1 {hit['S1']}/"
          f"{len(summary)} sizes, M1 {hit['M1']}/{len(summary)} sizes "
          f"({time.perf_counter() - t0:.0f} s in all)")
    if args.json:
        out = {"version": 1, "host": host_line(), "p": args.p, "warm": args.warm,
               "sizes": args.sizes,
               "blocks": args.blocks, "rounds": args.rounds, "repeats": args.repeats,
               "transfers": str(args.transfers) if args.transfers else "own",
               "fits": {m: {k: f.to_json() for k, f in fits[m].items()} for m in MODELS},
               "rows": rows, "crossovers": summary,
               "samples": {k: {"n": v[0].tolist(), "mlt": v[1].tolist(),
                               "time_s": v[2].tolist()} for k, v in table.items()}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=args.json.parent, prefix=args.json.name + ".")
        with os.fdopen(fd, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
