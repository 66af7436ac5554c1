"""The marker socket's wire protocol: length-prefixed, versioned frames (DESIGN.md section 6).

The protocol itself (frame layout, the conversation, the binary hot-path frames, the black
box, sequence numbers and acks, authorisation, version history) is specified in
docs/protocol.md. Here: the typed frames, one frozen dataclass per frame type
(:class:`Hello`, :class:`Welcome`, :class:`Context`, :class:`Begin`, :class:`Open`,
:class:`Close`, :class:`Record`, :class:`Read`, :class:`Sync`, :class:`Buffer`, :class:`Ack`,
:class:`Started`, :class:`Reading`, :class:`Error`, :class:`Query`, :class:`Result`) with
``encode(version)`` and a ``decode`` class method (OPEN and CLOSE in
:mod:`counterd.wire.binary_frames`, QUERY and RESULT in :mod:`counterd.wire.query_frames`, their
base in :mod:`counterd.wire.json_frame`); :func:`decode` and :meth:`Decoder.typed_frames`
dispatch on the type. A CLOSE's counters are :class:`~counterd.wire.binary_frames.WireCounter`
records (name, source, value, ratio, raw), named by its context's ``counters``, so
``Close.decode`` takes those names. The marker's hot path encodes with :func:`encode_open`
and :func:`encode_close` (no dataclass built per superstep).
:meth:`Decoder.frames` stays the raw layer: ``(type, dict)``, or ``(type, bytes)`` for OPEN and
CLOSE.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from counterd.data.errors import BadInput
from counterd.data.events import CounterValue, Source
from counterd.data.records import INT32_MAX, INT64_MAX, MAX_ID_CHARS, UINT64_MAX, SuperstepRecord
from counterd.util import strictjson
from counterd.wire.binary_frames import Close, Open, head
from counterd.wire.framing import (
    _HEAD_PREFIX,  # noqa: F401 (re-exported)
    _KNOWN_TYPES,
    _LENGTH_PREFIX,
    _V1_TYPES,
    ACCEPTED_VERSIONS,  # noqa: F401 (re-exported)
    BINARY_TYPES,
    CLIENT_TYPES,  # noqa: F401 (re-exported)
    CLOSE_HEAD,  # noqa: F401 (re-exported)
    COUNTER,  # noqa: F401 (re-exported)
    FLAG_BIT,  # noqa: F401 (re-exported)
    FLAG_BITS,  # noqa: F401 (re-exported)
    HEADER,  # noqa: F401 (re-exported)
    HEADER_BYTES,
    MAX_FRAME_BYTES,
    NO_RAW,  # noqa: F401 (re-exported)
    OPEN_HEAD,  # noqa: F401 (re-exported)
    PROTOCOL_VERSION,
    SOURCE_INDEX,  # noqa: F401 (re-exported)
    SOURCES,
    CounterLike,  # noqa: F401 (re-exported)
    FrameType,
    ProtocolError,
    bit_flags,  # noqa: F401 (re-exported)
    dumps_payload,  # noqa: F401 (re-exported)
    encode,  # noqa: F401 (re-exported)
    encode_close,  # noqa: F401 (re-exported)
    encode_open,  # noqa: F401 (re-exported)
    encode_raw,  # noqa: F401 (re-exported)
    flag_bits,  # noqa: F401 (re-exported)
)
from counterd.wire.json_frame import JsonFrame, is_int, reply_error, seq_field
from counterd.wire.query_frames import Query, Result

# The framing and the hot-path encoders live in counterd.wire.framing (which the markers import
# without the typed frames below); every name there is this module's too. The binary frames
# (counterd.wire.binary_frames) and the query frames (counterd.wire.query_frames) have their own
# modules; this one decodes them in a stream.
_SOURCE = {s: Source(s) for s in SOURCES}


# -- typed frames -------------------------------------------------------------------------------
MAX_COUNTERS = 64  # names in one CONTEXT (counterd.data.events knows fewer than 20)


MAX_BATCH_JOB = 64  # characters of a HELLO batch_job (Slurm "123_4", PBS "123.server")


@dataclass(frozen=True, slots=True)
class Hello(JsonFrame):
    """c: the first frame, exactly once. The daemon takes pid and uid from SO_PEERCRED."""

    TYPE: ClassVar[FrameType] = FrameType.HELLO
    pid: int | None = None
    host: str | None = None
    run_id: str | None = None
    job: str | None = None
    batch_job: str | None = None  # the batch system's job id (counterd.data.env.batch_job)
    scratch: bool = False  # every context of the connection will be scratch (calibration)

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in (("pid", self.pid), ("host", self.host),
                                                 ("run_id", self.run_id), ("job", self.job),
                                                 ("batch_job", self.batch_job))
                               if v is not None}
        if self.scratch:
            out["scratch"] = True
        return out

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Hello:
        """Never refuses: a field of the wrong type is None, a job other than an empty value is
        a string; a batch_job that is not a short printable string is None; scratch is
        ``true`` or not (anything else)."""
        pid, host, run_id, job = p.get("pid"), p.get("host"), p.get("run_id"), p.get("job")
        batch = p.get("batch_job")
        return cls(pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                   host if isinstance(host, str) else None,
                   run_id if isinstance(run_id, str) else None,
                   str(job) if job else None,
                   batch if isinstance(batch, str) and 0 < len(batch) <= MAX_BATCH_JOB
                   and batch.isprintable() else None,
                   p.get("scratch") is True)


@dataclass(frozen=True, slots=True)
class Welcome(JsonFrame):
    """d: the answer to HELLO, in the client's version: what SO_PEERCRED said about it."""

    TYPE: ClassVar[FrameType] = FrameType.WELCOME
    version: int
    max_frame: int
    uid: int
    pid: int
    buffer: bool = False  # the daemon takes a BUFFER (absent: it does not)
    scratch: bool = False  # it keeps nothing of a CONTEXT marked scratch (absent: it would)

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "max_frame": self.max_frame,
                               "uid": self.uid, "pid": self.pid}
        if self.buffer:
            out["buffer"] = True
        if self.scratch:
            out["scratch"] = True
        return out

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Welcome:
        try:
            return cls(int(p["version"]), int(p["max_frame"]), int(p["uid"]), int(p["pid"]),
                       p.get("buffer") is True, p.get("scratch") is True)
        except (KeyError, TypeError, ValueError) as exc:
            raise reply_error(cls.TYPE, exc) from None


@dataclass(frozen=True, slots=True)
class Context(JsonFrame):
    """c: what the OPENs and CLOSEs naming context ``c`` on this connection share; a CLOSE
    carries one counter per name of ``counters``, in that order."""

    TYPE: ClassVar[FrameType] = FrameType.CONTEXT
    s: int
    c: int
    run_id: str
    pid: int
    host: str
    backend: str
    counters: tuple[str, ...] = ()
    marker_ns: int | None = None  # the process's marker pair cost (SuperstepRecord.marker_ns)
    # The supersteps of a scratch context are acknowledged and never kept, nor made incomplete
    # records: the markers' calibration through the socket (a daemon whose WELCOME offers it).
    scratch: bool = False

    def payload(self) -> dict[str, Any]:
        out = {"s": self.s, "c": self.c, "run_id": self.run_id, "pid": self.pid,
               "host": self.host, "backend": self.backend, "counters": list(self.counters)}
        if self.marker_ns is not None:
            out["marker_ns"] = self.marker_ns
        if self.scratch:
            out["scratch"] = True
        return out

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Context:
        s = seq_field(p)
        try:
            c, run_id, pid = p["c"], p["run_id"], p["pid"]
            host, backend, names = p["host"], p["backend"], p.get("counters", [])
            marker, scratch = p.get("marker_ns"), p.get("scratch", False)
            if not ((marker is None or is_int(marker, 0, INT64_MAX))
                    and isinstance(scratch, bool)
                    and is_int(c, 1, 0xFFFF) and isinstance(run_id, str)
                    and 0 < len(run_id) <= MAX_ID_CHARS and is_int(pid, 0, INT32_MAX)
                    and isinstance(host, str) and len(host) <= MAX_ID_CHARS
                    and isinstance(backend, str) and len(backend) <= MAX_ID_CHARS
                    and isinstance(names, list) and len(names) <= MAX_COUNTERS
                    and all(isinstance(n, str) and len(n) <= MAX_ID_CHARS for n in names)):
                raise TypeError("fields of the wrong type or beyond their limits")
        except (KeyError, TypeError) as exc:
            raise ProtocolError("bad_context", f"malformed CONTEXT ({exc})") from None
        return cls(s, c, run_id, pid, host, backend, tuple(names), marker, scratch)


@dataclass(frozen=True, slots=True)
class Begin(JsonFrame):
    """c: a superstep begins. ``line`` is the begin line (the receiver checks its fields);
    ``count``, if not None, asks the daemon to count ``line["tid"]`` on the client's behalf
    (as sent: a malformed one is reported in the STARTED)."""

    TYPE: ClassVar[FrameType] = FrameType.BEGIN
    s: int
    line: Mapping[str, Any]
    count: Any = None

    def payload(self) -> dict[str, Any]:
        p: dict[str, Any] = {"s": self.s, "line": self.line}
        if self.count is not None:
            p["count"] = self.count
        return p

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Begin:
        s = seq_field(p)
        line = p.get("line")
        if not isinstance(line, dict):
            raise ProtocolError("bad_begin", "malformed begin line (no begin line)")
        return cls(s, line, p.get("count"))


@dataclass(frozen=True, slots=True)
class Record(JsonFrame):
    """c: a finished superstep's record."""

    TYPE: ClassVar[FrameType] = FrameType.RECORD
    s: int
    rec: SuperstepRecord

    def payload(self) -> dict[str, Any]:
        return {"s": self.s, "rec": self.rec.to_json()}

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Record:
        s = seq_field(p)
        body = p.get("rec")
        try:
            if not isinstance(body, dict):
                raise BadInput("no record in the frame")
            rec = SuperstepRecord.from_json(body)
        except BadInput as exc:
            raise ProtocolError("bad_record", str(exc)) from None
        return cls(s, rec)


@dataclass(frozen=True, slots=True)
class Read(JsonFrame):
    """c: the counters ``count`` of thread ``tid`` (None: the main thread) of ``pid``,
    cumulative since the first READ of them."""

    TYPE: ClassVar[FrameType] = FrameType.READ
    s: int
    pid: int
    tid: int | None = None
    count: tuple[str, ...] = ()

    def payload(self) -> dict[str, Any]:
        return {"s": self.s, "pid": self.pid, "tid": self.tid, "count": list(self.count)}

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Read:
        s = seq_field(p)
        pid, tid, count = p.get("pid"), p.get("tid") or None, p.get("count", [])
        # tid 0 and null mean the main thread
        if (is_int(pid, 1, INT32_MAX) and (tid is None or is_int(tid, 1, INT32_MAX))
                and isinstance(count, list) and len(count) <= MAX_COUNTERS
                and all(isinstance(e, str) and len(e) <= MAX_ID_CHARS for e in count)):
            return cls(s, pid, tid, tuple(count))
        raise ProtocolError("bad_read", "malformed READ (pid and tid must be integers in "
                            f"[1, 2^31), count a list of at most {MAX_COUNTERS} names)")


@dataclass(frozen=True, slots=True)
class Sync(JsonFrame):
    """c: asks for an ACK now."""

    TYPE: ClassVar[FrameType] = FrameType.SYNC
    s: int

    def payload(self) -> dict[str, Any]:
        return {"s": self.s}

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Sync:
        return cls(seq_field(p))


@dataclass(frozen=True, slots=True)
class Buffer(JsonFrame):
    """c: the client's black box comes with this frame (one descriptor, ``SCM_RIGHTS``): a
    memory file in the mapped spool form (:func:`counterd.wire.spool.read_box`) holding the frames
    it has written but not sent yet, its head naming this connection ``box`` (the same file
    serves the client's later connections). Only to a daemon whose WELCOME says ``"buffer":
    true``."""

    TYPE: ClassVar[FrameType] = FrameType.BUFFER
    s: int
    box: int

    def payload(self) -> dict[str, Any]:
        return {"s": self.s, "box": self.box}

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Buffer:
        s, box = seq_field(p), p.get("box")
        if not is_int(box, 0, UINT64_MAX):
            raise ProtocolError("bad_buffer", f"BUFFER's box {box!r:.40} is not an integer in "
                                "[0, 2^64)")
        return cls(s, box)


@dataclass(frozen=True, slots=True)
class Ack(JsonFrame):
    """d: every frame up to ``s`` is processed and every record among them is durable."""

    TYPE: ClassVar[FrameType] = FrameType.ACK
    s: int

    def payload(self) -> dict[str, Any]:
        return {"s": self.s}

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Ack:
        return cls(seq_field(p))


@dataclass(frozen=True, slots=True)
class Started(JsonFrame):
    """d: the reply to a BEGIN that asked the daemon to count; ``unsupported`` says why it
    could not."""

    TYPE: ClassVar[FrameType] = FrameType.STARTED
    s: int
    unsupported: str | None = None

    def payload(self) -> dict[str, Any]:
        if self.unsupported is None:
            return {"s": self.s}
        return {"s": self.s, "unsupported": self.unsupported}

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Started:
        why = p.get("unsupported")
        return cls(seq_field(p), None if why is None else str(why))


@dataclass(frozen=True, slots=True)
class Reading(JsonFrame):
    """d: the reply to a READ: counter -> (value, multiplexing ratio), and the counters that
    could not be read with the reason."""

    TYPE: ClassVar[FrameType] = FrameType.READING
    s: int
    values: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    unsupported: Mapping[str, str] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        return {"s": self.s, "values": {k: list(v) for k, v in self.values.items()},
                "unsupported": dict(self.unsupported)}

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Reading:
        s = seq_field(p)
        try:
            values = {str(k): (float(v[0]), float(v[1])) for k, v in p["values"].items()}
            unsupported = {str(k): str(v) for k, v in p.get("unsupported", {}).items()}
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise reply_error(cls.TYPE, exc) from None
        return cls(s, values, unsupported)


@dataclass(frozen=True, slots=True)
class Error(JsonFrame):
    """d: a refused frame (``s``, when the refusal is about one) or a broken connection."""

    TYPE: ClassVar[FrameType] = FrameType.ERROR
    code: str
    message: str
    s: int | None = None

    def payload(self) -> dict[str, Any]:
        if self.s is None:
            return {"code": self.code, "message": self.message}
        return {"code": self.code, "message": self.message, "s": self.s}

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Error:
        s = p.get("s")
        return cls(str(p.get("code")), str(p.get("message")),
                   s if isinstance(s, int) and not isinstance(s, bool) else None)


def record_of(ctx: Context, opened: Open, close: Close) -> SuperstepRecord:
    """The record a CLOSE completes: the OPEN's name, rank, cpu and params, the CLOSE's times,
    flags, counters and unsupported counters, the context's run, pid, host and backend (the
    daemon's sessions and the marker spool build it alike). ValueError if the record is not
    valid (:class:`SuperstepRecord`'s checks)."""
    return SuperstepRecord(
        run_id=ctx.run_id, index=close.index, name=opened.name, rank=opened.rank, pid=ctx.pid,
        cpu=opened.cpu, begin_ns=close.begin_ns, end_ns=close.end_ns,
        counters={k.name: CounterValue(k.value, _SOURCE[k.source], k.ratio, k.raw)
                  for k in close.counters},
        params=opened.params, flags=close.flags, unsupported=close.unsupported,
        backend=ctx.backend, host=ctx.host, marker_ns=ctx.marker_ns)


def begin_line(ctx: Context, opened: Open) -> dict[str, Any]:
    """The begin line an OPEN stands for (the fields of a JSON ``BEGIN``'s line)."""
    return {"run_id": ctx.run_id, "index": opened.index, "name": opened.name,
            "rank": opened.rank, "pid": ctx.pid, "cpu": opened.cpu,
            "begin_ns": opened.begin_ns, "params": dict(opened.params),
            "backend": ctx.backend, "host": ctx.host, "marker_ns": ctx.marker_ns}


ClientFrame = Hello | Context | Begin | Open | Close | Record | Read | Sync | Buffer | Query
DaemonFrame = Welcome | Ack | Started | Reading | Error | Result
Frame = ClientFrame | DaemonFrame

_JSON_DECODERS: dict[FrameType, Callable[[Mapping[str, Any]], Frame]] = {
    FrameType.HELLO: Hello.decode, FrameType.WELCOME: Welcome.decode,
    FrameType.CONTEXT: Context.decode, FrameType.BEGIN: Begin.decode,
    FrameType.RECORD: Record.decode, FrameType.READ: Read.decode, FrameType.SYNC: Sync.decode,
    FrameType.BUFFER: Buffer.decode,
    FrameType.ACK: Ack.decode, FrameType.STARTED: Started.decode,
    FrameType.READING: Reading.decode, FrameType.ERROR: Error.decode,
    FrameType.QUERY: Query.decode, FrameType.RESULT: Result.decode}


def decode(ftype: FrameType, payload: Any, names: Sequence[str] | None = None) -> Frame:
    """The typed frame of a ``(type, payload)`` from :meth:`Decoder.frames`. A CLOSE needs
    ``names``, its context's counters (ProtocolError ``unknown_context`` without them).
    Raises ProtocolError with the code the daemon refuses such a frame with."""
    if ftype is FrameType.OPEN:
        return Open.decode(payload)
    if ftype is FrameType.CLOSE:
        if names is None:
            raise ProtocolError("unknown_context", f"CLOSE names context "
                                f"{head(ftype, payload).c}, not declared")
        return Close.decode(payload, names)
    return _JSON_DECODERS[ftype](payload)


class Decoder:
    """Incremental decoder: ``feed(bytes)`` then iterate ``frames()`` (or ``typed_frames()``).

    Raises :class:`ProtocolError` for a length above ``max_frame`` or below 2, another
    version, an unknown type, or a payload that is not a JSON object. After a framing error
    (length, version) the stream cannot be resynchronised and the caller must close it; a
    bad payload in a well-framed frame (``code`` ``bad_json``, ``bad_type``) leaves the
    decoder usable.
    """

    __slots__ = ("max_frame", "_buf", "broken", "versions", "version", "_counters",
                 "last_size")

    def __init__(self, max_frame: int = MAX_FRAME_BYTES,
                 versions: frozenset[int] = frozenset({PROTOCOL_VERSION})) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self.broken = False
        self.versions = versions
        self.version: int | None = None  # of the first frame; a stream keeps one version
        self._counters: dict[int, tuple[str, ...]] = {}  # typed_frames: CONTEXT c -> counters
        self.last_size = 0  # bytes of the last frame yielded (what holding it costs)

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held (non-zero at EOF means a half-sent frame)."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self, skip: frozenset[int] = frozenset()) -> Iterator[tuple[FrameType, Any]]:
        """(type, payload): a dict, or ``bytes`` for the binary types (OPEN, CLOSE). Frames
        of the types in ``skip`` are taken off the stream unread (not yielded)."""
        buf = self._buf
        while not self.broken and len(buf) >= _LENGTH_PREFIX:
            length = int.from_bytes(buf[:_LENGTH_PREFIX], "big")
            if length < 2 or length > self.max_frame:
                self.broken = True
                raise ProtocolError("oversized" if length > self.max_frame else "short",
                                    f"frame length {length} outside [2, {self.max_frame}]")
            if len(buf) < _LENGTH_PREFIX + length:
                return
            version, ftype = buf[4], buf[5]
            body = bytes(buf[HEADER_BYTES:_LENGTH_PREFIX + length])
            del buf[:_LENGTH_PREFIX + length]
            self.last_size = _LENGTH_PREFIX + length
            if version != self.version:
                if self.version is not None or version not in self.versions:
                    self.broken = True
                    raise ProtocolError("version", f"protocol version {version} is not "
                                        + (str(self.version) if self.version is not None else
                                           " or ".join(map(str, sorted(self.versions))))
                                        + "; upgrade the older side (client or counterd)")
                self.version = version
            if ftype not in (_KNOWN_TYPES if version >= 2 else _V1_TYPES):
                raise ProtocolError("bad_type", f"unknown frame type {ftype} in version "
                                    f"{version}")
            if ftype in skip:
                continue
            if ftype in BINARY_TYPES:
                yield FrameType(ftype), body
                continue
            try:
                payload = strictjson.loads(body)
            except strictjson.Malformed as exc:
                raise ProtocolError("bad_json", f"payload is not strict JSON ({exc})") from None
            if not isinstance(payload, dict):
                raise ProtocolError("bad_json", "payload is not a JSON object")
            yield FrameType(ftype), payload

    def typed_frames(self) -> Iterator[Frame]:
        """:meth:`frames` as typed values (:func:`decode`). A CLOSE's counters are named by the
        CONTEXT of its ``c`` seen earlier in this stream. A frame that does not decode raises
        ProtocolError and is dropped; iterating again goes on with the next."""
        for ftype, payload in self.frames():
            names = self._counters.get(head(ftype, payload).c) \
                if ftype is FrameType.CLOSE else None
            frame = decode(ftype, payload, names)
            if isinstance(frame, Context):
                self._counters[frame.c] = frame.counters
            yield frame
