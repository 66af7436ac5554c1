"""The marker socket's framing and the markers' hot-path encoders (docs/protocol.md specifies
the frames, the conversation and the version history; :mod:`counterd.wire.protocol`, which holds
the typed frames, re-exports every name here).

This is the part of the protocol a program's markers need to write frames (to the daemon's
socket, its black box or a mapped spool file): the frame header, the frame types, the binary
layouts of ``OPEN`` and ``CLOSE``, the flag bits and counter sources, and the encoders. It
builds no dataclass at import: the typed frames of :mod:`counterd.wire.protocol` (17 of them, each
compiled by :mod:`dataclasses` when the module is imported) are for the readers (the daemon,
spool readers, the client's replies), and loading them cost each recorded process as much
as the rest of counterd's own modules together: under Callgrind, where every counted process
runs its start-up 50-100x slower, 279 M instructions from start-up to the first superstep with
them, 211 M without (``bench/callgrind_startup.py``).
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from counterd.data.errors import PicklableError

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
    QUERY = 10
    BUFFER = 11
    ACK = 16
    STARTED = 17
    READING = 18
    RESULT = 19
    ERROR = 31


_KNOWN_TYPES = frozenset(int(t) for t in FrameType)
CLIENT_TYPES = frozenset({FrameType.HELLO, FrameType.BEGIN, FrameType.RECORD, FrameType.READ,
                          FrameType.SYNC, FrameType.CONTEXT, FrameType.OPEN, FrameType.CLOSE,
                          FrameType.QUERY, FrameType.BUFFER})
BINARY_TYPES = frozenset({int(FrameType.OPEN), int(FrameType.CLOSE)})  # payload is bytes
_V1_TYPES = _KNOWN_TYPES - {int(FrameType.CONTEXT), int(FrameType.BUFFER)} - BINARY_TYPES

# Version 2 binary layouts (big-endian, no padding).
OPEN_HEAD = struct.Struct("!QHQQiiH")  # seq, ctx, index, begin_ns, rank, cpu, name bytes
CLOSE_HEAD = struct.Struct("!QHQQQIH")  # seq, ctx, index, begin_ns, end_ns, flags, unsupported
COUNTER = struct.Struct("!Bddq")  # source, value, ratio, raw
NO_RAW = -(1 << 63)  # COUNTER.raw for a counter without a raw count
_HEAD_PREFIX = struct.Struct("!QHQ")  # seq, ctx, index: how both OPEN_HEAD and CLOSE_HEAD begin
# Wire constants: appending is compatible, reordering is not.
FLAG_BITS = ("incomplete", "unmatched_end", "nested", "exception", "multiplexed", "migrated",
             "unsupported_counters", "whole_command", "counters_from_separate_run",
             "counters_missing", "target_changed", "dropped_params", "cpu_features_hidden",
             "sampled", "counted_other_code")
FLAG_BIT = {name: 1 << i for i, name in enumerate(FLAG_BITS)}
SOURCES = ("measured", "simulated", "extrapolated", "assumed",  # counterd.data.events.Source values
           "sampled")
SOURCE_INDEX = {source: i for i, source in enumerate(SOURCES)}


class ProtocolError(PicklableError):
    """The peer broke the protocol. ``code`` is a short, bounded reason (a metric label)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


dumps_payload = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False,
                                 allow_nan=False).encode
"""A JSON payload as the wire has it (compact separators, UTF-8 kept, NaN refused)."""


def encode(ftype: FrameType, payload: Mapping[str, Any], version: int = PROTOCOL_VERSION
           ) -> bytes:
    """One frame. Raises ValueError for a payload that is not JSON (NaN included)."""
    body = dumps_payload(payload).encode()
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
    """The flags of a CLOSE bitmask; ProtocolError ``bad_close`` for a bit without a flag."""
    flags = _FLAGS_OF.get(bits)
    if flags is None:
        if bits >> len(FLAG_BITS):
            raise ProtocolError("bad_close", f"unknown flag bits {bits:#x}")
        flags = _FLAGS_OF[bits] = frozenset(name for i, name in enumerate(FLAG_BITS)
                                            if bits >> i & 1)
    return flags


_FLAGS_OF: dict[int, frozenset[str]] = {}  # bit_flags, memoised (2 ** len(FLAG_BITS) at most)


# -- the hot path: OPEN and CLOSE without building a dataclass ----------------------------------
# The frame header and the binary head are packed in one call.
_OPEN_FRAME = struct.Struct("!IBB" + OPEN_HEAD.format.lstrip("!"))
_CLOSE_FRAME = struct.Struct("!IBB" + CLOSE_HEAD.format.lstrip("!"))
_OPEN_LENGTH = 2 + OPEN_HEAD.size  # the length field of an OPEN without name and params
_CLOSE_LENGTH = 2 + CLOSE_HEAD.size
_OPEN = int(FrameType.OPEN)
_CLOSE = int(FrameType.CLOSE)
_pack_counter = COUNTER.pack


class CounterLike(Protocol):
    """What :func:`encode_close` reads of a counter: a :class:`WireCounter`, or a
    :class:`counterd.data.events.CounterValue` (its ``source`` is one of :data:`SOURCES`)."""

    @property
    def source(self) -> str: ...
    @property
    def value(self) -> float: ...
    @property
    def ratio(self) -> float: ...
    @property
    def raw(self) -> int | None: ...


def encode_open(s: int, c: int, index: int, begin_ns: int, rank: int, cpu: int, name: str,
                params: Mapping[str, Any] | None = None, version: int = PROTOCOL_VERSION
                ) -> bytes:
    """An OPEN frame (see :class:`Open`). Raises struct.error for a field beyond its packed
    range (send a BEGIN instead), ValueError for params that are not JSON."""
    nb = name.encode()
    tail = nb + dumps_payload(params).encode() if params else nb
    return _OPEN_FRAME.pack(_OPEN_LENGTH + len(tail), version, _OPEN, s, c, index, begin_ns,
                            rank, cpu, len(nb)) + tail


def encode_close(s: int, c: int, index: int, begin_ns: int, end_ns: int, flags: int,
                 counters: Iterable[CounterLike] = (),
                 unsupported: Mapping[str, str] | None = None,
                 version: int = PROTOCOL_VERSION) -> bytes:
    """A CLOSE frame (see :class:`Close`): ``flags`` is the bitmask of :func:`flag_bits`,
    ``counters`` in the order of the context's ``counters``. Raises KeyError for a source not
    in :data:`SOURCES`, struct.error for a field beyond its packed range, ValueError for
    unsupported counters that are not JSON (send a RECORD instead)."""
    tail = dumps_payload(unsupported).encode() if unsupported else b""
    packed = b"".join([_pack_counter(SOURCE_INDEX[k.source], k.value, k.ratio,
                                     NO_RAW if k.raw is None else k.raw) for k in counters])
    return _CLOSE_FRAME.pack(_CLOSE_LENGTH + len(packed) + len(tail), version, _CLOSE, s, c,
                             index, begin_ns, end_ns, flags, len(tail)) + packed + tail
