"""Issue 29 item 5: a recorder that survives its program. What a recorded program leaves in its
spool directory (bench/_hostile_spool.py, the one home of each scenario) is read without
blocking, without following links, in bounded chunks up to a cap, what was skipped said once
per file, and the spool directory goes whatever happens.

Each test checks the mechanism at small scale: the spool's reader in-process (its memory with
tracemalloc, a hang turned into a failure by an alarm), and ``counterd record`` end to end for
a few kinds. The full-size attacks (a 20 GB sparse file, 4 GiB of frames claimed) with the
recorder's time and peak RSS measured are bench/attacks.py's category "recorder".
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
import struct
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import _hostile_spool as hostile
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from counterd import launch
from counterd.commands import recording
from counterd.data.errors import BadInput
from counterd.data.records import SuperstepRecord
from counterd.wire import framing as wire
from counterd.wire import spool, spool_reader

ALARM_S = 5  # a reader that blocks (a FIFO's open) fails the test instead of hanging it


class Hung(Exception):
    pass


@pytest.fixture
def deadline() -> Iterator[None]:
    def hung(sig: int, frame: object) -> None:
        raise Hung(f"still reading after {ALARM_S} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(ALARM_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _plant(d: Path, kind: str, size: int = 0, target: str = "") -> Path:
    try:
        return Path(hostile.plant(str(d), kind, size, target))
    except PermissionError:
        pytest.skip(f"{kind}: making one needs root (mknod, chown)")


def _collect(d: Path, cap: int | None = None, owner: int | None = None
             ) -> tuple[list[SuperstepRecord], list[spool_reader.Skipped], int]:
    """(records, what was skipped, peak bytes allocated while reading)."""
    told: list[spool_reader.Skipped] = []
    tracemalloc.start()
    try:
        recs = list(spool_reader.collect(d, told.append, owner=owner, cap=cap))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return recs, told, peak


def _record_line(index: int, *, ev: str = "record", run_id: str = "r") -> bytes:
    line = hostile.record_line(run_id).replace(b'"index":0', f'"index":{index}'.encode())
    return line if ev == "record" else line.replace(b'"ev":"record"', b'"ev":"begin"')


@pytest.fixture
def spool_dir(tmp_path: Path) -> Path:
    d = tmp_path / "spool"
    d.mkdir()
    (d / "2.jsonl").write_bytes(_record_line(7, run_id="good"))  # a whole file beside it
    return d


SAYS = {
    "fifo": "a FIFO, not a regular file",
    "link to /dev/zero": "a symbolic link (spool files are not followed)",
    "directory": "a directory, not a regular file",
    "socket": "a socket, not a regular file",
    "character device": "a character device, not a regular file",
    "block device": "a block device, not a regular file",
}


@pytest.mark.parametrize("kind", sorted(SAYS))
def test_a_spool_entry_that_is_not_a_regular_file_is_skipped_and_said(
        spool_dir: Path, kind: str, deadline: None) -> None:
    path = _plant(spool_dir, kind)
    recs, told, peak = _collect(spool_dir)
    assert [(r.run_id, r.index) for r in recs] == [("good", 7)]
    assert told == [spool_reader.Skipped(str(path), SAYS[kind])]
    assert told[0].line() == f"spool file 1.jsonl skipped: {SAYS[kind]}"
    assert peak < 4 << 20


def test_a_link_to_another_users_file_is_not_followed(spool_dir: Path, tmp_path: Path,
                                                      deadline: None) -> None:
    target = tmp_path / "theirs.jsonl"
    target.write_bytes(hostile.record_line())
    _plant(spool_dir, "link to another user's file", target=str(target))
    recs, told, _ = _collect(spool_dir)
    assert hostile.STOLEN_RUN not in {r.run_id for r in recs}
    assert [s.why for s in told] == ["a symbolic link (spool files are not followed)"]


def test_a_file_of_another_user_is_skipped_when_an_owner_is_asked(spool_dir: Path) -> None:
    path = _plant(spool_dir, "another user's file")  # chown: root only (skips otherwise)
    recs, told, _ = _collect(spool_dir, owner=os.geteuid())
    assert hostile.STOLEN_RUN not in {r.run_id for r in recs}
    assert told == [spool_reader.Skipped(str(path), f"owned by uid {hostile.NOBODY}, not by the "
                                             f"recording user (uid {os.geteuid()})")]


def test_a_file_swapped_for_a_fifo_after_its_lstat_is_not_read(
        spool_dir: Path, monkeypatch: pytest.MonkeyPatch, deadline: None) -> None:
    """The type is checked again on the descriptor (fstat): a regular file when lstat looked,
    a FIFO when opened, is opened without blocking and skipped."""
    path = spool_dir / "1.jsonl"
    path.write_bytes(b"")
    real_open = os.open

    def swap(p: object, flags: int, *a: object, **k: object) -> int:
        if os.fspath(p) == str(path):  # type: ignore[call-overload]
            path.unlink()
            os.mkfifo(path)
        return real_open(p, flags, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(spool.os, "open", swap)
    assert spool_reader.open_regular(path) == "a FIFO, not a regular file"


def test_sparse_frames_claiming_4_gib_cost_one_chunk(spool_dir: Path, deadline: None) -> None:
    """A 1.frames of 4 GiB of holes whose head claims 2^32 committed bytes: the framing breaks
    at the first frame (length 0), the rest is not read, memory stays one chunk."""
    path = _plant(spool_dir, "sparse frames")
    t0 = time.monotonic()
    recs, told, peak = _collect(spool_dir)
    assert time.monotonic() - t0 < ALARM_S
    assert [(r.run_id, r.index) for r in recs] == [("good", 7)]
    assert told == [spool_reader.Skipped(str(path), "its frames break at byte 64 (of 4 GiB its "
                                         "head claims): the rest is not read", part=True)]
    assert peak < 3 * spool_reader.READ_CHUNK


def test_a_frames_head_claiming_more_than_a_spool_file_holds_is_not_read(
        spool_dir: Path) -> None:
    path = spool_dir / "1.frames"
    path.write_bytes(struct.pack("<8sQ", spool.MAGIC, spool.MAX_FRAMES_BYTES + 1))
    _, told, _ = _collect(spool_dir)
    assert told[0].why.startswith(f"its head claims {spool.MAX_FRAMES_BYTES + 1} bytes")


def test_a_sparse_jsonl_is_skipped_over_its_holes(spool_dir: Path, deadline: None) -> None:
    """Lines, a hole of 64 GiB (a line of zero bytes, too long to keep), lines: the hole is
    skipped with SEEK_DATA, not read, and the lines after it are kept."""
    path = spool_dir / "1.jsonl"
    hole = 64 << 30
    with path.open("wb") as f:
        f.write(_record_line(1))
        f.seek(hole)
        f.write(b"\n" + _record_line(2))
    if os.lseek(os.open(path, os.O_RDONLY), 0, os.SEEK_HOLE) >= hole:
        pytest.skip("this file system does not report holes (SEEK_HOLE)")
    recs, told, peak = _collect(spool_dir, cap=1 << 40)
    assert sorted((r.run_id, r.index) for r in recs) == [("good", 7), ("r", 1), ("r", 2)]
    assert told == [spool_reader.Skipped(str(path), "1 line of 1 MiB or more (damage, or a hole of "
                                             "zero bytes) skipped", part=True)]
    assert peak < 8 * spool_reader.READ_CHUNK  # a chunk, a line of up to a chunk, their join


def test_a_spool_file_beyond_the_cap_is_read_up_to_it(spool_dir: Path) -> None:
    """The cap (small here, 4 GiB by default): lines starting within it are read, what follows
    is not, and said; a superstep whose begin was read but not its end is an incomplete
    record that says why."""
    path = spool_dir / "1.jsonl"
    lines = [_record_line(i) for i in range(100)]
    begin = _record_line(500, ev="begin")
    data = b"".join(lines[:50]) + begin + b"".join(lines[50:])
    path.write_bytes(data + _record_line(500))
    cap = len(b"".join(lines[:50]) + begin)
    recs, told, _ = _collect(spool_dir, cap=cap)
    got = {(r.run_id, r.index): r for r in recs}
    assert set(got) == {("good", 7), *(("r", i) for i in range(50)), ("r", 500)}
    assert got[("r", 500)].end_ns is None and "incomplete" in got[("r", 500)].flags
    assert got[("r", 500)].unsupported["*"].startswith(
        "its end may lie in what was not read of spool file 1.jsonl: only its first")
    assert len(told) == 1 and told[0].part and "COUNTERD_SPOOL_MAX_BYTES" in told[0].why


def test_the_cap_is_the_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(spool_reader.ENV_MAX_FILE_BYTES, raising=False)
    assert spool_reader.max_file_bytes() == spool_reader.MAX_FILE_BYTES == 4 << 30
    monkeypatch.setenv(spool_reader.ENV_MAX_FILE_BYTES, "512M")
    assert spool_reader.max_file_bytes() == 512 << 20
    for bad in ("lots", "-1", "10"):
        monkeypatch.setenv(spool_reader.ENV_MAX_FILE_BYTES, bad)
        with pytest.raises(BadInput, match="COUNTERD_SPOOL_MAX_BYTES"):
            spool_reader.max_file_bytes()


def test_a_bad_cap_is_refused_before_the_command_runs(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(spool_reader.ENV_MAX_FILE_BYTES, "lots")
    mark = tmp_path / "ran"
    with pytest.raises(BadInput, match="COUNTERD_SPOOL_MAX_BYTES"):
        recording.record(["touch", str(mark)], out=None, backend="none")
    assert not mark.exists()


@pytest.mark.parametrize("form", ["jsonl", "frames"])
def test_a_file_truncated_while_read_ends_where_it_ends(
        spool_dir: Path, monkeypatch: pytest.MonkeyPatch, form: str) -> None:
    """The file shrinks after the first chunk was read (a process of the command still
    running): the reader stops at its new end, keeps what it read, never faults (no
    mapping)."""
    monkeypatch.setattr(spool_reader, "READ_CHUNK", 4096)
    path = spool_dir / f"1.{form}"
    if form == "jsonl":
        path.write_bytes(b"".join(_record_line(i) for i in range(100)))
    else:
        w = spool.MappedWriter(path)
        for i in range(100):
            w.append(wire.encode(wire.FrameType.RECORD,
                                           {"s": i + 1, "rec": SuperstepRecord.from_json(
                                               _json(_record_line(i))).to_json()}))
        w.close()
    real = os.pread
    calls = []

    def shrinking(fd: int, n: int, at: int) -> bytes:
        calls.append(at)
        if len(calls) == 2:
            os.truncate(path, 6000)
        return real(fd, n, at)

    monkeypatch.setattr(spool.os, "pread", shrinking)
    recs, told, _ = _collect(spool_dir)
    mine = sorted(r.index for r in recs if r.run_id == "r")
    assert mine and mine == list(range(len(mine))) and len(mine) < 100
    if form == "frames":
        assert told and told[0].why.startswith("it ends at byte 6000, its head says")


def test_a_file_growing_while_read_is_read_up_to_its_size_when_opened(
        spool_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process of the command still appending (a 1 GB/s writer would keep a reader going
    to the cap): what it adds after the open is not read."""
    monkeypatch.setattr(spool_reader, "READ_CHUNK", 4096)
    path = spool_dir / "1.jsonl"
    path.write_bytes(b"".join(_record_line(i) for i in range(40)))
    real = os.pread

    def growing(fd: int, n: int, at: int) -> bytes:
        with path.open("ab") as f:
            f.write(b"".join(_record_line(i) for i in range(1000, 1040)))
        return real(fd, n, at)

    monkeypatch.setattr(spool.os, "pread", growing)
    recs, told, _ = _collect(spool_dir)
    assert sorted(r.index for r in recs if r.run_id == "r") == list(range(40))
    assert told == []


def test_frames_shorter_than_their_head_says_are_read_to_the_end_and_said(
        spool_dir: Path) -> None:
    path = spool_dir / "1.frames"
    w = spool.MappedWriter(path)
    w.append(wire.encode(wire.FrameType.RECORD, {
        "s": 1, "rec": SuperstepRecord.from_json(_json(_record_line(5))).to_json()}))
    size = spool.HEAD_BYTES + w.committed
    w.close()
    with path.open("r+b") as f:
        f.truncate(size)
        f.seek(8)
        f.write(struct.pack("<Q", size - spool.HEAD_BYTES + 1000))  # more than it holds
    recs, told, _ = _collect(spool_dir)
    assert ("r", 5) in {(r.run_id, r.index) for r in recs}
    assert told == [spool_reader.Skipped(str(path), f"it ends at byte {size}, its head says "
                                             f"{size + 1000}: the frames beyond are lost",
                                         part=True)]


def _readline_events(path: Path) -> list[dict[str, object]]:
    """The events as the reader before issue 29 gave them (buffered readline of the whole
    file): what the chunked reader must still give for any file a program writes."""
    from counterd.util.strictjson import Malformed, loads

    out = []
    with path.open("rb") as fh:
        while line := fh.readline(spool_reader.MAX_LINE_BYTES + 1):
            if len(line) > spool_reader.MAX_LINE_BYTES:
                while line and not line.endswith(b"\n"):
                    line = fh.readline(spool_reader.MAX_LINE_BYTES)
                continue
            try:
                d = loads(line)
            except Malformed:
                continue
            if isinstance(d, dict) and isinstance(d.get("ev"), str) and (
                    "index" not in d or (isinstance(d["index"], int)
                                         and not isinstance(d["index"], bool))):
                out.append(d)
    return out


_PIECES = st.sampled_from([b'{"ev":"begin","index":1}', b'{"ev":"record","index":2}',
                           b'{"ev":"x"}', b"", b"junk", b"\x00" * 40, b'{"ev":"begin","in',
                           b"b" * 200, b"[1,2]",
                           # events of 63, 64 and 65 bytes: about MAX_LINE_BYTES (64 here)
                           *(b'{"ev":"' + b"a" * n + b'"}' for n in (54, 55, 56))])


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.tuples(_PIECES, st.booleans()), max_size=12),
       chunk=st.sampled_from([1, 7, 16, 64, 1 << 20]))
def test_the_chunked_reader_gives_what_readline_gave(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     pieces: list[tuple[bytes, bool]],
                                                     chunk: int) -> None:
    """Property: for any file of lines (long ones, torn ones, junk, zero bytes, with or
    without a last newline) and any chunk size, the same events as the readline reader."""
    monkeypatch.setattr(spool_reader, "MAX_LINE_BYTES", 64)
    monkeypatch.setattr(spool_reader, "READ_CHUNK", chunk)
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"".join(p + (b"\n" if nl else b"") for p, nl in pieces))
    assert list(spool_reader.read_lines(path)) == _readline_events(path)


def _json(line: bytes) -> dict[str, object]:
    import json

    d = json.loads(line)
    assert isinstance(d, dict)
    return d


# -- counterd record end to end ----------------------------------------------------------------
@pytest.fixture
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """TMPDIR (the spool directory's parent) a directory of the test's own."""
    base = tmp_path / "tmpdir"
    base.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    return base


def _spool_dirs(base: Path) -> list[str]:
    return [p.name for p in base.iterdir() if p.name.startswith(launch.SPOOL_PREFIX)]


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "directory", "sparse frames"])
def test_the_recorder_finishes_says_what_it_skipped_and_leaves_no_spool(
        tmpdir_env: Path, kind: str, deadline: None) -> None:
    cmd = [sys.executable, str(Path(hostile.__file__)), kind, "0", "", str(tmpdir_env / "end")]
    heard: list[str] = []
    res = recording.record(cmd, out=None, backend="none", progress=heard.append)
    assert res.exit_code == 0
    assert len(res.skipped) == 1 and res.skipped[0].startswith("spool file 1.")
    assert heard == list(res.skipped)
    assert [r.flags for r in res.records] == [frozenset({"whole_command"})]
    assert _spool_dirs(tmpdir_env) == []


def test_a_signal_while_the_recorder_reads_removes_its_spool(
        tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM after the command, while the spool is read: the recorder stops by
    :class:`launch.Stopped`, its spool directory removed, and its handlers put back."""
    seen: list[str] = []

    def slow_collect(d: str, skipped: Callable[[str], None] | None = None) -> list[object]:
        seen.append(d)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ALARM_S)  # interrupted by the handler's exception
        raise AssertionError("the signal did not stop the recorder")

    monkeypatch.setattr(recording, "_collect_spool", slow_collect)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(launch.Stopped) as stop:
        recording.record(["true"], out=None, backend="none")
    assert stop.value.sig == signal.SIGTERM
    assert seen and not os.path.exists(seen[0]) and _spool_dirs(tmpdir_env) == []
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_cli_says_it_was_stopped_and_exits_128_plus_the_signal(
        tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    from counterd.commands import cli

    def stopped(*a: object, **k: object) -> None:
        raise launch.Stopped(signal.SIGHUP)

    monkeypatch.setattr(recording, "record", stopped)
    out = tmp_path / "r.jsonl"
    assert cli.main(["record", "--backend", "none", "--out", str(out), "--", "true"]) == 129
    assert f"stopped by SIGHUP before writing the records; its spool removed, {out} not " \
           f"written" in capsys.readouterr().err
    assert not out.exists()


# -- what a recorder killed by SIGKILL leaves ----------------------------------------------------
def _aged(path: Path, age_s: float = 3600.0) -> Path:
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def test_stale_spool_dirs_of_dead_recorders_are_removed_and_nothing_else(
        tmpdir_env: Path) -> None:
    base = tmpdir_env
    dead = _aged(Path(launch.make_spool_dir()))  # made, then its recorder "killed":
    os.close(launch._locks.pop(str(dead)))  # the lock goes with the process
    (dead / "1.frames").write_bytes(b"x")
    os.mkfifo(dead / "2.jsonl")
    _aged(dead)
    young = Path(launch.make_spool_dir())
    os.close(launch._locks.pop(str(young)))
    held = _aged(Path(launch.make_spool_dir()))
    os.close(launch._locks.pop(str(held)))
    other_fd = os.open(held, os.O_RDONLY | os.O_DIRECTORY)  # another live recorder's lock
    fcntl.flock(other_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    older_name = base / "counterd-spool-0123456789abcdef"  # a recorder that did not lock
    older_name.mkdir(mode=0o700)
    _aged(older_name)
    loose = base / (launch.SPOOL_PREFIX + "loose")
    loose.mkdir(mode=0o755)
    _aged(loose)
    outside = base / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    link = base / (launch.SPOOL_PREFIX + "link")
    link.symlink_to(outside, target_is_directory=True)
    try:
        removed = launch.remove_stale_spool_dirs(str(base))
    finally:
        os.close(other_fd)
    assert removed == [str(dead)] and not dead.exists()
    assert young.exists() and held.exists() and older_name.exists() and loose.exists()
    assert (outside / "keep").read_text() == "x" and link.is_symlink()


def test_a_spool_dir_swapped_for_a_link_is_emptied_through_its_descriptor(
        tmpdir_env: Path, tmp_path: Path) -> None:
    """The recorded program moved its spool directory and put a link to another directory in
    its place: the removal does not follow it, and empties the moved directory through the
    descriptor the recorder holds."""
    d = Path(launch.make_spool_dir())
    (d / "1.jsonl").write_bytes(b"x")
    moved = tmp_path / "moved"
    d.rename(moved)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    d.symlink_to(victim, target_is_directory=True)
    launch.remove_spool_dir(str(d))
    assert (victim / "keep").read_text() == "x"
    assert moved.exists() and list(moved.iterdir()) == []
    assert str(d) not in launch._locks


def test_a_live_recorders_spool_dir_is_locked(tmpdir_env: Path) -> None:
    d = launch.make_spool_dir()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError) as exc:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert exc.value.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)
        launch.remove_spool_dir(d)
    assert not os.path.exists(d) and d not in launch._locks


# -- counterd import -----------------------------------------------------------------------------
def test_counterd_import_keeps_what_it_could_not_read(tmp_path: Path, deadline: None) -> None:
    from counterd.commands.importing import import_files

    d = tmp_path / "spill"
    d.mkdir(mode=0o700)
    os.mkfifo(d / "1.jsonl")
    (d / "2.jsonl").write_bytes(_record_line(3))
    res = import_files([d], store=tmp_path / "store.db")
    assert res.records == 1 and res.removed == [str(d / "2.jsonl")]
    assert res.kept == {str(d / "1.jsonl"): "not read: a FIFO, not a regular file"}
    assert stat.S_ISFIFO(os.lstat(d / "1.jsonl").st_mode)
