"""QUERY answers read in tests without a socket: one frame, or every page of a listing."""

from __future__ import annotations

from typing import Any

from counterd.daemon.auth import Peer
from counterd.daemon.query import Queries
from counterd.wire import protocol, query_frames
from counterd.wire.protocol import FrameType

#: The session version the queries are answered for.
VERSION = 2


def answer(queries: Queries, payload: dict[str, Any], peer: Peer, privileged: bool = False,
           max_frame: int = 262144) -> tuple[FrameType, Any]:
    """The one frame the daemon answers ``payload`` with: (type, payload)."""
    dec = protocol.Decoder(1 << 26)
    dec.feed(queries.answer(payload, peer, privileged, VERSION, max_frame))
    [frame] = list(dec.frames())
    return frame


def pages(queries: Queries, what: str, peer: Peer, privileged: bool = False,
          max_frame: int = 262144, after: list[Any] | None = None,
          **fields: Any) -> list[query_frames.Result]:
    """Every page of a ``what`` listing from cursor ``after`` on, following each page's cursor
    until the last page (``after`` None); fails if any answer is not a RESULT."""
    got: list[query_frames.Result] = []
    for s in range(1, 10_000):
        payload: dict[str, Any] = {"s": s, "what": what, **fields}
        if after is not None:
            payload["after"] = after
        ftype, p = answer(queries, payload, peer, privileged, max_frame)
        assert ftype is FrameType.RESULT, p
        page = query_frames.Result.decode(p)
        got.append(page)
        if page.after is None:
            return got
        after = list(page.after)
    raise AssertionError("no last page")
