"""Start and stop a ``counterd run`` subprocess on temp paths for the daemon benchmarks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Daemon:
    def __init__(self, tmp: Path, extra: str = "", synchronous: str = "full",
                 interval: float = 1.0, socket_extra: str = "", metrics_extra: str = "",
                 src: Path | None = None) -> None:
        """``src``: run the daemon of that source tree (its ``counterd`` package first on
        PYTHONPATH, as bench/attacks.py --daemon-src does); None: this interpreter's."""
        self.tmp = tmp
        self.socket = tmp / "counterd.sock"
        self.store = tmp / "counterd.db"
        self.port = free_port()
        self.config = tmp / "counterd.toml"
        self.config.write_text(
            f'log_level = "warning"\n[metrics]\nlisten = "127.0.0.1:{self.port}"\n{metrics_extra}'
            f'[socket]\npath = "{self.socket}"\n{socket_extra}'
            f'[store]\npath = "{self.store}"\nsynchronous = "{synchronous}"\n'
            f'[sampling]\ninterval_s = {interval}\n' + extra)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
        if src is not None:
            env["PYTHONPATH"] = str(src)
        self.proc = subprocess.Popen([sys.executable, "-m", "counterd.commands.cli", "run",
                                      "--config",
                                      str(self.config)], env=env, cwd=src,
                                     stderr=(tmp / "daemon.log").open("wb"))
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                urllib.request.urlopen(self.url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError((tmp / "daemon.log").read_text()) from None
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)
