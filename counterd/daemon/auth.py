"""Who a marker client is and what it may do (DESIGN.md section 6, "Authorisation").

A client is who the kernel said it was when it connected (:func:`peer_credentials`), never what
it says of itself, and never what a pid names later: its pid, uid and gid (SO_PEERCRED) and its
supplementary groups (SO_PEERGROUPS) are the credentials the kernel saved at ``connect()``, read
once when the daemon accepts the connection and kept in the session's :class:`Peer`. Every later
decision uses that record. (Until the Reliability issue, group membership was read from
``/proc/<peer pid>/status`` at query time: a client that connected and exited, its connection
kept by another process, was judged by whatever process got its pid next, e.g. a member of
``socket.allowed_group``.)

It may only have counters read for processes it owns (all of the target's uids equal its uid);
root, and members of the configured group (``socket.allowed_group``, as the primary group or a
supplementary one at connect), are *privileged* and may read any, and may list and report every
user's runs (:mod:`counterd.daemon.query`); others see their own. A supplementary group the
daemon cannot read (a kernel older than 4.13 has no SO_PEERGROUPS) counts as not a member: the
check fails closed, and says so once in the log.

Runs need no owner check: every client writes into its own uid's namespace (the store keys runs
on uid and run id), so the same run id from two users is two runs and no one can squat another's
(the Reliability issue). The run-id -> owner table this replaced grew with every CONTEXT of a
new run id and was never shrunk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import platform
import socket
import struct
from collections.abc import Sequence
from typing import NamedTuple

log = logging.getLogger("counterd.daemon")

# SO_PEERGROUPS (Linux >= 4.13): the peer's supplementary groups as saved at connect(). Python's
# socket module does not export it (checked on 3.11.7: `socket.SO_PEERGROUPS` is missing),
# so the value comes from the kernel's headers: 59 in asm-generic/socket.h, which x86, arm,
# arm64 and riscv use; sparc (0x003d) and parisc (0x4034) number their socket options apart.
SO_PEERGROUPS: int = getattr(socket, "SO_PEERGROUPS", None) or (
    0x003D if platform.machine().startswith("sparc")
    else 0x4034 if platform.machine().startswith("parisc") else 59)
NGROUPS_MAX = 65536  # include/uapi/linux/limits.h
_GID = struct.Struct("I")  # gid_t
_PY_BUFLEN_MAX = 1024  # socket.getsockopt refuses a larger buffer: 256 groups
_said_no_groups = False


class Peer(NamedTuple):
    """A client's process, user and groups as the kernel saved them at ``connect()``
    (SO_PEERCRED, SO_PEERGROUPS), taken once when the connection is accepted."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = frozenset()  # supplementary groups; empty when unknown

    def describe(self) -> str:
        return f"client pid {self.pid} uid {self.uid}"


def peer_credentials(sock: socket.socket) -> Peer:
    """pid, uid, gid (SO_PEERCRED) and supplementary groups (SO_PEERGROUPS) of a Unix socket's
    peer, as the kernel saved them when it connected."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid, peer_groups(sock))


def peer_groups(sock: socket.socket) -> frozenset[int]:
    """The peer's supplementary groups at connect (SO_PEERGROUPS); empty, logged once, where
    the kernel cannot say (no SO_PEERGROUPS before Linux 4.13)."""
    global _said_no_groups
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, _PY_BUFLEN_MAX)
    except OSError as exc:
        if exc.errno == errno.ERANGE:  # more than 256 groups: a buffer Python will not give
            return _peer_groups_large(sock)
        if not _said_no_groups:
            _said_no_groups = True
            log.warning("SO_PEERGROUPS failed (%s): supplementary groups of clients are not "
                        "known, so socket.allowed_group admits only clients whose primary group "
                        "it is (Linux >= 4.13 says them)", exc.strerror)
        return frozenset()
    return _gids(raw)


def _gids(raw: bytes) -> frozenset[int]:
    n = len(raw) // _GID.size
    return frozenset(struct.unpack(f"{n}I", raw[:n * _GID.size]))


def _peer_groups_large(sock: socket.socket) -> frozenset[int]:
    """SO_PEERGROUPS with room for NGROUPS_MAX groups, through libc's getsockopt."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    buf = ctypes.create_string_buffer(NGROUPS_MAX * _GID.size)
    size = ctypes.c_uint32(len(buf))
    if libc.getsockopt(sock.fileno(), socket.SOL_SOCKET, SO_PEERGROUPS, buf,
                       ctypes.byref(size)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"SO_PEERGROUPS: {os.strerror(err)}")
    return _gids(buf.raw[:size.value])


class Authority:
    """The daemon's authorisation decisions, from a :class:`Peer` alone (nothing is read from
    ``/proc`` here: a pid may name another process by now). ``allowed_gid`` is
    ``socket.allowed_group``'s gid (None: only root is privileged). Used by the loop's thread
    only."""

    def __init__(self, allowed_gid: int | None = None) -> None:
        self.allowed_gid = allowed_gid

    def privileged(self, peer: Peer) -> bool:
        """Root, or a member of the allowed group (primary or supplementary) at connect."""
        if peer.uid == 0:
            return True
        gid = self.allowed_gid
        return gid is not None and (peer.gid == gid or gid in peer.groups)

    def may_read(self, peer: Peer, uids: Sequence[int]) -> bool:
        """May ``peer`` read the counters of a process whose uids are ``uids``?"""
        return self.privileged(peer) or not any(u != peer.uid for u in uids)
