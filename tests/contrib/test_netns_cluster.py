"""A test cluster on one machine (issue 31 item 4): N hosts, each a network namespace with its
own address on a bridge and its own hostname (UTS namespace), one counterd per host bound to
that address, a BSP program marked on every host, and a real Prometheus in its own namespace
that discovers the daemons through `counterd cluster targets`'s file_sd JSON, scrapes them,
evaluates contrib/prometheus's rules and fires CounterdDown when one daemon is killed -9
(checked through Prometheus's HTTP API). Every address lives inside the namespaces; the bridge
is in a namespace of its own: nothing is added to the host's network.

Skipped with the reason where namespaces cannot be made (not root, no ip(8), no unshare).
Slow: under 15 s with 3 hosts, scrape and evaluation every second and the alert's `for:`
shortened to 2 s (the shipped rule keeps 1m)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from counterd import cli
from counterd.daemon.store import open_readonly

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "contrib" / "prometheus"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
IP, UNSHARE, CURL = shutil.which("ip"), shutil.which("unshare"), shutil.which("curl")
HOSTS = 3
NET = "10.231.0"  # inside the namespaces only
PROM_ADDR = f"{NET}.254"


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool, name in ((IP, "ip (iproute2)"), (UNSHARE, "unshare (util-linux)"),
                       (CURL, "curl")):
        if tool is None:
            return f"{name} not installed"
    if not Path(PROMETHEUS).exists():
        return "prometheus not installed (scripts/system-deps.sh)"
    probe = subprocess.run([str(UNSHARE), "--net", "--uts", "true"], capture_output=True)
    if probe.returncode != 0:
        return f"cannot make namespaces here: {probe.stderr.decode().strip()}"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None,
                                                   reason=str(_why_not()))]


def _ip(*args: str) -> None:
    subprocess.run([str(IP), *args], check=True, capture_output=True, timeout=10)


class Cluster:
    """Namespaces ``<tag>-sw`` (the bridge), ``<tag>-n1..nN`` (hosts), ``<tag>-prom``."""

    def __init__(self, tmp: Path, n: int) -> None:
        self.tmp, self.n = tmp, n
        self.tag = f"cd31-{os.getpid()}"
        self.made: list[str] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.sw = self._ns("sw")
        _ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.sw, "link", "set", "br0", "up")

    def _ns(self, name: str) -> str:
        ns = f"{self.tag}-{name}"
        _ip("netns", "add", ns)
        self.made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        return ns

    def host(self, name: str, addr: str) -> str:
        ns = self._ns(name)
        peer = f"p-{name}"
        _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", peer,
            "netns", self.sw)
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", self.sw, "link", "set", peer, "master", "br0")
        _ip("-n", self.sw, "link", "set", peer, "up")
        return ns

    def run(self, key: str, ns: str, hostname: str, argv: list[str],
            env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """``argv`` in namespace ``ns`` with its own hostname (a new UTS namespace)."""
        log = (self.tmp / f"{key}.log").open("wb")
        proc = subprocess.Popen(
            [str(IP), "netns", "exec", ns, str(UNSHARE), "--uts", "sh", "-c",
             'hostname "$0" && exec "$@"', hostname, *argv],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=ROOT)
        self.procs[key] = proc
        return proc

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for ns in reversed(self.made):
            subprocess.run([str(IP), "netns", "del", ns], capture_output=True, timeout=10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    tmp_path.chmod(0o755)
    c = Cluster(tmp_path, HOSTS)
    try:
        yield c
    finally:
        c.close()


def _daemon_config(tmp: Path, name: str, addr: str) -> Path:
    d = tmp / name
    d.mkdir()
    cfg = d / "counterd.toml"
    cfg.write_text(f'[metrics]\nlisten = "{addr}:9464"\nallow = ["{PROM_ADDR}", "127.0.0.1"]\n'
                   f'refresh_s = 0.1\n[socket]\npath = "{d / "counterd.sock"}"\n'
                   f'[store]\npath = "{d / "counterd.db"}"\nsynchronous = "normal"\n'
                   '[sampling]\nbackend = "none"\n')
    return cfg


BSP = """
import counterd
from counterd.markers.api import recorder
for i in range(20):
    with counterd.superstep("exchange"):
        sum(range(20000))
assert recorder().sink.flush(10)
"""


def test_prometheus_scrapes_a_namespace_cluster_and_fires_counterd_down(
        cluster: Cluster) -> None:
    tmp = cluster.tmp
    hosts = [f"{NET}.{i}" for i in range(1, HOSTS + 1)]
    for i, addr in enumerate(hosts, 1):
        ns = cluster.host(f"n{i}", addr)
        cfg = _daemon_config(tmp, f"n{i}", addr)
        cluster.run(f"counterd-n{i}", ns, f"node{i:03d}",
                    [sys.executable, "-m", "counterd.cli", "run", "--config", str(cfg)],
                    {"PYTHONPATH": str(ROOT)})
    prom_ns = cluster.host("prom", PROM_ADDR)
    sd = tmp / "file_sd"
    sd.mkdir()
    hostlist = f"{NET}.[1-{HOSTS}]"
    assert cli.main(["cluster", "targets", hostlist, "--label", "cluster=netns",
                     "--out", str(sd / "counterd.json")]) == 0
    for rules in ("counterd.rules.yml", "counterd.alerts.yml"):
        text = (CONTRIB / rules).read_text()
        (tmp / rules).write_text(text.replace("for: 1m", "for: 2s"))
    text = (CONTRIB / "prometheus.yml").read_text()
    for old, new in (("scrape_interval: 15s", "scrape_interval: 1s"),
                     ("evaluation_interval: 15s", "evaluation_interval: 1s"),
                     ("/etc/prometheus/file_sd", str(sd))):
        text = text.replace(old, new)
    (tmp / "prometheus.yml").write_text(text)
    cluster.run("prometheus", prom_ns, "prometheus",
                [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}", "--web.listen-address=127.0.0.1:9090"])

    def api(path: str, q: str = "") -> Any:
        url = f"http://127.0.0.1:9090/api/v1/{path}" + (
            f"?query={urllib.parse.quote(q)}" if q else "")
        out = subprocess.run([str(IP), "netns", "exec", prom_ns, str(CURL), "-sf", url],
                             capture_output=True, timeout=10)
        return json.loads(out.stdout)["data"] if out.returncode == 0 else None

    def wait(what: str, cond: Any, timeout: float = 10) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = cond()
            if got:
                return got
            time.sleep(0.3)
        logs = {p.name: p.read_text()[-600:] for p in tmp.glob("*.log")}
        raise AssertionError(f"{what} did not happen: {logs}")

    def query(q: str) -> list[dict[str, Any]]:
        data = api("query", q)
        return list(data["result"]) if data else []

    # the BSP program on every host (its namespace, its hostname), in one batch job
    programs = [cluster.run(f"bsp-n{i}", f"{cluster.tag}-n{i}", f"node{i:03d}",
                            [sys.executable, "-c", BSP],
                            {"PYTHONPATH": str(ROOT), "SLURM_JOB_ID": "77", "COUNTERD_JOB": "bsp",
                             "COUNTERD_SOCKET": str(tmp / f"n{i}" / "counterd.sock")})
                for i in range(1, HOSTS + 1)]
    assert [p.wait(30) for p in programs] == [0] * HOSTS
    for i in range(1, HOSTS + 1):  # each daemon saw its own host's name
        assert {r.host for r in open_readonly(tmp / f"n{i}" / "counterd.db").runs()} == \
            {f"node{i:03d}"}
    up = wait("every target up", lambda: len(query('up{job="counterd"} == 1')) == HOSTS)
    assert up
    per_node = wait("the job's series from every node", lambda: query(
        'count(counterd_superstep_duration_seconds_count{batch_job="77",workload="bsp"})'))
    assert float(per_node[0]["value"][1]) == HOSTS
    assert wait("a job-level rule", lambda: query(
        'batch_job:counterd_last_superstep_work_seconds:max{batch_job="77"}'))
    assert not query('ALERTS{alertname="CounterdDown"}')
    # a peer on the network but not on metrics.allow (host n1 scraping n3): closed unanswered,
    # counted, and the count reaches Prometheus
    refused = subprocess.run([str(IP), "netns", "exec", f"{cluster.tag}-n1", str(CURL), "-s",
                              f"http://{hosts[2]}:9464/metrics"], capture_output=True,
                             timeout=10)
    assert refused.returncode == 52 and refused.stdout == b""  # curl: empty reply
    assert wait("the refusal counted", lambda: query(
        f'counterd_metrics_refused_total{{instance="{hosts[2]}",reason="not_allowed"}} == 1'))
    victim = cluster.procs["counterd-n2"]
    os.kill(victim.pid, signal.SIGKILL)  # ip netns exec execs: the pid is unshare's, then sh's,
    victim.wait(10)                       # then counterd's (each exec), so this kills counterd
    firing = wait("CounterdDown firing", lambda: query(
        'ALERTS{alertname="CounterdDown",alertstate="firing"}'))
    assert [a["metric"]["instance"] for a in firing] == [hosts[1]]
