"""A real Prometheus scrapes the daemon; promtool accepts the exposition."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from counterd.data.records import SuperstepRecord
from counterd.markers.sinks.socket import SocketSink

from .conftest import DaemonProc, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _records(d: DaemonProc) -> None:
    """Five supersteps of rank 0, 500 ns each; the last one also on rank 1, begun 300 ns later
    for 400 ns: its span is 700 ns (the work plus less than the skew), its work 500 ns, its
    start skew 300 ns."""
    sink = SocketSink(d.socket, job="bsp")
    for i in range(5):
        sink.record(SuperstepRecord(run_id="prom", index=i, name="exchange", rank=0, pid=1,
                                    cpu=0, begin_ns=1000 * i, end_ns=1000 * i + 500))
    sink.record(SuperstepRecord(run_id="prom", index=4, name="exchange", rank=1, pid=2, cpu=1,
                                begin_ns=4300, end_ns=4700))
    assert sink.flush(10)
    sink.close()


@pytest.mark.skipif(not Path(PROMTOOL).exists(),
                    reason="promtool not installed (Debian package prometheus; "
                           "scripts/system-deps.sh installs it as root)")
def test_promtool_accepts_the_exposition(daemon: DaemonProc) -> None:
    _records(daemon)
    text = daemon.metrics()
    out = subprocess.run([PROMTOOL, "check", "metrics"], input=text, text=True,
                         capture_output=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                    reason="prometheus not installed (Debian package prometheus; "
                           "scripts/system-deps.sh installs it as root)")
def test_prometheus_scrapes_the_daemon(daemon: DaemonProc, tmp_path: Path) -> None:
    _records(daemon)
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: counterd\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{daemon.port}']\n")
    log = (tmp_path / "prometheus.log").open("wb")
    prom = subprocess.Popen([PROMETHEUS, f"--config.file={cfg}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    def query(q: str) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(q)}"
        deadline = time.monotonic() + 60
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not result:
            time.sleep(0.5)
            try:
                body = json.loads(urllib.request.urlopen(url, timeout=5).read())
            except OSError:
                continue
            result = body["data"]["result"]
        assert result, f"prometheus never returned {q}: " + \
            (tmp_path / "prometheus.log").read_text()[-1500:]
        return result

    try:
        series = query('counterd_superstep_duration_seconds_count{workload="bsp"}')[0]
        assert series["metric"]["superstep"] == "exchange"
        assert float(series["value"][1]) == 6.0  # one observation per record
        # The last superstep's span, work and start skew, side by side.
        span, work, skew = (float(query(f'counterd_last_superstep{n}_seconds{{workload="bsp"}}')
                                  [0]["value"][1]) for n in ("", "_work", "_skew"))
        assert (span, work, skew) == (700e-9, 500e-9, 300e-9)
        targets = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).read())
        assert targets["data"]["activeTargets"][0]["health"] == "up"
    finally:
        prom.terminate()
        prom.wait(30)
        log.close()
