"""Records files of other nodes are untrusted input (issue 32): ``counterd report --records
a.jsonl b.jsonl ...`` and ``counterd runs --records`` against garbage files, conflicting run
ids, forged clock anchors and huge files. Each bad input is one line on stderr and exit code 2,
or a report that says what it cannot vouch for; never a confident number from a forged clock,
never memory that grows with a repeated line."""

from __future__ import annotations

import json
import os
import signal
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from counterd.commands import cli
from counterd.data.clocks import MAX_ANCHORS, Anchor, ClockDomain
from counterd.data.errors import BadInput
from counterd.data.records import MAX_DOMAINS_PER_FILE, SuperstepRecord
from counterd.report import nodes
from tests.report.cluster_files import MS, REAL0, node_file

S = 10**9


@pytest.fixture(autouse=True)
def alarm() -> Iterator[None]:
    """A read that blocks (a FIFO) fails the test instead of hanging it."""
    def hung(signum: int, frame: object) -> None:
        raise AssertionError("the report blocked")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def good(tmp: Path) -> Path:
    return node_file(tmp / "good.jsonl", "node1", [0, 1], mono0=5 * S)


def exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def domain_line(**change: object) -> bytes:
    d = {**ClockDomain("job-1", "node2", "boot-a", "time:[2]", (Anchor(1, REAL0, 10),),
                       None, "slurm").to_json(), **change}
    return json.dumps(d).encode() + b"\n"


@pytest.mark.parametrize("content,said", [
    (b"\x00\x01\x02garbage\xff\n", "not a JSON record"),
    (b'{"format": 1, "run_id": "x"}\n', "malformed superstep record"),
    (b'{"begin_ns": NaN}\n', "not a JSON record"),
    (b"[1, 2]\n", "is a JSON object"),
    (b'{"format": "counterd-clock-domain", "version": 1}\n', "run_id is not a string"),
    (domain_line(anchors="[[1, 2, 3]]"), "anchors are not a list"),
    (domain_line(version=99), "clock domain version 99"),
])
def test_garbage_is_one_line_and_exit_2(content: bytes, said: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    for command in ("report", "runs"):
        err = exit_2([command, "--records", str(good(tmp_path)), str(bad)], capsys)
        assert said in err and "bad.jsonl" in err


@pytest.mark.parametrize("make", ["fifo", "directory", "dev_zero", "missing"])
def test_what_is_not_a_regular_file_is_refused_without_reading_it(
        make: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.jsonl"
    if make == "fifo":
        os.mkfifo(path)  # opening it to read would block: it is not opened
    elif make == "directory":
        path.mkdir()
    elif make == "dev_zero":
        path = Path("/dev/zero")
    err = exit_2(["report", "--records", str(good(tmp_path)), str(path)], capsys)
    assert str(path) in err


def test_two_clock_domains_for_one_host_and_run_in_one_file_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = node_file(tmp_path / "b.jsonl", "node2", [2], mono0=9 * S)
    f.write_bytes(domain_line(boot_id="boot-z") + f.read_bytes())
    err = exit_2(["report", "--records", str(good(tmp_path)), str(f)], capsys)
    assert "two clock domains for run 'job-1' on host 'node2'" in err


def test_conflicting_run_ids_stay_apart_and_a_stray_domain_anchors_nothing(
        tmp_path: Path) -> None:
    a = good(tmp_path)
    # node2's records say run job-2, its domain says job-1: the domain is not taken for them
    b = node_file(tmp_path / "b.jsonl", "node2", [2], mono0=9 * S, run_id="job-2")
    b.write_bytes(domain_line() + b"".join(
        line + b"\n" for line in b.read_bytes().splitlines() if b'"format": 1' in line))
    rep = nodes.build([a, b])
    assert [r.run_id for r in rep.runs] == ["job-1", "job-2"]
    assert any("b.jsonl: 1 clock domain(s) name a run or host without records" in n
               for n in rep.notes)
    job2 = rep.runs[1]
    assert all(s.span_ns is None for s in job2.steps)  # no domain of its own: no span
    assert job2.source == "unknown"


def test_a_forged_domain_in_another_file_does_not_move_a_nodes_clock(tmp_path: Path) -> None:
    a, b = good(tmp_path), node_file(tmp_path / "b.jsonl", "node2", [2], mono0=9 * S)
    honest = nodes.build([a, b]).runs[0]
    forged = tmp_path / "forged.jsonl"  # claims node2's clock is 500 s elsewhere
    forged.write_bytes(domain_line(anchors=[[9 * S, REAL0 + 500 * S, 1]]))
    (run,) = nodes.build([a, b, forged]).runs
    assert [s.span_ns for s in run.steps] == [s.span_ns for s in honest.steps]


def test_forged_anchors_that_disagree_make_the_span_uncertain_not_wrong(tmp_path: Path) -> None:
    a = good(tmp_path)
    # node2's realtime "jumps back" an hour between its anchors, each read claimed exact
    forged = [Anchor(9 * S - MS, REAL0 - MS, 0), Anchor(9 * S + 400 * MS, REAL0 - 3600 * S, 0)]
    b = node_file(tmp_path / "b.jsonl", "node2", [2], mono0=9 * S, anchors=forged)
    (run,) = nodes.build([a, b]).runs
    for s in run.steps:
        assert s.span_uncertain and s.span_err_ns >= 1800 * S  # type: ignore[operator]
        assert s.slowest_work_ns == 3 * MS  # each processor's own work is still exact
    assert "uncertain" in nodes.render_text(nodes.build([a, b]))


def test_anchors_out_of_order_or_too_many_are_refused(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    for anchors, said in (([[5, 1, 1], [4, 1, 1]], "increasing"),
                          ([[i, i, 1] for i in range(MAX_ANCHORS + 1)], "anchors are not")):
        bad = tmp_path / "b.jsonl"
        bad.write_bytes(domain_line(anchors=anchors))
        assert said in exit_2(["report", "--records", str(good(tmp_path)), str(bad)], capsys)


def test_more_domain_lines_than_a_file_holds_are_refused(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    bad = tmp_path / "b.jsonl"
    bad.write_bytes(domain_line() * (MAX_DOMAINS_PER_FILE + 1))
    err = exit_2(["report", "--records", str(good(tmp_path)), str(bad)], capsys)
    assert f"more than {MAX_DOMAINS_PER_FILE} clock-domain lines" in err


def test_a_huge_line_is_refused_after_16_mib(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "b.jsonl"
    with bad.open("wb") as f:  # 1 GiB of a sparse line: read no further than the limit
        f.truncate(1 << 30)
    err = exit_2(["report", "--records", str(good(tmp_path)), str(bad)], capsys)
    assert "line longer than" in err


def test_a_huge_file_of_one_repeated_record_is_held_once(tmp_path: Path) -> None:
    rec = SuperstepRecord("job-1", 0, "s", 1, 7, 0, 9 * S, 9 * S + MS, host="node2")
    line = json.dumps(rec.to_json()).encode() + b"\n"
    big = tmp_path / "big.jsonl"
    big.write_bytes(domain_line(anchors=[[8 * S, REAL0, 10], [10 * S, REAL0 + 2 * S, 10]])
                    + line * 5_000)  # 1.7 MB
    tracemalloc.start()
    try:
        (run,) = nodes.build([good(tmp_path), big]).runs
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # a few supersteps' aggregates, not 5,000 records (each over 1 KB as a SuperstepRecord)
    assert peak < 2 << 20, peak
    assert run.records == 6 + 1 and any("4999 records given twice" in n for n in run.notes)


def test_sparse_huge_rank_numbers_do_not_make_billions_missing(tmp_path: Path) -> None:
    a = node_file(tmp_path / "a.jsonl", "node1", [0], mono0=5 * S)
    b = node_file(tmp_path / "b.jsonl", "node2", [2**31 - 1], mono0=9 * S)
    (run,) = nodes.build([a, b]).runs
    assert all(s.missing == () and s.missing_count == 0 for s in run.steps)
    # dense numbering with gaps: missing ranks named, at most 64 listed, all counted
    c = node_file(tmp_path / "c.jsonl", "node3", list(range(150, 160)), mono0=7 * S)
    (run,) = nodes.build([a, c]).runs
    s = run.steps[0]
    assert s.missing_count == 149 and s.missing == tuple(range(1, 65))
    assert "missing ranks: 1-64 and 85 more" in nodes.render_text(nodes.build([a, c]))


def test_too_many_files_are_refused_before_any_is_read(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="at most 4096"):
        nodes.build([tmp_path / f"{i}.jsonl" for i in range(nodes.MAX_FILES + 1)])
