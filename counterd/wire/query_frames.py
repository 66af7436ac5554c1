"""The query frames: users read their runs through the daemon (QUERY and RESULT,
docs/protocol.md). Used by the daemon's :mod:`counterd.daemon.query` and the clients of
``counterd runs`` and ``counterd report``; :mod:`counterd.wire.protocol` decodes them in a stream.

The store is private to the daemon's user (the Reliability issue: a world-readable store let
anyone read every run), so ``counterd runs`` and ``counterd report`` ask the daemon, which
answers from the asking uid's namespace (SO_PEERCRED) unless the client is privileged:

    c: QUERY  {"s", "what": "runs"|"records"|"clock", "run_id"?, "uid"?, "after"?}
    d: RESULT {"s", "items": [...], "after": cursor|null, "uid"?, "run_id"?}

One RESULT per QUERY, at most a frame's worth of items; a client asks again with the
RESULT's ``after`` until it is null, so the daemon holds nothing between pages. A refused
QUERY is answered with an ERROR. Added in version 2 as new types (an older daemon answers
``bad_type``). "clock" (issue 32): the run's clock domains (counterd.data.clocks), one per host of
its records, in one RESULT; a daemon before it answers ``bad_query``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from counterd.wire.framing import HEADER, PROTOCOL_VERSION, FrameType, ProtocolError, dumps_payload
from counterd.wire.json_frame import JsonFrame, reply_error, seq_field

QUERY_WHATS = ("runs", "records", "clock")
MAX_QUERY_ID_BYTES = 4096
_UINT32 = 1 << 32
_INT64 = 1 << 63


def _cursor(value: Any, ftype: FrameType) -> tuple[str | int, ...] | None:
    """A QUERY's or RESULT's ``after``: null, or a list of up to 4 strings and 64-bit ints."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > 4 or not all(
            (isinstance(v, str) and len(v) <= MAX_QUERY_ID_BYTES)
            or (isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64)
            for v in value):
        raise ProtocolError("bad_query" if ftype is FrameType.QUERY else "bad_reply",
                            f"malformed {ftype.name} cursor {str(value)[:80]!r}")
    return tuple(value)


def _uid_field(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < _UINT32:
        raise ProtocolError("bad_query", f"uid {str(value)[:40]!r} is not a uid")
    return value


@dataclass(frozen=True, slots=True)
class Query(JsonFrame):
    """c: a page of runs (``what`` "runs") or of one run's records ("records"; ``run_id``
    None: the latest run). ``uid``: whose namespace (None: the client's own, or every user's
    runs for a privileged client); only privileged clients may name another. ``after``: the
    previous RESULT's cursor."""

    TYPE: ClassVar[FrameType] = FrameType.QUERY
    s: int
    what: str
    run_id: str | None = None
    uid: int | None = None
    after: tuple[str | int, ...] | None = None

    def payload(self) -> dict[str, Any]:
        p: dict[str, Any] = {"s": self.s, "what": self.what}
        if self.run_id is not None:
            p["run_id"] = self.run_id
        if self.uid is not None:
            p["uid"] = self.uid
        if self.after is not None:
            p["after"] = list(self.after)
        return p

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Query:
        s = seq_field(p)
        what, run_id = p.get("what"), p.get("run_id")
        if what not in QUERY_WHATS:
            raise ProtocolError("bad_query", f"QUERY of {str(what)[:40]!r}: not one of "
                                + ", ".join(QUERY_WHATS))
        if run_id is not None and not (isinstance(run_id, str) and run_id
                                       and len(run_id) <= MAX_QUERY_ID_BYTES):
            raise ProtocolError("bad_query", "QUERY run_id is not a non-empty string of at "
                                f"most {MAX_QUERY_ID_BYTES} characters")
        return cls(s, what, run_id, _uid_field(p.get("uid")),
                   _cursor(p.get("after"), cls.TYPE))


@dataclass(frozen=True, slots=True)
class Result(JsonFrame):
    """d: one page of a QUERY's answer: ``items`` (run rows as objects, or records' JSON),
    ``uid`` and ``run_id`` of the run read (records), ``after`` the cursor to ask the next page
    with (None: this was the last)."""

    TYPE: ClassVar[FrameType] = FrameType.RESULT
    s: int
    items: tuple[Mapping[str, Any], ...] = ()
    after: tuple[str | int, ...] | None = None
    uid: int | None = None
    run_id: str | None = None

    def payload(self) -> dict[str, Any]:
        p: dict[str, Any] = {"s": self.s, "items": list(self.items),
                             "after": None if self.after is None else list(self.after)}
        if self.uid is not None:
            p["uid"] = self.uid
        if self.run_id is not None:
            p["run_id"] = self.run_id
        return p

    @classmethod
    def decode(cls, p: Mapping[str, Any]) -> Result:
        s = seq_field(p)
        items, uid, run_id = p.get("items"), p.get("uid"), p.get("run_id")
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise reply_error(cls.TYPE, ValueError("items are not a list of objects"))
        if run_id is not None and not isinstance(run_id, str):
            raise reply_error(cls.TYPE, ValueError("run_id is not a string"))
        try:
            uid = _uid_field(uid)
        except ProtocolError as exc:
            raise reply_error(cls.TYPE, ValueError(exc.message)) from None
        return cls(s, tuple(items), _cursor(p.get("after"), cls.TYPE), uid, run_id)


def encode_result(s: int, item_texts: Sequence[str], after: Sequence[str | int] | None,
                  uid: int | None = None, run_id: str | None = None,
                  version: int = PROTOCOL_VERSION) -> bytes:
    """A RESULT whose items are already JSON text (records as the store keeps them), spliced
    in rather than parsed and encoded again; :meth:`Result.decode` reads it."""
    tail: dict[str, Any] = {"after": None if after is None else list(after)}
    if uid is not None:
        tail["uid"] = uid
    if run_id is not None:
        tail["run_id"] = run_id
    body = (f'{{"s":{int(s)},"items":[' + ",".join(item_texts) + "],"
            + dumps_payload(tail)[1:]).encode()
    return HEADER.pack(len(body) + 2, version, FrameType.RESULT) + body
