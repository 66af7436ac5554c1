"""bench/_pyperf.py: the bench scripts' ``--pyperf FILE``, written with pyperf's API and read by
pyperf's own commands (compare_to, stats), from samples given to the helper itself."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from bench._pyperf import PyperfOut, add_option

pyperf = pytest.importorskip("pyperf")


def _write(path: Path, scale: float) -> None:
    out = PyperfOut(path, host="host test: 2 CPUs", command=["bench/x.py", "--pairs", "5"])
    # Marker pairs: us per pair of 5 batches; the second series twice as slow in the new run.
    out.add("marker_cost/pair/compiled", [s * 1e-6 for s in (1.0, 1.1, 0.9, 1.05, 0.95)],
            loops=2000, backend="perf")
    out.add("marker_cost/pair/python", [scale * s * 1e-6 for s in (3.0, 3.2, 2.9, 3.1, 3.0)],
            loops=2000, backend="perf")
    # A 0: below the clock's resolution.
    out.add("start_skew/sim/fork/2p/first", [0.0, 2e-3, 3e-3], backend="sim")
    out.dump()


def test_two_runs_compare_with_pyperf_compare_to(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    _write(old, 1.0)
    _write(new, 2.0)
    assert "3 benchmarks written to" in capsys.readouterr().out
    suite = pyperf.BenchmarkSuite.load(str(new))
    bench = suite.get_benchmark("marker_cost/pair/python")
    assert bench.get_nrun() == 5 and bench.get_unit() == "second"
    assert bench.mean() == pytest.approx(6.08e-6)
    meta = bench.get_metadata()
    assert meta["backend"] == "perf" and meta["loops"] == 2000
    assert meta["host"] == "host test: 2 CPUs" and meta["command"] == "bench/x.py --pairs 5"
    assert isinstance(meta["load_avg_1min"], float) and meta["python_version"]
    skew = suite.get_benchmark("start_skew/sim/fork/2p/first")
    assert min(skew.get_values()) == 1e-9 and skew.get_metadata()["values_at_resolution"] == 1
    run = subprocess.run([sys.executable, "-m", "pyperf", "compare_to", str(old), str(new)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert ("marker_cost/pair/python: Mean +- std dev: [old] 3.04 us +- 0.11 us -> [new] "
            "6.08 us +- 0.23 us: 2.00x slower") in run.stdout
    hidden = next(line for line in run.stdout.splitlines() if "not significant" in line)
    assert "marker_cost/pair/compiled" in hidden
    stats = subprocess.run([sys.executable, "-m", "pyperf", "stats", str(old)],
                           capture_output=True, text=True, timeout=60)
    assert stats.returncode == 0 and "Number of run with values: 5" in stats.stdout
    assert "Loop iterations per value: 2000" in stats.stdout


def test_no_file_no_work_and_bad_samples_refused(tmp_path: Path) -> None:
    off = PyperfOut(None)
    off.add("x", [-1.0])  # not looked at: nothing is written
    off.dump()
    out = PyperfOut(tmp_path / "a.json", host="h")
    with pytest.raises(ValueError, match="negative"):
        out.add("x", [1e-3, -1e-6])
    out.add("x", [1e-3])
    with pytest.raises(ValueError, match="twice"):
        out.add("x", [1e-3])
    with pytest.raises(ValueError, match="commas or colons"):
        out.add("in-process, memory sink", [1e-3])


@pytest.mark.parametrize("name", ["out.txt", "no/such/dir/out.json"])
def test_a_bad_file_name_is_refused_by_the_option(tmp_path: Path, name: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    ap = argparse.ArgumentParser()
    add_option(ap)
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(["--pyperf", str(tmp_path / name)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --pyperf" in err and (".json" in err or "no directory" in err)
    assert ap.parse_args([]).pyperf is None
