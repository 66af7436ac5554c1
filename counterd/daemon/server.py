"""The marker socket (DESIGN.md section 6): listening, accepting clients (SO_PEERCRED), reading
their frames into each connection's :class:`~counterd.daemon.session.Session` and writing its
replies, all without blocking, on one selector in the loop's thread.

The limits (:class:`~counterd.daemon.config.Limits`, in ``shared.limits``) keep one user from
starving the others: connections in all and per uid (root exempt), an idle timeout for
connections with nothing open, and (in the sessions) bytes held per connection and per uid.
When ``accept`` fails for want of file descriptors (EMFILE, ENFILE), the listener is taken out
of the selector for :data:`ACCEPT_BACKOFF_S` (doubling to :data:`ACCEPT_BACKOFF_MAX_S`) and the
failure is logged once per pause, instead of a busy loop on a socket that stays readable.

Fair service: no user's frames take the loop for long. A connection's socket is read (one
``recv`` of :data:`_RECV_BYTES` at most) only when what it sent before has been handled; a
connection with frames to handle waits in its uid's queue (:class:`RoundRobin`), and each turn
of the loop serves one connection of each uid, in turn, for at most :data:`SLICE_FRAMES`
frames, :data:`SLICE_BYTES` bytes and :data:`SLICE_S` seconds: a uid with 256 connections gets
the same share as one with a single connection. A uid with too much queued for the writer
(:meth:`counterd.daemon.quota.Usage.congested`) is not served until the writer catches up, so a
flood waits in its own sockets. The black box of a connection that ended is read a slice per
turn too (frames that keep nothing, such as SYNC, skipped unread). QUERY frames are answered
off the loop (:class:`counterd.daemon.query.QueryWorker`), one in flight per connection.

Acknowledgements come from the writer's thread once records are committed: the writer wakes
the loop (:meth:`Server.wake`, a socket pair in the selector, also used by signals) and the
server sends each client one ACK carrying its latest sequence number (a SYNC, or a scratch
CLOSE, with nothing of its connection in flight is acknowledged at once, without the writer).
A client must say HELLO within :data:`HELLO_TIMEOUT_S` and finish a frame within
:data:`PARTIAL_FRAME_TIMEOUT_S`.
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
from collections import deque
from collections.abc import Callable
from pathlib import Path

from counterd.daemon.auth import Peer, peer_credentials
from counterd.daemon.session import Session
from counterd.daemon.shared import Shared
from counterd.data.errors import BadInput
from counterd.wire import protocol
from counterd.wire.protocol import Decoder, ProtocolError

log = logging.getLogger("counterd.daemon")

HELLO_TIMEOUT_S = 10.0  # a connection must say HELLO within this
PARTIAL_FRAME_TIMEOUT_S = 30.0  # a frame begun must be complete within this
ACCEPT_BACKOFF_S = 0.1  # first pause of accepting after EMFILE
ACCEPT_BACKOFF_MAX_S = 5.0
_RECV_BYTES = 65536  # one read of a connection's socket (its frames are then handled first)
SLICE_FRAMES = 64  # frames of one connection handled per turn of the loop, at most
SLICE_BYTES = 65536  # their bytes (at least one frame); also a black box's chunk per turn
SLICE_S = 0.005  # and the time they take
# Frames that keep nothing, skipped unread in a black box after its connection ended: no one
# is left to answer them.
_NOTHING_TO_KEEP = frozenset({protocol.FrameType.SYNC, protocol.FrameType.READ,
                              protocol.FrameType.QUERY, protocol.FrameType.HELLO,
                              protocol.FrameType.BUFFER})
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


class RoundRobin:
    """The sessions with frames to handle, one queue per uid: :meth:`turn` takes the first of
    each uid's queue, uids in turn (round-robin between users, not connections)."""

    def __init__(self) -> None:
        self._queues: dict[int, deque[Session]] = {}  # uid -> sessions; uids in turn order

    def add(self, session: Session) -> None:
        if not session.queued:
            session.queued = True
            self._queues.setdefault(session.uid, deque()).append(session)

    def discard(self, session: Session) -> None:
        if session.queued:
            session.queued = False
            queue = self._queues.get(session.uid)
            if queue is not None:
                with contextlib.suppress(ValueError):
                    queue.remove(session)
                if not queue:
                    del self._queues[session.uid]

    def turn(self, skip: Callable[[int], bool]) -> list[Session]:
        """One session of each uid with work (but those ``skip`` says to leave waiting), taken
        off its queue; each uid served goes to the back of the line."""
        out: list[Session] = []
        for uid in list(self._queues):
            if skip(uid):
                continue
            queue = self._queues.pop(uid)
            session = queue.popleft()
            session.queued = False
            if queue:
                self._queues[uid] = queue
            out.append(session)
        return out

    def ready(self, skip: Callable[[int], bool]) -> bool:
        """Whether some uid (not skipped) has work."""
        return any(not skip(uid) for uid in self._queues)

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())


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
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._listener: socket.socket | None = None
        self._path: Path | None = None
        self._stopping = False  # the writer has stopped: nothing more can be stored
        self._ready = RoundRobin()

    # -- lifecycle ---------------------------------------------------------------------------
    def listen(self, path: Path, mode: int) -> None:
        self._listener = bind(path, mode)
        self._path = path
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")

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
        """Read and handle what every client already sent (at shutdown), with no slices: its
        buffered frames, its socket until it would block, the black box of one that ended."""
        for session in list(self._sessions.values()):
            while not session.closed:
                status = self._handle(session, 1 << 62, 1 << 62, float("inf"), park=False)
                if status is _CLOSED:
                    break
                if session.eof:
                    self._box_step(session, 1 << 30)
                    continue
                if not self._receive(session):
                    break

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
        """Wait up to ``timeout`` seconds (none while frames wait to be handled), read what is
        ready, then serve one turn (:meth:`turn`)."""
        busy = self._ready.ready(self._congested)
        for key, events in self._sel.select(timeout=0 if busy else timeout):
            if key.data == "listen":
                self._accept()
            elif key.data == "wake":
                self._on_wake()
            else:
                session = key.data
                if events & selectors.EVENT_READ and not session.closed:
                    self._read(session)
                if events & selectors.EVENT_WRITE and not session.closed:
                    self._flush(session)
        self.turn()

    def _congested(self, uid: int) -> bool:
        return self.shared.writer.usage.congested(uid)

    def turn(self) -> None:
        """Serve one connection of each uid with frames to handle, a slice each."""
        for session in self._ready.turn(self._congested):
            if session.closed:
                continue
            if self._serve(session):
                self._ready.add(session)
            if not session.closed:
                self._flush(session)

    def housekeeping(self, now: float) -> None:
        """Drop clients that do not say HELLO in time, leave a frame half-sent, or stay idle
        with nothing open; resume accepting after an EMFILE pause."""
        idle_s = self.shared.limits.idle_timeout_s
        for session in list(self._sessions.values()):
            if session.eof or session.queued or session.parked:
                continue  # ending, or frames of it wait for the loop: not the client's doing
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
                    and not session.box_waiting():  # frames in its black box: not idle
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
            self.adopt(sock, peer)

    def adopt(self, sock: socket.socket, peer: Peer) -> Session:
        """A connection accepted (of ``peer``): its session, served from now on."""
        sock.setblocking(False)
        session = Session(self._next_cid, sock, peer,
                          Decoder(self.shared.limits.max_frame_bytes,
                                  protocol.ACCEPTED_VERSIONS),
                          time.monotonic(), self.shared, self._forget)
        self._next_cid += 1
        self._sessions[session.cid] = session
        self._per_uid[peer.uid] = self._per_uid.get(peer.uid, 0) + 1
        self._sel.register(sock, selectors.EVENT_READ, session)
        session.registered = selectors.EVENT_READ
        self.shared.state.set_clients(len(self._sessions))
        return session

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
        session.registered = 0
        self._ready.discard(session)
        if self._sessions.pop(session.cid, None) is not None:
            left = self._per_uid.get(session.uid, 1) - 1
            if left:
                self._per_uid[session.uid] = left
            else:
                self._per_uid.pop(session.uid, None)
        if not any(s.pid == session.pid for s in self._sessions.values()):
            self.shared.clients.discard(session.pid)
        self.shared.state.set_clients(len(self._sessions))

    def _receive(self, session: Session) -> bool:
        """One read of the client's socket into its decoder (EOF or a failure: the connection
        ended, ``session.eof``); False if nothing was there to read."""
        try:
            data, fds = _receive(session.sock)
        except (BlockingIOError, InterruptedError):
            return False
        except ConnectionResetError:
            # A client that exits with acknowledgements still unread makes the kernel reset
            # the connection instead of closing it: an end like any other.
            data, fds = b"", []
        except OSError as exc:
            log.info("%s: receive failed (%s)", session.describe(), exc)
            data, fds = b"", []
        for fd in fds:
            session.descriptor(fd)
        if not data:
            session.eof = True
        else:
            session.received += len(data)
            session.decoder.feed(data)
        return True

    def _read(self, session: Session) -> None:
        """The socket is readable: read once, then stop reading it until its frames are
        handled (the kernel's buffer holds the rest: the client waits, not the daemon)."""
        if not self._receive(session):
            return
        session.reading = False
        self._interest(session)
        self._ready.add(session)

    def _serve(self, session: Session) -> bool:
        """A slice of work for ``session``; True if it has more to do at once."""
        if session.parked:
            return False  # its QUERY's answer brings it back (_on_wake)
        status = self._handle(session, SLICE_FRAMES, SLICE_BYTES,
                              time.monotonic() + SLICE_S)
        if status is _MORE:
            return True
        if status is not _DRAINED:  # closed, or waiting for a QUERY's answer
            return False
        if session.eof:
            return self._box_step(session, SLICE_BYTES)
        decoder = session.decoder
        session.partial_since = (session.partial_since or time.monotonic()) \
            if decoder.pending else None
        session.reading = True
        self._interest(session)
        return False

    def _handle(self, session: Session, max_frames: int, max_bytes: int, deadline: float,
                park: bool = True) -> object:
        """Handle the frames buffered for ``session``, at most ``max_frames`` of them (frames
        refused count too), ``max_bytes`` bytes (at least one frame) and until ``deadline``.
        Returns _CLOSED, _PARKED (a QUERY's answer is awaited), _MORE (the slice is used up)
        or _DRAINED (no complete frame is left)."""
        decoder = session.decoder
        skip = _NOTHING_TO_KEEP if session.eof else frozenset()
        frames = decoder.frames(skip)
        n = size = 0
        while True:
            if n and (n >= max_frames or size >= max_bytes or time.monotonic() >= deadline):
                return _MORE
            n += 1
            try:
                item = next(frames, None)
                if item is None:
                    return _DRAINED
                size += decoder.last_size
                session.handle(*item)
            except ProtocolError as exc:  # that frame refused: go on with the next
                session.violation(exc.code, exc.message)
                if decoder.broken or not session.hello:
                    session.close(incomplete=True)
                    return _CLOSED
                frames = decoder.frames(skip)
                continue
            except Exception:  # a bug the frame reached: this client goes, the daemon stays
                log.exception("%s: internal error handling a frame", session.describe())
                session.violation("internal", "the daemon could not handle a frame; reconnect")
                session.close(incomplete=True)
                return _CLOSED
            if session.closed:
                return _CLOSED
            if session.parked and park:
                return _PARKED

    def _box_step(self, session: Session, size: int) -> bool:
        """The connection ended and its buffered frames are handled: the next chunk of what
        the client wrote to its black box but never sent (True: more to handle), or, when
        none is left, the end: the supersteps still begun become incomplete records."""
        chunk = session.box_chunk(size)
        if chunk:
            session.decoder.feed(chunk)
            return True
        if session.decoder.pending:
            session.violation("truncated", "connection closed inside a frame "
                              f"({session.decoder.pending} bytes of it received)", reply=False)
        session.close(incomplete=True)
        return False

    def _gone(self, session: Session) -> None:
        """A reply could not be sent (EPIPE, ECONNRESET): the client is gone, but what it sent
        before is still to be read, then its black box (reading goes on until EOF); at
        shutdown, after the writer's last commit, nothing more can be stored."""
        if self._stopping:
            log.info("%s: gone while the daemon stops: what it had not sent is not read",
                     session.describe())
            session.close(incomplete=False)
            return
        session.gone = True
        session.outbuf.clear()
        self._interest(session)

    def _flush(self, session: Session) -> None:
        if session.gone:
            return
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
        self._interest(session)

    def _interest(self, session: Session) -> None:
        """Watch the socket for what the session waits for: reading (when its frames are
        handled and it has not ended), writing (replies wait)."""
        if session.closed:
            return
        want = (selectors.EVENT_READ if session.reading and not session.eof else 0) \
            | (selectors.EVENT_WRITE if session.outbuf and not session.gone else 0)
        if want == session.registered:
            return
        if not want:
            self._sel.unregister(session.sock)
        elif not session.registered:
            self._sel.register(session.sock, want, session)
        else:
            self._sel.modify(session.sock, want, session)
        session.registered = want

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
            if session is not None and not session.closed:
                session.committed_to(seq)
                self._flush(session)
        worker = self.shared.query_worker
        for cid, answer in worker.take_answers() if worker is not None else ():
            session = self._sessions.get(cid)
            if session is not None and not session.closed:
                session.parked = False
                session.send(answer)
                if not session.closed:
                    self._ready.add(session)  # its next frames, or its socket again
                    self._flush(session)


_CLOSED, _PARKED, _MORE, _DRAINED = object(), object(), object(), object()
