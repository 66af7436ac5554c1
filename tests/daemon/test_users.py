"""Two unix users: SO_PEERCRED decides whose counters a client may obtain."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from counterd.daemon.store import open_readonly
from counterd.data.records import SuperstepRecord
from counterd.markers.sinks.socket import SocketSink

from .conftest import DaemonProc

USERS = ("cdtest_alice", "cdtest_bob")

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                                reason="needs root and useradd to create two test users")


def _ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", name], check=True, capture_output=True)
        return pwd.getpwnam(name)


def _drop(user: pwd.struct_passwd) -> None:
    os.setgroups([])
    os.setresgid(user.pw_gid, user.pw_gid, user.pw_gid)
    os.setresuid(user.pw_uid, user.pw_uid, user.pw_uid)


def as_user(user: pwd.struct_passwd, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child with the user's uid/gid; returns its JSON result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(r)
            _drop(user)
            out = json.dumps(fn()).encode()
        except BaseException as exc:
            out = json.dumps({"child_error": repr(exc)}).encode()
        os.write(w, out)
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def sleeper(user: pwd.struct_passwd) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        _drop(user)
        os.execv("/bin/sleep", ["sleep", "60"])
    return pid


@pytest.fixture
def users() -> Iterator[tuple[pwd.struct_passwd, pwd.struct_passwd]]:
    yield _ensure_user(USERS[0]), _ensure_user(USERS[1])


@pytest.fixture
def shared_daemon() -> Iterator[DaemonProc]:
    tmp = Path(tempfile.mkdtemp(prefix="counterd-users-", dir="/tmp"))
    os.chmod(tmp, 0o755)  # the other users must reach the socket
    d = DaemonProc(tmp / "d").start()
    yield d
    if d.alive():
        d.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_a_client_cannot_obtain_counters_of_another_users_process(
        users: tuple[pwd.struct_passwd, pwd.struct_passwd], shared_daemon: DaemonProc) -> None:
    alice, bob = users
    sock = shared_daemon.socket
    bob_pid, alice_pid = sleeper(bob), sleeper(alice)
    try:
        time.sleep(0.1)

        def bob_records() -> Any:
            sink = SocketSink(sock, job="bob")
            sink.record(SuperstepRecord(run_id="bobrun", index=0, name="b", rank=0,
                                        pid=os.getpid(), cpu=0, begin_ns=1, end_ns=2))
            return {"ok": sink.flush(10), "uid": sink.welcome["uid"]}

        assert as_user(bob, bob_records) == {"ok": True, "uid": bob.pw_uid}

        def alice_tries() -> Any:
            sink = SocketSink(sock, job="alice")
            other = sink.read(bob_pid, ["task_clock_ns"])
            own = sink.read(alice_pid, ["task_clock_ns"])
            sink.record(SuperstepRecord(run_id="bobrun", index=1, name="forged", rank=0,
                                        pid=os.getpid(), cpu=0, begin_ns=1, end_ns=2))
            sink.flush(10)
            return {"other": other, "own": own, "refused": [m for _, m in sink.refused],
                    "uid": sink.welcome["uid"]}

        got = as_user(alice, alice_tries)
        assert got["uid"] == alice.pw_uid  # the daemon saw alice through SO_PEERCRED
        assert got["other"]["code"] == "forbidden", got
        assert "values" not in got["other"]
        assert got["own"]["type"] == "READING" and "task_clock_ns" in got["own"]["values"], got
        # run ids are namespaced by uid: alice's "bobrun" is hers, bob's is untouched
        assert got["refused"] == [], got
        store_runs = {(r.uid, r.run_id): r for r in open_readonly(shared_daemon.store).runs()}
        assert store_runs[(bob.pw_uid, "bobrun")].records == 1
        assert store_runs[(alice.pw_uid, "bobrun")].records == 1

        # root may read anyone's
        root = SocketSink(sock, job="root")
        assert root.read(bob_pid, ["task_clock_ns"])["type"] == "READING"
        root.close()

        # members of socket.allowed_group may too, after a reload
        group = grp.getgrgid(alice.pw_gid).gr_name
        shared_daemon.write_config(socket_extra=f'allowed_group = "{group}"\n')
        shared_daemon.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while "configuration reloaded" not in shared_daemon.log_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        got = as_user(alice, lambda: SocketSink(sock).read(bob_pid, ["task_clock_ns"]))
        assert got.get("type") == "READING", got
    finally:
        for pid in (bob_pid, alice_pid):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
