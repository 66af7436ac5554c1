"""Clock domains of daemon runs (issue 32 item 2): the daemon anchors a run's clocks when a
client declares it, periodically and when the client ends; schema 6 keeps them; ``counterd
export`` writes a run as the file convention's records file with its clock domain, its anchors
moved onto the client's CLOCK_MONOTONIC where the client runs in another time namespace."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from counterd.commands import cli
from counterd.daemon.schema import SCHEMA_VERSION, migrate, schema_version
from counterd.daemon.store import ClientClock, RunAnchor, RunInfo, Store
from counterd.data.clocks import Anchor, ClockDomain, boot_id, time_namespace
from counterd.data.records import SuperstepRecord, read_jsonl
from counterd.report import nodes

from .conftest import DaemonProc

PROGRAM = textwrap.dedent("""
    import counterd
    from counterd.markers.api import recorder
    counterd.init()
    for i in range(5):
        with counterd.superstep("s"):
            sum(range(10000))
    assert recorder().sink.flush(10)
""")


def rec(run: str = "r", index: int = 0, host: str = "h") -> SuperstepRecord:
    return SuperstepRecord(run, index, "s", 0, 10, 0, 5_000, 6_000, host=host)


def test_schema_6_is_a_migration_and_old_runs_have_no_domain(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    assert migrate(conn, target=5) == 5
    conn.close()
    old = Store(tmp_path / "s.db", synchronous="normal")  # migrates to the current version
    assert schema_version(old._conn) == SCHEMA_VERSION >= 6
    old.commit([(rec(), RunInfo("j", 0))])
    assert old.clock_domain("r", 0, "h") == (
        None, "the daemon took no clock anchors for this run (recorded before)")
    old.close()


def test_anchors_are_kept_moved_by_the_clients_offset_and_pruned(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db", synchronous="normal")
    clock = ClientClock("boot-1", "time:[5]", 1000 * 10**9, 20_000)
    store.commit([(rec(), RunInfo("j", 7))], anchors=[
        RunAnchor(7, "r", Anchor(4_000, 10**18, 30), clock),
        RunAnchor(7, "r", Anchor(9_000, 10**18 + 5_000, 40), clock)])
    domain, why = store.clock_domain("r", 7, "h")
    assert why == "" and domain == ClockDomain(
        "r", "h", "boot-1", "time:[5]",
        (Anchor(4_000 + 1000 * 10**9, 10**18, 30), Anchor(9_000 + 1000 * 10**9, 10**18 + 5_000,
                                                          40)), 20_000, "given")
    assert store.clock_domain("r", 8, "h")[0] is None  # another uid's run of that id: none
    unknown = ClientClock("boot-1", "time:[6]", None)
    store.commit([(rec("q"), RunInfo("j", 7))],
                 anchors=[RunAnchor(7, "q", Anchor(1, 2, 3), unknown)])
    assert "could not be read" in store.clock_domain("q", 7, "h")[1]
    store._conn.execute("UPDATE runs SET last_seen_ns = 1")
    store.prune(retention_ns=10**9, now_ns=10**18 + 10**10)
    assert store._conn.execute("SELECT COUNT(*) FROM clock_domains").fetchone()[0] == 0
    assert store._conn.execute("SELECT COUNT(*) FROM clock_anchors").fetchone()[0] == 0
    store.close()


def export(d: DaemonProc, out: Path, *via: str) -> list[ClockDomain]:
    assert cli.main(["export", "--config", str(d.config), "--out", str(out), *via]) == 0
    domains: list[ClockDomain] = []
    list(read_jsonl(out, domains))
    return domains


def test_a_daemon_run_exports_with_its_clock_domain(daemon: DaemonProc, tmp_path: Path) -> None:
    t0 = time.time_ns()
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=daemon.env(
        COUNTERD_RUN_ID="dr"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    time.sleep(0.5)  # the end anchor (the client's disconnect) reaches the store
    for via in ([], ["--store", str(daemon.store)]):  # through the daemon, and the file
        f = tmp_path / f"dr{len(via)}.jsonl"
        (d,) = export(daemon, f, *via)
        records = list(read_jsonl(f))
        assert len(records) == 5 and d.run_id == "dr" and d.host == records[0].host
        assert d.boot_id == boot_id() and d.timens == time_namespace()
        assert len(d.anchors) >= 2  # the run's start and its client's end
        for r in records:  # every superstep lies between the anchors, mapped near its time
            for t in (r.begin_ns, r.end_ns):
                real, err, inside = d.to_real(t)  # type: ignore[arg-type]
                assert inside and err < 1_000_000 and t0 <= real <= time.time_ns()
    # the exported files are the file convention's: two nodes' files report across nodes
    (run,) = nodes.build([tmp_path / "dr0.jsonl", tmp_path / "dr2.jsonl"]).runs
    assert run.records == 5 and any("given twice" in n for n in run.notes)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) missing")
def test_a_client_in_its_own_time_namespace_is_anchored_on_its_clock(
        daemon: DaemonProc, tmp_path: Path) -> None:
    probe = subprocess.run(["unshare", "--time", "--fork", "--monotonic", "500", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a time namespace here: {probe.stderr.decode().strip()}")
    t0 = time.time_ns()
    out = subprocess.run(["unshare", "--time", "--fork", "--monotonic", "500", sys.executable,
                          "-c", PROGRAM], env=daemon.env(COUNTERD_RUN_ID="ns"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    time.sleep(0.5)
    f = tmp_path / "ns.jsonl"
    (d,) = export(daemon, f, "ns", "--store", str(daemon.store))
    assert d.timens != time_namespace()
    records = list(read_jsonl(f))
    # the records are 500 s ahead of the daemon's clock; mapped through the domain they land
    # in the run's real time, not 500 s off
    for r in records:
        real, err, inside = d.to_real(r.begin_ns)
        assert inside and t0 <= real <= time.time_ns(), (real - t0) / 1e9
    raw = json.loads(f.read_text().splitlines()[0])
    assert raw["format"] == "counterd-clock-domain"


def test_the_writer_anchors_a_declared_run_again_after_the_period(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from counterd.daemon import writer as w
    from counterd.daemon.metrics_state import MetricsState

    writer = w.Writer(MetricsState(), wake=lambda: None, stopping=threading.Event())
    clock = ClientClock("b", "t", 0)
    item = w.Item(1, 1, rec("r"), RunInfo("j", 7))
    assert writer._due([item]) == []  # a run nobody declared: no clock to anchor
    writer._anchored(RunAnchor(7, "r", Anchor(1, 2, 3), clock))
    assert writer._due([item]) == []  # anchored just now
    monkeypatch.setattr(w, "ANCHOR_PERIOD_S", 0.0)
    (due,) = writer._due([item, item])  # once per run, however many of its records
    assert (due.uid, due.run_id, due.clock) == (7, "r", clock)
