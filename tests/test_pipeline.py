"""The whole pipeline on this host, as a new user runs it: calibrate the node, record a program
the way the "no memory counters" advice says, and get a prediction for every superstep that
did work, with the model variant named. This runs the advice itself, so it cannot go stale."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from counterd.prediction import NO_PREDICTION_REASONS
from predictor.errors import MEMORY_COUNTER_ACTION

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([str(BIN / args[0]), *args[1:]], cwd=ROOT, text=True,
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


@pytest.mark.callgrind
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_recorded_as_advised_every_superstep_is_predicted(tmp_path: Path) -> None:
    # The advice, as the errors and /metrics give it.
    advice = "counterd record --backend callgrind --out FILE -- CMD"
    assert advice in MEMORY_COUNTER_ACTION
    assert "counterd record --backend callgrind" in NO_PREDICTION_REASONS["no_memory_counters"]
    # The memory patterns only: counting the compute patterns under Callgrind took 45-60 s of
    # this test's 144 s. Their measurement is tests/microbench/test_compute.py's, the compute
    # variant's fit and its choice for counted records tests/predictor/test_compute_fit.py's,
    # and the whole chain with them bench/program_accuracy.py's.
    _cli("microbench", "run", "--quick", "--compute-backend", "none", "--out",
         str(tmp_path / "q.json"), "--force")
    _cli("predict", "calibrate", "--results", str(tmp_path / "q.json"), "--out",
         str(tmp_path / "node.toml"), "--force")
    run = tmp_path / "run.jsonl"
    _cli(*advice.replace("FILE", str(run)).replace("CMD", f"{sys.executable} "
                                                   "examples/bsp_sum.py").split())
    rep = json.loads(_cli("counterd", "report", "--records", str(run), "--profile",
                          str(tmp_path / "node.toml"), "--json").stdout)
    steps = rep["supersteps"]
    assert len(steps) == 3
    # Callgrind's two levels (the profile has no compute patterns to add instructions to)
    profile = tomllib.loads((tmp_path / "node.toml").read_text())
    variant = "improved.l1_llc"
    assert variant in profile["models"] and not any(".compute" in m for m in profile["models"])
    for s in steps:
        assert s["prediction"] is not None, rep["prediction_note"]
        assert s["prediction"]["model"] == variant
        assert s["prediction"]["accuracy"]["avg_error"] >= 1.0
    assert "no prediction" not in rep["prediction_note"]
    # predict --counters reads the same records and picks the same variant.
    fc = json.loads(_cli("predict", "--profile", str(tmp_path / "node.toml"), "--counters",
                         str(run), "--json").stdout)
    assert [r["model"] for r in fc["supersteps"]] == [variant] * 3
