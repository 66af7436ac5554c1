"""The marker socket (DESIGN.md section 6): listening, accepting clients (SO_PEERCRED,
``socket.max_clients``), reading their frames into each connection's
:class:`~counterd.daemon.session.Session` and writing its replies, all without blocking, on one
selector in the loop's thread.

Acknowledgements come from the writer's thread once records are committed: the writer wakes
the loop (:meth:`Server.wake`, a socket pair in the selector, also used by signals) and the
server sends each client one ACK carrying its latest sequence number. A client must say HELLO
within :data:`HELLO_TIMEOUT_S` and finish a frame within :data:`PARTIAL_FRAME_TIMEOUT_S`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import stat
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
_RECV_BYTES = 262144


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


class Server:
    """The sessions of one daemon. ``listen()`` binds, ``poll()`` serves once, ``drain()``,
    ``close_sessions()`` and ``close()`` shut down; ``max_clients`` and ``max_frame`` follow
    the config."""

    def __init__(self, shared: Shared, *, max_clients: int, max_frame: int) -> None:
        self.shared = shared
        self.max_clients = max_clients
        self.max_frame = max_frame
        self._sel = selectors.DefaultSelector()
        self._sessions: dict[int, Session] = {}
        self._next_cid = 1
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._listener: socket.socket | None = None
        self._path: Path | None = None

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
            self._sel.unregister(self._listener)
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
        """Drop clients that do not say HELLO in time or leave a frame half-sent."""
        for session in list(self._sessions.values()):
            if not session.hello and now - session.opened > HELLO_TIMEOUT_S:
                session.violation("no_hello", f"no HELLO within {HELLO_TIMEOUT_S:.0f} s")
                session.close(incomplete=False)
            elif session.partial_since is not None and \
                    now - session.partial_since > PARTIAL_FRAME_TIMEOUT_S:
                session.violation("stalled", "a frame stayed incomplete for "
                                  f"{PARTIAL_FRAME_TIMEOUT_S:.0f} s")
                session.close(incomplete=True)

    def _accept(self) -> None:
        assert self._listener is not None
        state = self.shared.state
        for _ in range(64):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: keep serving the others
                log.error("accept failed: %s", exc)
                return
            if len(self._sessions) >= self.max_clients:
                log.warning("refusing a client: %d connections (socket.max_clients)",
                            len(self._sessions))
                state.count("protocol_errors", "too_many_clients")
                sock.close()
                continue
            try:
                peer = peer_credentials(sock)
            except OSError as exc:
                log.warning("SO_PEERCRED failed, dropping the client: %s", exc)
                sock.close()
                continue
            sock.setblocking(False)
            session = Session(self._next_cid, sock, peer,
                              Decoder(self.max_frame, protocol.ACCEPTED_VERSIONS),
                              time.monotonic(), self.shared, self._forget)
            self._next_cid += 1
            self._sessions[session.cid] = session
            self._sel.register(sock, selectors.EVENT_READ, session)
            state.set_clients(len(self._sessions))

    def _forget(self, session: Session) -> None:
        """A session closes: out of the selector, the table and the sampled clients."""
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(session.sock)
        self._sessions.pop(session.cid, None)
        if not any(s.pid == session.pid for s in self._sessions.values()):
            self.shared.clients.discard(session.pid)
        self.shared.state.set_clients(len(self._sessions))

    def _on_readable(self, session: Session, drain_only: bool = False) -> None:
        decoder = session.decoder
        for _ in range(16 if not drain_only else 1 << 20):
            try:
                data = session.sock.recv(_RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.info("%s: receive failed (%s)", session.describe(), exc)
                session.close(incomplete=True)
                return
            if not data:
                if decoder.pending:
                    session.violation("truncated", "connection closed inside a frame "
                                      f"({decoder.pending} bytes of it received)", reply=False)
                session.close(incomplete=True)
                return
            decoder.feed(data)
            try:
                for ftype, payload in decoder.frames():
                    session.handle(ftype, payload)
                    if session.closed:
                        return
            except ProtocolError as exc:
                session.violation(exc.code, exc.message)
                if decoder.broken or not session.hello:
                    session.close(incomplete=True)
                    return
            session.partial_since = (session.partial_since or time.monotonic()) \
                if decoder.pending else None
            if len(data) < _RECV_BYTES:
                break
        if not session.closed:
            self._flush(session)

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
            except OSError:
                session.close(incomplete=True)
                return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if session.outbuf else 0)
        if session.writing != bool(session.outbuf):
            session.writing = bool(session.outbuf)
            self._sel.modify(session.sock, want, session)

    def _on_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        for cid, seq in self.shared.writer.take_acks().items():
            session = self._sessions.get(cid)
            if session is not None and not session.closed and seq > session.ack_wanted:
                session.ack_wanted = seq
                self._flush(session)
