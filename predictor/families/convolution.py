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
  (:func:`predictor.families.mlt.column_lines`: distinct 64 B lines, 8 float64 per line).
* :func:`calibration_op`, :func:`transfer_op`: the same accounting for the calibration shapes.
* the predictions: :mod:`predictor.families.convolution_predict`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from predictor.errors import BadInput
from predictor.families import mlt as ml

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
        """Distinct memory lines (exact, :func:`predictor.families.mlt.column_lines`)."""
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


__all__ = ["COMPUTE_KINDS", "KINDS", "LINE", "PROGRAMS", "TRANSFER", "Layout", "Op", "Region",
           "Shape", "Superstep", "calibration_op", "column_blocks", "compute_op", "layout",
           "program", "scan_program", "shift_program", "transfer_case", "transfer_op",
           "west_pieces"]
