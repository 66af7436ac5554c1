"""A suite that scales with the node (issue 35): processor counts, shared-data patterns kept
to few processors, exclusive processors simulated once per bank, memory spans that the
simulator serves from memory on many processors, and the run-time estimate of
``microbench list``."""

from __future__ import annotations

import dataclasses
import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from counterd.machine.geometry import Geometry
from counterd.machine.views import NodeView
from microbench import probe as probe_mod
from microbench import results
from microbench.catalogue import catalogue
from microbench.cli import main
from microbench.counters import (
    clear_cache,
    plan_key,
    simulate_pattern,
    simulations,
    translation_period,
)
from microbench.estimate import (
    CALLGRIND_BARE,
    CALLGRIND_START,
    CALLGRIND_WORK,
    COMPUTE_REPS,
    FAR_LINES,
    NEAR_LINES,
    PROBE_MEM_BYTES,
    Speeds,
    chunks,
    compute_cost,
    estimate,
    expected_attempts,
    level_keys,
    run_order,
    simulation_cost,
    superstep_s,
    timing_cost,
)
from microbench.patterns import COHERENT_MAX_PROCS, HOST_BANKS, host_machine, paper_machine
from microbench.plans import plans
from microbench.probe import _OtherWork, _spans, probe
from microbench.repetition import NORMAL, QUICK, RunConfig
from microbench.suite import run_suite

SMALL = "L1=8K/4/64,L2=64K/8/64,L3=1M/4/64"  # a 4-way shared L3: 16 processors exceed its ways


def node(cpus: int, spec: str = "L1=48K/12/64,L2=2M/16/64,L3=300M/20/64") -> NodeView:
    """A node of ``cpus`` CPUs whose last level is shared by all of them."""
    g = Geometry.from_spec(spec)
    last = dataclasses.replace(g.levels[-1], shared_cpus=tuple(range(cpus)))
    g = dataclasses.replace(g, levels=(*g.levels[:-1], last))
    return NodeView(f"{cpus} CPUs", tuple(range(cpus)), g, HOST_BANKS, "test")


# -- processor counts ---------------------------------------------------------------------

@pytest.mark.parametrize(("cpus", "want"), [
    (1, (1,)), (2, (1, 2)), (3, (1, 2, 3)), (6, (1, 2, 3, 6)), (8, (1, 2, 4, 8)),
    (16, (1, 2, 4, 8, 16)), (24, (1, 2, 6, 12, 24)), (64, (1, 2, 16, 32, 64)),
    (128, (1, 2, 32, 64, 128)),
])
def test_proc_counts_are_one_two_and_quarters(cpus: int, want: tuple[int, ...]) -> None:
    assert node(cpus).proc_counts() == want


def test_paper_machine_keeps_its_counts() -> None:
    assert paper_machine().proc_counts() == (1, 2, 4, 8)
    assert paper_machine().coherent_counts(limit=8) == (2, 4, 8)


@pytest.mark.parametrize(("cpus", "want"), [(2, (2,)), (3, (2, 3)), (8, (2, 4)), (16, (2, 4)),
                                            (128, (2, 4))])
def test_shared_data_counts_stop_at_the_limit(cpus: int, want: tuple[int, ...]) -> None:
    assert COHERENT_MAX_PROCS == 4
    assert node(cpus).coherent_counts() == want
    assert node(cpus).coherent_counts(limit=2) == (2,)
    assert node(6).coherent_counts(limit=8) == (2, 3, 4, 6)


@pytest.mark.parametrize(("cpus", "limit"), [(2, COHERENT_MAX_PROCS), (4, COHERENT_MAX_PROCS),
                                             (8, 8)])
def test_within_the_limit_every_count_has_both_modes(cpus: int, limit: int) -> None:
    # On 2 CPUs (where the suite was built) and on the paper's 8 with its limit, nothing is
    # left out: every count has exclusive and concurrent patterns and coherence variants.
    pats = catalogue(node(cpus, SMALL), "all", min_accesses=1024, coherent_procs=limit)
    for p in node(cpus).proc_counts():
        modes = {x.mode for x in pats if x.procs == p and x.coherence is None}
        assert modes == ({"exclusive"} if p == 1 else {"exclusive", "concurrent"})
        if p > 1 or cpus > 1:
            assert {x.coherence for x in pats if x.procs == p} >= {"clean", "shared", "dirty"}


def test_128_cpus_keep_what_calibration_needs() -> None:
    m = node(128)
    pats = catalogue(m, "table1", min_accesses=1 << 19)
    assert sorted({p.procs for p in pats}) == [1, 2, 4, 32, 64, 128]
    assert max(p.procs for p in pats if p.mode == "concurrent") == COHERENT_MAX_PROCS
    # F1: one processor, every level, loads and stores.
    one = {(p.level, p.op) for p in pats if p.procs == 1}
    assert one >= {(lv, op) for lv in ("L1", "L2", "L3", "mem") for op in ("load", "store")}
    # F2 and F3: exclusive memory patterns on all 128 processors, at several contentions.
    full = [p for p in pats if p.procs == 128 and p.mode == "exclusive" and p.level == "mem"]
    bkcs = {p.bkc for p in full}
    assert min(bkcs) == Fraction(128, 8) and max(bkcs) == 128 and len(bkcs) >= 4
    assert len(pats) < 3 * len(catalogue(node(16), "table1", min_accesses=1 << 19))


def test_explicit_procs_are_kept_and_shared_data_limited() -> None:
    pats = catalogue(node(128), "table1", procs=[2, 16], min_accesses=1 << 19)
    assert {(p.procs, p.mode) for p in pats} == {(2, "exclusive"), (2, "concurrent"),
                                                 (16, "exclusive")}
    wide = catalogue(node(128), "table1", procs=[16], coherent_procs=16, min_accesses=1 << 19)
    assert {p.mode for p in wide} == {"exclusive", "concurrent"}


def test_memory_supersteps_shrink_where_processors_queue_for_banks() -> None:
    m = node(128)
    pats = catalogue(m, "table1", procs=[8, 128], min_accesses=1 << 19)
    for p in pats:
        if p.level == "mem" and p.procs == 128:  # 16 processors per bank: 16 times fewer
            assert p.count * p.sweeps >= (1 << 19) // 16 > p.count * (p.sweeps - 1)
        else:
            assert p.count * p.sweeps >= 1 << 19 > p.count * (p.sweeps - 1)


# -- memory patterns on more processors than the shared level has ways --------------------

def test_memory_patterns_are_served_from_memory_beyond_the_ways() -> None:
    m = node(16, SMALL)  # 16 exclusive processors share a 4-way L3: the simulator gives 1 way
    pats = [p for p in catalogue(m, "table1", procs=[16], min_accesses=2048)
            if p.level == "mem" and p.mode == "exclusive" and p.op == "load"]
    assert pats
    lines = [lv.line_bytes for lv in m.geometry.levels]
    for p in pats:
        assert p.span_bytes >= 2 * m.geometry.levels[-1].size_bytes // 4 - p.stride_bytes
        sims = simulate_pattern(p, m.geometry, m.bank_map, warmup=1, page_bytes=m.page_bytes)
        assert results.served_level(sims[0].counters, p, lines) == "mem", p.mnemonic


# -- exclusive processors simulated once per bank -----------------------------------------

def test_shifted_plans_simulate_alike() -> None:
    # Every rank of every exclusive pattern: its counts equal those of its plan shifted down
    # to the lowest multiple of the translation period (what plan_key simulates).
    from microbench.counters import _simulate_plan

    m = node(8, SMALL)
    checked = 0
    for p in catalogue(m, "all", min_accesses=1024):
        if p.mode != "exclusive" or p.coherence is not None:
            continue
        g = m.geometry.split_shared(p.procs)
        period = translation_period(g, m.bank_map, m.page_bytes)
        for plan in plans(p, m.page_bytes):
            key = plan_key(plan, period)
            assert key.main is not None and plan.main is not None
            moved = plan.main.offset_bytes - key.main.offset_bytes
            assert moved % period == 0 and key.main.offset_bytes < period + p.span_bytes
            same = dataclasses.replace(plan, slot=0)
            assert (_simulate_plan(same, 1, g, m.bank_map, "auto")
                    == _simulate_plan(key, 1, g, m.bank_map, "auto")), (p.mnemonic, plan.slot)
            checked += 1
    clear_cache()
    assert checked > 300


def test_exclusive_processors_are_simulated_once_per_first_bank() -> None:
    m = node(128)
    pats = catalogue(m, "table1", procs=[128], min_accesses=1 << 19)
    for p in pats:
        fed = simulations(p, m.geometry, m.bank_map, page_bytes=m.page_bytes)
        if p.mode == "exclusive":
            first = {b % (m.bank_map.banks * m.bank_map.interleave_bytes)
                     for b in p.bases_bytes}
            assert len(fed) == len(first) <= m.bank_map.banks
        else:
            assert len(fed) == p.cpus_needed


# -- the estimate ---------------------------------------------------------------------------

def speeds(m: NodeView, *, kernel: float = 1.0, sim: float = 100.0, snoop: float = 0.5,
           disturbed: float = 0.0) -> Speeds:
    """Synthetic per-access times: each level twice the one above it."""
    keys = level_keys(m)
    k = {key: kernel * 2 ** i for i, key in enumerate(keys)}
    s = {key: sim * 2 ** i for i, key in enumerate(keys)}
    far = (2 * s["mem"], 2 * s["mem"])
    return Speeds(k, k, s, s, far, dict.fromkeys(keys, snoop), fault_ns=1000, touch_ns=100,
                  superstep_ns=20_000,
                  pattern_ns=1e6, worker_start_ns=5e6, startup_s=0.5, python_start_s=0.3,
                  compute_quick_s=0.05,
                  compute_full_s=0.5, compute_prepare_s=0.1, disturbed=disturbed)


def test_estimate_uses_the_measured_times() -> None:
    m = node(4, SMALL)
    pats = catalogue(m, "table1", min_accesses=1 << 14)
    base = estimate(pats, m, speeds(m), cfg=QUICK)
    slow = estimate(pats, m, speeds(m).scaled(3.0), cfg=QUICK)
    assert slow.simulation_cpu_s == pytest.approx(3 * base.simulation_cpu_s)
    assert slow.timing_s > base.timing_s and slow.total_s > base.total_s
    # Without the fixed costs, timing is the per-access times times the accesses.
    bare = dataclasses.replace(speeds(m), pattern_ns=0.0, superstep_ns=0.0)
    assert (estimate(pats, m, bare.scaled(3.0), cfg=QUICK).timing_s
            == pytest.approx(3 * estimate(pats, m, bare, cfg=QUICK).timing_s))
    # Exactly the sum of the patterns', and their simulations over chunks of 4 in parallel.
    assert base.timing_s == pytest.approx(sum(c.timing_s for c in base.patterns))
    assert base.simulation_cpu_s / 4 <= base.simulation_s <= base.simulation_cpu_s


def test_estimate_grows_with_accesses_and_repetitions() -> None:
    m = node(4, SMALL)
    sp = speeds(m)
    small = catalogue(m, "table1", min_accesses=1 << 12)
    large = catalogue(m, "table1", min_accesses=1 << 15)
    for a, b in zip(small, large, strict=True):
        assert a.mnemonic == b.mnemonic
        if b.accesses_per_proc > a.accesses_per_proc:
            assert timing_cost(b, m, sp, QUICK)[0] > timing_cost(a, m, sp, QUICK)[0]
            assert simulation_cost(b, m, sp, QUICK) > simulation_cost(a, m, sp, QUICK)
    assert (estimate(large, m, sp, cfg=QUICK).total_s
            > estimate(small, m, sp, cfg=QUICK).total_s)
    more = dataclasses.replace(QUICK, min_reps=10, max_reps=10, budget_ns=10**12)
    assert estimate(small, m, sp, cfg=more).timing_s > estimate(small, m, sp, cfg=QUICK).timing_s
    # The full configuration warms the simulator up once more, and a disturbed host retries.
    assert (estimate(small, m, sp, cfg=NORMAL).simulation_cpu_s
            > estimate(small, m, sp, cfg=QUICK).simulation_cpu_s)
    assert (estimate(small, m, speeds(m, disturbed=1.0), cfg=QUICK).timing_s
            > 2 * estimate(small, m, sp, cfg=QUICK).timing_s)


def test_shared_data_patterns_cost_more_with_processors() -> None:
    m = node(8, SMALL)
    pats = {p.mnemonic: p for p in catalogue(m, "table1", min_accesses=1 << 14,
                                             coherent_procs=8)}
    sp = speeds(m)
    cost = {n: simulation_cost(pats[f"p{n}.s1.b0.LC"], m, sp, QUICK) for n in (2, 4, 8)}
    assert cost[2] < cost[4] < cost[8]
    assert cost[8] / cost[4] > 2  # processors x snooped processors
    assert simulation_cost(pats["p8.s1.b0.LC"], m, speeds(m, snoop=0.0), QUICK) < cost[8]


def test_compute_patterns_by_backend() -> None:
    m = node(2, SMALL)
    pats = catalogue(m, "table1", procs=[1], min_accesses=1 << 12)
    sp = speeds(m)
    by = {b: estimate(pats, m, sp, cfg=QUICK, compute_backend=b, quick=True).compute_s
          for b in ("none", "perf", "callgrind")}
    assert by["none"] == 0 < by["perf"] < by["callgrind"]
    full = estimate(pats, m, sp, cfg=NORMAL, compute_backend="perf").compute_s
    assert full > by["perf"]


def test_callgrind_prices_the_start_and_the_kernels_apart() -> None:
    sp = speeds(node(2, SMALL))
    base = compute_cost("callgrind", True, sp)
    # A second more of a Python's start: the timed run's start, and CALLGRIND_START under
    # callgrind.
    slower_start = dataclasses.replace(sp, python_start_s=sp.python_start_s + 1.0)
    assert compute_cost("callgrind", True, slower_start) - base == pytest.approx(
        1.0 + CALLGRIND_START)
    # A second more of one quick repetition: COMPUTE_REPS of them timed, two counted under
    # callgrind.
    slower = dataclasses.replace(sp, compute_quick_s=sp.compute_quick_s + 1.0)
    want = COMPUTE_REPS + 2 * CALLGRIND_WORK
    assert compute_cost("callgrind", True, slower) - base == pytest.approx(want)
    # A second more of preparing the inputs: once timed, once counted.
    prep = dataclasses.replace(sp, compute_prepare_s=sp.compute_prepare_s + 1.0)
    assert compute_cost("callgrind", True, prep) - base == pytest.approx(1 + CALLGRIND_WORK)
    # The full set at its own repetition time, the start the same.
    assert compute_cost("callgrind", False, sp) > base
    assert CALLGRIND_START > 1 and CALLGRIND_WORK > 1


def test_callgrind_priced_from_valgrind_timed_here() -> None:
    """Where valgrind was timed (a bare Python start under it), the counted run is a fixed
    multiple of that, slowed down by the competing work, and the native start no longer
    matters."""
    sp = dataclasses.replace(speeds(node(2, SMALL)), callgrind_bare_s=2.0)
    timed = compute_cost("perf", True, sp)
    assert compute_cost("callgrind", True, sp, cpus=2) == pytest.approx(
        timed + CALLGRIND_BARE[True] * 2.0)
    assert compute_cost("callgrind", False, sp, cpus=2) == pytest.approx(
        compute_cost("perf", False, sp) + CALLGRIND_BARE[False] * 2.0)
    slower_start = dataclasses.replace(sp, python_start_s=sp.python_start_s + 1.0)
    assert compute_cost("callgrind", True, slower_start, cpus=2) == pytest.approx(
        compute_cost("callgrind", True, sp, cpus=2) + 1.0)  # the timed run's start only
    # Three CPUs' worth of competing work on 2 CPUs: (3 + 1) / 2 = twice as long.
    busy = dataclasses.replace(sp, others=3.0)
    assert compute_cost("callgrind", True, busy, cpus=2) == pytest.approx(
        timed + 2 * CALLGRIND_BARE[True] * 2.0)
    assert CALLGRIND_BARE[False] > CALLGRIND_BARE[True] > 1


def test_callgrind_not_timed_without_valgrind(monkeypatch: pytest.MonkeyPatch) -> None:
    import counterd.backends.callgrind.valgrind as vg

    monkeypatch.setattr(vg, "valgrind_path", lambda: None)
    assert probe_mod._callgrind_bare_s() == 0.0


def test_other_work_leaves_out_niced_work_and_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Competing work over the window: the system's busy time less this process's own, niced
    work left out unless this process is niced too (fed times, no real measurement)."""
    import collections

    T = collections.namedtuple("T", "user nice system idle iowait irq softirq steal")
    clock = iter([100.0, 102.0, 102.0])  # a window of 2 s (one reading per cpus())
    times = iter([T(10, 0, 5, 0, 0, 0, 0, 0), T(13, 4, 6, 0, 0, 0, 0, 0)] * 2)
    own = iter([1.0, 2.0, 1.0, 2.0])  # this process and its children: 1 s in the window
    monkeypatch.setattr(probe_mod.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(probe_mod.psutil, "cpu_times", lambda: next(times))
    monkeypatch.setattr(_OtherWork, "_own", staticmethod(lambda: next(own)))
    monkeypatch.setattr(probe_mod.os, "nice", lambda inc: 0)
    w = _OtherWork()
    # busy user + system: 4 s, less 1 s of our own, over 2 s: 1.5 CPUs; nice's 4 s left out.
    assert w.cpus() == pytest.approx(1.5)
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(probe_mod.os, "nice", lambda inc: 19)
    assert _OtherWork().cpus() == pytest.approx(3.5)  # niced: niced work competes


def test_probe_measures_this_host() -> None:
    m = host_machine(Geometry.from_spec(SMALL))
    sp = probe(m, compute=False)
    assert set(sp.sim_load_ns) == set(level_keys(m)) == {"L1", "L2", "L3", "mem"}
    for table in (sp.kernel_load_ns, sp.kernel_store_ns, sp.sim_load_ns, sp.sim_store_ns):
        assert all(0 < v < 1e6 and math.isfinite(v) for v in table.values())
    assert sp.kernel_far_ns is not None
    assert all(0 < v < 1e6 and math.isfinite(v) for v in sp.kernel_far_ns)
    # The simulator walks every level for a memory access and one for an L1 hit.
    assert sp.sim_load_ns["mem"] > sp.sim_load_ns["L1"]
    assert sp.pattern_ns > 0 and sp.worker_start_ns > 0 and 0 < sp.probe_s < 10
    pats = catalogue(m, "table1", procs=[1], min_accesses=1 << 12)
    assert estimate(pats, m, sp, cfg=QUICK).total_s > 0


def test_run_keeps_its_estimate_and_what_each_step_took(tmp_path: Path) -> None:
    m = host_machine(Geometry.from_spec("L1=4K/4/64,L2=32K/8/64"))
    pats = [p for p in catalogue(m, "table1", procs=[1], min_accesses=4096) if p.op == "load"]
    cfg = RunConfig(warmup=1, min_reps=3, max_reps=4, budget_ns=10**8)
    est = estimate(pats, m, speeds(m), cfg=cfg)
    etas: list[float | None] = []
    doc = run_suite(m, pats, tmp_path / "r.json", suite="table1", cfg=cfg, backend="sim",
                    compute_backend="none", estimate=est,
                    progress=lambda d, t, mn, eta: etas.append(eta))
    assert doc["estimate"]["total_s"] == pytest.approx(est.total_s)
    assert [c["mnemonic"] for c in doc["estimate"]["per_pattern"]] == [p.mnemonic for p in pats]
    assert etas[0] == pytest.approx(est.total_s)
    assert set(doc["phases_s"]) == {"startup", "timing", "simulation", "writing", "compute"}
    assert doc["phases_s"]["timing"] > 0 and doc["phases_s"]["simulation"] > 0
    for rec in doc["patterns"]:
        assert rec["sim"]["seconds"] > 0 and rec["load"]["timed_s"] > 0
    # Run longest simulation first, kept in the order given.
    assert [r["mnemonic"] for r in doc["patterns"]] == [p.mnemonic for p in pats]
    order = run_order(pats, est)
    assert order != pats and sorted(order, key=pats.index) == pats
    sims = {c.mnemonic: c.sim_s for c in est.patterns}
    assert [sims[p.mnemonic] for p in order] == sorted(sims.values(), reverse=True)
    assert run_order(pats, None) == pats


def test_chunks_of_like_simulations_are_shorter() -> None:
    m = node(8, SMALL)
    pats = catalogue(m, "all", min_accesses=1 << 14)
    est = estimate(pats, m, speeds(m), cfg=QUICK)
    in_catalogue_order = sum(max(c.sim_s for c in ch) for ch in chunks(est.patterns, 8))
    assert est.simulation_cpu_s / 8 <= est.simulation_s < in_catalogue_order


# -- microbench list ------------------------------------------------------------------------

def machine_file(tmp_path: Path, cpus: int) -> Path:
    shared = ", ".join(map(str, range(cpus)))
    path = tmp_path / f"node{cpus}.toml"
    path.write_text(f"""format = "counterd-machine"
version = 1

[host]
hostname = "node{cpus}"
cpus_online = {cpus}

[[caches]]
level = 1
size = "8K"
ways = 4
line_bytes = 64

[[caches]]
level = 2
size = "64K"
ways = 8
line_bytes = 64

[[caches]]
level = 3
size = "1M"
ways = 4
line_bytes = 64
shared_cpus = [{shared}]
""")
    return path


def test_list_estimates_a_planned_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    path = machine_file(tmp_path, 128)
    assert main(["list", "--quick", "--machine", str(path), "--compute-backend", "none",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["cpus"] == 128 and doc["quick"] and doc["suite"] == "table1"
    assert max(p["procs"] for p in doc["patterns"]) == 128
    est = doc["estimate"]
    assert est["cpus"] == 128 and est["patterns"] == doc["count"]
    assert est["total_s"] == pytest.approx(sum(est[k] for k in (
        "startup_s", "region_s", "timing_s", "simulation_s", "compute_s")))
    assert doc["speeds"]["disturbed"] == 0  # a planned node: this host's load says nothing
    assert main(["list", "--quick", "--machine", str(path), "--compute-backend", "none",
                 "--procs", "1,2,32,64,128"]) == 0
    out = capsys.readouterr().out
    assert "on node128 (machine file" in out and "128 CPUs" in out
    assert "processors 1, 2, 32, 64, 128" in out
    assert "estimated run time: " in out and "at this host's speed" in out


def test_list_refuses_more_processors_than_the_node(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = machine_file(tmp_path, 16)
    assert main(["list", "--machine", str(path), "--procs", "32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "32 processors asked, 16 CPUs" in err[0]
    assert main(["list", "--coherent-procs", "0"]) == 2
    assert "give a positive number" in capsys.readouterr().err


def test_list_without_native_kernels_still_lists(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from counterd.data.errors import BackendUnavailable
    from microbench import probe as probe_mod

    def missing(*_: object, **__: object) -> None:
        raise BackendUnavailable("native kernels", "not built", "install gcc")

    monkeypatch.setattr(probe_mod, "native_lib", missing)
    assert main(["list", "--suite", "table1", "--procs", "1"]) == 0
    out = capsys.readouterr().out
    assert "p1.s1.b0.LE" in out and "no run-time estimate: " in out and "not built" in out


def test_other_work_and_far_strides_lengthen_the_estimate() -> None:
    m = node(2, SMALL)
    pats = catalogue(m, "table1", min_accesses=1 << 14)
    sp = speeds(m)
    busy = dataclasses.replace(sp, others=2.0)  # two CPUs' worth of others' work
    quiet, crowded = estimate(pats, m, sp, cfg=QUICK), estimate(pats, m, busy, cfg=QUICK)
    assert crowded.simulation_s == pytest.approx(2 * quiet.simulation_s)  # (2 + 2) / 2
    assert crowded.timing_s > quiet.timing_s
    # Memory sweeps 32 lines apart cost the simulator the far time per access, 4 apart the
    # near one; the pre-fault (a page apart) the far one.
    same = dataclasses.replace(sp, sim_far_ns=(sp.sim_load_ns["mem"], sp.sim_store_ns["mem"]))
    by = {p.mnemonic: p for p in pats}
    near, far = by["p1.s32.b1/8.LE"], by["p1.s256.b1.LE"]
    assert simulation_cost(far, m, sp, QUICK) > simulation_cost(far, m, same, QUICK)
    main_near = simulation_cost(near, m, sp, QUICK) - simulation_cost(near, m, same, QUICK)
    prefault = (-(-near.span_bytes // 4096) + 1) * (sp.sim_far_ns[0] - sp.sim_load_ns["mem"])
    assert main_near == pytest.approx(prefault / 1e9, rel=0.01)


def test_far_memory_strides_cost_the_kernels_their_far_time() -> None:
    m = node(2, SMALL)
    sp = speeds(m)
    near, far = (2.0, 3.0), (5.0, 11.0)
    probed = dataclasses.replace(sp, kernel_load_ns={**sp.kernel_load_ns, "mem": near[0]},
                                 kernel_store_ns={**sp.kernel_store_ns, "mem": near[1]},
                                 kernel_far_ns=far)
    same = dataclasses.replace(probed, kernel_far_ns=None)
    by = {p.mnemonic: p for p in catalogue(m, "table1", procs=[1], min_accesses=1 << 14)}
    line = m.geometry.levels[-1].line_bytes
    for name, t in (("p1.s256.b1.LE", 0), ("p1.s256.b1.SE", 1)):
        p = by[name]
        assert p.stride_bytes >= FAR_LINES * line
        # One processor, below the banks: the kernel's part is accesses x time per access.
        extra = p.count * p.sweeps * (far[t] - near[t]) / 1e9
        assert superstep_s(p, m, probed) - superstep_s(p, m, same) == pytest.approx(extra)
    p = by["p1.s32.b1/8.SE"]  # NEAR_LINES apart: the near time
    assert p.stride_bytes <= NEAR_LINES * line
    assert superstep_s(p, m, probed) == pytest.approx(superstep_s(p, m, same))
    # Cache-resident patterns never take the memory times.
    p = by["p1.s1.b0.LE"]
    assert superstep_s(p, m, probed) == pytest.approx(superstep_s(p, m, same))
    # Scaling the host's speed scales the far times too.
    assert probed.scaled(2.0).kernel_far_ns == (2 * far[0], 2 * far[1])
    assert same.scaled(2.0).kernel_far_ns is None


@pytest.mark.parametrize("spec", ["L1=48K/12/64,L2=2M/16/64,L3=300M/20/64",
                                  "L1=32K/8/64,L2=1M/16/64,L3=32M/16/64", SMALL])
def test_the_probe_sweeps_each_level_as_its_patterns_span_it(spec: str) -> None:
    m = node(2, spec)
    spans = _spans(m)
    levels = m.geometry.levels
    for i, lv in enumerate(levels):
        span, stride = spans[f"L{lv.level}"]
        want = lv.size_bytes // 2 if i == 0 else max(2 * levels[i - 1].size_bytes,
                                                     min(lv.size_bytes // 2, PROBE_MEM_BYTES))
        assert span == want
        # A table1 pattern of the level spans half of it: the probe spans as much, unless
        # the cap (or, for a small level, twice the level above) says otherwise.
        pat = next(p for p in catalogue(m, "table1", procs=[1], min_accesses=1 << 12)
                   if p.level == f"L{lv.level}" and p.op == "load")
        assert (span == pytest.approx(pat.span_bytes, rel=0.01)
                or span in (PROBE_MEM_BYTES, 2 * levels[i - 1].size_bytes))
        assert stride == (1 if i == 0 else levels[0].line_bytes // 8)
    mem_span, mem_stride = spans["mem"]
    assert mem_span == min(2 * levels[-1].size_bytes, PROBE_MEM_BYTES)
    assert mem_stride * 8 == NEAR_LINES * levels[0].line_bytes


@pytest.mark.parametrize("d", [0.0, 0.2, 0.5, 0.9, 1.0])
def test_retries_come_only_after_disturbed_attempts(d: float) -> None:
    # run_settled measures again only while every attempt so far was disturbed.
    assert expected_attempts(0, d) == 1
    assert expected_attempts(2, d) == pytest.approx(1 + d + d * d)
    assert 1 <= expected_attempts(2, d) <= 1 + 2 * d
    m = node(2, SMALL)
    p = catalogue(m, "table1", procs=[1], min_accesses=1 << 12)[0]
    cfg = dataclasses.replace(QUICK, retries=2)
    assert timing_cost(p, m, speeds(m, disturbed=d), cfg)[1] == pytest.approx(1 + d + d * d)


def test_the_load_disturbs_a_share_of_the_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    m = host_machine(Geometry.from_spec(SMALL))
    cpus = os.cpu_count() or 1
    shares = {}
    for load in (0.0, cpus / 2, float(cpus), 4.0 * cpus):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        sp = probe(m, compute=False)
        assert sp.others >= 0  # competing work is measured, not the load average
        shares[load] = sp.disturbed
    assert shares[0.0] == 0.0
    assert shares[float(cpus)] == pytest.approx(1 - math.exp(-1))
    assert list(shares.values()) == sorted(shares.values())
    assert shares[4.0 * cpus] < 1.0
    # A planned node is not this host: its load says nothing.
    planned = probe(m, compute=False, planned=True)
    assert planned.disturbed == 0.0 and planned.others == 0.0


# -- exclusive processors in one shared last level (simulate_pattern exclusive="shared") ------

def test_shared_last_level_counts_what_the_coherent_system_counts() -> None:
    # Exclusive processors share no line, so the unsnooped shared simulation must count
    # exactly what the coherent one (snooping every access) does.
    m = node(4, SMALL)
    pats = [p for p in catalogue(m, "table1", procs=[4], min_accesses=1024)
            if p.mode == "exclusive" and p.level == "mem"][:3]
    assert pats
    for p in pats:
        kw = {"warmup": 1, "page_bytes": m.page_bytes}
        shared = simulate_pattern(p, m.geometry, m.bank_map, exclusive="shared", **kw)
        coherent = simulate_pattern(p, m.geometry, m.bank_map, coherent=True, **kw)
        assert [s.counters for s in shared] == [s.counters for s in coherent], p.mnemonic
        assert [(s.lm, s.wb) for s in shared] == [(s.lm, s.wb) for s in coherent]
    clear_cache()
