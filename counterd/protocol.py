"""The marker socket's wire protocol: length-prefixed, versioned frames (DESIGN.md section 6).

Frame layout (all integers big-endian)::

    +----------------+---------+------+-------------------------------+
    | length: uint32 | version | type | payload: UTF-8 JSON object    |
    |                | uint8   | uint8| (length - 2 bytes)            |
    +----------------+---------+------+-------------------------------+

``length`` counts the version byte, the type byte and the payload. The receiver checks it
against its limit (:data:`MAX_FRAME_BYTES` by default, ``max_frame_bytes`` in the daemon's
config) *before* reading the body, so an oversized length is rejected without buffering it.
``version`` is :data:`PROTOCOL_VERSION`; a frame of another version is answered with an
``ERROR`` and the connection is closed. The payload is one JSON object (compact separators).

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
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterator, Mapping
from typing import Any

PROTOCOL_VERSION = 1
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
    ACK = 16
    STARTED = 17
    READING = 18
    ERROR = 31


_KNOWN_TYPES = frozenset(int(t) for t in FrameType)
CLIENT_TYPES = frozenset({FrameType.HELLO, FrameType.BEGIN, FrameType.RECORD, FrameType.READ,
                          FrameType.SYNC})


class ProtocolError(Exception):
    """The peer broke the protocol. ``code`` is a short, bounded reason (a metric label)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def encode(ftype: FrameType, payload: Mapping[str, Any]) -> bytes:
    """One frame. Raises ValueError for a payload that is not JSON (NaN included)."""
    body = _dumps(payload).encode()
    return HEADER.pack(len(body) + 2, PROTOCOL_VERSION, ftype) + body


def encode_raw(ftype: FrameType, body: bytes) -> bytes:
    """One frame around an already encoded JSON body (the client's hot path)."""
    return HEADER.pack(len(body) + 2, PROTOCOL_VERSION, ftype) + body


class Decoder:
    """Incremental decoder: ``feed(bytes)`` then iterate ``frames()``.

    Raises :class:`ProtocolError` for a length above ``max_frame`` or below 2, another
    version, an unknown type, or a payload that is not a JSON object. After a framing error
    (length, version) the stream cannot be resynchronised and the caller must close it; a
    bad payload in a well-framed frame (``code`` ``bad_json``, ``bad_type``) leaves the
    decoder usable.
    """

    __slots__ = ("max_frame", "_buf", "broken")

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self.broken = False

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held (non-zero at EOF means a half-sent frame)."""
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> Iterator[tuple[FrameType, dict[str, Any]]]:
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
            if version != PROTOCOL_VERSION:
                self.broken = True
                raise ProtocolError("version", f"protocol version {version} is not "
                                    f"{PROTOCOL_VERSION}")
            if ftype not in _KNOWN_TYPES:
                raise ProtocolError("bad_type", f"unknown frame type {ftype}")
            try:
                payload = json.loads(body)
            except (UnicodeDecodeError, ValueError) as exc:
                raise ProtocolError("bad_json", f"payload is not JSON ({exc})") from None
            if not isinstance(payload, dict):
                raise ProtocolError("bad_json", "payload is not a JSON object")
            yield FrameType(ftype), payload
