"""The binary frames of the marker socket, OPEN and CLOSE, as typed values (docs/protocol.md):
:class:`Open`, :class:`Close` with its :class:`WireCounter` counters, and the :class:`Head`
that a receiver reads first (:func:`head`) to find the context and the OPEN a frame names. The
markers encode them without these classes (:func:`counterd.wire.framing.encode_open`,
:func:`counterd.wire.framing.encode_close`); :mod:`counterd.wire.protocol` decodes a stream into
them.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from counterd.data.records import INT64_MAX, MAX_NAME_CHARS, params
from counterd.util import strictjson
from counterd.wire.framing import (
    _HEAD_PREFIX,
    CLOSE_HEAD,
    COUNTER,
    FLAG_BIT,
    NO_RAW,
    OPEN_HEAD,
    PROTOCOL_VERSION,
    SOURCES,
    FrameType,
    ProtocolError,
    bit_flags,
    encode_close,
    encode_open,
    flag_bits,
)


@dataclass(frozen=True, slots=True)
class Head:
    """How an OPEN's or a CLOSE's head begins: what the receiver looks up (the context, the
    OPEN of the superstep) before it decodes the rest."""

    s: int
    c: int
    index: int


def _check_head(ftype: FrameType, packed: struct.Struct, body: bytes) -> None:
    if len(body) < packed.size:
        raise ProtocolError("bad_frame", f"{ftype.name} of {len(body)} bytes is shorter "
                            f"than its {packed.size}-byte head")


_unpack_open = OPEN_HEAD.unpack_from
_unpack_close = CLOSE_HEAD.unpack_from
_iter_counters = COUNTER.iter_unpack
_new_tuple = tuple.__new__  # a WireCounter without NamedTuple's Python-level __new__


_OPEN_HEAD_SIZE = OPEN_HEAD.size
_CLOSE_HEAD_SIZE = CLOSE_HEAD.size


def head(ftype: FrameType, body: bytes) -> Head:
    """The :class:`Head` of an OPEN or CLOSE body; ProtocolError ``bad_frame`` when the body is
    shorter than its fixed head."""
    if len(body) < (_OPEN_HEAD_SIZE if ftype is FrameType.OPEN else _CLOSE_HEAD_SIZE):
        _check_head(ftype, OPEN_HEAD if ftype is FrameType.OPEN else CLOSE_HEAD, body)
    s, c, index = _HEAD_PREFIX.unpack_from(body)
    return Head(s, c, index)


@dataclass(frozen=True, slots=True)
class Open:
    """c (binary): superstep ``index`` of context ``c``'s run begins; ``begin_ns`` is that of
    its incomplete record should it never end."""

    TYPE: ClassVar[FrameType] = FrameType.OPEN
    s: int
    c: int
    index: int
    begin_ns: int
    rank: int
    cpu: int
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def encode(self, version: int = PROTOCOL_VERSION) -> bytes:
        return encode_open(self.s, self.c, self.index, self.begin_ns, self.rank, self.cpu,
                           self.name, self.params, version)

    @classmethod
    def decode(cls, body: bytes) -> Open:
        """ProtocolError ``bad_frame`` (shorter than its head) or ``bad_begin`` (a name or
        params that do not decode)."""
        start = OPEN_HEAD.size
        if len(body) < start:
            _check_head(cls.TYPE, OPEN_HEAD, body)
        s, c, index, begin_ns, rank, cpu, name_bytes = _unpack_open(body)
        try:
            if index > INT64_MAX or begin_ns > INT64_MAX:
                raise ValueError("index or begin_ns beyond 2^63")
            name = body[start:start + name_bytes].decode()  # strict: no surrogates
            tail = body[start + name_bytes:]
            if len(name.encode()) != name_bytes or len(name) > MAX_NAME_CHARS:
                raise ValueError(f"the name is cut short or longer than {MAX_NAME_CHARS}")
            kept = params(strictjson.loads(tail)) if tail else {}
        except (ValueError, TypeError) as exc:  # strictjson.Malformed and Unicode included
            raise ProtocolError("bad_begin", f"malformed OPEN ({exc})") from None
        return cls(s, c, index, begin_ns, rank, cpu, name, kept)


class WireCounter(NamedTuple):
    """One counter of a CLOSE: named by the context, ``source`` one of :data:`SOURCES`,
    ``raw`` None for a counter without a raw count."""

    name: str
    source: str
    value: float
    ratio: float = 1.0
    raw: int | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """c (binary): superstep ``index`` of context ``c``'s run, opened on this connection,
    ended; its record takes the OPEN's name, rank, cpu and params."""

    TYPE: ClassVar[FrameType] = FrameType.CLOSE
    s: int
    c: int
    index: int
    begin_ns: int
    end_ns: int
    flags: frozenset[str] = frozenset()
    counters: tuple[WireCounter, ...] = ()
    unsupported: Mapping[str, str] = field(default_factory=dict)

    def encode(self, version: int = PROTOCOL_VERSION) -> bytes:
        """ValueError for a flag without a bit (send a RECORD instead). The counters go in
        their order here, which must be that of the context's ``counters``."""
        bits = flag_bits(self.flags)
        if bits is None:
            raise ValueError(f"flags {sorted(self.flags - FLAG_BIT.keys())} have no CLOSE bit")
        return encode_close(self.s, self.c, self.index, self.begin_ns, self.end_ns, bits,
                            self.counters, self.unsupported, version)

    @classmethod
    def decode(cls, body: bytes, names: Sequence[str]) -> Close:
        """``names``: the counters of the CLOSE's context. ProtocolError ``bad_frame`` (shorter
        than its head) or ``bad_record`` (sizes, sources, unsupported counters or flags)."""
        start = CLOSE_HEAD.size
        if len(body) < start:
            _check_head(cls.TYPE, CLOSE_HEAD, body)
        s, c, index, begin_ns, end_ns, bits, tail_bytes = _unpack_close(body)
        end = start + len(names) * COUNTER.size
        try:
            if len(body) != end + tail_bytes:
                raise ValueError(f"{len(body)} bytes for {len(names)} counters and "
                                 f"{tail_bytes} bytes of unsupported counters")
            counters = tuple([
                _new_tuple(WireCounter, (name, SOURCES[src], value, ratio,
                                         None if raw == NO_RAW else raw))
                for name, (src, value, ratio, raw) in zip(
                    names, _iter_counters(body[start:end]), strict=True)])
            unsupported = strictjson.loads(body[len(body) - tail_bytes:]) if tail_bytes \
                else {}
            if not isinstance(unsupported, dict) or not all(
                    isinstance(v, str) for v in unsupported.values()):
                raise ValueError("unsupported counters are not a JSON object of strings")
            flags = bit_flags(bits)
        except (ValueError, IndexError, ProtocolError) as exc:
            raise ProtocolError("bad_record", f"malformed CLOSE ({exc})") from None
        return cls(s, c, index, begin_ns, end_ns, flags, counters, unsupported)
