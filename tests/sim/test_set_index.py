"""The set index of a cache level (counterd/machine/geometry.py ``set_index``: modulo, hashed,
sliced) and the shared last level of processors that share no data (CoherentSim ``snoop=False``).

Expected counts are reasoned from the geometry next to each case; the C engine is checked
against the Python engine (the specification) on every index.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np
import pytest

from counterd.data.errors import BadInput
from counterd.machine.geometry import CacheLevel, Geometry, hash_low, mix64, set_index
from counterd.machine.memory import BankMap
from counterd.sim import AddressStream, CacheSim, CoherentSim, StridedStream, native_status

EngineChoice = Literal["python", "native"]
NATIVE_OK, NATIVE_WHY = native_status()
ENGINES = [
    "python",
    pytest.param("native", marks=pytest.mark.skipif(not NATIVE_OK, reason=NATIVE_WHY)),
]
LINE = 64


def _with_index(g: Geometry, index: str, *, shared: tuple[int, ...] = ()) -> Geometry:
    last = dataclasses.replace(g.levels[-1], index=index, shared_cpus=shared or
                               g.levels[-1].shared_cpus)
    return dataclasses.replace(g, levels=(*g.levels[:-1], last))


def test_mix64_is_murmur3_fmix64() -> None:
    # Values of MurmurHash3's fmix64 from its published C code, compiled.
    assert mix64(0) == 0
    assert mix64(1) == 0xB456BCFC34C2CB2C
    assert mix64(12345) == 0x17D2ABFBF90BAEF9


def test_set_index_modes() -> None:
    # 384 sets = 3 x 128: sliced keeps the low 7 bits of the line and hashes the rest to one of
    # 3 slices; hashed spreads every line; modulo is line % sets.
    lv = CacheLevel(2, 384 * 4 * LINE, 4, LINE)
    assert hash_low(lv) == 0
    assert hash_low(dataclasses.replace(lv, index="hashed")) == 1
    sliced = dataclasses.replace(lv, index="sliced")
    assert hash_low(sliced) == 128
    lines = range(0, 128 * 3000, 128)  # a stride of one slice: the same low bits
    sets = {set_index(384, 128, x) for x in lines}
    assert sets == {0, 128, 256}  # one set in each slice, every slice reached
    assert {set_index(384, 0, x) for x in lines} == {0, 128, 256}  # modulo: the same sets
    hashed = {set_index(384, 1, x) for x in lines}
    assert len(hashed) > 300  # a hash reaches (almost) every set
    with pytest.raises(BadInput, match="set index"):
        CacheLevel(2, 384 * 4 * LINE, 4, LINE, index="xor")


@pytest.mark.parametrize("engine", ENGINES)
def test_power_of_two_stride_fits_a_hashed_level_only(engine: EngineChoice) -> None:
    # L2 of 256 sets x 4 ways (1024 lines); 64 lines 256 lines apart: modulo puts them all in
    # set 0 (4 ways: LRU over 64 lines misses every time), a hash spreads them over the sets
    # (64 lines in 256 sets: none gets more than 4 here), so the second pass hits.
    g = Geometry.from_spec("L1=1K/2/64,L2=64K/4/64")
    s = StridedStream(0, 64, 256 * LINE, "load", reps=2)
    counts = {}
    for index in ("modulo", "hashed", "sliced"):
        sim = CacheSim(_with_index(g, index), BankMap(8, 128), engine)
        sim.feed(s)
        counts[index] = sim.counts().levels[1].misses
    assert counts["modulo"] == 128
    assert counts["hashed"] == 64  # cold misses only
    assert counts["sliced"] == 128  # one slice (256 sets, a power of two): modulo's index


def _random_stream(rng: np.random.Generator, n: int, span: int, base: int = 0) -> AddressStream:
    addr = (rng.integers(0, span // 8, size=n) * 8).astype(np.uint64) + np.uint64(base)
    kinds = rng.choice(np.array([0, 1, 2], np.uint8), size=n, p=[0.5, 0.3, 0.2])
    return AddressStream(addr, kinds)


@pytest.mark.skipif(not NATIVE_OK, reason=NATIVE_WHY)
@pytest.mark.parametrize("index", ["hashed", "sliced"])
def test_native_equals_python_on_every_index(index: str) -> None:
    g = _with_index(Geometry.from_spec("L1=2K/4/64,L2=24K/6/64,L3=96K/12/64"), index,
                    shared=(0, 1))
    rng = np.random.default_rng(35)
    streams = [_random_stream(rng, 6000, 512 * 1024),
               StridedStream(2**41, 900, 4096, "rmw", reps=3)]
    out = []
    for engine in ("python", "native"):
        sim = CacheSim(g, BankMap(8, 256), engine)  # type: ignore[arg-type]
        sim.feed(streams)
        sim.flush()
        out.append(sim.counts())
    assert out[0] == out[1]
    assert out[0].levels[2].misses > 0 and out[0].levels[2].hits > 0
    coherent = [CoherentSim(g, 2, BankMap(8, 256), e) for e in ("python", "native")]
    for sim in coherent:
        sim.feed([_random_stream(np.random.default_rng(3), 3000, 64 * 1024),
                  _random_stream(np.random.default_rng(4), 3000, 64 * 1024)])
    assert coherent[0].counts() == coherent[1].counts()


@pytest.mark.parametrize("engine", ENGINES)
def test_unsnooped_shared_level_is_exact_for_disjoint_data(engine: EngineChoice) -> None:
    # L3 of 64 sets x 4 ways, shared. Processor 0 sweeps 96 lines at a stride of 2 lines (even
    # sets, 3 lines each), processor 1 the odd lines: in one shared L3 every set holds its 3
    # lines, so the second pass hits; each processor alone with half the ways (split: 2) has
    # 3 lines for 2 ways and misses every time (LRU). Snooping finds nothing on disjoint data,
    # so the unsnooped system counts exactly what the coherent one does.
    g = _with_index(Geometry.from_spec("L1=1K/2/64,L2=2K/2/64,L3=16K/4/64"), "modulo",
                    shared=(0, 1))
    phase = [StridedStream(0, 96, 2 * LINE, "load", reps=2),
             StridedStream(LINE, 96, 2 * LINE, "store", reps=2)]
    bm = BankMap(8, 256)
    snooped, plain = (CoherentSim(g, 2, bm, engine, snoop=s) for s in (True, False))
    for sim in (snooped, plain):
        sim.feed(phase)
    assert plain.counts() == snooped.counts()
    assert [p.levels[2].misses for p in plain.counts()] == [96, 96]  # cold misses only
    split = g.split_shared(2)
    alone = []
    for stream in phase:
        sim = CacheSim(split, bm, engine)
        sim.feed(stream)
        alone.append(sim.counts().levels[2].misses)
    assert alone == [192, 192]
