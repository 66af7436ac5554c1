"""Tests of the sim backend (counterd/sim/engines.py, counterd/_native/cachesim.c).

Expected numbers are counted by hand from the geometry (brute-force reasoning written next to
each case), checked against the independent simulator pycachesim, or taken from seed 004's
Table 1; the C engine is checked against the Python engine, which is the specification.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from counterd.backends.base import Backend, CounterGroup, Reading
from counterd.backends.sim import SimBackend
from counterd.data.errors import BadInput, UnknownCounter
from counterd.data.events import Source
from counterd.machine.geometry import SGI_POWER_CHALLENGE, Geometry, parse_size
from counterd.machine.memory import SGI_BANKS, BankMap
from counterd.machine.sysfs import read, read_levels
from counterd.sim import (
    AddressStream,
    CacheSim,
    CoherentSim,
    StridedStream,
    native_status,
    simulate,
)

EngineChoice = Literal["auto", "native", "python"]
NATIVE_OK, NATIVE_WHY = native_status()
ENGINES = [
    "python",
    pytest.param("native", marks=pytest.mark.skipif(not NATIVE_OK, reason=NATIVE_WHY)),
]

# This host's L1d/L2 (sysfs), given explicitly so the tests do not depend on the machine.
HOSTLIKE = Geometry.from_spec("L1=48K/12/64,L2=2M/16/64")
KiB = 1024
MiB = 1024 * KiB


def run(geometry: Geometry, *streams: StridedStream | AddressStream, engine: str = "python",
        flush: bool = False, bankmap: BankMap = SGI_BANKS):
    sim = CacheSim(geometry, bankmap, engine)  # type: ignore[arg-type]
    sim.feed(streams)
    if flush:
        sim.flush()
    assert sim.engine_name == engine
    return sim.counts()


# ------------------------------------------------------------------------------------ geometry


def test_parse_size() -> None:
    assert parse_size("48K") == 48 * KiB
    assert parse_size("307200K\n") == 300 * MiB
    assert parse_size("1M") == MiB
    assert parse_size("128") == 128
    with pytest.raises(BadInput):
        parse_size("12Q")


def test_sgi_spec_with_growing_lines() -> None:
    g = SGI_POWER_CHALLENGE
    assert [(lv.size_bytes, lv.ways, lv.line_bytes, lv.sets) for lv in g.levels] == [
        (32 * KiB, 2, 32, 512), (MiB, 2, 128, 4096)]
    assert "Predicting performance on SMPs" in g.source and "DTLB not in sysfs" in g.source
    assert Geometry.from_spec(g.spec()).levels == g.levels


def test_spec_errors_name_the_fix() -> None:
    with pytest.raises(BadInput, match="L1=32K/2/32"):
        Geometry.from_spec("L1=32K/2")
    with pytest.raises(BadInput, match="smaller than"):
        Geometry.from_spec("L1=32K/2/128,L2=1M/2/64")
    with pytest.raises(BadInput, match="power of two"):
        Geometry.from_spec("L1=30K/2/48")
    g = dataclasses.replace(HOSTLIKE, tlb_entries=1536, tlb_ways=12)
    assert g.tlb_sets == 128


def _write_index(root: Path, i: int, **files: str) -> None:
    d = root / "devices/system/cpu/cpu0/cache" / f"index{i}"
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")


def test_from_sysfs_reads_data_and_unified_levels(tmp_path: Path) -> None:
    # This host's sysfs, copied: the instruction cache must be skipped, the L3 has a
    # non-power-of-two number of sets and is shared by cpus 0-1.
    rows = [("1", "Data", "48K", "12", "64", "0"), ("1", "Instruction", "32K", "8", "64", "0"),
            ("2", "Unified", "2048K", "16", "64", "0"),
            ("3", "Unified", "307200K", "20", "64", "0-1")]
    for i, (level, kind, size, ways, line, shared) in enumerate(rows):
        _write_index(tmp_path, i, level=level, type=kind, size=size, ways_of_associativity=ways,
                     coherency_line_size=line, shared_cpu_list=shared)
    g = read(tmp_path, tmp_path).geometry
    assert [(lv.level, lv.size_bytes, lv.ways, lv.line_bytes, lv.sets, lv.shared_cpus)
            for lv in g.levels] == [(1, 48 * KiB, 12, 64, 64, (0,)),
                                    (2, 2 * MiB, 16, 64, 2048, (0,)),
                                    (3, 300 * MiB, 20, 64, 245760, (0, 1))]
    assert "DTLB not in sysfs" in g.source and (g.tlb_entries, g.page_bytes) == (64, 4096)
    split = g.split_shared(2)
    assert [lv.ways for lv in split.levels] == [12, 16, 10]
    assert split.levels[2].sets == 245760


def test_unreadable_sysfs_is_a_typed_error_with_a_fix(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="Geometry.from_spec"):
        read_levels(tmp_path)
    _write_index(tmp_path, 0, level="1", type="Data", size="lots")
    with pytest.raises(BadInput, match="index0"):
        read_levels(tmp_path)
    g = read(tmp_path, tmp_path).geometry  # the machine's documented fallback never raises
    assert g.source.startswith("fallback") and "sysfs failed" in g.source
    assert SimBackend(g).available().available


# ----------------------------------------------------------------------------- streams, banks


def test_kernel_stream_matches_kernels_c() -> None:
    # counterd_store_stride(base, n=5, stride_words=3, reps=2): base[i*3] for uint64_t words.
    s = StridedStream.from_kernel("counterd_store_stride", 5, 3, 2, base=0x1000)
    assert (s.kind, s.stride_bytes, s.elem_bytes, len(s)) == ("store", 24, 8, 10)
    assert s.addresses().tolist() == [0x1000 + 24 * i for i in range(5)] * 2
    assert StridedStream.from_kernel("rmw_stride", 1, 1, 1, 0).kind == "rmw"
    with pytest.raises(BadInput, match="load_stride"):
        StridedStream.from_kernel("copy", 1, 1, 1, 0)
    with pytest.raises(BadInput, match="64-bit"):
        StridedStream(2**64 - 8, 2, 8)


def test_bankmap() -> None:
    bm = BankMap(8, 128)
    assert [bm.bank(a) for a in (0, 127, 128, 1023, 1024, 5 * 128)] == [0, 0, 1, 7, 0, 5]
    assert bm.banks_of(np.array([0, 128, 2**63], np.uint64)).tolist() == [0, 1, 0]


# --------------------------------------------------------------------------- hand-counted


@pytest.mark.parametrize("engine", ENGINES)
def test_l1_sized_array_stride_1_two_passes(engine: str) -> None:
    # 48 KiB / 8 B = 6144 words; 48 KiB / 64 B = 768 lines, 12 per set in 64 sets: fits exactly.
    words = 48 * KiB // 8
    c1 = run(HOSTLIKE, StridedStream(0x10000, words, 8, "load"), engine=engine)
    assert (c1.levels[0].misses, c1.levels[1].misses) == (768, 768)
    c2 = run(HOSTLIKE, StridedStream(0x10000, words, 8, "load", reps=2), engine=engine)
    assert c2.loads == 2 * words
    assert c2.levels[0].misses == 768  # second pass: no L1 miss at all
    assert c2.levels[0].hits == 2 * words - 768
    assert c2.levels[0].writebacks == 0 and c2.banks.wb == (0,) * 8


@pytest.mark.parametrize("engine", ENGINES)
def test_line_stride_over_twice_l2_misses_everywhere(engine: str) -> None:
    # 4 MiB / 64 B = 65536 lines, cyclic over twice the L2 with LRU: every access misses both.
    n = 4 * MiB // 64
    c = run(HOSTLIKE, StridedStream(0, n, 64, "load", reps=2), engine=engine)
    assert c.levels[0].misses == c.levels[1].misses == 2 * n
    assert c.levels[0].hits == c.levels[1].hits == 0
    assert sum(c.banks.lm) == 2 * n  # every L2 miss is served by memory


@pytest.mark.parametrize("engine", ENGINES)
def test_stores_over_twice_l1_write_back_what_they_evict(engine: str) -> None:
    g = Geometry.from_spec("L1=32K/8/64,L2=1M/16/64")  # L1: 512 lines; L2 holds everything
    n = 64 * KiB // 8  # 8192 words = 1024 lines, each stored to
    c = run(g, StridedStream(0, n, 8, "store"), engine=engine)
    assert c.stores == n and c.loads == 0
    assert c.levels[0].misses == 1024
    # The first 512 lines are evicted dirty by the second 512; the last 512 stay in L1, dirty.
    assert c.levels[0].writebacks == 512
    assert (c.levels[1].wb_hits, c.levels[1].wb_misses) == (512, 0)
    assert c.levels[1].writebacks == 0 and c.banks.wb == (0,) * 8
    f = run(g, StridedStream(0, n, 8, "store"), engine=engine, flush=True)
    assert f.levels[0].writebacks == 1024  # + the 512 still dirty in L1
    assert f.levels[1].writebacks == 1024  # L2 then writes every line it holds dirty to memory
    assert f.banks.wb == (128,) * 8  # 1024 lines of 64 B over 8 banks of 128 B: 2 lines each


@pytest.mark.parametrize("engine", ENGINES)
def test_stores_with_line_size_growing_sgi(engine: str) -> None:
    # SGI: 32 B L1 lines (1024 lines in 32 KiB), 128 B L2 lines. Stores over 64 KiB:
    # 2048 L1 misses; 2048 - 1024 = 1024 L1 lines evicted dirty; 64 KiB / 128 B = 512 L2 misses.
    c = run(SGI_POWER_CHALLENGE, StridedStream(0, 64 * KiB // 8, 8, "store"), engine=engine)
    assert c.levels[0].misses == 2048
    assert c.levels[0].writebacks == 1024
    assert c.levels[1].misses == 512 and c.levels[1].wb_misses == 0
    assert c.banks.lm == (64,) * 8


@pytest.mark.parametrize("engine", ENGINES)
def test_direct_mapped_conflict(engine: str) -> None:
    dm = Geometry.from_spec("L1=1K/1/64,L2=64K/4/64")  # 16 sets of one way
    a, b = 0x4000, 0x4000 + 1 * KiB  # same set, different lines
    ping_pong = AddressStream.of([a, b] * 50, "load")
    c = run(dm, ping_pong, engine=engine)
    assert c.levels[0].misses == 100 and c.levels[0].hits == 0
    assert c.levels[1].misses == 2  # L2 keeps both
    two_way = Geometry.from_spec("L1=1K/2/64,L2=64K/4/64")
    assert run(two_way, ping_pong, engine=engine).levels[0].misses == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_dtlb_misses_page_stride(engine: str) -> None:
    # Default DTLB: 64 entries, 4-way (16 sets). 128 consecutive pages put 8 pages in each set,
    # cycled in order through 4 ways: LRU misses every time.
    c = run(HOSTLIKE, StridedStream(0, 128, 4096, "load", reps=2), engine=engine)
    assert c.dtlb_misses == 256
    c = run(HOSTLIKE, StridedStream(0, 64, 4096, "load", reps=3), engine=engine)
    assert c.dtlb_misses == 64  # fits: only the cold misses


@pytest.mark.parametrize("engine", ENGINES)
def test_rmw_is_a_load_then_a_store(engine: str) -> None:
    g = Geometry.from_spec("L1=32K/8/64,L2=1M/16/64")
    c = run(g, StridedStream.from_kernel("rmw_stride", 8192, 1, 1, 0), engine=engine)
    assert (c.loads, c.stores) == (8192, 8192)
    assert c.levels[0].misses == 1024 and c.levels[0].writebacks == 512
    assert c.levels[0].hits == 2 * 8192 - 1024


@pytest.mark.parametrize("engine", ENGINES)
def test_addresses_are_not_truncated_to_32_bits(engine: str) -> None:
    g = Geometry.from_spec("L1=1K/2/64,L2=8K/2/64")
    a = 0x40
    c = run(g, AddressStream.of([a, a + 2**32, a, a + 2**32], "load"), engine=engine)
    assert c.levels[0].misses == 2  # two distinct lines (pycachesim 0.3.1 would see one)
    # A stream far above 4 GiB counts exactly like the same stream near 0 (bases aligned to
    # every set and bank period).
    s = StridedStream(0, 3000, 200, "store", reps=2)
    high = dataclasses.replace(s, base=2**63 + 2**40)
    assert run(g, high, engine=engine) == run(g, s, engine=engine)


# ------------------------------------------------------------------- C engine == Python engine


def _random_stream(rng: np.random.Generator, n: int, span: int, base: int = 0) -> AddressStream:
    # Word-aligned addresses concentrated on a few hot regions so that there are hits,
    # conflicts, dirty evictions and writebacks that miss below.
    hot = rng.integers(0, span // 8, size=n) * 8
    near = (rng.integers(0, 64, size=n) * 8 + (hot // 4096) * 4096) % span
    addr = np.where(rng.random(n) < 0.5, hot, near).astype(np.uint64) + np.uint64(base)
    kinds = rng.choice(np.array([0, 1, 2], np.uint8), size=n, p=[0.5, 0.3, 0.2])
    return AddressStream(addr, kinds)


GEOMETRIES = [
    Geometry.from_spec("L1=4K/2/32,L2=32K/4/64,L3=256K/8/128,tlb=16/4"),
    Geometry.from_spec("L1=1K/1/64,L2=12K/3/64"),  # direct-mapped, non-power-of-two sets
    Geometry.from_spec("L1=2K/4/64,L2=24K/6/64,L3=96K/12/128,tlb=8/8,page=8K"),
    SGI_POWER_CHALLENGE,
]


@pytest.mark.skipif(not NATIVE_OK, reason=NATIVE_WHY)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: g.spec())
def test_native_equals_python_on_random_streams(geometry: Geometry) -> None:
    rng = np.random.default_rng(20240611)
    streams = [_random_stream(rng, 20000, 512 * KiB),
               _random_stream(rng, 5000, 4 * MiB, base=2**45)]  # second one on warm caches
    bm = BankMap(8, 128)
    py = run(geometry, *streams, engine="python", flush=True, bankmap=bm)
    c = run(geometry, *streams, engine="native", flush=True, bankmap=bm)
    assert c == py
    # The streams really exercise every path.
    assert all(lv.writebacks and lv.misses for lv in py.levels)
    assert py.dtlb_misses > 0
    # Writebacks that miss below need a line to outlive its copy in the next level; the
    # direct-mapped L1 (16 lines) never holds one that long on this stream.
    assert sum(lv.wb_misses for lv in py.levels) > 0 or geometry.levels[0].ways == 1
    assert sum(py.banks.wb) > 0 and sum(py.banks.lm) > 0


@pytest.mark.skipif(not NATIVE_OK, reason=NATIVE_WHY)
@pytest.mark.parametrize("kind", ["load", "store", "rmw"])
@pytest.mark.parametrize("stride_words", [1, 3, 8, 32, 256])
def test_native_equals_python_on_strided_streams(kind: str, stride_words: int) -> None:
    g = GEOMETRIES[0]
    s = StridedStream(0x7000_0000_1000, 1500, stride_words * 8, kind, reps=3)  # type: ignore[arg-type]
    py = run(g, s, engine="python", flush=True)
    assert run(g, s, engine="native", flush=True) == py
    assert run(g, s.expand(), engine="native", flush=True) == py  # general-form path too


# ------------------------------------------------------------------------ pycachesim cross-check


def _pycachesim_counts(geometry: Geometry, stream: AddressStream) -> list[dict[str, int]]:
    cachesim = pytest.importorskip("cachesim")
    mem = cachesim.MainMemory()
    below = None
    caches: list[object] = []
    for lv in reversed(geometry.levels):  # pycachesim builds from the last level up
        c = cachesim.Cache(f"L{lv.level}", lv.sets, lv.ways, lv.line_bytes, "LRU",
                           write_back=True, write_allocate=True,
                           store_to=below, load_from=below)
        if below is None:
            mem.load_to(c)
            mem.store_from(c)
        caches.insert(0, c)
        below = c
    sim = cachesim.CacheSimulator(caches[0], mem)
    for addr, kind in zip(stream.addresses.tolist(), stream.kinds.tolist(), strict=True):
        if kind != 1:
            sim.load(addr, length=8)
        if kind != 0:
            sim.store(addr, length=8)
    return [s for s in sim.stats() if s["name"] != "MEM"]


@pytest.mark.parametrize("geometry", GEOMETRIES[:3], ids=lambda g: g.spec())
def test_cross_check_with_pycachesim(geometry: Geometry) -> None:
    # pycachesim semantics (read in its backend.c): a load miss fetches from below and then
    # inserts, writing a dirty victim into the level below; a store miss allocates through a
    # load; a writeback that misses below allocates there through a load (counted as a MISS)
    # and one that hits marks the line dirty without reordering LRU. All as here, so MISS and
    # EVICT (dirty evictions) must match exactly.
    # One difference: a store that HITS does not refresh LRU in pycachesim, but does here (a
    # store is a use). The stream therefore stores only right after loading the same word
    # (rmw: the line is already most recent) or into the line it is sequentially filling
    # (a streaming store sweep, same argument), where both policies give the same order.
    # Offsets stay below 4 GiB: the installed pycachesim truncates addresses to 32 bits.
    rng = np.random.default_rng(7)
    rand = _random_stream(rng, 15000, 256 * KiB)
    kinds = np.where(rand.kinds == 1, np.uint8(2), rand.kinds)  # plain stores -> rmw
    sweep = StridedStream(3 * MiB, 20000, 8, "store").expand()
    stream = AddressStream(np.concatenate([rand.addresses, sweep.addresses]),
                           np.concatenate([kinds, sweep.kinds]))
    ours = run(geometry, stream, engine="python")
    theirs = _pycachesim_counts(geometry, stream)
    for mine, other in zip(ours.levels, theirs, strict=True):
        assert mine.total_misses == other["MISS_count"], other["name"]
        assert mine.writebacks == other["EVICT_count"], other["name"]
        if mine.level > 1:
            # Below L1 both count demand fills that hit; at L1 pycachesim counts only load
            # hits (its stores never count as HITs), so L1 hits are not comparable.
            assert mine.hits == other["HIT_count"], other["name"]
    assert ours.levels[0].writebacks > 0 and ours.levels[-1].writebacks > 0
    if NATIVE_OK:
        assert run(geometry, stream, engine="native") == ours


# ------------------------------------------------------------------------ seed 004, Table 1

# Seed 004 section 2: "Cache line size is 32 B (8 words) for L1 and 128 (32 words) for L2", so
# the paper's word is 4 bytes, not the 8 bytes of our kernels (and not 8 as the task brief
# assumed). Derivation with 8 banks interleaved on 128 B: a stride of 32 words = 128 B moves to
# the next bank on every access -> all 8 banks; 64 words = 256 B -> every other bank
# {0,2,4,6}; 128 words = 512 B -> {0,4}; 256 words = 1 KiB = 8 x 128 B -> bank 0 only. With
# 8-byte words the s32 row would touch {0,2,4,6}, contradicting Table 1's "All", so the table
# (and the text "stride 32*i ... reach 8/i memory banks") confirm 4-byte words. Processors
# other than P0 start their sub-arrays at base offsets of k x 128 B (seed: "different base
# addresses are used in combination with a given stride to direct accesses to the desired
# banks"); the offsets below are read off the table's first bank of each processor.
PAPER_WORD_BYTES = 4
ALL = set(range(8))
# mnemonic: banks touched by each processor, transcribed from Table 1
TABLE1: dict[str, list[set[int]]] = {
    "p1.s32.b1/8": [ALL],
    "p1.s64.b1/4": [{0, 2, 4, 6}],
    "p1.s128.b1/2": [{0, 4}],
    "p1.s256.b1": [{0}],
    "p2.s64.b1/4": [{0, 2, 4, 6}, {1, 3, 5, 7}],
    "p2.s128.b1/2": [{0, 4}, {2, 6}],
    "p2.s256.b2": [{0}, {0}],
    "p4.s128.b1/2": [{0, 4}, {1, 5}, {2, 6}, {3, 7}],
    "p4.s256.b1": [{0}, {2}, {4}, {6}],
    "p8.s256.b1": [{b} for b in range(8)],
    "p8.s128.b2": [{0, 4}, {2, 6}] * 4,
    "p8.s256.b8": [{0}] * 8,
}


@pytest.mark.parametrize("mnemonic", list(TABLE1))
def test_table1_bank_sets(mnemonic: str) -> None:
    procs, stride_words, bkc = mnemonic.split(".")
    p, stride = int(procs[1:]), int(stride_words[1:]) * PAPER_WORD_BYTES
    expected = TABLE1[mnemonic]
    l2 = SGI_POWER_CHALLENGE.levels[-1].size_bytes
    # Each processor: its own sub-array of 2 x size(L2), started min(bank) x 128 B into a
    # region aligned to 8 banks x 128 B, so that "all accesses generate L1 and L2 misses".
    streams = [StridedStream(k * 4 * l2 + min(banks) * 128, 2 * l2 // stride, stride, "load")
               for k, banks in enumerate(expected)]
    engine: EngineChoice = "native" if NATIVE_OK else "python"
    result = simulate(streams, SGI_POWER_CHALLENGE, SGI_BANKS, engine=engine)
    assert len(result.processors) == p
    for proc, banks, s in zip(result.processors, expected, streams, strict=True):
        assert proc.banks.touched() == banks
        assert proc.levels[0].misses == proc.levels[1].misses == s.count
    # BKC = active processors / distinct banks accessed (seed 004 section 3)
    num, _, den = bkc[1:].partition("/")
    assert p / len(result.banks.touched()) == pytest.approx(int(num) / int(den or 1))


def test_simulate_has_no_coherence_and_splits_shared_levels() -> None:
    g = Geometry.from_spec("L1=4K/4/64,L2=64K/8/64")
    g = dataclasses.replace(g, levels=(g.levels[0], dataclasses.replace(
        g.levels[1], shared_cpus=(0, 1))))
    same = StridedStream(0, 4096, 8, "store", reps=2)  # 32 KiB, both processors, same lines
    r = simulate([same, same], g, engine="python")
    # Private caches, no invalidations: each processor misses only on its own cold lines.
    assert [p.levels[0].misses for p in r.processors] == [512 + 512, 512 + 512]
    assert [p.levels[1].misses for p in r.processors] == [512, 512]
    assert r.banks.lm == tuple(2 * x for x in r.processors[0].banks.lm)
    # split: each gets 4 of the 8 L2 ways (32 KiB): the 32 KiB array still fits exactly.
    s = simulate([same, same], g, engine="python", shared="split")
    assert s.geometry.levels[1].ways == 4 and s.processors[0].levels[1].misses == 512
    big = StridedStream(0, 6144, 8, "load", reps=2)  # 48 KiB: fits 64 KiB, not 32 KiB
    assert simulate([big], g, engine="python").processors[0].levels[1].misses == 768
    assert simulate([big, big], g, shared="split").processors[0].levels[1].misses == 1536


# --------------------------------------------------------------------------------- backend


def test_backend_capability() -> None:
    b = SimBackend(SGI_POWER_CHALLENGE)
    assert isinstance(b, Backend)
    cap = b.available()
    assert cap.available and b.source is Source.SIMULATED and b.name == "sim"
    assert ("native" if NATIVE_OK else "python") in cap.reason
    assert "Predicting performance on SMPs" in cap.reason
    for name in ("loads", "stores", "l1d_misses", "l2_misses", "l1d_writebacks",
                 "l2_writebacks", "dtlb_misses"):
        assert cap.supports(name), name
    for name in ("cycles", "instructions", "task_clock_ns", "page_faults"):
        assert cap.counters[name] == "simulation counts memory accesses, not time or instructions"
    assert not cap.supports("l3_misses")  # two-level geometry
    assert SimBackend(HOSTLIKE, engine="python").available().reason.count("python") == 1


def test_group_feed_read_close() -> None:
    b = SimBackend(Geometry.from_spec("L1=32K/8/64,L2=1M/16/64"))
    group = b.open(["loads", "stores", "l1d_misses", "l1d_writebacks", "l3_misses", "cycles"])
    assert isinstance(group, CounterGroup)
    before = group.read()
    group.feed(StridedStream.from_kernel("store_stride", 8192, 1, 1, base=0))
    r = group.read()
    assert isinstance(r, Reading)
    assert all(v.source is Source.SIMULATED and v.ratio == 1.0 for v in r.values.values())
    assert r.values["stores"].value == 8192 and r.values["loads"].value == 0
    assert (r.values["l1d_misses"].value, r.values["l1d_writebacks"].value) == (1024, 512)
    assert r.unsupported == {"cycles": "simulation counts memory accesses, not time or "
                             "instructions", "l3_misses": "the simulated geometry has no L3"}
    # Warm caches: L1 holds the last 512 lines stored (dirty). Loading them again misses
    # nothing; loading the first 512 then misses on each and evicts the dirty ones.
    group.feed([StridedStream(32 * KiB, 4096, 8, "load")])
    r2 = group.read()
    d = r2.delta(r)
    assert (d["loads"].value, d["l1d_misses"].value, d["l1d_writebacks"].value) == (4096, 0, 0)
    group.feed(StridedStream(0, 4096, 8, "load"))
    d = group.read().delta(r2)
    assert (d["l1d_misses"].value, d["l1d_writebacks"].value) == (512, 512)
    assert r.delta(before)["l1d_misses"].value == 1024
    assert sum(group.bank_counts().lm) == 1024  # cold L2: every line from memory
    group.close()
    with pytest.raises(BadInput, match="closed"):
        group.read()
    with pytest.raises(UnknownCounter):
        b.open(["l1_misses"])


def test_a_reading_is_built_again_only_after_a_feed_or_a_flush() -> None:
    """Two reads with nothing fed between (an empty superstep's markers) give the same
    reading without building the counts again; a feed or a flush (the dirty lines written
    back) changes what the next read says."""
    group = SimBackend(Geometry.from_spec("L1=32K/8/64,L2=1M/16/64")).open(
        ["stores", "l1d_writebacks"])
    first = group.read()
    assert group.read() is first
    group.feed(StridedStream(0, 64, 64, "store"))
    fed = group.read()
    assert fed is not first and fed.delta(first)["stores"].value == 64
    assert group.read() is fed
    group.flush()
    flushed = group.read()
    assert flushed.delta(fed)["l1d_writebacks"].value == 64


# ------------------------------------------------------------------------------- coherence

# Two private levels, and an L3 that sysfs says both CPUs share (one cache when coherent).
_C = Geometry.from_spec("L1=4K/4/64,L2=32K/8/64,L3=256K/16/64")
COHERENT = dataclasses.replace(_C, levels=(*_C.levels[:2], dataclasses.replace(
    _C.levels[2], shared_cpus=(0, 1))))


def test_private_levels_from_shared_cpus() -> None:
    assert COHERENT.private_levels == 2
    assert HOSTLIKE.private_levels == 2  # shared_cpus unknown: private
    assert dataclasses.replace(COHERENT, levels=tuple(
        dataclasses.replace(lv, shared_cpus=(0, 1)) for lv in COHERENT.levels)
    ).private_levels == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_alternating_stores_to_one_line_miss_every_time(engine: EngineChoice) -> None:
    # chunk 1: P0 st, P1 st, P0 st, ... to the same word, 10 each. By hand: P0's first store is
    # a cold miss (from memory); every later store finds the line dirty in the other's L1,
    # so it misses in L1 and L2 and is served by a transfer: 20 L1 misses, 19 coherence misses.
    one = StridedStream(0, 1, 8, "store", reps=10)
    r = simulate([one, one], COHERENT, engine=engine, coherence=True, chunk=1)
    p0, p1 = r.processors
    assert r.engine == engine
    assert [p.levels[0].misses for p in r.processors] == [10, 10]
    assert [p.levels[1].misses for p in r.processors] == [10, 10]
    assert (p0.coherence_misses, p1.coherence_misses) == (9, 10)
    assert (p0.invalidations, p1.invalidations) == (10, 9)  # by each of the other's stores
    # each transfer takes the dirty data from the other's L1: one writeback there
    assert (p0.levels[0].writebacks, p1.levels[0].writebacks) == (10, 9)
    assert p0.levels[2].misses == 1 and p1.levels[2].misses == 0  # L3 asked once, cold
    assert sum(r.banks.lm) == 1 and sum(r.banks.wb) == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_alternating_line_sweeps_and_chunk(engine: EngineChoice) -> None:
    # 8 lines, 3 sweeps, one store per line, chunk 1: every store misses in L1 (the first
    # sweep of P0 cold), P1's every store and P0's after its first sweep are transfers.
    lines = StridedStream(0, 8, 64, "store", reps=3)
    r = simulate([lines, lines], COHERENT, engine=engine, coherence=True, chunk=1)
    assert [p.levels[0].misses for p in r.processors] == [24, 24]
    assert [p.coherence_misses for p in r.processors] == [16, 24]
    # stride 1 word, chunk 8: a turn is one whole line, so each processor misses once per line
    # per sweep (24 each) instead of once per word (192).
    words = StridedStream(0, 64, 8, "store", reps=3)
    r8 = simulate([words, words], COHERENT, engine=engine, coherence=True, chunk=8)
    assert [p.levels[0].misses for p in r8.processors] == [24, 24]
    r1 = simulate([words, words], COHERENT, engine=engine, coherence=True, chunk=1)
    assert [p.levels[0].misses for p in r1.processors] == [192, 192]
    # without coherence each processor only has its 8 cold misses
    nc = simulate([words, words], COHERENT, engine=engine)
    assert [p.levels[0].misses for p in nc.processors] == [8, 8]


@pytest.mark.parametrize("engine", ENGINES)
def test_load_after_remote_store_is_a_coherence_miss(engine: EngineChoice) -> None:
    sim = CoherentSim(COHERENT, 2, SGI_BANKS, engine)
    x = StridedStream(4096, 1, 8, "store")
    sim.feed([x, None])  # P0 stores X: modified in P0's L1
    sim.feed([None, dataclasses.replace(x, kind="load")])  # P1 loads X
    p0, p1 = sim.counts()
    assert (p1.levels[0].misses, p1.levels[1].misses, p1.coherence_misses) == (1, 1, 1)
    assert p1.levels[2].misses == 0  # a cache-to-cache transfer: L3 not asked
    # P0's copy is now clean: one writeback from its L1, which (M -> S) reaches the L3
    assert p0.levels[0].writebacks == 1 and p0.levels[2].wb_hits == 1
    assert p0.invalidations == p1.invalidations == 0
    sim.feed([dataclasses.replace(x, kind="load"), None])  # shared: P0 still hits
    sim.feed([x, None])  # P0 stores: hits, invalidates P1's clean copy, no writeback
    q0, q1 = sim.counts()
    assert q0.levels[0].misses == p0.levels[0].misses == 1
    assert (q1.invalidations, q1.levels[0].writebacks, q0.coherence_misses) == (1, 0, 0)
    sim.feed([None, dataclasses.replace(x, kind="load")])  # P1 lost it: misses again
    assert sim.counts()[1].coherence_misses == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_disjoint_streams_count_as_without_coherence(engine: EngineChoice) -> None:
    rng = np.random.default_rng(7)
    g = Geometry.from_spec("L1=2K/4/64,L2=16K/4/64,L3=64K/8/64")  # all private (no sharers)
    streams = [_random_stream(rng, 4000, 256 * KiB, base=p * MiB) for p in range(3)]
    coherent = simulate(streams, g, engine=engine, coherence=True, chunk=3, flush=True)
    alone = simulate(streams, g, engine=engine, flush=True)
    assert coherent.processors == alone.processors
    assert all(p.coherence_misses == p.invalidations == 0 for p in coherent.processors)


@pytest.mark.skipif(not NATIVE_OK, reason=NATIVE_WHY)
@pytest.mark.parametrize("chunk", [1, 5, 8])
@pytest.mark.parametrize("geometry", [COHERENT, *GEOMETRIES[:3]], ids=lambda g: g.spec())
def test_native_equals_python_coherent(geometry: Geometry, chunk: int) -> None:
    rng = np.random.default_rng(20240612 + chunk)
    sims = [CoherentSim(geometry, 3, BankMap(8, 128), e, chunk=chunk)  # type: ignore[arg-type]
            for e in ("python", "native")]
    phases = [
        [_random_stream(rng, 3000, 64 * KiB) for _ in range(3)],  # overlapping: sharing
        [StridedStream(0, 700, 24, "rmw", reps=2), None,
         [StridedStream(8, 300, 64, "load"), _random_stream(rng, 500, 32 * KiB)]],
        [_random_stream(rng, 2000, 64 * KiB), _random_stream(rng, 10, 64 * KiB),
         StridedStream(2**40, 500, 8, "store")],
    ]
    for sim in sims:
        for phase in phases:
            sim.feed(phase)
        sim.flush()
    py, c = (s.counts() for s in sims)
    assert c == py
    assert all(p.coherence_misses > 0 and p.invalidations > 0 for p in py)
    assert sum(p.levels[0].writebacks for p in py) > 0


def test_coherent_sim_rejects_bad_input() -> None:
    with pytest.raises(BadInput, match="chunk"):
        CoherentSim(COHERENT, 2, chunk=0)
    with pytest.raises(BadInput, match="one .or None. per processor"):
        CoherentSim(COHERENT, 2, engine="python").feed([None])
