"""The one backend resolver (counterd.backends.resolve): what ``auto`` picks per purpose on
invented hosts, that every caller uses it, what counterd probe shows, and ``record --events``
(a counter the backend cannot give is exit 2 naming the backends that can; the records hold
only the counters named)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from counterd import backends
from counterd.backends import Capability, resolve
from counterd.data.errors import BadInput, UnknownBackend
from counterd.data.events import NAMES

ROOT = Path(__file__).resolve().parents[2]
SOFTWARE = ("task_clock_ns", "page_faults", "context_switches")
MEMORY = ("loads", "stores", "l1d_misses", "l2_misses", "l3_misses", "l1d_writebacks",
          "l2_writebacks", "l3_writebacks", "dtlb_misses", "instructions")


def cap(name: str, available: bool = True, gives: tuple[str, ...] = ()) -> Capability:
    return Capability(name, available, f"{name} {'works' if available else 'is missing'}",
                      {c: None if c in gives else f"{name} cannot" for c in NAMES})


def host(*, pmu: bool, perf: bool = True, valgrind: bool = True, papi: bool = False
         ) -> dict[str, Capability]:
    """Capabilities of an invented host."""
    perf_gives = SOFTWARE + (("cycles", "instructions", "loads", "stores", "l1d_misses")
                             if pmu else ())
    return {
        "perf": cap("perf", perf, perf_gives if perf else ()),
        "papi": cap("papi", papi, ("loads", "l1d_misses") if papi else ()),
        "sim": cap("sim", True, MEMORY[:-1]),
        "callgrind": cap("callgrind", valgrind, ("loads", "stores", "l1d_misses",
                                                 "l3_misses", "instructions")
                         if valgrind else ()),
    }


# Each caller's behaviour before the resolver existed, now stated in backends.POLICIES.
@pytest.mark.parametrize("hostcaps, expected", [
    (host(pmu=True), {"markers": "perf", "record": "perf", "sampling": "perf",
                      "microbench": "perf"}),
    (host(pmu=False), {"markers": "perf", "record": "callgrind", "sampling": "perf",
                       "microbench": "sim"}),
    (host(pmu=False, valgrind=False), {"markers": "perf", "record": "perf",
                                       "sampling": "perf", "microbench": "sim"}),
    (host(pmu=False, papi=True), {"markers": "perf", "record": "callgrind",
                                  "sampling": "perf", "microbench": "papi"}),
    (host(pmu=False, perf=False, valgrind=False), {"markers": None, "record": None,
                                                   "sampling": None, "microbench": "sim"}),
    (host(pmu=False, perf=False), {"markers": None, "record": "callgrind", "sampling": None,
                                   "microbench": "sim"}),
])
def test_auto_per_purpose(hostcaps: dict[str, Capability],
                          expected: dict[str, str | None]) -> None:
    got = {p: resolve("auto", p, hostcaps) for p in backends.PURPOSES}
    assert {p: r.backend for p, r in got.items()} == expected
    for r in got.values():
        assert r.reason and not r.error and r.tried
    if expected["record"] == "callgrind":  # the reason says why perf was passed over
        perf = hostcaps["perf"]
        assert ("not perf (cannot count loads" if perf.available else
                "not perf (unavailable: perf is missing") in got["record"].reason


def test_names_per_purpose() -> None:
    caps = host(pmu=False, papi=False)
    with pytest.raises(UnknownBackend, match="choose from auto, perf, none"):
        resolve("sim", "sampling", caps)
    with pytest.raises(UnknownBackend):
        resolve("callgrind", "microbench", caps)
    bad = resolve("papi", "record", caps)
    assert bad.error and bad.backend is None and "papi is missing" in bad.reason
    assert str(bad.unavailable("fix it")).startswith("backend papi is unavailable")
    ok = resolve("sim", "markers", caps)
    assert ok.backend == "sim" and not ok.error
    for name, why in (("daemon", "counters come from daemon"),
                      ("callgrind", "counters come from callgrind"), ("none", "none")):
        r = resolve(name, "markers", caps)
        assert (r.backend, r.reason, r.error) == (None, why, False)


def test_every_caller_uses_the_resolver(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record, markers, sampling and microbench give what resolve() gives, on an invented host
    with a PMU and on one with nothing but the simulators."""
    from counterd.commands import recording
    from counterd.daemon import behalf
    from counterd.markers.recorder import Recorder
    from microbench import suite

    for hostcaps in (host(pmu=True), host(pmu=False, perf=False)):
        monkeypatch.setattr(backends, "capability", lambda name, c=hostcaps: c[name])
        expect = {p: resolve("auto", p).backend for p in backends.PURPOSES}
        assert recording.resolve_backend("auto").backend == expect["record"]
        plan = suite.resolve_backend("auto")
        assert plan.used == expect["microbench"]
        assert plan.measured_backend == (expect["microbench"]
                                         if expect["microbench"] != "sim" else None)
        backend, _, _ = behalf.resolve_backend("auto")
        assert (backend.name if backend is not None else None) == expect["sampling"]
        rec = Recorder(socket="off", run_id="resolve-test")
        chosen = rec._resolve_backend()
        assert (chosen.name if chosen is not None else None) == expect["markers"]
    with pytest.raises(BadInput, match="backend papi is unavailable"):
        recording.resolve_backend("papi")


def test_probe_shows_auto_per_purpose() -> None:
    from counterd.commands.probe import probe, render_text

    result = probe()
    assert set(result.auto) == set(backends.PURPOSES)
    for purpose, r in result.auto.items():
        assert r == resolve("auto", purpose, result.backends)
    text = render_text(result)
    assert "auto picks, per purpose" in text
    for purpose in backends.PURPOSES:
        line = next(x for x in text.splitlines() if x.split()[:1] == [purpose])
        assert result.auto[purpose].reason in line
    d = result.to_json()
    assert set(d["auto"]) == set(backends.PURPOSES)
    assert all(a["reason"] and a["tried"] for a in d["auto"].values())


# ---------------------------------------------------------------------- record --events


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "counterd.commands.cli", *args],
                          capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_events_the_backend_cannot_give_are_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    caps = backends.capabilities()
    proc = _cli("record", "--backend", "none", "--events", "task_clock_ns", "--out", str(out),
                "--", "true")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "counter task_clock_ns cannot be recorded with backend none" in proc.stderr
    able = [n for n in ("perf", "papi", "callgrind", "sim") if caps[n].supports("task_clock_ns")]
    if able:
        assert "backends that give it on this host: " + ", ".join(able) in proc.stderr
    # A counter that sim gives and callgrind does not: named with the backends that can.
    proc = _cli("record", "--backend", "callgrind" if caps["callgrind"].available else "perf",
                "--events", "dtlb_misses", "--out", str(out), "--", "true")
    assert proc.returncode == 2, proc.stderr
    assert "counter dtlb_misses cannot be recorded" in proc.stderr
    assert "backends that give it on this host: sim" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()
    with pytest.raises(BadInput, match="counter loads cannot be recorded with backend none"):
        from counterd.commands.recording import record

        record(["true"], out=out, backend="none", events=["loads"])


def test_events_limit_what_is_recorded(tmp_path: Path) -> None:
    if not backends.capability("perf").supports("task_clock_ns"):
        pytest.skip("perf software events are not available here")
    out = tmp_path / "r.jsonl"
    proc = _cli("record", "--backend", "perf", "--events", "task_clock_ns", "--out", str(out),
                "--", sys.executable, str(ROOT / "examples" / "bsp_sum.py"), "20000", "1")
    assert proc.returncode == 0, proc.stderr
    from counterd.data.records import read_jsonl

    recs = list(read_jsonl(out))
    assert recs and all(set(r.counters) == {"task_clock_ns"} for r in recs)
    assert all(set(r.unsupported) <= {"task_clock_ns", "*"} for r in recs)


@pytest.mark.callgrind
def test_events_limit_callgrind_records(tmp_path: Path) -> None:
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not on PATH (apt-get install valgrind)")
    out = tmp_path / "x.jsonl"
    proc = _cli("record", "--backend", "callgrind", "--events", "loads", "--out", str(out),
                "--", sys.executable, "-c", "pass")
    assert proc.returncode == 0, proc.stderr
    (rec,) = [d for d in map(json.loads, out.read_text().splitlines()) if d["format"] == 1]
    assert set(rec["counters"]) == {"loads"} and rec["counters"]["loads"]["value"] > 1000
    assert rec["unsupported"] == {} and "unsupported_counters" not in rec["flags"]


@pytest.mark.parametrize("pmu, perf, valgrind", [
    (True, True, True), (True, True, False), (False, True, True), (False, True, False),
    (False, False, False)])
def test_auto_picks_perf_alone_exactly_when_resolve_picks_it_whatever_else_is_there(
        pmu: bool, perf: bool, valgrind: bool) -> None:
    """auto_picks_alone (what a saved perf plan may stand for) never says yes where resolve,
    asked with perf's capability and any other backends, would not pick perf."""
    caps = host(pmu=pmu, perf=perf, valgrind=valgrind)
    alone = backends.auto_picks_alone("record", "perf", caps["perf"])
    assert alone == (pmu and perf)
    if alone:
        for others in (host(pmu=pmu, valgrind=True), host(pmu=pmu, valgrind=False, papi=True)):
            assert resolve("auto", "record", {**others, "perf": caps["perf"]}).backend == "perf"
    assert backends.auto_picks_alone("sampling", "perf", caps["perf"]) == perf
