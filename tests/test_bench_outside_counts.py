"""``bench/outside_counts.py``: the counts' extrapolation against a counted run at the target,
and what the forecast would miss by with the counted instructions (campaign records, the
counted run at the target and the checking runs stubbed: no Callgrind, no timing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench import outside_counts as oc
from bench.outside_suite import Program
from predictor.inputs import Step
from predictor.pilot.check import Measured
from predictor.pilot.runs import PilotRun

PROG = Program("toy", 400)
FIXED_S, PER_INSTR_S = 2e-3, 1e-9  # the pilots' work: a fixed cost plus 1 ns an instruction


def _runs() -> list[PilotRun]:
    out = []
    for n in PROG.pilots:
        w = (FIXED_S + PER_INSTR_S * 1e4 * n) * 1e9
        step = Step("0:work", {"instructions": np.array([1e4 * n])}, (0,))
        out.append(PilotRun(n, (step,), f"run-{n:g}", ((w, w, w),), ((w, w, w),)))
    return out


def test_rows_split_the_error_into_the_counts_and_the_time_per_instruction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 4x: the forecast extrapolated 1.2x the instructions counted there, and the checking
    runs measured 1.5 ns an instruction (the largest pilot: (2 ms + 4 ms) / 4e6 instructions);
    the fixed cost is a third of the largest pilot's time."""
    target = PROG.target("4x")
    true_instr = 1e4 * target
    measured_s = 1.5e-9 * true_instr
    predicted_s = 0.05
    (tmp_path / "forecast.json").write_text(json.dumps({"supersteps": [
        {"index": 0, "name": "work", "basis": "scaled", "predicted_s": predicted_s,
         "counters": {"instructions": 1.2 * true_instr}}]}))
    monkeypatch.setattr(oc, "load_campaign", lambda d, sizes, repeat: _runs())
    monkeypatch.setattr(oc, "load_checks",
                        lambda d, repeat: {(0, "work"): Measured(measured_s * 1e9, 0.0, 0.0)})
    monkeypatch.setattr(oc, "counted_at_target", lambda prog, d: {(0, "work"): true_instr})
    (row,) = oc.rows(PROG, tmp_path, 3)
    top_s, top_instr = FIXED_S + PER_INSTR_S * 1e4 * 400, 1e4 * 400
    assert row["step"] == "0:work" and row["basis"] == "scaled"
    assert row["count"] == pytest.approx(1.2)
    assert row["E"] == pytest.approx(max(predicted_s, measured_s) / min(predicted_s, measured_s))
    oracle = top_s * true_instr / top_instr
    assert row["oracle"] == pytest.approx(max(oracle, measured_s) / min(oracle, measured_s))
    assert row["tpi"] == pytest.approx((measured_s / true_instr) / (top_s / top_instr))
    assert row["fixed"] == pytest.approx(FIXED_S / top_s)
    assert row["log_e"] == pytest.approx(math.log(predicted_s / measured_s))


def test_a_superstep_the_checks_or_the_target_count_lack_is_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "forecast.json").write_text(json.dumps({"supersteps": [
        {"index": 0, "name": "work", "basis": "scaled", "predicted_s": 0.05,
         "counters": {"instructions": 1.0}}]}))
    monkeypatch.setattr(oc, "load_campaign", lambda d, sizes, repeat: _runs())
    monkeypatch.setattr(oc, "load_checks", lambda d, repeat: {})
    monkeypatch.setattr(oc, "counted_at_target", lambda prog, d: {(0, "work"): 1.0})
    assert oc.rows(PROG, tmp_path, 3) == []


def test_no_kept_campaign_is_one_line_and_exit_2(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert oc.main(["--work", str(tmp_path / "nowhere"), "--only", "matmul"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no kept 4x campaign of matmul" in err[0]
    assert "run bench/outside_suite.py" in err[0]
