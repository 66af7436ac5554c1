"""The markers' own cost, reported: each process calibrates a begin + end pair at its first
superstep, every record carries it (through memory, the spool's frames and lines, and the
record's JSON), and the report says which supersteps it is more than 1% of."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from counterd.data.records import SuperstepRecord, incomplete_record
from counterd.markers.recorder import Recorder
from counterd.markers.sinks import MemorySink
from counterd.report import model
from counterd.report.html import render_html
from counterd.report.text import render_csv, render_text, to_json
from counterd.wire import binary_frames, protocol, spool_reader


def test_a_record_carries_its_marker_cost_and_records_without_one_are_unchanged() -> None:
    r = SuperstepRecord("r", 0, "s", 0, 1, 0, 10, 20, marker_ns=1500)
    assert SuperstepRecord.from_json(r.to_json()).marker_ns == 1500
    plain = SuperstepRecord("r", 0, "s", 0, 1, 0, 10, 20)
    assert "marker_ns" not in plain.to_json()  # the JSON (and the wire) of before
    assert SuperstepRecord.from_json(plain.to_json()).marker_ns is None
    with pytest.raises(ValueError):
        SuperstepRecord("r", 0, "s", 0, 1, 0, 10, 20, marker_ns=-1)
    line = {"run_id": "r", "index": 3, "name": "s", "rank": 0, "pid": 1, "cpu": 0,
            "begin_ns": 5, "marker_ns": 900}
    assert incomplete_record(line).marker_ns == 900


def test_the_context_frame_carries_it_to_every_record_it_completes() -> None:
    ctx = protocol.Context(1, 1, "r", 7, "h", "perf", (), 1234)
    back = protocol.Context.decode(json.loads(protocol.encode(
        protocol.FrameType.CONTEXT, ctx.payload())[6:]))
    assert back.marker_ns == 1234
    op = binary_frames.Open(2, 1, 0, 100, 0, 1, "s")
    close = binary_frames.Close(3, 1, 0, 100, 200)
    assert protocol.record_of(back, op, close).marker_ns == 1234
    assert protocol.begin_line(back, op)["marker_ns"] == 1234
    with pytest.raises(protocol.ProtocolError):
        protocol.Context.decode({**ctx.payload(), "marker_ns": -5})


@pytest.mark.parametrize("where", ["memory", "spool"])
def test_each_process_calibrates_a_pair_and_its_records_carry_it(tmp_path: Path,
                                                                 where: str) -> None:
    rec = Recorder(run_id="m", backend="none", socket="off",
                   spool=tmp_path if where == "spool" else None)
    if where == "memory":
        rec.sink = MemorySink()
    for _ in range(3):
        with rec.begin("s", {}):
            pass
    got = rec.sink.records if where == "memory" else list(spool_reader.collect(tmp_path))
    costs = {r.marker_ns for r in got}
    assert len(got) == 3 and len(costs) == 1
    (cost,) = costs
    assert cost is not None and 100 < cost < 10_000_000  # 0.1 us .. 10 ms: measured, plausible
    assert [p.suffix for p in tmp_path.iterdir()] == ([".frames"] if where == "spool" else [])


def test_no_cost_is_claimed_where_it_was_not_measured(tmp_path: Path) -> None:
    rec = Recorder(run_id="m", backend="none", socket="off", calibrate=False)
    rec.sink = MemorySink()
    with rec.begin("s", {}):
        pass
    assert rec.sink.records[0].marker_ns is None


def _row(index: int, time_ns: int, marker_ns: int | None) -> list[SuperstepRecord]:
    return [SuperstepRecord("r", index, f"s{index}", rank, 1 + rank, rank, 1000, 1000 + time_ns,
                            marker_ns=marker_ns) for rank in (0, 1)]


def test_the_report_says_which_supersteps_the_markers_weigh_on() -> None:
    rep = model.build([*_row(0, 10_000_000, 5000), *_row(1, 100_000, 5000),
                       *_row(2, 200_000, 5000)])
    assert [r.marker_share for r in rep.rows] == [5000 / 10_000_000, 0.05, 0.025]
    note = rep.marker_note()
    assert "5.0 us" in note and "2 of 3 supersteps" in note and "up to 5%" in note
    assert "slow the run" in note
    assert note in render_text(rep)
    j = to_json(rep)
    assert j["supersteps"][1]["marker_s"] == pytest.approx(5e-6)
    assert j["supersteps"][1]["marker_share"] == pytest.approx(0.05)
    import csv
    import io

    rows = list(csv.DictReader(io.StringIO(render_csv(rep))))
    assert rows[1]["marker_s"] == repr(5e-6)
    calm = model.build(_row(0, 10_000_000, 5000))
    assert "under 1% of every superstep" in calm.marker_note()
    assert model.build(_row(0, 100, None)).marker_note() == ""
    # Each superstep's share, in the tables: "!" (orange in HTML) where it is over 1%.
    text = render_text(rep).splitlines()
    head = next(i for i, line in enumerate(text) if line.lstrip().startswith("#"))
    assert text[head].split()[-2:] == ["markers", "flags"]
    assert [line.split()[-2:] for line in text[head + 1:head + 4]] == [
        ["1.00", "0.1%"], ["5.0%", "!"], ["2.5%", "!"]]
    html = render_html(rep)
    assert '<th title="one begin + end pair' in html
    assert '<td class="flag">5.0%</td>' in html and '<td>0.1%</td>' in html
    # Records without a calibrated cost: no column (the report of before).
    bare = model.build(_row(0, 100, None))
    assert "markers" not in render_text(bare) and "share of time" not in render_html(bare)


def test_the_report_says_how_many_supersteps_were_sampled_and_suggests_it_where_not() -> None:
    heavy = model.build([*_row(0, 100_000, 5000), *_row(1, 100_000, 5000)])
    assert "--sample" in heavy.marker_note()  # the markers weigh: sampling is offered
    sampled = [SuperstepRecord("r", 1, "s1", rank, 1 + rank, 0, 1000, 101_000, marker_ns=5000,
                               flags=frozenset({"sampled"})) for rank in (0, 1)]
    rep = model.build([*_row(0, 100_000, 5000), *sampled])
    note = rep.marker_note()
    assert "the counters of 1 of 2 supersteps are sampled" in note and "--sample" not in note
    assert "over 1% of the time of 1 of 1 read supersteps" in note  # the sampled one: not read
    no_cost = [SuperstepRecord("r", 0, "s", 0, 1, 0, 1000, 2000, flags=frozenset({"sampled"}))]
    assert model.build(no_cost).marker_note().startswith("the counters of 1 of 1 supersteps")
