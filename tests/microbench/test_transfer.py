"""The row/column transfer benchmark: cases in the paper's ranges, messages that read exactly
the neighbour's rows or columns, line counts equal to the lines the copy's address stream
touches, flushes that cover them, the native 2-D copy, a real two-process run and the CLI."""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import numpy as np
import pytest

from counterd.data.errors import BadInput
from microbench import transfer as tr
from microbench.cli import main
from microbench.kernels import WORD_BYTES, CopyCall, buffer_address, native_lib
from microbench.patterns import host_machine
from predictor.families import mlt

CPUS = len(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(CPUS < 2, reason="a transfer needs 2 CPUs")
PAGE, LINE = 4096, 64


def test_case_geometry() -> None:
    c = tr.Case("cols", 3000, 1001, 7)  # a 1 x 2 mesh: the columns are split
    assert (c.b_r, c.b_c, c.words, c.n_bytes) == (3000, 501, 7 * 3000, 7 * 3000 * 8)
    r = tr.Case("rows", 1001, 3000, 7)  # 2 x 1: the rows are
    assert (r.b_r, r.b_c, r.words) == (501, 3000, 7 * 3000)
    with pytest.raises(BadInput):
        tr.Case("cols", 10, 10, 6)  # a block of 5 columns cannot send 6
    with pytest.raises(BadInput):
        tr.Case("diagonal", 10, 10, 1)  # type: ignore[arg-type]


def test_sampled_cases_stay_in_the_papers_ranges_and_d_follows_its_distribution() -> None:
    for kind in ("rows", "cols"):
        log = tr.sample(2000, kind, seed=3)
        uni = tr.sample(2000, kind, seed=3, d_dist="uniform")
        for cases in (log, uni):
            assert all(2 <= c.matrix_rows <= 4000 and 2 <= c.matrix_cols <= 4000
                       for c in cases)
            assert all(1 <= c.d <= min(200, c.across) for c in cases)
        small_log = np.mean([c.d <= 14 for c in log])
        small_uni = np.mean([c.d <= 14 for c in uni])
        assert small_log > 0.4 and small_uni < 0.15, (small_log, small_uni)
        assert tr.sample(50, kind, seed=1) == tr.sample(50, kind, seed=1)
    with pytest.raises(BadInput):
        tr.sample(10, "rows", d_dist="normal")  # type: ignore[arg-type]


def _source_words(case: tr.Case, rank: int) -> set[int]:
    """Byte offsets of the words rank ``rank`` receives, from the layout by hand."""
    lay = tr.layout(case, PAGE)
    other = lay.blocks[1 - rank]
    if case.kind == "rows":
        first_row = 0 if rank == 0 else case.b_r - case.d
        rows, cols = range(first_row, first_row + case.d), range(case.b_c)
    else:
        first_col = 0 if rank == 0 else case.b_c - case.d
        rows, cols = range(case.b_r), range(first_col, first_col + case.d)
    return {other + (i * case.b_c + j) * WORD_BYTES for i in rows for j in cols}


CASES = [tr.Case(k, r, c, d) for k, r, c, d in (
    ("cols", 40, 50, 1), ("cols", 40, 50, 3), ("cols", 17, 35, 9), ("cols", 9, 4, 2),
    ("cols", 33, 402, 200), ("rows", 40, 50, 1), ("rows", 41, 13, 7), ("rows", 400, 3, 200))]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mnemonic)
def test_messages_read_the_neighbours_boundary_and_mlt_is_the_lines_read(case: tr.Case) -> None:
    calls = tr.messages(case, PAGE)
    lines = tr.lines_touched(case, LINE, PAGE)
    lay = tr.layout(case, PAGE)
    for rank, call in enumerate(calls):
        s = call.stream()
        loads = s.addresses[s.kinds == 0]
        stores = s.addresses[s.kinds == 1]
        assert set(loads.tolist()) == _source_words(case, rank)
        ghost = lay.ghosts[rank]
        assert set(stores.tolist()) == set(range(ghost, ghost + case.n_bytes, WORD_BYTES))
        assert lines[rank] == len({a // LINE for a in loads.tolist()})
        flushed = {(f.offset_bytes + i * f.stride_words * WORD_BYTES) // LINE
                   for f in tr.flushes(call, LINE) for i in range(f.count)}
        assert {a // LINE for a in loads.tolist()} <= flushed
        assert all(f.end_bytes <= lay.end for f in tr.flushes(call, LINE))
        assert call.end_bytes <= lay.end


def test_plans_flush_the_neighbours_message_or_store_the_own_block() -> None:
    case = tr.Case("cols", 40, 50, 3)
    cold = tr.plans(case, PAGE, LINE, "cold")
    dirty = tr.plans(case, PAGE, LINE, "dirty")
    msgs = tr.messages(case, PAGE)
    for rank in (0, 1):
        assert cold[rank].main == msgs[rank] == dirty[rank].main
        assert cold[rank].setup == (tr.flushes(msgs[1 - rank], LINE),)
        (store,), = dirty[rank].setup
        assert (store.kernel, store.offset_bytes, store.count) == (
            "store", tr.layout(case, PAGE).blocks[rank], case.b_r * case.b_c)


def test_native_copy2d_is_numpys_slice_copy() -> None:
    lib = native_lib("counterd_copy2d")
    buf = bytearray(8 * 4096)
    a = np.frombuffer(buf, dtype=np.uint64)
    a[:] = np.arange(a.size, dtype=np.uint64) * 7 + 1
    src = a[:1000].reshape(40, 25).copy()
    call = CopyCall(dst_offset=8 * 2000, dst_pitch=4, src_offset=8 * 3, src_pitch=25, rows=39,
                    cols=4)
    last = call.run(lib, buffer_address(buf))
    got = a[2000:2000 + 39 * 4].reshape(39, 4)
    want = a[3:3 + 39 * 25].reshape(39, 25)[:, :4]
    assert np.array_equal(got, want) and last == int(want[-1, -1])
    assert np.array_equal(a[:1000].reshape(40, 25), src)  # the source is untouched
    assert call.accesses == 2 * 39 * 4 and call.end_bytes <= len(buf)
    ctypes.memset(buffer_address(buf), 0, 8)  # the buffer stays usable
    with pytest.raises(BadInput):
        CopyCall(0, 2, 8, 2, rows=3, cols=3)  # a row wider than its pitch


@needs_two
def test_a_real_run_times_every_case_and_counts_its_lines(tmp_path: Path) -> None:
    m = host_machine()
    cases = (tr.Case("cols", 200, 300, 1), tr.Case("rows", 60, 300, 4))
    out = tmp_path / "t.json"
    doc = tr.measure(m, cases, out, cfg=tr.QUICK_CONFIG, passes=2, order_seed=1)
    assert doc["complete"] and json.loads(out.read_text())["complete"]
    line = m.geometry.levels[0].line_bytes
    for case, rec in zip(cases, doc["cases"], strict=True):
        assert rec["kind"] == case.kind and rec["n_bytes"] == case.n_bytes
        assert rec["mlt"] == max(tr.lines_touched(case, line, m.page_bytes))
        assert len(rec["pass_times_s"]) == 2 and rec["time_s"] > 0
        assert rec["time_s"] == pytest.approx(float(np.median(rec["pass_times_s"])))
    got = mlt.transfers(doc, "cols")
    assert got.times.size == 1 and got.mlt[0] == 200 and got.narrow.all()


@needs_two
def test_cli_writes_then_refuses_to_overwrite(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.json"
    assert main(["transfer", "--quick", "--cases", "4", "--out", str(out)]) == 0
    assert "8 transfers" in capsys.readouterr().out
    assert len(tr.load(out)["cases"]) == 8
    assert main(["transfer", "--quick", "--cases", "4", "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(BadInput):
        tr.load(tmp_path / "bad.json")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.mnemonic)
def test_mlt_is_what_a_cold_cache_misses_on_the_source(case: tr.Case) -> None:
    """The paper's premise, checked on the project's cache simulator: with the source lines
    flushed (the benchmark's cold state) and the destination already cached, the copy's L1
    misses are its memory lines touched (an L1 large enough that nothing is evicted: MLT
    counts compulsory misses; capacity misses come on top when source and buffer overflow)."""
    from counterd.machine.geometry import Geometry
    from counterd.sim import CacheSim

    geometry = Geometry.from_spec("L1=4M/16/64,L2=16M/16/64")
    for rank, call in enumerate(tr.messages(case, PAGE)):
        ghost = tr.layout(case, PAGE).ghosts[rank]
        sim = CacheSim(geometry)
        # the receiver's buffer was written by its previous exchange: in its cache
        sim.feed(CopyCall(ghost, case.words, ghost, case.words, 1, case.words).stream())
        before = sim.counts()
        sim.feed(call.stream())
        after = sim.counts()
        misses = after.levels[0].misses - before.levels[0].misses
        assert misses == tr.lines_touched(case, LINE, PAGE)[rank]
