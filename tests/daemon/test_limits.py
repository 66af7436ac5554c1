"""The socket's limits (the Reliability issue), against a real daemon: idle connections are
closed and their clients come back, one uid cannot hold more connections than its share, and
the limits are config keys."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from counterd.daemon import config
from counterd.data.errors import BadInput
from counterd.data.records import SuperstepRecord
from counterd.markers.sinks.socket import SocketSink
from counterd.wire import protocol
from counterd.wire.protocol import FrameType
from tests.daemon.conftest import DaemonProc, RawClient


def test_an_idle_connection_is_closed_and_its_client_comes_back(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path / "d")
    d.write_config(socket_extra="idle_timeout_s = 1\n")
    d.start()
    try:
        idle = RawClient(d.socket)
        busy = RawClient(d.socket)  # a superstep open: not idle, however long it runs
        busy.send_frame(protocol.Begin(1, {"run_id": "long", "index": 0, "name": "s",
                                           "rank": 0, "pid": 1, "cpu": 0, "begin_ns": 5}))
        ftype, payload = idle.reply()
        assert ftype is FrameType.ERROR and payload["code"] == "idle", payload
        with pytest.raises(ConnectionError):
            idle.reply()
        busy.sock.settimeout(1.5)
        with pytest.raises(TimeoutError):
            busy.reply()  # still open, nothing said to it
        sink = SocketSink(d.socket)
        sink.record(SuperstepRecord("idle", 0, "s", 0, 1, 0, 1, 2))
        assert sink.flush(5)
        time.sleep(2.5)  # closed for idleness meanwhile
        sink.record(SuperstepRecord("idle", 1, "s", 0, 1, 0, 1, 2))
        assert sink.flush(10), sink.refused  # reconnected, resent, acknowledged
        sink.close()
    finally:
        d.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another uid")
def test_one_uid_cannot_take_more_than_its_connections() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="counterd-limits-", dir="/tmp"))
    os.chmod(tmp, 0o755)  # the other uid must reach the socket
    d = DaemonProc(tmp / "d")
    d.write_config(socket_extra="max_clients_per_uid = 3\n")
    d.start()
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # uid 65534: three connections, then a fourth that must be refused
            status = b"e"
            try:
                os.close(r)
                os.setgid(65534)
                os.setuid(65534)
                held = [RawClient(d.socket) for _ in range(3)]  # noqa: F841 (kept open)
                fourth = RawClient(d.socket, hello=False)
                ftype, payload = fourth.reply()
                status = b"k" if (ftype is FrameType.ERROR
                                  and payload["code"] == "too_many_clients") else b"n"
            except BaseException as exc:
                status = f"e{type(exc).__name__}: {exc}"[:200].encode()
            finally:
                os.write(w, status)
                time.sleep(3)  # hold the three while root connects
                os._exit(0)
        os.close(w)
        status = os.read(r, 256)
        assert status == b"k", status
        mine = [RawClient(d.socket) for _ in range(5)]  # root is exempt: not refused
        assert len(mine) == 5
        os.waitpid(pid, 0)
        counted = d.metrics()  # exported at 0 from the start (issue 34): counted is not 0
        assert 'counterd_protocol_errors_total{reason="too_many_clients"}' in counted
        assert 'counterd_protocol_errors_total{reason="too_many_clients"} 0.0' not in counted
    finally:
        d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_limits_are_config_keys_checked_at_load(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[socket]\nmax_clients_per_uid = 7\nidle_timeout_s = 30\n"
                    "max_bytes_per_client = 1048576\n")
    cfg = config.load(path, env={})
    assert (cfg.limits.max_clients_per_uid, cfg.limits.idle_timeout_s,
            cfg.limits.max_bytes_per_client) == (7, 30.0, 1048576)
    assert config.load(None, env={"COUNTERD_MAX_CONTEXTS": "9"}).limits \
        .max_contexts_per_client == 9
    path.write_text("[socket]\nmax_bytes_per_client = 10\n")
    with pytest.raises(BadInput, match="max_bytes_per_client"):
        config.load(path, env={})
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(BadInput, match="not UTF-8"):
        config.load(path, env={})


def test_out_of_file_descriptors_pauses_accepting_instead_of_spinning(tmp_path: Path) -> None:
    """The daemon at its open-file limit: clients beyond wait in the backlog, the daemon's
    CPU stays low and its log short, and it serves again once connections close."""
    import subprocess

    d = DaemonProc(tmp_path / "d")
    d.write_config(socket_extra="max_clients = 64\n")
    d.start()
    assert d.proc is not None
    soft = 40
    subprocess.run(["prlimit", f"--pid={d.proc.pid}", f"--nofile={soft}:{soft}"], check=True)
    socks = []
    try:
        for _ in range(60):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(d.socket))  # the kernel's backlog takes them
            socks.append(s)
        log_before = d.log.stat().st_size
        ticks0 = _cpu_ticks(d.proc.pid)
        time.sleep(3)
        cpu_s = (_cpu_ticks(d.proc.pid) - ticks0) / os.sysconf("SC_CLK_TCK")
        assert cpu_s < 0.6, f"the daemon used {cpu_s:.2f} s of CPU in 3 s"
        assert d.log.stat().st_size - log_before < 20_000
        assert "pausing new connections" in d.log_text()
    finally:
        for s in socks:
            s.close()
    sink = SocketSink(d.socket)
    sink.record(SuperstepRecord("after", 0, "s", 0, 1, 0, 1, 2))
    assert sink.flush(15)
    sink.close()
    d.stop()


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])
