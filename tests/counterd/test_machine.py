"""The one machine description (counterd/machine.py): read from sysfs/procfs once per process,
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
from counterd.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]
KiB, MiB = 1 << 10, 1 << 20

HEAD = 'format = "counterd-machine"\nversion = 1\n'


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
    monkeypatch.delenv(machine.ENV_MACHINE, raising=False)
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
    m = machine.read(fake_host(tmp_path), tmp_path)
    assert [(lv.level, lv.size_bytes, lv.ways, lv.shared_cpus) for lv in m.levels] == [
        (1, 48 * KiB, 12, (0,)), (2, 2 * MiB, 16, (0,)), (3, 300 * MiB, 20, (0, 1))]
    assert m.l1i is not None and (m.l1i.size_bytes, m.l1i.ways) == (32 * KiB, 8)
    assert (m.tlb_entries, m.tlb_ways) == (None, None)  # sysfs has no DTLB
    assert "DTLB not in sysfs" in m.geometry.source and m.geometry.tlb_entries == 64
    assert m.bank_map == machine.HOST_BANKS and m.bank_map_assumed
    fp = m.fingerprint()
    assert fp["cpu_model"] == "Test CPU @ 2.0GHz" and fp["cpus_online"] == 2
    assert fp["caches"] == "L1=48K/12/64,L2=2M/16/64,L3=300M/20/64"
    # The same spec the predictor writes into profiles (predictor.profile.caches_spec).
    from predictor.profile import caches_spec

    assert fp["caches"] == caches_spec([{"level": lv.level, "size_bytes": lv.size_bytes,
                                         "ways": lv.ways, "line_bytes": lv.line_bytes}
                                        for lv in m.levels])


def test_unreadable_sysfs_falls_back_with_the_reason(tmp_path: Path) -> None:
    m = machine.read(tmp_path / "nothing", tmp_path / "nothing")
    assert not m.caches_known and m.caches_spec == ""
    assert m.geometry.source.startswith("fallback") and "sysfs failed" in m.geometry.source


def test_sysfs_is_read_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every consumer takes the machine from counterd.machine; the files behind it are read
    once, however many consumers ask. The host is a sysfs tree of the test's own, so that the
    reads are counted on any host (one without cache entries in its sysfs too)."""
    reads: Counter[str] = Counter()
    real, real_read = machine.read_text, machine.read
    root = fake_host(tmp_path)

    def counting(path: Path) -> str:
        reads[str(path)] += 1
        return real(path)

    monkeypatch.setattr(machine, "read_text", counting)
    monkeypatch.setattr(machine, "read", lambda *a, **k: real_read(root, root))
    machine.reset()
    from counterd.backends.callgrind import CallgrindBackend, CallgrindGeometry
    from counterd.backends.sim import SimBackend
    from counterd.host import host_info
    from counterd.probe import probe
    from microbench.patterns import host_machine
    from microbench.runner import host_metadata
    from predictor.profile import current_host

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
        return machine.read_text(path)

    machine.read(fake_host(tmp_path), tmp_path, reader=reader)
    assert len(reads) == len(set(reads)) and any(r.endswith("index3/size") for r in reads)


# ----------------------------------------------------------------------------- machine files


def test_machine_file_overrides_every_consumer(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sgi.toml"
    path.write_text(SGI)
    monkeypatch.setenv(machine.ENV_MACHINE, str(path))
    m = machine.current()
    assert m is machine.current() and m.file == str(path)
    assert m.geometry.spec() == "L1=32K/2/32,L2=1M/2/128,tlb=64/64,page=16K"
    assert m.geometry.private_levels == 1  # the L2 is shared by 8 CPUs
    from counterd.backends.callgrind import CallgrindGeometry, counter_support
    from counterd.backends.sim import SimBackend
    from microbench.patterns import host_machine
    from predictor.profile import current_host

    sim = SimBackend()
    assert sim.geometry == m.geometry and sim.bankmap == machine.BankMap(8, 128)
    assert "seed 004" in sim.available().reason
    cg = CallgrindGeometry.from_machine()
    assert cg.last_level == 2 and cg.d1.line_bytes == 32 and cg.i1.line_bytes == 64
    assert counter_support(cg.last_level)["l2_misses"] is None
    hm = host_machine()
    assert hm.bank_map == machine.BankMap(8, 128) and hm.bank_provenance == "seed 004"
    assert hm.page_bytes == 16384
    assert current_host() == {"hostname": "sgi", "cpu_model": "MIPS R10000", "cpus_online": 8,
                              "page_bytes": 16384, "caches": "L1=32K/2/32,L2=1M/2/128"}


def test_partial_machine_file_keeps_the_rest_of_the_host(tmp_path: Path) -> None:
    host = machine.read(fake_host(tmp_path), tmp_path)
    path = tmp_path / "tlb.toml"
    path.write_text(HEAD + "\n[tlb]\nentries = 1536\nways = 12\n")
    m = machine.load_file(path, base=host)
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
    proc = _cli("counterd.cli", "probe", "--json", "--machine", str(path))
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
    proc = _cli("counterd.cli", "record", "--machine", str(path), "--backend", "sim",
                "--out", str(out), "--", sys.executable,
                str(ROOT / "examples" / "bsp_sum.py"), "20000", "1")
    assert proc.returncode == 0, proc.stderr
    from counterd.records import read_jsonl

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
    "version": ('format = "counterd-machine"\nversion = 2\n', "version = 2",
                "reads version 1"),
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
    _one_line_exit_2(_cli("counterd.cli", "probe", "--machine", str(path)), path, field, fix)


@pytest.mark.parametrize("case", ["line48", "not_utf8", "unknown_key"])
def test_bad_machine_file_through_every_cli(tmp_path: Path, case: str) -> None:
    path, field, fix = _bad_file(tmp_path, case)
    out = tmp_path / "out.jsonl"
    runs = [
        ("counterd.cli", "record", "--machine", str(path), "--out", str(out), "--", "true"),
        ("microbench.cli", "run", "--machine", str(path), "--out", str(tmp_path / "r.json")),
        ("microbench.cli", "list", "--machine", str(path)),
    ]
    for args in runs:
        _one_line_exit_2(_cli(*args), path, field, fix)
    env = {machine.ENV_MACHINE: str(path)}
    records = tmp_path / "rec.jsonl"
    records.write_text(json.dumps({"format": 1, "run_id": "r", "index": 0, "name": "s",
                                   "rank": 0, "begin_ns": 0, "end_ns": 10, "counters": {}})
                       + "\n")
    for args in [("counterd.cli", "probe"),
                 ("counterd.cli", "record", "--out", str(out), "--", "true"),
                 ("microbench.cli", "list"),
                 ("predictor.cli", "--profile", "sgi-power-challenge", "--counters",
                  str(records))]:
        _one_line_exit_2(_cli(*args, env=env), path, field, fix)
    assert not out.exists() and not (tmp_path / "r.json").exists()


def test_missing_machine_file(tmp_path: Path) -> None:
    proc = _cli("counterd.cli", "probe", "--machine", str(tmp_path / "none.toml"))
    assert proc.returncode == 2 and "cannot read machine file" in proc.stderr
    with pytest.raises(BadInput, match="cannot read machine file"):
        machine.load_file(tmp_path / "none.toml")
