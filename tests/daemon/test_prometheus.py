"""A real Prometheus scrapes the daemon; promtool accepts the exposition."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from counterd.markers.client import SocketSink
from counterd.records import SuperstepRecord

from .conftest import DaemonProc, free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _records(d: DaemonProc) -> None:
    sink = SocketSink(d.socket, job="bsp")
    for i in range(5):
        sink.record(SuperstepRecord(run_id="prom", index=i, name="exchange", rank=0, pid=1,
                                    cpu=0, begin_ns=1000 * i, end_ns=1000 * i + 500))
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
    try:
        query = urllib.parse.quote('counterd_superstep_duration_seconds_count{workload="bsp"}')
        url = f"http://127.0.0.1:{port}/api/v1/query?query={query}"
        deadline = time.monotonic() + 60
        result: list[dict[str, object]] = []
        while time.monotonic() < deadline and not result:
            time.sleep(0.5)
            try:
                body = json.loads(urllib.request.urlopen(url, timeout=5).read())
            except OSError:
                continue
            result = body["data"]["result"]
        assert result, "prometheus never returned the counterd series: " + \
            (tmp_path / "prometheus.log").read_text()[-1500:]
        series = result[0]
        assert series["metric"]["superstep"] == "exchange"  # type: ignore[index]
        assert float(series["value"][1]) == 5.0  # type: ignore[index]
        targets = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).read())
        assert targets["data"]["activeTargets"][0]["health"] == "up"
    finally:
        prom.terminate()
        prom.wait(30)
        log.close()
