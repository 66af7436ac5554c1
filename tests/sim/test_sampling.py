"""Set sampling (counterd/sim/sampling.py): the sampled simulation against the full one.

At small scale: a 256 KiB last level of 512 sets, 1 block of 32 sets in 4 simulated (a block
spans 2 KiB, one cycle of the 8 x 256 B banks, so that every bank has its share of the
sample). The levels above the sampled one, the TLB, loads and stores must be exact; the
sampled level's and the memory's counts are estimates, checked against the full simulation.
"""

from __future__ import annotations

import numpy as np
import pytest

from counterd.data.errors import BadInput
from counterd.machine.geometry import Geometry
from counterd.machine.memory import BankMap
from counterd.sim import AddressStream, CacheSim, CoherentSim, StridedStream, native_status
from counterd.sim.counts import ProcessorCounts
from counterd.sim.sampling import SetSampling, estimate, for_large_last_level

NATIVE_OK, NATIVE_WHY = native_status()
ENGINES = [
    "python",
    pytest.param("native", marks=pytest.mark.skipif(not NATIVE_OK, reason=NATIVE_WHY)),
]
G = Geometry.from_spec("L1=1K/2/64,L2=8K/4/64,L3=256K/8/64")  # L3: 512 sets
BANKS = BankMap(8, 256)
SAMPLE = SetSampling(3, 4, 32)  # sets 0-31, 128-159, ...: 128 of 512
L3 = 256 << 10


def _sweeps() -> dict[str, list[StridedStream | AddressStream]]:
    """Memory patterns as microbench sweeps them (twice the L3, warm-up then measured), at the
    suite's strides of 4 and 32 lines, and a random stream with stores."""
    out: dict[str, list[StridedStream | AddressStream]] = {}
    for kind in ("load", "store", "rmw"):
        for stride in (256, 2048):
            count = 2 * L3 // stride
            out[f"{kind}-{stride}"] = [StridedStream(1 << 20, count, stride, kind, 2)]
    rng = np.random.default_rng(7)
    addr = (rng.integers(0, 4 * L3, size=60_000) & ~7).astype(np.uint64)
    out["random"] = [AddressStream(addr, (rng.random(addr.size) < 0.3).astype(np.uint8))]
    return out


def _run(streams: list[StridedStream | AddressStream], sampling: SetSampling | None,
         engine: str = "python") -> ProcessorCounts:
    sim = CacheSim(G, BANKS, engine, sampling=sampling)  # type: ignore[arg-type]
    sim.feed(streams)
    return sim.counts()


@pytest.mark.skipif(not NATIVE_OK, reason=NATIVE_WHY)
def test_engines_count_the_sample_alike() -> None:
    # The C engine against the Python specification, skipped requests included.
    for name, streams in _sweeps().items():
        assert _run(streams, SAMPLE, "native") == _run(streams, SAMPLE, "python"), name


@pytest.mark.parametrize("engine", ENGINES)
def test_sampled_estimate_against_the_full_simulation(engine: str) -> None:
    for name, streams in _sweeps().items():
        full = _run(streams, None, engine)
        sampled = _run(streams, SAMPLE, engine)
        est = estimate(sampled, SAMPLE, G)
        # Above the sampled level nothing changes.
        assert (est.loads, est.stores, est.dtlb_misses) == (full.loads, full.stores,
                                                            full.dtlb_misses), name
        assert est.levels[:2] == full.levels[:2], name
        assert 0 < sampled.levels[2].skipped < full.levels[2].hits + full.levels[2].misses
        # The sampled level and memory: estimates (exact on these uniform sweeps but for the
        # sweep's ends; the random stream within a few percent).
        tol = 0.05 if name == "random" else 0.01
        lv, fl = est.levels[2], full.levels[2]
        for field in ("hits", "misses", "wb_hits", "wb_misses", "writebacks"):
            scale = max(1, fl.hits + fl.misses + fl.wb_hits + fl.wb_misses)
            assert abs(getattr(lv, field) - getattr(fl, field)) <= tol * scale, (name, field)
        total = max(1, sum(full.banks.lm) + sum(full.banks.wb))
        for got, want in zip(est.banks.lm + est.banks.wb, full.banks.lm + full.banks.wb,
                             strict=True):
            assert abs(got - want) <= tol * total, name
        assert est.levels[2].skipped == est.levels[2].wb_skipped == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_superstep_is_estimated_from_its_own_difference(engine: str) -> None:
    # microbench differences two snapshots around the measured sweep and then scales: the
    # result matches the full simulation's difference.
    def measured(sampling: SetSampling | None) -> ProcessorCounts:
        sim = CacheSim(G, BANKS, engine, sampling=sampling)  # type: ignore[arg-type]
        sim.feed(StridedStream(0, 2 * L3 // 512, 512, "store"))
        before = sim.counts()
        sim.feed(StridedStream(0, 2 * L3 // 512, 512, "store"))
        return estimate(sim.counts() - before, sampling, G)

    full, est = measured(None), measured(SAMPLE)
    assert est.levels[2].total_misses == full.levels[2].total_misses == 2 * L3 // 512
    assert est.levels[2].writebacks == full.levels[2].writebacks
    assert est.banks == full.banks


@pytest.mark.parametrize("engine", ENGINES)
def test_a_coherent_system_samples_its_shared_level(engine: str) -> None:
    shared = Geometry.from_spec("L1=1K/2/64,L2=8K/4/64,L3=256K/8/64")
    last = shared.levels[-1].__class__(3, L3, 8, 64, shared_cpus=(0, 1))
    shared = shared.__class__(levels=(*shared.levels[:2], last), source="test")
    s = StridedStream(0, 2 * L3 // 256, 256, "store", 2)
    counts = {}
    for sampling in (None, SAMPLE):
        csim = CoherentSim(shared, 2, BANKS, engine, sampling=sampling)  # type: ignore[arg-type]
        csim.feed([s, s])
        counts[sampling] = [estimate(c, sampling, shared) for c in csim.counts()]
    for full, est in zip(counts[None], counts[SAMPLE], strict=True):
        assert est.levels[:2] == full.levels[:2]
        assert est.coherence_misses == full.coherence_misses
        assert abs(est.levels[2].total_misses - full.levels[2].total_misses) <= \
            0.01 * max(1, full.levels[2].total_misses + full.levels[2].hits)


def test_a_block_short_of_a_bank_cycle_misses_banks() -> None:
    # Why blocks span whole bank cycles: 16 sets of 64 B reach 4 of the 8 banks only, and the
    # estimate would put every other bank's misses on them.
    streams = _sweeps()["load-256"]
    half = SetSampling(3, 4, 16)
    est = estimate(_run(streams, half), half, G)
    assert est.banks.lm[4:] == (0, 0, 0, 0) and min(_run(streams, None).banks.lm) > 0


def test_no_sample_is_the_full_simulation() -> None:
    streams = _sweeps()["store-256"]
    assert _run(streams, SetSampling(3, 1, 16)) == _run(streams, None)
    assert estimate(_run(streams, None), None, G) == _run(streams, None)


def test_which_levels_are_sampled() -> None:
    assert for_large_last_level(Geometry.from_spec("L1=48K/12/64,L2=2M/16/64,L3=32M/16/64")) \
        is None
    s = for_large_last_level(Geometry.from_spec("L1=48K/12/64,L2=2M/16/64,L3=300M/20/64"))
    assert s is not None and s.level == 3
    meta = s.to_json(Geometry.from_spec("L1=48K/12/64,L2=2M/16/64,L3=300M/20/64"))
    assert meta["sets"] == 245760 and meta["sampled_sets"] == 4 * 4096
    assert "set sampling" in meta["method"]
    with pytest.raises(BadInput, match="no such level"):
        CacheSim(Geometry.from_spec("L1=1K/2/64"), BANKS, sampling=SAMPLE)
    with pytest.raises(BadInput):
        SetSampling(3, 0, 16)
