"""What every typed JSON frame of the marker socket shares (:mod:`counterd.wire.protocol` and
:mod:`counterd.wire.query_frames`): the :class:`JsonFrame` base, which encodes its payload as one
frame, and the checks of the fields that each decoder applies first (a sequence number, an
integer in range) with the ProtocolError a malformed reply is refused with."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar, TypeGuard

from counterd.data.records import UINT64_MAX
from counterd.wire.framing import HEADER, PROTOCOL_VERSION, FrameType, ProtocolError, dumps_payload


def seq_field(p: Mapping[str, Any]) -> int:
    """The frame's sequence number ``s``; ProtocolError ``bad_seq`` unless it is one."""
    s = p.get("s")
    if is_int(s, 1, UINT64_MAX):
        return s
    raise ProtocolError("bad_seq", f"sequence number {s!r:.40} is not an integer in [1, 2^64)")


def is_int(v: Any, lo: int, hi: int) -> TypeGuard[int]:
    """``v`` is an int (not a bool) in [lo, hi]: what a JSON field must be before it is used
    as a pid, an index or a sequence number."""
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def reply_error(ftype: FrameType, exc: Exception) -> ProtocolError:
    """The error a malformed reply of the daemon (a frame of ``ftype``) is refused with."""
    return ProtocolError("bad_reply", f"malformed {ftype.name} ({exc})")


class JsonFrame(abc.ABC):
    """A frame whose payload is a JSON object: ``payload()`` is that object."""

    __slots__ = ()
    TYPE: ClassVar[FrameType]

    @abc.abstractmethod
    def payload(self) -> dict[str, Any]:
        """The frame's JSON object."""

    def encode(self, version: int = PROTOCOL_VERSION) -> bytes:
        body = dumps_payload(self.payload()).encode()
        return HEADER.pack(len(body) + 2, version, self.TYPE) + body
