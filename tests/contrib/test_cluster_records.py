"""One MPI run across hosts whose monotonic clocks differ by 1,000 s, reported whole (issue 32
items 1, 2, 4, 5), bench/cluster_records.py's job at small scale: 3 hosts, each a network
namespace with its own hostname and a time namespace whose CLOCK_MONOTONIC is offset by 0,
1,000 and 2,000 s; MPICH's mpiexec starts 2 ranks per host through a launcher that enters the
host's namespaces instead of ssh, each rank under its own ``counterd record --out``.

The files hold one run id (hydra's, found by every rank on every host); the report across
nodes gives each superstep's span within its stated bound of the span on one clock (each
record's times less its host's namespace offset, which the test set and so knows exactly),
while a naive merge of the monotonic times is off by 2,000 s.

Skipped with the reason where namespaces cannot be made (not root, no ip, unshare or nsenter,
a kernel without time namespaces) or MPI is missing. About 3 s."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from counterd.commands import cli
from counterd.report import nodes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from cluster_records import OFFSET_S, offsets, run_job, single_clock_spans, why_not  # noqa: E402
from netns_cluster import Cluster  # noqa: E402

HOSTS, RANKS, STEPS = 3, 2, 5
pytestmark = [pytest.mark.slow, pytest.mark.skipif(why_not() is not None,
                                                   reason=str(why_not()))]



def test_an_mpi_run_over_hosts_of_different_clocks_is_one_run_with_honest_spans(
        cluster: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    files = run_job(cluster, HOSTS, RANKS, STEPS, cluster.tmp / "out")
    assert len(files) == HOSTS * RANKS
    rep = nodes.build(files)
    (run,) = rep.runs  # one run id on every host
    assert run.source == "hydra" and run.run_id.startswith("hydra-")
    assert run.nodes == ("node001", "node002", "node003")
    assert run.ranks == tuple(range(HOSTS * RANKS)) and run.records == HOSTS * RANKS * STEPS
    assert "one kernel" in run.clock and not run.notes
    truth, naive = single_clock_spans(files, offsets(HOSTS))
    assert len(run.steps) == STEPS
    for s in run.steps:
        assert s.missing == () and [n.ranks for n in s.nodes] == [(0, 1), (2, 3), (4, 5)]
        assert s.span_ns is not None and s.span_err_ns is not None
        assert abs(s.span_ns - truth[s.index]) <= s.span_err_ns  # within the stated bound
        assert s.span_err_ns < 1_000_000 and not s.span_uncertain
        assert s.slowest_work_ns is not None and s.slowest_work_ns <= truth[s.index]
        assert naive[s.index] >= (HOSTS - 1) * OFFSET_S * 10**9 - 10**9  # the naive merge
    assert cli.main(["report", "--records", *map(str, files)]) == 0
    text = capsys.readouterr().out
    assert f"run {run.run_id} (MPICH hydra" in text and "3 nodes" in text
