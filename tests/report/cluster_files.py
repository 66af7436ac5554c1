"""Records files of one run across nodes, made by the tests (tests/report/test_nodes.py,
tests/hostile/test_records_files.py): each node's CLOCK_MONOTONIC has its own origin, its clock
domain maps it to one realtime clock."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from counterd.data.clocks import Anchor, ClockDomain
from counterd.data.records import SuperstepRecord, write_jsonl

REAL0 = 1_800_000_000 * 10**9  # the run's realtime origin
MS = 1_000_000


def node_file(path: Path, host: str, ranks: Sequence[int], *, mono0: int,
              works: dict[int, int] | None = None, steps: int = 3, run_id: str = "job-1",
              boot: str = "boot-a", timens: str = "time:[1]", bound: int | None = None,
              source: str = "slurm", skew_ns: int = 0, read_ns: int = 1000,
              anchors: Sequence[Anchor] | None = None, domain: bool = True,
              drop: frozenset[tuple[int, int]] = frozenset()) -> Path:
    """One node's file: superstep i of every node begins at realtime REAL0 + i x 100 ms
    (+ ``skew_ns`` on this node), rank r works ``works[r]`` (default (r + 1) ms); the node's
    monotonic clock reads ``mono0`` at REAL0. ``drop``: (superstep, rank) pairs left out."""
    works = works or {r: (r + 1) * MS for r in ranks}
    recs = []
    for i in range(steps):
        begin = mono0 + i * 100 * MS + skew_ns
        recs += [SuperstepRecord(run_id, i, "step", r, 1000 + r % 1000, 0, begin,
                                 begin + works[r], host=host)
                 for r in ranks if (i, r) not in drop]
    if anchors is None:
        anchors = [Anchor(mono0 - MS, REAL0 - MS, read_ns),
                   Anchor(mono0 + steps * 100 * MS, REAL0 + steps * 100 * MS, read_ns)]
    head = [ClockDomain(run_id, host, boot, timens, tuple(anchors), bound, source).to_json()] \
        if domain else []
    write_jsonl(recs, path, header=head)
    return path
