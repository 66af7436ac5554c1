"""The end of ``make demo`` (scripts/demo_summary.py): it reads what ``counterd report
--format json`` and ``predict --pilot --check --json`` write, and its two summary lines carry
their numbers; anything else is one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from counterd import report
from predictor.inputs import Step
from predictor.pilot.check import Measured
from predictor.pilot.runs import PilotRun
from tests.report.test_report import iterated_records, predict, records, two_and_a_half_ms

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "demo_summary.py"
SIZES = [1e5, 2e5, 4e5]


def _report_json(tmp_path: Path, with_profile: bool = True) -> Path:
    rep = report.build(records(), predict=predict if with_profile else None)
    out = tmp_path / "report.json"
    out.write_text(report.render(rep, "json"))
    return out


def _pilot_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> Path:
    """``predict --pilot --check --json`` on a program whose work is 10 ns per element, its
    runs stubbed (no program is run): the JSON is the CLI's own."""
    from predictor.cli import main

    rng = np.random.default_rng(5)

    def campaign(*a: object, **k: object) -> list[PilotRun]:
        runs = []
        for n in SIZES:
            work = tuple(10 * n * (1 + 0.01 * rng.standard_normal()) for _ in range(3))
            step = Step("0:scan", {}, (0, 1), time_ns=float(np.median(work)),
                        meta={"work_ns": float(np.median(work))})
            runs.append(PilotRun(n, (step,), f"run-{n:g}", (work,), (work,)))
        return runs

    def check(*a: object, **k: object) -> dict[tuple[int, str], Measured]:
        return {(0, "scan"): Measured(work_ns=9.2e6, span_ns=9.3e6, skew_ns=1e5)}

    monkeypatch.setattr("predictor.pilot.campaign.run_campaign", campaign)
    monkeypatch.setattr("predictor.pilot.campaign.load_checks", check)
    assert main(["--pilot", "prog {n}", "--sizes", ",".join(f"{n:g}" for n in SIZES),
                 "--target", "8e5", "--check", "--json"]) == 0
    out = tmp_path / "pilot.json"
    out.write_text(capsys.readouterr().out)
    return out


def _run(*args: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=60)


def test_the_summary_carries_the_reports_and_the_forecasts_numbers(tmp_path, monkeypatch,
                                                                   capsys):
    rep, pil = _report_json(tmp_path), _pilot_json(tmp_path, monkeypatch, capsys)
    p = _run(rep, pil)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    summary = [ln for ln in lines if ln.startswith("summary: ")]
    assert len(summary) == 2 and lines[-2:] == summary
    e = json.loads(rep.read_text())["error_ratio"]
    assert "3 of 3 supersteps predicted" in summary[0]
    assert f"average E {e['average']:.2f}, worst {e['maximum']:.2f}" in summary[0]
    w = json.loads(pil.read_text())["total"]["check"]["work"]
    assert w["measured_s"] == pytest.approx(9.2e-3)
    assert (f"{w['forecast_s'] * 1e3:.2f} ms forecast, 9.20 ms measured, E {w['E']:.2f}"
            in summary[1])
    row = next(ln for ln in lines if ln.strip().startswith("0 scan"))
    assert "9.20 ms" in row and f"{w['E']:.2f}" in row


def test_a_report_without_predictions_says_so(tmp_path, monkeypatch, capsys):
    p = _run(_report_json(tmp_path, with_profile=False),
             _pilot_json(tmp_path, monkeypatch, capsys))
    assert p.returncode == 0, p.stderr
    assert "none of the 3 supersteps was predicted" in p.stdout


def test_files_in_the_wrong_place_or_not_json_are_one_line_and_exit_2(tmp_path, monkeypatch,
                                                                      capsys):
    rep, pil = _report_json(tmp_path), _pilot_json(tmp_path, monkeypatch, capsys)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\xff\x00not json")
    unchecked = tmp_path / "unchecked.json"
    doc = json.loads(pil.read_text())
    del doc["total"]["check"]
    unchecked.write_text(json.dumps(doc))
    for args, says in (((pil, rep), "is not the JSON of counterd report"),
                       ((rep, garbage), "cannot read"),
                       ((rep, unchecked), "--check"),
                       ((rep,), "usage")):
        p = _run(*args)
        assert p.returncode == 2 and says in p.stderr and p.stderr.count("\n") == 1, p.stderr
        assert p.stdout == ""



def test_an_iterated_run_is_summarised_by_each_names_median(tmp_path, monkeypatch, capsys):
    rep = report.build(iterated_records(), predict=two_and_a_half_ms)
    path = tmp_path / "report.json"
    path.write_text(report.render(rep, "json"))
    p = _run(path, _pilot_json(tmp_path, monkeypatch, capsys))
    assert p.returncode == 0, p.stderr
    first = next(ln for ln in p.stdout.splitlines() if ln.startswith("summary: "))
    assert ("2 of 2 supersteps predicted by the F calibrated on this host, each 4 times in "
            "the run: the median of its work over F, average E 1.30, worst 1.60 (swap); one "
            "occurrence at a time, average 1.87, worst 3.60") in first
