"""A test cluster on one machine (issue 31 item 4), bench/netns_cluster.py's Cluster at small
scale: 3 hosts, each a network namespace with its own address on a bridge and its own
hostname (UTS namespace), one counterd per host bound to that address, a BSP program marked
on every host, and a real Prometheus in its own namespace that discovers the daemons through
`counterd cluster targets`'s file_sd JSON, scrapes them, evaluates contrib/prometheus's rules
and fires CounterdDown when one daemon is killed -9 (checked through Prometheus's HTTP API).
Every address lives inside the namespaces; the bridge is in a namespace of its own.

Skipped with the reason where namespaces cannot be made (not root, no ip(8), unshare, curl or
prometheus). Slow: about 10 s, scrape and evaluation every second and the alert's `for:`
shortened to 2 s (the shipped rule keeps 1m; the bench measures that one)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from counterd.daemon.store import open_readonly

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from netns_cluster import Cluster, why_not  # noqa: E402

HOSTS = 3
pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_not() is not None,
                                                   reason=str(why_not()))]



def test_prometheus_scrapes_a_namespace_cluster_and_fires_counterd_down(
        cluster: Cluster) -> None:
    c = cluster
    c.build(HOSTS, 1, alert_for="2s")
    assert c.run_bsp("77") == [0] * HOSTS  # on every host, in Slurm job 77
    for i in range(1, HOSTS + 1):  # each daemon saw its own host's name
        assert {r.host for r in open_readonly(c.tmp / f"n{i}" / "counterd.db").runs()} == \
            {f"node{i:03d}"}
    c.wait("every target up", lambda: len(c.query('up{job="counterd"} == 1')) == HOSTS)
    per_node = c.wait("the job's series from every node", lambda: c.query(
        'count(counterd_superstep_duration_seconds_count{batch_job="77",workload="bsp"})'))
    assert float(per_node[0]["value"][1]) == HOSTS
    assert c.wait("a job-level rule", lambda: c.query(
        'batch_job:counterd_last_superstep_work_seconds:max{batch_job="77"}'))
    assert not c.query('ALERTS{alertname="CounterdDown"}')
    # a peer on the network but not on metrics.allow (host n1 scraping n3): closed unanswered,
    # counted, and the count reaches Prometheus
    refused = c.curl(c.ns(1), f"http://{c.hosts[2]}:9464/metrics")
    assert refused.returncode == 52 and refused.stdout == b""  # curl: empty reply
    assert c.wait("the refusal counted", lambda: c.query(
        f'counterd_metrics_refused_total{{instance="{c.hosts[2]}",reason="not_allowed"}} == 1'))
    victim = c.procs["counterd-n2"]
    os.kill(victim.pid, signal.SIGKILL)  # the daemon itself (ip netns exec, unshare, sh exec)
    victim.wait(10)
    firing = c.wait("CounterdDown firing", lambda: c.query(
        'ALERTS{alertname="CounterdDown",alertstate="firing"}'))
    assert [a["metric"]["instance"] for a in firing] == [c.hosts[1]]
