"""The mapped marker spool: binary OPEN/CLOSE frames in a shared file mapping, no system call
per marker; records equal to the in-memory ones; growth past a chunk; threads; a process
killed anywhere; damage skipped; a disk that fills falls back to JSON lines, nothing lost."""

from __future__ import annotations

import errno
import os
import random
import signal
import threading
from pathlib import Path

import pytest

from counterd import _native
from counterd.data.env import ENV_NATIVE
from counterd.markers.recorder import Recorder
from counterd.markers.sinks import MemorySink, SpoolSink
from counterd.wire import spool, spool_reader


@pytest.fixture(autouse=True, params=["native", "python"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test on both engines: the compiled hot path (where it is built) and Python."""
    if request.param == "native":
        monkeypatch.delenv(ENV_NATIVE, raising=False)
        if _native.hotpath() is None:
            pytest.skip("the compiled hot path (counterd/_native/hotpath_src/) is not built")
    else:
        monkeypatch.setenv(ENV_NATIVE, "0")
    return str(request.param)


def _recorder(directory: Path, backend: str = "none") -> Recorder:
    # No calibration: its scratch spool would take the fallocate calls the tests count.
    return Recorder(run_id="mapped", backend=backend, spool=directory, socket="off",
                    calibrate=False)


def test_markers_go_to_one_mapped_file_as_frames_and_collect_into_the_same_records(
        tmp_path: Path, one_cpu: int) -> None:
    rec = _recorder(tmp_path)
    mem = Recorder(run_id="mapped", backend="none", socket="off")
    mem.sink = MemorySink()
    for r in (rec, mem):
        with r.begin("load", {"n": 1000}):
            pass
        with r.begin("sort", {}):
            pass
        r.end(name="stray")  # unmatched: a RECORD frame
    files = spool.files(tmp_path)
    assert [f.suffix for f in files] == [spool.FRAMES]
    got = sorted(spool_reader.collect(tmp_path), key=lambda r: r.index)
    want = sorted(mem.sink.records, key=lambda r: r.index)
    assert [(r.name, r.params, r.flags) for r in got] == [
        (r.name, r.params, r.flags) for r in want]
    assert got[0].name == "load" and got[0].params == {"n": 1000} and got[0].end_ns
    assert "unmatched_end" in got[2].flags
    kinds = [d["ev"] for d in spool_reader.read_events(files[0])]
    assert kinds == ["begin", "record", "begin", "record", "record"]


def test_counters_survive_the_frames(tmp_path: Path) -> None:
    """perf software events: the CLOSE carries every counter with its source and ratio."""
    rec = Recorder(run_id="mapped", backend="perf", events=["task_clock_ns", "page_faults"],
                   spool=tmp_path, socket="off")
    with rec.begin("work", {}):
        sum(range(100_000))
    (r,) = spool_reader.collect(tmp_path)
    if r.unsupported.get("*") or not r.counters:
        pytest.skip(f"perf software events unavailable here: {r.unsupported}")
    assert r.counters["task_clock_ns"].value > 0
    assert r.counters["task_clock_ns"].source.value == "measured"


def test_the_file_grows_past_a_chunk_and_threads_share_it(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    monkeypatch.setattr(spool, "CHUNK", 4096)  # grow every few frames
    rec = _recorder(tmp_path)

    def work(t: int) -> None:
        for i in range(300):
            with rec.begin(f"t{t}", {"i": i}):
                pass

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    got = list(spool_reader.collect(tmp_path))
    assert len(got) == 1200 and not any(r.flags - {"migrated"} for r in got)
    assert sorted(r.index for r in got) == list(range(1200))
    assert spool.files(tmp_path)[0].stat().st_size > 4096


def _dies_inside(directory: str) -> None:
    rec = _recorder(Path(directory))
    with rec.begin("done", {}):
        pass
    rec.begin("dies here", {})
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_process_killed_inside_a_superstep_leaves_an_incomplete_record(
        tmp_path: Path) -> None:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child is killed
        try:
            _dies_inside(str(tmp_path))
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    got = sorted(spool_reader.collect(tmp_path), key=lambda r: r.index)
    assert [(r.name, "incomplete" in r.flags) for r in got] == [("done", False),
                                                               ("dies here", True)]


def test_damage_is_skipped_never_raised(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    for i in range(20):
        with rec.begin("s", {"i": i}):
            pass
    (path,) = spool.files(tmp_path)
    data = bytearray(path.read_bytes())
    rng = random.Random(5)
    for trial in range(60):
        bad = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            bad[rng.randrange(len(bad))] = rng.randrange(256)
        if trial % 3 == 0:  # a committed count beyond the file
            bad[8:16] = (len(bad) * 4).to_bytes(8, "little")
        d = tmp_path / f"t{trial}"
        d.mkdir()
        (d / path.name).write_bytes(bytes(bad))
        for r in spool_reader.collect(d):  # never raises
            assert r.run_id
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "1.frames").write_bytes(b"")
    assert list(spool_reader.collect(tmp_path / "empty")) == []


def test_a_disk_that_fills_as_the_file_grows_falls_back_to_lines_and_loses_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], engine: str) -> None:
    if engine == "native":
        pytest.skip("patches Python's posix_fallocate; the compiled engine's full disk is "
                    "tested in test_hotpath.py under RLIMIT_FSIZE")
    monkeypatch.setattr(spool, "CHUNK", 4096)
    real = os.posix_fallocate
    calls = {"n": 0}

    def fallocate(fd: int, offset: int, length: int) -> None:
        calls["n"] += 1
        if calls["n"] > 1:  # the first chunk is there, growth fails
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    rec = _recorder(tmp_path)
    assert isinstance(rec.sink, SpoolSink)
    for i in range(200):
        with rec.begin("s", {"i": i}):
            pass
    assert sorted(p.suffix for p in spool.files(tmp_path)) == [".frames", ".jsonl"]
    frames = [p for p in spool.files(tmp_path) if p.suffix == spool.FRAMES]
    mapped = [e for e in spool_reader.read_events(frames[0]) if e["ev"] == "record"]
    assert mapped  # the first chunk held records before growth failed
    got = list(spool_reader.collect(tmp_path))
    assert sorted(r.index for r in got) == list(range(200))
    assert not any("incomplete" in r.flags for r in got)
    assert capsys.readouterr().err == ""  # a full disk is not a mapping failure to report


def test_a_forked_child_writes_its_own_file_with_its_own_contexts(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    with rec.begin("parent", {}):
        pass
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            with rec.begin("child", {"i": 1}):
                pass
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    got = sorted(r.name for r in spool_reader.collect(tmp_path))
    assert got == ["child", "parent"]  # (the module API gives a child its own recorder too)
    assert len(spool.files(tmp_path)) == 2
    assert not any("incomplete" in r.flags for r in spool_reader.collect(tmp_path))


def test_a_pid_given_again_writes_beside_the_first_file(tmp_path: Path) -> None:
    first = spool.MappedWriter(tmp_path / "7.frames")
    second = spool.MappedWriter(tmp_path / "7.frames")
    assert first.path.name == "7.frames" and second.path.name == "7-1.frames"
    first.close()
    second.close()
