"""counterd.launch: the way to a recorded command's exec, and the perf plan kept for it
(issue 13, item 4: counterd record starts fast)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from counterd import _native, launch, perf_abi
from counterd.backends.perf import PerfBackend
from counterd.commands.recording import record
from counterd.data.env import ENV_NATIVE
from counterd.data.events import CounterValue, Source, measured
from counterd.data.records import read_jsonl
from counterd.machine.files import ENV_MACHINE

ROOT = Path(__file__).resolve().parents[2]
KEY = {"boot_id": "b-1", "kernel": "6.18", "paranoid": "2", "uid": "1000", "backend": "x:1:2"}


def _perf_counts() -> bool:
    return PerfBackend().available().supports("task_clock_ns")


needs_perf = pytest.mark.skipif(not _perf_counts(), reason="perf_event_open does not work here")


def _no_such_software_event(attr: bytes) -> bytes:
    """``attr`` (a software event's) with config 999: the kernel has no such event (ENOENT)."""
    return attr[:8] + (999).to_bytes(8, "little") + attr[16:]


def _plan() -> launch.PerfPlan:
    return launch.PerfPlan(["task_clock_ns", "page_faults"], [b"\x01\x02", b"\xff" * 136],
                           {"l1d_misses": "no PMU here — a reason with spaces"})


def test_a_saved_plan_is_the_plan_loaded(tmp_path: Path) -> None:
    path = launch.save_plan(_plan(), str(tmp_path / "d"), KEY)
    assert path == str(tmp_path / "d" / launch.PLAN_FILE)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "d").st_mode) == 0o700
    assert launch.load_plan(str(tmp_path / "d"), KEY) == _plan()
    assert os.listdir(tmp_path / "d") == [launch.PLAN_FILE]  # no temporary file left


@pytest.mark.parametrize("field", sorted(KEY))
def test_a_plan_saved_under_another_key_is_not_loaded(tmp_path: Path, field: str) -> None:
    launch.save_plan(_plan(), str(tmp_path), KEY)
    assert launch.load_plan(str(tmp_path), {**KEY, field: KEY[field] + "x"}) is None


@pytest.mark.parametrize("text", [
    "", "not a plan\n", "counterd-perf-plan 2\n", "counterd-perf-plan 1\nkey\n",
    "counterd-perf-plan 1\nevent task_clock_ns zz\n", "counterd-perf-plan 1\nmystery a b\n",
    "counterd-perf-plan 1\n\xff\xfe\n",
])
def test_a_file_that_is_not_a_plan_is_not_loaded(tmp_path: Path, text: str) -> None:
    (tmp_path / launch.PLAN_FILE).write_bytes(text.encode("latin-1"))
    os.chmod(tmp_path / launch.PLAN_FILE, 0o600)
    assert launch.load_plan(str(tmp_path), KEY) is None


def test_a_plan_others_could_have_written_is_not_loaded(tmp_path: Path) -> None:
    launch.save_plan(_plan(), str(tmp_path / "d"), KEY)
    plan = tmp_path / "d" / launch.PLAN_FILE
    os.chmod(plan, 0o620)  # group-writable: anyone in the group could plant attributes
    assert launch.load_plan(str(tmp_path / "d"), KEY) is None
    os.chmod(plan, 0o600)
    (tmp_path / "e").mkdir()
    os.symlink(plan, tmp_path / "e" / launch.PLAN_FILE)  # a link is not followed
    assert launch.load_plan(str(tmp_path / "e"), KEY) is None
    assert launch.load_plan(str(tmp_path / "d"), KEY) == _plan()


def test_a_plan_with_nowhere_to_go_is_not_saved(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert launch.save_plan(_plan(), str(tmp_path / "file"), KEY) is None
    (tmp_path / "ro").mkdir(mode=0o500)
    if os.access(tmp_path / "ro", os.W_OK):  # root writes anyway
        return
    assert launch.save_plan(_plan(), str(tmp_path / "ro"), KEY) is None
    assert os.listdir(tmp_path / "ro") == []


def test_the_plan_lives_where_xdg_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    monkeypatch.setenv("XDG_CACHE_HOME", "/c")
    assert launch.plan_dir() == "/run/user/7/counterd"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative")  # ignored, as the spec says
    assert launch.plan_dir() == "/c/counterd"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/h")
    assert launch.plan_dir() == "/h/.cache/counterd"


def test_the_key_changes_with_the_perf_backends_files(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "perf"
    shutil.copytree(launch._PERF_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(launch, "_PERF_DIR", str(copy))
    before = launch.plan_key()
    assert before == launch.plan_key()
    assert "events/generic.json" in before["backend"]
    with open(copy / "events" / "generic.json", "a") as f:
        f.write(" ")
    after = launch.plan_key()
    assert after["backend"] != before["backend"]
    assert {k: v for k, v in after.items() if k != "backend"} == {
        k: v for k, v in before.items() if k != "backend"}


def test_which_finds_what_shutil_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "tool", 0o755)
    (tmp_path / "plain").write_text("")
    (tmp_path / "adir").mkdir()
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    for name in ("sh", "true", "tool", "plain", "adir", "no-such-tool-xyz",
                 str(tmp_path / "tool"), str(tmp_path / "plain"), str(tmp_path / "adir")):
        assert launch.which(name) == shutil.which(name), name


def test_spool_dirs_are_private_and_distinct(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    a, b = launch.make_spool_dir(), launch.make_spool_dir()
    assert a != b and os.path.dirname(a) == str(tmp_path)
    assert stat.S_IMODE(os.stat(a).st_mode) == 0o700


@pytest.fixture(params=["compiled", "ctypes"])
def opener(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """perf_event_open(2) through the compiled extension, and through ctypes (its fallback
    where the extension is not built, or with COUNTERD_NATIVE=0)."""
    if request.param == "compiled" and _native.hotpath() is None:
        pytest.skip("the compiled extension is not built")
    if request.param == "ctypes":
        monkeypatch.setenv(ENV_NATIVE, "0")
    monkeypatch.setattr(perf_abi, "_open_event", None)
    return str(request.param)


@needs_perf
def test_a_plan_opens_on_the_waiting_command_and_counts_from_its_exec(opener: str) -> None:
    plan = PerfBackend().whole_command_plan()
    bad = launch.PerfPlan([*plan.events, "short", "bogus"],
                          [*plan.attrs, b"\x00" * 8, _no_such_software_event(plan.attrs[0])],
                          {})
    pid, go = launch.fork_waiting(["sh", "-c", "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done"],
                                  os.environ)
    fds, failed = launch.open_plan(bad, pid)
    os.write(go, b"g")
    os.close(go)
    assert launch.wait(pid) == 0
    assert failed == {"short": errno.EINVAL, "bogus": errno.ENOENT}
    assert len(fds) == len(plan.events)
    values = dict(zip(plan.events, launch.read_plan(fds), strict=True))
    for fd in fds:
        os.close(fd)
    value, enabled, running = values["task_clock_ns"]
    assert value > 0 and enabled == running > 0
    assert measured(value, enabled, running) == CounterValue(float(value), Source.MEASURED,
                                                             1.0, value)
    opened_by = perf_abi._open_event.__code__.co_freevars  # type: ignore[union-attr]
    assert ("hot" in opened_by) == (opener == "compiled") and ("libc" in opened_by) != \
        (opener == "compiled")


@pytest.mark.skipif(_native.hotpath() is None, reason="the compiled extension is not built")
def test_the_extensions_perf_event_open_refuses_an_attr_of_another_size() -> None:
    hot = _native.hotpath()
    for attr in (b"", b"\x00" * 8, (64).to_bytes(4, "little") * 2 + b"\x00" * 64):
        with pytest.raises(OSError) as exc:
            hot.perf_event_open(attr, 0, -1, -1, 8)
        assert exc.value.errno == errno.EINVAL


def test_a_counter_is_scaled_for_the_time_it_was_not_counted() -> None:
    assert measured(1000, 400, 100) == CounterValue(4000.0, Source.MEASURED, 0.25, 1000)
    assert measured(1000, 100, 120) == CounterValue(1000.0, Source.MEASURED, 1.0, 1000)
    assert measured(0, 100, 0) == CounterValue(0.0, Source.MEASURED, 0.0, 0)  # never on
    with pytest.raises(ValueError, match="shorter than 32"):
        launch.parse_single_read(b"\x00" * 24)


def test_a_spool_dir_goes_with_what_it_holds_and_nothing_outside(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    outside = tmp_path / "outside"
    (spool / "sub" / "deeper").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep").write_text("x")
    for name in ("1.frames", "2.jsonl", "sub/a", "sub/deeper/b"):
        (spool / name).write_text("x")
    (spool / "link").symlink_to(outside, target_is_directory=True)
    launch.remove_spool_dir(str(spool))
    assert not spool.exists() and (outside / "keep").read_text() == "x"
    launch.remove_spool_dir(str(spool))  # gone already: nothing to do, no error


def test_a_spool_dir_is_written_once_it_holds_an_entry(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    assert not launch.spool_written(str(spool))  # none: nothing written, no error
    spool.mkdir()
    assert not launch.spool_written(str(spool))
    (spool / "1.frames").write_bytes(b"")
    assert launch.spool_written(str(spool))


@needs_perf
def test_record_with_a_saved_plan_counts_what_it_counts_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first, second = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    assert launch.load_plan() is None
    assert record(["true"], out=first, backend="perf").exit_code == 0
    saved = launch.load_plan()
    assert saved == PerfBackend().whole_command_plan()
    assert record(["true"], out=second, backend="perf").exit_code == 0
    (a,), (b,) = list(read_jsonl(first)), list(read_jsonl(second))
    assert a.flags == b.flags == {"whole_command"}
    assert set(a.counters) == set(b.counters) == set(saved.events)
    assert a.unsupported == b.unsupported == {}


@needs_perf
def test_a_saved_plan_that_no_longer_opens_is_worked_out_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    good = PerfBackend().whole_command_plan()
    launch.save_plan(launch.PerfPlan(["task_clock_ns"],
                                     [_no_such_software_event(good.attrs[0])], {}))
    out = tmp_path / "r.jsonl"
    assert record(["true"], out=out, backend="perf").exit_code == 0
    (rec,) = list(read_jsonl(out))
    assert set(rec.counters) == set(good.events) and rec.unsupported == {}
    assert launch.load_plan() == good  # replaced


@needs_perf
def test_record_with_a_saved_plan_loads_nothing_heavy_before_the_exec(tmp_path: Path) -> None:
    """What ``counterd record`` has imported when it starts the command, with a plan saved
    and no machine file (one is read and checked before the exec, tests/counterd/
    test_startup.py): the standard library's os-level modules and counterd's cli, launch,
    recording, env, errors (and the compiled extension, which opens the counters without
    ctypes)."""
    heavy = ("argparse", "json", "re", "pathlib", "typing", "dataclasses", "shutil", "tempfile",
             "functools", "counterd.data.records", "counterd.backends", "counterd.wire.spool",
             "counterd.wire.protocol", "counterd.markers", "counterd.machine")
    if _native.hotpath() is not None:
        heavy += ("ctypes",)
    code = (
        "import os, sys\n"
        "spawn = os.posix_spawnp\n"
        "def spy(*args, **kwargs):\n"
        f"    print(' '.join(m for m in {heavy!r} if m in sys.modules), flush=True)\n"
        "    return spawn(*args, **kwargs)\n"
        "os.posix_spawnp = spy\n"
        "from counterd.commands.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    env = {**{k: v for k, v in os.environ.items() if k != ENV_MACHINE},
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    argv = ["record", "--backend", "perf", "--out", str(tmp_path / "r.jsonl"), "--", "true"]
    runs = [subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=120) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[1].stderr
    assert runs[1].stdout  # the spy saw the command start
    assert "counterd.backends" in runs[0].stdout.split()  # no plan yet: worked out, then saved
    assert runs[1].stdout.split() == []


@needs_perf
def test_a_plan_for_some_counters_is_not_saved(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "r.jsonl"
    assert record(["true"], out=out, backend="perf", events=["page_faults"]).exit_code == 0
    assert launch.load_plan() is None  # the next recording of every counter works it out
    (rec,) = list(read_jsonl(out))
    assert set(rec.counters) == {"page_faults"}


@needs_perf
def test_a_counter_the_kernel_refuses_on_the_command_is_saved_as_unsupported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real = PerfBackend.whole_command_plan

    def with_a_refused_counter(self: PerfBackend, events: tuple[str, ...] = (),
                               cap: object = None) -> launch.PerfPlan:
        plan = real(self, events)
        refused = _no_such_software_event(plan.attrs[0])
        return launch.PerfPlan([*plan.events, "l1d_misses"], [*plan.attrs, refused], {})

    monkeypatch.setattr(PerfBackend, "whole_command_plan", with_a_refused_counter)
    out = tmp_path / "r.jsonl"
    assert record(["true"], out=out, backend="perf").exit_code == 0
    (rec,) = list(read_jsonl(out))
    assert "l1d_misses" not in rec.counters and "unsupported_counters" in rec.flags
    assert "l1d_misses" in rec.unsupported and rec.unsupported["l1d_misses"]
    saved = launch.load_plan()
    assert saved is not None and "l1d_misses" not in saved.events
    assert saved.unsupported == rec.unsupported  # the next recording opens what opened


@pytest.mark.parametrize("backend", ["perf", "none"])
def test_a_command_that_cannot_be_run_is_exit_127_with_the_reason(
        tmp_path: Path, backend: str, capfd: pytest.CaptureFixture[str]) -> None:
    """Found on PATH but not a program (no #! line): the kernel refuses it (ENOEXEC), as a
    shell would say; no record, and the counters opened for it are closed."""
    if backend == "perf" and not _perf_counts():
        pytest.skip("perf_event_open does not work here")
    bogus = tmp_path / "not-a-program"
    bogus.write_bytes(b"\x00\x01garbage")
    bogus.chmod(0o755)
    before = len(os.listdir("/proc/self/fd"))
    result = record([str(bogus)], out=tmp_path / "r.jsonl", backend=backend)
    assert result.exit_code == 127 and result.records == ()
    assert f"counterd record: cannot run {bogus}: Exec format error" in capfd.readouterr().err
    assert len(os.listdir("/proc/self/fd")) == before


def test_whether_auto_picks_perf_is_kept_with_the_plan(tmp_path: Path) -> None:
    marked = launch.PerfPlan(_plan().events, _plan().attrs, _plan().unsupported, auto=True)
    launch.save_plan(marked, str(tmp_path), KEY)
    assert launch.load_plan(str(tmp_path), KEY) == marked != _plan()


@needs_perf
@pytest.mark.parametrize("auto", [True, False])
def test_backend_auto_uses_a_saved_plan_only_where_auto_picks_perf_on_it_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, auto: bool) -> None:
    """A plan saved where auto picks perf on perf's capability alone (hardware memory
    counters) stands for the resolution; another is not used for auto (here auto would pick
    callgrind or perf's software events depending on valgrind, which the plan does not know)."""
    from counterd.commands import recording

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    plan = PerfBackend().whole_command_plan()
    launch.save_plan(launch.PerfPlan(plan.events, plan.attrs, plan.unsupported, auto=auto))

    def resolved(name: str) -> None:
        raise RuntimeError(f"resolved {name}")

    monkeypatch.setattr(recording, "resolve_backend", resolved)
    out = tmp_path / "r.jsonl"
    if not auto:
        with pytest.raises(RuntimeError, match="resolved auto"):
            record(["true"], out=out, backend="auto")
        return
    result = record(["true"], out=out, backend="auto")
    assert result.exit_code == 0 and result.backend == "perf"
    (rec,) = list(read_jsonl(out))
    assert set(rec.counters) == set(plan.events)


@needs_perf
def test_what_another_thread_starts_meanwhile_is_not_counted(tmp_path: Path) -> None:
    """The counters opened on the recorder pass only to what its own thread creates (perf
    inheritance follows the forking task): a program calling record() from one thread while
    another runs a busy subprocess gets the command's counts alone."""
    import threading

    done = threading.Event()

    def busy() -> None:
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 0.3: pass"], check=True)
        done.set()

    worker = threading.Thread(target=busy)
    worker.start()
    out = tmp_path / "r.jsonl"
    assert record(["sleep", "0.5"], out=out, backend="perf").exit_code == 0
    worker.join()
    assert done.is_set()
    (rec,) = list(read_jsonl(out))
    assert rec.counters["task_clock_ns"].value < 50e6  # sleep's own, not the 300 ms busy loop


def test_wait_exit_returns_at_the_exit_or_the_timeout_and_leaves_the_child_to_wait() -> None:
    import time

    quick = launch.spawn(["sleep", "0.05"], os.environ)
    t0 = time.monotonic()
    assert launch.wait_exit(quick, 30.0)
    assert time.monotonic() - t0 < 10.0
    assert launch.wait(quick) == 0  # not reaped by wait_exit
    slow = launch.spawn(["sleep", "30"], os.environ)
    try:
        t0 = time.monotonic()
        assert not launch.wait_exit(slow, 0.1)
        assert time.monotonic() - t0 >= 0.09
    finally:
        os.kill(slow, 9)
        assert launch.wait(slow) == -9
