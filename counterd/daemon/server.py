"""The marker socket (DESIGN.md section 6): listening, accepting clients (SO_PEERCRED), reading
their frames into each connection's :class:`~counterd.daemon.session.Session` and writing its
replies, all without blocking, on one selector in the loop's thread.

The limits (:class:`~counterd.daemon.config.Limits`, in ``shared.limits``) keep one user from
starving the others: connections in all and per uid (root exempt), an idle timeout for
connections with nothing open, and (in the sessions) bytes held per connection and per uid.
When ``accept`` fails for want of file descriptors (EMFILE, ENFILE), the listener is taken out
of the selector for :data:`ACCEPT_BACKOFF_S` (doubling to :data:`ACCEPT_BACKOFF_MAX_S`) and the
failure is logged once per pause, instead of a busy loop on a socket that stays readable.

Acknowledgements come from the writer's thread once records are committed: the writer wakes
the loop (:meth:`Server.wake`, a socket pair in the selector, also used by signals) and the
server sends each client one ACK carrying its latest sequence number. A client must say HELLO
within :data:`HELLO_TIMEOUT_S` and finish a frame within :data:`PARTIAL_FRAME_TIMEOUT_S`.
"""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import os
import selectors
import socket
import stat
import struct
import time
from pathlib import Path

from counterd import protocol
from counterd.daemon.auth import peer_credentials
from counterd.daemon.session import Session, Shared
from counterd.errors import BadInput
from counterd.protocol import Decoder, ProtocolError

log = logging.getLogger("counterd.daemon")

HELLO_TIMEOUT_S = 10.0  # a connection must say HELLO within this
PARTIAL_FRAME_TIMEOUT_S = 30.0  # a frame begun must be complete within this
ACCEPT_BACKOFF_S = 0.1  # first pause of accepting after EMFILE
ACCEPT_BACKOFF_MAX_S = 5.0
_RECV_BYTES = 262144
_NO_FDS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def bind(path: Path, mode: int) -> socket.socket:
    """A non-blocking listening Unix socket at ``path`` (a stale socket file is replaced;
    BadInput if another daemon serves it or it cannot be created)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create {path.parent}: {exc.strerror}",
                       "choose a writable socket.path (COUNTERD_SOCKET)") from exc
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise BadInput(f"{path} exists and is not a socket",
                           "remove it or choose another socket.path")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            raise BadInput(f"another counterd is serving {path}",
                           "stop it first, or choose another socket.path")
        except OSError:
            path.unlink()  # stale: left by a daemon that was killed
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(str(path))
        os.chmod(path, mode)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise BadInput(f"cannot listen on {path}: {exc.strerror}",
                       "choose a writable socket.path (COUNTERD_SOCKET)") from exc
    sock.setblocking(False)
    return sock


_FD_BYTES = socket.CMSG_SPACE(struct.calcsize("i"))  # room for one descriptor; more are closed


def _receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    """What the client sent, and the descriptors that came with it (``SCM_RIGHTS``: at most
    one; the kernel closes those beyond the room given). Raises OSError as ``recv``."""
    data, anc, _, _ = sock.recvmsg(_RECV_BYTES, _FD_BYTES, socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(array.array("i", payload[:usable]))
    return data, fds


class Server:
    """The sessions of one daemon. ``listen()`` binds, ``poll()`` serves once, ``drain()``,
    ``close_sessions()`` and ``close()`` shut down; the limits are ``shared.limits`` (a reload
    replaces them; a session keeps the frame limit it was accepted with)."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self._sel = selectors.DefaultSelector()
        self._sessions: dict[int, Session] = {}
        self._per_uid: dict[int, int] = {}  # uid -> connections
        self._accept_paused_until: float | None = None
        self._accept_backoff = ACCEPT_BACKOFF_S
        self._accept_failures = 0
        self._next_cid = 1
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._listener: socket.socket | None = None
        self._path: Path | None = None
        self._stopping = False  # the writer has stopped: nothing more can be stored

    # -- lifecycle ---------------------------------------------------------------------------
    def listen(self, path: Path, mode: int) -> None:
        self._listener = bind(path, mode)
        self._path = path
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")

    def wake(self) -> None:
        """Signal- and thread-safe: interrupt :meth:`poll` (acks ready, stop, reload)."""
        with contextlib.suppress(OSError):
            self._wake_w.send(b"w")

    def stop_listening(self) -> None:
        """Accept no more clients; remove the socket file."""
        if self._listener is not None:
            assert self._path is not None
            if self._accept_paused_until is None:
                self._sel.unregister(self._listener)
            self._accept_paused_until = None
            self._listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self._path)

    def drain(self) -> None:
        """Read and handle what every client already sent (at shutdown)."""
        for session in list(self._sessions.values()):
            self._on_readable(session, drain_only=True)

    def close_sessions(self) -> None:
        """After the writer's last commit: acknowledge, send what is pending (waiting up to a
        second per client), close every connection (no incomplete records: the daemon, not
        the client, is going away)."""
        self._stopping = True
        self._on_wake()
        for session in list(self._sessions.values()):
            with contextlib.suppress(OSError):
                session.sock.setblocking(True)
                session.sock.settimeout(1.0)
                if session.outbuf:
                    session.sock.sendall(session.outbuf)
            session.close(incomplete=False)

    def close(self) -> None:
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- the loop ----------------------------------------------------------------------------
    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds and serve what is ready."""
        for key, events in self._sel.select(timeout=timeout):
            if key.data == "listen":
                self._accept()
            elif key.data == "wake":
                self._on_wake()
            else:
                session = key.data
                if events & selectors.EVENT_READ and not session.closed:
                    self._on_readable(session)
                if events & selectors.EVENT_WRITE and not session.closed:
                    self._flush(session)

    def housekeeping(self, now: float) -> None:
        """Drop clients that do not say HELLO in time, leave a frame half-sent, or stay idle
        with nothing open; resume accepting after an EMFILE pause."""
        idle_s = self.shared.limits.idle_timeout_s
        for session in list(self._sessions.values()):
            if not session.hello and now - session.opened > HELLO_TIMEOUT_S:
                session.violation("no_hello", f"no HELLO within {HELLO_TIMEOUT_S:.0f} s")
                session.close(incomplete=False)
            elif session.partial_since is not None and \
                    now - session.partial_since > PARTIAL_FRAME_TIMEOUT_S:
                session.violation("stalled", "a frame stayed incomplete for "
                                  f"{PARTIAL_FRAME_TIMEOUT_S:.0f} s")
                session.close(incomplete=True)
            elif not session.begins and now - session.last_frame > idle_s \
                    and session.ack_sent >= session.ack_wanted and not session.outbuf \
                    and not session.unsent():  # frames waiting in its black box: not idle
                session.violation("idle", f"nothing sent for {idle_s:g} s with no superstep "
                                  "open (socket.idle_timeout_s); reconnect when needed")
                session.close(incomplete=False)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._resume_accepting()

    def _accept(self) -> None:
        assert self._listener is not None
        state = self.shared.state
        limits = self.shared.limits
        for _ in range(64):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _NO_FDS:
                    self._pause_accepting(exc)
                else:  # ECONNABORTED and the like: that client's problem, not ours
                    log.info("accept failed: %s", exc)
                return
            self._accept_backoff = ACCEPT_BACKOFF_S
            try:
                peer = peer_credentials(sock)
            except OSError as exc:
                log.warning("SO_PEERCRED failed, dropping the client: %s", exc)
                sock.close()
                continue
            refusal = None
            if len(self._sessions) >= limits.max_clients:
                refusal = f"{len(self._sessions)} connections (socket.max_clients)"
            elif peer.uid != 0 and self._per_uid.get(peer.uid, 0) >= \
                    limits.max_clients_per_uid:
                refusal = (f"uid {peer.uid} has {self._per_uid[peer.uid]} connections "
                           "(socket.max_clients_per_uid)")
            if refusal is not None:
                self.shared.log.warning("refusing %s: %s", peer.describe(), refusal)
                state.count("protocol_errors", "too_many_clients")
                with contextlib.suppress(OSError):  # tell it why, if it listens
                    sock.setblocking(False)
                    sock.send(protocol.Error("too_many_clients", refusal).encode())
                sock.close()
                continue
            sock.setblocking(False)
            session = Session(self._next_cid, sock, peer,
                              Decoder(limits.max_frame_bytes, protocol.ACCEPTED_VERSIONS),
                              time.monotonic(), self.shared, self._forget)
            self._next_cid += 1
            self._sessions[session.cid] = session
            self._per_uid[peer.uid] = self._per_uid.get(peer.uid, 0) + 1
            self._sel.register(sock, selectors.EVENT_READ, session)
            state.set_clients(len(self._sessions))

    def _pause_accepting(self, exc: OSError) -> None:
        """Out of file descriptors: stop watching the listener for a while (it stays readable,
        so watching it would spin); the kernel keeps the waiting clients in its backlog."""
        assert self._listener is not None
        self._accept_failures += 1
        log.error("accept failed: %s; pausing new connections for %.1f s (%d connections "
                  "open; raise LimitNOFILE or lower socket.max_clients)", exc.strerror,
                  self._accept_backoff, len(self._sessions))
        self.shared.state.count("protocol_errors", "no_file_descriptors")
        self._sel.unregister(self._listener)
        self._accept_paused_until = time.monotonic() + self._accept_backoff
        self._accept_backoff = min(self._accept_backoff * 2, ACCEPT_BACKOFF_MAX_S)

    def _resume_accepting(self) -> None:
        self._accept_paused_until = None
        if self._listener is not None:
            self._sel.register(self._listener, selectors.EVENT_READ, "listen")

    def _forget(self, session: Session) -> None:
        """A session closes: out of the selector, the table and the sampled clients."""
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(session.sock)
        if self._sessions.pop(session.cid, None) is not None:
            left = self._per_uid.get(session.uid, 1) - 1
            if left:
                self._per_uid[session.uid] = left
            else:
                self._per_uid.pop(session.uid, None)
        if not any(s.pid == session.pid for s in self._sessions.values()):
            self.shared.clients.discard(session.pid)
        self.shared.state.set_clients(len(self._sessions))

    def _on_readable(self, session: Session, drain_only: bool = False) -> None:
        for _ in range(16 if not drain_only else 1 << 20):
            try:
                data, fds = _receive(session.sock)
            except (BlockingIOError, InterruptedError):
                break
            except ConnectionResetError:
                # A client that exits with acknowledgements still unread makes the kernel
                # reset the connection instead of closing it: an end like any other.
                data, fds = b"", []
            except OSError as exc:
                log.info("%s: receive failed (%s)", session.describe(), exc)
                self._end(session)
                return
            for fd in fds:
                session.descriptor(fd)
            if not data:
                self._end(session)
                return
            session.received += len(data)
            if not self._feed(session, data):
                return
            if len(data) < _RECV_BYTES:
                break
        if not session.closed:
            self._flush(session)

    def _feed(self, session: Session, data: bytes) -> bool:
        """Decode and handle ``data`` of the client's stream; False when the session closed."""
        decoder = session.decoder
        decoder.feed(data)
        while True:
            try:
                for ftype, payload in decoder.frames():
                    session.handle(ftype, payload)
                    if session.closed:
                        return False
                break
            except ProtocolError as exc:  # that frame refused: go on with the next
                session.violation(exc.code, exc.message)
                if decoder.broken or not session.hello:
                    session.close(incomplete=True)
                    return False
            except Exception:  # a bug the frame reached: this client goes, the daemon stays
                log.exception("%s: internal error handling a frame", session.describe())
                session.violation("internal", "the daemon could not handle a frame; reconnect")
                session.close(incomplete=True)
                return False
        session.partial_since = (session.partial_since or time.monotonic()) \
            if decoder.pending else None
        return True

    def _gone(self, session: Session) -> None:
        """A reply could not be sent (EPIPE, ECONNRESET): the client is gone, but what it sent
        before is still to be read, then its black box (:meth:`_end`); at shutdown, after the
        writer's last commit, nothing more can be stored."""
        if self._stopping:
            log.info("%s: gone while the daemon stops: what it had not sent is not read",
                     session.describe())
            session.close(incomplete=False)
            return
        while not session.closed:
            try:
                data, fds = _receive(session.sock)
            except (BlockingIOError, InterruptedError, OSError):
                break
            for fd in fds:
                session.descriptor(fd)
            if not data:
                break
            session.received += len(data)
            if not self._feed(session, data):
                return
        if not session.closed:
            self._end(session)

    def _end(self, session: Session) -> None:
        """The connection ended: the frames the client wrote to its black box but never sent
        are handled first, then the supersteps still begun become incomplete records."""
        unsent = session.unsent()
        if unsent:
            # An ordinary end (a client exits with its last batch unsent, or is killed): nothing
            # is lost, it is read from there. A loss is a warning (Session.unsent, the
            # truncated-frame violation below).
            log.debug("%s: its connection ended with %d bytes unsent in its black box: read "
                      "from there", session.describe(), len(unsent))
            if not self._feed(session, unsent):
                return
        if session.decoder.pending:
            session.violation("truncated", "connection closed inside a frame "
                              f"({session.decoder.pending} bytes of it received)", reply=False)
        session.close(incomplete=True)

    def _flush(self, session: Session) -> None:
        if session.ack_wanted > session.ack_sent:  # acks are coalesced: only the latest matters
            session.outbuf += protocol.Ack(session.ack_wanted).encode(session.version)
            session.ack_sent = session.ack_wanted
        if session.outbuf:
            try:
                n = session.sock.send(session.outbuf)
                del session.outbuf[:n]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:  # the client is gone: what it sent and its black box first
                self._gone(session)
                return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if session.outbuf else 0)
        if session.writing != bool(session.outbuf):
            session.writing = bool(session.outbuf)
            self._sel.modify(session.sock, want, session)

    def _on_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        for cid, refused in self.shared.writer.take_refusals().items():
            session = self._sessions.get(cid)
            if session is not None and not session.closed:
                for seq, reason in refused:  # before the ACK that covers them
                    session.violation("refused", reason, seq)
        for cid, seq in self.shared.writer.take_acks().items():
            session = self._sessions.get(cid)
            if session is not None and not session.closed and seq > session.ack_wanted:
                session.ack_wanted = seq
                self._flush(session)
