"""Row and column transfers between processes: the benchmark of the memory-lines-touched paper.

The paper (section 4.4) times messages of d rows or d columns of a matrix of up to 4000 x 4000
elements, d up to 200, and fits its Table 1 models on 100 of the measurements. On a
shared-memory node a message between two processes is one copy: the receiver reads the
sender's rows or columns out of the shared matrix into its own buffer. Here two pinned
processes own the two halves of an L_R x L_C matrix of 8-byte words, stored row-major (a 1 x 2
mesh for column transfers, 2 x 1 for row transfers), and exchange d columns or rows at once:
each copies its neighbour's boundary (``counterd_copy2d``) into a ghost buffer of its own. Before
every exchange the owner of each message's source flushes its lines from every cache (state
``cold``, the default: every line the message touches comes from memory, the compulsory
misses MLT counts), or stores over its whole block as the computation of a superstep would
(state ``dirty``: the lines are dirty in the owner's cache where they fit, in memory where they
do not). A message's time is the slower process's own copy time (its clock read right before
and after the copy).

Both exchanges of a case move the same n bytes, but their source rows start at different
offsets into a cache line, so they touch different numbers of lines: the case's MLT is the
larger of the two (the slower process sets the time), counted exactly by
:func:`predictor.families.mlt.row_lines` / :func:`predictor.families.mlt.column_lines`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from counterd.data.errors import BadInput
from counterd.machine.views import NodeView
from microbench import results
from microbench.kernels import WORD_BYTES, CopyCall, KernelCall, native_lib, prefault_call
from microbench.plans import WorkerPlan
from microbench.repetition import RunConfig, spread
from microbench.runner import WorkerPool, host_metadata
from predictor.families import mlt

FORMAT = mlt.TRANSFER_FORMAT  # the reader's (predictor.families.mlt.transfers) one name for it
VERSION = mlt.TRANSFER_VERSIONS[-1]
KINDS: tuple[str, ...] = ("rows", "cols")
Kind = Literal["rows", "cols"]
State = Literal["cold", "dirty"]
Dist = Literal["log", "uniform"]
DISTS: tuple[str, ...] = ("log", "uniform")
STATES: tuple[str, ...] = ("cold", "dirty")
MAX_SIDE = 4000  # the paper's largest matrix side
MAX_D = 200  # and its largest number of rows or columns per message
MIN_SIDE = 2
CASES = 300  # per kind: the paper's 100 for training, the rest for testing
# Short supersteps, several repetitions: the median of 5-15 after one warm-up.
CONFIG = RunConfig(warmup=1, min_reps=5, max_reps=15, tolerance=0.10, budget_ns=50_000_000,
                   retries=1)
QUICK_CONFIG = RunConfig(warmup=1, min_reps=3, max_reps=5, tolerance=0.20,
                         budget_ns=20_000_000, retries=0)


@dataclass(frozen=True)
class Case:
    """d rows or columns exchanged between the two halves of an ``matrix_rows`` x
    ``matrix_cols`` matrix; ``b_r`` x ``b_c`` is one process's block."""

    kind: Kind
    matrix_rows: int
    matrix_cols: int
    d: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BadInput(f"transfer kind {self.kind!r}", "use rows or cols")
        if min(self.matrix_rows, self.matrix_cols) < MIN_SIDE:
            raise BadInput(f"a {self.matrix_rows} x {self.matrix_cols} matrix",
                           f"give sides of at least {MIN_SIDE}")
        if not 1 <= self.d <= self.across:
            raise BadInput(f"d = {self.d} {self.kind} of a {self.b_r} x {self.b_c} block",
                           f"give 1 <= d <= {self.across}")

    @property
    def b_r(self) -> int:
        return math.ceil(self.matrix_rows / 2) if self.kind == "rows" else self.matrix_rows

    @property
    def b_c(self) -> int:
        return self.matrix_cols if self.kind == "rows" else math.ceil(self.matrix_cols / 2)

    @property
    def across(self) -> int:
        """How many rows (or columns) a block has to send."""
        return self.b_r if self.kind == "rows" else self.b_c

    @property
    def words(self) -> int:
        """Words per message."""
        return self.d * (self.b_c if self.kind == "rows" else self.b_r)

    @property
    def n_bytes(self) -> int:
        return self.words * WORD_BYTES

    @property
    def mnemonic(self) -> str:
        return f"{self.kind}.{self.matrix_rows}x{self.matrix_cols}.d{self.d}"


def sample(count: int, kind: Kind, *, seed: int = 0, max_side: int = MAX_SIDE,
           max_d: int = MAX_D, d_dist: Dist = "log") -> tuple[Case, ...]:
    """``count`` cases in the paper's ranges (section 4.4: "matrix sizes between 1 x 1 and
    4000 x 4000", d "between 1 and 200"): matrix sides uniform in [2, max_side]; d in
    [1, min(max_d, what a block has)], log-uniform (the default) or uniform.

    The paper does not say how d was drawn. Log-uniform puts half the messages at d <= 14,
    where a column message's lines and bytes are far from proportional (d = 1: a line per
    8-byte element); uniform puts 96% at d >= 8, where MLT is about n / line + b_r, nearly
    proportional to n, so no data could tell the two models apart. The paper's own figures
    are of d = 1, 2 and 5 ("d = 1 represents the most common type of communication")."""
    if count < 1 or max_side < MIN_SIDE or max_d < 1:
        raise BadInput(f"{count} cases, sides up to {max_side}, d up to {max_d}",
                       f"give at least one case, sides >= {MIN_SIDE} and d >= 1")
    if d_dist not in DISTS:
        raise BadInput(f"d distribution {d_dist!r}", "choose " + " or ".join(DISTS))
    rng = np.random.default_rng([seed, KINDS.index(kind)])
    out = []
    for _ in range(count):
        r, c = (int(x) for x in rng.integers(MIN_SIDE, max_side + 1, size=2))
        top = min(max_d, Case(kind, r, c, 1).across)
        if d_dist == "log":
            d = int(math.floor(math.exp(rng.uniform(0.0, math.log(top + 1)))))
        else:
            d = int(rng.integers(1, top + 1))
        out.append(Case(kind, r, c, max(1, min(top, d))))
    return tuple(out)


def interleave(*groups: Sequence[Case]) -> tuple[Case, ...]:
    """Cases of several groups in alternation, so a drift of the host's speed over the run
    falls on every group alike."""
    out: list[Case] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return tuple(out)


# -- layout and plans --------------------------------------------------------------------------

def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


@dataclass(frozen=True)
class Layout:
    """Byte offsets in the shared region: the two blocks, then the two ghost buffers, each
    page-aligned."""

    blocks: tuple[int, int]
    ghosts: tuple[int, int]
    end: int


def layout(case: Case, page_bytes: int) -> Layout:
    block = _round_up(case.b_r * case.b_c * WORD_BYTES, page_bytes)
    ghost = _round_up(case.n_bytes, page_bytes)
    return Layout((0, block), (2 * block, 2 * block + ghost), 2 * block + 2 * ghost)


def messages(case: Case, page_bytes: int) -> tuple[CopyCall, CopyCall]:
    """What each process copies: process 0 receives its neighbour's first d rows (or
    columns), process 1 its neighbour's last d."""
    lay = layout(case, page_bytes)
    b_r, b_c, d = case.b_r, case.b_c, case.d
    if case.kind == "rows":
        first = CopyCall(lay.ghosts[0], b_c, lay.blocks[1], b_c, d, b_c)
        last_src = lay.blocks[0] + (b_r - d) * b_c * WORD_BYTES
        return first, CopyCall(lay.ghosts[1], b_c, last_src, b_c, d, b_c)
    first = CopyCall(lay.ghosts[0], d, lay.blocks[1], b_c, b_r, d)
    last_src = lay.blocks[0] + (b_c - d) * WORD_BYTES
    return first, CopyCall(lay.ghosts[1], d, last_src, b_c, b_r, d)


def lines_touched(case: Case, line_bytes: int, page_bytes: int) -> tuple[int, int]:
    """Exact memory lines of the source each process's message touches."""
    per_line = line_bytes // WORD_BYTES
    out = []
    for call in messages(case, page_bytes):
        # Blocks are page-aligned, so a source's position in its line is its offset in words
        # from the block start, modulo the line.
        offset = (call.src_offset // WORD_BYTES) % per_line
        count = mlt.row_lines if case.kind == "rows" else mlt.column_lines
        out.append(count(case.b_r, case.b_c, per_line, case.d, offset))
    return out[0], out[1]


def flushes(call: CopyCall, line_bytes: int) -> tuple[KernelCall, ...]:
    """Flush calls that write back and invalidate, in every cache, each line the copy reads.
    A row's words are flushed a line apart and at its last word, so every line it touches
    gets a flush whatever its alignment: one strided flush down the rows per such word."""
    per_line = line_bytes // WORD_BYTES
    if call.rows == 1 or call.src_pitch == call.cols:  # contiguous
        first = call.src_offset - call.src_offset % line_bytes
        end = call.src_offset + call.words * WORD_BYTES
        return (KernelCall("flush", first, -(-(end - first) // line_bytes), per_line),)
    words = sorted({*range(0, call.cols, per_line), call.cols - 1})
    return tuple(KernelCall("flush", call.src_offset + j * WORD_BYTES, call.rows, call.src_pitch)
                 for j in words)


def plans(case: Case, page_bytes: int, line_bytes: int, state: State = "cold"
          ) -> tuple[WorkerPlan, WorkerPlan]:
    """Each process's plan: before every exchange, the owner of each message's source either
    flushes its lines (``cold``) or stores over its whole block as a computation would
    (``dirty``)."""
    lay = layout(case, page_bytes)
    block_words = case.b_r * case.b_c
    calls = messages(case, page_bytes)
    out = []
    for rank, call in enumerate(calls):
        prefault = (prefault_call(lay.blocks[rank], block_words * WORD_BYTES, page_bytes),
                    prefault_call(lay.ghosts[rank], case.n_bytes, page_bytes))
        before: tuple[KernelCall, ...]
        if state == "dirty":
            before = (KernelCall("store", lay.blocks[rank], block_words, 1),)
        else:  # the message the neighbour reads from this block
            before = flushes(calls[1 - rank], line_bytes)
        out.append(WorkerPlan(rank, True, prefault, (before,), call))
    return out[0], out[1]


# -- running -----------------------------------------------------------------------------------

Progress = Callable[[int, int, str], None]


def no_progress(done: int, total: int, mnemonic: str) -> None:
    """The default: library code does not print."""


PASSES = 3  # rounds over every case, each in its own random order


def measure(machine: NodeView, cases: Sequence[Case], out: str | Path, *,
            cfg: RunConfig = CONFIG, state: State = "cold", passes: int = PASSES,
            order_seed: int | None = None, progress: Progress = no_progress,
            config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Time every case on two pinned processes and write the results document to ``out``.

    A case's repetitions follow each other within milliseconds, but this kind of host's
    memory speed drifts over seconds: the same case measured twice a few seconds apart
    differed by -40% / +25% (10th / 90th percentile over 300 cases). So every case is timed
    in ``passes`` rounds over all cases, each round in a fresh random order, and its time is
    the median of its rounds' medians (the orders are drawn from ``order_seed``, fresh by
    default). The document is rewritten after every round, so an interrupted run keeps the
    rounds it finished."""
    if machine.max_procs < 2:
        raise BadInput(f"{machine.max_procs} CPU available; a transfer needs two processes",
                       "run on a host with two or more CPUs")
    if passes < 1 or not cases:
        raise BadInput(f"{len(cases)} cases in {passes} passes", "give cases and passes >= 1")
    native_lib("counterd_copy2d")
    page, line = machine.page_bytes, machine.geometry.levels[0].line_bytes
    region = max(layout(c, page).end for c in cases)
    doc: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "created": results.now_iso(),
        "complete": False, "host": host_metadata(machine.cpus[:2]),
        **machine.to_json(), "line_bytes": line, "element_bytes": WORD_BYTES,
        "state": state, "passes": passes, "config": {**asdict(cfg), **(config or {})},
        "notes": ["times measured: per case the median over passes of each pass's median "
                  "copy time of the slower process; MLT counted exactly from the layout "
                  "(source lines of the slower of the two messages)"],
        "cases": []}
    rng = np.random.default_rng(order_seed)
    timings: list[list[Any]] = [[] for _ in cases]
    t0 = time.monotonic()
    done, total = 0, passes * len(cases)
    with WorkerPool(machine, [], cfg, region=(region, 2)) as pool:
        for _ in range(passes):
            for i in rng.permutation(len(cases)):
                case = cases[i]
                progress(done, total, case.mnemonic)
                timings[i].append(_settled(pool, plans(case, page, line, state),
                                           case.mnemonic, cfg))
                done += 1
            doc["cases"] = [_record(c, ts, line, page, cfg.unstable_spread)
                            for c, ts in zip(cases, timings, strict=True) if ts]
            results.write(out, doc)
    doc["complete"] = True
    doc["elapsed_s"] = round(time.monotonic() - t0, 1)
    results.write(out, doc)
    progress(total, total, "")
    return doc


def _settled(pool: WorkerPool, work: Sequence[WorkerPlan], name: str, cfg: RunConfig) -> Any:
    """The run, retried up to ``cfg.retries`` times while flagged (as
    :meth:`WorkerPool.run_settled` does for patterns): the least flagged attempt."""
    best = pool.run_plans(name, 2, work, cfg)
    for _ in range(cfg.retries):
        if not best.flags:
            break
        t = pool.run_plans(name, 2, work, cfg)
        if len(t.flags) < len(best.flags):
            best = t
    return best


def _record(case: Case, timings: Sequence[Any], line: int, page: int,
            unstable_spread: float = CONFIG.unstable_spread) -> dict[str, Any]:
    # Each process's own copy time, the slower of the two per repetition: the superstep time
    # (max end - min begin) would add the barrier's release skew, 50-100 us on this kind of
    # VM, to messages that take a microsecond.
    per_pass = [t.per_proc_ns.max(axis=1) for t in timings]
    medians = [float(np.median(s)) for s in per_pass]
    lines = lines_touched(case, line, page)
    unstable = any(spread(s) > unstable_spread for s in per_pass)
    flags = sorted({f for t in timings for f in t.flags if f != "unstable"}
                   | ({"unstable"} if unstable else set()))
    return {"kind": case.kind, "matrix_rows": case.matrix_rows,
            "matrix_cols": case.matrix_cols, "b_r": case.b_r, "b_c": case.b_c, "d": case.d,
            "n_bytes": case.n_bytes, "mlt": max(lines), "mlt_per_process": list(lines),
            "time_s": float(np.median(medians)) / 1e9,
            "pass_times_s": [m / 1e9 for m in medians],
            "spread": max(spread(s) for s in per_pass),
            # "unstable" is the runner's verdict on superstep times; here the copy times decide
            "flags": flags}


def load(path: str | Path) -> dict[str, Any]:
    """A transfer results document, checked; BadInput naming what is wrong."""
    doc = results.read_json(path, "microbench transfer")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BadInput(f"{path} is not a transfer results file",
                       "give the file microbench transfer --out wrote")
    return doc


__all__ = ["CASES", "CONFIG", "Case", "FORMAT", "KINDS", "Layout", "QUICK_CONFIG",
           "interleave", "layout", "lines_touched", "load", "measure", "messages", "plans",
           "sample"]
