"""counterd record starts fast (issue 13, item 4): what it loads before the command's exec.

Whatever the recorder imports before it writes the go byte delays the command; these tests
keep the expensive modules off that path, and check that a machine file still works when
counterd.machine is only loaded on demand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from counterd import machine
from counterd.commands import recording
from counterd.data.records import read_jsonl
from counterd.machine.files import ENV_MACHINE

ROOT = Path(__file__).resolve().parents[2]

# Modules that cost milliseconds each and that the way to the exec does not need.
NOT_BEFORE_EXEC = ("counterd.machine", "counterd.wire.spool", "counterd.wire.protocol", "uuid",
                   "importlib.resources", "platform", "importlib.metadata")


def _fresh(code: str, timeout: float = 60) -> str:
    """What ``code`` prints in a fresh interpreter that imports this tree's counterd."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=timeout, check=True).stdout


def test_the_env_name_is_machines() -> None:
    assert recording.ENV_MACHINE == ENV_MACHINE


def test_the_record_path_imports_nothing_it_does_not_need_before_exec() -> None:
    """Everything counterd record imports up to the go byte (the CLI, the recorder, the perf
    backend with its tables, a resolved backend), in a fresh interpreter."""
    code = (
        "import sys\n"
        "import counterd.commands.cli, counterd.commands.recording, counterd.backends.perf as p\n"
        "counterd.commands.recording.resolve_command(['true'])\n"
        "p.load_tables()\n"
        f"print(' '.join(m for m in {NOT_BEFORE_EXEC!r} if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV_MACHINE}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60, check=True)
    assert proc.stdout.split() == []


@pytest.mark.parametrize("marks", [False, True])
def test_the_spool_reader_is_loaded_only_for_a_command_that_marked(tmp_path: Path,
                                                                   marks: bool) -> None:
    """A short command that left the spool empty gets its whole-command record without the
    spool's frame decoder being imported; one that marked gets its supersteps' records."""
    prog = tmp_path / "prog.py"
    prog.write_text("import counterd\nwith counterd.superstep('s'):\n    pass\n" if marks
                    else "pass\n")
    code = (
        "import sys\n"
        "from counterd.commands import recording\n"
        "recording.STARTUP_S = 60.0\n"  # the command ends within it however slow the host
        f"r = recording.record([sys.executable, {str(prog)!r}], out=None, backend='none')\n"
        "print(r.exit_code, ' '.join(sorted({x.name for x in r.records})),"
        " 'counterd.wire.spool' in sys.modules, 'counterd.wire.protocol' in sys.modules)\n"
    )
    out = _fresh(code, timeout=120)
    name = "s" if marks else f"{sys.executable} {prog}"
    assert out.split(" ", 1)[0] == "0"
    assert out.rstrip().endswith(f"{name} {marks} {marks}")


@pytest.mark.parametrize("backend", ["callgrind", "none"])
def test_a_recorded_process_writes_frames_without_the_typed_frames(tmp_path: Path,
                                                                    backend: str) -> None:
    """A process of a recorded command (the environment counterd record gives it) writes its
    supersteps' frames to the spool with counterd.wire.framing alone: counterd.wire.protocol's
    typed frames (17 dataclasses compiled at import) are the readers'. Under Callgrind every
    counted process paid them: 68 M of the 279 M instructions from start-up to its first superstep
    (bench/callgrind_startup.py)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    code = ("import sys, counterd\n"
            "with counterd.superstep('s'):\n    pass\n"
            "print('counterd.wire.framing' in sys.modules,"
            " 'counterd.wire.protocol' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env.update(PYTHONPATH=str(ROOT), COUNTERD_BACKEND=backend, COUNTERD_SPOOL=str(spool),
               COUNTERD_INIT="import", COUNTERD_RUN_ID="r", COUNTERD_SOCKET="off")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60, check=True)
    assert proc.stdout.split() == ["True", "False"]
    from counterd.wire.spool_reader import read_events

    (path,) = spool.iterdir()
    assert [e["ev"] for e in read_events(path)] == ["begin", "record"]


def test_a_program_that_feeds_streams_loads_no_simulator() -> None:
    """``from counterd.sim import StridedStream`` (examples/bsp_sum.py, for the sim backend)
    loads the streams alone: the simulators and the machine description come with their
    first use, as every name the package offers does."""
    code = ("import sys\n"
            "from counterd.sim import StridedStream\n"
            "print(' '.join(m for m in ('counterd.sim.coherence', 'counterd.sim.engines',"
            " 'counterd.machine') if m in sys.modules))\n"
            "import counterd.sim as sim\n"
            "print(all(getattr(sim, name) is not None for name in sim.__all__))\n")
    assert _fresh(code).split("\n")[:2] == ["", "True"]


def _record(tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
            cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "show.py"
    script.write_text("import json, os\nprint(json.dumps(os.environ.get('COUNTERD_MACHINE')))\n")
    return subprocess.run(
        [sys.executable, "-m", "counterd.commands.cli", "record", "--backend", "none", *extra,
         "--out",
         str(tmp_path / "r.jsonl"), "--", sys.executable, str(script)],
        capture_output=True, text=True, cwd=cwd, timeout=120,
        env={**{k: v for k, v in os.environ.items() if k != ENV_MACHINE},
             "PYTHONPATH": str(ROOT), **(env or {})})


def _machine_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.toml"
    path.write_text('format = "counterd-machine"\nversion = 1\npage_bytes = 4096\n')
    return path


def test_a_machine_file_reaches_the_command(tmp_path: Path) -> None:
    path = _machine_file(tmp_path)
    proc = _record(tmp_path, "--machine", str(path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == str(path)
    # A relative COUNTERD_MACHINE reaches it as an absolute path.
    proc = _record(tmp_path, env={ENV_MACHINE: "m.toml"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == str(path)
    proc = _record(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) is None


@pytest.mark.parametrize("how", ["option", "env"])
def test_a_bad_machine_file_is_exit_2_before_the_command_runs(tmp_path: Path, how: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('format = "counterd-machine"\nversion = 1\npage_bytes = 3000\n')
    proc = (_record(tmp_path, "--machine", str(bad)) if how == "option" else
            _record(tmp_path, env={ENV_MACHINE: str(bad)}))
    assert proc.returncode == 2, proc.stderr
    assert "bad.toml" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "r.jsonl").exists()


def test_record_in_process_uses_the_machine_a_caller_set(tmp_path: Path) -> None:
    """machine.using without a file: nothing to export; with one: exported, as before."""
    path = _machine_file(tmp_path)
    out = tmp_path / "r.jsonl"
    script = tmp_path / "show.py"
    script.write_text("import os, sys\n"
                      "sys.exit(0 if os.environ.get('COUNTERD_MACHINE') == sys.argv[1] else 5)\n")
    with machine.using(path):
        result = recording.record([sys.executable, str(script), str(path)], out=out,
                                  backend="none")
    assert result.exit_code == 0
    assert len(list(read_jsonl(out))) == 1


# The plain form of counterd record's command line, read without argparse (cli._plain_record):
# it must read what argparse reads.
PLAIN = [
    ["record", "--out", "r.jsonl", "--", "true"],
    ["record", "--out=r.jsonl", "--backend", "perf", "--", "python", "-c", "pass", "--out", "x"],
    ["record", "--backend=none", "--events", "task_clock_ns,page_faults", "--json", "--out",
     "o", "--machine", "m.toml", "--cpu-features", "as-counted", "--sample", "50us:10", "--",
     "a", "b"],
    ["record", "--events=", "--out", "o", "--", "--not-an-option-of-ours"],
]
NOT_PLAIN = [
    ["record", "--help"], ["record", "-h", "--", "x"], ["record", "--out", "o"],
    ["record", "--out", "o", "--"], ["record", "--", "true"],  # --out is required
    ["record", "--ou", "o", "--", "true"],  # argparse would take the abbreviation
    ["record", "--out", "o", "--out", "p", "--", "true"],  # given twice
    ["record", "--out", "-o", "--", "true"],  # argparse: expected one argument
    ["record", "--json=yes", "--out", "o", "--", "true"],
    ["record", "--cpu-features", "fast", "--out", "o", "--", "true"],  # not a choice
    ["record", "--out", "o", "stray", "--", "true"], ["report", "--", "x"], [],
]


@pytest.mark.parametrize("argv", PLAIN, ids=lambda a: " ".join(a)[:60])
def test_the_plain_record_command_line_reads_as_argparse_reads_it(argv: list[str]) -> None:
    from counterd.commands import cli, cli_options

    plain = cli._plain_record(argv)
    assert plain is not None
    parsed = vars(cli_options.parser("record").parse_args(argv))
    parsed = {k: (str(v) if k in ("out", "machine") and v is not None else v)
              for k, v in parsed.items()}
    assert vars(plain) == parsed


@pytest.mark.parametrize("argv", NOT_PLAIN, ids=lambda a: " ".join(a)[:60] or "(none)")
def test_every_other_command_line_is_left_to_argparse(argv: list[str]) -> None:
    from counterd.commands import cli

    assert cli._plain_record(argv) is None


def test_the_plain_reader_knows_every_record_option_and_default() -> None:
    from counterd.commands import cli, cli_options

    sub = next(a for a in cli_options.parser("record")._actions if a.dest == "command")
    record = sub.choices["record"]  # type: ignore[index]
    options = {a.option_strings[-1]: a for a in record._actions if a.option_strings}
    options.pop("--help")
    assert set(options) == set(cli._RECORD_VALUES) | set(cli._RECORD_FLAGS)
    assert {o: options[o].default for o in cli._RECORD_VALUES} == cli._RECORD_VALUES
    assert all(options[f].default is False for f in cli._RECORD_FLAGS)


@pytest.mark.parametrize("script, code", [("exit 3", 3), ("kill -9 $$", 128 + 9)])
def test_record_ends_with_the_commands_exit_status_and_its_summary(tmp_path: Path,
                                                                   script: str,
                                                                   code: int) -> None:
    """counterd record leaves without the interpreter's teardown (cli.console): the command's
    status and the summary on stderr still come out."""
    proc = subprocess.run(
        [sys.executable, "-m", "counterd.commands.cli", "record", "--backend", "none", "--out",
         str(tmp_path / "r.jsonl"), "--", "sh", "-c", script],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == code
    assert proc.stderr.startswith("counterd: 1 records (") and proc.stderr.endswith("\n")
    assert len(list(read_jsonl(tmp_path / "r.jsonl"))) == 1


def test_the_report_package_loads_its_model_and_renderers_on_first_use() -> None:
    """``counterd report --central`` and ``--records`` across nodes need counterd.report.nodes
    only: importing the package loads neither the report model nor the HTML page (with
    statistics, fractions and decimal); every name it offers still comes when asked for."""
    code = ("import sys\n"
            "import counterd.report.nodes\n"
            "print(' '.join(m for m in ('counterd.report.model', 'counterd.report.html',"
            " 'counterd.report.text', 'counterd.prediction', 'statistics') if m in sys.modules))\n"
            "import counterd.report as r\n"
            "from counterd.report import build, render_runs\n"
            "from counterd.report.model import build as b\n"
            "print(build is b, all(getattr(r, n) is not None for n in r.__all__),"
            " r.render_html.__module__)\n")
    assert _fresh(code).split("\n")[:2] == ["", "True True counterd.report.html"]
