"""The marker socket's wire protocol: length-prefixed, versioned frames (DESIGN.md section 6).

Frame layout (all integers big-endian)::

    +----------------+---------+------+-------------------------------+
    | length: uint32 | version | type | payload: UTF-8 JSON object    |
    |                | uint8   | uint8| (length - 2 bytes)            |
    +----------------+---------+------+-------------------------------+

``length`` counts the version byte, the type byte and the payload. The receiver checks it
against its limit (:data:`MAX_FRAME_BYTES` by default, ``max_frame_bytes`` in the daemon's
config) *before* reading the body, so an oversized length is rejected without buffering it.
``version`` is :data:`PROTOCOL_VERSION` or an older version in :data:`ACCEPTED_VERSIONS`; a
frame of another version is answered with an ``ERROR`` and the connection is closed. The daemon
answers each client in the version of its HELLO. The payload is one JSON object (compact
separators), except for the binary hot-path frames ``OPEN`` and ``CLOSE`` (version 2).

Conversation (``c`` = client, ``d`` = daemon)::

    c: HELLO   {"pid", "host", "run_id", "job"}      first frame, exactly once
    d: WELCOME {"version", "max_frame", "uid", "pid"} what SO_PEERCRED said about the client
    c: BEGIN   {"s": seq, "line": {begin line}, "count": [counters]?}
    c: RECORD  {"s": seq, "rec": {SuperstepRecord JSON}}
    c: READ    {"s": seq, "pid": pid, "tid": tid?, "count": [counters]}
    c: SYNC    {"s": seq}                             ask for an ACK now
    d: ACK     {"s": seq}            every frame with seq <= s is processed and every record
                                     among them is committed to the store (durable)
    d: STARTED {"s": seq}            reply to a BEGIN that asked the daemon to count
    d: READING {"s": seq, "values": {counter: [value, ratio]}, "unsupported": {...}}
    d: ERROR   {"s": seq?, "code": str, "message": str}

Version 2 adds a cheaper hot path (one marker pair = one ``OPEN`` + one ``CLOSE``, struct-packed,
no JSON unless the superstep has params or unsupported counters)::

    c: CONTEXT {"s": seq, "c": ctx, "run_id", "pid", "host", "backend", "counters": [names]}
    c: OPEN    binary: OPEN_HEAD (seq, ctx, index, begin_ns, rank, cpu, name bytes), the name
               (UTF-8), then the params as a JSON object, or nothing for no params
    c: CLOSE   binary: CLOSE_HEAD (seq, ctx, index, begin_ns, end_ns, flags bitmask,
               unsupported bytes),
               one COUNTER (source, value, ratio, raw) per name of the context's "counters",
               in that order, then the unsupported counters as a JSON object (or nothing)

A ``CONTEXT`` declares, once per connection, what every record of a run in this process shares
(``ctx`` is a small number the client picks, unique per connection). An ``OPEN`` is a
``BEGIN`` whose line is the context's fields plus the packed ones, and the daemon holds it the
same way. A ``CLOSE`` completes the superstep ``(context's run_id, index)`` whose ``OPEN`` was
sent on the same connection: the daemon builds the record from the held ``OPEN`` (name, rank,
cpu, params), the ``CLOSE`` (begin_ns and end_ns as the client took them, flags, counters named
by the ``CLOSE``'s context, unsupported) and the ``OPEN``'s context (run_id, pid, host,
backend); the ``OPEN``'s begin_ns is that of an incomplete record. A ``CLOSE`` without its
``OPEN`` is refused (``unknown_begin``). Flags are bits in the order of :data:`FLAG_BITS`, a
counter's source an index into :data:`SOURCES`, a raw count of ``None`` is :data:`NO_RAW`.
Clients send a record as ``RECORD`` whenever it does not fit (incomplete, resent after a
reconnect, counted by the daemon, an unknown flag).

Sequence numbers are per connection, strictly increasing, assigned by the client to every
frame after HELLO. Acks are cumulative and coalesced: a client that is slow to read sees one
ACK carrying the latest sequence number, never a backlog. A client keeps every record until
it is acknowledged; if the connection breaks it reconnects and resends them (the store ignores
duplicates, keyed on run, host, pid and superstep index) or, failing that, writes them to its
fallback sink.

A ``BEGIN`` carries the begin line (the same fields as a spool begin line); the daemon keeps
it until the matching ``RECORD`` arrives, and a connection that closes with begins still open
(the client died inside a superstep) gives ``incomplete`` records. ``"count"`` in a ``BEGIN``
asks the daemon to count the client's thread (``line.tid``) for the superstep on its behalf,
where the kernel forbids self-monitoring; the client waits for ``STARTED`` before running the
superstep, and the daemon adds the counts to the matching ``RECORD``.

Authorisation (SO_PEERCRED): a client may only have counters read for processes it owns (all
of the target's uids equal the client's uid); root, and members of the configured group, may
read any. A record for a run first seen from another uid is refused the same way.

Version history:
    1 - first version (HELLO, WELCOME, BEGIN, RECORD, READ, SYNC, ACK, STARTED, READING, ERROR).
    2 - CONTEXT, OPEN and CLOSE: a marker pair costs two small binary frames instead of a JSON
        begin line and a JSON record (issue 3: marker cost). Version 1 clients are still served
        (in version 1); version 2 frame types in a version 1 stream are ``bad_type``.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterator, Mapping
from typing import Any

PROTOCOL_VERSION = 2
ACCEPTED_VERSIONS = frozenset({1, 2})
MAX_FRAME_BYTES = 256 * 1024
HEADER = struct.Struct("!IBB")  # length, version, type
HEADER_BYTES = HEADER.size  # 6
_LENGTH_PREFIX = 4


class FrameType(enum.IntEnum):
    HELLO = 1
    WELCOME = 2
    BEGIN = 3
    RECORD = 4
    READ = 5
    SYNC = 6
    CONTEXT = 7
    OPEN = 8
    CLOSE = 9
    ACK = 16
    STARTED = 17
    READING = 18
    ERROR = 31


_KNOWN_TYPES = frozenset(int(t) for t in FrameType)
CLIENT_TYPES = frozenset({FrameType.HELLO, FrameType.BEGIN, FrameType.RECORD, FrameType.READ,
                          FrameType.SYNC, FrameType.CONTEXT, FrameType.OPEN, FrameType.CLOSE})
BINARY_TYPES = frozenset({int(FrameType.OPEN), int(FrameType.CLOSE)})  # payload is bytes
_V1_TYPES = _KNOWN_TYPES - {int(FrameType.CONTEXT)} - BINARY_TYPES

# Version 2 binary layouts (big-endian, no padding).
OPEN_HEAD = struct.Struct("!QHQQiiH")  # seq, ctx, index, begin_ns, rank, cpu, name bytes
CLOSE_HEAD = struct.Struct("!QHQQQIH")  # seq, ctx, index, begin_ns, end_ns, flags, unsupported
COUNTER = struct.Struct("!Bddq")  # source, value, ratio, raw
NO_RAW = -(1 << 63)  # COUNTER.raw for a counter without a raw count
# Wire constants: appending is compatible, reordering is not.
FLAG_BITS = ("incomplete", "unmatched_end", "nested", "exception", "multiplexed", "migrated",
             "unsupported_counters", "whole_command", "counters_from_separate_run",
             "counters_missing")
FLAG_BIT = {name: 1 << i for i, name in enumerate(FLAG_BITS)}
SOURCES = ("measured", "simulated", "extrapolated", "assumed")  # counterd.events.Source values


class ProtocolError(Exception):
    """The peer broke the protocol. ``code`` is a short, bounded reason (a metric label)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def encode(ftype: FrameType, payload: Mapping[str, Any], version: int = PROTOCOL_VERSION
           ) -> bytes:
    """One frame. Raises ValueError for a payload that is not JSON (NaN included)."""
    body = _dumps(payload).encode()
    return HEADER.pack(len(body) + 2, version, ftype) + body


def encode_raw(ftype: FrameType, body: bytes, version: int = PROTOCOL_VERSION) -> bytes:
    """One frame around an already encoded body (JSON, or binary for OPEN and CLOSE)."""
    return HEADER.pack(len(body) + 2, version, ftype) + body


def flag_bits(flags: frozenset[str]) -> int | None:
    """The CLOSE bitmask of ``flags``; None if one has no bit (send a RECORD instead)."""
    bits = 0
    for f in flags:
        bit = FLAG_BIT.get(f)
        if bit is None:
            return None
        bits |= bit
    return bits


def bit_flags(bits: int) -> frozenset[str]:
    if bits >> len(FLAG_BITS):
        raise ProtocolError("bad_close", f"unknown flag bits {bits:#x}")
    return frozenset(name for i, name in enumerate(FLAG_BITS) if bits >> i & 1)


class Decoder:
    """Incremental decoder: ``feed(bytes)`` then iterate ``frames()``.

    Raises :class:`ProtocolError` for a length above ``max_frame`` or below 2, another
    version, an unknown type, or a payload that is not a JSON object. After a framing error
    (length, version) the stream cannot be resynchronised and the caller must close it; a
    bad payload in a well-framed frame (``code`` ``bad_json``, ``bad_type``) leaves the
    decoder usable.
    """

    __slots__ = ("max_frame", "_buf", "broken", "versions", "version")

    def __init__(self, max_frame: int = MAX_FRAME_BYTES,
                 versions: frozenset[int] = frozenset({PROTOCOL_VERSION})) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self.broken = False
        self.versions = versions
        self.version: int | None = None  # of the first frame; a stream keeps one version

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held (non-zero at EOF means a half-sent frame)."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> Iterator[tuple[FrameType, Any]]:
        """(type, payload): a dict, or ``bytes`` for the binary types (OPEN, CLOSE)."""
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
            if ftype in BINARY_TYPES:
                yield FrameType(ftype), body
                continue
            try:
                payload = json.loads(body)
            except (UnicodeDecodeError, ValueError) as exc:
                raise ProtocolError("bad_json", f"payload is not JSON ({exc})") from None
            if not isinstance(payload, dict):
                raise ProtocolError("bad_json", "payload is not a JSON object")
            yield FrameType(ftype), payload
