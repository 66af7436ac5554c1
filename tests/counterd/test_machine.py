"""The one machine description (counterd/machine/): read from sysfs/procfs once per process,
overridable from a machine file (COUNTERD_MACHINE, --machine), used by every consumer; a bad
machine file is one line and exit 2 from every CLI that reads it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from counterd import machine
from counterd.data.errors import BadInput
from counterd.machine.files import ENV_MACHINE, load_file
from counterd.machine.geometry import MAX_CPU_ID, format_cpulist, parse_cpulist
from counterd.machine.memory import HOST_BANKS, BankMap, Sourced
from counterd.machine.sysfs import read, read_text

ROOT = Path(__file__).resolve().parents[2]
KiB, MiB = 1 << 10, 1 << 20

HEAD = 'format = "counterd-machine"\nversion = 1\n'
HEAD2 = 'format = "counterd-machine"\nversion = 2\n'
HOST4 = '\n[host]\ncpus_online = 4\n'


def cache(level: int, kind: str, size: str | int, ways: int | str, line: int,
          extra: str = "") -> str:
    size_v = f'"{size}"' if isinstance(size, str) else str(size)
    ways_v = f'"{ways}"' if isinstance(ways, str) else str(ways)
    return (f"\n[[caches]]\nlevel = {level}\ntype = \"{kind}\"\nsize = {size_v}\n"
            f"ways = {ways_v}\nline_bytes = {line}\n{extra}")


# The seed's SGI Power Challenge, as a machine file: 2 levels, 8 CPUs, 16 KiB pages.
SGI = (HEAD + "page_bytes = 16384\n\n[host]\nhostname = \"sgi\"\ncpu_model = \"MIPS R10000\"\n"
       "cpus_online = 8\n"
       + cache(1, "data", "32K", 2, 32) + cache(1, "instruction", "32K", 2, 64)
       + cache(2, "unified", "1M", 2, 128, "shared_cpus = [0, 1, 2, 3, 4, 5, 6, 7]\n")
       + "\n[tlb]\nentries = 64\nways = 64\n"
       + "\n[bank_map]\nbanks = 8\ninterleave_bytes = 128\nprovenance = \"seed 004\"\n")


@pytest.fixture(autouse=True)
def _fresh_machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ENV_MACHINE, raising=False)
    machine.reset()
    yield
    machine.reset()


def _write_index(root: Path, i: int, **files: str) -> None:
    d = root / "devices/system/cpu/cpu0/cache" / f"index{i}"
    d.mkdir(parents=True)
    for name, text in files.items():
        (d / name).write_text(text + "\n")


def fake_host(root: Path) -> Path:
    """sysfs and procfs of a 2-CPU host with this development VM's caches."""
    rows = [("1", "Data", "48K", "12", "0"), ("1", "Instruction", "32K", "8", "0"),
            ("2", "Unified", "2048K", "16", "0"), ("3", "Unified", "307200K", "20", "0-1")]
    for i, (level, kind, size, ways, shared) in enumerate(rows):
        _write_index(root, i, level=level, type=kind, size=size, ways_of_associativity=ways,
                     coherency_line_size="64", shared_cpu_list=shared)
    (root / "devices/system/cpu/online").write_text("0-1\n")
    (root / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n"
                                  "model name\t: Test CPU @ 2.0GHz\n\n")
    return root


def test_read_gives_levels_l1i_fingerprint(tmp_path: Path) -> None:
    m = read(fake_host(tmp_path), tmp_path)
    assert [(lv.level, lv.size_bytes, lv.ways, lv.shared_cpus) for lv in m.levels] == [
        (1, 48 * KiB, 12, (0,)), (2, 2 * MiB, 16, (0,)), (3, 300 * MiB, 20, (0, 1))]
    assert m.l1i is not None and (m.l1i.size_bytes, m.l1i.ways) == (32 * KiB, 8)
    assert (m.tlb_entries, m.tlb_ways) == (None, None)  # sysfs has no DTLB
    assert "DTLB not in sysfs" in m.geometry.source and m.geometry.tlb_entries == 64
    assert m.bank_map == HOST_BANKS and m.bank_map_assumed
    fp = m.fingerprint()
    assert fp["cpu_model"] == "Test CPU @ 2.0GHz" and fp["cpus_online"] == 2
    assert fp["caches"] == "L1=48K/12/64,L2=2M/16/64,L3=300M/20/64"
    # The same spec the predictor writes into profiles (predictor.costs.profile.caches_spec).
    from predictor.costs.profile import caches_spec

    assert fp["caches"] == caches_spec([{"level": lv.level, "size_bytes": lv.size_bytes,
                                         "ways": lv.ways, "line_bytes": lv.line_bytes}
                                        for lv in m.levels])


def test_unreadable_sysfs_falls_back_with_the_reason(tmp_path: Path) -> None:
    m = read(tmp_path / "nothing", tmp_path / "nothing")
    assert not m.caches_known and m.caches_spec == ""
    assert m.geometry.source.startswith("fallback") and "sysfs failed" in m.geometry.source


def test_sysfs_is_read_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every consumer takes the machine from counterd.machine; the files behind it are read
    once, however many consumers ask. The host is a sysfs tree of the test's own, so that the
    reads are counted on any host (one without cache entries in its sysfs too)."""
    reads: Counter[str] = Counter()
    real, real_read = read_text, read
    root = fake_host(tmp_path)

    def counting(path: Path) -> str:
        reads[str(path)] += 1
        return real(path)

    monkeypatch.setattr("counterd.machine.sysfs.read_text", counting)
    monkeypatch.setattr("counterd.machine.sysfs.read", lambda *a, **k: real_read(root, root))
    machine.reset()
    from counterd.backends.callgrind import CallgrindBackend
    from counterd.backends.callgrind.geometry import CallgrindGeometry
    from counterd.backends.sim import SimBackend
    from counterd.commands.probe import probe
    from counterd.data.host import host_info
    from microbench.patterns import host_machine
    from microbench.runner import host_metadata
    from predictor.costs.profile import current_host

    geometries = {SimBackend().geometry.spec(), host_machine().geometry.spec(),
                  machine.current().geometry.spec()}
    CallgrindBackend().available()
    CallgrindGeometry.from_machine()  # the fake host lists an L1 instruction cache
    here = current_host()
    host_info()
    host_metadata([0])
    result = probe()
    assert len(geometries) == 1
    assert here == machine.current().fingerprint() and result.machine is machine.current()
    cache_files = [p for p in reads if "/cache/index" in p]
    assert cache_files, "the machine was not read through counterd.machine"
    assert max(reads.values()) == 1, reads.most_common(3)


def test_read_takes_an_injected_reader(tmp_path: Path) -> None:
    reads: list[str] = []

    def reader(path: Path) -> str:
        reads.append(str(path))
        return read_text(path)

    read(fake_host(tmp_path), tmp_path, reader=reader)
    assert len(reads) == len(set(reads)) and any(r.endswith("index3/size") for r in reads)


# ----------------------------------------------------------------------------- machine files


def test_machine_file_overrides_every_consumer(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sgi.toml"
    path.write_text(SGI)
    monkeypatch.setenv(ENV_MACHINE, str(path))
    m = machine.current()
    assert m is machine.current() and m.file == str(path)
    assert m.geometry.spec() == "L1=32K/2/32,L2=1M/2/128,tlb=64/64,page=16K"
    assert m.geometry.private_levels == 1  # the L2 is shared by 8 CPUs
    from counterd.backends.callgrind.dumps import counter_support
    from counterd.backends.callgrind.geometry import CallgrindGeometry
    from counterd.backends.sim import SimBackend
    from microbench.patterns import host_machine
    from predictor.costs.profile import current_host

    sim = SimBackend()
    assert sim.geometry == m.geometry and sim.bankmap == BankMap(8, 128)
    assert "seed 004" in sim.available().reason
    cg = CallgrindGeometry.from_machine()
    assert cg.last_level == 2 and cg.d1.line_bytes == 32 and cg.i1.line_bytes == 64
    assert counter_support(cg.last_level)["l2_misses"] is None
    hm = host_machine()
    assert hm.bank_map == BankMap(8, 128) and hm.bank_provenance == "seed 004"
    assert hm.page_bytes == 16384
    assert current_host() == {"hostname": "sgi", "cpu_model": "MIPS R10000", "cpus_online": 8,
                              "page_bytes": 16384, "caches": "L1=32K/2/32,L2=1M/2/128"}


def test_partial_machine_file_keeps_the_rest_of_the_host(tmp_path: Path) -> None:
    host = read(fake_host(tmp_path), tmp_path)
    path = tmp_path / "tlb.toml"
    path.write_text(HEAD + "\n[tlb]\nentries = 1536\nways = 12\n")
    m = load_file(path, base=host)
    assert m.levels == host.levels and m.fingerprint() == host.fingerprint()
    assert (m.geometry.tlb_entries, m.geometry.tlb_ways) == (1536, 12)
    assert f"DTLB from machine file {path}" in m.geometry.source
    assert m.bank_map_assumed  # not given: still the declared, assumed map


def test_using_restores_the_previous_machine(tmp_path: Path) -> None:
    path = tmp_path / "sgi.toml"
    path.write_text(SGI)
    before = machine.current()
    with machine.using(path) as m:
        assert machine.current() is m and m.hostname == "sgi"
    assert machine.current() is before


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, **(env or {})})


def test_cli_machine_option(tmp_path: Path) -> None:
    path = tmp_path / "sgi.toml"
    path.write_text(SGI)
    proc = _cli("counterd.commands.cli", "probe", "--json", "--machine", str(path))
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["machine"]["file"] == str(path) and d["host"]["cpu_model"] == "MIPS R10000"
    assert d["machine"]["fingerprint"]["caches"] == "L1=32K/2/32,L2=1M/2/128"
    assert d["counters"]["l3_misses"]["backend"] != "sim"  # the SGI has no L3
    proc = _cli("microbench.cli", "list", "--suite", "table1", "--json", "--machine", str(path))
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert listed["geometry"]["spec"] == "L1=32K/2/32,L2=1M/2/128,tlb=64/64,page=16K"
    assert listed["bank_map"] == {"banks": 8, "interleave_bytes": 128, "provenance": "seed 004"}


def test_record_passes_the_machine_to_the_command(tmp_path: Path) -> None:
    """The markers of the recorded command simulate the machine of --machine (sim backend)."""
    path = tmp_path / "two.toml"
    path.write_text(HEAD + cache(1, "data", "32K", 8, 64) + cache(2, "unified", "1M", 16, 64))
    out = tmp_path / "r.jsonl"
    proc = _cli("counterd.commands.cli", "record", "--machine", str(path), "--backend", "sim",
                "--out", str(out), "--", sys.executable,
                str(ROOT / "examples" / "bsp_sum.py"), "20000", "1")
    assert proc.returncode == 0, proc.stderr
    from counterd.data.records import read_jsonl

    recs = [r for r in read_jsonl(out) if r.name == "sum"]
    assert recs and "l2_misses" in recs[0].counters and "l3_misses" not in recs[0].counters


# ------------------------------------------------------------------------------- bad input

BAD = {
    "line0": (HEAD + cache(1, "data", "32K", 8, 0), "caches[1].line_bytes = 0",
              "power of two"),
    "line48": (HEAD + cache(1, "data", "48K", 12, 48), "caches[1].line_bytes = 48",
               "power of two"),
    "ways0": (HEAD + cache(1, "data", "32K", 0, 64), "caches[1].ways = 0", "give ways >= 1"),
    "sets": (HEAD + cache(1, "data", 1000000, 8, 64), "caches[1].size = 1000000",
             "whole number of sets"),
    "line_shrinks": (HEAD + cache(1, "data", "32K", 8, 64) + cache(2, "unified", "1M", 16, 32),
                     "caches[2].line_bytes = 32 is smaller than L1's line",
                     "at least 64 B"),
    "gap": (HEAD + cache(1, "data", "32K", 8, 64) + cache(3, "unified", "1M", 16, 64),
            "levels [1, 3]", "without gaps"),
    "unknown_key": (HEAD + cache(1, "data", "32K", 8, 64, "size_kb = 32\n"),
                    "unknown key caches[1].size_kb", "level, type, size"),
    "unknown_top": (HEAD + "caches_l1 = 3\n", "unknown key caches_l1", "the keys are"),
    "wrong_type": (HEAD + cache(1, "data", "32K", "8", 64), "caches[1].ways = '8' is a string",
                   "write ways = 8"),
    "wrong_table": (HEAD + "tlb = 64\n", "tlb is an integer, not a table", "[tlb]"),
    "tlb": (HEAD + "[tlb]\nentries = 64\nways = 5\n", "tlb.entries = 64", "sets x ways"),
    "version": ('format = "counterd-machine"\nversion = 3\n', "version = 3",
                "reads version 1, 2"),
    "memory_v1": (HEAD + "\n[memory]\nchannels_per_node = 8\n",
                  "[memory] in a version 1 file", "write version = 2"),
    "channels0": (HEAD2 + "\n[memory]\nchannels_per_node = 0\n",
                  "memory.channels_per_node = 0", "give channels_per_node >= 1"),
    "channels_str": (HEAD2 + '\n[memory]\nchannels_per_node = "8"\n',
                     "memory.channels_per_node = '8' is a string", "write channels_per_node"),
    "interleave": (HEAD2 + "\n[memory]\ninterleave_bytes = 300\n",
                   "memory.interleave_bytes = 300 is not a power of two", "e.g. 256"),
    "nodes_overlap": (HEAD2 + HOST4 + '\n[memory]\nnuma_nodes = ["0-2", "2-3"]\n',
                      "CPU 2 is on node 0 and node 1", "put every CPU on one node"),
    "nodes_count": (HEAD2 + HOST4 + '\n[memory]\nnuma_nodes = ["0-1", "2-5"]\n',
                    "memory.numa_nodes list 6 CPUs, and 4 are online",
                    "cpus_online = 6"),
    "nodes_type": (HEAD2 + HOST4 + "\n[memory]\nnuma_nodes = [4]\n",
                   "memory.numa_nodes: node 0 = 4 is not a CPU list", 'numa_nodes = ["0-31"'),
    # a range that would expand to four billion CPUs: refused, not a MemoryError
    "nodes_huge": (HEAD2 + HOST4 + '\n[memory]\nnuma_nodes = ["0-4000000000"]\n',
                   "memory.numa_nodes: node 0 = '0-4000000000' is not a CPU list",
                   'numa_nodes = ["0-31"'),
    "nodes_huge_ids": (HEAD2 + HOST4 + "\n[memory]\nnuma_nodes = [[0, 1, 2, 99999999]]\n",
                       "is not a CPU list", 'numa_nodes = ["0-31"'),
    "nodes_empty": (HEAD2 + HOST4 + '\n[memory]\nnuma_nodes = ["0-3", ""]\n',
                    "memory.numa_nodes: node 1 has no CPUs", "list only the NUMA nodes"),
    "banks_twice": (HEAD2 + "\n[memory]\nchannels_per_node = 8\n"
                    "\n[bank_map]\nbanks = 8\ninterleave_bytes = 256\n",
                    "both [bank_map] and memory.channels_per_node", "not both"),
    "memory_key": (HEAD2 + "\n[memory]\nchannels = 8\n", "unknown key memory.channels",
                   "channels_per_node"),
    "no_format": ("version = 1\n", "format is missing", 'format = "counterd-machine"'),
    "not_toml": (HEAD + "[[caches]\nlevel = 1\n", "not TOML", "fix the syntax"),
    "not_utf8": (HEAD.encode() + b'[host]\ncpu_model = "\xff\xfe"\n', "not UTF-8",
                 "save it as UTF-8"),
}


def _bad_file(tmp_path: Path, case: str) -> tuple[Path, str, str]:
    content, field, fix = BAD[case]
    path = tmp_path / f"{case}.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path, field, fix


def _one_line_exit_2(proc: subprocess.CompletedProcess[str], path: Path, field: str,
                     fix: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"machine file {path}" in err and field in err and fix in err, err


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_machine_file_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    path, field, fix = _bad_file(tmp_path, case)
    _one_line_exit_2(_cli("counterd.commands.cli", "probe", "--machine", str(path)), path, field,
                     fix)


@pytest.mark.parametrize("case", ["line48", "not_utf8", "unknown_key"])
def test_bad_machine_file_through_every_cli(tmp_path: Path, case: str) -> None:
    path, field, fix = _bad_file(tmp_path, case)
    out = tmp_path / "out.jsonl"
    runs = [
        ("counterd.commands.cli", "record", "--machine", str(path), "--out", str(out), "--",
         "true"),
        ("microbench.cli", "run", "--machine", str(path), "--out", str(tmp_path / "r.json")),
        ("microbench.cli", "list", "--machine", str(path)),
    ]
    for args in runs:
        _one_line_exit_2(_cli(*args), path, field, fix)
    env = {ENV_MACHINE: str(path)}
    records = tmp_path / "rec.jsonl"
    records.write_text(json.dumps({"format": 1, "run_id": "r", "index": 0, "name": "s",
                                   "rank": 0, "begin_ns": 0, "end_ns": 10, "counters": {}})
                       + "\n")
    for args in [("counterd.commands.cli", "probe"),
                 ("counterd.commands.cli", "record", "--out", str(out), "--", "true"),
                 ("microbench.cli", "list"),
                 ("predictor.cli", "--profile", "sgi-power-challenge", "--counters",
                  str(records))]:
        _one_line_exit_2(_cli(*args, env=env), path, field, fix)
    assert not out.exists() and not (tmp_path / "r.json").exists()


def test_missing_machine_file(tmp_path: Path) -> None:
    proc = _cli("counterd.commands.cli", "probe", "--machine", str(tmp_path / "none.toml"))
    assert proc.returncode == 2 and "cannot read machine file" in proc.stderr
    with pytest.raises(BadInput, match="cannot read machine file"):
        load_file(tmp_path / "none.toml")


# ------------------------------------------------------- memory: NUMA nodes, channels, banks


def fake_numa(root: Path, nodes: dict[int, str], online: str) -> Path:
    """``fake_host`` with ``nodes`` (node number -> sysfs cpulist) under
    devices/system/node and ``online`` CPUs."""
    fake_host(root)
    (root / "devices/system/cpu/online").write_text(online + "\n")
    for n, cpulist in nodes.items():
        d = root / "devices/system/node" / f"node{n}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    (root / "devices/system/node/online").write_text(  # not a node directory
        ",".join(map(str, nodes)) + "\n")
    return root


def test_one_numa_node_read_channels_and_interleave_assumed(tmp_path: Path) -> None:
    m = read(fake_numa(tmp_path, {0: "0-1"}, "0-1"), tmp_path)
    mem = m.memory
    assert [(n.node, n.cpus) for n in mem.nodes.value] == [(0, (0, 1))]
    assert mem.nodes.provenance == "read" and "devices/system/node" in mem.nodes.note
    assert (mem.channels_per_node.value, mem.channels_per_node.provenance) == (8, "assumed")
    assert (mem.interleave_bytes.value, mem.interleave_bytes.provenance) == (256, "assumed")
    # One node and nothing declared: the earlier assumption, 8 banks x 256 B, labelled so.
    assert m.bank_map == HOST_BANKS and m.bank_map_assumed
    assert m.bank_provenance.startswith("assumed: 8 banks = 8 memory channels per NUMA node "
                                        "(assumed) x 1 NUMA node (read)")


def test_two_numa_nodes_make_twice_the_banks_and_spread_ranks(tmp_path: Path) -> None:
    """Two nodes whose CPUs interleave (as on many 2-socket BIOSes), a memory-only node (no
    CPUs, e.g. CXL memory): banks = 8 assumed channels x 2 nodes; ranks alternate nodes."""
    root = fake_numa(tmp_path, {0: "0-1,4-5", 1: "2-3,6-7", 2: ""}, "0-7")
    m = read(root, tmp_path)
    mem = m.memory
    assert [(n.node, n.cpus) for n in mem.nodes.value] == [(0, (0, 1, 4, 5)), (1, (2, 3, 6, 7))]
    assert m.cpus_online == 8 and mem.node_of(6) == 1 and mem.node_of(9) is None
    assert m.bank_map == BankMap(16, 256) and m.bank_map_assumed
    assert "x 2 NUMA nodes (read)" in m.bank_provenance
    assert mem.spread(range(8)) == (0, 2, 1, 3, 4, 6, 5, 7)
    assert mem.spread({1, 4, 5, 6}) == (1, 6, 4, 5)  # only the CPUs the program may use
    assert mem.spread({0, 1, 9}) == (0, 1, 9)  # a CPU on no node comes last
    for p in (2, 4, 6, 8):  # a p-rank program has p / 2 ranks on each node
        ranks = mem.spread(range(8))[:p]
        assert sum(mem.node_of(c) == 0 for c in ranks) == p // 2


def test_no_numa_directory_is_one_assumed_node(tmp_path: Path) -> None:
    m = read(fake_host(tmp_path), tmp_path)
    nodes = m.memory.nodes
    assert nodes.provenance == "assumed" and [n.cpus for n in nodes.value] == [(0, 1)]
    assert "no NUMA node with CPUs" in nodes.note
    assert m.bank_map == HOST_BANKS and m.bank_map_assumed


def test_inconsistent_numa_sysfs_is_one_assumed_node(tmp_path: Path) -> None:
    m = read(fake_numa(tmp_path, {0: "0-1", 1: "1"}, "0-1"), tmp_path)
    assert m.memory.nodes.provenance == "assumed" and "inconsistent" in m.memory.nodes.note


def test_two_node_machine_file_declares_memory() -> None:
    from tests.machine_files import load

    m = load("xeon-2s-64cpu")
    mem = m.memory
    assert [(n.node, format_cpulist(n.cpus)) for n in mem.nodes.value] == [
        (0, "0-31"), (1, "32-63")]
    for fact in (mem.nodes, mem.channels_per_node, mem.interleave_bytes):
        assert fact.provenance == "declared" and "xeon-2s-64cpu.toml" in fact.note
    assert m.bank_map == BankMap(16, 256) and not m.bank_map_assumed
    assert m.bank_provenance.startswith("declared: 16 banks = 8 memory channels per NUMA node")
    assert mem.spread(mem.cpus)[:6] == (0, 32, 1, 33, 2, 34)
    d = m.to_json()["memory"]
    assert d["banks"]["value"] == {"banks": 16, "interleave_bytes": 256}
    assert d["numa_nodes"]["value"][1] == {"node": 1, "cpus": list(range(32, 64))}
    assert "8 DDR4-3200 channels" in d["remark"]


def test_memory_file_over_a_host(tmp_path: Path) -> None:
    """A version 2 file declaring channels only keeps the host's nodes (read) and its
    interleave (assumed): the banks are as weak as their weakest part."""
    host = read(fake_numa(tmp_path, {0: "0", 1: "1"}, "0-1"), tmp_path)
    path = tmp_path / "ch.toml"
    path.write_text(HEAD2 + "\n[memory]\nchannels_per_node = 6\n")
    m = load_file(path, base=host)
    assert m.memory.nodes == host.memory.nodes
    assert m.memory.channels_per_node == Sourced(6, "declared", f"declared in {path}")
    assert m.bank_map == BankMap(12, 256) and m.bank_map_assumed
    path.write_text(HEAD2 + "\n[memory]\nchannels_per_node = 6\ninterleave_bytes = 4096\n")
    m = load_file(path, base=host)
    assert m.bank_map == BankMap(12, 4096) and not m.bank_map_assumed
    assert m.bank_provenance.startswith("declared: 12 banks")


def test_file_with_other_cpus_and_no_nodes_assumes_one_node(tmp_path: Path) -> None:
    """A version 1 file of a 64-CPU node (the host's nodes describe other CPUs): one node of
    its 64 CPUs, assumed; its [bank_map] is used as it is."""
    host = read(fake_numa(tmp_path, {0: "0", 1: "1"}, "0-1"), tmp_path)
    path = tmp_path / "n64.toml"
    path.write_text(HEAD + "\n[host]\ncpus_online = 64\n"
                    "\n[bank_map]\nbanks = 4\ninterleave_bytes = 128\n")
    m = load_file(path, base=host)
    nodes = m.memory.nodes
    assert nodes.provenance == "assumed" and [n.cpus for n in nodes.value] == [tuple(range(64))]
    assert m.bank_map == BankMap(4, 128) and not m.bank_map_assumed
    assert m.bank_provenance == f"declared in {path}"


def test_probe_says_what_was_read_declared_and_assumed(tmp_path: Path) -> None:
    from counterd.commands.probe import memory_lines

    m = read(fake_numa(tmp_path, {0: "0-1,4-5", 1: "2-3,6-7"}, "0-7"), tmp_path)
    text = "\n".join(memory_lines(m))
    assert "NUMA nodes 2: node 0 CPUs 0-1,4-5; node 1 CPUs 2-3,6-7 (read: sysfs" in text
    assert "channels 8 per NUMA node (assumed: memory channels are not in sysfs" in text
    assert "interleave 256 B (assumed:" in text
    assert "banks 16 x 256 B = 8 channels x 2 nodes, interleaved on 256 B (assumed)" in text
    assert "CPUs 0,2,1,3,4,6,5,7" in text
    from tests.machine_files import path as machine_path

    proc = _cli("counterd.commands.cli", "probe", "--machine", str(machine_path("xeon-2s-64cpu")))
    assert proc.returncode == 0, proc.stderr
    assert "channels 8 per NUMA node (declared in" in proc.stdout
    assert "banks 16 x 256 B = 8 channels x 2 nodes, interleaved on 256 B (declared)" \
        in proc.stdout
    proc = _cli("counterd.commands.cli", "probe", "--json", "--machine",
                str(machine_path("xeon-2s-64cpu")))
    mem = json.loads(proc.stdout)["machine"]["memory"]
    assert {k: mem[k]["provenance"] for k in ("numa_nodes", "channels_per_node",
                                             "interleave_bytes", "banks")} == dict.fromkeys(
        ("numa_nodes", "channels_per_node", "interleave_bytes", "banks"), "declared")


def test_cpulist_round_trip() -> None:
    for text in ("0", "0-3,8", "0-1,4-5,7", "2,4,6"):
        assert format_cpulist(parse_cpulist(text)) == text


@pytest.mark.parametrize("text", ["0-4000000000", "3-1", "-1", f"0-{MAX_CPU_ID + 1}",
                                  "x", "0-"])
def test_a_cpulist_beyond_any_machine_or_malformed_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)
