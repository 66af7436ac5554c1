"""A real ``counterd run`` in a subprocess, on temp paths and free loopback ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from counterd.wire import protocol
from counterd.wire.protocol import FrameType

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class DaemonProc:
    """``counterd run --config <tmp>/counterd.toml``; ``start()``, ``stop()``, ``kill9()``."""

    def __init__(self, tmp: Path, extra: str = "", interval: float = 0.2) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        os.chmod(tmp, 0o755)
        self.tmp = tmp
        self.socket = tmp / "counterd.sock"
        self.store = tmp / "counterd.db"
        self.port = free_port()
        self.config = tmp / "counterd.toml"
        self.log = tmp / "daemon.log"
        self.write_config(extra, interval)
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self, extra: str = "", interval: float = 0.2, socket_extra: str = ""
                     ) -> None:
        self.config.write_text(
            f'log_level = "info"\n[metrics]\nlisten = "127.0.0.1:{self.port}"\nrefresh_s = 0.1\n'
            f'[socket]\npath = "{self.socket}"\n{socket_extra}[store]\npath = "{self.store}"\n'
            f'synchronous = "normal"\n[sampling]\ninterval_s = {interval}\n' + extra)

    def start(self, timeout: float = 15.0) -> DaemonProc:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "counterd.commands.cli", "run", "--config", str(self.config)],
            stdout=subprocess.DEVNULL, stderr=self.log.open("ab"), env=env, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"counterd run exited {self.proc.returncode}: "
                                   + self.log.read_text()[-2000:])
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                urllib.request.urlopen(self.metrics_url, timeout=2).read()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("counterd run did not become ready: " + self.log.read_text()[-2000:])

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def metrics(self) -> str:
        return urllib.request.urlopen(self.metrics_url, timeout=5).read().decode()

    def stop(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
        env.update(COUNTERD_SOCKET=str(self.socket), PYTHONPATH=str(ROOT), **extra)
        return env

    def log_text(self) -> str:
        return self.log.read_text()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path / "d").start()
    yield d
    if d.alive():
        d.stop()


def next_reply(sock: socket.socket, decoder: protocol.Decoder
               ) -> tuple[FrameType, dict[str, object]]:
    """The daemon's next frame on ``sock`` (ConnectionError once it closes)."""
    while True:
        for frame in decoder.frames():
            return frame
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        decoder.feed(data)


class RawClient:
    """A protocol-level client for malformed-input tests."""

    def __init__(self, path: Path, hello: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        self.decoder = protocol.Decoder()
        if hello:
            self.send_frame(protocol.Hello(pid=os.getpid(), host="h", job="raw"))
            assert self.reply()[0] is FrameType.WELCOME

    def send(self, ftype: FrameType, payload: dict[str, object]) -> None:
        """Any payload, malformed ones included (see send_frame for well-formed frames)."""
        self.sock.sendall(protocol.encode(ftype, payload))

    def send_frame(self, frame: protocol.Frame, version: int = protocol.PROTOCOL_VERSION
                   ) -> None:
        self.sock.sendall(frame.encode(version))

    def reply(self) -> tuple[FrameType, dict[str, object]]:
        return next_reply(self.sock, self.decoder)

    def reply_to(self, seq: int) -> tuple[FrameType, dict[str, object]]:
        """The first reply that is not an ACK of frames before ``seq`` (acks are cumulative,
        coalesced and sent once committed: one for an earlier frame may come first)."""
        reply = self.reply()
        while reply[0] is FrameType.ACK and int(reply[1]["s"]) < seq:  # type: ignore[call-overload]
            reply = self.reply()
        return reply

    def sync(self, seq: int, version: int = protocol.PROTOCOL_VERSION
             ) -> tuple[FrameType, dict[str, object]]:
        """Send SYNC ``seq``; its reply (:meth:`reply_to`)."""
        self.send_frame(protocol.Sync(seq), version)
        return self.reply_to(seq)

    def close(self) -> None:
        self.sock.close()
