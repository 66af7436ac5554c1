"""The marker API: records, flags, SPMD processes with barriers, crashes mid-superstep."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

import counterd
from counterd.markers import native
from counterd.markers.api import configure
from counterd.markers.recorder import Recorder
from counterd.markers.sinks import SpoolSink
from counterd.wire.spool_reader import collect as collect_spool


@pytest.fixture
def mem_recorder() -> Recorder:
    return configure(backend="none", run_id="t-run")


def test_records_have_fields_and_increasing_indices(mem_recorder: Recorder, one_cpu: int) -> None:
    with counterd.superstep("a", n=10):
        time.sleep(0.002)
    with counterd.superstep("b", n=20):
        pass
    recs = counterd.records()
    assert [r.name for r in recs] == ["a", "b"]
    assert [r.index for r in recs] == [0, 1]
    assert recs[0].params == {"n": 10}
    assert recs[0].run_id == "t-run"
    assert recs[0].pid == os.getpid()
    assert recs[0].duration_ns is not None and recs[0].duration_ns >= 2_000_000
    assert recs[0].end_ns is not None and recs[1].begin_ns >= recs[0].end_ns
    assert recs[0].flags == frozenset()
    assert recs[0].cpu == one_cpu


def test_a_move_to_another_cpu_between_the_markers_is_flagged(mem_recorder: Recorder) -> None:
    before = sorted(os.sched_getaffinity(0))
    if len(before) < 2:
        pytest.skip("one CPU in this process's affinity: no other CPU to move to")
    try:
        os.sched_setaffinity(0, {before[0]})
        with counterd.superstep("moved"):
            os.sched_setaffinity(0, {before[1]})  # the kernel moves the thread before returning
        with counterd.superstep("stayed"):
            pass
    finally:
        os.sched_setaffinity(0, set(before))
    moved, stayed = counterd.records()
    assert moved.flags == frozenset({"migrated"})
    assert stayed.flags == frozenset() and stayed.cpu == before[1]


def test_exception_nested_and_unmatched_are_flagged(mem_recorder: Recorder) -> None:
    with pytest.raises(ZeroDivisionError), counterd.superstep("boom"):
        1 / 0  # noqa: B018
    with counterd.superstep("outer"), counterd.superstep("inner"):
        pass
    counterd.end(name="stray")
    by_name = {r.name: r for r in counterd.records()}
    assert "exception" in by_name["boom"].flags
    assert "nested" in by_name["inner"].flags
    assert "nested" not in by_name["outer"].flags
    assert by_name["stray"].flags == frozenset({"unmatched_end"})


def test_open_steps_become_incomplete_records(mem_recorder: Recorder) -> None:
    counterd.begin("left open")
    closed = mem_recorder.close_open_steps()
    assert len(closed) == 1
    rec = closed[0]
    assert rec.end_ns is None and "incomplete" in rec.flags
    assert rec in counterd.records()


def _spmd_worker(rank: int, spool: str, barrier: mp.synchronize.Barrier, steps: int) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})  # pinned, as SPMD workers are: no migration
    configure(backend="none", spool=Path(spool), run_id="spmd")
    counterd.set_rank(rank)
    for k in range(steps):
        barrier.wait()
        with counterd.superstep(f"step{k}", k=k):
            time.sleep(0.001 * (rank + 1))
    barrier.wait()


def test_two_process_spmd_with_barriers(tmp_path: Path) -> None:
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    steps = 4
    procs = [ctx.Process(target=_spmd_worker, args=(r, str(tmp_path), barrier, steps))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    recs = list(collect_spool(tmp_path))
    assert len(recs) == 2 * steps
    assert {(r.rank, r.index) for r in recs} == {(rank, k) for rank in (0, 1) for k in range(steps)}
    assert len({r.pid for r in recs}) == 2
    for k in range(steps - 1):
        ends = [r.end_ns for r in recs if r.index == k]
        begins_next = [r.begin_ns for r in recs if r.index == k + 1]
        # The barrier between supersteps: no processor begins k+1 before all ended k.
        assert min(begins_next) >= max(e for e in ends if e is not None)
    assert all(not r.flags for r in recs)


def _dies_inside(spool: str, how: str) -> None:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # no move between the markers
    configure(backend="none", spool=Path(spool), run_id="crash")
    with counterd.superstep("ok"):
        pass
    counterd.begin("dies here", n=5)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_process_dying_mid_superstep_gives_incomplete_record(tmp_path: Path, how: str) -> None:
    p = mp.get_context("fork").Process(target=_dies_inside, args=(str(tmp_path), how))
    p.start()
    p.join(30)
    assert p.exitcode == (-signal.SIGKILL if how == "kill" else 3)
    recs = sorted(collect_spool(tmp_path), key=lambda r: r.index)
    assert [r.name for r in recs] == ["ok", "dies here"]
    assert recs[0].flags == frozenset()
    assert recs[1].end_ns is None
    assert recs[1].flags == frozenset({"incomplete"})
    assert recs[1].params == {"n": 5}


def test_forked_child_gets_its_own_recorder(tmp_path: Path) -> None:
    parent = configure(backend="none", spool=tmp_path, run_id="fork")
    with counterd.superstep("parent"):
        pass

    def child() -> None:
        with counterd.superstep("child"):
            pass
        os._exit(0)

    p = mp.get_context("fork").Process(target=child)
    p.start()
    p.join(30)
    assert p.exitcode == 0
    recs = list(collect_spool(tmp_path))
    pids = {r.name: r.pid for r in recs}
    assert pids["parent"] == os.getpid() and pids["child"] != os.getpid()
    assert {r.run_id for r in recs} == {"fork"}
    assert isinstance(parent.sink, SpoolSink)


def test_rank_from_mpi_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "5")
    rec = configure(backend="none")
    assert rec.rank() == 5
    rec.set_rank(2)
    assert rec.rank() == 2


def test_unknown_marker_backend_is_bad_input() -> None:
    from counterd.data.errors import BadInput

    with pytest.raises(BadInput, match="unknown marker backend"):
        configure(backend="nope")


def _run_without_recorder(cmd: list[str], spool: Path) -> list[str]:
    """Run ``cmd`` with a spool but no run id, as a program started by hand (not by
    ``counterd record``); return the run ids of its records."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env.update(COUNTERD_SPOOL=str(spool), COUNTERD_BACKEND="none", COUNTERD_SOCKET="off")
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root)
    subprocess.run(cmd, env=env, check=True, timeout=120, cwd=root)
    return [r.run_id for r in collect_spool(spool)]


def test_workers_of_one_program_share_a_run_id(tmp_path: Path) -> None:
    import sys

    ids = _run_without_recorder([sys.executable, "examples/bsp_sum.py", "100000", "2"],
                                tmp_path)
    assert len(ids) == 6  # 3 supersteps x 2 processors
    assert len(set(ids)) == 1


def test_mpi_ranks_of_one_launch_share_a_run_id(tmp_path: Path) -> None:
    import sys

    pytest.importorskip("mpi4py", reason="mpi4py is in the [test] extra; install it")
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("no mpiexec beside this python (the mpich wheel provides it)")
    ids = _run_without_recorder([str(mpiexec), "-n", "2", sys.executable,
                                 "examples/bsp_mpi.py", "10000"], tmp_path)
    assert len(ids) == 4
    # hydra's proxies carry mpiexec's --control-port: the job-wide id (counterd.data.jobid)
    assert len(set(ids)) == 1 and ids[0].startswith("hydra-")


def test_simulation_of_fed_streams_is_not_part_of_the_superstep_time() -> None:
    from counterd.sim import StridedStream

    configure(backend="sim", events=("loads", "l1d_misses"), run_id="sim-time")
    n = 4_000_000  # about 0.2 s of simulation with the native engine, far more in Python
    with counterd.superstep("declared") as step:
        step.feed(StridedStream(1 << 30, n, 64, "load"))
    (rec,) = counterd.records()
    assert rec.counters["loads"].value == n
    assert rec.counters["loads"].source.value == "simulated"
    assert rec.counters["l1d_misses"].value == n  # one line per access, cold cache
    assert rec.duration_ns is not None and rec.duration_ns < 20_000_000


def test_a_superstep_without_a_declared_stream_has_no_sim_counters_never_zeros() -> None:
    from counterd.backends.sim import NO_STREAM_REASON
    from counterd.sim import StridedStream

    configure(backend="sim", events=("loads", "stores", "l1d_misses"), run_id="sim-none")
    with counterd.superstep("undeclared"):
        sum(range(1000))
    with counterd.superstep("declared") as step:
        step.feed(StridedStream(1 << 30, 100, 8, "store"))
    undeclared, declared = counterd.records()
    assert undeclared.counters == {}
    assert undeclared.unsupported == {c: NO_STREAM_REASON
                                      for c in ("loads", "stores", "l1d_misses")}
    assert "unsupported_counters" in undeclared.flags
    assert declared.counters["stores"].value == 100 and declared.counters["loads"].value == 0
    assert declared.unsupported == {} and "unsupported_counters" not in declared.flags


def test_a_stream_fed_between_supersteps_warms_the_simulated_caches_and_counts_nowhere() -> None:
    """counterd.feed outside a superstep (a first touch before the first barrier): the next
    superstep finds its lines in the simulated cache, as the real one would, and no record
    counts the touch; inside a superstep counterd.feed is that superstep's."""
    from counterd.sim import StridedStream

    configure(backend="sim", events=("loads", "stores", "l1d_misses"), run_id="sim-between")
    lines = 64  # 4 KiB: in any L1d
    counterd.feed(StridedStream(1 << 30, lines, 64, "store"))  # the first touch
    with counterd.superstep("warm"):
        counterd.feed(StridedStream(1 << 30, lines, 64, "load"))
    with counterd.superstep("cold") as step:
        step.feed(StridedStream(1 << 31, lines, 64, "load"))
    warm, cold = counterd.records()
    assert warm.counters["loads"].value == lines and warm.counters["stores"].value == 0
    assert warm.counters["l1d_misses"].value == 0
    assert cold.counters["l1d_misses"].value == lines  # never touched: every line misses


def test_feed_is_a_no_op_for_backends_that_count_real_hardware(mem_recorder: Recorder) -> None:
    from counterd.sim import StridedStream

    counterd.feed(StridedStream(1 << 30, 8, 64, "load"))
    with counterd.superstep("s") as step:
        counterd.feed(StridedStream(1 << 30, 8, 64, "load"))
    assert step.streams == []
    assert [r.name for r in counterd.records()] == ["s"]


class _KnownGroup:
    """A counter group whose readings are known: ``loads`` grows by 1000 per read and ran
    half of the time (multiplexed), ``sim_x`` is simulated and grows by 7."""

    events = ("loads", "sim_x")

    def __init__(self) -> None:
        self.reads = 0

    def read(self):  # type: ignore[no-untyped-def]
        from counterd.backends.base import CounterValue, Reading
        from counterd.data.events import Source

        self.reads += 1
        n = self.reads
        return Reading({"loads": CounterValue(2000.0 * n, Source.MEASURED, 0.5, 1000 * n),
                        "sim_x": CounterValue(7.0 * n, Source.SIMULATED, 1.0, None)},
                       time_enabled_ns=200 * n, time_running_ns=100 * n,
                       unsupported={"l2_misses": "not on this host"})


def test_lazy_records_equal_the_records_built_at_the_end_marker(mem_recorder: Recorder) -> None:
    st = mem_recorder._state()
    st.group = _KnownGroup()  # type: ignore[assignment]
    st.read = st.group.read  # a group without read_raw: Readings, decoded by Reading.delta
    st.lane = None  # the Python path, which reads groups of any kind
    native.invalidate()
    with counterd.superstep("a", n=1):
        pass
    step = counterd.begin("b")
    eager = counterd.end(step)  # end() builds the record now; the sink holds the step
    with pytest.raises(ZeroDivisionError), counterd.superstep("c"):
        1 / 0  # noqa: B018
    lazy = counterd.records()
    assert [r.name for r in lazy] == ["a", "b", "c"]
    assert lazy[1] == eager and lazy[1] is eager  # built once, then shared
    a = lazy[0]
    # Known answer: per superstep, 1000 raw loads over a span enabled 200 ns, running 100 ns.
    assert a.counters["loads"].raw == 1000
    assert a.counters["loads"].value == pytest.approx(2000.0, rel=1e-12)
    assert a.counters["loads"].ratio == pytest.approx(0.5, rel=1e-12)
    assert a.counters["sim_x"].value == pytest.approx(7.0, rel=1e-12)
    assert a.counters["sim_x"].raw is None
    assert a.params == {"n": 1} and a.unsupported == {"l2_misses": "not on this host"}
    assert {"multiplexed", "unsupported_counters"} <= a.flags
    assert "exception" in lazy[2].flags
    # A second read gives the same (already built) records.
    assert counterd.records() == lazy
    # The record round-trips through the JSON format unchanged.
    from counterd.data.records import SuperstepRecord

    assert SuperstepRecord.from_json(a.to_json()) == a


def test_pid_cache_follows_fork(tmp_path: Path) -> None:
    import importlib

    identity = importlib.import_module("counterd.markers.identity")
    assert identity.pid == os.getpid()
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        os.write(w, str(identity.pid).encode())
        os._exit(0)
    os.close(w)
    got = int(os.read(r, 64))
    os.close(r)
    os.waitpid(child, 0)
    assert got == child != os.getpid()


@pytest.mark.parametrize("env, said", [({}, True), ({"COUNTERD_SOCKET": "off"}, False)])
def test_records_nobody_keeps_are_said_once(env: dict[str, str], said: bool) -> None:
    """No counterd record around the program and no daemon: the markers keep records in memory
    only, and say so once (processor 0, at its first superstep), not silently."""
    import subprocess
    import sys

    from counterd.daemon.config import default_socket_path

    if default_socket_path().exists():
        pytest.skip("a daemon listens at the default socket here")
    base = {k: v for k, v in __import__("os").environ.items() if not k.startswith("COUNTERD_")}
    code = ("import counterd\nfor r in range(3):\n    with counterd.superstep('s'):\n        pass\n"
            "import multiprocessing as mp\n"
            "def w(k):\n    counterd.set_rank(k)\n    with counterd.superstep('t'):\n        pass\n"
            "if __name__ == '__main__':\n"
            "    ps = [mp.get_context('fork').Process(target=w, args=(k,)) for k in (1, 2)]\n"
            "    [p.start() for p in ps]; [p.join() for p in ps]\n")
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("kept in this process's memory only") == (1 if said else 0), \
        out.stderr


def _identity_in_worker(_: int) -> tuple[int, str]:
    from counterd.markers import identity

    return identity.auto_rank(), identity.default_run_id()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pool_workers_take_their_rank_and_the_parents_run_id(method: str) -> None:
    # identity looks multiprocessing up only where the program has loaded it (a worker always
    # has): the workers still find their 1-based identity and their parent's run id.
    import subprocess
    import sys

    from counterd.markers import identity

    with mp.get_context(method).Pool(2) as pool:
        got = pool.map(_identity_in_worker, range(8), chunksize=1)
    # (each pool of a process numbers its workers on from the last pool's)
    assert 1 <= len({rank for rank, _ in got}) <= 2 and all(rank >= 1 for rank, _ in got)
    assert {run for _, run in got} == {identity.default_run_id()}
    # A program that never loads multiprocessing is rank 0 of a run of its own.
    code = ("import sys; from counterd.markers import identity; "
            "print(identity.auto_rank(), 'multiprocessing' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COUNTERD_", "OMPI_",
                                                                      "PMI_", "SLURM_"))}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True, timeout=60)
    assert out.stdout.split() == ["0", "False"]
