"""``bench/outside_suite.py``: its table and summary read ``predict --pilot --check --json``'s
fields (canned here) into the issue's figures, and each program of the outside suite runs at a
tiny size without counterd's daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import outside_suite as suite

ROOT = Path(__file__).resolve().parents[1]
TINY = {"matmul": 6, "cg": 400, "splu": 400, "dense_solve": 6}  # every other program: 2000


def _comparison(forecast: float, lo: float, hi: float, measured: float) -> dict[str, Any]:
    e = max(forecast, measured) / min(forecast, measured)
    return {"forecast_s": forecast, "interval_s": [lo, hi], "measured_s": measured, "E": e,
            "inside": lo <= measured <= hi}


def canned(steps: list[tuple[str, float, float, float, float, float]], target: float = 4e5
           ) -> dict[str, Any]:
    """``predict --pilot --check --json``'s output for supersteps (name, forecast, lower,
    upper, measured work, time-only), each span 1 ms more than its work, forecast and
    measured."""
    out = []
    for i, (name, p, lo, hi, t, to) in enumerate(steps):
        out.append({"index": i, "name": name, "predicted_s": p, "interval_s": [lo, hi],
                    "basis": "scaled", "time_only_s": to, "span_s": p + 1e-3,
                    "check": {"work": _comparison(p, lo, hi, t),
                              "span": _comparison(p + 1e-3, lo, hi + 1e-3, t + 1e-3)},
                    "measured": {"work_s": t, "span_s": t + 1e-3, "skew_s": 0.0}})
    total = [sum(float(s[k]) for s in steps) for k in range(1, 5)]
    return {"target": target, "supersteps": out,
            "total": {"predicted_s": total[0], "interval_s": total[1:3],
                      "time_only_s": sum(s[5] for s in steps),
                      "check": {"work": _comparison(*total),
                                "span": _comparison(total[0] + 2e-3, total[1], total[2] + 2e-3,
                                                    total[3] + 2e-3)}}}


STEPS = [("fill", 0.010, 0.008, 0.012, 0.011, 0.020),  # E 1.1, inside, width 1.5
         ("scan", 0.030, 0.020, 0.040, 0.060, 0.030),  # E 2.0, outside, width 2.0
         ("sum", 0.002, 0.001, 0.004, 0.002, 0.002)]  # E 1.0, inside, width 4.0


def test_target_result_reads_the_fields_by_name() -> None:
    r = suite.target_result("prog", "4x", canned(STEPS), [0.011, 0.060, None])
    assert [s.name for s in r.steps] == ["0:fill", "1:scan", "2:sum"]
    assert [round(s.e or 0, 3) for s in r.steps] == [1.1, 2.0, 1.0]
    assert [s.inside for s in r.steps] == [True, False, True]
    assert [s.width for s in r.steps] == pytest.approx([1.5, 2.0, 4.0])
    assert r.median_e == pytest.approx(1.1)
    assert r.measured_s == pytest.approx(0.073)
    assert r.total_e == pytest.approx(0.073 / 0.042)
    assert r.total_inside is False  # 0.073 > 0.056
    assert r.time_only_e == pytest.approx(0.073 / 0.052)
    assert r.extrap_e is None  # a superstep Extra-P gave no value for
    assert [s.extrap_e for s in r.steps] == [pytest.approx(1.0), pytest.approx(1.0), None]
    assert r.steps[0].time_only_e == pytest.approx(0.020 / 0.011)


def test_table_and_summary_say_the_figures_and_the_targets() -> None:
    good = [("a", 0.010, 0.008, 0.012, 0.0105, 0.011), ("b", 0.020, 0.015, 0.025, 0.021, 0.02)]
    results = [suite.target_result("bad", "4x", canned(STEPS), None),
               suite.target_result("good", "4x", canned(good), [0.010, 0.020]),
               suite.target_result("good", "16x", canned(good, 1.6e6), None)]
    rows = suite.table(results)
    assert len(rows) == 4 and rows[1].startswith("bad ") and " 2/3 " in rows[1]
    assert " 2/2 " in rows[2] and "fill 1.10 (1.82, -)" in rows[1]
    text = "\n".join(suite.summary(results, "4x"))
    assert "2 programs, 5 supersteps" in text
    assert "cover 4/5 = 80% of supersteps" in text
    assert "median per-superstep E: forecast 1.050" in text  # 1.0, 1.05, 1.05, 1.1, 2.0
    assert "target median per-superstep E <= 1.15: met" in text
    assert "target every total E <= 1.5: MISSED (over: bad 1.74)" in text
    assert "worse than time-only's by > 10%: MISSED (worse: bad)" in text
    assert "target coverage >= 85%: MISSED; median width < 2x: met" in text  # 1.67
    assert "target" not in "\n".join(suite.summary(results, "16x"))


def test_two_campaigns_agree_only_within_intervals_and_medians() -> None:
    first = canned(STEPS)
    near = canned([(n, p * 1.05, lo, hi, t, to) for n, p, lo, hi, t, to in STEPS])
    far = canned([(n, p * 1.5, lo, hi * 1.5, t, to) for n, p, lo, hi, t, to in STEPS])
    g = suite.agreement(first, {**near, "campaign_s": 70.0}, "prog", "4x")
    assert g.each_inside and g.medians_close and g.campaign_s == 70.0
    g = suite.agreement(first, far, "prog", "4x")
    assert not g.each_inside  # 0.063 is above the first one's upper bound, 0.056
    assert not g.medians_close  # 1.1 against 1.36
    line = suite.agreement_lines([g])[0]
    assert "within the other's interval: MISSED" in line
    # where they differ: the forecasts 1.5x apart, the checking runs not at all
    assert g.forecasts_apart == pytest.approx(1.5) and g.checks_apart == pytest.approx(1.0)
    assert "the forecasts 1.50x apart, the checking runs 1.00x" in line
    moved = canned([(n, p, lo, hi, t * 2, to) for n, p, lo, hi, t, to in STEPS])
    g = suite.agreement(first, moved, "prog", "4x")
    assert g.forecasts_apart == pytest.approx(1.0) and g.checks_apart == pytest.approx(2.0)


@pytest.mark.parametrize("program", [p.name for p in suite.PROGRAMS + suite.HELD_OUT])
def test_each_program_runs_at_a_tiny_size_without_the_daemon(program: str) -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")},
           "PYTHONPATH": str(ROOT), "COUNTERD_SOCKET": "off"}  # no daemon, no recording
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "outside" / f"{program}.py"),
                           str(TINY.get(program, 2000))], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()  # each prints its result


def test_the_suite_is_at_least_twelve_programs_two_of_each_parallel_kind() -> None:
    assert len(suite.PROGRAMS) >= 12
    assert sum(p.parallel for p in suite.PROGRAMS) >= 3
    assert set(suite.QUICK) <= {p.name for p in suite.PROGRAMS}
    for p in suite.PROGRAMS + suite.HELD_OUT:
        assert all(float(x).is_integer() for x in p.pilots)  # the programs take integers
        assert p.pilots[-1] == p.largest and p.target("16x") == 16 * p.largest


def test_the_held_out_programs_are_apart_from_the_suite() -> None:
    held = {p.name for p in suite.HELD_OUT}
    assert len(held) == len(suite.HELD_OUT) == 5 and any(p.parallel for p in suite.HELD_OUT)
    assert not held & ({p.name for p in suite.PROGRAMS} | set(suite.QUICK))
    assert not held & {name for name, _ in suite.AGAIN}
    assert all((ROOT / "bench" / "outside" / f"{name}.py").is_file() for name in held)


def _canned_runs(monkeypatch: pytest.MonkeyPatch, campaign: Any) -> None:
    """The suite's runs replaced: ``campaign`` for the campaigns, canned checking runs at 16x and
    canned Extra-P forecasts."""
    monkeypatch.setattr(suite, "campaign", campaign)
    monkeypatch.setattr(suite, "from_records", lambda p, label, *a: canned(STEPS, p.target(label)))
    monkeypatch.setattr(suite, "extrap_at", lambda *a: {"4x": [0.011, 0.06, 0.002],
                                                        "16x": [None, None, None]})


def test_main_prints_one_table_from_the_campaigns(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The run's glue on canned campaigns (no program runs): every program at 4x and 16x, the
    second campaigns, the 1 s campaign's wall time, and a failed program said, not hidden."""
    def campaign(prog: suite.Program, label: str, d: Path, repeat: int,
                 profile: str | None) -> dict[str, Any]:
        if prog.name == "cg":
            raise suite.subprocess.CalledProcessError(2, ["predict"])
        return {**canned(STEPS, prog.target(label)), "campaign_s": 90.0 if "c2" in d.name
                else 60.0}

    _canned_runs(monkeypatch, campaign)
    assert suite.main(["--quick", "--no-profile", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cg: FAILED" in out and out.count("\ngroupby_python  4x ") == 1
    assert len([x for x in out.splitlines() if x.startswith(("matmul ", "wordcount "))]) == 4
    assert "groupby_python at 4x: totals 42 ms" in out
    assert "a campaign of a ~1 s program" not in out  # --quick: the 4x second campaign only
    assert suite.main(["--only", "histogram_spmd", "--no-profile", "--work", str(tmp_path)]) == 0
    assert "a campaign of a ~1 s program (histogram_spmd" in capsys.readouterr().out


def test_held_out_runs_only_the_held_out_programs(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``--held-out`` on canned campaigns: the held-out programs alone, each at 4x and 16x, no
    second campaign, and the header and summaries say "held-out programs"."""
    ran: list[tuple[str, str]] = []

    def campaign(prog: suite.Program, label: str, d: Path, repeat: int,
                 profile: str | None) -> dict[str, Any]:
        ran.append((prog.name, label))
        return {**canned(STEPS, prog.target(label)), "campaign_s": 60.0}

    _canned_runs(monkeypatch, campaign)
    assert suite.main(["--held-out", "--no-profile", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    held = sorted(p.name for p in suite.HELD_OUT)
    assert sorted(ran) == [(name, "4x") for name in held]  # one campaign each, none again
    assert "\n5 held-out programs; pilots" in out
    assert "at 4x: 5 held-out programs, 15 supersteps" in out
    assert "at 16x: 5 held-out programs, 15 supersteps" in out
    rows = [x.split()[0] for x in out.splitlines() if x.split()[1:2] in (["4x"], ["16x"])]
    assert sorted(rows) == sorted(held * 2)
    assert "two campaigns of the same program" not in out


def test_held_out_options_said_clearly(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert suite.main(["--held-out", "--quick", "--work", str(tmp_path)]) == 2
    assert "--quick and --held-out" in capsys.readouterr().err
    assert suite.main(["--held-out", "--only", "matmul", "--work", str(tmp_path)]) == 2
    assert "no held-out program matmul; choose from bfs_python" in capsys.readouterr().err
    assert suite.main(["--only", "pagerank", "--work", str(tmp_path)]) == 2
    assert "add --held-out" in capsys.readouterr().err
