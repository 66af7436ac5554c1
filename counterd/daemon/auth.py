"""Who a marker client is and what it may do (DESIGN.md section 6, "Authorisation").

A client is who SO_PEERCRED says it was when it connected (:func:`peer_credentials`), never
what it says of itself. It may only have counters read for processes it owns (all of the
target's uids equal its uid); root, and members of the configured group
(``socket.allowed_group``), are *privileged* and may read any, and may list and report
every user's runs (:mod:`counterd.daemon.query`); others see their own.

Runs need no owner check: every client writes into its own uid's namespace (the store keys runs
on uid and run id), so the same run id from two users is two runs and no one can squat another's
(the Reliability issue). The run-id -> owner table this replaced grew with every CONTEXT of a
new run id and was never shrunk.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple


class Peer(NamedTuple):
    """A client's process, user and group, from SO_PEERCRED (taken at connect)."""

    pid: int
    uid: int
    gid: int

    def describe(self) -> str:
        return f"client pid {self.pid} uid {self.uid}"


def peer_credentials(sock: socket.socket) -> Peer:
    """(pid, uid, gid) of a Unix socket's peer, from SO_PEERCRED (taken at connect)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def groups(pid: int) -> set[int]:
    """The supplementary groups of ``pid`` (empty if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


class Authority:
    """The daemon's authorisation decisions. ``allowed_gid`` is ``socket.allowed_group``'s gid
    (None: only root is privileged). Used by the loop's thread only."""

    def __init__(self, allowed_gid: int | None = None) -> None:
        self.allowed_gid = allowed_gid

    def privileged(self, peer: Peer) -> bool:
        """Root, or a member of the allowed group (primary or supplementary)."""
        if peer.uid == 0:
            return True
        gid = self.allowed_gid
        return gid is not None and (peer.gid == gid or gid in groups(peer.pid))

    def may_read(self, peer: Peer, uids: Sequence[int]) -> bool:
        """May ``peer`` read the counters of a process whose uids are ``uids``?"""
        return self.privileged(peer) or not any(u != peer.uid for u in uids)
