"""``predict`` end to end: calibrate -> validate -> forecast, --json, and bad input (exit 2)."""

from __future__ import annotations

import json
import re

import pytest

from predictor.cli import main
from predictor.synthetic import make_results, reference_model


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    f = tmp_path_factory.mktemp("res") / "results.json"
    f.write_text(json.dumps(make_results(reference_model(const=1500.0, dtlb=30.0),
                                         noise=0.01, seed=2)))
    return f


def test_calibrate_validate_forecast(results, tmp_path, capsys):
    prof = tmp_path / "host.toml"
    assert main(["calibrate", "--results", str(results), "--out", str(prof), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["diagnostics"]["improved"]["max_error"] < 1.1
    assert "1" in out["improved_terms"]  # the constant term

    assert main(["validate", "--results", str(results), "--profile", str(prof), "--json"]) == 0
    cap = capsys.readouterr()
    table = {r["function"]: r for r in json.loads(cap.out)["rows"]}
    assert set(table) == {"QSM-MIN", "QSM-MAX", "EBSP-MIN", "EBSP-MAX", "DXBSP-MIN",
                          "DXBSP-MAX", "F (paper)", "F (improved)",
                          # the model variants by counter set (predictor/costs/variants.py)
                          *(f"F ({f}.{v})" for f in ("paper", "improved")
                            for v in ("misses", "l1_llc"))}
    for name, row in table.items():  # the worst patterns, with F's term that dominated each
        doms = [x["dominating"] for x in row["limiting"]]
        assert len(doms) == 3
        assert all(d in ("F1", "F2", "F3") if name.startswith("F (") else d is None
                   for d in doms), (name, doms)
    assert table["F (improved)"]["avg_error"] <= 1.10
    assert table["F (improved)"]["max_error"] <= 1.50
    assert table["F (improved)"]["max_error"] < table["QSM-MAX"]["max_error"]
    assert "fitted on another host" not in cap.err  # results and profile: same host

    assert main(["validate", "--results", str(results), "--profile", str(prof)]) == 0
    text = capsys.readouterr().out
    assert "AVG ERR" in text and "F (improved)" in text

    csv = tmp_path / "c.csv"
    csv.write_text("superstep,rank,loads,stores,l1d_misses,l2_misses,l3_misses,l1d_writebacks,"
                   "l2_writebacks,l3_writebacks,dtlb_misses,time_ns\n"
                   "0,0,1000,0,1000,1000,1000,0,0,0,0,50000\n"
                   "0,1,1000,0,1000,1000,1000,0,0,0,0,50000\n")
    assert main(["--profile", str(prof), "--counters", str(csv), "--json"]) == 0
    cap = capsys.readouterr()
    (row,) = json.loads(cap.out)["supersteps"]
    assert row["dominant"] in ("F1", "F2", "F3") and row["error"] >= 1.0
    assert row["H"] == 1000 and row["M"] == 2000 and "K" in row["assumed"]
    # Times in seconds, as every machine-readable output: 50,000 ns measured.
    assert row["time_s"] == pytest.approx(50e-6) and row["F_s"] > 0
    assert not any(k.endswith("_ns") for k in row)
    assert "fitted on another host" in cap.err  # synthetic host vs this one


def test_sgi_forecast_text(tmp_path, capsys):
    csv = tmp_path / "c.csv"
    csv.write_text("superstep,rank,loads,stores,l1d_misses,l2_misses,l1d_writebacks,"
                   "l2_writebacks\n0,0,1000,0,1000,0,0,0\n")
    assert main(["--profile", "sgi-power-challenge", "--counters", str(csv)]) == 0
    cap = capsys.readouterr()
    # p1.s8-like: F1 = (0.0088 + 0.055) us * 1000 = 63.8 us
    assert " 63.8 us " in cap.out
    assert "times in us" not in cap.out and not re.search(r"\d[eE][+-]?\d", cap.out)
    assert "cpu_model: 'MIPS R10000 194 MHz' (profile)" in cap.err


def _one_line_exit2(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_bad_input(results, tmp_path, capsys):
    d = json.loads(results.read_text())
    d["patterns"] = [p for p in d["patterns"] if p["procs"] != 1]
    thin = tmp_path / "thin.json"
    thin.write_text(json.dumps(d))
    _one_line_exit2(capsys, ["calibrate", "--results", str(thin), "--out",
                             str(tmp_path / "x.toml")], "cannot fit F1")
    assert not (tmp_path / "x.toml").exists()
    _one_line_exit2(capsys, ["calibrate", "--results", str(tmp_path / "none.json"), "--out",
                             str(tmp_path / "y.toml")], "cannot read results")
    bad = tmp_path / "bad.toml"
    bad.write_text('format = "counterd-machine-profile"\nversion = 99\nunit = "ns"\n')
    _one_line_exit2(capsys, ["validate", "--results", str(results), "--profile", str(bad)],
                    "version 99 is not supported")
    csv = tmp_path / "c.csv"
    csv.write_text("superstep,rank,loads,stores\n0,0,nan,1\n")
    _one_line_exit2(capsys, ["--profile", "sgi-power-challenge", "--counters", str(csv)],
                    "'loads' has value 'nan'")
    csv.write_text("superstep,rank,loads,stores\n0,0,1,1\n")
    _one_line_exit2(capsys, ["--profile", "sgi-power-challenge", "--counters", str(csv)],
                    "counter 'l1d_misses' is missing")
    csv.write_text("superstep,rank,loads,stores,l2_misess\n0,0,1,1,1\n")
    _one_line_exit2(capsys, ["--profile", "sgi-power-challenge", "--counters", str(csv)],
                    "unknown counter 'l2_misess'")
    _one_line_exit2(capsys, ["--profile", "sgi-power-challenge"], "--counters")
    d = json.loads(results.read_text())
    for p in d["patterns"]:  # no pattern has a time: nothing to validate on
        p["time_ns"] = {"samples": []}
    untimed = tmp_path / "untimed.json"
    untimed.write_text(json.dumps(d))
    _one_line_exit2(capsys, ["validate", "--results", str(untimed), "--profile",
                             "sgi-power-challenge"], "timed patterns")


def test_profile_command(capsys):
    assert main(["profile", "sgi-power-challenge", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["machine"]["processors"] == 8


def test_the_help_pointer_to_the_pilot_help_works(capsys):
    """Issue 34: ``predict --help`` pointed to ``predict --pilot --help``, which failed with
    "argument --pilot: expected one argument (see predict --pilot --help)"."""
    assert main(["--help"]) == 0
    pointer = re.search(r"\(([^()]*--pilot --help)\)", capsys.readouterr().out.replace("\n", " "))
    assert pointer is not None
    argv = pointer.group(1).split()[1:]
    assert argv == ["--pilot", "--help"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.startswith("usage: predict --pilot") and "--sizes" in out and "--target" in out
    assert err == ""
    assert main(["--pilot", "-h"]) == 0
    assert capsys.readouterr().out.startswith("usage: predict --pilot")
    # --pilot without its command is still a usage error, pointing to the help that works
    assert main(["--pilot"]) == 2
    assert "expected one argument" in capsys.readouterr().err
