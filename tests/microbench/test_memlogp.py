"""microbench memlogp: the quick plan runs through the pinned runner on this host in seconds,
its kernel calls are the copy, pack and unpack the model assumes, and the results document
round-trips into the predictor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from counterd.machine.description import Machine
from microbench import memlogp as mm
from microbench.cli import main as microbench_main
from predictor.families import memlogp as ml
from tests.machine_files import planning_machine, running_machine

MiB = 1 << 20


def test_calls_are_copy_pack_and_unpack() -> None:
    n = 4096 // 8
    copy = mm.copy_call(mm.PlanPoint("copy", 4096, 8), reps=1)
    assert (copy.rows, copy.cols) == (1, n)  # contiguous: one row
    pack = mm.copy_call(mm.PlanPoint("pack", 4096, 256), reps=1)
    assert (pack.rows, pack.cols, pack.src_pitch, pack.dst_pitch) == (n, 1, 32, 1)
    unpack = mm.copy_call(mm.PlanPoint("unpack", 4096, 256), reps=1)
    assert (unpack.rows, unpack.cols, unpack.src_pitch, unpack.dst_pitch) == (n, 1, 1, 32)
    # the strided source and the destination do not overlap, and avoid 4 KiB aliasing
    assert pack.dst_offset >= pack.src_offset + (n - 1) * 256 + 8
    assert pack.dst_offset % 4096 != 0
    # stream: load of each source word, then the store of its destination
    stream = pack.stream()
    assert stream.addresses[:4].tolist() == [0, pack.dst_offset, 256, pack.dst_offset + 8]


# The largest contiguous copy of the default plan on each machine file: 64 MiB is twice a
# 32 MB L3; a 48 MB L3 raises it to 128 MiB; twice an L3 of 300 MB (1 GiB) is beyond the span
# cap, which keeps it at 256 MiB, still a copy of 512 MiB through the caches.
LARGEST_COPY = {"amd-2cpu-32m": 64 * MiB, "intel-2cpu-300m": 256 * MiB,
                "xeon-2s-64cpu": 128 * MiB}


def test_plans_stay_within_the_span_cap(described_machine: Machine) -> None:
    m = planning_machine(described_machine)
    plan = mm.default_plan(m)
    assert all((p.s_bytes // 8 - 1) * p.d_bytes + 8 <= mm.MAX_SPAN_BYTES for p in plan.points)
    sizes = {p.s_bytes for p in plan.points if p.op == "copy" and p.d_bytes == 8}
    assert min(sizes) * 2 <= m.geometry.levels[0].size_bytes  # alpha: below L1
    assert max(sizes) == LARGEST_COPY[described_machine.hostname]
    # beyond the last level: the copy's source and destination do not fit in it
    assert max(sizes) * 2 > m.geometry.levels[-1].size_bytes
    assert {p.op for p in plan.points if p.s_bytes == max(sizes)} == set(ml.OPS)
    assert any(p.op.startswith("p2p.") for p in plan.points)  # every file has two CPUs or more


def test_quick_plan_runs_and_round_trips(tmp_path: Path, described_machine: Machine) -> None:
    """Measured on this host, modelled on each machine file's hierarchy."""
    m = running_machine(described_machine)
    out = tmp_path / "memlogp.json"
    doc = mm.measure(m, mm.quick_plan(m), out)
    assert doc["complete"] and doc["format"] == ml.FORMAT
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(doc))
    got = ml.load_measurements(out)
    assert len(got.points) == len(doc["points"])
    assert [(lv.size_bytes, lv.ways, lv.line_bytes) for lv in got.hierarchy.levels] == [
        (lv.size_bytes, lv.ways, lv.line_bytes) for lv in described_machine.levels]
    for p, raw in zip(got.points, doc["points"], strict=True):
        assert p.per_byte_s == raw["per_byte_s"] > 0
        assert raw["samples_ns"] and min(raw["samples_ns"]) > 0
    # strided transfers cost more per byte than the contiguous copy in L1
    alpha = ml.alpha_of(got)
    assert all(p.per_byte_s > alpha for p in got.points if p.d_bytes > 8)
    model = ml.fit(got)
    assert set(model.curves) == set(ml.OPS)
    with pytest.raises(Exception, match="exists"):
        mm.measure(m, mm.quick_plan(m), out)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "q.json"
    assert microbench_main(["memlogp", "--quick", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["points"] > 0
    assert microbench_main(["memlogp", "--quick", "--out", str(out)]) == 2  # exists
    assert "--force" in capsys.readouterr().err
