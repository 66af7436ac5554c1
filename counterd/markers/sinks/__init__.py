"""Where a process's markers go, chosen once by :func:`make_sink`.

* :mod:`~counterd.markers.sinks.base`: the :class:`Sink` interface every sink offers, and what
  the binary-frame sinks share (CONTEXT, begin lines, CLOSE frames);
* :mod:`~counterd.markers.sinks.memory`: records kept in the process;
* :mod:`~counterd.markers.sinks.spool`: the process's file in ``counterd record``'s spool;
* :mod:`~counterd.markers.sinks.socket`: the daemon client (records sent over counterd's
  socket, held until acknowledged), over :mod:`~counterd.markers.sinks.link`, its connection
  (HELLO, the black box, reconnection, acknowledgements);
* :mod:`~counterd.markers.sinks.spill`: the private file of what the daemon did not take.

The daemon client (socket and link) is loaded only where a daemon is named or found: socket,
select and logging cost a program about 10 ms before its first superstep.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from counterd.data.env import ENV_SOCKET, ENV_SPOOL
from counterd.markers.sinks.base import Sink
from counterd.markers.sinks.memory import MemorySink
from counterd.markers.sinks.spool import SpoolSink

if TYPE_CHECKING:
    from counterd.markers.sinks.socket import SocketSink

__all__ = ["MemorySink", "Sink", "SpoolSink", "make_sink"]


def make_sink(spool: Path | None, sock: Path | str | None) -> Sink:
    """The one place that chooses where a process's markers go, first match wins:
    ``spool`` or ``sock`` (``configure``); ``COUNTERD_SPOOL`` (set by ``counterd record``);
    ``COUNTERD_SOCKET`` (a path; ``off`` disables the daemon); the daemon's default socket
    (:func:`counterd.data.env.default_socket_path`) if it exists; else memory."""
    env = os.environ
    if spool:
        return SpoolSink(spool)
    if sock is not None and str(sock) not in ("", "off"):
        return _socket_sink(sock)
    if env.get(ENV_SPOOL):
        return SpoolSink(Path(env[ENV_SPOOL]))
    if sock is None:
        path = env.get(ENV_SOCKET)
        if path is None:
            from counterd.data.env import default_socket_path

            default = default_socket_path()
            path = str(default) if default.exists() else None
            if path is None:
                return MemorySink(unkept=(
                    f"no counterd record around this program and no daemon at {default} "
                    f"({ENV_SOCKET} unset)"))
        if path and path != "off":
            return _socket_sink(path)
    return MemorySink()


def _socket_sink(path: Path | str) -> SocketSink:
    """A daemon that does not answer yet is waited for: the sink holds the records, retries
    with backoff and spills what exceeds its high-water mark, and at exit what is left (see
    :class:`SocketSink`). A named socket means a daemon is expected; memory would lose the
    records at exit."""
    import logging

    from counterd.markers.sinks.socket import SocketSink

    sink = SocketSink(path)
    if sink.degraded is not None:
        logging.getLogger("counterd.markers").info(
            "%s; records are held and sent once it answers", sink.degraded)
    return sink
