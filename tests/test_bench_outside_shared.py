"""``bench/outside_shared.py``: which supersteps' runs shared a CPU, read from a set's records
(written here: two ranks, one superstep shared in some runs, another never)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import outside_shared
from counterd.data.records import SuperstepRecord, write_jsonl


def _run(path: Path, work_ns: int, shared: bool) -> None:
    """Superstep 0 "fill": ranks 0 and 1 on CPU 0 when ``shared`` (else CPUs 0 and 1), each
    working ``work_ns``; superstep 1 "sum" on CPUs 0 and 1, 1 ms each."""
    recs = [SuperstepRecord(run_id=path.stem, index=0, name="fill", rank=r, pid=10 + r,
                            cpu=0 if shared else r, begin_ns=1000, end_ns=1000 + work_ns)
            for r in (0, 1)]
    recs += [SuperstepRecord(run_id=path.stem, index=1, name="sum", rank=r, pid=10 + r, cpu=r,
                             begin_ns=10**8, end_ns=10**8 + 10**6) for r in (0, 1)]
    write_jsonl(recs, path)


def test_the_table_counts_shared_runs_and_their_cost(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    camp = tmp_path / "set" / "toy_spmd" / "c1"
    camp.mkdir(parents=True)
    for n in (100, 200):  # at each size: run 0 shared (3 ms), runs 1 and 2 not (1 ms)
        for k in range(3):
            _run(camp / f"timed-{n}-{k}.jsonl", 3_000_000 if k == 0 else 1_000_000, k == 0)
    for k in range(2):  # both checking runs shared
        _run(camp / f"check-{k}.jsonl", 8_000_000, True)
    results = tmp_path / "set.json"
    results.write_text(json.dumps({"results": [
        {"program": "toy_spmd", "label": "4x", "steps": [{"name": "0:fill", "e": 1.8},
                                                         {"name": "1:sum", "e": 1.6}]},
        {"program": "toy_spmd", "label": "16x", "steps": []}]}))
    assert outside_shared.main([f"{tmp_path / 'set'}:{results}"]) == 0
    out = capsys.readouterr().out
    assert "| toy_spmd | 0:fill | 2 of 6 | 2 of 2 | 3.00x (2 sizes) | 1 of 1 |" in out
    assert "| toy_spmd | 1:sum | 0 of 6 | 0 of 2 | - | 1 of 1 |" in out
    assert "2 of 2 supersteps forecast more than 1.5x off at 4x; in 1 of them" in out


def test_a_set_that_is_not_a_directory_and_a_file_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert outside_shared.main([f"{tmp_path}/none:{tmp_path}/none.json"]) == 2
    assert "is not WORK:JSON" in capsys.readouterr().err
