"""predictor.families.convolution: the operation accounting of Conv-Shift and Conv-Scan against
brute
force (lines counted by enumerating addresses), the BSP sum of predictions, the fits on
synthetic data with known coefficients, and the crossover finder."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from predictor.errors import BadInput
from predictor.families import convolution as cv
from predictor.families import convolution_predict as cvp

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
    assert cvp.predict(steps, models) == pytest.approx(want)
    # Processor 1 (the only one with a west neighbour) receives 8 L (1 + min(b, w0)) bytes.
    per = cvp.superstep_times(steps, models)
    assert per[1] == 8 * 17 and per[3] == 8 * 17 * 3
    with pytest.raises(BadInput, match="no fitted model"):
        cvp.predict(steps, {"copy": _Linear(1, 0)})


def test_fit_kinds_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(3)
    n = rng.uniform(1e3, 1e6, 80)
    mlt = n / 24 + rng.uniform(0, 5e3, 80)  # lines: not a multiple of n
    t = 2e-6 + 1e-9 * n + 5e-8 * mlt
    fits = cvp.fit_kinds({"copy": (n, mlt, t), "transfer": (n, mlt, t * 2)})
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
    assert cvp.crossover(blocks, ratios) == want


def test_crossover_refuses_nan() -> None:
    with pytest.raises(BadInput):
        cvp.crossover([1, 2], [0.5, float("nan")])


# -- cache state -------------------------------------------------------------------------------

def region_lines(r: cv.Region) -> set[int]:
    """The segment lines of a region, by enumerating its addresses."""
    return {(r.at + r.start + i * r.pitch + j) // cv.LINE
            for i in range(r.rows) for j in range(r.cols)}


def test_region_line_ids_enumerate_its_addresses() -> None:
    rng = np.random.default_rng(5)
    for _ in range(300):
        cols = int(rng.integers(1, 30))
        r = cv.Region(int(rng.integers(1, 20)), cols, cols + int(rng.integers(0, 30)),
                      int(rng.integers(0, 100)), cv.LINE * int(rng.integers(0, 50)))
        assert set(r.line_ids().tolist()) == region_lines(r), r
    with pytest.raises(BadInput, match="multiple of 8"):
        cv.Region(2, 2, 2, 0, at=3)


@pytest.mark.parametrize(("size", "block", "p"), [(16, 1, 2), (17, 3, 2), (21, 5, 3)])
@pytest.mark.parametrize("name", cv.PROGRAMS)
def test_regions_are_what_mlt_counts(name: str, size: int, block: int, p: int) -> None:
    for s in cv.program(name, size, block, p):
        for ops in s.ops:
            for op in ops:
                assert op.regions
                if op.kind == cv.TRANSFER:  # the source's lines; the message is beta n's
                    assert op.mlt == op.regions[0].lines
                else:
                    assert op.mlt == sum(r.lines for r in op.regions)


def brute_reuse(steps: tuple[cv.Superstep, ...], rank: int) -> list[int]:
    """Per operation of ``rank`` in program order: the distinct lines touched since the
    oldest last touch of any of a region's lines, the largest over its regions, with the
    program run twice (an LRU stack distance, by sets)."""
    seq = [[region_lines(r) for r in op.regions] for s in steps for op in s.ops[rank]]
    n, out = len(seq), []
    for t in range(n, 2 * n):
        dist = 0
        for lines in seq[t % n]:
            since = min(max(u for u in range(t) if line in set().union(*seq[u % n]))
                        for line in lines)
            dist = max(dist, len(set().union(*(x for u in range(since, t) for x in seq[u % n]))))
        out.append(dist)
    return out


@pytest.mark.parametrize(("name", "size", "block"), [("shift", 16, 3), ("scan", 17, 3),
                                                      ("shift", 12, 1)])
def test_reuse_lines_is_the_stack_distance(name: str, size: int, block: int) -> None:
    steps = cv.program(name, size, block, 2)
    got = cvp.reuse_lines(steps)
    for rank in range(2):
        flat = [d for st in got for d in st[rank]]
        assert flat == brute_reuse(steps, rank)


def test_shift_reuse_is_three_arrays_in_the_west_loop() -> None:
    # acc, T_{k-1} and T_k: each rank's L x L/2 share, plus the received column and its lines.
    L = 400
    steps = cv.shift_program(L, 6, 2)
    reuse = cvp.reuse_lines(steps)
    add = [reuse[i][0][-1] for i, s in enumerate(steps) if s.name == "add west 3"][0]
    share = L * (L // 2) // cv.LINE
    assert 3 * share <= add <= 3 * share + 2 * L


def test_cache_rule_from_the_machine_description() -> None:
    from counterd.machine.geometry import CacheLevel

    levels = (CacheLevel(1, 32768, 8, 64, (0,)), CacheLevel(2, 1 << 20, 8, 64, (0,)),
              CacheLevel(3, 32 << 20, 16, 64, (0, 1, 2, 3)))
    l2 = cvp.cache_rule(levels, 2, 2)
    assert (l2.level, l2.size_bytes, l2.sharing) == (2, 1 << 20, 1)
    last = cvp.cache_rule(levels, 2)
    assert (last.level, last.sharing) == (3, 2)  # two of its four CPUs run the program
    assert l2.warm((1 << 20) // 64) and not l2.warm((1 << 20) // 64 + 1)
    assert last.warm((16 << 20) // 64) and not last.warm((16 << 20) // 64 + 1)
    with pytest.raises(BadInput, match="use one of 1, 2, 3"):
        cvp.cache_rule(levels, 2, 4)


def test_warm_operations_use_the_warm_models() -> None:
    cold = {k: _Linear(1.0, 0.0) for k in cv.KINDS}
    warm = {k: _Linear(0.0, 1.0) for k in cv.KINDS if k != cv.TRANSFER}
    steps = cv.shift_program(200, 3, 2)
    reuse = cvp.reuse_lines(steps)
    big = cvp.CacheRule(2, 1 << 30)  # everything fits: every operation warm
    small = cvp.CacheRule(2, 64)  # nothing does
    assert cvp.predict(steps, cold, warm_models=warm, rule=small) == cvp.predict(steps, cold)
    want = 0.0
    for s in steps:  # warm: mlt, except transfers (no warm model: the cold one, n)
        want += max(sum(o.n if o.kind == cv.TRANSFER else o.mlt for o in ops) for ops in s.ops)
    assert cvp.predict(steps, cold, warm_models=warm, rule=big) == pytest.approx(want)
    # A rule between the two reuse distances of the init copy and an add splits them.
    d_init, d_add = reuse[0][0][0], reuse[2][0][-1]
    assert d_add < d_init
    mid = cvp.CacheRule(2, 64 * d_add)
    flags = cvp.warm_ops(steps, mid)
    assert flags[2][0][-1] and not flags[0][0][0]


@pytest.mark.parametrize(("shares", "want"), [
    ([0.0, 0.0, 0.1, 0.9, 1.0], (4, 4)),  # firm on both sides: one block size
    ([0.0, 0.3, 0.5, 0.85, 1.0], (2, 4)),  # b = 2, 3 uncertain
    ([0.0, 0.0, 0.9, 0.6, 1.0], (3, 5)),  # a firm b = 3 before an uncertain b = 4
    ([0.0, 0.1, 0.15, 0.0, 0.1], (None, None)),  # Conv-Shift firmly faster throughout
    ([0.0, 0.0, 0.0, 0.5, 0.7], (4, None)),  # not firm at the largest block size
])
def test_crossover_range(shares: list[float], want: tuple[int | None, int | None]) -> None:
    assert cvp.crossover_range([1, 2, 3, 4, 5], shares) == want


def test_crossover_range_refuses_bad_shares() -> None:
    with pytest.raises(BadInput):
        cvp.crossover_range([1, 2], [0.5, 1.5])
    with pytest.raises(BadInput):
        cvp.crossover_range([1], [0.5], firm=0.4)
