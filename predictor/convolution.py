"""The uniform convolution of the memory-lines-touched paper, as operations with known costs.

I. Hur and C. Lin, "Incorporating Cache Effects into a Model of Interprocessor Communication"
(section 7) compare two programs that compute the same uniform convolution of an L x L image
with block b (out[i, j] = the sum of image[i-b+1..i, j-b+1..j], values outside the image 0):
Conv-Shift (its Figure 19: 2(b-1) shift-and-add operations) and Conv-Scan (its Figure 18: two
prefix sums and out = B - Z - Y + X, its Figure 13). The paper predicts each program's time as
the sum of its operations' costs, communication with its Table 1 models (S1: alpha + beta n,
M1: alpha + beta n + gamma MLT, n bytes sent, MLT memory lines touched) and computation with
section 7.1's t_comp = delta p + t_memory, t_memory the same models with n the loads and
stores. Its Figures 14-17 plot the measured and predicted ratio of Conv-Shift time over
Conv-Scan time per (b, L); the crossover is the block size from which Conv-Scan is faster.

This module is the accounting half of that experiment, pure and host-independent:

* :func:`layout`: where the programs of ``examples/convolution.py`` keep their arrays (the
  program reads its offsets from here, so counts and program agree by construction).
* :func:`shift_program`, :func:`scan_program`: each program as supersteps; per processor the
  operations it runs, each with its kind, n and MLT counted exactly from the layout
  (:func:`predictor.mlt.column_lines`: distinct 64 B lines, 8 float64 per line).
* :func:`calibration_op`, :func:`transfer_op`: the same accounting for the calibration shapes.
* :func:`fit_kinds`, :func:`predict`: one Table 1 model per operation kind, fitted with
  :func:`predictor.mlt.fit_table1`; a program's time is the sum over supersteps of the slowest
  processor's summed operation times (the BSP cost).
* :func:`reuse_lines`, :func:`cache_rule`, :func:`warm_ops`: which operations find their data
  cached (below).
* :func:`crossover`: the smallest block size at which Conv-Scan is faster;
  :func:`crossover_range`: the measured one with its uncertainty.

Cache state (the paper's section 3.1: MLT stands for compulsory and capacity misses; here the
two are told apart explicitly). Every kind is calibrated twice, cold (its lines come from
memory) and warm (its data left cached), and each operation of a program is predicted with one
of the two models by this rule, decided from the machine description and the accounting alone:

* its reuse distance (:func:`reuse_lines`) is, per region it touches, the distinct lines its
  processor touched since that region's data was last touched (the program run back to back,
  as the bench times it), counted exactly from :attr:`Op.regions`; the operation's is its
  regions' largest (its data is cached only if all of it is);
* it is warm when ``sharing x distance x 64 B <= size`` of the deciding cache level
  (:func:`cache_rule`: a :class:`counterd.machine.geometry.CacheLevel`, ``sharing`` the program's
  processors its ``shared_cpus`` covers: 1 for a per-core L2, p for a shared L3), cold
  otherwise (a capacity miss on every line, as after the calibration's eviction).

In Conv-Shift's loop the distance is three arrays' shares (acc, T_{k-1}, T_k: 3 L^2 / 2 words
per processor on 1 x 2). The bench uses the per-core L2 by default and reports the last
level's rule beside it (bench/convolution.py).

Within one operation kind the arithmetic count p is a fixed multiple of n (an add does one
operation per three loads and stores), so section 7.1's delta p folds into beta n: the models
are fitted per kind on (n, MLT) alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike

from counterd.machine.geometry import CacheLevel
from predictor import mlt as ml
from predictor.errors import BadInput

WORD_BYTES = 8  # float64
LINE_BYTES = 64
LINE = LINE_BYTES // WORD_BYTES  # elements per memory line
PAGE_WORDS = 4096 // WORD_BYTES  # every array starts on a page, so on a line

PROGRAMS = ("shift", "scan")
TRANSFER = "transfer"
# Computation kinds and their loads + stores per element written (section 7.1's n).
COMPUTE_KINDS: dict[str, int] = {
    "copy": 2,        # a[...] = b[...]
    "fill": 1,        # a[...] = 0
    "add": 3,         # a[...] += b[...]
    "addcol": 3,      # a[...] += v[:, None]   (the row-prefix carry)
    "cumsum_row": 2,  # np.cumsum(b, axis=1, out=a)
    "cumsum_col": 2,  # np.cumsum(b, axis=0, out=a)
    "bzyx": 9,        # a = B - Z - Y + X, three passes of two loads and a store
}
KINDS = (*COMPUTE_KINDS, TRANSFER)


# -- regions and operations --------------------------------------------------------------------

@dataclass(frozen=True)
class Region:
    """``rows`` x ``cols`` elements of a row-major array of row pitch ``pitch`` whose base is
    line-aligned, the first at element ``start``; ``at``: the array's own word offset in the
    programs' shared segment (a line multiple; it names the array for :func:`reuse_lines`)."""

    rows: int
    cols: int
    pitch: int
    start: int
    at: int = 0

    def __post_init__(self) -> None:
        if self.rows < 1 or self.cols < 1 or self.start < 0 or self.pitch < self.cols:
            raise BadInput(f"region {self}", "rows, cols >= 1, cols <= pitch, start >= 0")
        if self.at < 0 or self.at % LINE:
            raise BadInput(f"region {self}", f"give an array offset that is a multiple of "
                           f"{LINE} words (a line)")

    def line_ids(self) -> np.ndarray:
        """The segment's line numbers this region touches (a row's lines in order, rows in
        order; a line two rows share appears twice)."""
        first = self.at + self.start + np.arange(self.rows, dtype=np.int64) * self.pitch
        lo, hi = first // LINE, (first + self.cols - 1) // LINE
        count = hi - lo + 1
        before = np.cumsum(count) - count
        return np.repeat(lo - before, count) + np.arange(int(count.sum()), dtype=np.int64)

    @property
    def elements(self) -> int:
        return self.rows * self.cols

    @property
    def lines(self) -> int:
        """Distinct memory lines (exact, :func:`predictor.mlt.column_lines`)."""
        return ml.column_lines(self.rows, self.pitch, LINE, self.cols, self.start % LINE)


@dataclass(frozen=True)
class Op:
    """One operation of one processor: its kind (:data:`KINDS`), n (bytes for a transfer,
    loads + stores for a computation), MLT (distinct lines of the data it touches) and the
    regions it touches (for :func:`reuse_lines`; empty for a calibration shape)."""

    kind: str
    n: int
    mlt: int
    regions: tuple[Region, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BadInput(f"operation kind {self.kind!r}", "use one of " + ", ".join(KINDS))


def compute_op(kind: str, written: Region, *read: Region) -> Op:
    """A computation writing ``written`` (read too, for an accumulation) and reading ``read``,
    each region on its own array: n = loads + stores per element x elements written, MLT = the
    sum of the regions' lines."""
    if kind not in COMPUTE_KINDS:
        raise BadInput(f"computation kind {kind!r}", "use one of " + ", ".join(COMPUTE_KINDS))
    return Op(kind, COMPUTE_KINDS[kind] * written.elements,
              written.lines + sum(r.lines for r in read), (written, *read))


def transfer_op(rows: int, cols: int, src_pitch: int, src_start: int = 0, *, src_at: int = 0,
                dst: Region | None = None) -> Op:
    """``rows`` x ``cols`` words copied from an array of pitch ``src_pitch`` (at word
    ``src_at`` of the segment) into a contiguous message (``dst``, where it is known): n = the
    bytes sent, MLT = the source's lines (the paper's MLT of marshalling a message; the
    message's own lines are n / 64, so beta n carries them)."""
    src = Region(rows, cols, src_pitch, src_start, src_at)
    return Op(TRANSFER, WORD_BYTES * src.elements, src.lines,
              (src,) if dst is None else (src, dst))


def transfer_case(kind: str, b_r: int, b_c: int, d: int) -> Op:
    """The transfer benchmark's case: d rows (``kind`` "rows") or the d leftmost columns
    ("cols") of a b_r x b_c matrix, line-aligned."""
    if kind == "rows":
        return transfer_op(d, b_c, b_c)
    if kind == "cols":
        return transfer_op(b_r, d, b_c)
    raise BadInput(f"transfer kind {kind!r}", "use rows or cols")


# -- layout ------------------------------------------------------------------------------------

def _pages(words: int) -> int:
    return -(-words // PAGE_WORDS) * PAGE_WORDS


@dataclass(frozen=True)
class Layout:
    """Word offsets of the arrays in one shared segment, each page-aligned.

    ``im``, ``acc`` (the output), ``t0``, ``t1``: L x L, pitch L. ``ext[r]``: processor r's
    prefix sums with b zero rows above and b columns from the west on the left ((L + b) x
    (b + w_r)), the fluff region ZPL keeps around a local block. ``msg[r]``: processor r's
    receive buffer, L x max(b, p) words. Processor r owns columns ``cols[r]`` = (c0, w)."""

    size: int
    block: int
    p: int
    cols: tuple[tuple[int, int], ...]
    im: int
    acc: int
    t0: int
    t1: int
    ext: tuple[int, ...]
    msg: tuple[int, ...]
    words: int

    @property
    def msg_words(self) -> int:
        return self.size * max(self.block, self.p)

    def ext_pitch(self, rank: int) -> int:
        return self.block + self.cols[rank][1]


def column_blocks(size: int, p: int) -> tuple[tuple[int, int], ...]:
    """(first column, width) of each processor's block of a 1 x p mesh: the L columns cut as
    evenly as possible, the wider blocks first."""
    if p < 1 or size < p:
        raise BadInput(f"{size} columns over {p} processors", "give 1 <= p <= L")
    q, extra = divmod(size, p)
    out, c0 = [], 0
    for r in range(p):
        w = q + (1 if r < extra else 0)
        out.append((c0, w))
        c0 += w
    return tuple(out)


def layout(size: int, block: int, p: int) -> Layout:
    """The arrays of both programs for an L x L image (``size``), block b, p processors."""
    if size < 1 or block < 1:
        raise BadInput(f"L = {size}, b = {block}", "give L >= 1 and b >= 1")
    cols = column_blocks(size, p)
    at = 0
    named = []
    for _ in range(4):
        named.append(at)
        at += _pages(size * size)
    ext = []
    for _, w in cols:
        ext.append(at)
        at += _pages((size + block) * (block + w))
    msg = []
    for _ in cols:
        msg.append(at)
        at += _pages(size * max(block, p))
    return Layout(size, block, p, cols, named[0], named[1], named[2], named[3], tuple(ext),
                  tuple(msg), at)


# -- the two programs --------------------------------------------------------------------------

@dataclass(frozen=True)
class Superstep:
    """A named superstep: per processor, the operations it runs."""

    name: str
    ops: tuple[tuple[Op, ...], ...]


def _image(lay: Layout, rank: int, at: int, rows: int | None = None, row0: int = 0) -> Region:
    """Processor ``rank``'s columns of the L x L array at word ``at``, from row ``row0``."""
    c0, w = lay.cols[rank]
    return Region(lay.size - row0 if rows is None else rows, w, lay.size, row0 * lay.size + c0,
                  at)


def _message(lay: Layout, rank: int, words: int, start: int = 0) -> Region:
    """``words`` contiguous words of processor ``rank``'s receive buffer."""
    return Region(1, words, words, start, lay.msg[rank])


def shift_program(size: int, block: int, p: int) -> tuple[Superstep, ...]:
    """Conv-Shift (the paper's Figure 19) on a 1 x p mesh.

    ``init``: acc = im. For k = 1..b-1, ``west k``: every processor but the first receives
    its west neighbour's last column of T_{k-1} (T_0 = im), a one-column transfer; ``add west
    k``: T_k[:, 1:] = T_{k-1}[:, :-1], T_k[:, 0] = the received column (zeros on the first
    processor), acc += T_k. T_k lives in t1 for odd k, in t0 for even k. ``copy``: H = acc
    (in t0). For k = 1..b-1, ``add north k``: acc[k:] += H[:-k] (the vertical shifts are local
    on a 1 x p mesh)."""
    lay = layout(size, block, p)
    L = size
    steps = [Superstep("init", tuple((compute_op("copy", _image(lay, r, lay.acc),
                                                 _image(lay, r, lay.im)),)
                                     for r in range(p)))]
    prev = lay.im
    for k in range(1, block):
        cur = lay.t1 if k % 2 else lay.t0
        comm = tuple((transfer_op(L, 1, L, lay.cols[r][0] - 1, src_at=prev,
                                  dst=_message(lay, r, L)),) if r > 0 else ()
                     for r in range(p))
        steps.append(Superstep(f"west {k}", comm))
        work = []
        for r in range(p):
            c0, w = lay.cols[r]
            ops = []
            if w > 1:
                ops.append(compute_op("copy", Region(L, w - 1, L, c0 + 1, cur),
                                      Region(L, w - 1, L, c0, prev)))
            ops.append(compute_op("copy", Region(L, 1, L, c0, cur), Region(L, 1, 1, 0,
                                                                            lay.msg[r])))
            ops.append(compute_op("add", _image(lay, r, lay.acc), _image(lay, r, cur)))
            work.append(tuple(ops))
        steps.append(Superstep(f"add west {k}", tuple(work)))
        prev = cur
    if block > 1:
        steps.append(Superstep("copy", tuple((compute_op("copy", _image(lay, r, lay.t0),
                                                         _image(lay, r, lay.acc)),)
                                             for r in range(p))))
    for k in range(1, block):
        steps.append(Superstep(f"add north {k}", tuple(
            (compute_op("add", _image(lay, r, lay.acc, L - k, k),
                        _image(lay, r, lay.t0, L - k)),)
            if k < L else () for r in range(p))))
    return tuple(steps)


def west_pieces(lay: Layout, rank: int, width: int) -> tuple[tuple[int, int, int], ...]:
    """The columns [c0 - width, c0) that exist, by owner: (owner, its first local column,
    count), west to east."""
    c0 = lay.cols[rank][0]
    out = []
    for j in range(rank):
        a, w = lay.cols[j]
        lo, hi = max(a, c0 - width), min(a + w, c0)
        if hi > lo:
            out.append((j, lo - a, hi - lo))
    return tuple(out)


def scan_program(size: int, block: int, p: int) -> tuple[Superstep, ...]:
    """Conv-Scan (the paper's Figure 18) on a 1 x p mesh.

    ``row prefix``: each processor's cumulative sum along its rows (into t0). ``row carry``:
    processor r receives the last column of every processor west of it (one-column
    transfers). ``column prefix``: add the carry (their sum) to every row; cumulative sum down
    the columns into the interior of ``ext``. ``west columns``: processor r receives the b
    columns of prefix sums west of its block (those that exist; a b-column transfer on 1 x 2).
    ``box sums``: zero the fluff not received, unpack the message into ``ext``, acc = B - Z -
    Y + X."""
    lay = layout(size, block, p)
    L, b = size, block
    steps = [Superstep("row prefix", tuple(
        (compute_op("cumsum_row", _image(lay, r, lay.t0), _image(lay, r, lay.im)),)
        for r in range(p)))]
    steps.append(Superstep("row carry", tuple(
        tuple(transfer_op(L, 1, L, lay.cols[j][0] + lay.cols[j][1] - 1, src_at=lay.t0,
                          dst=_message(lay, r, L, j * L)) for j in range(r))
        for r in range(p))))
    work = []
    for r in range(p):
        c0, w = lay.cols[r]
        pitch = lay.ext_pitch(r)
        ops = [compute_op("add", _message(lay, r, L), _message(lay, r, L, j * L))
               for j in range(1, r)]
        if r > 0:
            ops.append(compute_op("addcol", _image(lay, r, lay.t0), Region(L, 1, 1, 0,
                                                                           lay.msg[r])))
        ops.append(compute_op("cumsum_col", Region(L, w, pitch, b * pitch + b, lay.ext[r]),
                              _image(lay, r, lay.t0)))
        work.append(tuple(ops))
    steps.append(Superstep("column prefix", tuple(work)))
    west = []
    for r in range(p):
        ops, at = [], 0
        for j, a, d in west_pieces(lay, r, b):
            pj = lay.ext_pitch(j)
            ops.append(transfer_op(L, d, pj, b * pj + b + a, src_at=lay.ext[j],
                                   dst=_message(lay, r, L * d, at)))
            at += L * d
        west.append(tuple(ops))
    steps.append(Superstep("west columns", tuple(west)))
    work = []
    for r in range(p):
        c0, w = lay.cols[r]
        pitch = lay.ext_pitch(r)
        ext = lay.ext[r]
        pieces = west_pieces(lay, r, b)
        got = sum(d for _, _, d in pieces)
        ops = [compute_op("fill", Region(b, pitch, pitch, 0, ext))]
        if got < b:
            ops.append(compute_op("fill", Region(L, b - got, pitch, b * pitch, ext)))
        at, col = 0, b - got
        for _, _, d in pieces:
            ops.append(compute_op("copy", Region(L, d, pitch, b * pitch + col, ext),
                                  Region(L, d, d, at, lay.msg[r])))
            at += L * d
            col += d
        ops.append(compute_op("bzyx", _image(lay, r, lay.acc),
                              Region(L + b, pitch, pitch, 0, ext)))
        work.append(tuple(ops))
    steps.append(Superstep("box sums", tuple(work)))
    return tuple(steps)


def program(name: str, size: int, block: int, p: int) -> tuple[Superstep, ...]:
    if name == "shift":
        return shift_program(size, block, p)
    if name == "scan":
        return scan_program(size, block, p)
    raise BadInput(f"program {name!r}", "use shift or scan")


# -- calibration shapes ------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """A calibration operation: ``rows`` x ``cols`` written at pitch ``dst_pitch``, read at
    ``src_pitch`` (``shift``: bzyx's b), each array line-aligned, starting ``offset`` elements
    into it."""

    kind: str
    rows: int
    cols: int
    dst_pitch: int
    src_pitch: int
    offset: int = 0
    shift: int = 1

    def __post_init__(self) -> None:
        if self.kind not in COMPUTE_KINDS:
            raise BadInput(f"computation kind {self.kind!r}",
                           "use one of " + ", ".join(COMPUTE_KINDS))
        if min(self.rows, self.cols, self.shift) < 1 or self.offset < 0:
            raise BadInput(f"shape {self}", "rows, cols, shift >= 1, offset >= 0")
        if min(self.dst_pitch, self.src_pitch) < self.cols:
            raise BadInput(f"shape {self}", "pitches of at least cols")

    def dst(self) -> Region:
        return Region(self.rows, self.cols, self.dst_pitch, self.offset)

    def src(self) -> Region:
        """The read array (for bzyx: (rows + shift) x (cols + shift), contiguous)."""
        if self.kind == "bzyx":
            s = self.shift
            return Region(self.rows + s, self.cols + s, self.cols + s, 0)
        if self.kind == "addcol":
            return Region(self.rows, 1, 1, 0)
        return Region(self.rows, self.cols, self.src_pitch, self.offset)

    @property
    def dst_words(self) -> int:
        return self.offset + (self.rows - 1) * self.dst_pitch + self.cols

    @property
    def src_words(self) -> int:
        r = self.src()
        return r.start + (r.rows - 1) * r.pitch + r.cols


def calibration_op(shape: Shape) -> Op:
    if shape.kind == "fill":
        return compute_op("fill", shape.dst())
    return compute_op(shape.kind, shape.dst(), shape.src())


# -- fitting and prediction --------------------------------------------------------------------

class Predicts(Protocol):
    def predict(self, table: Any) -> np.ndarray: ...


def fit_kinds(samples: Mapping[str, tuple[ArrayLike, ArrayLike, ArrayLike]], *,
              models: Sequence[str] = ("S1", "M1"), train_fraction: float = 0.7,
              max_train: int = ml.TRAINING_SIZE, seed: int = 0
              ) -> dict[str, dict[str, ml.RegressionFit]]:
    """Per model name, per operation kind: the Table 1 model fitted on that kind's samples
    (n, MLT, seconds) with :func:`predictor.mlt.fit_table1`, ``train_fraction`` of them (at
    most the paper's 100) to train, the rest to test."""
    if not 0 < train_fraction < 1:
        raise BadInput(f"train fraction {train_fraction}", "give a fraction in (0, 1)")
    out: dict[str, dict[str, ml.RegressionFit]] = {m: {} for m in models}
    for kind, (n, lines, times) in samples.items():
        y = np.asarray(times, dtype=float).ravel()
        most_terms = max(len(ml.TABLE1.get(m, ())) for m in models)
        train = min(max_train, max(most_terms + 2, int(round(train_fraction * y.size))))
        if y.size <= train:
            raise BadInput(f"{y.size} calibration samples of {kind}",
                           f"measure more than {train}")
        fits = ml.fit_table1({"n": n, "mlt": lines}, y, train=train, seed=seed, models=models)
        for f in fits:
            out[f.name][kind] = f
    return out


# -- cache state ------------------------------------------------------------------------------

@dataclass(frozen=True)
class CacheRule:
    """Which data a cache level keeps: an operation is *warm* when ``sharing`` x its reuse
    distance (:func:`reuse_lines`) x 64 B fits in ``size_bytes``, *cold* otherwise.
    ``sharing``: the program's processors that share the level (1 for a per-core cache; the
    SPMD processors touch equal amounts, so the level holds ``sharing`` times one's)."""

    level: int
    size_bytes: int
    sharing: int = 1

    def __post_init__(self) -> None:
        if self.level < 1 or self.size_bytes < LINE_BYTES or self.sharing < 1:
            raise BadInput(f"cache rule {self}", "level >= 1, a size of a line or more, "
                           "sharing >= 1")

    def warm(self, reuse: int) -> bool:
        return self.sharing * reuse * LINE_BYTES <= self.size_bytes

    def describe(self) -> str:
        per = f"{self.size_bytes / 2**20:g} MiB"
        share = "per core" if self.sharing == 1 else f"shared by {self.sharing} processors"
        return f"L{self.level} ({per}, {share})"


def cache_rule(levels: Sequence[CacheLevel], p: int, level: int | None = None) -> CacheRule:
    """The rule of cache ``level`` of a machine description (:attr:`counterd.machine.
    description.Machine.levels`; None: the last level) for p processors pinned one per CPU: it
    is shared by as many of them as its ``shared_cpus`` lists (at most p; 1 when unknown)."""
    if not levels:
        raise BadInput("a machine without cache levels", "describe the caches (a machine "
                       "file, or sysfs)")
    if level is None:
        lv = levels[-1]
    else:
        found = [x for x in levels if x.level == level]
        if not found:
            raise BadInput(f"cache level {level}",
                           "use one of " + ", ".join(str(x.level) for x in levels))
        lv = found[0]
    sharing = max(1, min(p, len(lv.shared_cpus))) if lv.shared_cpus else 1
    return CacheRule(lv.level, lv.size_bytes, sharing)


def reuse_lines(steps: Sequence[Superstep]) -> list[list[list[int]]]:
    """Per superstep, per processor, per operation: the operation's reuse distance in lines,
    counted exactly from the regions the operations touch (:attr:`Op.regions`).

    The program runs again and again (the bench times repeated runs), so every line has been
    touched before. For each region of an operation: the distinct lines this processor touched
    since its oldest line was last touched (that line included: the LRU stack distance of the
    region); the operation's distance is its regions' largest. Operations without regions (the
    calibration shapes) get 0."""
    out = [[[0] * len(ops) for ops in s.ops] for s in steps]
    p = max((len(s.ops) for s in steps), default=0)
    for r in range(p):
        seq = [(i, j, op) for i, s in enumerate(steps) if r < len(s.ops)
               for j, op in enumerate(s.ops[r])]
        ids = [[reg.line_ids() for reg in op.regions] for _, _, op in seq]
        top = max((int(x.max()) for regs in ids for x in regs), default=-1) + 1
        if top == 0:
            continue
        last = np.full(top, -1, dtype=np.int64)
        n = len(seq)
        for t in range(2 * n):  # the first pass only records: a run follows a run
            regs = ids[t % n]
            if t >= n:
                dist = 0
                for x in regs:
                    since = int(last[x].min())
                    dist = max(dist, int(np.count_nonzero(last >= since)))
                i, j, _ = seq[t % n]
                out[i][r][j] = dist
            for x in regs:
                last[x] = t
    return out


def warm_ops(steps: Sequence[Superstep], rule: CacheRule) -> list[list[list[bool]]]:
    """Per superstep, per processor, per operation: warm under ``rule``."""
    return [[[rule.warm(d) for d in ops] for ops in step] for step in reuse_lines(steps)]


def superstep_times(steps: Sequence[Superstep], models: Mapping[str, Predicts], *,
                    warm_models: Mapping[str, Predicts] | None = None,
                    rule: CacheRule | None = None) -> np.ndarray:
    """Predicted seconds of each superstep: per processor the sum of its operations' predicted
    times, the slowest processor's. With ``warm_models`` and ``rule``, an operation that
    :func:`warm_ops` calls warm is predicted by its kind's warm model (a kind without one keeps
    its ``models`` entry), the others by ``models`` (the cold ones)."""
    warm = warm_ops(steps, rule) if warm_models is not None and rule is not None else None
    by_kind: dict[tuple[str, bool], list[tuple[int, int, Op]]] = {}
    p = max((len(s.ops) for s in steps), default=0)
    for i, s in enumerate(steps):
        for r, ops in enumerate(s.ops):
            for j, op in enumerate(ops):
                hot = warm is not None and warm[i][r][j]
                by_kind.setdefault((op.kind, hot), []).append((i, r, op))
    per = np.zeros((len(steps), max(p, 1)))
    for (kind, hot), items in by_kind.items():
        if kind not in models:
            raise BadInput(f"no fitted model for {kind} operations",
                           "calibrate every kind: " + ", ".join(sorted({k for k, _ in by_kind})))
        model = warm_models[kind] if hot and warm_models and kind in warm_models \
            else models[kind]
        t = model.predict({"n": np.array([o.n for _, _, o in items], dtype=float),
                           "mlt": np.array([o.mlt for _, _, o in items], dtype=float)})
        for (i, r, _), v in zip(items, np.asarray(t, dtype=float), strict=True):
            per[i, r] += v
    return per.max(axis=1)


def predict(steps: Sequence[Superstep], models: Mapping[str, Predicts], *,
            warm_models: Mapping[str, Predicts] | None = None,
            rule: CacheRule | None = None) -> float:
    """Predicted seconds of a program: the sum over supersteps of the slowest processor (warm
    and cold operations as :func:`superstep_times` says)."""
    return float(superstep_times(steps, models, warm_models=warm_models, rule=rule).sum())


def crossover(blocks: Iterable[int], ratios: Iterable[float]) -> int | None:
    """The smallest block size whose ratio (Conv-Shift time / Conv-Scan time) exceeds 1, that
    is where Conv-Scan is faster; None if it never is."""
    pairs = sorted(zip(blocks, ratios, strict=True))
    for b, r in pairs:
        if not np.isfinite(r):
            raise BadInput(f"ratio {r} at b = {b}", "give finite ratios")
        if r > 1.0:
            return int(b)
    return None


FIRM = 0.8  # a verdict is firm when at least this share of repetition pairs gives it


def crossover_range(blocks: Iterable[int], scan_faster: Iterable[float], *,
                    firm: float = FIRM) -> tuple[int | None, int | None]:
    """The measured crossover with its uncertainty, from the share of repetition pairs (one
    Conv-Shift and one Conv-Scan time measured together) in which Conv-Scan is faster, per
    block size. A block size is firmly Conv-Shift's when at most 1 - ``firm`` of its pairs
    say Conv-Scan, firmly Conv-Scan's when at least ``firm`` do, uncertain otherwise.

    Returns (lo, hi): lo the smallest block size that is not firmly Conv-Shift's, hi the
    smallest from which every larger one is firmly Conv-Scan's. The crossover lies in
    [lo, hi] (a single block size when lo == hi). (None, None): Conv-Shift is firmly faster
    everywhere; hi None: Conv-Scan is not firmly faster at the largest block size."""
    if not 0.5 < firm <= 1:
        raise BadInput(f"firm share {firm}", "give a share in (0.5, 1]")
    pairs = sorted(zip(blocks, scan_faster, strict=True))
    for b, s in pairs:
        if not 0 <= s <= 1:
            raise BadInput(f"share {s} at b = {b}", "give shares in [0, 1]")
    lo = next((int(b) for b, s in pairs if s > 1 - firm), None)
    if lo is None:
        return None, None
    hi: int | None = None
    for b, s in reversed(pairs):
        if s < firm:
            break
        hi = int(b)
    return lo, hi


__all__ = ["COMPUTE_KINDS", "KINDS", "LINE", "PROGRAMS", "TRANSFER", "CacheRule", "Layout",
           "Op", "Region", "Shape", "Superstep", "cache_rule", "calibration_op",
           "column_blocks", "compute_op", "crossover", "crossover_range", "fit_kinds",
           "layout", "predict", "program", "reuse_lines", "scan_program", "shift_program",
           "superstep_times", "transfer_case", "transfer_op", "warm_ops", "west_pieces"]
