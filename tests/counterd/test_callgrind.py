"""counterd.backends.callgrind: dump parsing, event mapping, geometry, and real runs.

The runs check simulated counts against counts worked out by hand for strided kernels whose
access streams are exact (counterd/_native/kernels.c). One valgrind run of a Python script
serves every check (python under callgrind with cache simulation takes 10-20 s).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from counterd import _native
from counterd.backends.callgrind import CallgrindBackend
from counterd.backends.callgrind.counting import (
    boundary_calls_from_spool,
    count_command,
    count_supersteps,
)
from counterd.backends.callgrind.dumps import (
    Dump,
    SuperstepCounts,
    counter_support,
    parse_dump,
    supersteps_from_dumps,
    to_canonical,
)
from counterd.backends.callgrind.geometry import (
    CacheSpec,
    CallgrindGeometry,
    adjust_cache,
    valgrind_geometry,
)
from counterd.backends.callgrind.run import CallgrindRun
from counterd.backends.callgrind.run import run as callgrind_run
from counterd.backends.callgrind.valgrind import CallgrindError, valgrind_argv
from counterd.data.errors import BackendUnavailable, BadInput
from counterd.data.events import NAMES, Source
from counterd.data.records import read_jsonl
from counterd.machine.sysfs import read as read_machine
from tests._signals import HOWS, signal_of, stop_when_ready

# A dump as callgrind 3.19 writes it (--dump-line=no), cut down: header, two functions, a call
# whose following line is the call's inclusive cost (not self cost), and the totals line.
CANNED = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 4242
cmd:  /usr/bin/python3 prog.py --n 10
part: 2


desc: I1 cache: 32768 B, 64 B, 8-way associative
desc: D1 cache: 49152 B, 64 B, 12-way associative
desc: LL cache: 262144 B, 64 B, 8-way associative

desc: Timerange: Basic block 110005492 - 110006737
desc: Trigger: --dump-before=counterd_superstep_boundary

positions: line
events: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw ILdmr DLdmr DLdmw
summary: 1110 520 45 1 160 40 1 101 30 0 7 5


ob=(2) /work/main/counterd/_native/libcounterd.so
fl=(52) ???
fn=(2110) counterd_load_stride
0 1000 500 0 0 150 0 0 100 0 0 7
cob=(6) /usr/lib/libc.so.6
cfi=(287) ???
cfn=(2112) memset
calls=2 77
0 110 20 45 1 10 40 1 1 30 0 0 5

fn=(2112)
0 110 20 45 1 10 40 1 1 30 0 0 5

totals: 1110 520 45 1 160 40 1 101 30 0 7 5
"""


def test_parse_dump_header_and_totals() -> None:
    d = parse_dump(CANNED)
    assert d.pid == 4242 and d.part == 2
    assert d.cmd == "/usr/bin/python3 prog.py --n 10"
    assert d.trigger == "--dump-before=counterd_superstep_boundary"
    assert not d.final and d.complete
    assert d.events[:3] == ("Ir", "Dr", "Dw") and len(d.events) == 12
    assert d.totals["Ir"] == 1110 and d.totals["Dr"] == 520 and d.totals["Dw"] == 45
    assert d.totals["D1mr"] == 160 and d.totals["DLmw"] == 30 and d.totals["DLdmw"] == 5
    assert "LL cache: 262144 B, 64 B, 8-way associative" in d.desc


def test_parse_dump_sums_self_costs_without_totals() -> None:
    # Killed while writing: no summary/totals. Self costs are summed; the line after calls=
    # (inclusive cost of the call) must not be, or Ir would be 1220 instead of 1110.
    text = "\n".join(line for line in CANNED.splitlines()
                     if not line.startswith(("totals:", "summary:")))
    d = parse_dump(text)
    assert not d.complete
    assert d.totals["Ir"] == 1110 and d.totals["Dr"] == 520 and d.totals["Dw"] == 45
    assert d.totals["D1mr"] == 160 and d.totals["DLmr"] == 101 and d.totals["DLdmw"] == 5
    # Events missing at the end of a cost line are zero.
    assert d.totals["ILdmr"] == 0


def test_parse_dump_rejects_non_dumps() -> None:
    with pytest.raises(CallgrindError, match="events"):
        parse_dump("hello\nworld\n")


def test_to_canonical_maps_events_for_each_last_level() -> None:
    totals = {"Ir": 9, "Dr": 5, "Dw": 3, "D1mr": 2, "D1mw": 1, "DLmr": 7, "DLmw": 11,
              "ILdmr": 13, "DLdmr": 17, "DLdmw": 19, "I1mr": 0, "ILmr": 0}
    c3 = to_canonical(totals, 3)
    assert {k: v.raw for k, v in c3.items()} == {
        "instructions": 9, "loads": 5, "stores": 3, "l1d_misses": 3, "l3_misses": 18,
        "l3_writebacks": 13 + 17 + 19}
    assert all(v.source is Source.SIMULATED and v.ratio == 1.0 for v in c3.values())
    c2 = to_canonical(totals, 2)
    assert c2["l2_misses"].value == 18.0 and c2["l2_writebacks"].value == 49.0
    assert "l3_misses" not in c2
    # Without cache simulation only Ir exists.
    assert set(to_canonical({"Ir": 4}, 3)) == {"instructions"}


def test_counter_support_names_every_counter_with_reasons() -> None:
    s3 = counter_support(3)
    assert set(s3) == set(NAMES)
    assert s3["l3_misses"] is None and s3["l3_writebacks"] is None
    assert s3["l2_misses"] == "callgrind simulates two levels: L1 and the last level"
    assert "last level only" in (s3["l1d_writebacks"] or "")
    for name in ("cycles", "task_clock_ns", "page_faults", "dtlb_misses"):
        assert s3[name]
    s2 = counter_support(2)
    assert s2["l2_misses"] is None and "no L3" in (s2["l3_misses"] or "")


def test_adjust_cache_for_non_power_of_two_sets() -> None:
    host = CacheSpec(300 << 20, 20, 64)  # this host's L3: 245,760 sets
    sim, adj = adjust_cache("LL", host)
    assert sim == CacheSpec(304 << 20, 19, 64) and sim.sets == 1 << 18
    assert adj is not None and adj.host == host and "245760 sets -> 262144" in adj.reason
    ok = CacheSpec(48 << 10, 12, 64)  # 64 sets: accepted as is
    assert adjust_cache("D1", ok) == (ok, None)
    with pytest.raises(BadInput, match="line"):
        adjust_cache("LL", CacheSpec(96 * 48, 1, 48))


def _fake_cache(root: Path, index: int, level: int, kind: str, size: str, ways: int) -> None:
    d = root / "devices/system/cpu/cpu0/cache" / f"index{index}"
    d.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size),
                        ("ways_of_associativity", ways), ("coherency_line_size", 64)):
        (d / name).write_text(f"{value}\n")


def test_geometry_from_sysfs_fixture(tmp_path: Path) -> None:
    _fake_cache(tmp_path, 0, 1, "Data", "48K", 12)
    _fake_cache(tmp_path, 1, 1, "Instruction", "32K", 8)
    _fake_cache(tmp_path, 2, 2, "Unified", "2048K", 16)
    _fake_cache(tmp_path, 3, 3, "Unified", "307200K", 20)
    g = CallgrindGeometry.from_machine(read_machine(tmp_path, tmp_path))
    assert g.last_level == 3 and g.d1 == CacheSpec(48 << 10, 12, 64)
    assert g.ll == CacheSpec(304 << 20, 19, 64)
    assert [a.level for a in g.adjustments] == ["LL"]
    argv = valgrind_argv(["prog", "-x"], g, tmp_path / "out")
    assert argv[:2] == ["valgrind", "--tool=callgrind"] and argv[-2:] == ["prog", "-x"]
    for opt in ("--cache-sim=yes", "--simulate-wb=yes", "--D1=49152,12,64",
                f"--LL={304 << 20},19,64", "--trace-children=yes",
                "--dump-before=counterd_superstep_boundary",
                f"--callgrind-out-file={tmp_path / 'out' / 'callgrind.out.'}%p"):
        assert opt in argv


def test_geometry_from_sysfs_two_levels_and_missing(tmp_path: Path) -> None:
    _fake_cache(tmp_path, 0, 1, "Data", "32K", 8)
    _fake_cache(tmp_path, 1, 1, "Instruction", "32K", 8)
    _fake_cache(tmp_path, 2, 2, "Unified", "1024K", 16)
    assert CallgrindGeometry.from_machine(read_machine(tmp_path, tmp_path)).last_level == 2
    assert not CallgrindBackend(read_machine(tmp_path, tmp_path)).available(
        ).counters["l2_misses"]
    with pytest.raises(BadInput, match="pass the geometry"):
        CallgrindGeometry.from_machine(read_machine(tmp_path / "nothing", tmp_path))


def _dump(part: int, ir: int, *, final: bool = False) -> Dump:
    trigger = "Program termination" if final else "--dump-before=counterd_superstep_boundary"
    return Dump(("Ir", "Dr"), {"Ir": ir, "Dr": ir // 10}, 7, part, "", trigger)


def test_supersteps_from_dumps_pairs_nesting_and_death() -> None:
    # Calls: B0 E0 B1 B2 E2 E1 B3 (then exit). Dump k ends at call k; the final is part 8.
    calls = [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1), (1, 1), (3, 0)]
    dumps = [_dump(k, 100 * k) for k in range(1, 8)] + [_dump(8, 800, final=True)]
    got = {s.index: s for s in supersteps_from_dumps(dumps, calls, 3)}
    assert got[0].parts == (2,) and got[0].events["Ir"] == 200 and got[0].complete
    assert got[2].parts == (5,) and got[2].counters["loads"].raw == 50
    assert got[1].parts == (4, 5, 6) and got[1].events["Ir"] == 1500  # includes nested 2
    assert got[3].parts == (8,) and not got[3].complete and "never ended" in got[3].problem
    # The same run killed before exit: no final dump.
    killed = {s.index: s for s in supersteps_from_dumps(dumps[:-1], calls, 3)}
    assert killed[3].parts == () and "killed" in killed[3].problem
    assert killed[0].complete


def test_supersteps_from_dumps_when_no_dump_was_cut() -> None:
    # What happens when the boundary symbol is called straight from ctypes (module docstring).
    got = supersteps_from_dumps([_dump(1, 5, final=True)], [(0, 0), (0, 1)], 3)
    assert not got[0].complete and "must be called from C" in got[0].problem


def test_boundary_calls_from_spool_order(tmp_path: Path) -> None:
    # Lines as counterd.markers.recorder.SpoolSink writes them: begin before the begin call, record
    # after the end call; a record closed at exit (end_ns null) made no call; an unmatched end
    # made one for no superstep.
    lines = [
        {"ev": "begin", "index": 0, "name": "a", "rank": 1},
        {"ev": "record", "index": 0, "end_ns": 5, "flags": []},
        {"ev": "record", "index": 1, "end_ns": 6, "flags": ["unmatched_end"]},
        {"ev": "begin", "index": 2, "name": "b", "rank": 1},
        {"ev": "record", "index": 2, "end_ns": None, "flags": ["incomplete"]},
    ]
    path = tmp_path / "77.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"ev": "beg')
    calls, begins = boundary_calls_from_spool(path)
    assert calls == [(0, 0), (0, 1), (-1, 1), (2, 0)]
    assert sorted(begins) == [0, 2] and begins[2]["name"] == "b"


def test_a_counted_superstep_that_raised_keeps_its_text(tmp_path: Path) -> None:
    """Issue 34: the counted run's record of a superstep that raised carries the spool
    record's exception text; a text no record may hold (too long, several lines, not text) is
    left out, the flag kept."""
    lines = [{"ev": "begin", "index": 0, "name": "a"},
             {"ev": "record", "index": 0, "end_ns": 5, "flags": ["exception"],
              "exception": "ValueError: bad row 7"}]
    for i, bad in enumerate(["x" * 201, "a\nb", 3], start=1):
        lines += [{"ev": "begin", "index": i, "name": "b"},
                  {"ev": "record", "index": i, "end_ns": 5, "flags": ["exception"],
                   "exception": bad}]
    path = tmp_path / "77.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    _, begins = boundary_calls_from_spool(path)
    assert [begins[i]["raised"] for i in range(4)] == ["ValueError: bad row 7", True, True, True]


def test_backend_open_refuses_and_points_to_record() -> None:
    with pytest.raises(BackendUnavailable, match="whole commands") as info:
        CallgrindBackend().open(["loads"])
    assert "counterd record --backend callgrind" in (info.value.fix or "")
    cap = CallgrindBackend().available()
    assert cap.backend == "callgrind" and set(cap.counters) == set(NAMES)
    if shutil.which("valgrind") is None:
        assert not cap.available and "apt-get install valgrind" in cap.reason


# --------------------------------------------------------------------------------------------
# Real runs

needs_valgrind = pytest.mark.skipif(shutil.which("valgrind") is None,
                                    reason="valgrind is not on PATH (apt-get install valgrind)")

N = 100_000  # elements, one per 64-byte line: 6.4 MB, far larger than every cache below
STRIDE = 8  # uint64 words = 64 bytes
CHILD_N = 1_000
# Small explicit geometry so the array exceeds the LL (4,096 lines of 64 B).
GEOMETRY = CallgrindGeometry(CacheSpec(32 << 10, 8, 64), CacheSpec(32 << 10, 8, 64),
                             CacheSpec(256 << 10, 8, 64), last_level=3)
LL_LINES = (256 << 10) // 64
MARK = "counterd_superstep_mark"  # the C wrapper the marker API must call (module docstring)

# The array is a ctypes buffer (zeroed by calloc, untouched, as numpy.zeros's is): importing
# numpy for it cost the run 257 M instructions under Callgrind, half of its CPU.
SCRIPT = """\
import ctypes, os, sys
from counterd._native import lib

L = lib()
if sys.argv[1]:
    shim = ctypes.CDLL(sys.argv[1])  # defines counterd_superstep_boundary and the wrapper
    mark = shim.counterd_superstep_mark
else:
    mark = L.counterd_superstep_mark
mark.argtypes = [ctypes.c_int64, ctypes.c_int32]
mark.restype = ctypes.c_int64
n, stride = {N}, {STRIDE}
a = (ctypes.c_uint64 * (n * stride))()
p = ctypes.addressof(a)
with open(sys.argv[2], "w") as fh:
    fh.write(str(os.getpid()))

def step(i, fn, *args):
    mark(i, 0)
    fn(p, *args)
    mark(i, 1)

step(0, L.counterd_load_stride, 0, stride, 1)       # baseline: same call, no elements
step(1, L.counterd_load_stride, n, stride, 1)
step(2, L.counterd_store_stride, 0, stride, 1, 7)   # baseline
step(3, L.counterd_store_stride, n, stride, 1, 7)
step(4, L.counterd_load_stride, n, stride, 1)       # evicts the dirty lines of step 3
pid = os.fork()
if pid == 0:
    step(0, L.counterd_load_stride, {CHILD_N}, stride, 1)
    os._exit(0)
os.waitpid(pid, 0)
"""

SHIM = """\
#include <stdint.h>
__attribute__((noinline, visibility("default")))
int64_t counterd_superstep_boundary(int64_t index, int32_t kind)
{ __asm__ volatile("" ::: "memory"); return index * 2 + kind; }
__attribute__((visibility("default")))
int64_t counterd_superstep_mark(int64_t index, int32_t kind)
{ int64_t r = counterd_superstep_boundary(index, kind); __asm__ volatile("" ::: "memory");
  return r; }
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> str:
    """"" when libcounterd has the C wrapper the marker API must call, else the path of a
    library with the same two functions, built here (skip without a C compiler)."""
    lib = _native.lib()
    if lib is None:
        pytest.skip(_native.missing_reason())
    if hasattr(lib, MARK):
        return ""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip(f"libcounterd lacks {MARK} and there is no C compiler to build it")
    tmp = tmp_path_factory.mktemp("shim")
    (tmp / "shim.c").write_text(SHIM)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp / "libshim.so"),
                    str(tmp / "shim.c")], check=True)
    return str(tmp / "libshim.so")


ROOT = str(Path(__file__).resolve().parents[2])
ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ROOT}


@pytest.fixture(scope="module")
def strided(tmp_path_factory: pytest.TempPathFactory, shim: str) -> tuple[CallgrindRun, int]:
    """The run and the pid of the script's main process."""
    tmp = tmp_path_factory.mktemp("callgrind")
    script = tmp / "strided.py"
    script.write_text(SCRIPT.format(N=N, STRIDE=STRIDE, CHILD_N=CHILD_N))
    run = callgrind_run([sys.executable, str(script), shim, str(tmp / "pid")], GEOMETRY,
                        tmp / "out", ENV, timeout=300)
    return run, int((tmp / "pid").read_text())


def _steps(run: CallgrindRun, pid: int, n_steps: int) -> dict[int, SuperstepCounts]:
    calls = [(i, k) for i in range(n_steps) for k in (0, 1)]
    return {s.index: s for s in supersteps_from_dumps(run.dumps[pid], calls, 3, pid)}


@pytest.mark.callgrind
@needs_valgrind
def test_dump_files_per_boundary_call(strided: tuple[CallgrindRun, int]) -> None:
    strided_run, main = strided
    assert strided_run.exit_code == 0
    assert len(strided_run.dumps) == 2, strided_run.dumps.keys()  # the script and its fork
    for pid, dumps in strided_run.dumps.items():
        calls = 10 if pid == main else 2
        # N boundary calls -> parts 1..N, then the final dump (no file suffix) as part N+1.
        assert [d.part for d in dumps] == list(range(1, calls + 2))
        assert all(d.pid == pid and d.complete for d in dumps)
        assert [d.final for d in dumps] == [False] * calls + [True]
        assert dumps[0].trigger == "--dump-before=counterd_superstep_boundary"
        assert dumps[-1].path == strided_run.outdir / f"callgrind.out.{pid}"
        assert dumps[0].path == strided_run.outdir / f"callgrind.out.{pid}.1"
        assert "LL cache: 262144 B, 64 B, 8-way associative" in dumps[0].desc


@pytest.mark.callgrind
@needs_valgrind
def test_strided_loads(strided: tuple[CallgrindRun, int]) -> None:
    s = _steps(*strided, 5)
    assert all(x.complete for x in s.values())
    base, load = s[0].counters, s[1].counters

    def d(name: str) -> float:
        return load[name].value - base[name].value

    # The baseline makes the same ctypes call with n=0, so the difference is the loop alone:
    # exactly N loads and no stores; the loop's own stack traffic is absent at -O2.
    assert abs(d("loads") - N) <= 50
    assert abs(d("stores")) <= 50
    # Every element is on a new 64-byte line and the array is 25x the LL: all miss both levels.
    assert d("l1d_misses") == pytest.approx(N, rel=0.01)
    assert d("l3_misses") == pytest.approx(N, rel=0.01)
    assert d("instructions") >= 3 * N  # load, add, index update, compare+branch per element
    # Absolute overhead of one marked superstep around a ctypes call: documented in the module.
    assert base["loads"].value < 20_000


@pytest.mark.callgrind
@needs_valgrind
def test_strided_stores_and_last_level_writebacks(strided: tuple[CallgrindRun, int],
                                                  ) -> None:
    s = _steps(*strided, 5)
    base, store, reload = s[2].counters, s[3].counters, s[4].counters
    assert abs(store["stores"].value - base["stores"].value - N) <= 50
    assert store["l1d_misses"].value - base["l1d_misses"].value == pytest.approx(N, rel=0.01)
    # Write-allocate, write-back LL of LL_LINES lines, full of clean lines from step 1: the
    # first LL_LINES store misses evict clean lines, every later one a dirty line of its own.
    # Tolerance 1% of N: the interpreter's own dirty lines share the LL.
    wb = store["l3_writebacks"].value - base["l3_writebacks"].value
    assert wb == pytest.approx(N - LL_LINES, abs=0.01 * N)
    # The next load pass writes back the LL_LINES dirty lines left by the store pass, and no
    # more; some leave between the supersteps already (the interpreter runs in between).
    assert 0.85 * LL_LINES <= reload["l3_writebacks"].value <= LL_LINES + 200
    assert reload["l3_misses"].value == pytest.approx(N, rel=0.01)


@pytest.mark.callgrind
@needs_valgrind
def test_forked_child_has_its_own_dumps(strided: tuple[CallgrindRun, int]) -> None:
    strided_run, main = strided
    (child,) = [pid for pid in strided_run.dumps if pid != main]
    s = _steps(strided_run, child, 1)[0]
    assert s.complete and s.parts == (2,)
    # Costs start from zero at the fork: the child's superstep is its loop plus the marker
    # overhead, not the parent's history.
    assert CHILD_N <= s.counters["loads"].value <= CHILD_N + 20_000
    assert s.counters["l1d_misses"].value >= CHILD_N * 0.99


@pytest.mark.callgrind
@needs_valgrind
def test_run_missing_command_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="command not found") as info:
        callgrind_run(["no-such-command-xyz"], GEOMETRY, tmp_path)
    assert info.value.fix


@pytest.mark.callgrind
@needs_valgrind
def test_cross_check_with_sim_backend(strided: tuple[CallgrindRun, int]) -> None:
    """The same streams through counterd.backends.sim with callgrind's two levels (D1 and LL as
    sim's L1 and L2): per-pass misses agree within 1% of N, writebacks within 1% of N for the
    store pass and 10% of the LL's lines for the following load pass.

    The models differ where these tolerances allow: callgrind's D1 is write-through (dirty
    lines live in the LL only), sim's L1 is write-back into L2; callgrind's caches hold the
    interpreter's lines too, sim's start cold.
    """
    sim = pytest.importorskip("counterd.sim")
    s = _steps(*strided, 5)
    geo = sim.Geometry((sim.CacheLevel(1, 32 << 10, 8, 64), sim.CacheLevel(2, 256 << 10, 8, 64)))
    engine = sim.CacheSim(geo)
    base = 1 << 30  # page- and line-aligned: one line per element, as in the run
    before = engine.counts().canonical()
    got = {}
    for step, kernel in ((1, "load_stride"), (3, "store_stride"), (4, "load_stride")):
        engine.feed(sim.StridedStream.from_kernel(kernel, N, STRIDE, 1, base))
        after = engine.counts().canonical()
        got[step] = {k: after[k] - before[k] for k in after}
        before = after

    def cg_delta(step: int, name: str) -> float:
        baseline = s[0] if step in (1, 4) else s[2]
        return s[step].counters[name].value - baseline.counters[name].value

    for step in (1, 3, 4):
        assert cg_delta(step, "l1d_misses") == pytest.approx(got[step]["l1d_misses"],
                                                             abs=0.01 * N)
        assert cg_delta(step, "l3_misses") == pytest.approx(got[step]["l2_misses"], abs=0.01 * N)
    assert got[3]["l2_writebacks"] == pytest.approx(N - LL_LINES, abs=0.01 * N)
    assert cg_delta(3, "l3_writebacks") == pytest.approx(got[3]["l2_writebacks"], abs=0.01 * N)
    assert s[4].counters["l3_writebacks"].value == pytest.approx(got[4]["l2_writebacks"],
                                                                 rel=0.10)


MARKED = """\
import ctypes, sys
import counterd
from counterd import _native
from counterd.markers.api import recorder

L = _native.lib()
if sys.argv[1]:
    wrapper = ctypes.CDLL(sys.argv[1]).counterd_superstep_mark
    wrapper.argtypes = [ctypes.c_int64, ctypes.c_int32]

    class Native:  # what the marker API calls at begin and end, routed through the wrapper
        counterd_superstep_boundary = wrapper

    recorder()._native = Native()
n, stride = {N}, {STRIDE}
buf = (ctypes.c_uint64 * (n * stride))()
with counterd.superstep("load", n=n):
    L.counterd_load_stride(buf, n, stride, 1)
with counterd.superstep("store", n=n):
    L.counterd_store_stride(buf, n, stride, 1, 7)
step = counterd.superstep("never ended")
"""


@pytest.mark.callgrind
@needs_valgrind
def test_count_supersteps_with_the_marker_api(tmp_path: Path, shim: str) -> None:
    """End to end: counterd.superstep markers in a program -> spool + dumps -> records."""
    script = tmp_path / "marked.py"
    script.write_text(MARKED.format(N=N, STRIDE=STRIDE))
    recs = count_supersteps([sys.executable, str(script), shim], run_id="t1", env=ENV,
                            geometry=GEOMETRY, outdir=tmp_path / "out", timeout=300)
    assert sorted(recs) == [(0, 0), (0, 1), (0, 2)]
    load, store, dangling = recs[(0, 0)], recs[(0, 1)], recs[(0, 2)]
    assert load.name == "load" and load.params == {"n": N} and load.backend == "callgrind"
    assert "incomplete" not in load.flags and "unsupported_counters" in load.flags
    # The marker API's own work between the boundary calls (a spool write, a clock read) is
    # inside the superstep: a few thousand accesses on top of the kernel's N.
    assert N <= load.counters["loads"].value <= N + 20_000
    assert load.counters["l3_misses"].value == pytest.approx(N, rel=0.02)
    assert N <= store.counters["stores"].value <= N + 20_000
    # At least the store pass's own dirty lines beyond the LL's capacity; at most all of them,
    # the rest being the interpreter's: the marker API's work between the supersteps (building
    # and writing a record) leaves dirty lines in the LL that the store pass evicts.
    assert N - LL_LINES - 0.01 * N <= store.counters["l3_writebacks"].value <= N
    assert all(v.source is Source.SIMULATED for v in load.counters.values())
    assert "cycles" in load.unsupported
    # Begun and never ended: closed at exit, counted up to process exit, flagged.
    assert "incomplete" in dangling.flags and dangling.end_ns is None
    assert "never ended" in dangling.unsupported["*"]


def test_the_counted_run_serialises_thread_pools_unless_told(monkeypatch, tmp_path: Path) -> None:
    """Under valgrind, spinning BLAS/OpenMP workers run for whole slices and count as work: the
    counted run gets one thread per pool; a value the user set is kept; the spool and backend
    are always the counted run's own."""
    seen: list[dict[str, str]] = []

    def fake_run(cmd, geo, outdir, env, timeout, show_stdout=True, from_first_superstep=False):
        seen.append(dict(env))
        assert not show_stdout  # the timed run already showed the command's output
        return CallgrindRun(0, tmp_path, tuple(cmd), geo)

    monkeypatch.setattr("counterd.backends.callgrind.counting.run", fake_run)
    count_command(["prog"], run_id="r", env={"PATH": "/bin", "OMP_NUM_THREADS": "4"},
                  geometry=GEOMETRY)
    env = seen[0]
    assert env["OPENBLAS_NUM_THREADS"] == "1" and env["MKL_NUM_THREADS"] == "1"
    assert env["OMP_NUM_THREADS"] == "4" and env["PATH"] == "/bin"
    assert env["COUNTERD_BACKEND"] == "callgrind" and env["COUNTERD_SPOOL"]


def test_the_counted_run_removes_its_dumps_unless_told_where(monkeypatch, tmp_path: Path) -> None:
    """``counterd record --backend callgrind`` reads the dumps and removes them (a directory
    of dumps was left in the temporary directory by every recording); an ``outdir`` the caller
    names is kept."""
    dirs: list[Path] = []

    def fake_run(cmd, geo, outdir, env, timeout, show_stdout=True, from_first_superstep=False):
        dirs.append(Path(outdir))
        (Path(outdir) / "callgrind.out.1").write_text("")
        return CallgrindRun(0, Path(outdir), tuple(cmd), geo)

    monkeypatch.setattr("counterd.backends.callgrind.counting.run", fake_run)
    count_command(["prog"], run_id="r", env={}, geometry=GEOMETRY)
    assert dirs[0].name.startswith("counterd-cg-") and not dirs[0].exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    count_command(["prog"], run_id="r", env={}, geometry=GEOMETRY, outdir=kept)
    assert dirs[1] == kept and (kept / "callgrind.out.1").exists()


# The timed run ends at once; under callgrind the second superstep signals that it has begun
# and waits to be stopped, for 120 s at most (then it ends, unstopped, and the test fails). It
# waits in short sleeps: a SIGINT that valgrind takes while the program runs, just before it
# enters a sleep, is held until that sleep returns (3 of 10 tries of a 20 s sleep under
# callgrind here: the KeyboardInterrupt came after 20.01 s); a SIGTERM is acted on at once. One
# sleep of 120 s made the Ctrl-C case take 136-144 s against 13-35 s for SIGTERM.
STOPPED = """\
import os, pathlib, time
import counterd
with counterd.superstep("done", n=1):
    pass
with counterd.superstep("waits", n=2):
    if os.environ.get("COUNTERD_BACKEND") == "callgrind":
        pathlib.Path(sys_argv_ready).write_text("x")
        for _ in range(1200):
            time.sleep(0.1)
"""


@pytest.mark.callgrind
@needs_valgrind
@pytest.mark.parametrize("how", HOWS)
def test_a_signal_stops_the_counted_run_and_what_it_counted_is_kept(tmp_path: Path,
                                                                      how: str) -> None:
    """Issue 34: valgrind runs in its own session, where the terminal's Ctrl-C never reached
    it and a kill of the recorder left it running. The recorder passes the signal on, the
    counted run stops, the records are written (the superstep it finished with its counters,
    the one it was inside flagged), and the recorder ends as a shell reports the signal."""
    if not hasattr(_native.lib(), MARK):
        pytest.skip(f"libcounterd lacks {MARK}: the markers cut no callgrind dump")
    sig = signal_of(how)
    ready = tmp_path / "ready"
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED.replace("sys_argv_ready", repr(str(ready))))
    out = tmp_path / "r.jsonl"
    # valgrind unwinds the interrupted program 20-100x slower, on a host shared by others
    err = stop_when_ready(
        [sys.executable, "-m", "counterd.commands.cli", "record", "--backend", "callgrind", "--out",
         str(out), "--machine", str(Path(ROOT) / "tests/machine_files/amd-2cpu-32m.toml"),
         "--", sys.executable, str(script)], ready, how, cwd=Path(ROOT), ready_within_s=240,
        end_within_s=240)
    recs = sorted(read_jsonl(out), key=lambda r: r.index)
    assert [(r.name, r.end_ns is not None) for r in recs] == [("done", True), ("waits", True)]
    done, waits = recs
    assert "loads" in done.counters and "counters_missing" not in done.flags
    assert {"incomplete", "counters_missing"} & waits.flags and waits.unsupported["*"]
    assert f"its count under callgrind stopped by {sig.name} (exit {128 + sig})" in err


@pytest.mark.callgrind
@needs_valgrind
def test_the_counted_run_does_not_repeat_the_commands_messages(tmp_path: Path) -> None:
    """Issue 34: the command's traceback was printed twice, by the timed run and again by the
    run under callgrind. The second run's standard error is kept, not shown; the exception is
    still flagged on the record."""
    script = tmp_path / "raises.py"
    script.write_text("import counterd\nwith counterd.superstep('bad'):\n"
                      "    raise ValueError('bad input 42')\n")
    out = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record", "--backend",
                           "callgrind", "--out", str(out), "--", sys.executable, str(script)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("ValueError: bad input 42") == 1, proc.stderr
    assert proc.stderr.count("Traceback") == 1 and "the run under callgrind exited" not in \
        proc.stderr
    [rec] = read_jsonl(out)
    assert "exception" in rec.flags
    assert rec.exception == "ValueError: bad input 42"  # what it raised, kept (issue 34)


@pytest.mark.callgrind
@needs_valgrind
def test_a_command_stopped_in_its_timed_run_is_not_run_again_under_callgrind(
        tmp_path: Path) -> None:
    """Stopped by a signal in the timed run, the command is not run a second time, 20-100x
    slower: its records say they were not counted, and the recorder ends 128 + N."""
    script = tmp_path / "stops.py"
    script.write_text("import os, signal, counterd\nwith counterd.superstep('done'):\n"
                      "    pass\nos.kill(os.getpid(), signal.SIGTERM)\n")
    out = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record", "--backend",
                           "callgrind", "--out", str(out), "--", sys.executable, str(script)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143, proc.stderr
    assert "not counting under callgrind: the command was stopped by SIGTERM" in proc.stderr
    assert "counting under callgrind: the command runs a second time" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "; command killed by SIGTERM (exit 143)")
    [done] = read_jsonl(out)
    assert "counters_missing" in done.flags and "before its run under callgrind" in \
        done.unsupported["*"]


def test_with_the_prefetcher_valgrind_simulates_it_instead_of_writebacks(tmp_path: Path) -> None:
    """``--prefetch``: valgrind's prefetcher works only without its write-back simulator
    (callgrind/sim.c), so the argv asks for one or the other, and the writebacks are then
    reported as not counted, with the reason."""
    from dataclasses import replace

    g = valgrind_geometry(CacheSpec(32 << 10, 8, 64), CacheSpec(48 << 10, 12, 64),
                          CacheSpec(2 << 20, 16, 64), last_level=2)
    plain = valgrind_argv(["prog"], g, tmp_path)
    with_pf = valgrind_argv(["prog"], replace(g, prefetch=True), tmp_path)
    assert "--simulate-wb=yes" in plain and "--simulate-hwpref=yes" not in plain
    assert "--simulate-hwpref=yes" in with_pf and not any("simulate-wb" in a for a in with_pf)
    s = counter_support(2, prefetch=True)
    assert s["l2_misses"] is None
    assert "prefetcher" in (s["l2_writebacks"] or "")
    assert counter_support(2)["l2_writebacks"] is None


def test_prefetch_is_refused_without_callgrind(tmp_path: Path) -> None:
    """Bad input, before the command runs: one line saying what and how, exit 2."""
    marker = tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record", "--backend",
                           "none", "--prefetch", "--out", str(tmp_path / "r.jsonl"), "--",
                           "touch", str(marker)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "give --backend callgrind" in proc.stderr
    assert not marker.exists() and not (tmp_path / "r.jsonl").exists()


STREAM = """\
import numpy as np
import counterd
a = np.ones(1 << 21)  # 16 MiB: eight times the L2 of the machine file
with counterd.superstep("stream"):
    for _ in range(3):
        a.sum()
"""


@pytest.mark.callgrind
@needs_valgrind
def test_the_prefetcher_covers_a_stream_that_outgrows_the_l2(tmp_path: Path) -> None:
    """A sum streamed three times over an array eight times the L2: without the prefetcher
    every line misses the L2 each pass (one miss per 8 loads of 8 bytes); with it, the stream
    is fetched ahead and under a tenth of those remain (measured 2026-11-28 on the Intel KVM
    guest: 752,000 and 25,000)."""
    from predictor.pilot.regime import machine_text
    from tests import machine_files

    mfile = tmp_path / "l2.toml"
    mfile.write_text(machine_text(machine_files.load("intel-2cpu-300m"), 2 << 20))
    script = tmp_path / "stream.py"
    script.write_text(STREAM)
    got = {}
    for flag in ((), ("--prefetch",)):
        out = tmp_path / f"r{len(flag)}.jsonl"
        proc = subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record",
                               "--backend", "callgrind", *flag, "--machine", str(mfile),
                               "--out", str(out), "--", sys.executable, str(script)],
                              cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        [rec] = read_jsonl(out)
        got[flag] = rec
    plain, pf = got[()], got[("--prefetch",)]
    lines = 3 * (1 << 21) / 8
    assert plain.counters["l2_misses"].value > 0.9 * lines
    assert pf.counters["l2_misses"].value < 0.1 * plain.counters["l2_misses"].value
    assert "l2_writebacks" in plain.counters and "l2_writebacks" not in pf.counters
    assert "prefetcher" in pf.unsupported["l2_writebacks"]


# -- a helper that outlives the command --------------------------------------------------------


def test_wait_session_waits_for_what_the_command_left_running_and_no_longer() -> None:
    """The command's session: a shell that leaves a sleeper behind and exits at once. The wait
    ends when the sleeper does (well under the grace), or at the grace when it outlives it."""
    from counterd.backends.callgrind.run import wait_session

    for sleep_s, grace, ended in ((0.3, 5.0, True), (30.0, 0.3, False)):
        proc = subprocess.Popen(["sh", "-c", f"sleep {sleep_s} & exit 0"],
                                start_new_session=True)
        proc.wait()
        t0 = time.monotonic()
        try:
            assert wait_session(proc.pid, grace) is ended
            took = time.monotonic() - t0
            assert (0.1 < took < 4.0) if ended else (0.25 < took < 2.0)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@needs_valgrind
def test_a_helper_that_outlives_the_command_is_counted_not_a_failed_run(tmp_path: Path) -> None:
    """A command that starts a helper (here a sleep, as multiprocessing starts its resource
    tracker) and exits before it: the run waits for the helper, whose dump then is read like
    the others (without the wait: one dump, and the sleep's unreadable, half written; an SPMD
    program's counted run failed on 'Directory not empty' while such a dump was written)."""
    script = tmp_path / "leaves.py"
    script.write_text("import subprocess\nsubprocess.Popen(['sleep', '0.5'])\n")
    ran = callgrind_run([sys.executable, str(script)], GEOMETRY, tmp_path / "dumps",
                        dict(os.environ), 120, show_stdout=False)
    assert ran.exit_code == 0 and not ran.unreadable
    assert len(ran.dumps) == 2  # python's and the sleep's, written after python had ended


FIRST = """\
import ctypes
import counterd
from counterd import _native

L = _native.lib()
n, stride = {N}, {STRIDE}
buf = (ctypes.c_uint64 * (n * stride))()
L.counterd_load_stride(buf, n, stride, 1)  # before the first superstep: counted only from start
with counterd.superstep("load", n=n):
    L.counterd_load_stride(buf, n, stride, 1)
with counterd.superstep("store", n=n):
    L.counterd_store_stride(buf, n, stride, 1, 7)
"""


def test_counting_from_the_first_superstep_is_asked_for_only_when_told(tmp_path: Path) -> None:
    plain = valgrind_argv(["prog"], GEOMETRY, tmp_path)
    late = valgrind_argv(["prog"], GEOMETRY, tmp_path, from_first_superstep=True)
    assert not any(a.startswith("--instr-atstart") for a in plain)
    assert "--instr-atstart=no" in late and late[-1] == "prog"


@pytest.mark.callgrind
@needs_valgrind
def test_counted_from_the_first_superstep_the_supersteps_count_the_same(tmp_path: Path) -> None:
    """``--instr-atstart=no`` and the first mark's client request: each superstep's work is
    counted as from the start (the marker API's own few thousand accesses apart), what came
    before the first superstep is not (the load pass before it and the interpreter's start-up:
    the whole run's instructions fall), and the last level starts empty there."""
    if not _native.marks_start_counting():
        pytest.skip("libcounterd was built without valgrind's header: its marks start nothing")
    script = tmp_path / "first.py"
    script.write_text(FIRST.format(N=N, STRIDE=STRIDE))
    runs = {late: count_command([sys.executable, str(script)], run_id="t", env=ENV,
                                geometry=GEOMETRY, timeout=300, from_first_superstep=late)
            for late in (False, True)}
    start, first = runs[False], runs[True]
    for key in ((0, 0), (0, 1)):
        a, b = start.supersteps[key].counters, first.supersteps[key].counters
        for name in ("instructions", "loads", "stores"):
            assert b[name].value == pytest.approx(a[name].value, rel=0.01, abs=5_000), name
    assert first.supersteps[(0, 0)].counters["l3_misses"].value == pytest.approx(N, rel=0.02)
    # from the start the pass before the superstep and the interpreter's start-up are counted
    assert start.whole["loads"].value - first.whole["loads"].value >= N
    assert first.whole["instructions"].value < 0.5 * start.whole["instructions"].value


def test_count_from_start_is_refused_without_callgrind(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record", "--backend",
                           "none", "--count-from-start", "--out", str(tmp_path / "r.jsonl"),
                           "--", "touch", str(marker)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "drop --count-from-start" in proc.stderr
    assert not marker.exists() and not (tmp_path / "r.jsonl").exists()


@needs_valgrind
@pytest.mark.parametrize(("marked", "from_start", "expected"),
                         [(True, False, True), (True, True, False), (False, False, False)])
def test_record_counts_from_the_first_superstep_where_the_command_marks_them(
        monkeypatch, tmp_path: Path, marked: bool, from_start: bool, expected: bool) -> None:
    """Where the timed run marked supersteps, the counted run starts at each process's first
    (unless --count-from-start); a command without markers is counted from its start (late,
    nothing would be counted)."""
    from counterd.backends.callgrind.counting import CountedRun
    from counterd.commands.recording import record

    if not _native.marks_start_counting():
        pytest.skip("libcounterd was built without valgrind's header: its marks start nothing")
    seen: dict[str, object] = {}

    def fake(argv, **kw):
        seen.update(kw)
        return CountedRun(supersteps={}, whole={}, unsupported={}, exit_code=0, adjustments=())

    monkeypatch.setattr("counterd.backends.callgrind.counting.count_command", fake)
    script = tmp_path / "p.py"
    script.write_text("import counterd\nwith counterd.superstep('s'):\n    pass\n" if marked
                      else "pass\n")
    record([sys.executable, str(script)], out=None, backend="callgrind",
           count_from_start=from_start)
    assert seen["from_first_superstep"] is expected
