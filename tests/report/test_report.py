"""Per-superstep reports: numbers against hand-computed answers, every format, the CLI."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from counterd import prediction, report
from counterd.backends.base import CounterValue
from counterd.commands import cli
from counterd.daemon.store import store_records
from counterd.data.events import Source
from counterd.data.records import SuperstepRecord, write_jsonl
from counterd.prediction import Prediction

# Two processors, three supersteps. Superstep 1: rank 0 has 3x rank 1's misses and runs
# 1.0 ms from t=1000 ns to 1_001_000; rank 1 runs 0.5 ms from 2_000 to 502_000.
MISSES = {(0, 0): 100.0, (0, 1): 100.0, (1, 0): 300.0, (1, 1): 100.0, (2, 0): 50.0,
          (2, 1): 50.0}


def records() -> list[SuperstepRecord]:
    out = []
    for index in range(3):
        for rank in range(2):
            begin = 1_000 + rank * 1_000 + index * 10_000_000
            dur = 1_000_000 if rank == 0 else 500_000
            out.append(SuperstepRecord(
                run_id="rep", index=index, name=["load", "exchange", "reduce"][index],
                rank=rank, pid=100 + rank, cpu=rank, begin_ns=begin, end_ns=begin + dur,
                counters={"l1d_misses": CounterValue(MISSES[(index, rank)], Source.SIMULATED)},
                backend="sim", host="h"))
    return out


def predict(recs: Sequence[SuperstepRecord]) -> Prediction:
    misses = [r.counters["l1d_misses"].value for r in recs]
    # F1 = busiest processor's misses x 2 us, F2 = all misses x 0.9 us, F3 = 0.15 ms
    terms = {"F1": max(misses) * 2e-6, "F2": sum(misses) * 0.9e-6, "F3": 1.5e-4}
    return Prediction(terms, max(terms.values()), {"QSM": (1e-4, 2e-3)})


def test_numbers_match_hand_computed_answers() -> None:
    rep = report.build(records(), predict=predict)
    r = rep.rows[1]
    assert r.time_ns == 1_001_000 - 1_000  # max end - min begin
    c = r.counters["l1d_misses"]
    assert (c.max, c.sum) == (300.0, 400.0)
    assert c.imbalance == pytest.approx(300 / 200)
    assert r.time_imbalance == pytest.approx(1_000_000 / 750_000)
    assert r.slowest_rank == 0
    assert r.prediction is not None and r.dominating == "F1"  # 600 us > 360 us > 150 us
    assert r.error_ratio == pytest.approx(1.0e-3 / 0.6e-3)
    assert rep.rows[2].dominating == "F3"  # 150 us > F1 100 us > F2 90 us
    avg, mx = rep.error_summary()  # type: ignore[misc]
    assert mx == pytest.approx(max(row.error_ratio for row in rep.rows))  # type: ignore[type-var]


def test_every_format(tmp_path: Path) -> None:
    rep = report.build(records(), predict=predict, prediction_note="fake profile")
    text = report.render(rep, "text")
    assert "exchange" in text and "F1" in text and "error ratio" in text
    data = json.loads(report.render(rep, "json"))
    assert data["supersteps"][1]["counters"]["l1d_misses"]["max"] == 300.0
    assert data["supersteps"][1]["prediction"]["dominating"] == "F1"
    assert data["supersteps"][1]["prediction"]["bounds_s"]["QSM"] == [1e-4, 2e-3]
    rows = list(csv.DictReader(io.StringIO(report.render(rep, "csv"))))
    assert [r["name"] for r in rows] == ["load", "exchange", "reduce"]
    assert float(rows[1]["l1d_misses_sum"]) == 400.0 and rows[1]["dominating"] == "F1"
    assert float(rows[1]["QSM_max_s"]) == 2e-3
    page = report.render(rep, "html")
    assert page.count("<svg") == 3 and "<script" not in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page
    assert "F1 hierarchy" in page


def test_one_unit_per_quantity() -> None:
    """Text: times with an SI prefix, grouped counts, no e-notation, no unit in a header that
    its values do not carry; CSV and JSON: seconds and integer counts, the unit in the name."""
    recs = [dataclasses.replace(r, counters={
        **r.counters, "task_clock_ns": CounterValue(7.246e6, Source.MEASURED),
        "loads": CounterValue(2e6, Source.MEASURED)}) for r in records()]
    rep = report.build(recs, predict=predict, prediction_note="fake profile")
    text = report.render(rep, "text")
    assert not re.search(r"\d[eE][+-]?\d", text)
    assert "_ms" not in text and "_ns" not in text.replace("task_clock_ns", "")
    head = text.splitlines()[4].split()
    assert head[:13] == ["#", "superstep", "p", "work", "span", "skew", "F", "E", "dom", "F1",
                         "F2", "F3", "t_imb"]
    assert "1.00 ms" in text and "600 us" in text  # superstep 1: T 1.0 ms, F = F1 = 600 us
    assert "7.25 ms" in text and "14.5 ms" in text  # task clock max and sum
    assert "2,000,000" in text and "4,000,000" in text and "300" in text  # counts
    rows = list(csv.DictReader(io.StringIO(report.render(rep, "csv"))))
    cols = list(rows[0])
    assert [c for c in cols if c.endswith("_ns") or c.endswith("_ms")] == []
    assert {"slowest_work_s", "span_s", "skew_s", "F1_s", "F_s", "task_clock_s_max",
            "task_clock_s_sum", "loads_max"} <= set(cols)
    assert float(rows[1]["span_s"]) == pytest.approx(1e-3)
    assert float(rows[1]["slowest_work_s"]) == pytest.approx(1e-3)
    assert float(rows[1]["skew_s"]) == pytest.approx(1e-6)
    assert float(rows[1]["task_clock_s_max"]) == pytest.approx(7.246e-3)
    assert rows[1]["loads_sum"] == "4000000" and rows[1]["l1d_misses_max"] == "300"
    step = json.loads(report.render(rep, "json"))["supersteps"][1]
    assert step["span_s"] == pytest.approx(1e-3) and step["work_s"]["1"] == 5e-4
    assert step["slowest_work_s"] == pytest.approx(1e-3) and step["skew_s"] == 1e-6
    assert step["counters"]["task_clock_s"]["sum"] == pytest.approx(2 * 7.246e-3)
    assert step["counters"]["loads"]["max"] == 2_000_000
    assert not any(k.endswith("_ns") for k in (*step, *step["counters"]))


def test_without_profile_the_report_says_why() -> None:
    fn, why = prediction.load(None)
    assert fn is None and "no machine profile" in why
    rep = report.build(records(), predict=fn, prediction_note=why)
    assert all(r.prediction is None and r.error_ratio is None for r in rep.rows)
    assert "no machine profile" in report.render(rep, "text")
    assert "No prediction: no machine profile configured" in report.render(rep, "html")


def test_html_reads_at_a_glance() -> None:
    """Why a prediction is missing comes from the model, the most frequent bottleneck counts
    only real ones, counters carry units without e-notation, simulation is said at the top,
    and a superstep too short to matter does not take the heat map's colour scale."""
    def some(recs: Sequence[SuperstepRecord]) -> Prediction:
        if recs[0].index == 0:
            raise prediction.NoPrediction("the superstep has no memory-hierarchy counters",
                                          "no_memory_counters")
        if recs[0].index == 1:
            return Prediction({"F1": 0.0, "F2": 0.0, "F3": 0.0}, 0.0)
        return predict(recs)

    loads = {"loads": CounterValue(7_246_000.0, Source.SIMULATED)}
    recs = [replace(r, counters={**r.counters, **loads}) for r in records()]
    recs += [replace(r, index=3, name="tiny", begin_ns=40_000_000,
                     end_ns=40_000_000 + 100 * (1 + r.rank)) for r in recs[4:]]
    rep = report.build(recs, predict=some, prediction_note="fake profile")
    assert rep.missing_predictions() == {"the superstep has no memory-hierarchy counters": [0]}
    assert rep.bottlenecks() == {"F3": 2}  # superstep 1's terms are all 0
    assert rep.rows[1].dominating is None and rep.simulated
    assert [rep.is_short(r) for r in rep.rows] == [False, False, False, True]
    page = report.render(rep, "html")
    assert "Superstep 0 (load): the superstep has no memory-hierarchy counters" in page
    assert "configure a machine profile" not in page
    assert "F3 bank</b><span>most frequent bottleneck (2 of 4 supersteps)" in page
    assert "7,246,000" in page and "e+0" not in page
    assert "load instructions retired\">loads<small>instructions</small></th>" in page
    assert 'class="banner"><b>Simulated memory counters.' in page and "<b>sim</b>" in page
    assert "Grey: supersteps whose work is shorter than" in page
    assert "tiny, p1: 0.000 ms, 1.33x the mean (too short a part of the run" in page


def test_incomplete_superstep_has_no_time() -> None:
    recs = records()
    recs[5] = SuperstepRecord(run_id="rep", index=2, name="reduce", rank=1, pid=101, cpu=1,
                              begin_ns=recs[5].begin_ns, end_ns=None,
                              flags=frozenset({"incomplete"}))
    rep = report.build(recs, predict=predict)
    assert rep.rows[2].time_ns is None and rep.rows[2].prediction is None
    assert "incomplete" in report.render(rep, "html")


def test_cli_report_from_records_and_store(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "run.jsonl"
    write_jsonl(records(), f)
    assert cli.main(["report", "--records", str(f), "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith(
        "index,name,processors,slowest_work_s,span_s,skew_s,")
    db = tmp_path / "s.db"
    store_records(db, records(), job="bsp")
    monkeypatch.setattr(prediction, "load", lambda profile, **kw: (predict, "fake"))
    out = tmp_path / "r.html"
    assert cli.main(["report", "rep", "--store", str(db), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert cli.main(["runs", "--store", str(db), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert runs[0]["run_id"] == "rep" and runs[0]["supersteps"] == 3


# Two processors, four supersteps, F = 2 ms for each (begin, duration) in ns per rank:
# 0 "setup": rank 1 begins 30 ms late (as a process that sets itself up inside its first
#   superstep would): span 32.2 ms, work 2.2 ms, skew 30 ms: flagged, E = 2.2 / 2.0
# 1 "steady": 50 us apart, under the floor: not flagged
# 2 "long": 150 us apart, over the floor but under a quarter of its 10 ms of work: not flagged
# 3 "short": 120 us apart for 200 us of work: over both, flagged
SKEWED = {0: ((0, 2_000_000), (30_000_000, 2_200_000)),
          1: ((40_000_000, 2_000_000), (40_050_000, 1_900_000)),
          2: ((50_000_000, 10_000_000), (50_150_000, 9_000_000)),
          3: ((70_000_000, 200_000), (70_120_000, 150_000))}


def skewed_records() -> list[SuperstepRecord]:
    return [SuperstepRecord(
        run_id="skew", index=index, name=["setup", "steady", "long", "short"][index], rank=rank,
        pid=100 + rank, cpu=rank, begin_ns=begin, end_ns=begin + dur,
        counters={"l1d_misses": CounterValue(100.0, Source.MEASURED)}, backend="perf",
        host="h") for index, ranks in SKEWED.items() for rank, (begin, dur) in enumerate(ranks)]


def two_ms(recs: Sequence[SuperstepRecord]) -> Prediction:
    return Prediction({"F1": 2e-3, "F2": 1e-3, "F3": 0.0}, 2e-3)


def test_start_skew_is_flagged_and_E_is_from_the_work() -> None:
    """A superstep whose processors began 30 ms apart for 2.2 ms of work: the span (32.2 ms),
    the work (2.2 ms) and the skew (30 ms) in every format, E from the work (1.1, not the
    span's 16.1), the flag start_skew on it and on no superstep whose skew is under the
    floor or under a quarter of its work, and the flag explained in the notes."""
    rep = report.build(skewed_records(), predict=two_ms, prediction_note="fake profile")
    setup = rep.rows[0]
    assert (setup.time_ns, setup.slowest_work_ns, setup.skew_ns) == (
        32_200_000, 2_200_000, 30_000_000)
    assert setup.error_ratio == pytest.approx(2.2 / 2.0)
    assert rep.rows[2].error_ratio == pytest.approx(10.0 / 2.0)  # the slowest: rank 0
    assert [r.skewed for r in rep.rows] == [True, False, False, True]
    assert [sorted(r.all_flags) for r in rep.rows] == [["start_skew"], [], [], ["start_skew"]]
    assert all(r.flags == frozenset() for r in rep.rows)  # the records' own flags: none
    assert rep.error_summary() == pytest.approx(
        (sum([1.1, 1.0, 5.0, 2e-3 / 0.2e-3]) / 4, 10.0))
    # Superstep 3's 0.2 ms of work is too short a part of the run (under 5 % of its 14.4 ms
    # of work): it sets the maximum, and the summary without it is given beside.
    assert rep.short_ns == pytest.approx(0.72e6) and rep.worst_error() is rep.rows[3]
    assert rep.error_summary(rated=True) == pytest.approx(((1.1 + 1.0 + 5.0) / 3, 5.0))
    assert rep.error_note().endswith(
        "maximum 10.00 (superstep 3 short); without the 1 superstep whose work is under "
        "720 us (too short a part of the run): average 2.37, maximum 5.00")

    text = report.render(rep, "text").splitlines()
    row = text[5].split()
    assert row[:12] == ["0", "setup", "2", "2.20", "ms", "32.2", "ms", "30.0", "ms", "2.00",
                        "ms", "1.10"]
    assert row[-1] == "start_skew" and text[6].split()[-1] != "start_skew"
    notes = "\n".join(text)
    assert "T the work, P = F" in notes and "slowest processor's own time" in notes
    assert rep.error_note() in notes
    assert "2 of 4 supersteps (0, 3) flagged start_skew: the processors began" in notes
    assert "not the superstep's cost" in notes

    data = json.loads(report.render(rep, "json"))
    assert data["format"] == 2
    assert data["error_ratio"]["maximum_at"] == 3
    assert data["error_ratio"]["rated"] == pytest.approx(
        {"average": 7.1 / 3, "maximum": 5.0, "short_s": 0.72e-3})
    step = data["supersteps"][0]
    assert (step["slowest_work_s"], step["span_s"], step["skew_s"]) == (2.2e-3, 32.2e-3, 0.03)
    assert step["error_ratio"] == pytest.approx(1.1) and step["flags"] == ["start_skew"]
    assert data["supersteps"][1]["flags"] == []
    assert "start_skew" in data["skew_note"] and "what F predicts" in data["times_note"]

    rows = list(csv.DictReader(io.StringIO(report.render(rep, "csv"))))
    assert [(float(r["slowest_work_s"]), float(r["span_s"]), float(r["skew_s"]), r["flags"])
            for r in rows[:2]] == [(2.2e-3, 32.2e-3, 0.03, "start_skew"),
                                   (2e-3, 2e-3, 5e-5, "")]
    assert float(rows[0]["error_ratio"]) == pytest.approx(1.1)

    page = report.render(rep, "html")
    cells = re.findall(r"<tr>(.*?)</tr>", page.split("<h2>Supersteps</h2>")[1])
    setup_row = re.findall(r"<td[^>]*>(.*?)</td>", cells[1])
    assert setup_row[:8] == ["0", "setup", "2", "2.20 ms", "32.2 ms", "30.0 ms", "2.00 ms",
                             "1.10"]
    assert '<td class="flag">30.0 ms</td>' in cells[1]
    assert '<span title="the processors began the superstep far apart' in cells[1]
    assert "start_skew" not in cells[2]
    assert "supersteps flagged start_skew" in page
    assert "<b>4.28 / 10.00</b><span>error ratio E avg / max (F vs work); max: 3 short" in page
    assert "<b>2.37 / 5.00</b><span>E avg / max without supersteps whose work is under " \
           "720 us" in page
    assert "2 of 4 supersteps (0, 3) flagged start_skew" in page
    # The plot: the work as the bar, the rest of the span paler on it; superstep 0's span is
    # over twice the others' top, so its bar is cut at the top and says how long it is.
    assert "rest of the span (start skew, waiting): cut at the top" in page
    assert ">span 32.2 ms</text>" in page
    assert "work 2.200 ms (slowest processor), span 32.200 ms, start skew 30.000 ms" in page


def test_one_processor_has_no_skew_and_span_is_work() -> None:
    rep = report.build([r for r in skewed_records() if r.rank == 0], predict=two_ms)
    assert all(r.skew_ns == 0 and r.time_ns == r.slowest_work_ns and not r.skewed
               for r in rep.rows)
    assert "flagged" not in report.render(rep, "text")
    assert "supersteps flagged" not in report.render(rep, "html")


def _on_cpus(index: int, spans: Sequence[tuple[int, int, int, frozenset[str]]]
             ) -> list[SuperstepRecord]:
    """Superstep ``index``: one record per (cpu, begin, end, flags), rank by position."""
    return [SuperstepRecord(run_id="cpus", index=index, name=f"s{index}", rank=rank,
                            pid=100 + rank, cpu=cpu, begin_ns=b, end_ns=e, flags=flags)
            for rank, (cpu, b, e, flags) in enumerate(spans)]


NONE: frozenset[str] = frozenset()


def test_processors_that_took_turns_on_one_cpu_are_flagged_shared_cpu() -> None:
    """Flagged: two of three processors on CPU 0 overlapping by half the shorter one's time;
    two that began on CPU 0, one moved away before its end (migrated). Not flagged: the same
    on two CPUs; on one CPU, overlapping by a tenth; one that never ended."""
    recs = (_on_cpus(0, [(0, 0, 4_000_000, NONE), (0, 2_000_000, 6_000_000, NONE),
                         (1, 0, 3_000_000, NONE)])
            + _on_cpus(1, [(0, 10_000_000, 14_000_000, NONE),
                           (1, 10_000_000, 14_000_000, NONE)])
            + _on_cpus(2, [(0, 20_000_000, 24_000_000, NONE),
                           (0, 23_600_000, 27_600_000, NONE)])
            + _on_cpus(3, [(0, 30_000_000, 34_000_000, frozenset({"migrated"})),
                           (0, 30_000_000, 34_000_000, NONE)])
            + [*_on_cpus(4, [(0, 40_000_000, 44_000_000, NONE)]),
               dataclasses.replace(_on_cpus(4, [(0, 0, 0, NONE)] * 2)[1], begin_ns=40_000_000,
                                   end_ns=None, flags=frozenset({"incomplete"}))])
    rep = report.build(recs)
    assert [r.shared_cpus for r in rep.rows] == [frozenset({0}), frozenset(), frozenset(),
                                                 frozenset({0}), frozenset()]
    assert ["shared_cpu" in r.all_flags for r in rep.rows] == [True, False, False, True, False]
    text = report.render(rep, "text")
    assert "shared_cpu" in text and "os.sched_setaffinity" in text  # the flag and its fix
    assert "2 of 5 supersteps (0, 3) flagged shared_cpu: two or more" in text
    data = json.loads(report.render(rep, "json"))
    assert "shared_cpu" in data["supersteps"][0]["flags"]
    assert data["flag_notes"]["shared_cpu"].startswith("2 of 5 supersteps (0, 3) flagged")
    html = report.render(rep, "html")
    assert "<b>2</b><span>supersteps flagged shared_cpu</span>" in html
    assert '<b class="flag">shared_cpu</b>: 2 of 5 supersteps (0, 3)' in html


@pytest.mark.parametrize("args, words", [
    (["report", "--records", "/nonexistent.jsonl"], "cannot read"),
    (["report", "nope", "--store", "STORE"], "no run 'nope'"),
    (["report", "--store", "/nonexistent/s.db"], "no store"),
    (["report", "--records", "X", "--store", "STORE"], "one or the other"),
    (["report", "--records", "X", "--profile", "/nonexistent.toml"], "does not exist"),
    (["report", "--format", "pdf"], "invalid choice"),
    (["runs", "--store", "/nonexistent/s.db"], "no store"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              args: list[str], words: str) -> None:
    db = tmp_path / "s.db"
    store_records(db, records())
    f = tmp_path / "x.jsonl"
    write_jsonl(records(), f)
    args = [str(db) if a == "STORE" else str(f) if a == "X" else a for a in args]
    with pytest.raises(SystemExit) if words == "invalid choice" else _nothing():
        assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


def test_runs_without_a_daemon_says_what_it_read_and_exits_1_with_nothing_to_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """Issue 34: with no daemon, ``counterd runs`` printed "no runs in the store" (status 0),
    having read /var/lib/counterd silently. It names the socket nobody answers at and the
    store it read; with no store either it says so and exits 1 (nothing to answer from, the
    arguments being fine); an empty store is an answer (0)."""
    for var in ("COUNTERD_SOCKET", "COUNTERD_STORE"):
        monkeypatch.delenv(var, raising=False)
    sock, db = tmp_path / "none.sock", tmp_path / "s.db"
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[socket]\npath = "{sock}"\n[store]\npath = "{db}"\n[metrics]\nlisten = ""\n')
    for command in (["runs"], ["report"]):
        assert cli.main([*command, "--config", str(cfg)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"no daemon answers at {sock}" in err, err
        assert f"there is no store at {db}" in err and "counterd run" in err
    store_records(db, [])
    assert cli.main(["runs", "--config", str(cfg)]) == 0
    out, err = capsys.readouterr()
    assert out == f"no runs in the store {db}\n"
    assert err == f"counterd runs: no daemon answers at {sock} (No such file or directory): " \
                  f"read its store {db} directly\n"
    store_records(db, records(), job="bsp")
    assert cli.main(["runs", "--config", str(cfg)]) == 0
    out, err = capsys.readouterr()
    assert "rep" in out and f"read its store {db} directly" in err


def test_flags_shown_are_those_that_change_what_to_believe(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    """Issue 34: every row of a Callgrind recording said
    counters_from_separate_run,cpu_features_hidden,unsupported_counters, which says nothing to
    a user. The text and HTML show a row's flags that change what to believe about it, each
    explained in a legend; the rest are counted below it, shown with --verbose, and always in
    the JSON and CSV."""
    from dataclasses import replace

    provenance = frozenset({"counters_from_separate_run", "cpu_features_hidden",
                            "unsupported_counters", "migrated"})
    recs = [replace(r, flags=provenance | ({"exception"} if r.index == 1 else set()))
            for r in records()]
    f = tmp_path / "run.jsonl"
    write_jsonl(recs, f)
    assert cli.main(["report", "--records", str(f)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line[:4].strip().isdigit()][:3]  # steps
    assert [line.rstrip().endswith("exception") for line in rows] == [False, True, False]
    assert not any(p in line for line in rows for p in provenance)
    assert "  exception: the superstep's body raised an exception" in text
    assert ("(--verbose shows and explains them): counters_from_separate_run (3), "
            "cpu_features_hidden (3), migrated (3), unsupported_counters (3)") in text
    assert cli.main(["report", "--records", str(f), "--verbose"]) == 0
    verbose = capsys.readouterr().out
    rows = [line for line in verbose.splitlines() if line[:4].strip().isdigit()][:3]
    assert all(line.rstrip().endswith("counters_from_separate_run,cpu_features_hidden,migrated,"
                                      "unsupported_counters") for line in rows[::2])
    assert "  counters_from_separate_run: time from a timed run, counters from a separate " \
           "counted run" in verbose and "--verbose shows" not in verbose
    assert cli.main(["report", "--records", str(f), "--json"]) == 0
    rows_json = json.loads(capsys.readouterr().out)["supersteps"]
    assert all(provenance <= set(r["flags"]) for r in rows_json)
    html = tmp_path / "r.html"
    assert cli.main(["report", "--records", str(f), "--out", str(html)]) == 0
    page = html.read_text()
    assert "<dt><code>exception</code></dt><dd>the superstep&#x27;s body raised an " \
           "exception</dd>" in page or "<dt><code>exception</code></dt>" in page
    assert ">cpu_features_hidden<" not in page and "cpu_features_hidden (3)" in page


def test_a_row_flagged_exception_shows_what_was_raised(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Issue 34: an exception inside a superstep was flagged but its text not kept. The text
    and HTML show it after the flag, short; the JSON and CSV carry each rank's whole text."""
    long = "KeyError: 'row 9' " + "x" * 150
    recs = [replace(r, flags=frozenset({"exception"}), exception=long if r.rank else
                    "ValueError: bad row 7") if r.index == 1 else r for r in records()]
    f = tmp_path / "run.jsonl"
    write_jsonl(recs, f)
    assert cli.main(["report", "--records", str(f)]) == 0
    text = capsys.readouterr().out
    rows = [line.rstrip() for line in text.splitlines() if line[:4].strip().isdigit()][:3]
    assert rows[1].endswith("  exception (ValueError: bad row 7 (ranks 0, 1; rank 0's))")
    assert "exception" not in rows[0] + rows[2]
    assert cli.main(["report", "--records", str(f), "--json"]) == 0
    rows_json = json.loads(capsys.readouterr().out)["supersteps"]
    assert [r["exceptions"] for r in rows_json] == [
        {}, {"0": "ValueError: bad row 7", "1": long}, {}]
    assert cli.main(["report", "--records", str(f), "--format", "csv"]) == 0
    table = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [json.loads(r["exceptions"]) if r["exceptions"] else {} for r in table] == \
        [r["exceptions"] for r in rows_json]
    html = tmp_path / "r.html"
    assert cli.main(["report", "--records", str(f), "--out", str(html)]) == 0
    page = html.read_text()
    assert ('<span class="raised" title="ValueError: bad row 7 (ranks 0, 1; rank 0&#x27;s)">'
            "(ValueError: bad row 7 (ranks 0, 1; rank 0&#x27;s))</span>") in page
    # One rank's long text, cut in the row (the JSON above has it whole).
    one = [replace(r, flags=frozenset({"exception"}), exception=long) for r in records()
           if r.rank == 1]
    row = report.build(one).rows[0]
    assert row.exception_note() == long[:57] + "..." and row.exception_note(short=False) == long


def iterated_records() -> list[SuperstepRecord]:
    """Two names run four times each (an iterative program): ``scan``'s work 1, 2, 3 and 9 ms
    (one occurrence slowed), ``swap``'s 4 ms every time; two processors, rank 1 half rank 0's."""
    out = []
    works = {"scan": [1, 2, 3, 9], "swap": [4, 4, 4, 4]}
    index = 0
    for it in range(4):
        for name in ("scan", "swap"):
            for rank in range(2):
                dur = works[name][it] * 1_000_000 // (1 + rank)
                begin = index * 100_000_000
                out.append(SuperstepRecord(
                    run_id="it", index=index, name=name, rank=rank, pid=100 + rank, cpu=rank,
                    begin_ns=begin, end_ns=begin + dur,
                    counters={"l1d_misses": CounterValue(1_000, Source.SIMULATED)},
                    backend="sim", host="h"))
            index += 1
    return out


def two_and_a_half_ms(recs: Sequence[SuperstepRecord]) -> Prediction:
    terms = {"F1": 2.5e-3, "F2": 1e-3, "F3": 0.0}
    return Prediction(terms, 2.5e-3, {})


def test_repeated_names_are_judged_by_their_median_work() -> None:
    rep = report.build(iterated_records(), predict=two_and_a_half_ms)
    assert rep.repeated
    scan, swap = rep.by_name
    assert (scan.name, scan.first_index, scan.occurrences) == ("scan", 0, 4)
    assert scan.work_ns == 2_500_000  # median of 1, 2, 3, 9 ms: the slowed one does not count
    assert (scan.low_ns, scan.high_ns) == (1_000_000, 9_000_000)
    assert scan.error_ratio == pytest.approx(1.0)
    assert swap.work_ns == 4_000_000 and swap.error_ratio == pytest.approx(4 / 2.5)
    avg, worst, at = rep.name_error_summary() or (0, 0, None)
    assert avg == pytest.approx((1 + 1.6) / 2) and worst == pytest.approx(1.6) and at is swap
    # one occurrence at a time, the slowed scan (9 ms against 2.5) is the maximum
    assert rep.error_summary() is not None and rep.error_summary()[1] == pytest.approx(9 / 2.5)
    text = report.render(rep, "text")
    assert "per superstep name" in text
    assert re.search(r"0 scan\s+2\s+4\s+2\.50 ms\s+1\.00 ms\s+9\.00 ms\s+2\.50 ms"
                     r"\s+1\.00\s+1\.00", text)
    assert "average E 1.30, maximum 1.60 (swap)" in text
    doc = json.loads(report.render(rep, "json"))
    assert [n["name"] for n in doc["by_name"]] == ["scan", "swap"]
    assert doc["by_name"][0]["work_s"] == pytest.approx(2.5e-3)
    assert doc["name_error_ratio"] == {"average": pytest.approx(1.3), "maximum":
                                       pytest.approx(1.6), "maximum_at": "swap",
                                       "repeated": True}
    html = report.render(rep, "html")
    assert "Per superstep name" in html and "1.30 / 1.60" in html


def test_names_that_never_repeat_add_no_per_name_view() -> None:
    rep = report.build(records(), predict=predict)
    assert not rep.repeated and len(rep.by_name) == 3
    assert "per superstep name" not in report.render(rep, "text")
    assert "Per superstep name" not in report.render(rep, "html")
    assert json.loads(report.render(rep, "json"))["name_error_ratio"]["repeated"] is False


def test_each_occurrence_is_judged_against_its_own_F() -> None:
    """Under one name, occurrences whose F differs: E comes from the median of work / F, so
    three of four occurrences predicted 2x too long give E 2 (the medians of work, 1.5 ms,
    and of F, 2 ms, would give 1.33). Occurrences without a prediction (3), or never ended
    (4), are not counted; another processor count (6) is a row of its own."""
    works_ms, fs_ms = [1, 2, 3, 7, 7, 1, 1], [2, 4, 1, 0, 3, 2, 1]  # F 0: no prediction

    def prefer(recs: Sequence[SuperstepRecord]) -> Prediction | None:
        f = fs_ms[recs[0].index] * 1e-3
        return None if f == 0 else Prediction({"F1": f, "F2": 0.0, "F3": 0.0}, f, {})

    recs = []
    for index, w in enumerate(works_ms):
        ranks = 1 if index == 6 else 2  # index 6: one processor
        for rank in range(ranks):
            begin = index * 100_000_000
            end = None if index == 4 and rank == 1 else begin + w * 1_000_000
            recs.append(SuperstepRecord(
                run_id="v", index=index, name="step", rank=rank, pid=1 + rank, cpu=rank,
                begin_ns=begin, end_ns=end, backend="sim", host="h",
                flags=frozenset({"incomplete"}) if end is None else frozenset(),
                counters={"l1d_misses": CounterValue(1.0, Source.SIMULATED)}))
    rep = report.build(recs, predict=prefer)
    two, one = rep.by_name
    assert (two.processors, two.first_index, two.occurrences) == (2, 0, 4)  # 0, 1, 2, 5
    assert two.ratio == pytest.approx(0.5) and two.error_ratio == pytest.approx(2.0)
    assert (one.processors, one.first_index, one.occurrences) == (1, 6, 1)
    text = report.render(rep, "text")
    assert re.search(r"0 step\s+2\s+4 .* 0\.50\s+2\.00", text)
    assert "E from the median of work / F" in text
    assert json.loads(report.render(rep, "json"))["by_name"][0]["work_over_F"] == \
        pytest.approx(0.5)


def test_a_name_is_escaped_in_the_html_view() -> None:
    recs = [dataclasses.replace(r, name="<b>scan</b>" if r.name == "scan" else r.name)
            for r in iterated_records()]
    html = report.render(report.build(recs, predict=two_and_a_half_ms), "html")
    assert "&lt;b&gt;scan&lt;/b&gt;" in html and "<b>scan</b>" not in html
