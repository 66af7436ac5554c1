"""The superstep marker API used inside programs (DESIGN.md section 5).

    import counterd
    counterd.set_rank(rank)                 # SPMD processor id (optional, see below)
    with counterd.superstep("count elements", n=n) as step:
        ...                                 # the superstep's work
        step.feed(stream)                   # only meaningful for the sim backend

One :class:`~counterd.records.SuperstepRecord` is produced per processor (thread of a process
that marks supersteps) per superstep, with CLOCK_MONOTONIC begin/end, the CPU, counter deltas
with their sources, params and flags. Nothing is lost silently:

* an exception inside the body gives a record flagged ``exception``;
* a superstep begun inside another gives a record flagged ``nested``;
* ``end()`` without ``begin()`` gives a record flagged ``unmatched_end``;
* a process that exits inside a superstep gets a record flagged ``incomplete`` (at exit), and
  one that is killed leaves its ``begin`` line in the spool, which the merge turns into an
  ``incomplete`` record (:func:`collect_spool`).

Configuration comes from ``configure()`` or, for programs started by ``counterd record``, from
the environment: ``COUNTERD_RUN_ID``, ``COUNTERD_SPOOL`` (a directory; each process appends
its events to ``<pid>.jsonl`` there), ``COUNTERD_BACKEND`` (perf, papi, sim, callgrind, daemon,
none) and ``COUNTERD_EVENTS`` (comma-separated canonical counters). Without either, records are
kept in memory (``counterd.records()``) and counted with perf where available.

Where records go (the sink), first match wins: ``configure(spool=...)`` or
``configure(socket=...)``; ``COUNTERD_SPOOL`` (set by ``counterd record``); ``COUNTERD_SOCKET``
(a path; ``off`` disables the daemon); the daemon's default socket
(:func:`counterd.daemon.config.default_socket_path`) if a daemon answers there; else memory. Through
the daemon (:class:`SocketSink`) every record is kept by the process until the daemon has
acknowledged it as committed to its store; ``COUNTERD_JOB`` names the job (default: the
program's file name). Backend ``daemon`` (or perf being unusable in-process, e.g.
``perf_event_paranoid`` forbidding self-monitoring) asks the daemon to count each superstep's
thread on the program's behalf.

Rank: ``set_rank()`` wins; else ``COUNTERD_RANK``; else an MPI launcher's rank variable
(Open MPI, MPICH/PMI, PMIx, MVAPICH, Slurm); else a multiprocessing worker's identity (1-based,
the parent being 0); else 0. Forked children (multiprocessing) start with fresh per-process state:
their counters are reopened for the child's own threads.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import select
import socket as _socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from counterd.backends.base import CounterGroup, CounterValue, Reading, Target
from counterd.errors import BadInput, CounterdError
from counterd.protocol import SOURCES as _WIRE_SOURCES
from counterd.records import Param, SuperstepRecord

ENV_RUN_ID = "COUNTERD_RUN_ID"
ENV_SPOOL = "COUNTERD_SPOOL"
ENV_BACKEND = "COUNTERD_BACKEND"
ENV_EVENTS = "COUNTERD_EVENTS"
ENV_RANK = "COUNTERD_RANK"
ENV_SOCKET = "COUNTERD_SOCKET"
ENV_JOB = "COUNTERD_JOB"
ENV_FLUSH_TIMEOUT = "COUNTERD_FLUSH_TIMEOUT"  # seconds to wait for acks at exit (default 10)
_MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
                  "SLURM_PROCID")
MARKER_BACKENDS = ("perf", "papi", "sim", "callgrind", "daemon", "none")

log = logging.getLogger("counterd.markers")
_SNDTIMEO = struct.pack("ll", 30, 0)  # struct timeval: a send to the daemon waits 30 s at most
_SOURCE_INDEX = {source: i for i, source in enumerate(_WIRE_SOURCES)}  # Source is a StrEnum
_dumps_line = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps builds one per call

# This process's id, kept current across fork: os.getpid() is a system call and the markers'
# hot path asked for it several times per superstep (issue 3: marker cost).
_pid = os.getpid()


def _after_fork_in_child() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)

def _getcpu_function() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):  # not glibc: CPU stays unknown (-1)
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


_sched_getcpu = _getcpu_function()


def current_cpu() -> int:
    return int(_sched_getcpu()) if _sched_getcpu is not None else -1


def default_run_id() -> str:
    """The run id of a program not started by ``counterd record``: one per process tree.

    MPI ranks are started separately by the launcher, each with its own environment; ranks on
    one node share the launcher's proxy as parent, so their run id derives from that parent
    (pid and start time). Otherwise the first process to need one creates it and exports it in
    ``COUNTERD_RUN_ID``, so multiprocessing workers (fork or spawn) and subprocesses inherit it.
    """
    if any(var in os.environ for var in _MPI_RANK_VARS):
        ppid = os.getppid()
        try:
            start = Path(f"/proc/{ppid}/stat").read_text().rsplit(")", 1)[1].split()[19]
        except (OSError, IndexError):
            start = "0"
        digest = hashlib.sha1(f"{_socket.gethostname()}:{ppid}:{start}".encode()).hexdigest()
        return "mpi-" + digest[:12]
    run_id = uuid.uuid4().hex[:12]
    os.environ[ENV_RUN_ID] = run_id
    return run_id


# A run is the process tree of the first process that imports counterd: export its id now,
# before that process can fork or spawn its workers (MPI ranks derive theirs instead).
if ENV_RUN_ID not in os.environ and not any(var in os.environ for var in _MPI_RANK_VARS):
    default_run_id()


def _auto_rank() -> int:
    for var in (ENV_RANK, *_MPI_RANK_VARS):
        value = os.environ.get(var)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    identity = getattr(multiprocessing.current_process(), "_identity", ())
    return int(identity[0]) if identity else 0


# --------------------------------------------------------------------------------------------
# Sinks: where records go.


def _as_record(item: SuperstepRecord | Step) -> SuperstepRecord:
    return item if isinstance(item, SuperstepRecord) else item.record()


class MemorySink:
    """Keeps records in the process (the default when nothing else is configured).

    A superstep ended by the marker is kept as its closed :class:`Step`; the record is built
    when :attr:`records` is read (building and validating a record costs more than the rest of
    a marker pair). The records are identical to ones built at the end marker.
    """

    def __init__(self) -> None:
        self._items: list[SuperstepRecord | Step] = []

    @property
    def records(self) -> list[SuperstepRecord]:
        items = self._items
        n = len(items)  # appended concurrently beyond n: left for the next read
        for i in range(n):
            item = items[i]
            if not isinstance(item, SuperstepRecord):
                items[i] = item.record()  # assignment of one element is atomic under the GIL
        return items[:n]  # type: ignore[return-value]

    def begin(self, line: Mapping[str, Any]) -> None:  # begins need no durability in memory
        pass

    def record(self, rec: SuperstepRecord | Step) -> None:
        self._items.append(rec)  # list.append is atomic under the GIL

    closed = record


class SpoolSink:
    """Appends one JSON line per begin and per record to ``<spool>/<pid>.jsonl``.

    Each line is one ``write(2)`` on an O_APPEND descriptor, so a process killed at any point
    leaves whole lines only; a ``begin`` line with no matching record becomes an ``incomplete``
    record when the spool is collected.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._fd: int | None = None
        self._pid = -1

    def _descriptor(self) -> int:
        pid = _pid
        if self._fd is None or self._pid != pid:  # first use, or we are a forked child
            path = self.directory / f"{pid}.jsonl"
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                                   0o644)
            except OSError as exc:
                raise BadInput(f"cannot write the marker spool {path}: {exc.strerror}",
                               f"make {self.directory} writable or unset {ENV_SPOOL}") from exc
            self._pid = pid
        return self._fd

    def _descriptor_fast(self) -> int:
        fd = self._fd
        return fd if fd is not None and self._pid == _pid else self._descriptor()

    def _write(self, obj: Mapping[str, Any]) -> None:
        os.write(self._descriptor_fast(), (_dumps_line(obj) + "\n").encode())

    def begin(self, line: Mapping[str, Any]) -> None:
        self._write({"ev": "begin", **line})

    def record(self, rec: SuperstepRecord | Step) -> None:
        self._write({"ev": "record", **_as_record(rec).to_json()})

    closed = record


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
        self._pid = _pid
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
        return self._pid == _pid  # a forked child never uses its parent's connection

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
            values = [(_SOURCE_INDEX[cv.source], cv.value, cv.ratio,
                       p.NO_RAW if cv.raw is None else cv.raw) for cv in counters.values()]
            tail = p._dumps(unsupported).encode() if unsupported else b""
            c = self._context_id(step.recorder._ctx, tuple(counters))
            if c is None:
                return None
            body = b"".join([p.CLOSE_HEAD.pack(self._seq + 1, c, step.index, step.begin_ns,
                                               step.end_ns, bits, len(tail)),
                             *[p.COUNTER.pack(*v) for v in values], tail])
        except (KeyError, struct.error, ValueError):
            return None
        return p.HEADER.pack(len(body) + 2, 2, p.FrameType.CLOSE) + body

    # -- sink interface ----------------------------------------------------------------------
    def open(self, ctx: tuple[str, int, str, str], index: int, name: str, rank: int, cpu: int,
             begin_ns: int, params: dict[str, Param]) -> int:
        """Send the begin of a superstep as an OPEN (a BEGIN where OPEN does not fit). Returns
        the connection number the OPEN went on, 0 if none (then its end goes as a RECORD)."""
        fields = (ctx, index, name, rank, cpu, begin_ns, params)
        with self._lock:
            if self.degraded is not None or self._pid != _pid:
                self.fallback.begin(_line_of(fields))
                return 0
            p = self._protocol
            self._open[(ctx[0], index)] = fields
            c = self._context_id(ctx, ())
            frame = None
            if c is not None:
                nb = name.encode()
                try:
                    body = p.OPEN_HEAD.pack(self._seq + 1, c, index, begin_ns, rank, cpu,
                                            len(nb)) + nb
                except struct.error:  # an index, rank or name beyond the packed fields
                    pass
                else:
                    if params:
                        body += p._dumps(params).encode()
                    frame = p.HEADER.pack(len(body) + 2, 2, p.FrameType.OPEN) + body
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
            if self.degraded is not None or self._pid != _pid:
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


# --------------------------------------------------------------------------------------------


def _line_of(item: Any) -> dict[str, Any]:
    """A begin line from what SocketSink.open keeps (or the line itself)."""
    if isinstance(item, dict):
        return item
    ctx, index, name, rank, cpu, begin_ns, params = item
    return {"run_id": ctx[0], "index": index, "name": name, "rank": rank, "pid": ctx[1],
            "cpu": cpu, "begin_ns": begin_ns, "params": params, "backend": ctx[3],
            "host": ctx[2]}


class Step:
    """An open superstep, returned by ``begin()`` and by ``with superstep(...) as step``.

    Once ended it also holds what its record is built from (``end_ns``, ``stop``, ``end_cpu``,
    ``unsupported``): sinks keep the closed step and build the record only when it is needed
    (:meth:`record`), off the marker's hot path.
    """

    __slots__ = ("recorder", "index", "name", "rank", "cpu", "begin_ns", "params", "start",
                 "flags", "closed", "streams", "end_ns", "stop", "end_cpu", "unsupported",
                 "sent", "_record", "delta")

    def __init__(self, recorder: Recorder, index: int, name: str, rank: int, cpu: int,
                 begin_ns: int, params: dict[str, Param], start: Any,
                 flags: frozenset[str]) -> None:
        self.recorder = recorder
        self.index = index
        self.name = name
        self.rank = rank
        self.cpu = cpu
        self.begin_ns = begin_ns
        self.params = params
        self.start = start
        self.flags = flags
        self.closed = False
        self.streams: list[Any] = []
        self.end_ns: int | None = None
        self.stop: Any = None  # the group's read at the end (raw tuple or Reading)
        self.end_cpu = -1
        self.unsupported: Mapping[str, str] | None = None  # the thread's, at the end
        self.sent = 0  # SocketSink connection number its OPEN went on (0: none)
        self._record: SuperstepRecord | None = None
        # Turns (start, stop) into (counter values, unsupported): the group's raw decoder.
        self.delta: Callable[[Any, Any], tuple[dict[str, CounterValue], Mapping[str, str]]] \
            = _reading_delta

    def record(self) -> SuperstepRecord:
        """The record of this (ended) superstep, built once."""
        rec = self._record
        if rec is None:
            rec = self._record = self.recorder._materialise(self)
        return rec

    def feed(self, stream: Any) -> None:
        """Declare an address stream this superstep executes (used by the ``sim`` backend; a
        no-op for backends that count real hardware). The stream is simulated when the
        superstep ends, after its end time is taken: simulation is never part of the time."""
        if getattr(self.recorder._state().group, "feed", None) is not None:
            self.streams.append(stream)

    def __enter__(self) -> Step:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.flags = self.flags | {"exception"}
        self.recorder._end(self, None)


def _reading_delta(start: Reading, stop: Reading
                   ) -> tuple[dict[str, CounterValue], Mapping[str, str]]:
    return stop.delta(start), stop.unsupported


class _ThreadState:
    """What one thread of one process needs on the marker's hot path, found with one lookup."""

    __slots__ = ("pid", "stack", "group", "unsupported", "rank", "daemon_counts", "read",
                 "delta")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stack: list[Step] = []
        self.group: CounterGroup | None = None
        self.unsupported: dict[str, str] = {}
        self.rank: int | None = None
        self.daemon_counts: bool | None = None  # decided at this thread's first begin
        # The group's cheapest read and its decoder (perf: raw tuples, decoded lazily).
        self.read: Callable[[], Any] | None = None
        self.delta: Callable[[Any, Any], tuple[dict[str, CounterValue], Mapping[str, str]]] \
            = _reading_delta


_NO_FLAGS: frozenset[str] = frozenset()
_NESTED = frozenset({"nested"})
_INCOMPLETE = frozenset({"incomplete"})
_MIGRATED = frozenset({"migrated"})
_MULTIPLEXED = frozenset({"multiplexed"})
_UNSUPPORTED = frozenset({"unsupported_counters"})


class Recorder:
    """Per-process marker state. One exists per process (re-created after fork)."""

    def __init__(self, *, run_id: str | None = None, backend: str | None = None,
                 events: Sequence[str] | None = None, spool: Path | None = None,
                 socket: Path | str | None = None) -> None:
        env = os.environ
        self.run_id = run_id or env.get(ENV_RUN_ID) or default_run_id()
        name = backend or env.get(ENV_BACKEND) or "default"
        if name not in MARKER_BACKENDS + ("default",):
            raise BadInput(f"unknown marker backend {name!r}",
                           "choose from " + ", ".join(MARKER_BACKENDS))
        self.backend_name = name
        ev = events if events is not None else [e for e in env.get(ENV_EVENTS, "").split(",") if e]
        self.events: tuple[str, ...] = tuple(ev)
        self.sink: MemorySink | SpoolSink | SocketSink = _make_sink(spool, socket)
        self.host = _socket.gethostname()
        self.pid = _pid
        self._ctx: tuple[str, int, str, str] = (self.run_id, self.pid, self.host, "none")
        self._process_rank: int | None = None
        self._local = threading.local()
        self._indices = itertools.count()  # next() on it is atomic under the GIL
        self._open: dict[int, Step] = {}  # id(step) -> step, for the at-exit sweep
        self._backend: Any = None
        self._backend_error: str | None = None
        self._native: Any = None
        if name == "callgrind":
            from counterd import _native

            self._native = _native.lib()

    @property
    def _durable(self) -> bool:
        return isinstance(self.sink, SpoolSink | SocketSink)

    @property
    def _daemon_counts(self) -> bool:
        """Whether the daemon counts this process's supersteps on its behalf."""
        if not isinstance(self.sink, SocketSink) or self.sink.degraded is not None:
            return False
        if self.backend_name == "daemon":
            return True
        return (self.backend_name == "default" and self._resolve_backend() is None
                and self._backend_error is not None)

    # -- configuration of the processor id -------------------------------------------------
    def set_rank(self, rank: int, *, thread: bool = False) -> None:
        if rank < 0:
            raise BadInput(f"rank {rank} < 0", "ranks are 0, 1, ... p-1")
        if thread:
            self._state().rank = rank
        else:
            self._process_rank = rank

    def rank(self) -> int:
        rank = self._state().rank
        if rank is not None:
            return rank
        if self._process_rank is None:
            self._process_rank = _auto_rank()
        return self._process_rank

    # -- counters ----------------------------------------------------------------------------
    def _resolve_backend(self) -> Any:
        if self._backend is not None or self._backend_error is not None:
            return self._backend
        from counterd import backends

        name = self.backend_name
        if name in ("none", "callgrind", "daemon"):  # these count from outside the process
            self._backend_error = f"counters come from {name}" if name != "none" else "none"
            return None
        try:
            if name == "default":
                candidate = backends.get("perf")
                if not candidate.available().available:
                    self._backend_error = "perf is not available; no counters"
                    return None
                self._backend = candidate
            else:
                self._backend = backends.select(name)
        except CounterdError as exc:
            self._backend_error = str(exc)
        return self._backend

    def _state(self) -> _ThreadState:
        """This thread's state; created (and its counter group opened) on first use in this
        thread of this process — a forked child gets a fresh one."""
        st: _ThreadState | None = getattr(self._local, "st", None)
        pid = _pid
        if st is not None and st.pid == pid:
            return st
        st = _ThreadState(pid)
        self._local.st = st
        backend = self._resolve_backend()
        # What every record of this process shares; the label is fixed once the backend is
        # resolved (SocketSink's CONTEXT frames carry it).
        self._ctx = (self.run_id, self.pid, self.host, self._label())
        if backend is None:
            return st
        cap = backend.available()
        events = self.events or tuple(c for c, why in cap.counters.items() if why is None)
        try:
            try:
                st.group = backend.open(events, Target.this_thread(), strict=False)
            except TypeError:  # a backend without the strict keyword
                st.group = backend.open(events, Target.this_thread())
        except CounterdError as exc:
            st.unsupported = {e: str(exc) for e in events}
        if st.group is not None:
            raw = getattr(st.group, "read_raw", None)
            st.read = raw if raw is not None else st.group.read
            if raw is not None:
                st.delta = st.group.delta_raw  # type: ignore[attr-defined]
        return st

    # -- markers -------------------------------------------------------------------------------
    def begin(self, name: str, params: Mapping[str, Param]) -> Step:
        st = self._state()
        index = next(self._indices)
        cpu = current_cpu()
        rank = st.rank if st.rank is not None else self.rank()
        params = dict(params) if params else {}
        sent = 0
        sink = self.sink
        if not isinstance(sink, MemorySink):  # the begin is what survives a kill inside it
            if st.daemon_counts is None:
                st.daemon_counts = self._daemon_counts
            if isinstance(sink, SocketSink) and not st.daemon_counts:
                sent = sink.open(self._ctx, index, name, rank, cpu, time.monotonic_ns(), params)
            else:
                line = {"run_id": self.run_id, "index": index, "name": name, "rank": rank,
                        "pid": st.pid, "cpu": cpu, "begin_ns": time.monotonic_ns(),
                        "params": params, "backend": self._ctx[3], "host": self.host}
                if isinstance(sink, SocketSink):
                    line["tid"] = threading.get_native_id()
                    sink.begin(line, count=self.events)
                else:
                    sink.begin(line)
        start = st.read() if st.read is not None else None
        step = Step(self, index, name, rank, cpu, time.monotonic_ns(), params, start,
                    _NESTED if st.stack else _NO_FLAGS)
        step.delta = st.delta
        step.sent = sent
        st.stack.append(step)
        self._open[id(step)] = step
        if self._native is not None:
            self._native.counterd_superstep_mark(index, 0)
        return step

    def end(self, step: Step | None = None, name: str | None = None) -> SuperstepRecord:
        return _as_record(self._end(step, name))

    def _end(self, step: Step | None, name: str | None) -> SuperstepRecord | Step:
        """End a superstep; the hot path keeps the closed step (its record is built lazily)."""
        if self._native is not None:
            self._native.counterd_superstep_mark(step.index if step else -1, 1)
        end_ns = time.monotonic_ns()
        st = self._state()
        stack = st.stack
        if step is None:
            if not stack:
                return self._unmatched_end(name or "?", end_ns)
            step = stack[-1]
        if step.closed:
            return self._unmatched_end(step.name, end_ns)
        if step.streams and st.group is not None:
            feed = st.group.feed  # type: ignore[attr-defined]
            for stream in step.streams:  # simulated after end_ns: not part of the time
                feed(stream)
            step.streams.clear()
        step.stop = st.read() if st.read is not None else None
        step.end_ns = end_ns
        step.end_cpu = current_cpu()
        step.unsupported = st.unsupported
        if stack and stack[-1] is step:
            stack.pop()
        elif step in stack:
            stack.remove(step)
        step.closed = True
        self._open.pop(id(step), None)
        self.sink.closed(step)
        return step

    def _parts(self, step: Step) -> tuple[dict[str, CounterValue], frozenset[str],
                                          dict[str, str]]:
        """A closed step's counters, flags and unsupported counters (end_ns None: it never
        ended)."""
        counters: dict[str, CounterValue] = {}
        unsupported = dict(step.unsupported) if step.unsupported else {}
        start, stop = step.start, step.stop
        if start is not None and stop is not None:
            counters, group_unsupported = step.delta(start, stop)
            if group_unsupported:
                unsupported.update(group_unsupported)
        elif self._backend_error and self.backend_name not in ("none", "callgrind"):
            unsupported.setdefault("*", self._backend_error)
        flags = step.flags
        if step.end_ns is None:
            flags = flags | _INCOMPLETE
        elif step.end_cpu != step.cpu:
            flags = flags | _MIGRATED
        for cv in counters.values():
            if cv.ratio < 1.0:
                flags = flags | _MULTIPLEXED
                break
        if unsupported:
            flags = flags | _UNSUPPORTED
        return counters, flags, unsupported

    def _materialise(self, step: Step) -> SuperstepRecord:
        counters, flags, unsupported = self._parts(step)
        return SuperstepRecord(
            run_id=self.run_id, index=step.index, name=step.name, rank=step.rank,
            pid=self.pid, cpu=step.cpu, begin_ns=step.begin_ns, end_ns=step.end_ns,
            counters=counters, params=step.params, flags=flags,
            unsupported=unsupported, backend=self._ctx[3], host=self.host)

    def _unmatched_end(self, name: str, end_ns: int) -> SuperstepRecord:
        rec = SuperstepRecord(
            run_id=self.run_id, index=next(self._indices), name=name, rank=self.rank(),
            pid=self.pid, cpu=current_cpu(), begin_ns=end_ns, end_ns=end_ns,
            flags=frozenset({"unmatched_end"}), backend=self._label(), host=self.host)
        self.sink.record(rec)
        return rec

    def _label(self) -> str:
        if self._backend is not None:
            return str(self._backend.name)
        if self.backend_name == "daemon" or (self.backend_name == "default"
                                             and isinstance(self.sink, SocketSink)
                                             and self._backend_error is not None):
            return "perf"  # the daemon counts with perf
        return "perf" if self.backend_name == "default" else self.backend_name

    def close_open_steps(self) -> list[SuperstepRecord]:
        """Record every superstep still open as ``incomplete`` (called at interpreter exit)."""
        out = []
        for step in list(self._open.values()):
            if not step.closed:
                step.closed = True
                rec = step.record()
                self.sink.record(rec)
                out.append(rec)
        self._open.clear()
        return out


# --------------------------------------------------------------------------------------------
# Module-level API: one recorder per process.

_recorder: Recorder | None = None
_recorder_lock = threading.Lock()


def recorder() -> Recorder:
    global _recorder
    rec = _recorder
    if rec is None or rec.pid != _pid:
        with _recorder_lock:
            if _recorder is None or _recorder.pid != _pid:
                _recorder = Recorder() if _recorder is None else _fork_copy(_recorder)
            rec = _recorder
    return rec


def _fork_copy(parent: Recorder) -> Recorder:
    """A child's recorder: same run, backend, events and sink target; fresh counters and
    supersteps (the parent's open supersteps are the parent's) and, through the daemon, its
    own connection (the parent's is never used by the child)."""
    spool = parent.sink.directory if isinstance(parent.sink, SpoolSink) else None
    sock: Path | str = "off"
    if isinstance(parent.sink, SocketSink) and parent.sink.degraded is None:
        sock = parent.sink.path
    child = Recorder(run_id=parent.run_id, backend=parent.backend_name,
                     events=parent.events or None, spool=spool, socket=sock)
    if isinstance(parent.sink, MemorySink):
        child.sink = parent.sink  # the child's copy of the parent's list, in the child
    return child


def _make_sink(spool: Path | None, sock: Path | str | None
               ) -> MemorySink | SpoolSink | SocketSink:
    """The sink, by the precedence in the module docstring."""
    env = os.environ
    if spool:
        return SpoolSink(spool)
    if sock is not None and str(sock) not in ("", "off"):
        try:
            return SocketSink(sock)
        except (OSError, ConnectionError) as exc:
            raise BadInput(f"cannot reach counterd at {sock}: {exc}",
                           "start it (counterd run) or leave the socket unset") from exc
    if env.get(ENV_SPOOL):
        return SpoolSink(Path(env[ENV_SPOOL]))
    if sock is None:
        path = env.get(ENV_SOCKET)
        explicit = path is not None
        if path is None:
            from counterd.daemon.config import default_socket_path

            default = default_socket_path()
            path = str(default) if default.exists() else None
        if path and path != "off":
            try:
                return SocketSink(path)
            except (OSError, ConnectionError) as exc:
                (log.warning if explicit else log.debug)(
                    "counterd daemon at %s unreachable (%s); records stay in memory", path, exc)
    return MemorySink()


def configure(*, backend: str | None = None, events: Sequence[str] | None = None,
              spool: Path | None = None, run_id: str | None = None,
              socket: Path | str | None = None) -> Recorder:
    """Replace this process's recorder (before the first superstep, typically).
    ``socket``: the daemon's socket path (``"off"``: do not use a daemon)."""
    global _recorder
    with _recorder_lock:
        if _recorder is not None:
            _recorder.close_open_steps()
            if isinstance(_recorder.sink, SocketSink):
                _recorder.sink.close()
        _recorder = Recorder(run_id=run_id, backend=backend, events=events, spool=spool,
                             socket=socket)
        return _recorder


def set_rank(rank: int, *, thread: bool = False) -> None:
    """Declare this process's (or, with ``thread=True``, this thread's) processor id."""
    recorder().set_rank(rank, thread=thread)


def begin(name: str, **params: Param) -> Step:
    return recorder().begin(name, params)


def end(step: Step | None = None, *, name: str | None = None) -> SuperstepRecord:
    return recorder().end(step, name)


def superstep(name: str, **params: Param) -> Step:
    """``with superstep(name, **params) as step:`` marks one superstep of this processor."""
    return recorder().begin(name, params)


def records() -> list[SuperstepRecord]:
    """Records kept in memory by this process (empty when they go to a spool)."""
    sink = recorder().sink
    if isinstance(sink, SocketSink):
        sink = sink.fallback
    return list(sink.records) if isinstance(sink, MemorySink) else []


@atexit.register
def _at_exit() -> None:
    rec = _recorder
    if rec is not None and rec.pid == _pid:
        rec.close_open_steps()
        if isinstance(rec.sink, SocketSink):
            try:
                timeout = float(os.environ.get(ENV_FLUSH_TIMEOUT, "10"))
            except ValueError:
                timeout = 10.0
            rec.sink.close(timeout)


# --------------------------------------------------------------------------------------------
# Collecting a spool (used by ``counterd record``).


def collect_spool(directory: Path) -> Iterator[SuperstepRecord]:
    """Records from every ``<pid>.jsonl`` in ``directory``; a begin without a record becomes an
    ``incomplete`` record (the process died inside the superstep). A torn last line (killed
    mid-write is impossible for one write(2) below PIPE_BUF, but a full disk is not) is
    skipped and reported as an incomplete record if its begin survived."""
    for path in sorted(Path(directory).glob("*.jsonl")):
        begins: dict[tuple[str, int], dict[str, Any]] = {}
        ended: set[tuple[str, int]] = set()
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    continue
                key = (str(d.get("run_id")), int(d.get("index", -1)))
                if d.get("ev") == "begin":
                    begins[key] = d
                elif d.get("ev") == "record":
                    ended.add(key)
                    yield SuperstepRecord.from_json(d)
        for key, d in begins.items():
            if key not in ended:
                yield SuperstepRecord(
                    run_id=d["run_id"], index=d["index"], name=d["name"], rank=d["rank"],
                    pid=d["pid"], cpu=d["cpu"], begin_ns=d["begin_ns"], end_ns=None,
                    params=d.get("params", {}), flags=frozenset({"incomplete"}),
                    backend=d.get("backend", "none"), host=d.get("host", ""))
