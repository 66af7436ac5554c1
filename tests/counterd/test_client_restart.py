"""The marker client against a real ``counterd run`` that is stopped, killed and restarted:
nothing the program marked is lost, nothing raises into it, acknowledgements are read."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from counterd.commands.cli import main as cli_main
from counterd.daemon.store import open_readonly
from counterd.data.records import SuperstepRecord
from counterd.markers.recorder import Recorder
from counterd.markers.sinks.socket import SocketSink
from counterd.markers.sinks.spill import SpillFile
from tests.daemon.conftest import DaemonProc


def stored(d: DaemonProc, run_id: str) -> list[SuperstepRecord]:
    store = open_readonly(d.store)
    try:
        return store.records(run_id)
    finally:
        store.close()


def recorder(d: DaemonProc, run_id: str, tmp: Path, high_water: int = 8192) -> Recorder:
    rec = Recorder(run_id=run_id, backend="none", socket=d.socket)
    assert isinstance(rec.sink, SocketSink)
    rec.sink.high_water = high_water
    rec.sink.spill = SpillFile(tmp / "spill")
    return rec


def mark(rec: Recorder, n: int, name: str = "s") -> None:
    for _ in range(n):
        rec.end(rec.begin(name, {}))


@pytest.mark.parametrize("how", ["stop", "kill9"])
def test_a_restart_loses_nothing_and_an_open_superstep_still_gets_its_record(
        tmp_path: Path, how: str) -> None:
    d = DaemonProc(tmp_path / "d").start()
    rec = recorder(d, f"restart-{how}", tmp_path)
    sink = rec.sink
    assert isinstance(sink, SocketSink)
    mark(rec, 300)
    open_step = rec.begin("across", {"k": 1})  # open while the daemon goes away
    d.stop() if how == "stop" else d.kill9()
    mark(rec, 200)  # no exception, and held for the daemon, not in the fallback
    assert sink.degraded is not None
    assert not sink.fallback.records
    assert len(sink.unacked) >= 200
    d.start()
    time.sleep(0.1)  # past the first backoff delay: the next marker reconnects
    mark(rec, 100)
    rec.end(open_step)
    assert sink.flush(20)
    got = stored(d, f"restart-{how}")
    assert len(got) == 601
    assert sorted(r.index for r in got) == list(range(601))
    across = [r for r in got if r.name == "across"]
    assert len(across) == 1 and across[0].end_ns is not None and across[0].params == {"k": 1}
    assert sink.spill.records == 0
    sink.close(5)
    d.stop()


def test_the_first_superstep_open_across_a_restart_never_raises(tmp_path: Path) -> None:
    """The issue's BrokenPipeError: SocketSink.closed() declared the CONTEXT of the first
    CLOSE on a dead socket, past the reconnect and fallback."""
    d = DaemonProc(tmp_path / "d").start()
    rec = Recorder(run_id="first", backend="perf", events=["task_clock_ns"], socket=d.socket)
    assert isinstance(rec.sink, SocketSink)
    step = rec.begin("first", {})  # the counters' CONTEXT is declared at its end
    d.stop()
    rec.end(step)
    d.start()
    assert rec.sink.flush(20)
    got = stored(d, "first")
    assert [(r.name, r.end_ns is not None) for r in got] == [("first", True)]
    rec.sink.close(5)
    d.stop()


def test_acknowledgements_are_read_on_the_marker_path(tmp_path: Path) -> None:
    """Backend none sends OPEN + CLOSE, so every CLOSE had an odd sequence number and the
    old one-look-every-16 check never ran: 99,001 of 100k records stayed held."""
    d = DaemonProc(tmp_path / "d").start()
    rec = recorder(d, "acks", tmp_path, high_water=1000)
    sink = rec.sink
    assert isinstance(sink, SocketSink)
    most = 0
    for i in range(6000):
        mark(rec, 1)
        most = max(most, len(sink.unacked))
        if i % 1000 == 999:
            time.sleep(0.05)  # the daemon commits; its acks are read by the next markers
    assert most <= 1000
    assert sink.spill.records == 0  # a healthy daemon slows the program, spills nothing
    assert 6000 - len(sink.unacked) >= 5000  # acknowledged while the program ran
    assert sink.flush(20)
    assert len(stored(d, "acks")) == 6000
    d.stop()


def test_no_daemon_at_start_spills_at_exit_and_import_sends_it(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "d")  # configured, not started: the socket is not there
    spill = tmp_path / "spill"
    code = textwrap.dedent("""
        import counterd
        for i in range(700):
            with counterd.superstep("s", i=i, bad=float("nan")):
                pass
    """)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], text=True, capture_output=True,
                         timeout=60, env=d.env(COUNTERD_RUN_ID="nodaemon", COUNTERD_BACKEND="none",
                                                COUNTERD_SPILL=str(spill)))
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 20  # an exit does not wait out the flush for no daemon
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "700 records" in lines[0] and "counterd import" in lines[0], \
        out.stderr
    files = list(spill.glob("*.jsonl"))
    assert len(files) == 1 and str(files[0]) in lines[0]
    assert stat.S_IMODE(os.stat(spill).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(files[0]).st_mode) == 0o600
    d.start()
    assert cli_main(["import", str(spill), "--socket", str(d.socket)]) == 0
    got = stored(d, "nodaemon")
    assert sorted(r.params["i"] for r in got) == list(range(700))
    assert all(r.unsupported == {"param:bad": "not finite: nan"} for r in got)
    assert not files[0].exists()  # removed once acknowledged
    d.stop()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_workers_with_no_daemon_spill_their_records(tmp_path: Path,
                                                                    method: str) -> None:
    """A multiprocessing worker ends without the interpreter's exit handlers (a forked one by
    os._exit): its records, unsent for want of a daemon, were lost without a word. They are
    spilled at the worker's end as a single process's are at its exit, and imported."""
    d = DaemonProc(tmp_path / "d")  # configured, not started: the socket is not there
    spill = tmp_path / "spill"
    code = textwrap.dedent(f"""
        import multiprocessing as mp
        import counterd

        def work(rank):
            counterd.set_rank(rank)
            for i in range(5):
                with counterd.superstep("s", i=i):
                    pass

        if __name__ == "__main__":
            ctx = mp.get_context("{method}")
            procs = [ctx.Process(target=work, args=(r,)) for r in range(2)]
            [p.start() for p in procs]
            [p.join() for p in procs]
            assert all(p.exitcode == 0 for p in procs)
    """)
    prog = tmp_path / "prog.py"
    prog.write_text(code)
    out = subprocess.run([sys.executable, str(prog)], text=True, capture_output=True,
                         timeout=60, env=d.env(COUNTERD_RUN_ID="workers", COUNTERD_BACKEND="none",
                                                COUNTERD_SPILL=str(spill)))
    assert out.returncode == 0, out.stderr
    said = [ln for ln in out.stderr.splitlines() if "counterd import" in ln]
    assert len(said) == 2 and all("5 records" in ln for ln in said), out.stderr
    d.start()
    assert cli_main(["import", str(spill), "--socket", str(d.socket)]) == 0
    got = stored(d, "workers")
    assert sorted((r.rank, r.params["i"]) for r in got) == [(r, i) for r in (0, 1)
                                                             for i in range(5)]
    d.stop()


def test_import_keeps_a_file_the_daemon_does_not_take_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spill = SpillFile(tmp_path / "spill")
    recs = [SuperstepRecord(run_id="imp", index=i, name="s", rank=0, pid=7, cpu=0,
                            begin_ns=i, end_ns=i + 1) for i in range(5)]
    assert spill.write(recs)
    spill.close()
    assert spill.path is not None
    with spill.path.open("a") as fh:
        fh.write('{"ev": "record", "format": 1}\n' + "[" * 100_000 + "\n")
    store = tmp_path / "store.db"
    assert cli_main(["import", str(spill.path), "--store", str(store)]) == 1
    assert "kept" in capsys.readouterr().out
    assert spill.path.exists()  # a line that is not a record: the file stays
    s = open_readonly(store)
    try:
        assert s.records("imp") == recs  # the good records are in
    finally:
        s.close()
    assert cli_main(["import", str(tmp_path / "nothing-here")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_flush_with_no_daemon_reports_false_and_keeps_everything(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sink = SocketSink(tmp_path / "absent.sock", job="t", spill=SpillFile(tmp_path / "spill"))
    rec = SuperstepRecord(run_id="absent", index=0, name="s", rank=0, pid=1, cpu=0,
                          begin_ns=1, end_ns=2)
    sink.record(rec)
    t0 = time.monotonic()
    assert sink.flush(0.3) is False
    assert time.monotonic() - t0 < 1.0
    assert list(sink.unacked.values()) == [rec]
    with caplog.at_level(logging.WARNING, logger="counterd.markers"):
        sink.close(0.1)
    assert sink.spill.path is not None
    assert [r.message for r in caplog.records if "counterd import" in r.message]
