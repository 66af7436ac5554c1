"""Counting on a client's behalf is bound to the process that connected (the Reliability issue:
a forked client had its parent's setuid exec counted into its record; with pid reuse, a client
got a root process's task clock). An exec, a new owner or a reused pid ends the counting with a
``target_changed`` record, never another process's counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from counterd.backends.base import CounterValue, Reading, Target
from counterd.daemon import behalf
from counterd.daemon.behalf import ClientCounters, Counting, TargetChanged, identify
from counterd.daemon.store import open_readonly
from counterd.data.errors import CounterdError
from counterd.data.events import Source
from counterd.data.records import FLAGS, SuperstepRecord

from .conftest import ROOT, DaemonProc


class _Group:
    """A counter group that counts 1 per read: what the binding checks wrap, without perf."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.reads = 0
        self.closed = False

    def read(self) -> Reading:
        self.reads += 1
        return Reading({"task_clock_ns": CounterValue(float(self.reads), Source.MEASURED,
                                                      1.0, self.reads)})

    def close(self) -> None:
        self.closed = True


class _Backend:
    def __init__(self) -> None:
        self.opened: list[_Group] = []

    def open(self, events: Any, target: Target, strict: bool = False) -> _Group:
        group = _Group(target)
        self.opened.append(group)
        return group


def _perf() -> Counting:
    backend, reason, _ = behalf.resolve_backend("perf")
    if backend is None:
        pytest.skip(f"perf cannot count here: {reason}")
    return Counting(backend, reason)


def _rec(pid: int, index: int = 0) -> SuperstepRecord:
    return SuperstepRecord(run_id="r", index=index, name="s", rank=0, pid=pid, cpu=0,
                           begin_ns=1, end_ns=2)


@pytest.fixture
def waiting() -> Iterator[subprocess.Popen[bytes]]:
    """A process that execs /bin/sleep when a byte arrives on its stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import os, sys; sys.stdin.buffer.read(1); "
         "os.execv('/bin/sleep', ['sleep', '30'])"], stdin=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while identify(proc.pid, proc.pid) is None or \
            Path(f"/proc/{proc.pid}/exe").resolve().name == "sleep":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def _exec(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"x")
    proc.stdin.flush()
    deadline = time.monotonic() + 10
    while os.path.realpath(f"/proc/{proc.pid}/exe") != os.path.realpath("/bin/sleep"):
        assert time.monotonic() < deadline, "the target did not exec"
        time.sleep(0.01)


def test_target_changed_is_a_known_flag_with_a_wire_bit() -> None:
    from counterd.wire import protocol

    assert "target_changed" in FLAGS
    assert protocol.FLAG_BITS[:11][-1] == "target_changed"  # appended: wire-compatible


def test_an_exec_during_the_superstep_flags_the_record_and_drops_the_counts(
        waiting: subprocess.Popen[bytes]) -> None:
    counting = _perf()
    counters = ClientCounters(waiting.pid)
    counters.start(counting, ("r", 0), waiting.pid, ["task_clock_ns"])
    _exec(waiting)
    rec = counters.finish(("r", 0), _rec(waiting.pid), "test")
    assert "target_changed" in rec.flags
    assert "task_clock_ns" not in rec.counters
    assert "exec'd another program" in rec.unsupported["task_clock_ns"]
    # and the next BEGIN is refused: this pid is not the process that connected any more
    with pytest.raises(CounterdError, match="not the process that connected"):
        counters.start(counting, ("r", 1), waiting.pid, ["task_clock_ns"])
    counters.close()


def test_without_an_exec_the_counts_are_added(waiting: subprocess.Popen[bytes]) -> None:
    counting = _perf()
    counters = ClientCounters(waiting.pid)
    counters.start(counting, ("r", 0), waiting.pid, ["task_clock_ns"])
    rec = counters.finish(("r", 0), _rec(waiting.pid), "test")
    assert "target_changed" not in rec.flags and "task_clock_ns" in rec.counters
    counters.close()


def test_an_exec_before_the_begin_is_refused(waiting: subprocess.Popen[bytes]) -> None:
    counters = ClientCounters(waiting.pid)  # connected before the exec
    _exec(waiting)
    backend = _Backend()
    with pytest.raises(CounterdError, match="exec'd another program"):
        counters.start(Counting(backend, ""), ("r", 0), waiting.pid, ["task_clock_ns"])
    assert backend.opened == []  # nothing was opened on the new program


def test_a_read_of_a_process_that_execs_ends_with_target_changed(
        waiting: subprocess.Popen[bytes]) -> None:
    counting = _perf()
    counters = ClientCounters(os.getpid())
    first = counters.read(counting, waiting.pid, waiting.pid, ["task_clock_ns"])
    assert "task_clock_ns" in first.values
    _exec(waiting)
    with pytest.raises(TargetChanged, match="exec'd"):
        counters.read(counting, waiting.pid, waiting.pid, ["task_clock_ns"])
    counters.close()


def test_a_setuid_exec_is_caught_by_the_uid_check(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _Backend()
    counters = ClientCounters(os.getpid())
    counters.start(Counting(backend, ""), ("r", 0), 0, ["task_clock_ns"])
    real = behalf._uids

    def setuid(pid: int, tid: int, procfs: Path) -> tuple[int, ...] | None:
        uids = real(pid, tid, procfs)  # the real uid stays, effective and saved change
        return None if uids is None else (uids[0], uids[1] + 1, uids[2] + 1, uids[3] + 1)

    monkeypatch.setattr(behalf, "_uids", setuid)
    rec = counters.finish(("r", 0), _rec(os.getpid()), "test")
    assert "target_changed" in rec.flags and rec.counters == {}
    assert "owner changed" in rec.unsupported["task_clock_ns"]
    assert backend.opened[0].closed  # counting ended
    with pytest.raises(CounterdError, match="owner changed"):
        counters.start(Counting(backend, ""), ("r", 1), 0, ["task_clock_ns"])


def test_a_reused_pid_is_refused_at_begin_and_flagged_at_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _Backend()
    counting = Counting(backend, "")
    counters = ClientCounters(os.getpid())
    counters.start(counting, ("r", 0), 0, ["task_clock_ns"])
    real = behalf._stat_fields

    def reused(path: Path) -> list[str] | None:  # another process with the same pid
        fields = real(path)
        if fields is not None:
            fields[19] = str(int(fields[19]) + 1)
        return fields

    monkeypatch.setattr(behalf, "_stat_fields", reused)
    rec = counters.finish(("r", 0), _rec(os.getpid()), "test")
    assert "target_changed" in rec.flags and rec.counters == {}
    assert "pid was reused" in rec.unsupported["task_clock_ns"]
    with pytest.raises(CounterdError, match="pid was reused"):
        counters.start(counting, ("r", 1), 0, ["task_clock_ns"])


def test_the_client_keeps_its_own_counters_and_flags() -> None:
    rec = SuperstepRecord(run_id="r", index=0, name="s", rank=0, pid=1, cpu=0, begin_ns=1,
                          end_ns=2, counters={"loads": CounterValue(3.0, Source.SIMULATED)},
                          flags=frozenset({"nested"}))
    out = behalf.target_changed(rec, ["loads", "task_clock_ns"], "it exec'd")
    assert out.counters == rec.counters  # the client's own claim, not the daemon's count
    assert out.unsupported == {"task_clock_ns": "it exec'd"}
    assert out.flags == {"nested", "target_changed", "unsupported_counters"}


def test_a_tid_of_another_process_is_refused(waiting: subprocess.Popen[bytes]) -> None:
    backend = _Backend()
    counters = ClientCounters(os.getpid())
    with pytest.raises(CounterdError, match=f"tid {waiting.pid} is not a thread of pid "
                       f"{os.getpid()}"):
        counters.start(Counting(backend, ""), ("r", 0), waiting.pid, ["task_clock_ns"])
    assert backend.opened == []


def test_a_process_gone_at_connect_is_never_counted() -> None:
    proc = subprocess.Popen(["/bin/true"])
    proc.wait()
    counters = ClientCounters(proc.pid)
    with pytest.raises(CounterdError, match="exited before it connected"):
        counters.start(Counting(_Backend(), ""), ("r", 0), 0, ["task_clock_ns"])


_FORKED_CLIENT = r"""
import json, os, socket, sys, time
from counterd.wire import protocol
from counterd.wire.protocol import FrameType
from counterd.data.records import SuperstepRecord

sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
dec = protocol.Decoder()

def reply():
    while True:
        for frame in dec.frames():
            return frame
        dec.feed(sock.recv(65536))

sock.sendall(protocol.Hello(pid=os.getpid(), host="h", job="forked").encode())
assert reply()[0] is FrameType.WELCOME
r, w = os.pipe()
if os.fork():  # the parent: the process that connected, execs when its child says so
    os.read(r, 1)
    os.execv("/bin/sleep", ["sleep", "5"])
parent = os.getppid()
line = {"run_id": "forked", "index": 0, "name": "s", "rank": 0, "pid": parent, "cpu": 0,
        "begin_ns": 1, "params": {}, "backend": "none", "host": "h", "tid": parent}
sock.sendall(protocol.Begin(1, line, ["task_clock_ns"]).encode())
started = reply()
os.write(w, b"x")
while os.path.realpath(f"/proc/{parent}/exe") != os.path.realpath("/bin/sleep"):
    time.sleep(0.01)
rec = SuperstepRecord(run_id="forked", index=0, name="s", rank=0, pid=parent, cpu=0,
                      begin_ns=1, end_ns=2, host="h")
sock.sendall(protocol.Record(2, rec).encode() + protocol.Sync(3).encode())
print(json.dumps({"started": started[1], "ack": reply()[1]}))
"""


def test_a_forked_client_does_not_get_its_parents_exec_counted(daemon: DaemonProc) -> None:
    if behalf.resolve_backend("perf")[0] is None:
        pytest.skip("perf cannot count here")
    out = subprocess.run([sys.executable, "-c", _FORKED_CLIENT, str(daemon.socket)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    got = json.loads(out.stdout)
    assert "unsupported" not in got["started"], got  # counting began on the parent
    assert got["ack"]["s"] == 3, got
    store = open_readonly(daemon.store)
    [rec] = store.records("forked")
    store.close()
    assert "target_changed" in rec.flags
    assert "task_clock_ns" not in rec.counters
    assert "exec'd another program" in rec.unsupported["task_clock_ns"]


def test_a_target_that_exits_inside_the_superstep_is_told_by_its_pidfd(
        waiting: subprocess.Popen[bytes]) -> None:
    counters = ClientCounters(waiting.pid)
    counters.start(Counting(_Backend(), ""), ("r", 0), waiting.pid, ["task_clock_ns"])
    waiting.kill()  # not reaped: a zombie, /proc still shows its pid
    deadline = time.monotonic() + 10
    while Path(f"/proc/{waiting.pid}/stat").read_text().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    rec = counters.finish(("r", 0), _rec(waiting.pid), "test")
    assert "target_changed" in rec.flags and rec.counters == {}
    assert rec.unsupported["task_clock_ns"].endswith("it exited during the superstep")
