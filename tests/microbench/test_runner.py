"""Runner: pinned workers really run in parallel, barriers hold, times are positive and the
median is reproducible within the reported spread; the stopping rule; coherence plans."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from microbench.catalogue import catalogue
from microbench.patterns import Pattern, host_machine
from microbench.plans import plans
from microbench.repetition import RunConfig, should_stop, spread, superstep_times
from microbench.runner import WorkerPool, host_metadata

CPUS = len(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(CPUS < 2, reason="needs 2 CPUs to run 2 processors")
CFG = RunConfig(warmup=1, min_reps=8, max_reps=12, tolerance=0.02, budget_ns=10**9)


def _small(mnemonic: str) -> Pattern:
    m = host_machine()
    # ~0.5 ms supersteps of L1 loads: fast, and long against barrier wake-up skew.
    pats = {p.mnemonic: p for p in catalogue(m, "all", procs=[1, 2] if CPUS > 1 else [1],
                                             min_accesses=1 << 19)}
    return pats[mnemonic]


@needs_two
def test_two_processors_run_in_parallel_and_barriers_hold() -> None:
    m = host_machine()
    p = _small("p2.s1.b0.LE")
    shares = []
    for _ in range(2):  # measured once more where a busy host preempted a worker in many reps
        with WorkerPool(m, [p], CFG) as pool:
            t = pool.run(p)
        assert t.affinity == ((m.cpus[0],), (m.cpus[1],))  # one worker pinned per CPU
        begin, end = t.begin_ns, t.end_ns
        reps = begin.shape[0]
        assert reps >= CFG.warmup + CFG.min_reps and begin.shape[1] == 2
        assert (end > begin).all()
        # In parallel: the two kernels' [begin, end] intervals overlap in most supersteps
        # (workers run one after the other would overlap in none; a host busy with other work
        # preempts a worker in some: 0.69 was seen under four other test runs).
        overlap = np.minimum(end[:, 0], end[:, 1]) - np.maximum(begin[:, 0], begin[:, 1])
        shares.append(float((overlap > 0).mean()))
        if shares[-1] > 0.5:
            break
    assert shares[-1] > 0.5, f"share of repetitions run in parallel: {shares}"
    # Barriers: nobody begins superstep k+1 before everybody ended superstep k.
    assert (begin[1:].min(axis=1) >= end[:-1].max(axis=1)).all()
    # Superstep time = max end - min begin, and covers each processor's own time.
    st = superstep_times(begin, end)
    assert (st >= (end - begin).max(axis=1)).all()
    assert np.array_equal(t.samples_ns, st[CFG.warmup:])
    assert t.checksums[0] == t.checksums[1]  # the same sweep over identical zeroed memory


def test_times_are_positive_and_reproducible_within_the_spread() -> None:
    m = host_machine()
    p = _small("p1.s1.b0.LE")
    with WorkerPool(m, [p], CFG) as pool:
        runs = [pool.run(p) for _ in range(3)]
    for t in runs:
        assert (t.samples_ns > 0).all() and (t.per_proc_ns > 0).all()
        assert len(t.warmup_samples_ns) == CFG.warmup

    def gap(a: Any, b: Any) -> float:
        ma, mb = np.median(a.samples_ns), np.median(b.samples_ns)
        return float(abs(ma - mb) / min(ma, mb) - spread(a.samples_ns) - spread(b.samples_ns))

    # Runs of the same pattern agree within their reported spreads (plus a margin for a shared
    # VM); a runner that mixed up reps or processors would not. Of three runs the closest two
    # are compared: on this VM one run in a few dozen is slowed 1.5-2x as a whole, by the
    # hypervisor, without any repetition looking disturbed.
    assert min(gap(a, b) for i, a in enumerate(runs) for b in runs[i + 1:]) <= 0.25


def test_should_stop() -> None:
    cfg = RunConfig(warmup=2, min_reps=3, max_reps=6, tolerance=0.05, budget_ns=10_000)
    flat = np.array([99, 50, 100, 100, 100])  # warm-ups are not counted
    assert not should_stop(flat[:4], 2, cfg)
    assert should_stop(flat, 2, cfg)
    noisy = np.array([0, 0, 100, 200, 100, 300])
    assert not should_stop(noisy, 2, cfg)
    assert should_stop(np.append(noisy, [100, 100]), 2, cfg)  # max_reps reached
    assert should_stop(np.array([0, 0, 5000, 9000, 100]), 2, cfg)  # budget spent
    assert spread([100] * 5) == 0 and spread([90, 100, 110]) == pytest.approx(0.16)


def test_coherence_plans() -> None:
    pats = {p.mnemonic: p for p in catalogue(host_machine(), "validation", procs=[1])} \
        if CPUS > 1 else {}
    if not pats:
        pytest.skip("coherence variants need 2 CPUs")
    dirty = plans(pats["p1.s1.b0.LE.dirty"])
    assert [w.timed for w in dirty] == [True, False]  # a helper prepares the data
    helper = dirty[1]
    assert helper.main is None and [c.kernel for c in helper.setup[0]] == ["store"]
    assert helper.setup[0][0].offset_bytes == dirty[0].main.offset_bytes  # type: ignore[union-attr]
    shared = plans(pats["p1.s1.b0.SE.shared"])
    assert [c.kernel for c in shared[1].setup[0]] == ["store", "flush", "load"]
    assert [c.kernel for c in shared[0].setup[1]] == ["load"] and shared[1].setup[1] == ()


def test_host_metadata() -> None:
    h = host_metadata([0])
    for key in ("cpu_model", "governor", "smt", "hugepages", "isolated", "loadavg"):
        assert key in h
    assert len(h["loadavg"]) == 3


def test_disturbed_measurements_are_taken_again_and_the_least_disturbed_kept():
    """run_settled: a measurement flagged unstable, steal or preempted is retaken up to cfg.retries
    times; the attempt with the fewest such flags, then the smallest spread, is kept."""
    from types import SimpleNamespace

    from counterd.data.errors import BadInput

    def t(flags, samples):
        return SimpleNamespace(flags=tuple(flags), samples_ns=np.array(samples, float))

    class Stub:
        def __init__(self, timings, retries):
            self.timings, self.cfg, self.calls = iter(timings), RunConfig(retries=retries), 0

        def run(self, pattern, cfg):
            self.calls += 1
            return next(self.timings)

    clean = t(("loaded",), [10, 10, 10])  # not a flag worth a retry
    s = Stub([clean], 2)
    assert WorkerPool.run_settled(s, None) == (clean, 1) and s.calls == 1
    steal, ok = t(("steal",), [10, 10, 10]), t((), [10, 11, 12])
    assert WorkerPool.run_settled(Stub([steal, ok], 2), None) == (ok, 2)
    worse, better = t(("unstable",), [10, 20, 40]), t(("unstable",), [10, 15, 20])
    both = t(("unstable", "steal"), [10, 10, 10])
    assert WorkerPool.run_settled(Stub([worse, both, better], 2), None) == (better, 3)
    assert WorkerPool.run_settled(Stub([worse], 0), None) == (worse, 1)
    with pytest.raises(BadInput, match="retries"):
        RunConfig(retries=-1)


@needs_two
def test_ranks_are_pinned_in_the_numa_layouts_order() -> None:
    """Rank k runs on the k-th CPU of the NUMA placement: with the host's two CPUs on two
    nodes listed in reverse, rank 0 is pinned to the second CPU's node (node 0) and rank 1
    to the first's (node 1), as likwid-pin -c M:scatter would pin a 2-thread program."""
    import dataclasses

    from counterd import machine
    from counterd.machine.memory import NumaNode, Sourced

    a, b = sorted(os.sched_getaffinity(0))[:2]
    here = machine.current()
    # (a machine file's [bank_map], under COUNTERD_MACHINE, would replace the derived one)
    layout = dataclasses.replace(here.memory, declared_banks=None, nodes=Sourced(
        (NumaNode(0, (b,)), NumaNode(1, (a,))), "declared", "test"))
    with machine.using(dataclasses.replace(here, memory=layout)):
        m = host_machine()
    assert m.cpus[:2] == (b, a) and m.bank_map.banks == 2 * layout.channels_per_node.value
    p = next(x for x in catalogue(m, "table1", procs=[2], min_accesses=1 << 12)
             if x.mnemonic == "p2.s1.b0.LE")
    cfg = RunConfig(warmup=1, min_reps=3, max_reps=3, budget_ns=10**8)
    with WorkerPool(m, [p], cfg) as pool:
        t = pool.run(p)
    assert t.cpus == (b, a) and t.affinity == ((b,), (a,))
