"""The report across nodes from several records files (issue 32 item 4): exact work per
processor and node, node imbalance, missing ranks, and spans mapped through each node's clock
domain with their bound, said to be uncertain or unknown rather than printed confidently."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from counterd.commands import cli
from counterd.data.clocks import Anchor
from counterd.data.errors import BadInput
from counterd.report import nodes
from tests.report.cluster_files import MS, REAL0, node_file

S = 10**9


def two_nodes(tmp: Path, **kw: object) -> list[Path]:
    """node1 ranks 0-1 (work 1, 2 ms), node2 ranks 2-3 (work 6 ms), monotonic clocks 1,000 s
    apart; ``kw`` goes to node2's file."""
    a = node_file(tmp / "a.jsonl", "node1", [0, 1], mono0=5 * S)
    b = node_file(tmp / "b.jsonl", "node2", [2, 3], mono0=1005 * S,
                  works={2: 6 * MS, 3: 6 * MS}, **kw)  # type: ignore[arg-type]
    return [a, b]


def test_one_kernel_two_monotonic_clocks_give_the_realtime_span(tmp_path: Path) -> None:
    rep = nodes.build(two_nodes(tmp_path, timens="time:[2]"))
    (run,) = rep.runs
    assert run.run_id == "job-1" and run.nodes == ("node1", "node2") and run.job_wide
    assert run.ranks == (0, 1, 2, 3) and run.records == 12
    for s in run.steps:
        # both nodes began at the same realtime: the span is the slowest work, 6 ms; a naive
        # merge of the monotonic times would give 1,000 s
        assert s.span_err_ns is not None and s.span_err_ns <= 2000
        assert abs(s.span_ns - 6 * MS) <= s.span_err_ns  # type: ignore[operator]
        assert not s.span_uncertain and s.span_note == ""
        assert s.slowest_work_ns == 6 * MS and s.slowest == ("node2", 2)
        assert [(n.node, n.slowest_work_ns) for n in s.nodes] == [("node1", 2 * MS),
                                                                   ("node2", 6 * MS)]
        assert s.node_imbalance == pytest.approx(6 / 4)  # 6 ms over the mean of 2 and 6
        assert s.missing == ()
    assert "one kernel" in run.clock


def test_a_skewed_node_widens_the_span_by_its_skew(tmp_path: Path) -> None:
    (run,) = nodes.build(two_nodes(tmp_path, skew_ns=3 * MS)).runs
    assert all(abs(s.span_ns - 9 * MS) <= s.span_err_ns for s in run.steps)  # type: ignore


def test_two_kernels_without_a_sync_bound_leave_the_span_unknown(tmp_path: Path) -> None:
    files = two_nodes(tmp_path, boot="boot-b")
    (run,) = nodes.build(files).runs
    assert all(s.span_err_ns is None and s.span_uncertain for s in run.steps)
    assert any("--clock-bound" in n and "node1" in n and "node2" in n for n in run.notes)
    text = nodes.render_text(nodes.build(files))
    assert "uncertain (~6.00 ms, bound unknown)" in text
    # the work stays exact
    assert all(s.slowest_work_ns == 6 * MS for s in run.steps)


def test_a_declared_bound_is_added_and_a_large_one_makes_the_span_uncertain(
        tmp_path: Path) -> None:
    files = two_nodes(tmp_path, boot="boot-b")
    (fine,) = nodes.build(files, clock_bound_ns=10_000).runs
    s = fine.steps[0]
    assert 2 * 10_000 <= s.span_err_ns <= 2 * 10_000 + 4000  # type: ignore[operator]
    assert abs(s.span_ns - 6 * MS) <= s.span_err_ns and not s.span_uncertain  # type: ignore
    (coarse,) = nodes.build(files, clock_bound_ns=1 * MS).runs
    s = coarse.steps[0]
    assert s.span_uncertain and "over 25%" in s.span_note
    assert nodes.span_text(s).startswith("uncertain (6.00 ms +- 2.00 ms")


def test_a_kernel_stated_bound_is_used(tmp_path: Path) -> None:
    a = node_file(tmp_path / "a.jsonl", "node1", [0], mono0=5 * S, bound=50_000)
    b = node_file(tmp_path / "b.jsonl", "node2", [1], mono0=9 * S, boot="boot-b",
                  bound=20_000)
    (run,) = nodes.build([a, b]).runs
    # each end and begin can be off by the bound of the node it came from plus its read
    assert all(50_000 + 20_000 <= s.span_err_ns <= 2 * 50_000 + 4000  # type: ignore
               for s in run.steps)


def test_a_clock_step_between_anchors_is_in_the_bound(tmp_path: Path) -> None:
    # node2's realtime was stepped by 5 ms during the run: its anchors disagree by 5 ms
    anchors = [Anchor(1005 * S - MS, REAL0 - MS, 1000),
               Anchor(1005 * S + 300 * MS, REAL0 + 300 * MS + 5 * MS, 1000)]
    (run,) = nodes.build(two_nodes(tmp_path, anchors=anchors)).runs
    s = run.steps[0]
    assert s.span_err_ns >= 2_500_000 and s.span_uncertain  # type: ignore[operator]
    true_span = 6 * MS
    assert abs(s.span_ns - true_span) <= s.span_err_ns  # type: ignore[operator]


def test_missing_ranks_are_named(tmp_path: Path) -> None:
    files = two_nodes(tmp_path, drop=frozenset({(1, 3)}))
    (run,) = nodes.build(files).runs
    assert [s.missing for s in run.steps] == [(), (3,), ()]
    text = nodes.render_text(nodes.build(files))
    assert "missing ranks: 3" in text
    # a rank no file has at all is missing from every superstep
    (run,) = nodes.build(files[:1] + [node_file(tmp_path / "c.jsonl", "node3", [3],
                                                mono0=7 * S)]).runs
    assert [s.missing for s in run.steps] == [(2,)] * 3


def test_node_local_run_ids_are_said(tmp_path: Path) -> None:
    a = node_file(tmp_path / "a.jsonl", "node1", [0], mono0=5 * S, run_id="abc",
                  source="node")
    b = node_file(tmp_path / "b.jsonl", "node2", [0], mono0=9 * S, run_id="def",
                  source="node")
    rep = nodes.build([a, b])
    assert [r.run_id for r in rep.runs] == ["abc", "def"]
    assert all(not r.job_wide and any("node-local" in n for n in r.notes) for r in rep.runs)
    assert "node-local" in nodes.render_text(rep)


def test_a_file_given_twice_is_refused_and_a_copy_counts_once(tmp_path: Path) -> None:
    a, b = two_nodes(tmp_path)
    with pytest.raises(BadInput, match="given twice"):
        nodes.build([a, b, a])
    copy = tmp_path / "copy.jsonl"
    shutil.copy(a, copy)
    (run,) = nodes.build([a, b, copy]).runs
    assert run.records == 12 and run.nodes == ("node1", "node2")
    assert any("6 records given twice" in n for n in run.notes)


def test_conflicting_records_are_counted_and_the_first_kept(tmp_path: Path) -> None:
    a, b = two_nodes(tmp_path)
    other = node_file(tmp_path / "other.jsonl", "node1", [0, 1], mono0=5 * S,
                      works={0: 9 * MS, 1: 2 * MS})
    (run,) = nodes.build([a, b, other]).runs
    assert any("3 records conflict" in n for n in run.notes)
    assert run.steps[0].nodes[0].slowest_work_ns == 2 * MS


def test_records_without_a_clock_domain_have_no_span(tmp_path: Path) -> None:
    a = node_file(tmp_path / "a.jsonl", "node1", [0], mono0=5 * S)
    b = node_file(tmp_path / "b.jsonl", "node2", [1], mono0=9 * S, domain=False)
    (run,) = nodes.build([a, b]).runs
    assert all(s.span_ns is None and "node2" in s.span_note for s in run.steps)
    assert any("no clock domain for node2" in n for n in run.notes)
    assert all(s.slowest_work_ns == 2 * MS for s in run.steps)


def test_the_cli_reports_and_lists_runs_across_nodes(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in two_nodes(tmp_path, drop=frozenset({(2, 2)}))]
    assert cli.main(["report", "--records", *files]) == 0
    text = capsys.readouterr().out
    assert "run job-1 (Slurm's" in text and "2 nodes (node1, node2)" in text
    assert "missing ranks: 2" in text
    assert cli.main(["report", "--records", *files, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "counterd-cross-node-report"
    steps = doc["runs"][0]["supersteps"]
    assert [s["missing_ranks"] for s in steps] == [[], [], [2]]
    assert steps[0]["slowest_work_s"] == pytest.approx(0.006)
    assert cli.main(["report", "--records", *files, "--format", "csv"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + 3 * 2
    assert cli.main(["runs", "--records", *files, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row == {"run_id": "job-1", "run_id_source": "slurm", "job_wide": True,
                   "nodes": ["node1", "node2"], "ranks": 4, "supersteps": 3, "records": 11,
                   "notes": []}


@pytest.mark.parametrize("argv,said", [
    (["--clock-bound", "soon"], "--clock-bound 'soon'"),
    (["--format", "html"], "no html format"),
])
def test_bad_options_are_one_line_and_exit_2(argv: list[str], said: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in two_nodes(tmp_path)]
    assert cli.main(["report", "--records", *files, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]


def test_a_clock_bound_needs_several_files(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    a = node_file(tmp_path / "a.jsonl", "node1", [0], mono0=5 * S)
    assert cli.main(["report", "--records", str(a), "--clock-bound", "1ms"]) == 2
    assert "across nodes" in capsys.readouterr().err
    # one file alone is the usual report, its clock domain line skipped
    assert cli.main(["report", "--records", str(a)]) == 0
    assert "3 supersteps" in capsys.readouterr().out


def test_files_of_one_host_are_one_node_and_two_boots_of_a_name_are_two(tmp_path: Path) -> None:
    ranks = [node_file(tmp_path / f"r{r}.jsonl", "node1", [r], mono0=5 * S, domain=False)
             for r in (0, 1)]
    (run,) = nodes.build(ranks).runs
    assert run.nodes == ("node1",) and run.steps[0].nodes[0].ranks == (0, 1)
    rebooted = node_file(tmp_path / "b.jsonl", "node1", [2], mono0=9 * S, boot="boot-b")
    (run,) = nodes.build([node_file(tmp_path / "a.jsonl", "node1", [0, 1], mono0=5 * S),
                          rebooted]).runs
    assert run.nodes == ("node1#1", "node1#2")


def test_one_gathered_file_of_several_hosts_is_reported_across_nodes_when_asked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_nodes(tmp_path)
    gathered = tmp_path / "all.jsonl"
    gathered.write_bytes(a.read_bytes() + b.read_bytes())
    assert cli.main(["report", "--records", str(gathered), "--across-nodes"]) == 0
    text = capsys.readouterr().out
    assert "2 nodes (node1, node2)" in text and "6.00 ms +- " in text
    assert cli.main(["report", "--across-nodes"]) == 2
    assert "--across-nodes reads records files" in capsys.readouterr().err
