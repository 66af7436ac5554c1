"""The daemon's side of a client's black box: the memory file a client passes with a BUFFER
frame (docs/protocol.md), checked when it comes (:func:`buffer_refusal`) and read after the
connection ended, for the frames the client wrote there and never sent (:class:`ClientBox`, a
part of :class:`counterd.daemon.session.Session`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from counterd.wire import protocol, spool
from counterd.wire.protocol import ProtocolError

if TYPE_CHECKING:
    from counterd.daemon.auth import Peer
    from counterd.daemon.shared import Shared

log = logging.getLogger("counterd.daemon")


class ClientBox:
    """A session's black box: the descriptor a BUFFER came with, and how much of it was read
    beyond the bytes received. The state is the session's own (set in its ``__init__``)."""

    box: int | None  # the client's black box (a BUFFER's descriptor)
    box_serves: int  # the connection its head must name (the BUFFER's "box")
    _box_sent: int | None  # a descriptor received, for the next BUFFER
    box_read: int  # bytes of the box read after the connection ended
    received: int  # bytes read from the connection (the client's stream offset)
    closed: bool
    peer: Peer
    shared: Shared

    def descriptor(self, fd: int) -> None:
        """A descriptor came with the client's bytes: kept for its BUFFER if it is the first,
        else closed unread."""
        if self.box is None and self._box_sent is None and not self.closed:
            self._box_sent = fd
        else:
            os.close(fd)

    def box_chunk(self, size: int) -> bytes:
        """The next ``size`` bytes at most of what the client's black box holds beyond the
        bytes received (the connection has ended: the client died, or closed with frames it
        had not sent), up to ``socket.max_bytes_per_client`` in all; read a chunk per turn of
        the loop (server.Server), not at once."""
        if self.box is None:
            return b""
        limit = self.shared.limits.max_bytes_per_client
        left = limit - self.box_read
        try:
            if left <= 0:
                if spool.read_box(self.box, self.received + self.box_read, 1,
                                  self.box_serves):  # a warning: supersteps are lost
                    self.shared.log.warning(
                        "%s: its black box held more than socket.max_bytes_per_client (%d "
                        "bytes) beyond what it sent: the first %d bytes are read, the rest is "
                        "lost; raise the limit", self.peer.describe(), limit, limit)
                os.close(self.box)
                self.box = None
                return b""
            data = spool.read_box(self.box, self.received + self.box_read, min(size, left),
                                  self.box_serves)
        except OSError as exc:
            log.warning("%s: its black box cannot be read (%s): what it had not sent is lost",
                        self.peer.describe(), exc)
            return b""
        if data and not self.box_read:  # an ordinary end (a loss is a warning, above)
            log.debug("%s: its connection ended with frames unsent in its black box: read "
                      "from there", self.peer.describe())
        self.box_read += len(data)
        return data

    def box_waiting(self) -> bool:
        """Frames wait in the black box beyond what was received (the client is not idle)."""
        if self.box is None:
            return False
        try:
            return bool(spool.read_box(self.box, self.received, 1, self.box_serves))
        except OSError:
            return False


def buffer_refusal(payload: Mapping[str, Any], fd: int | None, has_box: bool
             ) -> str | protocol.Buffer:
    """Why a BUFFER (with descriptor ``fd``) is refused, or the frame."""
    try:
        frame = protocol.Buffer.decode(payload)
    except ProtocolError as exc:
        return exc.message
    if has_box:
        return "a second BUFFER on one connection"
    if fd is None:
        return "BUFFER without a descriptor (SCM_RIGHTS)"
    try:
        fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
    except OSError:
        return "the BUFFER's descriptor is not a shared-memory file (memfd_create or tmpfs)"
    return frame
