"""No start skew of counterd's making: every process sets its markers up before its first
barrier, so a first superstep begins as evenly as a second one (issue: Superstep time).

A program (tests/counterd/skew_program.py) with N processes, a barrier, an empty superstep, a
barrier and another empty superstep, recorded by ``counterd record`` with perf software events
(the markers open counters, calibrate their own cost and open their spool file: what used to
land in the first superstep, 4-45 ms of skew against 0.02-0.7 ms for the second). Over repeated
rounds of fresh processes, the first superstep's start skew must stay within 3x the second's
plus half a millisecond (the median over rounds: one round's barrier release on an
oversubscribed 2-CPU host can be late for either superstep alike). A configuration that misses
is measured once more, and must hold then: a first superstep that pays counterd's own set-up
misses every time (26-195 ms medians against 0.2-6 ms before the set-up moved out of it, on a
2-CPU guest), while the host's scheduler can cost one measurement a tick (4 ms) of a worker
that is not on a CPU when the barrier releases it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from counterd.data.records import read_jsonl
from tests.counterd.skew_program import skews

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(__file__).with_name("skew_program.py")
SLACK_NS = 500_000
ROUNDS = 7


def _perf_usable() -> str | None:
    from counterd import backends

    res = backends.resolve("perf", "markers")
    return None if res.backend is not None else res.reason


# Where the recorded programs keep their bytecode (set once per module): a process imports
# counterd compiled, as from an installed copy. With PYTHONDONTWRITEBYTECODE in the test's
# environment a module edited since its last compile was compiled anew in every spawned worker
# before its first barrier (tens of milliseconds of CPU that a loaded host's scheduler then
# charges at the barrier's release).
_PYCACHE: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _bytecode(tmp_path_factory: pytest.TempPathFactory) -> None:
    _PYCACHE[:] = [tmp_path_factory.mktemp("pycache")]


def _record(cmd: list[str], out: Path, env_init: str | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env["COUNTERD_SOCKET"] = "off"
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if _PYCACHE:
        env["PYTHONPYCACHEPREFIX"] = str(_PYCACHE[0])
    if env_init is not None:
        env["COUNTERD_INIT"] = env_init
    subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record", "--backend", "perf",
                    "--out", str(out), "--", *cmd], env=env, cwd=ROOT, check=True,
                   timeout=300, capture_output=True)


def _miss(pairs: list[tuple[int, int]], what: str) -> str | None:
    """Why ``pairs`` (first, second start skews over rounds) miss the bound, or None."""
    first = statistics.median(p[0] for p in pairs)
    second = statistics.median(p[1] for p in pairs)
    shown = ", ".join(f"{a / 1e6:.3f}/{b / 1e6:.3f}" for a, b in pairs)
    if first <= 3 * second + SLACK_NS:
        return None
    return (f"{what}: first superstep's start skew (median {first / 1e6:.3f} ms) over 3x the "
            f"second's ({second / 1e6:.3f} ms) + {SLACK_NS / 1e6} ms; rounds first/second: "
            f"{shown}")


def _check(measure: Callable[[], list[tuple[int, int]]], what: str) -> None:
    """The bound holds on a measurement, or on the one made after it missed."""
    first = _miss(measure(), what)
    if first is not None:
        again = _miss(measure(), what)
        assert again is None, f"{first}; and again: {again}"


@pytest.fixture(scope="module", autouse=True)
def _perf() -> None:
    why = _perf_usable()
    if why is not None:
        pytest.skip(f"perf software events unavailable here: {why}")


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("how", ["fork", "spawn"])
def test_multiprocessing_first_superstep_begins_as_evenly_as_the_second(
        tmp_path: Path, how: str, n: int) -> None:
    def measure() -> list[tuple[int, int]]:
        out = tmp_path / "run.jsonl"
        out.unlink(missing_ok=True)
        _record([sys.executable, str(PROGRAM), how, str(n), str(ROUNDS)], out)
        recs = list(read_jsonl(out))
        assert len(recs) == 2 * n * ROUNDS
        for k in range(ROUNDS):  # each worker its own rank, found after its bootstrap
            assert len({r.rank for r in recs
                        if r.params["round"] == k and r.name == "first"}) == n
        pairs = list(skews(recs).values())
        assert len(pairs) == ROUNDS
        return pairs

    _check(measure, f"{how}, {n} processes")


@pytest.mark.parametrize("n", [2, 4])
def test_mpi_ranks_first_superstep_begins_as_evenly_as_the_second(tmp_path: Path,
                                                                  n: int) -> None:
    pytest.importorskip("mpi4py", reason="mpi4py is in the [test] extra; install it")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("no mpiexec beside this python (the mpich wheel provides it)")
    def measure() -> list[tuple[int, int]]:
        pairs = []
        for k in range(3):  # one round per launch: a launch takes about a second
            out = tmp_path / f"mpi{k}.jsonl"
            out.unlink(missing_ok=True)
            _record([str(mpiexec), "-n", str(n), sys.executable, str(PROGRAM), "mpi"], out)
            recs = list(read_jsonl(out))
            assert sorted(r.rank for r in recs if r.name == "first") == list(range(n))
            pairs += list(skews(recs).values())
        return pairs

    _check(measure, f"MPI, {n} ranks")


def test_an_explicit_init_serves_a_program_the_recorder_does_not_set_up(tmp_path: Path) -> None:
    """With the import-time set-up off, ``counterd.init()`` in each process before its first
    barrier (what the README shows for programs outside ``counterd record``) does the same."""
    def measure() -> list[tuple[int, int]]:
        out = tmp_path / "run.jsonl"
        out.unlink(missing_ok=True)
        _record([sys.executable, str(PROGRAM), "spawn", "2", str(ROUNDS), "--init"], out,
                env_init="first")
        pairs = list(skews(read_jsonl(out)).values())
        assert len(pairs) == ROUNDS
        return pairs

    _check(measure, "spawn, 2 processes, counterd.init()")


def test_init_does_before_the_first_superstep_what_it_would_do_inside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from counterd import markers
    from counterd.markers import api
    from counterd.markers.recorder import Recorder

    calibrations: list[int] = []
    real = Recorder.calibrate
    monkeypatch.setattr(Recorder, "calibrate",
                        lambda self, st=None: calibrations.append(1) or real(self, st))
    rec = api.configure(backend="none", spool=tmp_path, socket="off")
    assert not rec.prepared and getattr(rec._local, "st", None) is None
    markers.init()
    assert rec.prepared and calibrations == [1] and rec._marker_ns is not None
    st = rec._local.st
    assert any(tmp_path.iterdir()), "the spool file is made by init, not by the first marker"
    with markers.superstep("first"):
        pass
    assert calibrations == [1] and rec._local.st is st  # nothing set up inside the superstep
    markers.init()  # again: nothing more
    assert calibrations == [1]


def test_a_child_forked_from_a_prepared_process_is_prepared_at_the_fork(tmp_path: Path) -> None:
    from counterd import markers
    from counterd.markers import api

    parent = api.configure(backend="none", spool=tmp_path, socket="off")
    markers.init()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its recorder exists before it marks anything
        try:
            child = api._recorder
            ok = (child is not None and child is not parent and child.pid == os.getpid()
                  and child.prepared and getattr(child._local, "st", None) is not None
                  and child._marker_ns == parent._marker_ns and not child._calibrate)
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1"
    os.close(r)
    assert (tmp_path / f"{pid}.frames").exists() or any(
        str(pid) in p.name for p in tmp_path.iterdir())


def test_a_configure_after_init_keeps_the_process_prepared(tmp_path: Path) -> None:
    from counterd import markers
    from counterd.markers import api

    api.configure(backend="none", socket="off")
    markers.init()
    again = api.configure(backend="none", spool=tmp_path, socket="off")
    assert again.prepared and getattr(again._local, "st", None) is not None


@pytest.mark.parametrize("value, prepared", [("import", True), ("first", False), (None, False)])
def test_counterd_init_import_prepares_at_import_and_only_then(tmp_path: Path, value: str | None,
                                                               prepared: bool) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env.update(PYTHONPATH=str(ROOT), COUNTERD_BACKEND="none", COUNTERD_SOCKET="off",
               COUNTERD_SPOOL=str(tmp_path))
    if value is not None:
        env["COUNTERD_INIT"] = value
    probe = ("import counterd, sys; from counterd.markers import api; "
             "r = api._recorder; print(r is not None and r.prepared)")
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == str(prepared)



# A process's first superstep runs no more marker code than its tenth: whatever a first begin
# did besides (the package's look-up of the marker API, a begin through the Python recorder
# to find a worker's rank or its lane again) cost tens of microseconds after the barrier, in
# which a process descheduled on a busy host begins late (bench/first_marker.py).

@pytest.fixture
def python_begins() -> Iterator[list[str]]:
    """The names of supersteps that ``counterd.superstep`` hands to the Python recorder (not
    to this thread's compiled lane) while the test runs; skips where there is no compiled
    path."""
    from counterd.markers import api, native

    hot = native.module()
    if hot is None:
        pytest.skip("the compiled hot path is not built (no C compiler?)")
    calls: list[str] = []

    def counting(name: str, params: dict[str, Any]) -> Any:
        calls.append(name)
        return api._begin(name, params)

    hot.set_fallback(counting)
    try:
        yield calls
    finally:
        hot.set_fallback(api._begin)


def test_the_marker_api_is_bound_in_the_package_when_any_of_it_is_first_used() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env.update(PYTHONPATH=str(ROOT), COUNTERD_BACKEND="none", COUNTERD_SOCKET="off")
    probe = ("import counterd; names = ('superstep', 'begin', 'end', 'set_rank', 'init'); "
             "print(any(n in vars(counterd) for n in names)); counterd.init; "
             "print(all(n in vars(counterd) for n in names))")
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"]
    env["COUNTERD_INIT"] = "import"
    out = subprocess.run([sys.executable, "-c", "import counterd; print('superstep' in "
                          "vars(counterd))"], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True"


def test_a_freed_lane_that_was_never_current_leaves_the_current_one(
        tmp_path: Path, python_begins: list[str]) -> None:
    """init() calibrates through a scratch recorder whose lane is freed at a later garbage
    collection: that used to send the next ``superstep()`` of every thread through Python to
    find its lane again (the first superstep, after the barrier)."""
    import gc

    import counterd
    from counterd import markers
    from counterd.markers import api

    api.configure(backend="none", spool=tmp_path, socket="off")
    markers.init()
    gc.collect()  # the calibration's recorder and its lane go
    with counterd.superstep("first"):
        pass
    assert python_begins == []


def test_a_deferred_rank_is_read_by_the_lane_at_its_first_begin(
        monkeypatch: pytest.MonkeyPatch, python_begins: list[str]) -> None:
    """A spawned worker is set up before its bootstrap gives it its identity: its lane reads
    the identity at its first begin, in compiled code, and the recorder agrees."""
    import multiprocessing

    import counterd
    from counterd import markers
    from counterd.data.env import ENV_RANK, MPI_RANK_VARS
    from counterd.markers import api

    for var in (ENV_RANK, *MPI_RANK_VARS):
        monkeypatch.delenv(var, raising=False)
    rec = api.configure(backend="none", socket="off")
    markers.init()
    rec.defer_rank()  # at the worker's import: no identity yet
    monkeypatch.setattr(multiprocessing.current_process(), "_identity", (3,))  # its bootstrap
    with counterd.superstep("first") as step:
        pass
    assert python_begins == [] and step.rank == 3 and rec.rank() == 3
    assert [r.rank for r in api.records()] == [3]


def test_a_rank_the_environment_gives_is_not_deferred(monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    from counterd import markers
    from counterd.data.env import ENV_RANK
    from counterd.markers import api

    monkeypatch.setenv(ENV_RANK, "5")
    rec = api.configure(backend="none", socket="off")
    markers.init()
    rec.defer_rank()
    monkeypatch.setattr(multiprocessing.current_process(), "_identity", (3,))
    assert not rec._rank_pending and rec.rank() == 5


def _report_rank(conn: Any) -> None:
    from counterd.markers import api

    rec = api._recorder
    conn.send((rec is not None and rec._rank_pending, rec.rank() if rec else None))


def test_a_forked_worker_finds_its_rank_in_its_bootstrap_before_its_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import multiprocessing

    from counterd import markers
    from counterd.data.env import ENV_RANK, MPI_RANK_VARS
    from counterd.markers import api

    for var in (ENV_RANK, *MPI_RANK_VARS):
        monkeypatch.delenv(var, raising=False)
    api.configure(backend="none", spool=tmp_path, socket="off")
    markers.init()
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_report_rank, args=(there,))
    proc.start()
    pending, rank = here.recv()
    proc.join(60)
    assert proc.exitcode == 0
    assert (pending, rank) == (False, proc._identity[0])


def test_init_reads_the_counters_once_so_the_first_superstep_does_not_build_them() -> None:
    """The sim backend builds its counts at a group's first read (a forked child's first
    superstep also touched the group's pages there): init() takes that read."""
    from counterd import markers
    from counterd.markers import api

    rec = api.configure(backend="sim", socket="off")
    markers.init()
    group = rec._local.st.group
    assert group is not None and group._last is not None
    reading = group._last[1]
    with api.superstep("first") as step:
        pass
    assert group._last[1] is reading and step.start[1] is reading
