"""Authorisation is bound at connect: a Peer holds the credentials the kernel saved when the
client connected (SO_PEERCRED, SO_PEERGROUPS), and the Authority decides from it alone."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from counterd.daemon import auth
from counterd.daemon.auth import Authority, Peer, peer_credentials

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set another "
                               "process's groups (setgroups)")


def _connect_as(path: str, groups: list[int], gid: int, uid: int) -> int:
    """Fork a child that takes ``groups``, ``gid`` and ``uid``, connects to ``path`` and
    exits at once; returns its pid (reaped)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.close()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return pid


def _accept_from(groups: list[int], gid: int = 65533, uid: int = 65533) -> tuple[int, Peer]:
    """Accept a connection from a child as ``uid`` with ``groups`` (an abstract socket: no
    directory permission between the other uid and it)."""
    path = f"\0counterd-test-auth-{os.getpid()}-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(4)
        pid = _connect_as(path, groups, gid, uid)
        conn, _ = listener.accept()  # after the client exited: what connect() saw stays
        with conn:
            return pid, peer_credentials(conn)


def test_so_peergroups_constant() -> None:
    """Python does not export SO_PEERGROUPS (if it ever does, that value is used); the
    kernel's value stands in, and answers on this kernel (a socket pair: no groups error)."""
    assert auth.SO_PEERGROUPS == getattr(socket, "SO_PEERGROUPS", auth.SO_PEERGROUPS)
    a, b = socket.socketpair()
    with a, b:
        assert auth.peer_groups(a) == frozenset(os.getgroups())


@ROOT_ONLY
def test_peer_holds_the_groups_of_connect_time() -> None:
    """The client's supplementary groups as they were at connect(), although the client has
    exited since (its pid free for any process to take)."""
    pid, peer = _accept_from([4242, 4243])
    assert peer == Peer(pid, 65533, 65533, frozenset({4242, 4243}))
    assert Authority(4242).privileged(peer)
    assert Authority(4243).may_read(peer, (0, 0, 0, 0))
    assert not Authority(4244).privileged(peer)
    assert not Authority(None).privileged(peer)


@ROOT_ONLY
def test_more_groups_than_python_can_ask() -> None:
    """300 groups do not fit the 1024 bytes socket.getsockopt allows: read through libc."""
    groups = list(range(5000, 5300))
    _, peer = _accept_from(groups)
    assert peer.groups == frozenset(groups)
    assert Authority(5299).privileged(peer)


def test_authority_reads_nothing_of_the_pid() -> None:
    """The decision comes from the Peer alone: a pid naming a root process (1) or this
    process (member of whatever it is) changes nothing."""
    a = Authority(4242)
    assert not a.privileged(Peer(1, 65534, 65534))
    assert not a.privileged(Peer(os.getpid(), 65534, 65534, frozenset({1, 2})))
    assert a.privileged(Peer(1, 65534, 4242))  # primary group
    assert a.privileged(Peer(1, 0, 0))  # root
    assert a.may_read(Peer(1, 65534, 65534), (65534, 65534, 65534, 65534))
    assert not a.may_read(Peer(1, 65534, 65534), (65534, 0, 65534, 65534))


def test_no_peergroups_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without SO_PEERGROUPS: no supplementary groups, so no membership by them."""
    monkeypatch.setattr(auth, "SO_PEERGROUPS", 9999)  # an option no kernel has: ENOPROTOOPT
    a, b = socket.socketpair()
    with a, b:
        peer = peer_credentials(a)
    assert peer.groups == frozenset()
    assert peer.uid == os.getuid() and peer.pid == os.getpid()
