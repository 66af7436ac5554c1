"""Conv-Shift or Conv-Scan: which is faster, and where the crossover lies, predicted by the
standard model (S1) and the memory-lines-touched model (M1), against measured times.

I. Hur and C. Lin, "Incorporating Cache Effects into a Model of Interprocessor Communication",
section 7 (Figures 14-17): two programs computing the same uniform convolution of an L x L
image with block b (examples/convolution.py); the ratio of Conv-Shift time over Conv-Scan time
per (b, L), measured and predicted; the crossover is the smallest b at which Conv-Scan is
faster. Here, on this host, with a 1 x p mesh of worker processes (p = 2):

1. Calibration (no program run): every operation kind the programs use (copy, fill, add,
   addcol, cumsum_row, cumsum_col, bzyx: the numpy calls themselves, over random shapes,
   pitches and offsets, run by every processor at once), each shape timed twice: cold (each
   run after reading 32 MiB per processor, so every line the operation touches comes from
   memory) and warm (the same data left cached from the run before). Transfers (d rows or
   columns of a b_r x b_c matrix) come from ``microbench transfer --out`` files given with
   ``--transfers`` (a file's "state": cold, the source lines flushed to memory, is the cold
   model; dirty, the owner's block just written, the warm one), else from this run's own
   transfers of the native copy kernel (the matrix just written by the other processor: warm;
   used for both states when no file gives the cold one).
   Each kind and state gets the paper's Table 1 models S1 (alpha + beta n) and M1 (alpha +
   beta n + gamma MLT), fitted by predictor.families.mlt.fit_table1; R^2 (eq. 11) and MS_E (eq. 10)
   on
   samples kept out of the fit.
2. Measurement: both programs at every (b, L), ``--repeats`` timed runs each after a warm-up,
   in ``--rounds`` launches; in each launch the programs and a share of the calibration run in a
   fresh random order, so a slow spell of the host falls on calibration and measurement alike.
   Then ``--extra-rounds`` more launches of the block sizes near each L's crossover (within one
   of the median crossover, and every block size whose verdict is not firm). A run's time is the
   BSP one (per superstep the slowest processor's own work, summed); per launch the median over
   repeats, and the two programs' medians of one launch make a repetition pair. The measured
   ratio is the median over pairs; the measured crossover is given as a range
   (:func:`predictor.families.convolution_predict.crossover_range`): from the smallest block size at
   which more than 20 % of the pairs find Conv-Scan faster, to the smallest from which on at
   least 80 % do.
3. Prediction: per program, from predictor.families.convolution's operation accounting (n, MLT and
   the
   regions of every operation from L, b and the layout), the sum over supersteps of the slowest
   processor's summed operation predictions, with the S1 fits and with the M1 fits. Each
   operation is predicted with its kind's warm model when its reuse distance fits the cache
   level of ``--cache-level`` (predictor.families.convolution_predict.cache_rule on the machine
   description:
   counterd.machine), cold otherwise. The table also shows the all-cold prediction and the
   other level's rule.

    .venv/bin/python bench/convolution.py [--quick] [--sizes 200,400,700,1000] [--blocks 1-10]
        [--rounds 7] [--extra-rounds 24] [--repeats 5] [--transfers FILE ...]
        [--cache-level 2] [--json OUT]

Target (issue 12): the convolution crossover predicted at the measured block size, read as:
the predicted crossover lies within the measured crossover's range.
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

from bench._host import guarded, host_line  # noqa: E402
from counterd import machine  # noqa: E402
from predictor.errors import BadInput, PredictorError  # noqa: E402
from predictor.families import convolution as cv  # noqa: E402
from predictor.families import convolution_predict as cvp  # noqa: E402

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


TRANSFER_STATES = {"cold": "cold", "dirty": "warm"}  # a microbench file's state: our state


def load_transfers(path: Path) -> tuple[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(our state, (n, MLT, seconds)) of the cases of a ``microbench transfer --out`` file.
    MLT is the file's exact count (its source rows at their real pitch and offset, the slower
    process's); n is recounted (:func:`predictor.families.convolution.transfer_case`) as a check
    that
    the file's elements are the programs' 8-byte words. :class:`ValueError` says what is
    wrong with the file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it ({exc}): give a file written by "
                         "`microbench transfer --out`") from exc
    if data.get("format") != "microbench-transfer" or data.get("version") != 1:
        raise ValueError(f"{path}: format {data.get('format')!r} version "
                         f"{data.get('version')!r}, not microbench-transfer 1: rerun "
                         "`microbench transfer --out`")
    state = TRANSFER_STATES.get(str(data.get("state")))
    if state is None:
        raise ValueError(f"{path}: state {data.get('state')!r}: use a file of state "
                         + " or ".join(TRANSFER_STATES))
    rows = []
    for c in data["cases"]:
        op = cv.transfer_case(c["kind"], int(c["b_r"]), int(c["b_c"]), int(c["d"]))
        if int(c["n_bytes"]) != op.n:
            raise ValueError(f"{path}: case {c.get('kind')} {c.get('b_r')}x{c.get('b_c')} "
                             f"d {c.get('d')} has n_bytes {c['n_bytes']}, expected {op.n} "
                             "(8-byte elements)")
        rows.append((op.n, int(c["mlt"]), float(c["time_s"])))
    if not rows:
        raise ValueError(f"{path}: no cases: rerun `microbench transfer --out`")
    a = np.array(rows, dtype=float)
    return state, (a[:, 0], a[:, 1], a[:, 2])


# -- measurement -------------------------------------------------------------------------------

Key = tuple[str, int, int]


def _launch(args: argparse.Namespace, rng: np.random.Generator, configs: Sequence[Key],
            calib: Sequence[Any], check: bool, times: dict[Key, list[float]],
            calib_t: dict[int, float]) -> None:
    """One launch: the programs of ``configs`` and the calibration jobs ``calib`` (their
    indices as keys of ``calib_t``) in a fresh random order."""
    jobs: list[Any] = [prog.ProgramJob(n, L, b, args.repeats, check=check)
                       for n, L, b in configs]
    jobs += list(calib)
    index = {id(job): i for i, job in enumerate(calib)}
    perm = rng.permutation(len(jobs))
    jobs = [jobs[i] for i in perm]
    res = prog.run_jobs(jobs, args.p, markers=False)
    for job, t in zip(jobs, res, strict=True):
        if isinstance(job, prog.ProgramJob):
            times[(job.name, job.size, job.block)].append(
                float(np.median(t.max(axis=2).sum(axis=1))) / 1e9)
        else:
            calib_t[index[id(job)]] = float(np.median(t.max(axis=2)[:, 0])) / 1e9


def near_crossover(blocks: Sequence[int], pairs: dict[int, np.ndarray]) -> list[int]:
    """The block sizes to measure again: within one of the crossover of the median ratios
    (the largest block size when Conv-Scan is never faster), and every block size whose
    verdict is not firm (fewer than :data:`predictor.families.convolution_predict.FIRM` of its pairs
    agree)."""
    x = cvp.crossover(blocks, [float(np.median(pairs[b])) for b in blocks])
    centre = blocks[-1] if x is None else x
    out = {b for b in blocks if abs(b - centre) <= 1}
    for b in blocks:
        share = float(np.mean(pairs[b] > 1))
        if max(share, 1 - share) < cvp.FIRM:
            out.add(b)
    return sorted(out)


def measure(args: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    """Run every round and the extra rounds; return the calibration samples and the per-round
    program times."""
    shapes = compute_shapes(rng, args.per_kind, max(args.sizes) + 100)
    xfers = transfer_cases(rng, args.transfer_cases, max(args.sizes) + 100) \
        if args.own_transfers else []
    calib: list[Any] = [prog.OpJob(s, args.calib_repeats, cold)
                        for cold in (True, False) for s in shapes]
    calib += [prog.TransferJob(k, r, c, d, args.calib_repeats) for k, r, c, d in xfers]
    shares = np.array_split(rng.permutation(len(calib)), args.rounds)
    configs = [(n, L, b) for L in args.sizes for b in args.blocks for n in cv.PROGRAMS]
    times: dict[Key, list[float]] = {c: [] for c in configs}
    calib_t: dict[int, float] = {}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        got: dict[int, float] = {}
        _launch(args, rng, configs, [calib[i] for i in shares[r]], r == 0, times, got)
        calib_t.update({int(shares[r][i]): v for i, v in got.items()})
        log(f"  round {r + 1}/{args.rounds} ({time.perf_counter() - t0:.0f} s)")
    near: dict[int, list[int]] = {}
    for L in args.sizes:
        pairs = {b: np.array(times[("shift", L, b)]) / np.array(times[("scan", L, b)])
                 for b in args.blocks}
        near[L] = near_crossover(args.blocks, pairs)
    extra = [(n, L, b) for L in args.sizes for b in near[L] for n in cv.PROGRAMS]
    for r in range(args.extra_rounds):
        _launch(args, rng, extra, [], False, times, {})
        if (r + 1) % 6 == 0 or r + 1 == args.extra_rounds:
            log(f"  extra round {r + 1}/{args.extra_rounds} near the crossovers "
                f"({time.perf_counter() - t0:.0f} s)")
    return {"shapes": shapes, "xfers": xfers, "calib": calib_t, "times": times,
            "configs": configs, "near": near}


def samples(meas: dict[str, Any], files: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
            ) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Per state (cold, warm), per kind: (n, MLT, seconds)."""
    shapes: list[cv.Shape] = meas["shapes"]
    out: dict[str, dict[str, list[tuple[int, int, float]]]] = {"cold": {}, "warm": {}}
    for k, state in enumerate(("cold", "warm")):
        for i, s in enumerate(shapes):
            op = cv.calibration_op(s)
            out[state].setdefault(s.kind, []).append(
                (op.n, op.mlt, meas["calib"][k * len(shapes) + i]))
    for j, (kind, r, c, d) in enumerate(meas["xfers"]):
        op = cv.transfer_case(kind, r, c, d)
        t = meas["calib"][2 * len(shapes) + j]
        for state in ("cold", "warm"):
            out[state].setdefault(cv.TRANSFER, []).append((op.n, op.mlt, t))
    table: dict[str, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for state, kinds in out.items():
        table[state] = {}
        for kind, rows in kinds.items():
            a = np.array(rows, dtype=float)
            table[state][kind] = (a[:, 0], a[:, 1], a[:, 2])
        if state in files:
            table[state][cv.TRANSFER] = files[state]
    return table


# -- report ------------------------------------------------------------------------------------

def _ints(text: str, what: str) -> list[int]:
    """``1-10`` or ``1,2,5``: positive integers in increasing order, else BadInput."""
    try:
        if "-" in text:
            a, b = text.split("-")
            out = list(range(int(a), int(b) + 1))
        else:
            out = [int(x) for x in text.split(",")]
    except ValueError:
        raise BadInput(f"{what} {text!r}", "write e.g. 1-10 or 200,400") from None
    if not out or min(out) < 1 or out != sorted(set(out)):
        raise BadInput(f"{what} {text!r}", "give positive values in increasing order")
    return out


def _show(x: int | None) -> str:
    return "-" if x is None else str(x)


def _range(lo: int | None, hi: int | None, top: int) -> str:
    if lo is None:
        return f">{top}"
    if hi is None:
        return f"{lo}-(>{top})"
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _within(x: int | None, lo: int | None, hi: int | None) -> bool:
    """A predicted crossover inside a measured range (None: beyond the largest block)."""
    if lo is None:
        return x is None
    if x is None:
        return hi is None
    return lo <= x and (hi is None or x <= hi)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run (about a minute)")
    ap.add_argument("--sizes", default=None, help="image sizes L (default 200,400,700,1000)")
    ap.add_argument("--blocks", default="1-10", help="block sizes b (default 1-10)")
    ap.add_argument("--rounds", type=int, default=None, help="launches (default 7)")
    ap.add_argument("--extra-rounds", type=int, default=None,
                    help="launches of the block sizes near the crossovers (default 24)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per launch")
    ap.add_argument("--per-kind", type=int, default=None,
                    help="calibration shapes per computation kind (default 60)")
    ap.add_argument("--transfer-cases", type=int, default=None,
                    help="own calibration transfers (default 200; 100 train, as the paper)")
    ap.add_argument("--calib-repeats", type=int, default=3)
    ap.add_argument("--transfers", type=Path, action="append", default=[],
                    help="a `microbench transfer --out` file (state cold: the cold transfer "
                    "model; dirty: the warm one); may be given twice")
    ap.add_argument("--cache-level", default="2",
                    help="the cache level whose capacity decides warm or cold: a level "
                    "number or 'last' (default 2, the per-core L2)")
    ap.add_argument("-p", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write everything here")
    args = ap.parse_args(argv)
    args.sizes = _ints(args.sizes or ("200,400" if args.quick else "200,400,700,1000"),
                       "--sizes")
    args.blocks = _ints(args.blocks, "--blocks")
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.extra_rounds = args.extra_rounds if args.extra_rounds is not None else \
        (4 if args.quick else 24)
    args.per_kind = args.per_kind or (24 if args.quick else 60)
    args.transfer_cases = args.transfer_cases or (120 if args.quick else 200)
    if args.quick:
        args.repeats = min(args.repeats, 3)
    try:
        files: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        named: dict[str, Path] = {}
        for path in args.transfers:
            state, data = load_transfers(path)
            if state in files:
                raise ValueError(f"{path} and {named[state]} are both {state} transfer files: "
                                 "give one per state")
            files[state], named[state] = data, path
        levels = machine.current().levels
        level = None if args.cache_level == "last" else int(args.cache_level)
        rule = cvp.cache_rule(levels, args.p, level)
        last = cvp.cache_rule(levels, args.p, None)
        other = last if rule.level != last.level else cvp.cache_rule(levels, args.p, 2)
    except (ValueError, PredictorError) as exc:
        print(f"convolution: {exc}", file=sys.stderr)
        return 2
    args.own_transfers = len(files) < 2
    rng = np.random.default_rng(args.seed)

    print(host_line())
    print(f"Conv-Shift vs Conv-Scan on a 1 x {args.p} mesh: L in {args.sizes}, b in "
          f"{args.blocks[0]}..{args.blocks[-1]}, {args.rounds} rounds x {args.repeats} runs "
          f"+ {args.extra_rounds} rounds near each crossover, BSP time (per superstep the "
          "slowest processor's own work, summed)")
    t0 = time.perf_counter()
    try:
        meas = measure(args, rng)
    except (prog.ConvolutionError, prog.BadArgument) as exc:
        print(f"convolution: {exc}", file=sys.stderr)
        return 1
    table = samples(meas, files)
    try:
        fits = {state: cvp.fit_kinds(table[state], models=MODELS, seed=args.seed)
                for state in ("cold", "warm")}
    except PredictorError as exc:
        print(f"convolution: {exc}", file=sys.stderr)
        return 1
    own = "this run's own transfers (the native copy kernel, p = 2, source just written: warm)"
    src = {state: (f"{named[state]} (microbench transfer, state "
                   f"{'cold' if state == 'cold' else 'dirty'})" if state in named else own)
           for state in ("cold", "warm")}
    print(f"\nCalibration ({time.perf_counter() - t0:.0f} s so far). Computation: every shape "
          "cold (after a 32 MiB read per processor) and warm (data left cached).")
    print(f"  Transfers, cold model: {src['cold']}")
    print(f"  Transfers, warm model: {src['warm']}")
    print("  R^2 = eq. 11 (0 exact, 1 = the mean), MS_E = eq. 10 in us^2, on held-out samples")
    print(f"  {'kind':<11} {'state':<5} {'n':>4} {'S1 R^2':>8} {'M1 R^2':>8} {'S1 MS_E':>10} "
          f"{'M1 MS_E':>10}   M1 (seconds; n loads+stores or bytes, mlt lines)")
    for kind in cv.KINDS:
        for state in ("cold", "warm"):
            s1, m1 = fits[state]["S1"][kind], fits[state]["M1"][kind]
            print(f"  {kind:<11} {state:<5} {s1.n_train + s1.n_test:>4} {s1.r2:>8.4f} "
                  f"{m1.r2:>8.4f} {s1.mse * 1e12:>10.3g} {m1.mse * 1e12:>10.3g}   "
                  f"{m1.model.formula(3)}")

    models = {state: {m: {k: f.model for k, f in fits[state][m].items()} for m in MODELS}
              for state in ("cold", "warm")}
    variants = {"rule": rule, "cold": None, "other": other}
    rows = []
    for L in args.sizes:
        for b in args.blocks:
            row: dict[str, Any] = {"L": L, "b": b}
            sh_t = np.array(meas["times"][("shift", L, b)])
            sc_t = np.array(meas["times"][("scan", L, b)])
            pairs = sh_t / sc_t
            row["shift_s"], row["scan_s"] = float(np.median(sh_t)), float(np.median(sc_t))
            row["ratio"] = float(np.median(pairs))
            row["pairs"] = pairs.tolist()
            row["scan_faster"] = float(np.mean(pairs > 1))
            steps = {n: cv.program(n, L, b, args.p) for n in cv.PROGRAMS}
            row["warm_share"] = {}
            for v, rl in variants.items():
                if rl is not None:
                    flags = [x for n in cv.PROGRAMS for st in cvp.warm_ops(steps[n], rl)
                             for ops in st for x in ops]
                    row["warm_share"][v] = float(np.mean(flags))
                for m in MODELS:
                    kw: dict[str, Any] = {} if rl is None else \
                        {"warm_models": models["warm"][m], "rule": rl}
                    sh = cvp.predict(steps["shift"], models["cold"][m], **kw)
                    sc = cvp.predict(steps["scan"], models["cold"][m], **kw)
                    row[f"{v}_{m}_shift_s"], row[f"{v}_{m}_scan_s"] = sh, sc
                    row[f"{v}_{m}_ratio"] = sh / sc
            rows.append(row)

    print(f"\nRatio Conv-Shift / Conv-Scan (> 1: Conv-Scan faster); times in ms, measured "
          f"(median over pairs) and predicted with warm/cold by the {rule.describe()} rule; "
          "pairs: repetition pairs; scan%: the share in which Conv-Scan is faster; warm: the "
          "share of operations predicted warm")
    print(f"  {'L':>5} {'b':>3} {'shift':>8} {'scan':>8} {'ratio':>7} {'pairs':>5} "
          f"{'scan%':>5} {'warm':>5} {'S1 ratio':>9} {'M1 ratio':>9}   {'M1 shift':>8} "
          f"{'M1 scan':>8}  {'cold M1':>8}")
    for r in rows:
        print(f"  {r['L']:>5} {r['b']:>3} {r['shift_s'] * 1e3:>8.3f} {r['scan_s'] * 1e3:>8.3f} "
              f"{r['ratio']:>7.3f} {len(r['pairs']):>5} {r['scan_faster'] * 100:>4.0f}% "
              f"{r['warm_share']['rule']:>5.2f} {r['rule_S1_ratio']:>9.3f} "
              f"{r['rule_M1_ratio']:>9.3f}   {r['rule_M1_shift_s'] * 1e3:>8.3f} "
              f"{r['rule_M1_scan_s'] * 1e3:>8.3f}  {r['cold_M1_ratio']:>8.3f}")

    top = args.blocks[-1]
    print("\nCrossover: the smallest b at which Conv-Scan is faster. Measured: the median "
          "ratios' crossover and its range, from the smallest b at which more than 20 % of "
          "the repetition pairs find Conv-Scan faster to the smallest b from which on at "
          "least 80 % do (fewer than 80 % of the pairs agree inside it). Predicted: S1 and "
          f"M1 with warm/cold by the {rule.describe()} rule (the headline), all cold, and by "
          f"the {other.describe()} rule. ok: inside the measured range.")
    print(f"  {'L':>5} {'measured':>8} {'range':>8}   {'S1':>3} {'M1':>3} {'ok':>5}   "
          f"{'cold S1':>7} {'M1':>3} {'ok':>5}   {'L' + str(other.level) + ' S1':>7} "
          f"{'M1':>3} {'ok':>5}   {'M1 ratio err':>12}")
    summary = []
    for L in args.sizes:
        sub = [r for r in rows if r["L"] == L]
        bs = [r["b"] for r in sub]
        point = cvp.crossover(bs, [r["ratio"] for r in sub])
        lo, hi = cvp.crossover_range(bs, [r["scan_faster"] for r in sub])
        line: dict[str, Any] = {"L": L, "measured": point, "range": [lo, hi],
                                "near": meas["near"][L]}
        cells = []
        for v in variants:
            oks = []
            for m in MODELS:
                x = cvp.crossover(bs, [r[f"{v}_{m}_ratio"] for r in sub])
                line[f"{v}_{m}"], line[f"{v}_{m}_ok"] = x, _within(x, lo, hi)
                oks.append("y" if line[f"{v}_{m}_ok"] else "n")
            cells.append(f"{_show(line[f'{v}_S1']):>3} {_show(line[f'{v}_M1']):>3} "
                         f"{'/'.join(oks):>5}")
        line["M1_err"] = float(np.median([abs(r["rule_M1_ratio"] / r["ratio"] - 1)
                                          for r in sub]))
        summary.append(line)
        print(f"  {L:>5} {_show(point):>8} {_range(lo, hi, top):>8}   {cells[0]}   "
              f"{'':>4}{cells[1]}   {'':>4}{cells[2]}   {line['M1_err'] * 100:>11.1f}%")
    hit = {f"{v}_{m}": sum(s[f"{v}_{m}_ok"] for s in summary) for v in variants
           for m in MODELS}
    n = len(summary)
    print(f"\nTarget: the predicted crossover lies within the measured range: "
          f"{rule.describe()} rule S1 {hit['rule_S1']}/{n}, M1 {hit['rule_M1']}/{n} sizes "
          f"(all cold S1 {hit['cold_S1']}/{n}, M1 {hit['cold_M1']}/{n}; "
          f"L{other.level} rule S1 {hit['other_S1']}/{n}, M1 {hit['other_M1']}/{n}) "
          f"({time.perf_counter() - t0:.0f} s in all)")
    if args.json:
        out = {"version": 2, "host": host_line(), "p": args.p, "sizes": args.sizes,
               "blocks": args.blocks, "rounds": args.rounds, "extra_rounds": args.extra_rounds,
               "repeats": args.repeats, "firm": cvp.FIRM,
               "rule": {"level": rule.level, "size_bytes": rule.size_bytes,
                        "sharing": rule.sharing},
               "other_rule": {"level": other.level, "size_bytes": other.size_bytes,
                              "sharing": other.sharing},
               "transfers": {state: str(named.get(state, "own")) for state in ("cold", "warm")},
               "fits": {state: {m: {k: f.to_json() for k, f in fits[state][m].items()}
                                for m in MODELS} for state in fits},
               "rows": rows, "crossovers": summary,
               "samples": {state: {k: {"n": v[0].tolist(), "mlt": v[1].tolist(),
                                       "time_s": v[2].tolist()} for k, v in kinds.items()}
                           for state, kinds in table.items()}}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=args.json.parent, prefix=args.json.name + ".")
        with os.fdopen(fd, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
