"""Catalogue: Table 1 of seed 004 reproduced on the paper's machine, exact BSP quantities,
working sets that land in the level they are named for (checked by simulation)."""

from __future__ import annotations

import dataclasses
import os
import random
from fractions import Fraction
from pathlib import Path

import pytest

from counterd.data.errors import BadInput
from counterd.machine import using
from counterd.machine.description import Machine as DescribedMachine
from counterd.machine.geometry import Geometry
from counterd.machine.memory import BankMap
from counterd.machine.sysfs import read as read_machine
from counterd.machine.views import NodeView
from microbench.catalogue import catalogue
from microbench.counters import simulate_pattern
from microbench.patterns import (
    HOST_BANKS,
    Pattern,
    bank_histogram,
    bsp_quantities,
    host_machine,
    max_word_sharing,
    paper_machine,
    planned_machine,
)
from tests.machine_files import load as load_machine_file
from tests.machine_files import planning_machine

MiB = 1 << 20

ALL = frozenset(range(8))
EVEN, ODD = frozenset({0, 2, 4, 6}), frozenset({1, 3, 5, 7})


def _s(*banks: int) -> frozenset[int]:
    return frozenset(banks)


# Seed 004, Table 1, every row: per-processor banks (memory rows) or level (b0 rows).
TABLE1_MEMORY: dict[str, list[frozenset[int]]] = {
    "p1.s32.b1/8": [ALL],
    "p1.s64.b1/4": [EVEN],
    "p1.s128.b1/2": [_s(0, 4)],
    "p1.s256.b1": [_s(0)],
    "p2.s32.b1/4": [ALL, ALL],
    "p2.s64.b1/4": [EVEN, ODD],
    "p2.s64.b1/2": [EVEN, EVEN],
    "p2.s128.b1/2": [_s(0, 4), _s(2, 6)],
    "p2.s128.b1": [_s(0, 4), _s(0, 4)],
    "p2.s256.b1": [_s(0), _s(4)],
    "p2.s256.b2": [_s(0), _s(0)],
    "p4.s32.b1/2": [ALL] * 4,
    "p4.s64.b1/2": [EVEN, ODD, EVEN, ODD],
    "p4.s128.b1/2": [_s(0, 4), _s(1, 5), _s(2, 6), _s(3, 7)],
    "p4.s64.b1": [EVEN] * 4,
    "p4.s128.b1": [_s(0, 4), _s(2, 6), _s(0, 4), _s(2, 6)],
    "p4.s256.b1": [_s(0), _s(2), _s(4), _s(6)],
    "p4.s128.b2": [_s(0, 4)] * 4,
    "p4.s256.b2": [_s(0), _s(4), _s(0), _s(4)],
    "p4.s256.b4": [_s(0)] * 4,
    "p8.s32.b1": [ALL] * 8,
    "p8.s64.b1": [EVEN, ODD] * 4,
    "p8.s128.b1": [_s(0, 4), _s(1, 5), _s(2, 6), _s(3, 7)] * 2,
    "p8.s256.b1": [_s(b) for b in range(8)],
    "p8.s64.b2": [EVEN] * 8,
    "p8.s128.b2": [_s(0, 4), _s(2, 6)] * 4,
    "p8.s256.b2": [_s(0), _s(2), _s(4), _s(6)] * 2,
    "p8.s128.b4": [_s(0, 4)] * 8,
    "p8.s256.b4": [_s(0), _s(4)] * 4,
    "p8.s256.b8": [_s(0)] * 8,
}
TABLE1_CACHE = {"p1.s1.b0": "L1", "p8.s1.b0": "L1", "p1.s8.b0": "L2", "p8.s8.b0": "L2"}


@pytest.fixture(scope="module")
def paper() -> dict[str, Pattern]:
    return {p.mnemonic: p for p in catalogue(paper_machine(), "table1", coherent_procs=8)}


@pytest.mark.parametrize("row", list(TABLE1_MEMORY))
@pytest.mark.parametrize("combo", ["LE", "SE", "LC", "SC"])
def test_table1_memory_rows(paper: dict[str, Pattern], row: str, combo: str) -> None:
    procs = int(row.split(".")[0][1:])
    if procs == 1 and combo.endswith("C"):
        combo = combo[0] + "E"  # one processor: exclusive and concurrent are one experiment
    p = paper[f"{row}.{combo}"]
    assert p.level == "mem" and p.procs == procs
    assert list(p.banks) == TABLE1_MEMORY[row]
    # BKC = active processors / distinct banks (seed 004 section 3), as the mnemonic says.
    num, _, den = row.split(".b")[1].partition("/")
    assert p.bkc == Fraction(int(num), int(den or 1))
    assert p.bkc == Fraction(procs, len(frozenset().union(*p.banks)))
    # "an array of 2 x size(L2)": every access misses both levels (private L2 on the SGI).
    assert p.span_bytes >= 2 * (1 << 20) - p.stride_bytes


def test_table1_memory_rows_are_exactly_the_table(paper: dict[str, Pattern]) -> None:
    ours = {m.rsplit(".", 1)[0] for m, p in paper.items()
            if p.level == "mem" and m.endswith(".LE")}
    assert ours == set(TABLE1_MEMORY)


@pytest.mark.parametrize("row", list(TABLE1_CACHE))
def test_table1_cache_rows(paper: dict[str, Pattern], row: str) -> None:
    p = paper[f"{row}.LE"]
    assert (p.level, p.bkc) == (TABLE1_CACHE[row], 0)
    assert p.stride_words == (1 if p.level == "L1" else 8)  # 8 words = one 32 B L1 line


def test_paper_mnemonics_and_word() -> None:
    m = paper_machine()
    assert (m.word_bytes, m.bank_unit_words, m.proc_counts()) == (4, 32, (1, 2, 4, 8))
    names = [p.mnemonic for p in catalogue(m, coherent_procs=8)]
    assert len(names) == len(set(names))
    assert {"p1.s1.b0.LE", "p8.s32.b1.SC", "p8.s256.b8.SC", "p8.s256.b8.LE",
            "p1.s256.b1.SE"} <= set(names)  # the patterns seed 004 section 4.1 names


@pytest.mark.parametrize("machine", [
    paper_machine(),
    NodeView("8 CPUs, host-like geometry", tuple(range(8)),
            Geometry.from_spec("L1=48K/12/64,L2=2M/16/64,L3=32M/16/64"), HOST_BANKS, "test"),
], ids=["paper", "host-like"])
def test_validation_suite_size_on_eight_cpus(machine: NodeView) -> None:
    val = catalogue(machine, "validation", coherent_procs=8)
    assert len(val) >= 400  # seed 004 section 5.1: 412 patterns
    assert {p.coherence for p in val} == {None, "clean", "shared", "dirty"}
    assert {p.op for p in val} == {"load", "store", "rmw", "mixed"}
    assert any(p.ws_factor for p in val)
    table = catalogue(machine, "table1", coherent_procs=8)
    assert len(catalogue(machine, "all", coherent_procs=8)) == len(val) + len(table)
    assert not {p.mnemonic for p in val} & {p.mnemonic for p in table}


def test_host_catalogue_uses_host_cpus_and_word(described_machine: DescribedMachine) -> None:
    """The host's machine runs on the CPUs this process may use, with the described geometry,
    bank map and page; its catalogue needs no more CPUs than that."""
    m = host_machine()
    allowed = os.sched_getaffinity(0)
    assert sorted(m.cpus) == sorted(allowed)  # in the order the NUMA layout pins ranks
    assert m.cpus == described_machine.memory.spread(allowed)
    assert m.memory == described_machine.memory
    assert (m.geometry, m.bank_map, m.page_bytes) == (
        described_machine.geometry, described_machine.bank_map, described_machine.page_bytes)
    assert m.bank_provenance == described_machine.bank_provenance
    pats = catalogue(m)
    assert max(p.procs for p in pats) <= m.max_procs
    assert all(p.word_bytes == 8 for p in pats)


def test_the_host_bank_map_is_assumed() -> None:
    """Without a machine file the bank map is the declared HOST_BANKS, marked assumed."""
    with using(read_machine(Path("/nonexistent"), Path("/nonexistent"))):
        m = host_machine()
    assert m.bank_map == HOST_BANKS and m.bank_provenance.startswith("assumed")


def test_processors_are_placed_across_numa_nodes() -> None:
    """On the two-socket node (two NUMA nodes of 32 CPUs), rank k of every pattern runs on
    node k mod 2, as a program pinned with likwid-pin -c M:scatter: each processor count of
    the suite has half its processors on each node, and the banks are both sockets'
    channels (8 x 2 = 16), so P = 64 contends 64 / 16 = 4 per bank at the least."""
    described = load_machine_file("xeon-2s-64cpu")
    with using(described):
        m = planned_machine()
    assert m.cpus[:4] == (0, 32, 1, 33) and sorted(m.cpus) == list(range(64))
    assert m.memory == described.memory and m.bank_map == BankMap(16, 256)
    for p in m.proc_counts():
        nodes = [described.memory.node_of(c) for c in m.cpus[:p]]
        assert abs(nodes.count(0) - nodes.count(1)) <= 1, p
    pats = catalogue(m, "table1", procs=[64])
    bkcs = {p.bkc for p in pats if p.level == "mem"}
    assert min(bkcs) == 4 and max(bkcs) == 64
    for p in pats:  # the placement does not change what a pattern is: its bases and banks
        if p.level == "mem" and p.mode == "exclusive":
            assert len(frozenset().union(*p.banks)) == 64 // p.bkc


def test_banks_that_are_not_a_power_of_two() -> None:
    """12 banks (6 channels x 2 nodes): strides of 1, 2, 4 and 8 bank units and of 12, which
    reaches one bank; no mnemonic twice (a stride of 8 units reaches 3 of 12 banks from any
    first bank, so processors starting 4 banks apart contend as those starting together)."""
    g = Geometry.from_spec("L1=48K/12/64,L2=2M/16/64,L3=32M/16/64")
    m = NodeView("12 banks", tuple(range(16)), g, BankMap(12, 256), "test")
    pats = catalogue(m)
    names = [p.mnemonic for p in pats]
    assert len(names) == len(set(names))
    mem = [p for p in pats if p.level == "mem" and p.op == "load" and p.mode == "exclusive"
           and p.suite == "table1" and p.procs == 16]
    assert {p.stride_words for p in mem} == {32 * i for i in (1, 2, 4, 8, 12)}
    assert max(p.bkc for p in mem) == 16 and min(p.bkc for p in mem) == Fraction(16, 12)
    for p in mem:
        assert p.bkc == Fraction(16, len(frozenset().union(*p.banks)))


# The largest working set (per processor) of the catalogue on each machine file's node: twice
# its L3 (the 64-CPU node: 48 MB, shared by the 32 CPUs of a socket).
LARGEST_SPAN = {"amd-2cpu-32m": 64 * MiB, "intel-2cpu-300m": 600 * MiB,
                "xeon-2s-64cpu": 96 * MiB}


def test_catalogue_on_each_machine_files_node(described_machine: DescribedMachine) -> None:
    m = planning_machine(described_machine)
    largest = LARGEST_SPAN[described_machine.hostname]
    val, table = catalogue(m, "validation"), catalogue(m, "table1")
    counts = {p.procs for p in val + table}  # from one processor to all of the node's
    assert min(counts) == 1 and max(counts) == described_machine.cpus_online
    assert {p.coherence for p in val} == {None, "clean", "shared", "dirty"}
    names = [p.mnemonic for p in val + table]
    assert len(names) == len(set(names))
    assert max(p.span_bytes for p in val + table) == pytest.approx(largest, rel=1e-5)
    # Memory patterns sweep at least twice the L3 that serves them (with exclusive data, the
    # processors sharing one L3, at most the 32 of a socket, together): they leave it.
    llc = m.geometry.levels[-1]
    for p in val + table:
        if p.level == "mem" and not p.ws_factor:
            on_one_llc = min(p.procs, len(llc.shared_cpus)) if p.mode == "exclusive" else 1
            assert p.span_bytes * on_one_llc >= 0.999 * 2 * llc.size_bytes, p.mnemonic


def test_bad_input() -> None:
    m = paper_machine()
    with pytest.raises(BadInput, match="unknown suite"):
        catalogue(m, "bogus")  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="9 processors"):
        catalogue(m, procs=[9])
    with pytest.raises(BadInput, match="stride 0"):
        catalogue(m, strides=[0])
    with pytest.raises(BadInput, match="accesses"):
        catalogue(m, min_accesses=0)
    p = catalogue(m, "table1")[0]
    with pytest.raises(BadInput, match="stride"):
        dataclasses.replace(p, stride_words=0)
    with pytest.raises(BadInput, match="working set"):
        dataclasses.replace(p, count=0)


def test_bank_histogram_and_sharing_match_brute_force() -> None:
    rng = random.Random(4)
    bm = BankMap(8, 128)
    for _ in range(200):
        base, count, stride = rng.randrange(0, 4096, 4), rng.randrange(1, 300), rng.choice(
            [4, 8, 32, 96, 128, 256, 384, 512, 1024, 4096])
        brute = [0] * 8
        for i in range(count):
            brute[bm.bank(base + i * stride)] += 1
        assert bank_histogram(base, count, stride, bm) == brute
        bases = [rng.randrange(0, 2048, 8) for _ in range(rng.randrange(1, 6))]
        words: dict[int, int] = {}
        for b in bases:
            for i in range(count):
                words[b + i * stride] = words.get(b + i * stride, 0) + 1
        assert max_word_sharing(bases, count, stride) == max(words.values())


def test_bsp_quantities() -> None:
    m = paper_machine()
    pats = {p.mnemonic: p for p in catalogue(m, "table1", coherent_procs=8)}
    p = pats["p8.s256.b8.LC"]  # every processor the same words of one bank
    q = bsp_quantities(p, m.bank_map)
    assert q.H == p.count * p.sweeps and q.M == 8 * q.H and q.M_b == q.M and q.K == 8 * p.sweeps
    q = bsp_quantities(pats["p8.s256.b1.LE"], m.bank_map)  # one bank each, all different
    assert q.M_b == q.H and q.K == pats["p8.s256.b1.LE"].sweeps


# A small 2-CPU machine with a shared last level, so that every pattern simulates quickly.
_G = Geometry.from_spec("L1=4K/4/64,L2=32K/8/64,L3=256K/16/64")
SMALL = NodeView("small", (0, 1), dataclasses.replace(
    _G, levels=(*_G.levels[:2], dataclasses.replace(_G.levels[2], shared_cpus=(0, 1)))),
    HOST_BANKS, "test")


@pytest.mark.parametrize("pattern", catalogue(SMALL, min_accesses=4096),
                         ids=lambda p: p.mnemonic)
def test_every_pattern_is_served_where_it_says(pattern: Pattern) -> None:
    """The catalogue's sizing, checked by the simulator: where the accesses of one measured
    superstep (after warm-up) are served is the level in the pattern's name."""
    from microbench.results import served_level

    # The sizing is about where data lives without sharing: coherence misses of concurrent
    # patterns are checked in test_concurrent_stores_miss_by_coherence.
    sims = simulate_pattern(pattern, SMALL.geometry, SMALL.bank_map, warmup=1, coherent=False)
    lines = [lv.line_bytes for lv in SMALL.geometry.levels]
    for sim in sims:
        assert served_level(sim.counters, pattern, lines) == pattern.level
        accesses = sim.counters["loads"] + sim.counters["stores"]
        assert accesses == pattern.accesses_per_proc
    if pattern.level == "mem":
        touched = [frozenset(b for b, n in enumerate(s.lm) if n) for s in sims]
        assert touched == list(pattern.banks)  # LM(b) where the catalogue steered it


def test_concurrent_and_exclusive_bases() -> None:
    pats = {p.mnemonic: p for p in catalogue(SMALL, "table1")}
    e, c = pats["p2.s32.b1/4.LE"], pats["p2.s32.b1/4.LC"]
    assert len(set(c.bases_bytes)) == 1
    lo, hi = sorted(e.bases_bytes)
    assert hi - lo >= e.span_bytes + 4096  # padded apart by at least a page
    assert all(b % 4096 == 0 for b in e.bases_bytes)


def test_concurrent_stores_miss_by_coherence() -> None:
    """Concurrent stores to shared L1-resident data: without coherence they would hit; with
    it (turns of 8 accesses, stride 8 words = one line per access) every store misses in L1
    and L2 because the other processor took the line since, and is served by a transfer."""
    pats = {p.mnemonic: p for p in catalogue(SMALL, min_accesses=4096)}
    p = pats["p2.s8.b0.SC.ws0.75xL1"]
    alone = simulate_pattern(p, SMALL.geometry, SMALL.bank_map, warmup=1, coherent=False)
    assert all(s.counters["l1d_misses"] == 0 for s in alone)
    sims = simulate_pattern(p, SMALL.geometry, SMALL.bank_map, warmup=1)
    n = p.accesses_per_proc
    for s in sims:
        assert s.counters["stores"] == n
        assert s.counters["l1d_misses"] == s.counters["l2_misses"] == n
        assert s.coherence_misses == n and s.invalidations == n
        assert s.counters["l3_misses"] == 0  # transfers do not ask the shared L3
    # Concurrent loads of memory-sized shared data: the shared L3 fetches each line once.
    lc = pats["p2.s32.b1/4.LC"]
    both = simulate_pattern(lc, SMALL.geometry, SMALL.bank_map, warmup=1)
    assert all(s.coherence_misses == s.invalidations == 0 for s in both)
    assert sum(s.counters["l3_misses"] for s in both) == lc.accesses_per_proc
