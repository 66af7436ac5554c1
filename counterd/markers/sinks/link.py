"""The daemon client's connection (:class:`DaemonLink`, the part of
:class:`counterd.markers.sinks.socket.SocketSink` below its sink interface): connecting and the
HELLO, the black box a daemon takes (frames written to a memory file both hold, sent in
batches), reconnection with backoff and the resend of what the last connection held, the one way
frames leave (:meth:`DaemonLink._write`), and what comes back (acknowledgements, refusals,
replies). docs/protocol.md specifies the conversation.
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import socket as _socket
import struct
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.data.env import ENV_JOB, batch_job
from counterd.data.records import SuperstepRecord
from counterd.markers import identity
from counterd.markers.sinks.base import as_record, begin_line, close_frame, context_payload

if TYPE_CHECKING:
    from counterd.markers.step import Step

log = logging.getLogger("counterd.markers")

# The longest a marker call waits for the daemon: connecting and its HELLO, acknowledgements at
# the high-water mark, a STARTED reply. A daemon that is slower than this (its disk full, say)
# costs the program its buffer, never its time (the issue measured 30 s per marker before).
BLOCK_S = 2.0
# Reconnection attempts after a lost connection: 50 ms, doubling to 2 s, for as long as the
# program runs. Attempts are made by marker calls that find the delay passed (they never sleep
# for it), and by flush and close.
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 2.0
ACK_EVERY = 16  # frames sent between two non-blocking looks for acknowledgements
OUT_MAX_BYTES = 8 << 20  # bytes the daemon has not read yet before it counts as stuck
# With a black box (the daemon takes a BUFFER), frames are sent in batches: once this many
# bytes wait, or the first of them has waited BATCH_S, at the next frame; at once for a frame
# that asks for a reply (SYNC, READ, a BEGIN the daemon counts), at flush and at close.
BATCH_BYTES = 32 << 10
BATCH_S = 0.05
REFUSED_KEPT = 1000  # refused records kept (with the reason) for inspection; all are counted


class DaemonLink:
    """One process's connection to the daemon, and the records it holds until acknowledged
    (``unacked``, numbered by frame; ``degraded`` says why there is no connection). The sink
    interface above it is :class:`~counterd.markers.sinks.socket.SocketSink`'s, which also keeps
    ``high_water``, the spill file and the fallback sink."""

    def __init__(self, path: Path | str, job: str | None, timeout_s: float,
                 scratch: bool) -> None:
        from counterd.wire import protocol

        self._protocol = protocol
        self.path = Path(path)
        self.job = job or os.environ.get(ENV_JOB) or Path(sys.argv[0] or "python").name
        self.timeout_s = timeout_s  # flush and READ replies (marker calls wait BLOCK_S at most)
        self.scratch = scratch
        # seq -> record (or the closed Step it is built from), in sending order
        self.unacked: OrderedDict[int, SuperstepRecord | Step] = OrderedDict()
        self.refused: list[tuple[SuperstepRecord | None, str]] = []
        self.refused_count = 0
        self._refused_codes: set[str] = set()
        self.degraded: str | None = "not connected yet"  # None while connected, else why not
        self.on_ack: Callable[[list[SuperstepRecord]], None] | None = None
        self.welcome: dict[str, Any] = {}
        # (run_id, index) -> begin line, or the fields of an OPEN (see line_of)
        self._open: dict[tuple[str, int], Any] = {}
        self._replies: dict[int, dict[str, Any]] = {}
        self._awaited: set[int] = set()  # sequence numbers whose reply someone waits for
        self._rlock = threading.RLock()
        self._held = 0  # how deep the calling thread holds _rlock (see _lock)
        self._pid = identity.pid
        self._n = 0  # the last frame number, while no black box numbers them (see _seq)
        self._gen = 0  # connection number: a CLOSE only follows an OPEN of the same connection
        # (ctx, counter names) -> CONTEXT id; kept across connections (declared again on each),
        # as the markers' lanes write frames naming them
        self._contexts: dict[tuple[Any, ...], int] = {}
        self._sock: _socket.socket | None = None
        self._decoder = protocol.Decoder(versions=protocol.ACCEPTED_VERSIONS)
        self._out = bytearray()  # sent frames the socket has not taken yet (no black box)
        self._box: Any = None  # the black box (spool.MappedWriter), once a daemon offers it
        self._boxed = False  # this connection's frames go through the black box
        self._boxing = True  # False once a black box could not be made or grow
        # Steps whose CLOSE a lane wrote into the black box (counterd.markers.native), until
        # _take_ended holds them in unacked; and the lanes writing there (their open steps
        # are begun again on a new connection).
        self._ended: list[Any] = []  # counterd._native._hotpath.HotStep
        self._lanes: weakref.WeakSet[Any] = weakref.WeakSet()
        self._unread = 0  # frames sent since the last look for acknowledgements
        self._retry_at = 0.0  # time.monotonic() of the next reconnection attempt
        self._backoff = BACKOFF_MIN_S
        # time.monotonic() of the last sign the daemon takes records: an acknowledgement, or
        # a new connection unless the last one ended with the daemon not reading
        self._alive_at = -BLOCK_S
        self._stuck = False

    # -- frame numbers and the lock ---------------------------------------------------------
    @property
    def _seq(self) -> int:
        """The last frame number of this connection: the black box's own counter while it
        takes the frames (the lanes number theirs there), else the sink's."""
        return int(self._box.seq) if self._boxed else self._n

    @_seq.setter
    def _seq(self, value: int) -> None:
        if self._boxed:
            self._box.seq = value
        else:
            self._n = value

    @property
    def _lock(self) -> _Held:
        """The sink's lock. While a thread holds it, the lanes write nothing into the black
        box (they take the Python way, and wait for the lock), so a frame numbered here
        leaves before any numbered after it."""
        return _Held(self)

    def _pause_lanes(self) -> None:
        if self._box is not None:
            self._box.paused = True

    def _resume_lanes(self) -> None:
        if self._box is not None:
            self._box.paused = not (self._boxed and self._sock is not None)

    # -- connection ------------------------------------------------------------------------
    def _connect(self) -> None:
        """Connect and say HELLO; raises OSError (ConnectionError: no WELCOME in BLOCK_S)."""
        p = self._protocol
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        wait_s = min(self.timeout_s, BLOCK_S)
        try:
            sock.settimeout(wait_s)
            sock.connect(str(self.path))
            hello = p.encode(p.FrameType.HELLO, hello_payload(self.job, self.scratch))
            sock.sendall(hello)
            # Blocking without a timeout from here on: sends use MSG_DONTWAIT, receives look
            # with select first (a Python socket timeout would turn each into a wait).
            sock.settimeout(None)
            self._boxed = False
            self._sock, self._seq, self.welcome = sock, 0, {}
            self._decoder = p.Decoder(versions=p.ACCEPTED_VERSIONS)
            self._out.clear()
            self._unread = 0
            self._gen += 1
            deadline = time.monotonic() + wait_s
            while self.welcome.get("pid") is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ConnectionError(f"the daemon at {self.path} did not answer HELLO")
                if select.select([sock], [], [], left)[0] and not self._receive():
                    raise ConnectionError(f"the daemon at {self.path} closed the connection")
            self._give_box(sock, len(hello))
        except BaseException:
            sock.close()
            self._sock = None
            raise

    def _give_box(self, sock: _socket.socket, sent: int) -> None:
        """Pass the black box to a daemon that takes one (a BUFFER frame with its descriptor),
        emptied, its first byte the stream's next; without one, frames go one by one."""
        p = self._protocol
        if not (self._boxing and self.welcome.get("buffer") is True):
            return
        if self._box is None:
            from counterd.wire.spool import MappedWriter

            try:
                box = MappedWriter.memory(f"counterd-{os.getpid()}")
            except OSError as exc:
                log.info("no black box (%s): frames go to counterd one by one", exc)
                self._boxing = False
                return
            box.batching(BATCH_BYTES, int(BATCH_S * 1e9))
            box.paused = True  # until this connection is ready (_resume_lanes)
            self._box = box
        self._n += 1
        frame = p.Buffer(self._n, self._gen).encode(int(self.welcome.get("version", 2)))
        self._box.serve(self._gen)  # an older connection's session reads nothing of this one
        sock.settimeout(min(self.timeout_s, BLOCK_S))
        try:
            n = sock.sendmsg([frame], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                        struct.pack("i", self._box.fd))])
            if n < len(frame):
                sock.sendall(frame[n:])
        finally:
            sock.settimeout(None)
        self._box.reset(sent + len(frame))
        self._box.seq, self._box.gen = self._n, self._gen
        self._boxed = True

    def _attempt(self, force: bool = False) -> bool:
        """Connect if not connected and the backoff delay has passed (or ``force``), then
        resend what is held; True when connected."""
        if self._sock is not None:
            return True
        now = time.monotonic()
        if not force and now < self._retry_at:
            return False
        before = self.degraded
        try:
            self._connect()
        except OSError as exc:  # ConnectionError included
            self._retry_at = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
            self.degraded = f"cannot connect to counterd at {self.path}: {exc}"
            return False
        self.degraded = None
        if not self._stuck:
            self._alive_at = time.monotonic()
        self._resend()
        if self._sock is not None and self._waiting():  # what was held goes now
            self._push(self._sock, True)
        if self._sock is not None and before != "not connected yet":
            log.info("reconnected to counterd at %s (after: %s); resent %d records",
                     self.path, before, len(self.unacked))
        return self._sock is not None

    def _resend(self) -> None:
        """On a new connection: the contexts declared so far (with their ids: the lanes name
        them), the begins of open supersteps, then every unacknowledged record, renumbered."""
        p = self._protocol
        for (ctx, names), c in list(self._contexts.items()):
            self._seq += 1
            if not self._send(p.FrameType.CONTEXT,
                              context_payload(self._seq, c, ctx, names, self.scratch)) \
                    or self._sock is None:
                return
        self._take_ended()
        if self.scratch:  # a BEGIN or RECORD would be kept: what the last connection held goes
            self._open.clear()
            self.unacked.clear()
            return
        begun = dict(self._open)
        for lane in list(self._lanes):  # the lanes' open steps, begun there by an OPEN
            for st in lane.open_steps():
                key = (st.recorder.run_id, st.index)
                if key not in begun and st.recorder.pid == self._pid:
                    begun[key] = (st.recorder.context.key, st.index, st.name, st.rank, st.cpu,
                                  st.begin_ns, st.params)
        for line in begun.values():
            self._seq += 1
            self._send(p.FrameType.BEGIN, {"s": self._seq, "line": line_of(line)})
            if self._sock is None:
                return
        items = list(self.unacked.values())
        self.unacked = OrderedDict(zip(itertools.count(self._seq + 1), items))
        self._seq += len(items)
        for seq, item in list(self.unacked.items()):
            self._send_record(seq, item)
            if self._sock is None:
                return

    def _disconnect(self, reason: str, stuck: bool = False) -> None:
        """Drop the connection; what it carried stays held and is resent after the next
        connection (the first attempt after the backoff delay; at once at flush and close)."""
        if self._boxed and self._mine():  # what it held is resent (held records, open
            self._take_ended()             # begins), not read
            self._n, self._boxed = int(self._box.seq), False
            self._box.reset(0)
            self._box.paused = True
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._out.clear()
        self.welcome = {}
        self.degraded = reason
        self._stuck = stuck
        if stuck:
            self._backoff = BACKOFF_MAX_S
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)
        log.info("counterd connection lost (%s): %d records held, reconnecting",
                 reason, len(self.unacked))

    # -- the one way out -----------------------------------------------------------------------
    def _send(self, ftype: Any, payload: Mapping[str, Any], now: bool = False) -> bool:
        """A JSON frame, written (``now``: and sent with the batch before it); False (nothing
        written) for a payload that is not JSON (NaN, a lone surrogate)."""
        try:
            frame = self._protocol.encode(ftype, payload)
        except (ValueError, TypeError):
            return False
        self._write(frame, now)
        return True

    def _write(self, frame: bytes, now: bool = False) -> None:
        """Every frame leaves here; never raises. A broken connection is dropped (``_sock``
        None afterwards) and the caller keeps what the frame carried. With a black box the
        frame waits there for its batch (unless ``now``). What the socket does not take at
        once waits (in the output buffer, or the black box); the call waits for it
        (``BLOCK_S`` at most, as a full pipe would make it) only while the daemon shows it
        takes records."""
        sock = self._sock
        if sock is None:
            return
        if self._boxed:
            box = self._box
            try:
                box.append(frame)
            except OSError as exc:  # no memory for it: the next connections go without
                self._disconnect(f"the black box cannot grow ({exc})")
                self._boxing = False
                self._box = None
                box.close()
                return
            if not (now or box.due()):
                return
        else:
            self._out += frame
        self._push(sock, now or self._boxed)

    def _take_ended(self) -> None:
        """Hold the steps whose CLOSE a lane wrote (numbered there) until acknowledged; one
        whose OPEN went the Python way (the lanes were paused) is no longer open."""
        ended = self._ended
        n = len(ended)  # a lane may append meanwhile: those wait for the next call
        if n:
            opened = self._open
            for st in ended[:n]:
                self.unacked[st.close_seq] = st
                if opened:
                    opened.pop((st.recorder.run_id, st.index), None)
            del ended[:n]

    def _push(self, sock: _socket.socket, poll: bool) -> None:
        """Send what waits, waiting for the socket only while the daemon takes records; look
        for acknowledgements after a batch (``poll``), or every ``ACK_EVERY`` frames."""
        try:
            left = self._drain(sock)
            if left and time.monotonic() - self._alive_at < BLOCK_S:
                deadline = time.monotonic() + BLOCK_S
                while left and (wait := deadline - time.monotonic()) > 0:
                    if select.select([], [sock], [], wait)[1]:
                        left = self._drain(sock)
                if left:
                    self._disconnect(f"the daemon read nothing for {BLOCK_S:g} s", stuck=True)
                    return
        except (OSError, ValueError) as exc:
            self._disconnect(f"send failed ({exc})")
            return
        if left > OUT_MAX_BYTES:
            self._disconnect(f"the daemon read nothing of the last {left} bytes sent",
                             stuck=True)
            return
        self._unread += 1
        if poll or self._unread >= ACK_EVERY:  # acknowledgements are read on every path
            self._unread = 0
            self._poll()

    def _drain(self, sock: _socket.socket) -> int:
        """Send what waits (the output buffer, or the black box's frames not taken yet), as
        far as the socket takes it now; the bytes still waiting. A black box whose frames
        were all taken starts again empty."""
        if self._boxed:
            return int(self._box.drain(sock))
        out = self._out
        while out:
            try:
                n = sock.send(out, _socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            del out[:n]
        return len(out)

    def _send_record(self, seq: int, item: SuperstepRecord | Step) -> None:
        """A held record as a RECORD frame; one that cannot be encoded is refused here (and a
        scratch sink's dropped: a RECORD is kept)."""
        if self.scratch:
            self.unacked.pop(seq, None)
            return
        if not self._send(self._protocol.FrameType.RECORD,
                          {"s": seq, "rec": as_record(item).to_json()}):
            self.unacked.pop(seq, None)
            self._refuse(as_record(item), "not_encodable: the record is not JSON (NaN or "
                         "infinite values, or text that is not UTF-8)")

    def _refuse(self, rec: SuperstepRecord | None, message: str) -> None:
        self.refused_count += 1
        if len(self.refused) < REFUSED_KEPT:
            self.refused.append((rec, message))
        code = message.split(":", 1)[0]
        if code not in self._refused_codes:  # one warning per reason, not one per record
            self._refused_codes.add(code)
            log.warning("counterd refused a record: %s", message)

    # -- what comes back -----------------------------------------------------------------------
    def _poll(self) -> None:
        """Read whatever replies have arrived, without waiting."""
        if self._sock is not None and not self._receive():
            self._disconnect("the daemon closed the connection")

    def _receive(self) -> bool:
        """Read and handle the replies available now; False when the connection is gone."""
        sock = self._sock
        if sock is None:
            return False
        self._take_ended()  # an ERROR or ACK may be about a step a lane ended
        try:
            data = sock.recv(65536, _socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        if not data:
            return False
        self._decoder.feed(data)
        FrameType = self._protocol.FrameType
        unacked = self.unacked
        try:
            for ftype, payload in self._decoder.frames():
                seq = payload.get("s")
                if not isinstance(seq, int):
                    seq = None
                if ftype is FrameType.ACK and seq is not None:
                    done = []
                    while unacked:
                        first = next(iter(unacked))
                        if first > seq:
                            break
                        done.append(unacked.pop(first))
                    self._alive_at = time.monotonic()
                    self._stuck = False
                    self._backoff = BACKOFF_MIN_S  # this connection works
                    if done and self.on_ack is not None:
                        self.on_ack([as_record(r) for r in done])
                elif ftype is FrameType.WELCOME:
                    self.welcome = payload
                elif seq is not None and seq in self._awaited:
                    self._replies[seq] = {"type": ftype.name, **payload}
                elif ftype is FrameType.ERROR:
                    rec = unacked.pop(seq, None) if seq is not None else None
                    message = f"{payload.get('code')}: {payload.get('message')}"
                    if rec is not None:
                        self._refuse(as_record(rec), message)
                    else:
                        log.info("counterd refused a frame: %s", message)
        except (self._protocol.ProtocolError, RecursionError) as exc:  # never into the program
            log.warning("counterd sent a bad frame (%s); reconnecting", exc)
            return False
        return True

    def _wait(self, done: Callable[[], bool], timeout_s: float, reconnect: bool) -> bool:
        """Wait until ``done()`` or the timeout. With ``reconnect`` (flush, close) a lost
        connection is retried with backoff meanwhile; without (marker calls) it ends the wait.
        """
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            sock = self._sock
            if sock is None:
                if not reconnect:
                    break
                if not self._attempt():
                    time.sleep(max(0.0, min(left, self._retry_at - time.monotonic())))
                continue
            try:
                readable, writable, _ = select.select([sock], [sock] if self._waiting() else [],
                                                      [], min(left, 1.0))
                if writable:
                    self._drain(sock)
            except (OSError, ValueError) as exc:
                self._disconnect(f"send failed ({exc})")
                continue
            if readable:
                self._poll()
        return done()

    def _waiting(self) -> bool:
        """Whether frames wait to be sent (the output buffer, or the black box)."""
        return bool(self._out) or (self._boxed and self._box.waiting > 0)

    @property
    def takes_scratch(self) -> bool:
        """Connected to a daemon that keeps nothing of a scratch context."""
        return self._sock is not None and self.welcome.get("scratch") is True

    def _mine(self) -> bool:
        return self._pid == identity.pid  # a forked child never uses its parent's connection

    def _context_id(self, ctx: identity.Ctx, names: tuple[str, ...]) -> int | None:
        """The CONTEXT id for ``ctx`` and counter ``names`` on this connection, declaring it
        first if new; None when the connection cannot take one (the caller sends JSON) or
        broke sending it."""
        key = (ctx, names)
        c = self._contexts.get(key)
        if c is None:
            if self._sock is None or len(self._contexts) >= 0xFFFF or \
                    int(self.welcome.get("version", 1)) < 2:
                return None
            c = len(self._contexts) + 1
            self._seq += 1
            if not self._send(self._protocol.FrameType.CONTEXT,
                              context_payload(self._seq, c, ctx, names, self.scratch)) \
                    or self._sock is None:
                return None
            self._contexts[key] = c
        return c

    def _close_frame(self, step: Step) -> bytes | None:
        """The CLOSE frame of ``step`` (its sequence number is the next one), or None when it
        does not fit one."""
        return close_frame(step, self._context_id, lambda: self._seq + 1)


class _Held:
    """``DaemonLink._lock`` held: the first hold of a thread pauses the lanes, the last
    release lets them write into the black box again."""

    __slots__ = ("sink",)

    def __init__(self, sink: DaemonLink) -> None:
        self.sink = sink

    def __enter__(self) -> None:
        sink = self.sink
        sink._rlock.acquire()
        sink._held += 1
        if sink._held == 1:
            sink._pause_lanes()

    def __exit__(self, *exc: object) -> None:
        sink = self.sink
        sink._held -= 1
        if sink._held == 0:
            sink._resume_lanes()
        sink._rlock.release()


def hello_payload(job: str, scratch: bool = False) -> dict[str, Any]:
    """The HELLO this process's socket sinks send: its pid, host, job and batch job, and for a
    ``scratch`` sink (the calibration's: every context it declares is scratch) ``"scratch":
    true``, so that the daemon spends nothing on keeping its clocks (docs/protocol.md)."""
    return {"pid": os.getpid(), "host": _socket.gethostname(), "job": job,
            **({"batch_job": b} if (b := batch_job()) else {}),
            **({"scratch": True} if scratch else {})}


def line_of(item: Any) -> dict[str, Any]:
    """A begin line from what SocketSink.open keeps (or the line itself)."""
    if isinstance(item, dict):
        return item
    return begin_line(*item)
