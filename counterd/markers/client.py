"""The daemon client: a sink that sends a program's begins and records to counterd's socket."""

from __future__ import annotations

import logging
import os
import select
import socket as _socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.env import ENV_JOB
from counterd.markers import identity
from counterd.markers.sinks import MemorySink, SpoolSink, _as_record
from counterd.records import Param, SuperstepRecord

if TYPE_CHECKING:
    from counterd.markers.recorder import Step

log = logging.getLogger("counterd.markers")
_SNDTIMEO = struct.pack("ll", 30, 0)  # struct timeval: a send to the daemon waits 30 s at most


class SocketSink:
    """Sends begins and records to the daemon over its Unix socket (:mod:`counterd.protocol`).

    Every record stays in ``unacked`` until the daemon acknowledges it (acknowledged = committed
    to the daemon's store); acknowledgements are read without blocking as markers go by, and
    waited for only when more than ``high_water`` records are outstanding, by :meth:`flush`,
    and at exit. If the connection breaks, the sink reconnects once and resends what is
    unacknowledged (and the begins of supersteps still open); if the daemon is gone it writes
    them to ``fallback`` (a MemorySink unless given) and continues there. Records the daemon
    refuses are moved to ``refused`` with the reason. One connection per process: a forked
    child gets its own sink (``_fork_copy``). Thread-safe.
    """

    def __init__(self, path: Path | str, *, job: str | None = None,
                 fallback: MemorySink | SpoolSink | None = None, timeout_s: float = 5.0,
                 high_water: int = 8192) -> None:
        from counterd import protocol

        self._protocol = protocol
        self.path = Path(path)
        self.job = job or os.environ.get(ENV_JOB) or Path(sys.argv[0] or "python").name
        self.fallback: MemorySink | SpoolSink = fallback or MemorySink()
        self.timeout_s = timeout_s
        self.high_water = high_water
        # seq -> record (or the closed Step it is built from), in sending order
        self.unacked: dict[int, SuperstepRecord | Step] = {}
        self.refused: list[tuple[SuperstepRecord | None, str]] = []
        self.degraded: str | None = None  # why records go to the fallback
        self.on_ack: Callable[[list[SuperstepRecord]], None] | None = None
        self.welcome: dict[str, Any] = {}
        # (run_id, index) -> begin line, or the fields of an OPEN (see _line_of)
        self._open: dict[tuple[str, int], Any] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._lock = threading.RLock()
        self._pid = identity.pid
        self._seq = 0
        self._gen = 0  # connection number: a CLOSE only follows an OPEN of the same connection
        self._contexts: dict[tuple[Any, ...], int] = {}  # (ctx, counter names) -> CONTEXT id
        self._sock: _socket.socket | None = None
        self._decoder = protocol.Decoder(versions=protocol.ACCEPTED_VERSIONS)
        self._connect()

    # -- connection ------------------------------------------------------------------------
    def _connect(self) -> None:
        """Connect and say HELLO; raises OSError (no daemon) or ConnectionError."""
        p = self._protocol
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(self.timeout_s)
            sock.connect(str(self.path))
            # Blocking from here on (a Python socket timeout would turn every MSG_DONTWAIT
            # receive into a wait); a daemon that stops reading fails sends after 30 s instead.
            sock.settimeout(None)
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, _SNDTIMEO)
            sock.sendall(p.encode(p.FrameType.HELLO, {
                "pid": os.getpid(), "host": _socket.gethostname(), "job": self.job}))
            self._sock, self._seq = sock, 0
            self._decoder = p.Decoder(versions=p.ACCEPTED_VERSIONS)
            self._gen += 1
            self._contexts = {}
            deadline = time.monotonic() + self.timeout_s
            while not self.welcome or self.welcome.get("pid") is None:
                left = deadline - time.monotonic()
                if left <= 0 or not self._receive(block=True, timeout_s=left):
                    raise ConnectionError(f"the daemon at {self.path} did not answer HELLO")
        except BaseException:
            sock.close()
            self._sock = None
            raise

    def _reconnect(self, reason: str) -> None:
        """After a broken connection: reconnect and resend, or fall back."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.welcome = {}
        try:
            self._connect()
            records, self.unacked = list(self.unacked.values()), {}
            for line in list(self._open.values()):
                self._seq += 1
                self._send_raw(self._protocol.FrameType.BEGIN,
                               {"s": self._seq, "line": _line_of(line)})
            for rec in records:
                self._seq += 1
                self.unacked[self._seq] = rec
                self._send_raw(self._protocol.FrameType.RECORD,
                               {"s": self._seq, "rec": _as_record(rec).to_json()})
            log.info("reconnected to counterd at %s after: %s", self.path, reason)
        except (OSError, ConnectionError) as exc:
            self._degrade(f"{reason}; reconnecting failed: {exc}")

    def _degrade(self, reason: str) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.degraded = reason
        log.warning("counterd daemon unreachable (%s): %d unacknowledged records and %d open "
                    "supersteps go to the %s sink", reason, len(self.unacked), len(self._open),
                    type(self.fallback).__name__)
        for line in self._open.values():
            self.fallback.begin(_line_of(line))
        for rec in self.unacked.values():
            self.fallback.record(rec)
        self.unacked.clear()
        self._open.clear()

    def _send_raw(self, ftype: Any, payload: Mapping[str, Any]) -> None:
        assert self._sock is not None
        self._sock.sendall(self._protocol.encode(ftype, payload))

    def _send(self, ftype: Any, payload: Mapping[str, Any]) -> None:
        try:
            if self._sock is None:
                raise ConnectionError("not connected")
            self._send_raw(ftype, payload)
        except OSError as exc:  # the daemon went away: what we hold is resent or kept
            self._reconnect(f"send failed ({exc})")

    def _receive(self, block: bool, timeout_s: float = 1.0) -> bool:
        """Read and handle replies (waiting up to ``timeout_s`` if ``block``); False when the
        connection is gone."""
        sock = self._sock
        if sock is None:
            return False
        try:
            if block and not select.select([sock], [], [], timeout_s)[0]:
                return True
            data = sock.recv(65536, _socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except (OSError, ValueError):
            return False
        if not data:
            return False
        self._decoder.feed(data)
        FrameType = self._protocol.FrameType
        try:
            for ftype, payload in self._decoder.frames():
                seq = payload.get("s")
                if ftype is FrameType.ACK and isinstance(seq, int):
                    done = []
                    for s in list(self.unacked):
                        if s > seq:
                            break
                        done.append(self.unacked.pop(s))
                    if done and self.on_ack is not None:
                        self.on_ack([_as_record(r) for r in done])
                elif ftype is FrameType.WELCOME:
                    self.welcome = payload
                elif ftype is FrameType.ERROR:
                    rec = self.unacked.pop(seq, None) if isinstance(seq, int) else None
                    message = f"{payload.get('code')}: {payload.get('message')}"
                    if rec is not None:
                        self.refused.append((_as_record(rec), message))
                    log.warning("counterd refused a frame: %s", message)
                    if isinstance(seq, int):
                        self._replies[seq] = payload
                elif isinstance(seq, int):
                    self._replies[seq] = {"type": ftype.name, **payload}
        except self._protocol.ProtocolError as exc:
            log.warning("counterd sent a bad frame (%s); reconnecting", exc)
            return False
        return True

    def _wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if self._sock is None or left <= 0:
                return done()
            if not self._receive(block=True, timeout_s=min(left, 1.0)):
                self._reconnect("connection closed while waiting for the daemon")
        return True

    def _mine(self) -> bool:
        return self._pid == identity.pid  # a forked child never uses its parent's connection

    def _send_frame(self, frame: bytes) -> None:
        try:
            if self._sock is None:
                raise ConnectionError("not connected")
            self._sock.sendall(frame)
        except OSError as exc:  # the daemon went away: what we hold is resent or kept
            self._reconnect(f"send failed ({exc})")

    def _context_id(self, ctx: tuple[str, int, str, str], names: tuple[str, ...]) -> int | None:
        """The CONTEXT id for ``ctx`` and counter ``names`` on this connection, declaring it
        first if new; None when the connection cannot take one (the caller sends JSON)."""
        key = (ctx, names)
        c = self._contexts.get(key)
        if c is None:
            if self._sock is None or len(self._contexts) >= 0xFFFF or \
                    int(self.welcome.get("version", 1)) < 2:
                return None
            c = len(self._contexts) + 1
            self._seq += 1
            self._send_raw(self._protocol.FrameType.CONTEXT, {
                "s": self._seq, "c": c, "run_id": ctx[0], "pid": ctx[1], "host": ctx[2],
                "backend": ctx[3], "counters": list(names)})
            self._contexts[key] = c
        return c

    def _close_frame(self, step: Step) -> bytes | None:
        """The CLOSE frame of ``step`` (its sequence number is the next one), or None when it
        does not fit one (an unknown flag or source, a value out of range)."""
        p = self._protocol
        counters, flags, unsupported = step.recorder._parts(step)
        bits = p.flag_bits(flags)
        if bits is None:
            return None
        try:
            c = self._context_id(step.recorder._ctx, tuple(counters))
            if c is None:
                return None
            return p.encode_close(self._seq + 1, c, step.index, step.begin_ns, step.end_ns,
                                  bits, counters.values(), unsupported)
        except (KeyError, struct.error, ValueError):
            return None

    # -- sink interface ----------------------------------------------------------------------
    def open(self, ctx: tuple[str, int, str, str], index: int, name: str, rank: int, cpu: int,
             begin_ns: int, params: dict[str, Param]) -> int:
        """Send the begin of a superstep as an OPEN (a BEGIN where OPEN does not fit). Returns
        the connection number the OPEN went on, 0 if none (then its end goes as a RECORD)."""
        fields = (ctx, index, name, rank, cpu, begin_ns, params)
        with self._lock:
            if self.degraded is not None or self._pid != identity.pid:
                self.fallback.begin(_line_of(fields))
                return 0
            p = self._protocol
            self._open[(ctx[0], index)] = fields
            c = self._context_id(ctx, ())
            frame = None
            if c is not None:
                try:
                    frame = p.encode_open(self._seq + 1, c, index, begin_ns, rank, cpu, name,
                                          params)
                except struct.error:  # an index, rank or name beyond the packed fields
                    pass
            self._seq += 1
            if frame is None:
                self._send(p.FrameType.BEGIN, {"s": self._seq, "line": _line_of(fields)})
                return 0
            gen = self._gen
            self._send_frame(frame)
            return gen

    def begin(self, line: Mapping[str, Any], count: Sequence[str] | None = None
              ) -> dict[str, Any] | None:
        """Send a begin line; with ``count``, ask the daemon to count this superstep's thread
        and wait until it has started (returns the daemon's reply)."""
        with self._lock:
            if self.degraded is not None or not self._mine():
                self.fallback.begin(line)
                return None
            self._seq += 1
            seq = self._seq
            self._open[(line["run_id"], line["index"])] = dict(line)
            payload: dict[str, Any] = {"s": seq, "line": line}
            if count is not None:
                payload["count"] = list(count)
            self._send(self._protocol.FrameType.BEGIN, payload)
            if count is None:
                return None
            self._wait(lambda: seq in self._replies, self.timeout_s)
            return self._replies.pop(seq, None)

    def record(self, rec: SuperstepRecord) -> None:
        with self._lock:
            if self.degraded is not None or not self._mine():
                self.fallback.record(rec)
                return
            self._seq += 1
            self.unacked[self._seq] = rec
            self._open.pop((rec.run_id, rec.index), None)
            self._send(self._protocol.FrameType.RECORD, {"s": self._seq, "rec": rec.to_json()})
            self._after_record()

    def closed(self, step: Step) -> None:
        """A superstep ended: a CLOSE if its OPEN went on this connection, else a RECORD."""
        with self._lock:
            if self.degraded is not None or self._pid != identity.pid:
                self.fallback.record(step)
                return
            self._open.pop((step.recorder.run_id, step.index), None)
            frame = self._close_frame(step) if step.sent == self._gen else None
            self._seq += 1
            self.unacked[self._seq] = step
            if frame is None:
                self._send(self._protocol.FrameType.RECORD,
                           {"s": self._seq, "rec": step.record().to_json()})
            else:
                self._send_frame(frame)
            self._after_record()

    def _after_record(self) -> None:
        if self._sock is not None and not self._seq & 15:  # acks: one look every 16 frames
            self._receive(block=False)
            if len(self.unacked) > self.high_water:
                self._wait(lambda: len(self.unacked) <= self.high_water // 2,
                           self.timeout_s * 6)

    def read(self, pid: int, events: Sequence[str] = (), tid: int | None = None
             ) -> dict[str, Any]:
        """Ask the daemon for the counters of ``pid`` (cumulative since the first READ); returns
        the READING or ERROR payload."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._send(self._protocol.FrameType.READ,
                       {"s": seq, "pid": pid, "tid": tid, "count": list(events)})
            self._wait(lambda: seq in self._replies, self.timeout_s)
            return self._replies.pop(seq, {"code": "timeout", "message": "no reply"})

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every record sent so far is acknowledged; True if all are."""
        with self._lock:
            if self.degraded is not None or not self._mine() or self._sock is None:
                return not self.unacked
            if not self.unacked:
                return True
            self._seq += 1
            self._send(self._protocol.FrameType.SYNC, {"s": self._seq})
            return self._wait(lambda: not self.unacked,
                              self.timeout_s if timeout_s is None else timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, then close; records still unacknowledged go to the fallback (logged)."""
        with self._lock:
            if not self._mine():
                return
            if not self.flush(timeout_s) and self.unacked:
                self._degrade(f"{len(self.unacked)} records not acknowledged in time")
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _line_of(item: Any) -> dict[str, Any]:
    """A begin line from what SocketSink.open keeps (or the line itself)."""
    if isinstance(item, dict):
        return item
    ctx, index, name, rank, cpu, begin_ns, params = item
    return {"run_id": ctx[0], "index": index, "name": name, "rank": rank, "pid": ctx[1],
            "cpu": cpu, "begin_ns": begin_ns, "params": params, "backend": ctx[3],
            "host": ctx[2]}
