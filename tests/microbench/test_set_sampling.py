"""The quick calibration's set sampling (microbench run --quick on a large last level): the
memory patterns' simulated counters from a sample of the last level's sets against the full
simulation, at small scale, and the results saying which counts are estimates."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from counterd.machine.geometry import Geometry
from counterd.machine.views import NodeView
from counterd.sim.sampling import SetSampling
from microbench.catalogue import catalogue
from microbench.counters import clear_cache, simulate_pattern, translation_period
from microbench.patterns import HOST_BANKS, host_machine
from microbench.runner import RunConfig
from microbench.suite import run_suite

# A 2-CPU node with a shared 512 KiB L3 of 512 sets (16 ways); 1 block of 32 sets in 4.
SPEC = "L1=2K/2/64,L2=16K/4/64,L3=512K/16/64"
SAMPLE = SetSampling(3, 4, 32)


def node() -> NodeView:
    g = Geometry.from_spec(SPEC)
    last = dataclasses.replace(g.levels[-1], shared_cpus=(0, 1))
    g = dataclasses.replace(g, levels=(*g.levels[:-1], last))
    return NodeView("2 CPUs", (0, 1), g, HOST_BANKS, "test")


def test_memory_patterns_sampled_against_full() -> None:
    m = node()
    pats = [p for p in catalogue(m, "table1", min_accesses=4096) if p.level in ("L3", "mem")]
    assert {p.mode for p in pats} == {"exclusive", "concurrent"}
    for p in pats:
        clear_cache()
        full = simulate_pattern(p, m.geometry, m.bank_map, warmup=1, page_bytes=m.page_bytes)
        est = simulate_pattern(p, m.geometry, m.bank_map, warmup=1, page_bytes=m.page_bytes,
                               sampling=SAMPLE)
        for f, e in zip(full, est, strict=True):
            accesses = f.counters["loads"] + f.counters["stores"]
            for name, want in f.counters.items():
                if name.startswith("l3_"):  # estimates: within 2% of the accesses
                    assert abs(e.counters[name] - want) <= 0.02 * accesses, (p.mnemonic, name)
                else:  # simulated in full
                    assert e.counters[name] == want, (p.mnemonic, name)
            for got, want in zip(e.lm + e.wb, f.lm + f.wb, strict=True):
                assert abs(got - want) <= 0.02 * accesses, p.mnemonic
    clear_cache()


def test_the_memo_shift_keeps_the_sample() -> None:
    # A shift by the translation period moves every line by whole sample periods.
    g = node().geometry
    period = translation_period(g, HOST_BANKS, 4096, SAMPLE)
    assert period % SAMPLE.period_bytes(g) == 0
    assert period % translation_period(g, HOST_BANKS, 4096) == 0


def test_a_sampled_run_says_so(tmp_path: Path) -> None:
    m = host_machine(node().geometry)
    pats = [p for p in catalogue(m, "table1", procs=[1], min_accesses=4096)
            if p.op == "load" and p.level == "mem"][:1]
    assert pats
    cfg = RunConfig(warmup=1, min_reps=3, max_reps=3, budget_ns=10**8, retries=0)
    doc = run_suite(m, pats, tmp_path / "r.json", suite="table1", cfg=cfg, backend="sim",
                    compute_backend="none", sampling=SAMPLE, quick=True)
    meta = doc["patterns"][0]["sim"]["set_sampling"]
    assert (meta["level"], meta["every"], meta["block_sets"], meta["sampled_sets"]) == \
        (3, 4, 32, 128)
    assert doc["config"]["set_sampling"] == meta
    assert any(n.startswith("set sampling: L3 simulated on 128 of its 512 sets")
               for n in doc["notes"])
    counters = doc["patterns"][0]["processors"][0]["counters"]
    assert counters["l3_misses"]["source"] == "simulated"
    plain = run_suite(m, pats, tmp_path / "p.json", suite="table1", cfg=cfg, backend="sim",
                      compute_backend="none")
    assert "set_sampling" not in plain["patterns"][0]["sim"]
    assert plain["config"]["set_sampling"] is None
