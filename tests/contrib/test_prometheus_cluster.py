"""A real Prometheus with contrib/prometheus's configuration: discovers a counterd through the
file_sd JSON that `counterd cluster targets` wrote, scrapes it over TLS with basic auth,
evaluates the recording rules on a batch job's series, and every query of the Grafana
dashboard (contrib/grafana: its panels and its template variables) returns series. Slow (a
Prometheus start): < 15 s."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from counterd.backends.base import CounterValue
from counterd.commands import cli
from counterd.daemon.config import Config
from counterd.daemon.service import Daemon
from counterd.data.events import Source
from counterd.data.records import SuperstepRecord
from counterd.markers.sinks.socket import SocketSink
from counterd.prediction import TERMS, Prediction

from ..daemon.conftest import free_port

CONTRIB = Path(__file__).resolve().parents[2] / "contrib" / "prometheus"
DASHBOARD = CONTRIB.parent / "grafana" / "counterd-cluster.json"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
OPENSSL = shutil.which("openssl")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                       reason="prometheus not installed (Debian package prometheus; "
                              "scripts/system-deps.sh installs it as root)"),
    pytest.mark.skipif(OPENSSL is None, reason="openssl not installed (test certificate)"),
]


def _pbkdf2_line(user: str, password: str) -> str:
    salt = b"prometheus-test"
    ab64 = lambda b: base64.b64encode(b).decode().rstrip("=").replace("+", ".")  # noqa: E731
    key = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 1000)
    return f"{user}:$pbkdf2-sha256$1000${ab64(salt)}${ab64(key)}\n"


def _records(first: int) -> list[SuperstepRecord]:
    """Two processors' supersteps first..first+2, 500 ns and 400 ns, with loads and misses."""
    return [SuperstepRecord(run_id="r", index=i, name="x", rank=r, pid=1 + r, cpu=r,
                            begin_ns=1000 * i, end_ns=1000 * i + 500 - 100 * r,
                            counters={"loads": CounterValue(1000.0, Source.MEASURED),
                                      "l1d_misses": CounterValue(100.0, Source.MEASURED)})
            for i in range(first, first + 3) for r in (0, 1)]


def _predict(records: Any) -> Prediction:
    return Prediction(terms_s={t: 2e-7 for t in TERMS}, total_s=6e-7)


def _variables(dashboard: dict[str, Any]) -> dict[str, str]:
    """Each template variable's label_values(METRIC, LABEL) as PromQL: group by (LABEL)."""
    out = {}
    for v in dashboard["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", v["query"]["query"])
        assert m, v
        out[v["name"]] = f"group by ({m.group(2)}) ({m.group(1)})"
    return out


def test_prometheus_discovers_scrapes_over_tls_and_evaluates_the_rules(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    crt, key = tmp_path / "crt.pem", tmp_path / "key.pem"
    subprocess.run([str(OPENSSL), "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True,
                   timeout=30)
    (tmp_path / "users").write_text(_pbkdf2_line("prometheus", "s3cret"))
    (tmp_path / "password").write_text("s3cret")
    d = Daemon(Config(metrics_listen="127.0.0.1:0", metrics_refresh_s=0.05,
                      tls_cert_file=str(crt), tls_key_file=str(key),
                      basic_auth_file=str(tmp_path / "users"), sample_backend="none",
                      store_synchronous="normal", socket_path=tmp_path / "s.sock",
                      store_path=tmp_path / "s.db"), predict=_predict)
    d.start()
    loop = threading.Thread(target=d.serve)
    loop.start()
    prom: subprocess.Popen[bytes] | None = None
    log = tmp_path / "prometheus.log"
    try:
        monkeypatch.setenv("SLURM_JOB_ID", "31")
        sink = SocketSink(d.config.socket_path, job="cg")
        for rec in _records(0):
            sink.record(rec)
        assert sink.flush(10)
        sd = tmp_path / "file_sd"
        sd.mkdir()
        assert cli.main(["cluster", "targets", "127.0.0.1", "--port", str(d.metrics_port),
                         "--label", "cluster=test", "--out", str(sd / "counterd.json")]) == 0
        for rules in ("counterd.rules.yml", "counterd.alerts.yml"):
            shutil.copy(CONTRIB / rules, tmp_path / rules)
        text = (CONTRIB / "prometheus.yml").read_text()
        for old, new in (("scrape_interval: 15s", "scrape_interval: 1s"),
                         ("evaluation_interval: 15s", "evaluation_interval: 1s"),
                         ("/etc/prometheus/file_sd", str(sd)),
                         ("    # Sites that require TLS", f"    scheme: https\n"
                          f"    tls_config: {{ca_file: {crt}}}\n"
                          f"    basic_auth: {{username: prometheus, password_file: "
                          f"{tmp_path / 'password'}}}\n    # Sites that require TLS")):
            assert old in text
            text = text.replace(old, new)
        (tmp_path / "prometheus.yml").write_text(text)
        port = free_port()
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                stdout=log.open("wb"), stderr=subprocess.STDOUT)

        def query(q: str) -> list[dict[str, Any]]:
            url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(q)}"
            deadline = time.monotonic() + 12
            while time.monotonic() < deadline:
                time.sleep(0.25)
                try:
                    result = json.loads(urllib.request.urlopen(url, timeout=5).read()
                                        )["data"]["result"]
                except OSError:
                    continue
                if result:
                    return list(result)
            raise AssertionError(f"prometheus never returned {q}: {log.read_text()[-1500:]}")

        up = query('up{job="counterd"} == 1')[0]["metric"]
        assert (up["instance"], up["cluster"]) == ("127.0.0.1", "test")
        work = query('batch_job:counterd_last_superstep_work_seconds:max{batch_job="31"}')
        assert float(work[0]["value"][1]) == 500e-9
        for rec in _records(3):  # more after the first scrape: the rate() rules have a value
            sink.record(rec)
        assert sink.flush(10)
        sink.close()
        query('counterd_superstep_duration_seconds_count{batch_job="31",superstep="x"} == 12')
        query('batch_job_superstep:counterd_superstep_duration_seconds:max_mean_rate5m > 0')
        dashboard = json.loads(DASHBOARD.read_text())
        assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
        chosen = {"cluster": "test", "batch_job": "31", "node": "127.0.0.1", "superstep": "x"}

        def chose(expr: str) -> str:
            for name, value in chosen.items():
                expr = expr.replace(f"${name}", value)
            return expr

        for name, promql in _variables(dashboard).items():
            values = {next(iter(r["metric"].values())) for r in query(chose(promql))}
            assert chosen[name] in values, (name, values)
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                assert query(chose(target["expr"])), panel["title"]  # query() waits for series
        assert d.state.metrics_refused["unauthorized"] == 0
        assert d.state.metrics_refused["tls"] == 0
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(30)
        d.request_stop()
        loop.join(30)
