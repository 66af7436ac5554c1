"""Results file (versioned, atomic, never silently overwritten, resumable) and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from counterd.data.errors import BadInput
from microbench import results
from microbench.catalogue import catalogue
from microbench.cli import main
from microbench.patterns import host_machine
from microbench.repetition import RunConfig
from microbench.suite import run_suite

GEOM = "L1=4K/4/64,L2=32K/8/64"
CFG = RunConfig(warmup=1, min_reps=3, max_reps=4, budget_ns=10**8)


def _tiny(tmp_path: Path) -> tuple[Any, list[Any]]:
    from counterd.machine.geometry import Geometry

    m = host_machine(Geometry.from_spec(GEOM))
    pats = [p for p in catalogue(m, "table1", procs=[1], min_accesses=4096)
            if p.op == "load"]
    return m, pats


def test_run_write_load_and_contract_fields(tmp_path: Path) -> None:
    m, pats = _tiny(tmp_path)
    out = tmp_path / "r.json"
    seen: list[tuple[int, int]] = []
    doc = run_suite(m, pats, out, suite="table1", cfg=CFG, backend="sim",
                    compute_backend="none", progress=lambda d, t, mn, eta: seen.append((d, t)))
    assert seen[-1] == (len(pats), len(pats))
    loaded = results.load(out)
    assert loaded == json.loads(json.dumps(doc))
    assert (loaded["format"], loaded["version"], loaded["backend"]) == (
        "counterd-microbench", 1, "sim")
    assert loaded["complete"] and loaded["word_bytes"] == 8
    assert loaded["bank_map"] == {"banks": m.bank_map.banks,
                                  "interleave_bytes": m.bank_map.interleave_bytes,
                                  "provenance": m.bank_provenance}
    assert m.memory is not None  # the NUMA layout the banks and the CPU order came from
    assert loaded["memory"] == json.loads(json.dumps(m.memory.to_json()))
    assert loaded["rank_cpus"] == list(m.cpus)
    for key in ("governor", "smt", "hugepages", "isolated", "loadavg"):
        assert key in loaded["host"]
    assert loaded["geometry"]["spec"].startswith(GEOM)
    for rec in loaded["patterns"]:
        t = rec["time_ns"]
        assert t["warmup_dropped"] == 1 and len(t["samples"]) == t["reps"] >= 3
        assert rec["per_access_ns"] == pytest.approx(t["median"] / rec["accesses_per_proc"])
        (proc,) = rec["processors"]
        assert proc["counters"]["loads"] == {"value": rec["accesses_per_proc"],
                                             "source": "simulated"}
        assert len(proc["banks"]["lm"]) == m.bank_map.banks
        assert rec["banks"]["lm"] == proc["banks"]["lm"]
        assert set(rec["bsp"]) == {"H", "K", "M", "M_b"}
        assert rec["bsp"]["H"] == rec["accesses_per_proc"]
        if rec["level"] == "mem":
            assert sum(rec["banks"]["lm"]) == rec["accesses_per_proc"]  # every load misses


def test_unknown_version_rejected_and_no_silent_overwrite(tmp_path: Path) -> None:
    bad = tmp_path / "v9.json"
    bad.write_text(json.dumps({"format": "counterd-microbench", "version": 9, "patterns": []}))
    with pytest.raises(BadInput, match="version 9"):
        results.load(bad)
    m, pats = _tiny(tmp_path)
    out = tmp_path / "r.json"
    out.write_text("precious")
    with pytest.raises(BadInput, match="exists"):
        run_suite(m, pats[:1], out, suite="table1", cfg=CFG, backend="sim",
                  compute_backend="none")
    assert out.read_text() == "precious"


def test_interrupted_run_keeps_finished_patterns_and_resumes(tmp_path: Path) -> None:
    from dataclasses import replace

    m, pats = _tiny(tmp_path)
    # One CPU: the run goes a pattern at a time (a chunk is one pattern per CPU), so the
    # interrupt after the first chunk comes before the end on any host, whatever its CPUs.
    m = replace(m, cpus=m.cpus[:1])
    assert len(pats) >= 2
    out = tmp_path / "r.json"

    def stop_after_first_chunk(done: int, total: int, mn: str, eta: float | None) -> None:
        if done > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_suite(m, pats, out, suite="table1", cfg=CFG, backend="sim",
                  compute_backend="none", progress=stop_after_first_chunk)
    partial = results.load(out)
    assert not partial["complete"] and len(partial["patterns"]) == 1  # of >= 2
    doc = run_suite(m, pats, out, suite="table1", cfg=CFG, backend="sim", resume=True,
                    compute_backend="none")
    assert doc["complete"] and len(doc["patterns"]) == len(pats)
    assert doc["patterns"][0] == partial["patterns"][0]  # kept, not rerun


@pytest.mark.parametrize("content, resume, message", [
    ("", True, "not usable JSON"),
    ('{"format": "counterd-records"}', True, "microbench"),
    ("{}", False, "exists"),
])
def test_cli_refuses_its_out_file_before_probing_the_host(
        content: str, resume: bool, message: str, tmp_path: Path, monkeypatch: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An --out that cannot be resumed or overwritten is one line and exit 2 at once: the
    run's estimate (seconds of probing this host) is never started for it."""
    import microbench.cli as cli

    def no_probe(*a: Any, **k: Any) -> Any:
        raise AssertionError("the host was probed before --out was checked")

    monkeypatch.setattr(cli, "probe", no_probe)
    out = tmp_path / "r.json"
    out.write_text(content)
    argv = ["run", "--quick", "--backend", "sim", "--procs", "1", "--strides", "1",
            "--suite", "table1", "--compute-backend", "none", "--out", str(out)]
    assert main([*argv, *(["--resume"] if resume else [])]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert out.read_text() == content  # nothing lost


@pytest.mark.parametrize("argv,message", [
    (["list", "--suite", "bogus"], "invalid choice"),
    (["run", "--procs", "1,999", "--out", "X"], "999 processors"),
    (["run", "--strides", "0", "--out", "X"], "stride 0"),
    (["run", "--accesses", "0", "--out", "X"], "size 0"),
    (["run", "--geometry", "L1=0K/4/64", "--out", "X"], "size and ways"),
    (["run", "--suite", "table1", "--procs", "1", "--strides", "1",
      "--out", "/nonexistent-dir/r.json"], "cannot write"),
    (["run", "--backend", "nope", "--out", "X"], "invalid choice"),
    (["show", "/nonexistent-file.json"], "cannot read"),
])
def test_cli_bad_input_exit_2(argv: list[str], message: str, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.startswith("microbench: ") and "\n" not in err
    assert not (tmp_path / "X").exists()


def test_cli_list_run_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--suite", "table1", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["count"] == len(listed["patterns"]) > 0
    out = tmp_path / "r.json"
    argv = ["run", "--suite", "table1", "--procs", "1", "--strides", "1,256", "--geometry", GEOM,
            "--accesses", "4096", "--quick", "--backend", "sim", "--compute-backend", "none",
            "--out", str(out)]
    assert main(argv) == 0
    assert main(argv) == 2  # exists: refused without --force
    assert main([*argv, "--force"]) == 0
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "p1.s1.b0.LE" in text and "Figure 1(a)" in text
    assert main(["show", str(out), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["patterns"] and "vs_bkc" in shown["figure1"]


def test_results_without_memory_still_load_and_show(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A results file written before the memory layout was recorded (no ``memory``, no
    ``rank_cpus``) is read and shown as before; one written now says what its banks are."""
    out = tmp_path / "r.json"
    argv = ["run", "--suite", "table1", "--procs", "1", "--strides", "256", "--geometry", GEOM,
            "--accesses", "4096", "--quick", "--backend", "sim", "--compute-backend", "none",
            "--out", str(out)]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["show", str(out)]) == 0
    assert "\nmemory: " in capsys.readouterr().out
    doc = json.loads(out.read_text())
    del doc["memory"], doc["rank_cpus"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    assert results.load(old)["bank_map"] == doc["bank_map"]
    assert main(["show", str(old)]) == 0
    text = capsys.readouterr().out
    assert doc["patterns"][0]["mnemonic"] in text and "\nmemory: " not in text


def test_a_closed_pipe_ends_quietly() -> None:
    """``microbench list | head -1``: no BrokenPipeError traceback, the status of a process
    ended by SIGPIPE (as cat gives)."""
    import fcntl
    import os
    import signal
    import subprocess
    import sys

    r, w = os.pipe()
    fcntl.fcntl(r, fcntl.F_SETPIPE_SZ, 4096)  # smaller than the listing: the writer must wait
    p = subprocess.Popen([sys.executable, "-m", "microbench.cli", "list", "--suite", "all"],
                         stdout=w, stderr=subprocess.PIPE)
    os.close(w)
    p.stdout = os.fdopen(r, "rb")
    assert p.stderr is not None
    p.stdout.read(10)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 128 + signal.SIGPIPE
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err


def test_version_is_looked_up_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the installed version and exits 0 for each command; building a parser
    does not read the distribution's metadata (40 ms that every command would pay)."""
    from unittest import mock

    from counterd.commands.cli import main as counterd_main
    from counterd.util import cliutil
    from predictor.cli import main as predict_main

    for run, prog in ((main, "microbench"), (counterd_main, "counterd"),
                      (predict_main, "predict")):
        try:
            code = run(["--version"])
        except SystemExit as exc:  # argparse's exit, as the console scripts see it
            code = int(exc.code or 0)
        assert code == 0
        out = capsys.readouterr().out.split()
        assert out[0] == prog and out[1][0].isdigit()
    with mock.patch.object(cliutil, "version", side_effect=AssertionError("looked up")):
        assert main(["list", "--suite", "table1"]) == 0
    capsys.readouterr()
