"""The marker client against daemons that misbehave (a fake one on a socket: it refuses
records, or stops reading), and params that are not JSON: the program is never stopped,
blocked for long, or lied to."""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from counterd.commands.importing import read_spill
from counterd.data.env import ENV_NATIVE
from counterd.data.records import SuperstepRecord
from counterd.markers.recorder import Recorder
from counterd.markers.sinks import MemorySink, SpoolSink
from counterd.markers.sinks.link import BLOCK_S
from counterd.markers.sinks.socket import SocketSink
from counterd.markers.sinks.spill import SpillFile
from counterd.wire import protocol
from counterd.wire.protocol import FrameType

Reply = Callable[[FrameType, Any], list[tuple[FrameType, dict[str, Any]]]]


class FakeDaemon:
    """Answers HELLO with WELCOME, then each frame with ``reply(type, payload)``; with
    ``reads=False`` it stops reading after the WELCOME (a daemon stuck on a full disk)."""

    def __init__(self, path: Path, reply: Reply | None = None, reads: bool = True) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(16)
        self.reply = reply or (lambda t, p: [])
        self.reads = reads
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        dec = protocol.Decoder(versions=protocol.ACCEPTED_VERSIONS)
        try:
            while data := conn.recv(65536):
                dec.feed(data)
                for ftype, payload in dec.frames():
                    if ftype is FrameType.HELLO:
                        conn.sendall(protocol.encode(FrameType.WELCOME, {
                            "version": 2, "max_frame": protocol.MAX_FRAME_BYTES, "uid": 0,
                            "pid": 1}))
                        if not self.reads:
                            return
                        continue
                    for rt, rp in self.reply(ftype, payload):
                        conn.sendall(protocol.encode(rt, rp))
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def sock_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "fake.sock"


def rec(i: int, **params: Any) -> SuperstepRecord:
    return SuperstepRecord(run_id="fake", index=i, name="s", rank=0, pid=1, cpu=0,
                           begin_ns=i, end_ns=i + 1, params=params)


def test_flush_is_false_when_the_daemon_refuses_a_record(sock_path: Path) -> None:
    def reply(ftype: FrameType, p: Any) -> list[tuple[FrameType, dict[str, Any]]]:
        if ftype is FrameType.RECORD and p["rec"]["index"] == 1:
            return [(FrameType.ERROR, {"s": p["s"], "code": "forbidden",
                                       "message": "run fake belongs to uid 1000"})]
        return [(FrameType.ACK, {"s": p["s"]})] if isinstance(p, dict) else []

    fake = FakeDaemon(sock_path, reply)
    sink = SocketSink(sock_path, job="t")
    for i in range(3):
        sink.record(rec(i))
    assert sink.flush(5) is False  # the issue: True while a record was refused
    assert sink.refused_count == 1 and sink.refused[0][1].startswith("forbidden")
    assert not sink.unacked
    sink.record(rec(3))
    assert sink.flush(5) is True  # nothing refused since the last flush
    sink.close(1)
    fake.close()


def test_a_record_that_is_not_json_is_refused_locally(sock_path: Path) -> None:
    fake = FakeDaemon(sock_path, lambda t, p: [(FrameType.ACK, {"s": p["s"]})])
    sink = SocketSink(sock_path, job="t")
    sink.record(rec(0, x=math.nan))  # built by hand, past the recorder's cleaning
    sink.record(rec(1))
    assert sink.flush(5) is False
    assert sink.refused_count == 1 and "not_encodable" in sink.refused[0][1]
    sink.close(1)
    fake.close()


def test_a_daemon_that_stops_reading_never_blocks_a_marker_for_long(
        sock_path: Path, tmp_path: Path) -> None:
    """The issue: a disk-full daemon made a marker call block ~30 s (the send timeout)."""
    fake = FakeDaemon(sock_path, reads=False)
    r = Recorder(run_id="stuck", backend="none", socket=sock_path)
    sink = r.sink
    assert isinstance(sink, SocketSink)
    sink.high_water = 2000
    sink.spill = SpillFile(tmp_path / "spill")
    worst = 0.0
    t_end = time.monotonic() + 4 * BLOCK_S  # long enough for a stuck-daemon reconnection
    n = 0
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        r.end(r.begin("s", {"pad": "x" * 200}))
        worst = max(worst, time.monotonic() - t0)
        n += 1
    assert worst <= BLOCK_S + 0.5
    assert len(sink.unacked) <= 2000
    assert sink.spill.records >= n - 2000 > 0
    sink.close(0.2)
    assert sink.spill.path is not None
    assert len(list(read_spill(sink.spill.path))) == n  # all of them, nothing lost
    fake.close()


_param_values = st.one_of(
    st.integers(), st.booleans(), st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(), max_size=8),  # lone surrogates included
    st.builds(object), st.lists(st.integers(), max_size=2), st.none())
_params = st.dictionaries(st.text(max_size=6), _param_values, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(name=st.text(max_size=8), params=_params)
def test_any_params_give_a_record_every_sink_can_encode(
        tmp_path: Path, name: str, params: dict[str, Any]) -> None:
    spool = SpoolSink(tmp_path / "spool")
    (tmp_path / "spool").mkdir(exist_ok=True)
    for sink in (MemorySink(), spool):
        r = Recorder(run_id="hyp", backend="none", socket="off")
        r.sink = sink
        got = r.end(r.begin(name, params))  # never raises
        wire = protocol.dumps_payload(got.to_json())  # what the daemon client sends: no NaN
        wire.encode()  # valid UTF-8 (a lone surrogate raises here)
        for key, value in params.items():
            kept = key in got.params
            named = f"param:{key}" in got.unsupported
            assert kept != named or not isinstance(key, str), (key, value, got)
            if kept:
                assert json.loads(protocol.dumps_payload({"v": got.params[key]}))["v"] == \
                    value
        assert ("dropped_params" in got.flags) == bool(got.unsupported)
        assert "unsupported_counters" not in got.flags


def test_a_full_disk_never_raises_into_the_program(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """ENOSPC on the spool: the mapped file cannot be allocated, and the lines of the
    JSON-lines form wait in memory and are written, in order, once the disk takes them again;
    beyond the backlog they are counted as lost and reported."""
    monkeypatch.setenv(ENV_NATIVE, "0")  # the Python mapping calls the fallocate patched here
    (tmp_path / "spool").mkdir()
    sink = SpoolSink(tmp_path / "spool")
    sink.BACKLOG_LINES = 3
    real_write = os.write
    full = True

    def fallocate(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", fallocate)

    def write(fd: int, data: bytes) -> int:
        if full and fd == sink._fd:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    recs = [SuperstepRecord("r", i, "s", 0, 1, 0, 10, 20) for i in range(6)]
    for rec in recs[:5]:
        sink.record(rec)  # no exception
    assert "cannot write the marker spool" in capsys.readouterr().err
    assert sink.lost == 2 and len(sink._backlog) == 3
    full = False
    sink.record(recs[5])
    assert not sink._backlog
    from counterd.wire import spool_reader

    assert [r.index for r in spool_reader.collect(tmp_path / "spool")] == [2, 3, 4, 5]
    sink.lost = 0  # reported at exit otherwise (checked above: the test's loss is on purpose)
