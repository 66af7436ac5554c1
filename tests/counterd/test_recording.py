"""counterd record and the CLI: exit codes, whole-command records, SPMD example, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from counterd.commands.cli import main
from counterd.commands.recording import record
from counterd.data.errors import BadInput
from counterd.data.records import read_jsonl
from tests._signals import HOWS, signal_of, stop_when_ready

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "bsp_sum.py"


def test_command_without_markers_is_one_superstep_and_exit_code_passes(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    result = record(["sh", "-c", "exit 3"], out=out, backend="none")
    assert result.exit_code == 3
    recs = list(read_jsonl(out))
    assert len(recs) == 1
    assert "whole_command" in recs[0].flags
    assert recs[0].duration_ns is not None and recs[0].duration_ns > 0


def test_spmd_example_gives_one_record_per_processor_per_superstep(tmp_path: Path) -> None:
    out = tmp_path / "ex.jsonl"
    result = record([sys.executable, str(EXAMPLE), "200000", "2"], out=out, backend="none")
    assert result.exit_code == 0
    recs = list(read_jsonl(out))
    assert sorted((r.index, r.rank) for r in recs) == [(i, r) for i in range(3) for r in (0, 1)]
    assert [r.name for r in recs if r.rank == 0] == ["fill", "sum", "exchange"]
    assert all(r.params == {"n": 200000, "p": 2} for r in recs)
    assert len({r.run_id for r in recs}) == 1


_ONE_CPU = """
import multiprocessing as mp, os, sys, time
import counterd

def work(rank, barrier):
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # both ranks on one CPU
    counterd.set_rank(rank)
    counterd.init()
    barrier.wait()
    with counterd.superstep("together"):
        t = time.thread_time()
        while time.thread_time() - t < 0.03:  # 30 ms of CPU each
            pass

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    ps = [ctx.Process(target=work, args=(r, barrier)) for r in range(2)]
    for p in ps: p.start()
    for p in ps: p.join()
    sys.exit(max(p.exitcode for p in ps))
"""


def test_record_says_when_processes_took_turns_on_one_cpu(tmp_path: Path) -> None:
    """Two processes pinned to one CPU, each with 30 ms of CPU in one superstep: the one that
    ends last took the other's time too, the superstep is shared_cpu, and the summary says so
    on its own line and in the JSON."""
    script = tmp_path / "one_cpu.py"
    script.write_text(_ONE_CPU)
    out = tmp_path / "r.jsonl"
    proc = _cli("record", "--backend", "none", "--out", str(out), "--", sys.executable,
                str(script))
    assert proc.returncode == 0, proc.stderr
    recs = list(read_jsonl(out))
    assert len(recs) == 2 and len({r.cpu for r in recs}) == 1
    assert max(r.duration_ns or 0 for r in recs) > 45_000_000  # waited for the other
    assert "counterd: 1 superstep had processes taking turns on one CPU" in proc.stderr
    proc = _cli("record", "--backend", "none", "--json", "--out", str(out), "--", "true")
    assert json.loads(proc.stderr.strip().splitlines()[-1])["shared_cpu"] == 0


def test_missing_command_is_bad_input_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="command not found: no-such-cmd-xyz"):
        record(["no-such-cmd-xyz"], out=tmp_path / "r.jsonl", backend="none")
    assert not (tmp_path / "r.jsonl").exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "counterd.commands.cli", *args],
                          capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["record", "--out", "/nonexistent-dir/x.jsonl", "--", "true"], "not a directory"),
    (["record", "--out", "{tmp}/x.jsonl", "--", "no-such-cmd-xyz"], "command not found"),
    (["record", "--backend", "bogus", "--out", "{tmp}/x.jsonl", "--", "true"], "unknown backend"),
    (["record", "--events", "loadz", "--out", "{tmp}/x.jsonl", "--", "true"], "unknown counter"),
    (["record", "--out", "{tmp}/x.jsonl"], "no command given"),
    (["report", "--records", "{tmp}/missing.jsonl"], "cannot read"),
    (["record", "--sample", "often", "--out", "{tmp}/x.jsonl", "--", "true"],
     "is not <duration>:<k>"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str],
                                              message: str) -> None:
    proc = _cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_cli_record_passes_exit_code_and_report_reads_it(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert main(["record", "--backend", "none", "--out", str(out), "--", "sh", "-c", "exit 4"]) == 4
    proc = _cli("report", "--records", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["supersteps"]
    assert len(rows) == 1 and rows[0]["flags"] == ["whole_command"]


def test_probe_json_shape() -> None:
    proc = _cli("probe", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    # issue 2's shape, plus the machine description, what auto picks per purpose, how the
    # markers run and pyperf's noise checks
    assert set(d) == {"host", "backends", "counters", "machine", "auto", "markers", "noise"}
    assert all(n["status"] in ("noise", "ok", "unknown") for n in d["noise"])
    from counterd import _native

    assert d["markers"].startswith("compiled" if _native.hotpath() is not None else "in Python")
    assert set(d["backends"]) == {"perf", "papi", "sim", "callgrind"}
    from counterd.data.events import NAMES

    assert set(d["counters"]) == set(NAMES)
    for name, st in d["counters"].items():
        assert isinstance(st["available"], bool)
        # Either a backend that gives it, or the reason none does.
        assert (st["backend"] is not None) == st["available"], name
        assert (st["reason"] is None) == st["available"], name
    for name, b in d["backends"].items():
        assert isinstance(b["available"], bool) and b["reason"], name
        assert "internal error" not in b["reason"], (name, b["reason"])


def test_probe_says_why_the_markers_run_in_python() -> None:
    proc = subprocess.run([sys.executable, "-m", "counterd.commands.cli", "probe"],
                          capture_output=True,
                          text=True, cwd=ROOT, timeout=120, env={**os.environ,
                                                                 "COUNTERD_NATIVE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "hot path  the markers run in Python: COUNTERD_NATIVE=0" in proc.stdout


def test_mpi_ranks_are_recorded(tmp_path: Path) -> None:
    pytest.importorskip("mpi4py", reason="mpi4py is in the [test] extra; install it")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("no mpiexec beside this python (the mpich wheel provides it)")
    out = tmp_path / "mpi.jsonl"
    result = record([str(mpiexec), "-n", "2", sys.executable, str(ROOT / "examples/bsp_mpi.py"),
                     "100000"], out=out, backend="none")
    assert result.exit_code == 0
    recs = list(read_jsonl(out))
    assert sorted((r.index, r.rank) for r in recs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len({r.pid for r in recs}) == 2


def test_whole_command_counts_start_at_exec(tmp_path: Path) -> None:
    """The exec shim reports ready before counters start: the recorder's Python start-up
    (about 2,000 page faults here) is not in the count of a command that does almost nothing."""
    from counterd.backends import get

    if not get("perf").available().supports("page_faults"):
        pytest.skip("perf software events are not available here")
    out = tmp_path / "r.jsonl"
    assert record(["true"], out=out, backend="perf").exit_code == 0
    (rec,) = list(read_jsonl(out))
    assert rec.counters["page_faults"].source.value == "measured"
    assert 0 < rec.counters["page_faults"].value < 400
    assert 0 < rec.counters["task_clock_ns"].value < 50e6


@pytest.mark.callgrind
def test_whole_command_under_callgrind_gets_simulated_counters(tmp_path: Path) -> None:
    import shutil

    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not on PATH (apt-get install valgrind)")
    out = tmp_path / "r.jsonl"
    assert record(["true"], out=out, backend="callgrind").exit_code == 0
    (rec,) = list(read_jsonl(out))
    assert {"whole_command", "counters_from_separate_run"} <= rec.flags
    assert "counters_missing" not in rec.flags
    assert rec.counters["loads"].source.value == "simulated"
    assert rec.counters["loads"].value > 1000  # the dynamic loader alone does thousands
    assert rec.duration_ns is not None and rec.duration_ns > 0  # from the timed run


def _env_probe(path: Path) -> list[str]:
    """A command that writes the dispatch variables it sees to ``path``."""
    keys = ["NPY_DISABLE_CPU_FEATURES", "GLIBC_TUNABLES", "OPENBLAS_CORETYPE"]
    return [sys.executable, "-c", "import json, os, sys; json.dump({k: os.environ.get(k) for "
            f"k in {keys!r}}}, open(sys.argv[1], 'w'))", str(path)]


@pytest.mark.parametrize("flags, mode, hidden", [
    ({"avx2", "avx512f", "avx512bw"}, "as-counted", True),
    ({"avx2", "avx512f"}, "native", False),
    ({"avx2", "fma"}, "as-counted", False),  # nothing valgrind lacks: nothing to hide
])
def test_cpu_features_as_counted_hides_what_valgrind_lacks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: set[str], mode: str,
        hidden: bool) -> None:
    import counterd.data.host

    monkeypatch.setattr(counterd.data.host, "cpu_flags", lambda procfs="/proc": frozenset(flags))
    monkeypatch.delenv("NPY_DISABLE_CPU_FEATURES", raising=False)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")  # the user's own setting is kept
    seen = tmp_path / "env.json"
    result = record(_env_probe(seen), out=tmp_path / "r.jsonl", backend="none",
                    cpu_features=mode)
    assert result.exit_code == 0
    env = json.loads(seen.read_text())
    assert env["OPENBLAS_CORETYPE"] == "Zen"
    (rec,) = result.records
    if hidden:
        assert "AVX512F" in env["NPY_DISABLE_CPU_FEATURES"]
        assert env["GLIBC_TUNABLES"].startswith("glibc.cpu.hwcaps=-AVX512F")
        assert "cpu_features_hidden" in rec.flags
    else:
        assert env["NPY_DISABLE_CPU_FEATURES"] is None and env["GLIBC_TUNABLES"] is None
        assert "cpu_features_hidden" not in rec.flags


@pytest.mark.parametrize("flags, lacked", [({"avx2", "avx512f"}, True), ({"avx2"}, False)])
def test_cpu_features_auto_times_natively_and_says_when_callgrind_counts_other_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        flags: set[str], lacked: bool) -> None:
    """The default hides nothing, beside Callgrind too (the times are the program's as it
    runs without counterd, as predict --pilot times it); where valgrind's CPU lacks features
    this one has, the records counted under it carry counted_other_code and the recorder says
    so once. The counted run is stubbed (its own tests run valgrind)."""
    import shutil

    import counterd.data.host
    from counterd.backends.callgrind.counting import CountedRun

    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not on PATH: the callgrind backend is not chosen")
    monkeypatch.setattr(counterd.data.host, "cpu_flags", lambda procfs="/proc": frozenset(flags))
    monkeypatch.delenv("NPY_DISABLE_CPU_FEATURES", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr("counterd.backends.callgrind.counting.count_command",
                        lambda argv, **kw: CountedRun(supersteps={}, whole={}, unsupported={},
                                                      exit_code=0, adjustments=()))
    seen = tmp_path / "env.json"
    said: list[str] = []
    result = record(_env_probe(seen), out=None, backend="callgrind", progress=said.append)
    assert result.exit_code == 0 and result.backend == "callgrind"
    env = json.loads(seen.read_text())
    assert env["NPY_DISABLE_CPU_FEATURES"] is None and env["GLIBC_TUNABLES"] is None
    (rec,) = result.records
    assert "cpu_features_hidden" not in rec.flags
    assert ("counted_other_code" in rec.flags) == lacked
    assert any("counts are of other code" in m and "avx512f" in m for m in said) == lacked
    with pytest.raises(BadInput, match="cpu-features"):
        record(["true"], out=None, backend="none", cpu_features="avx2")


def test_numpy_runs_its_avx2_code_when_avx512_is_hidden() -> None:
    """The variables do what they claim on the numpy this project installs: none of its
    AVX-512 dispatch targets is enabled (where the host has them, they are without it)."""
    import os

    from counterd.backends.callgrind.counting import AS_COUNTED_ENV
    from counterd.data.host import cpu_flags

    code = ("from numpy._core._multiarray_umath import __cpu_features__ as f, "
            "__cpu_dispatch__ as d; print(sorted(x for x in d if f.get(x) and "
            "('AVX512' in x or x == 'X86_V4')))")

    def enabled(extra: dict[str, str]) -> str:
        env = {k: v for k, v in os.environ.items() if k not in AS_COUNTED_ENV}
        return subprocess.run([sys.executable, "-c", code], env={**env, **extra},
                              capture_output=True, text=True, check=True).stdout.strip()

    assert enabled(dict(AS_COUNTED_ENV)) == "[]"
    if any(f.startswith("avx512") for f in cpu_flags()):
        assert enabled({}) != "[]"  # the host's own dispatch does use them


@pytest.mark.parametrize("out, fmt, err", [
    ("r.pdf", None, "cannot write .pdf"),
    ("r.json", "csv", "--format csv but --out"),
])
def test_report_out_refuses_a_suffix_that_lies(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               out: str, fmt: str | None, err: str) -> None:
    rec = tmp_path / "r.jsonl"
    assert record(["true"], out=rec, backend="none").exit_code == 0
    argv = ["report", "--records", str(rec), "--out", str(tmp_path / out)]
    assert main(argv + (["--format", fmt] if fmt else [])) == 2
    assert err in capsys.readouterr().err
    assert not (tmp_path / out).exists()


def test_report_out_writes_the_suffix_format_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rec = tmp_path / "r.jsonl"
    assert record(["true"], out=rec, backend="none").exit_code == 0
    for name, check in (("r.csv", lambda t: "," in t.splitlines()[0]),
                        ("r.json", lambda t: json.loads(t) is not None),
                        ("r.html", lambda t: t.lstrip().lower().startswith("<!doctype html")),
                        ("r.txt", lambda t: "superstep" in t)):
        assert main(["report", "--records", str(rec), "--out", str(tmp_path / name)]) == 0
        err = capsys.readouterr().err
        assert f"wrote {tmp_path / name}" in err
        assert check((tmp_path / name).read_text()), name


_SHORT_STEPS = """
import counterd
for i in range(30):
    with counterd.superstep("short", i=i):
        pass
"""


def test_record_samples_short_supersteps_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    result = record([sys.executable, "-c", _SHORT_STEPS], out=out, backend="perf",
                    events=["task_clock_ns"], sample="10s:3")
    if result.backend != "perf":
        pytest.skip("perf cannot count here")
    recs = sorted(read_jsonl(out), key=lambda r: r.index)
    assert [("sampled" in r.flags) for r in recs] == [i % 3 != 0 for i in range(30)]
    assert all(r.counters["task_clock_ns"].source.value == ("sampled" if i % 3 else "measured")
               for i, r in enumerate(recs))


_RAISES = """
import counterd
try:
    with counterd.superstep('parse', n=1):
        raise ValueError('bad row 7\\n' + 'x' * 500)
except ValueError:
    pass
with counterd.superstep('ok'):
    pass
"""


@pytest.mark.parametrize("native", ["0", "1"])
def test_a_superstep_that_raised_keeps_what_it_raised_in_the_spool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str) -> None:
    """Issue 34: the record of a superstep whose body raised says what it raised (type and
    message on one line, cut to 200 characters, no traceback), on the Python path and the
    compiled lane alike, through the spool of counterd record."""
    monkeypatch.setenv("COUNTERD_NATIVE", native)
    out = tmp_path / "r.jsonl"
    assert record([sys.executable, "-c", _RAISES], out=out, backend="none").exit_code == 0
    parse, ok = sorted(read_jsonl(out), key=lambda r: r.index)
    assert "exception" in parse.flags and ok.exception is None
    assert parse.exception is not None and len(parse.exception) == 200
    assert parse.exception.startswith("ValueError: bad row 7\\nxxx")
    assert parse.exception.endswith("x...") and "Traceback" not in parse.exception


@pytest.mark.parametrize("how", HOWS)
def test_a_signal_stops_the_command_and_its_supersteps_are_still_written(tmp_path: Path,
                                                                          how: str) -> None:
    """Ctrl-C reaches the whole foreground process group; ``kill`` or ``timeout`` signal the
    recorder alone, which passes SIGTERM on. Either way the command dies of it, the recorder
    does not, and writes the supersteps the command finished and the one it was inside
    (incomplete); the recorder ends as a shell reports the signal (128 + N)."""
    sig = signal_of(how)
    ready = tmp_path / "ready"
    program = (
        "import pathlib, time, counterd\n"
        "with counterd.superstep('done', n=1):\n"
        "    pass\n"
        "counterd.begin('interrupted', n=2)\n"
        f"pathlib.Path({str(ready)!r}).write_text('x')\n"
        "time.sleep(60)\n")
    out = tmp_path / "r.jsonl"
    err = stop_when_ready([sys.executable, "-m", "counterd.commands.cli", "record", "--backend",
                           "none",
                           "--out", str(out), "--", sys.executable, "-c", program], ready, how,
                          cwd=ROOT, ready_within_s=60, end_within_s=60)
    recs = sorted(read_jsonl(out), key=lambda r: r.index)
    assert [(r.name, r.params, "incomplete" in r.flags) for r in recs] == [
        ("done", {"n": 1}, False), ("interrupted", {"n": 2}, True)]
    assert f"command killed by {sig.name} (exit {128 + sig})" in err


def test_the_last_line_names_the_signal_that_killed_the_command(tmp_path: Path) -> None:
    """Issue 34: "command exited -9" said nothing to a user; the line names the signal and the
    status the recorder ends with, as a shell reports it."""
    out = tmp_path / "k.jsonl"
    proc = subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record", "--backend",
                           "none",
                           "--out", str(out), "--", sys.executable, "-c",
                           "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 137, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.endswith("; command killed by SIGKILL (exit 137)"), last
    # the raw status nowhere in what the line says of the command (the records' path before it
    # may hold "-9": pytest's ninth temporary directory, pytest-9)
    assert "-9" not in last.rsplit("; ", 1)[1]
