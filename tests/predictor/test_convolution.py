"""predictor.convolution: the operation accounting of Conv-Shift and Conv-Scan against brute
force (lines counted by enumerating addresses), the BSP sum of predictions, the fits on
synthetic data with known coefficients, and the crossover finder."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from predictor import convolution as cv
from predictor.errors import BadInput

CASES = [(16, 1, 2), (17, 3, 2), (12, 9, 2), (30, 4, 1), (21, 5, 3), (40, 10, 2)]


def brute_lines(*regions: tuple[int, int, int, int]) -> int:
    """Distinct 8-element lines of (rows, cols, pitch, start) regions of one array."""
    seen: set[int] = set()
    for rows, cols, pitch, start in regions:
        for i in range(rows):
            for j in range(cols):
                seen.add((start + i * pitch + j) // cv.LINE)
    return len(seen)


def test_region_lines_match_enumerated_addresses() -> None:
    rng = np.random.default_rng(1)
    for _ in range(400):
        cols = int(rng.integers(1, 30))
        pitch = cols + int(rng.integers(0, 30))
        rows = int(rng.integers(1, 25))
        start = int(rng.integers(0, 100))
        r = cv.Region(rows, cols, pitch, start)
        assert r.lines == brute_lines((rows, cols, pitch, start)), r


def test_transfer_cases_count_the_source_lines() -> None:
    # 3 columns of a 10 x 20 matrix: rows 0..9 start at 20 i, lines (20 i)//8 .. (20 i + 2)//8.
    op = cv.transfer_case("cols", 10, 20, 3)
    assert op.n == 8 * 30
    assert op.mlt == brute_lines((10, 3, 20, 0))
    op = cv.transfer_case("rows", 10, 20, 3)
    assert (op.n, op.mlt) == (8 * 60, 8)  # 60 contiguous elements from a line start
    with pytest.raises(BadInput):
        cv.transfer_case("diagonal", 4, 4, 1)


def test_layout_arrays_are_page_aligned_and_disjoint() -> None:
    lay = cv.layout(21, 5, 3)
    assert [w for _, w in lay.cols] == [7, 7, 7]
    spans = [(lay.im, 21 * 21), (lay.acc, 21 * 21), (lay.t0, 21 * 21), (lay.t1, 21 * 21)]
    spans += [(lay.ext[r], (21 + 5) * lay.ext_pitch(r)) for r in range(3)]
    spans += [(lay.msg[r], lay.msg_words) for r in range(3)]
    spans.sort()
    for (a, n), (b, _) in zip(spans, spans[1:], strict=False):
        assert a % cv.PAGE_WORDS == 0 and a + n <= b
    assert spans[-1][0] + spans[-1][1] <= lay.words
    assert cv.column_blocks(10, 3) == ((0, 4), (4, 3), (7, 3))


@pytest.mark.parametrize(("size", "block", "p"), CASES)
def test_shift_program_accounting(size: int, block: int, p: int) -> None:
    steps = cv.shift_program(size, block, p)
    names = [s.name for s in steps]
    hor = [x for k in range(1, block) for x in (f"west {k}", f"add west {k}")]
    assert names == ["init", *hor, *(["copy"] if block > 1 else []),
                     *[f"add north {k}" for k in range(1, block)]]
    lay = cv.layout(size, block, p)
    for s in steps:
        assert len(s.ops) == p
    for k in range(1, block):
        comm = steps[2 * k - 1]
        assert comm.ops[0] == ()  # the first processor has no west neighbour
        for r in range(1, p):
            (op,) = comm.ops[r]
            c0 = lay.cols[r][0]
            # One column of the west block, pitch L, into a contiguous buffer.
            assert (op.kind, op.n) == ("transfer", 8 * size)
            assert op.mlt == brute_lines((size, 1, size, c0 - 1))
        work = steps[2 * k]
        for r in range(p):
            c0, w = lay.cols[r]
            kinds = [o.kind for o in work.ops[r]]
            assert kinds == (["copy"] if w > 1 else []) + ["copy", "add"]
            add = work.ops[r][-1]
            assert add.n == 3 * size * w
            assert add.mlt == 2 * brute_lines((size, w, size, c0))
            unpack = work.ops[r][-2]
            assert unpack.mlt == brute_lines((size, 1, size, c0)) + brute_lines((size, 1, 1, 0))


@pytest.mark.parametrize(("size", "block", "p"), CASES)
def test_scan_program_accounting(size: int, block: int, p: int) -> None:
    steps = cv.scan_program(size, block, p)
    assert [s.name for s in steps] == ["row prefix", "row carry", "column prefix",
                                       "west columns", "box sums"]
    lay = cv.layout(size, block, p)
    for r in range(p):
        c0, w = lay.cols[r]
        carry = steps[1].ops[r]
        assert len(carry) == r and all(o.n == 8 * size for o in carry)
        west = steps[3].ops[r]
        # The b columns west of the block that exist, however many processors hold them.
        assert sum(o.n for o in west) == 8 * size * min(block, c0)
        pitch = block + w
        for o, (j, a, d) in zip(west, cv.west_pieces(lay, r, block), strict=True):
            pj = lay.ext_pitch(j)
            assert o.mlt == brute_lines((size, d, pj, block * pj + block + a))
        box = steps[4].ops[r][-1]
        assert box.kind == "bzyx" and box.n == 9 * size * w
        # B, Z, Y, X: four shifted views of ext, and the output block.
        B = (size, w, pitch, block * pitch + block)
        Z = (size, w, pitch, block)
        Y = (size, w, pitch, block * pitch)
        X = (size, w, pitch, 0)
        assert box.mlt == brute_lines(B, Z, Y, X) + brute_lines((size, w, size, c0))


class _Linear:
    """A stand-in model: seconds = a n + c mlt."""

    def __init__(self, a: float, c: float) -> None:
        self.a, self.c = a, c

    def predict(self, table: Any) -> np.ndarray:
        return self.a * np.asarray(table["n"]) + self.c * np.asarray(table["mlt"])


def test_predict_sums_the_slowest_processor_per_superstep() -> None:
    steps = cv.scan_program(17, 3, 2)
    models = {k: _Linear(1.0, 0.0) for k in cv.KINDS}
    want = sum(max(sum(o.n for o in ops) for ops in s.ops) for s in steps)
    assert cv.predict(steps, models) == pytest.approx(want)
    # Processor 1 (the only one with a west neighbour) receives 8 L (1 + min(b, w0)) bytes.
    per = cv.superstep_times(steps, models)
    assert per[1] == 8 * 17 and per[3] == 8 * 17 * 3
    with pytest.raises(BadInput, match="no fitted model"):
        cv.predict(steps, {"copy": _Linear(1, 0)})


def test_fit_kinds_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(3)
    n = rng.uniform(1e3, 1e6, 80)
    mlt = n / 24 + rng.uniform(0, 5e3, 80)  # lines: not a multiple of n
    t = 2e-6 + 1e-9 * n + 5e-8 * mlt
    fits = cv.fit_kinds({"copy": (n, mlt, t), "transfer": (n, mlt, t * 2)})
    m1 = fits["M1"]["copy"]
    assert m1.model.coef == pytest.approx([2e-6, 1e-9, 5e-8], rel=1e-6)
    assert m1.r2 < 1e-12 < fits["S1"]["copy"].r2
    assert m1.n_train == 56 and m1.n_test == 24
    assert fits["M1"]["transfer"].model.coef[2] == pytest.approx(1e-7, rel=1e-6)


@pytest.mark.parametrize(("blocks", "ratios", "want"), [
    ([1, 2, 3, 4, 5], [0.1, 0.5, 0.9, 1.2, 1.5], 4),
    ([5, 4, 3, 2, 1], [1.5, 1.2, 0.9, 0.5, 0.1], 4),  # any order
    ([1, 2, 3], [0.5, 1.0, 0.99], None),  # equal is not faster
    ([1, 2, 3, 4], [0.5, 1.1, 0.9, 1.3], 2),  # the smallest, even if it is not kept
    ([], [], None),
])
def test_crossover(blocks: list[int], ratios: list[float], want: int | None) -> None:
    assert cv.crossover(blocks, ratios) == want


def test_crossover_refuses_nan() -> None:
    with pytest.raises(BadInput):
        cv.crossover([1, 2], [0.5, float("nan")])
