"""microbench memlogp: the quick plan runs through the pinned runner on this host in seconds,
its kernel calls are the copy, pack and unpack the model assumes, and the results document
round-trips into the predictor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microbench import memlogp as mm
from microbench.cli import main as microbench_main
from microbench.patterns import host_machine
from predictor import memlogp as ml


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


# The three hosts' geometries (an AMD EPYC guest, an Intel guest whose sysfs reports its host's
# whole L3, a two-socket server's socket), not this host's.
GEOMETRIES = {"amd-32M": "L1=32K/8/64,L2=512K/8/64,L3=32M/16/64",
              "intel-300M": "L1=48K/12/64,L2=2M/16/64,L3=300M/20/64",
              "server-2s": "L1=32K/8/64,L2=1M/16/64,L3=128M/16/64"}


@pytest.mark.parametrize("spec", GEOMETRIES.values(), ids=GEOMETRIES.keys())
def test_plans_stay_within_the_span_cap(spec: str) -> None:
    from counterd.machine import Geometry

    m = host_machine(Geometry.from_spec(spec))
    plan = mm.default_plan(m)
    assert all((p.s_bytes // 8 - 1) * p.d_bytes + 8 <= mm.MAX_SPAN_BYTES for p in plan.points)
    sizes = {p.s_bytes for p in plan.points if p.op == "copy" and p.d_bytes == 8}
    llc = m.geometry.levels[-1].size_bytes
    assert min(sizes) * 2 <= m.geometry.levels[0].size_bytes  # alpha: below L1
    if 2 * llc <= mm.MAX_SPAN_BYTES:
        assert max(sizes) >= 2 * llc  # beyond the last level
    else:  # a last level the cap cannot double: as far as the cap goes
        assert max(sizes) == mm.MAX_SPAN_BYTES


def test_quick_plan_runs_and_round_trips(tmp_path: Path) -> None:
    m = host_machine()
    out = tmp_path / "memlogp.json"
    doc = mm.measure(m, mm.quick_plan(m), out)
    assert doc["complete"] and doc["format"] == ml.FORMAT
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(doc))
    got = ml.load_measurements(out)
    assert len(got.points) == len(doc["points"])
    assert got.hierarchy.levels[0].size_bytes == m.geometry.levels[0].size_bytes
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
