"""A counterd cluster on one machine in network namespaces, and its Prometheus (issue 31).

    sudo .venv/bin/python bench/netns_cluster.py [--hosts 8] [--scrape 5]

N hosts, each a network namespace with its own address on a bridge (the bridge in a namespace
of its own; 10.231.0.0/24 exists only inside them) and its own hostname (UTS namespace), one
``counterd run`` per host bound to its address with metrics.allow naming the Prometheus, a BSP
program marked on every host in one batch job, and a real Prometheus in its own namespace
discovering the daemons through ``counterd cluster targets``'s file_sd JSON, with
contrib/prometheus's rules. The bench measures the issue's targets at ``--scrape`` seconds:
every target up within two scrape intervals of being listed; scrape duration p99 per target
(Prometheus's ``scrape_duration_seconds``); ``prometheus_rule_evaluation_failures_total``;
the node's series count with the job live and after the grace period; CounterdDown (its
shipped ``for: 1m``) firing after a kill -9 and resolving after a restart.
tests/contrib/test_netns_cluster.py runs the same :class:`Cluster` at small scale.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONTRIB = ROOT / "contrib" / "prometheus"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
IP, UNSHARE, CURL = shutil.which("ip"), shutil.which("unshare"), shutil.which("curl")
NSENTER = shutil.which("nsenter")
NET = "10.231.0"  # inside the namespaces only
PROM_ADDR = f"{NET}.254"

BSP = """
import counterd
from counterd.markers.api import recorder
for i in range(20):
    with counterd.superstep("exchange"):
        sum(range(20000))
assert recorder().sink.flush(10)
"""


def _why_not(tools: tuple[tuple[str | None, str], ...], probe: list[str]) -> str | None:
    """Why namespaces cannot be made here: not root, one of ``tools`` (path, name) missing,
    or ``unshare`` with the options ``probe`` failing (None: they can)."""
    if os.geteuid() != 0:
        return "namespaces need root (ip netns add, unshare)"
    for tool, name in ((IP, "ip (iproute2)"), (UNSHARE, "unshare (util-linux)"), *tools):
        if tool is None:
            return f"{name} not installed"
    done = subprocess.run([str(UNSHARE), *probe, "true"], capture_output=True)
    if done.returncode != 0:
        return f"cannot make namespaces here: {done.stderr.decode().strip()}"
    return None


def why_not() -> str | None:
    """Why the Prometheus cluster cannot be made here (None: it can)."""
    if not Path(PROMETHEUS).exists() and os.geteuid() == 0:
        return "prometheus not installed (scripts/system-deps.sh)"
    return _why_not(((CURL, "curl"),), ["--net", "--uts"])


def why_not_timens() -> str | None:
    """Why hosts with time namespaces (:meth:`Cluster.clock_host`) cannot be made here (None:
    they can): also nsenter, and a kernel with time namespaces (Linux 5.6)."""
    return _why_not(((NSENTER, "nsenter (util-linux)"),),
                    ["--net", "--uts", "--time", "--fork", "--monotonic", "1000"])


def _ip(*args: str) -> None:
    subprocess.run([str(IP), *args], check=True, capture_output=True, timeout=10)


class Cluster:
    """Namespaces ``<tag>-sw`` (the bridge), ``<tag>-n1..`` (hosts), ``<tag>-prom``; every
    process started with :meth:`run` and every namespace go at :meth:`close`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.tag = f"cd31-{os.getpid()}"
        self.made: list[str] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.hosts: list[str] = []
        self.holders: dict[str, int] = {}  # address -> pid in its UTS and time namespaces
        self.sw = self._ns("sw")
        _ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.sw, "link", "set", "br0", "up")
        self.prom_ns = ""

    def _ns(self, name: str) -> str:
        ns = f"{self.tag}-{name}"
        _ip("netns", "add", ns)
        self.made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        return ns

    def ns(self, i: int) -> str:
        return f"{self.tag}-n{i}"

    def clock_host(self, i: int, monotonic_s: int) -> int:
        """Host ``i`` (address ``NET.i``, hostname ``nodeNNN``) whose CLOCK_MONOTONIC runs
        ``monotonic_s`` seconds ahead (a time namespace of its own): a process holds its UTS
        and time namespaces; :meth:`enter` runs commands in them. Returns the holder's pid."""
        ns = self.host(f"n{i}", f"{NET}.{i}")
        holder = subprocess.Popen(
            [str(IP), "netns", "exec", ns, str(UNSHARE), "--uts", "--time", "--fork",
             "--kill-child", "--monotonic", str(monotonic_s), "sh", "-c",
             f'hostname node{i:03d} && exec sleep infinity'])
        self.procs[f"holder-n{i}"] = holder
        children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # unshare's child: in the new time namespace
            kids = children.read_text().split() if children.exists() else []
            if kids and subprocess.run([str(NSENTER), "-t", kids[0], "--uts", "hostname"],
                                       capture_output=True, text=True
                                       ).stdout.strip() == f"node{i:03d}":
                self.hosts.append(f"{NET}.{i}")
                self.holders[f"{NET}.{i}"] = int(kids[0])
                return int(kids[0])
            time.sleep(0.02)
        raise RuntimeError(f"host n{i}'s namespaces were not made")

    def enter(self, addr: str) -> list[str]:
        """The argv prefix that runs a command in host ``addr``'s network, UTS and time
        namespaces (:meth:`clock_host`)."""
        return [str(NSENTER), "-t", str(self.holders[addr]), "--net", "--uts", "--time", "--"]

    def launcher(self) -> Path:
        """A launcher for MPI's ``ssh`` bootstrap (``mpiexec -launcher ssh -launcher-exec
        PATH``): ``PATH [-x ...] HOST COMMAND`` runs COMMAND in HOST's namespaces instead of
        over ssh."""
        path = self.tmp / "enter-host.sh"
        cases = "".join(f"  {addr}) pid={pid} ;;\n" for addr, pid in self.holders.items())
        path.write_text(
            "#!/bin/sh\n"
            'while [ "${1#-}" != "$1" ]; do shift; done\n'  # ssh's options (-x)
            'host=$1; shift\n'
            f'case $host in\n{cases}'
            '  *) echo "enter-host: unknown host $host" >&2; exit 255 ;;\n'
            'esac\n'
            f'exec {NSENTER} -t "$pid" --net --uts --time -- sh -c "$*"\n')
        path.chmod(0o755)
        return path

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
        """``argv`` in namespace ``ns`` with its own hostname (a new UTS namespace). ip netns
        exec, unshare and sh each exec the next: the Popen's pid is the command's."""
        log = (self.tmp / f"{key}.log").open("ab")
        proc = subprocess.Popen(
            [str(IP), "netns", "exec", ns, str(UNSHARE), "--uts", "sh", "-c",
             'hostname "$0" && exec "$@"', hostname, *argv],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, cwd=ROOT)
        self.procs[key] = proc
        return proc

    # -- the cluster -----------------------------------------------------------------------
    def daemon_config(self, i: int, grace_s: float = 60) -> Path:
        d = self.tmp / f"n{i}"
        d.mkdir(exist_ok=True)
        cfg = d / "counterd.toml"
        cfg.write_text(f'log_level = "warning"\n[metrics]\nlisten = "{NET}.{i}:9464"\n'
                       f'allow = ["{PROM_ADDR}", "127.0.0.1"]\nrefresh_s = 0.1\n'
                       f'grace_s = {grace_s}\n[socket]\npath = "{d / "counterd.sock"}"\n'
                       f'[store]\npath = "{d / "counterd.db"}"\nsynchronous = "normal"\n'
                       '[sampling]\nbackend = "none"\n')
        return cfg

    def start_daemon(self, i: int) -> subprocess.Popen[bytes]:
        return self.run(f"counterd-n{i}", self.ns(i), f"node{i:03d}",
                        [sys.executable, "-m", "counterd.commands.cli", "run", "--config",
                         str(self.tmp / f"n{i}" / "counterd.toml")], {"PYTHONPATH": str(ROOT)})

    def build(self, n: int, scrape_s: float, *, alert_for: str | None = None,
              grace_s: float = 60) -> None:
        """N hosts with their daemons, the file_sd JSON, and Prometheus scraping every
        ``scrape_s`` (``alert_for`` replaces the rules' ``for: 1m``: tests)."""
        from counterd.commands import cli

        for i in range(1, n + 1):
            self.hosts.append(f"{NET}.{i}")
            self.host(f"n{i}", self.hosts[-1])
            self.daemon_config(i, grace_s)
            self.start_daemon(i)
        self.prom_ns = self.host("prom", PROM_ADDR)
        sd = self.tmp / "file_sd"
        sd.mkdir()
        if cli.main(["cluster", "targets", f"{NET}.[1-{n}]", "--label", "cluster=netns",
                     "--out", str(sd / "counterd.json")]) != 0:
            raise RuntimeError("counterd cluster targets failed")
        for rules in ("counterd.rules.yml", "counterd.alerts.yml"):
            text = (CONTRIB / rules).read_text()
            (self.tmp / rules).write_text(text.replace("for: 1m", f"for: {alert_for}")
                                          if alert_for else text)
        text = (CONTRIB / "prometheus.yml").read_text()
        for old, new in (("scrape_interval: 15s", f"scrape_interval: {scrape_s:g}s"),
                         ("evaluation_interval: 15s", f"evaluation_interval: {scrape_s:g}s"),
                         ("/etc/prometheus/file_sd", str(sd))):
            text = text.replace(old, new)
        (self.tmp / "prometheus.yml").write_text(text)
        self.run("prometheus", self.prom_ns, "prometheus",
                 [PROMETHEUS, f"--config.file={self.tmp / 'prometheus.yml'}",
                  f"--storage.tsdb.path={self.tmp / 'tsdb'}",
                  "--web.listen-address=127.0.0.1:9090"])

    def run_bsp(self, batch_job: str = "77") -> list[int]:
        """The BSP program on every host (its namespace, its hostname); exit codes."""
        progs = [self.run(f"bsp-n{i}", self.ns(i), f"node{i:03d}", [sys.executable, "-c", BSP],
                          {"PYTHONPATH": str(ROOT), "SLURM_JOB_ID": batch_job,
                           "COUNTERD_JOB": "bsp",
                           "COUNTERD_SOCKET": str(self.tmp / f"n{i}" / "counterd.sock")})
                 for i in range(1, len(self.hosts) + 1)]
        return [p.wait(60) for p in progs]

    def curl(self, ns: str, url: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([str(IP), "netns", "exec", ns, str(CURL), "-s", url],
                              capture_output=True, timeout=10)

    def query(self, q: str) -> list[dict[str, Any]]:
        """Prometheus's instant query result ([] until it answers)."""
        out = self.curl(self.prom_ns, "http://127.0.0.1:9090/api/v1/query?query="
                        + urllib.parse.quote(q))
        try:
            return list(json.loads(out.stdout)["data"]["result"])
        except (ValueError, KeyError):
            return []

    def wait(self, what: str, cond: Any, timeout: float = 10, step: float = 0.3) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = cond()
            if got:
                return got
            time.sleep(step)
        logs = {p.name: p.read_text()[-600:] for p in self.tmp.glob("*.log")}
        raise AssertionError(f"{what} did not happen in {timeout} s: {logs}")

    def close(self) -> None:
        for pid in self.holders.values():  # unshare --fork outlives SIGTERM; its child ends it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
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


def main() -> int:
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _host import host_line

    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--scrape", type=float, default=5.0, help="scrape interval, seconds")
    args = ap.parse_args()
    reason = why_not()
    if reason:
        print(f"netns_cluster: {reason}", file=sys.stderr)
        return 2
    print(host_line())
    s = args.scrape
    with tempfile.TemporaryDirectory(prefix="counterd-netns-") as tmp:
        Path(tmp).chmod(0o755)
        c = Cluster(Path(tmp))
        try:
            t0 = time.monotonic()
            c.build(args.hosts, s, grace_s=max(2 * s + 1, 2.0))
            c.wait("Prometheus answering", lambda: c.query("vector(1)"), timeout=60, step=0.1)
            t_ready = time.monotonic()
            c.wait("every target up", lambda: len(c.query('up{job="counterd"} == 1'))
                   == args.hosts, timeout=60, step=0.2)
            up_s, ready_s = time.monotonic() - t_ready, t_ready - t0
            idle = c.query('scrape_samples_scraped{job="counterd"}')
            if c.run_bsp() != [0] * args.hosts:
                raise RuntimeError("a BSP program failed")
            c.wait("the job on every node", lambda: c.query(
                'count(counterd_superstep_duration_seconds_count{batch_job="77"})'),
                timeout=4 * s + 10)
            time.sleep(2 * s)
            live = c.query('scrape_samples_scraped{job="counterd"}')
            res = c.query(f'quantile_over_time(0.99, scrape_duration_seconds{{job="counterd"}}'
                          f'[{max(60, 12 * s):g}s])')
            p99 = sorted(float(r["value"][1]) for r in res)
            time.sleep(max(2 * s + 1, 2.0) + 2 * s)  # grace period and two scrapes
            after = c.query('scrape_samples_scraped{job="counterd"}')
            own = c.curl(c.prom_ns, "http://127.0.0.1:9090/metrics").stdout.decode()
            failures = sum(float(line.rsplit(" ", 1)[1]) for line in own.splitlines()
                           if line.startswith("prometheus_rule_evaluation_failures_total"))
            t_kill = time.monotonic()
            os.kill(c.procs["counterd-n2"].pid, signal.SIGKILL)
            c.procs["counterd-n2"].wait(10)
            c.wait("CounterdDown firing", lambda: c.query(
                'ALERTS{alertname="CounterdDown",alertstate="firing"}'), timeout=60 + 4 * s + 30,
                step=0.5)
            fire_s = time.monotonic() - t_kill
            t_restart = time.monotonic()
            c.start_daemon(2)
            c.wait("CounterdDown resolved", lambda: not c.query(
                'ALERTS{alertname="CounterdDown"}'), timeout=4 * s + 30, step=0.5)
            resolve_s = time.monotonic() - t_restart
        finally:
            c.close()

    def per(res: list[dict[str, Any]]) -> str:
        vals = sorted(int(float(r["value"][1])) for r in res)
        return f"{min(vals)}-{max(vals)}" if vals else "none"

    print(f"{args.hosts} namespace hosts, scrape and evaluation every {s:g} s")
    print(f"every target up {up_s:.1f} s after Prometheus answered (target: within "
          f"{2 * s:g} s of being listed; Prometheus answered {ready_s:.1f} s after the "
          f"namespaces, daemons and it were started)")
    print(f"scrape duration p99 over the last minute, per target: {min(p99) * 1e3:.1f}-"
          f"{max(p99) * 1e3:.1f} ms (target <= 50 ms)")
    print(f"prometheus_rule_evaluation_failures_total: {failures:g} (target 0)")
    print(f"samples per node: idle {per(idle)}, job live {per(live)}, after the grace "
          f"period {per(after)}")
    print(f"CounterdDown fired {fire_s:.1f} s after kill -9 (for: 1m plus two scrapes: "
          f"<= {60 + 2 * s:g} s), resolved {resolve_s:.1f} s after the restart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
