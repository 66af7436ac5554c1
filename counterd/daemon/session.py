"""One marker client's connection: its state and the protocol's state machine (DESIGN.md
section 6, :mod:`counterd.wire.protocol`).

A :class:`Session` answers HELLO with WELCOME, then takes CONTEXT, BEGIN, OPEN, CLOSE, RECORD,
READ, SYNC and BUFFER frames in sequence-number order. It holds the supersteps begun (BEGIN, OPEN)
until they end (RECORD, CLOSE), hands records to the writer (:mod:`counterd.daemon.writer`),
counts on the client's behalf where asked (:mod:`counterd.daemon.behalf`) and answers each
frame it refuses with an ERROR (a ``protocol_errors`` metric per code). Replies wait in
``outbuf`` for the server to send them; a client that does not read them is dropped. When the
connection closes with supersteps still begun (the client died inside them), they become
``incomplete`` records. The socket itself (accepting, reading, writing) is the server's
(:mod:`counterd.daemon.server`); what the sessions of a daemon share is
:mod:`counterd.daemon.shared`, the reading of a client's black box :mod:`counterd.daemon.blackbox`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from counterd.daemon.auth import Peer
from counterd.daemon.behalf import ClientCounters
from counterd.daemon.blackbox import ClientBox, buffer_refusal
from counterd.daemon.metrics_state import Workload
from counterd.daemon.sampling import owner_uids
from counterd.daemon.shared import Shared
from counterd.daemon.store import ClientClock, RunInfo
from counterd.daemon.writer import Item
from counterd.data.clocks import (
    Anchor,
    process_clock,
    sync_bound_ns,
    take_anchor,
)
from counterd.data.errors import CounterdError, NoSuchTarget
from counterd.data.records import SuperstepRecord, incomplete_record
from counterd.wire import binary_frames, protocol
from counterd.wire.protocol import Decoder, FrameType, ProtocolError

log = logging.getLogger("counterd.daemon")

MAX_OUTBUF = 1 << 20  # replies a client does not read; beyond, the client is dropped


# Backends whose counts come from outside the program and never through a daemon: a record
# of one that reaches the daemon counted nothing, and says why (flag unsupported_counters,
# unsupported["*"]).
OUTSIDE_ONLY = {
    "callgrind": "callgrind counts a program only when `counterd record --backend callgrind -- "
                 "CMD` runs it under valgrind; through the daemon nothing counted these "
                 "supersteps: unset COUNTERD_BACKEND (the daemon counts on the program's "
                 "behalf) or set it to perf",
}


class Opened(NamedTuple):
    """A superstep begun by an OPEN: the frame, and the CONTEXT it named (run_id, pid, host,
    backend)."""

    context: protocol.Context
    open: binary_frames.Open


Begun = Mapping[str, Any] | Opened  # a BEGIN's line, or an OPEN


class Session(ClientBox):
    """One connection. ``on_close`` is the server's: it forgets the session (selector,
    connection table, clients) when :meth:`close` runs, before the socket is closed."""

    def __init__(self, cid: int, sock: socket.socket, peer: Peer, decoder: Decoder,
                 opened: float, shared: Shared, on_close: Callable[[Session], None]) -> None:
        self.cid = cid
        self.sock = sock
        self.peer = peer
        self.opened = opened
        self.decoder = decoder
        self.shared = shared
        self._on_close = on_close
        self.hello = False
        self.job = "unknown"
        self.batch_job = ""
        self.last_seq = 0
        self._said_uncounted = False  # the OUTSIDE_ONLY warning, once per connection
        self.begins: dict[tuple[str, int], Begun] = {}  # (run_id, index) -> begun superstep
        self.contexts: dict[int, protocol.Context] = {}
        self._client_clock: ClientClock | None = None
        self._hello_anchor: Anchor | None = None
        # Clock anchors (counterd.data.clocks) of the runs this connection declared in a CONTEXT
        # not scratch: the start anchor of each, held until the connection hands the writer
        # a record of that run (so a connection that stores nothing costs the writer
        # nothing); then the runs anchored, anchored again when the connection ends.
        self._unanchored: dict[str, Anchor] = {}
        self._anchored: set[str] = set()
        self._sizes: dict[tuple[str, int], int] = {}  # wire bytes of each begun superstep
        self.held = 0  # bytes of self.begins and self.contexts, as sent (shared.held's part)
        self.last_frame = opened
        self.info: RunInfo | None = None
        self.counters = ClientCounters(peer.pid)
        self.outbuf = bytearray()
        self.ack_wanted = 0
        self.ack_sent = 0
        self.partial_since: float | None = None
        self.registered = 0  # the selector events watched for it (the server's)
        self.closed = False
        self.received = 0  # bytes read from the connection (the client's stream offset)
        self.box: int | None = None  # the client's black box (a BUFFER's descriptor)
        self.box_serves = 0  # the connection its head must name (the BUFFER's "box")
        self._box_sent: int | None = None  # a descriptor received, for the next BUFFER
        self.box_read = 0  # bytes of the box read after the connection ended
        # The server's scheduling (server.Server): in its queue of sessions with work, reading
        # its socket, the connection ended (its box and the frames buffered still to handle),
        # a QUERY's answer awaited (nothing more is handled until it comes), replies
        # undeliverable (the client is gone: what it sent is still read).
        self.queued = False
        self.reading = True
        self.eof = False
        self.parked = False
        self.gone = False
        # Acknowledgements: the last frame handed to the writer, the last the writer
        # committed, and a SYNC (or scratch CLOSE) to acknowledge once both meet.
        self.put_seq = 0
        self.committed = 0
        self.deferred = 0

    @property
    def pid(self) -> int:
        return self.peer.pid

    @property
    def uid(self) -> int:
        return self.peer.uid

    def describe(self) -> str:
        return self.peer.describe()

    @property
    def version(self) -> int:
        """The protocol version this client speaks (that of its first frame)."""
        return self.decoder.version or protocol.PROTOCOL_VERSION

    # -- output, violations, end -------------------------------------------------------------
    def send(self, frame: bytes) -> None:
        self.outbuf += frame
        if len(self.outbuf) > MAX_OUTBUF:
            self.shared.log.warning("%s does not read its replies; dropping it",
                                    self.describe())
            self.shared.state.count("protocol_errors", "slow_reader")
            self.close(incomplete=True)

    def violation(self, code: str, message: str, seq: int | None = None,
                  reply: bool = True) -> None:
        """Log and count a protocol violation; answer it with an ERROR (about frame ``seq``)
        unless ``reply`` is False."""
        self.shared.log.warning("%s: %s: %s", self.describe(), code, message)
        self.shared.state.count("protocol_errors", code)
        if reply and not self.closed:
            self.send(protocol.Error(code, message, seq).encode(self.version))

    def close(self, *, incomplete: bool) -> None:
        """End the session; with ``incomplete``, the supersteps still begun are stored as
        incomplete records. Sends what ``outbuf`` holds if the socket takes it at once."""
        if self.closed:
            return
        self.closed = True
        for fd in (self.box, self._box_sent):
            if fd is not None:
                os.close(fd)
        self.box = self._box_sent = None
        if incomplete and self.begins:
            info = RunInfo(self.job, self.uid, self.batch_job)
            for line in self.begins.values():
                if isinstance(line, Opened) and line.context.scratch:
                    continue  # a calibration's superstep: never kept
                try:
                    rec = _incomplete_record(line)
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("%s: unusable begin line %r: %s", self.describe(), line, exc)
                    continue
                why = self._refusal(0)
                if why is not None:
                    self.shared.log.warning("%s: its incomplete superstep %d of run %s is not "
                                            "kept: %s", self.describe(), rec.index,
                                            rec.run_id, why)
                    continue
                log.info("%s: died inside superstep %d (%s) of run %s: stored as incomplete",
                         self.describe(), rec.index, rec.name, rec.run_id)
                self._anchor_start(rec.run_id)
                self.shared.writer.put(Item(0, 0, rec, info, self._sizes.get(
                    (rec.run_id, rec.index), 0)))
        self.begins.clear()
        self._sizes.clear()
        for run_id in sorted(self._anchored):
            self.shared.writer.anchor(self.uid, run_id, self._clock())  # its end
        self._anchored.clear()
        self._unanchored.clear()
        self.contexts.clear()
        self._release(self.held)
        self.counters.close()
        if self.outbuf:  # best effort: the ERROR that explains why we close
            with contextlib.suppress(OSError):
                self.sock.send(self.outbuf)
        self._on_close(self)
        self.sock.close()

    # -- frames ------------------------------------------------------------------------------
    def handle(self, ftype: FrameType, payload: Any) -> None:
        """One frame from :meth:`Decoder.frames`. Raises ProtocolError for what breaks the
        conversation (the server reports it, and closes the connection before HELLO); a frame
        refused on its own is answered here, with an ERROR carrying its sequence number."""
        if ftype not in protocol.CLIENT_TYPES:
            raise ProtocolError("bad_type", f"{ftype.name} is not a client frame")
        self.last_frame = time.monotonic()
        if ftype is FrameType.HELLO:
            if self.hello:
                raise ProtocolError("bad_order", "HELLO sent twice")
            self._hello(protocol.Hello.decode(payload))
            return
        if not self.hello:
            raise ProtocolError("no_hello", f"{ftype.name} before HELLO")
        if ftype is FrameType.OPEN or ftype is FrameType.CLOSE:
            head = binary_frames.head(ftype, payload)
            self._follow(head.s)
            if ftype is FrameType.OPEN:
                self._open(head, payload)
            else:
                self._close_step(head, payload)
            return
        seq = self._follow(payload.get("s"))
        if ftype is FrameType.CONTEXT:
            self._context(seq, payload)
        elif ftype is FrameType.BEGIN:
            self._begin(seq, payload)
        elif ftype is FrameType.RECORD:
            self._record(seq, payload)
        elif ftype is FrameType.READ:
            self._read(seq, payload)
        elif ftype is FrameType.SYNC:
            self.sync(protocol.Sync.decode(payload).s)
        elif ftype is FrameType.BUFFER:
            self._buffer(seq, payload)
        elif ftype is FrameType.QUERY:
            privileged = self.shared.auth.privileged(self.peer)
            worker = self.shared.query_worker
            if worker is None:
                self.send(self.shared.queries.answer(payload, self.peer, privileged,
                                                     self.version, self.decoder.max_frame))
            else:  # answered off the loop; this connection waits for it (one in flight)
                self.parked = True
                worker.submit(self.cid, payload, self.peer, privileged, self.version,
                              self.decoder.max_frame)

    def _follow(self, seq: object) -> int:
        """``seq`` if it follows the last sequence number (ProtocolError ``bad_seq`` if not)."""
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= self.last_seq:
            raise ProtocolError("bad_seq", f"sequence number {seq!r} does not follow "
                                f"{self.last_seq}")
        self.last_seq = seq
        return seq

    def _hello(self, hello: protocol.Hello) -> None:
        self.hello = True
        # the start anchor of the runs this connection declares: before WELCOME, so before
        # any superstep the client marks through it (its CONTEXTs may come later, batched).
        # None for a connection that says all its contexts will be scratch (the markers'
        # calibration): nothing of it is kept, so it costs no clock work; a context it
        # declares not scratch after all is anchored from that CONTEXT on.
        self._hello_anchor = None if hello.scratch else take_anchor()
        self.job = (hello.job or "unknown")[:128]
        self.batch_job = hello.batch_job or ""
        self.shared.clients.add(self.pid, Workload(self.uid, self.job, self.batch_job))
        self.send(protocol.Welcome(version=self.version, max_frame=self.decoder.max_frame,
                                   uid=self.uid, pid=self.pid,
                                   buffer=self.version >= 2,
                                   scratch=self.version >= 2).encode(self.version))

    def _hold(self, seq: int, size: int, *, opening: bool) -> bool:
        """Account ``size`` bytes more held for this client (a begun superstep when
        ``opening``, else a context); refuse (False, with an ERROR) beyond the limits."""
        limits = self.shared.limits
        held_by_uid = self.shared.held.get(self.uid, 0)
        if opening and len(self.begins) >= limits.max_open_per_client:
            self.violation("too_many_open", f"more than {limits.max_open_per_client} "
                           "supersteps open on one connection (socket.max_open_per_client)",
                           seq)
            return False
        if self.held + size > limits.max_bytes_per_client:
            self.violation("too_much_held", "the supersteps open and contexts of this "
                           f"connection would hold more than {limits.max_bytes_per_client} "
                           "bytes (socket.max_bytes_per_client)", seq)
            return False
        if self.uid != 0 and held_by_uid + size > limits.max_bytes_per_uid:
            self.violation("too_much_held", f"the connections of uid {self.uid} would hold "
                           f"more than {limits.max_bytes_per_uid} bytes "
                           "(socket.max_bytes_per_uid)", seq)
            return False
        self.held += size
        self.shared.held[self.uid] = held_by_uid + size
        return True

    def _release(self, size: int) -> None:
        if not size:
            return
        self.held -= size
        left = self.shared.held.get(self.uid, 0) - size
        if left > 0:
            self.shared.held[self.uid] = left
        else:
            self.shared.held.pop(self.uid, None)

    def _keep_begun(self, key: tuple[str, int], begun: Begun) -> None:
        """Hold a begun superstep (its bytes already accounted by :meth:`_hold`)."""
        self._release(self._sizes.pop(key, 0))  # a begin sent again replaces the first
        self.begins[key] = begun
        self._sizes[key] = self.decoder.last_size

    def _end_begun(self, key: tuple[str, int]) -> None:
        if self.begins.pop(key, None) is not None:
            self._release(self._sizes.pop(key, 0))

    def _begin(self, seq: int, payload: Mapping[str, Any]) -> None:
        try:
            begin = protocol.Begin.decode(payload)
            line = begin.line
            held = _incomplete_record(line)  # validates the fields an incomplete record needs
            key = (held.run_id, held.index)
        except ProtocolError as exc:
            self.violation(exc.code, exc.message, seq)
            return
        except (KeyError, TypeError, ValueError) as exc:
            self.violation("bad_begin", f"malformed begin line ({exc})", seq)
            return
        if not self._hold(seq, self.decoder.last_size, opening=True):
            return
        self._clock_while_alive(held.run_id)
        self._keep_begun(key, line)
        if begin.count is None:
            return
        unsupported = None
        try:
            self.counters.start(self.shared.counting, key, line.get("tid"), begin.count)
        except (CounterdError, OSError, TypeError, ValueError) as exc:
            unsupported = str(exc)
        self.send(protocol.Started(seq, unsupported).encode(self.version))

    def _buffer(self, seq: int, payload: Mapping[str, Any]) -> None:
        """BUFFER: the descriptor that came with it becomes the black box, if it is a memory
        file (``F_GET_SEALS`` works on shmem files only: reading one never blocks)."""
        fd, self._box_sent = self._box_sent, None
        why = buffer_refusal(payload, fd, self.box is not None)
        if isinstance(why, str):
            if fd is not None:
                os.close(fd)
            self.violation("bad_buffer", why, seq)
            return
        self.box, self.box_serves = fd, why.box

    def _context(self, seq: int, payload: Mapping[str, Any]) -> None:
        try:
            ctx = protocol.Context.decode(payload)
        except ProtocolError as exc:
            self.violation(exc.code, exc.message, seq)
            return
        if ctx.c not in self.contexts:
            if len(self.contexts) >= self.shared.limits.max_contexts_per_client:
                self.violation("too_many_contexts", "more than "
                               f"{self.shared.limits.max_contexts_per_client} contexts on one "
                               "connection (socket.max_contexts_per_client)", seq)
                return
            if not self._hold(seq, self.decoder.last_size, opening=False):
                return
            if not ctx.scratch and ctx.run_id not in self._unanchored \
                    and ctx.run_id not in self._anchored:  # its start: the HELLO's anchor
                self._unanchored[ctx.run_id] = self._hello_anchor or take_anchor()
        self.contexts[ctx.c] = ctx

    def _anchor_start(self, run_id: str) -> None:
        """Before the first record of ``run_id`` this connection hands the writer: that run's
        start anchor, if it declared the run in a CONTEXT (the writer commits both in one
        transaction)."""
        start = self._unanchored.pop(run_id, None)
        if start is not None:
            self.shared.writer.anchor(self.uid, run_id, self._clock(), start)
            self._anchored.add(run_id)

    def _clock_while_alive(self, run_id: str) -> None:
        """At a superstep's begin in a run that will be anchored: read the client's clock now,
        while the client is alive to be read (its first record may reach the writer only after
        it died: the incomplete record made at the connection's end, its black box read
        after; /proc of a dead pid has no time namespace, or another process's)."""
        if run_id in self._unanchored and self._client_clock is None:
            self._clock()

    def _clock(self) -> ClientClock:
        """The client's clock beside the daemon's (read once per connection): this kernel's
        boot, the client's time namespace and its monotonic offset (counterd.data.clocks)."""
        if self._client_clock is None:
            timens, offset = process_clock(self.pid, self.shared.timens)
            self._client_clock = ClientClock(self.shared.boot_id, timens, offset,
                                             sync_bound_ns())
        return self._client_clock

    def _open(self, head: binary_frames.Head, body: bytes) -> None:
        seq = head.s
        ctx = self.contexts.get(head.c)
        if ctx is None:
            self.violation("unknown_context", f"OPEN names context {head.c}, not declared "
                           "on this connection", seq)
            return
        try:
            opened = binary_frames.Open.decode(body)
        except ProtocolError as exc:
            self.violation(exc.code, exc.message, seq)
            return
        if not self._hold(seq, self.decoder.last_size, opening=True):
            return
        self._clock_while_alive(ctx.run_id)
        self._keep_begun((ctx.run_id, opened.index), Opened(ctx, opened))

    def _close_step(self, head: binary_frames.Head, body: bytes) -> None:
        seq, index = head.s, head.index
        ctx = self.contexts.get(head.c)
        begun = self.begins.get((ctx.run_id, index)) if ctx is not None else None
        if ctx is None or not isinstance(begun, Opened):
            self.violation("unknown_begin", f"CLOSE of superstep {index} (context {head.c})"
                           " without its OPEN on this connection: send a RECORD", seq)
            self.shared.state.count("refused", "malformed")
            return
        try:
            close = binary_frames.Close.decode(body, ctx.counters)
            rec = protocol.record_of(begun.context, begun.open, close)
        except ProtocolError as exc:
            self.violation(exc.code, exc.message, seq)
            self.shared.state.count("refused", "malformed")
            return
        except ValueError as exc:
            self.violation("bad_record", f"malformed CLOSE ({exc})", seq)
            self.shared.state.count("refused", "malformed")
            return
        self._end_begun((ctx.run_id, index))
        if ctx.scratch:  # decoded and acknowledged as any, kept nowhere (protocol: scratch)
            self.sync(seq)  # and never reaches the writer
            return
        if self.info is None:
            self.info = RunInfo(self.job, self.uid, self.batch_job)
        self._put(Item(self.cid, seq, self._uncounted(rec), self.info, self.decoder.last_size))

    def _record(self, seq: int, payload: Mapping[str, Any]) -> None:
        try:
            rec = protocol.Record.decode(payload).rec
        except ProtocolError as exc:
            self.violation(exc.code, exc.message, seq)
            self.shared.state.count("refused", "malformed")
            return
        key = (rec.run_id, rec.index)
        self._end_begun(key)
        rec = self.counters.finish(key, rec, self.describe())
        self._put(Item(self.cid, seq, self._uncounted(rec),
                       RunInfo(self.job, self.uid, self.batch_job), self.decoder.last_size))

    # -- the writer, acknowledgements, quotas ---------------------------------------------------
    def _refusal(self, size: int) -> str | None:
        """Why this uid may not have a record of ``size`` bytes more kept (the store quota,
        the disk reserve: :class:`~counterd.daemon.quota.Usage`), or None."""
        limits = self.shared.limits
        return self.shared.writer.usage.refusal(self.uid, size, limits.max_store_bytes_per_uid,
                                                limits.store_reserve_bytes)

    def _put(self, item: Item) -> None:
        """Hand a record to the writer (acknowledged once committed), or refuse it with an
        ERROR naming the quota it would break."""
        why = self._refusal(item.size)
        if why is not None:
            self.violation("quota", why, item.seq)
            self.shared.state.count("refused", "quota")
            self.sync(item.seq)  # answered: the ACK that follows covers the ERROR
            return
        if item.record is not None:
            self._anchor_start(item.record.run_id)
        self.shared.writer.put(item)
        self.put_seq = item.seq

    def sync(self, seq: int) -> None:
        """Acknowledge frame ``seq`` (a SYNC, a scratch CLOSE: nothing to keep) as soon as
        everything handed to the writer before it is committed: at once if nothing is in
        flight, else with the writer's acknowledgement (:meth:`committed_to`). Neither costs
        the writer anything."""
        if self.put_seq <= self.committed:
            self.ack_wanted = max(self.ack_wanted, seq)
        else:
            self.deferred = max(self.deferred, seq)

    def committed_to(self, seq: int) -> None:
        """The writer committed this connection's frames up to ``seq``."""
        self.committed = max(self.committed, seq)
        self.ack_wanted = max(self.ack_wanted, seq)
        if self.deferred and self.committed >= self.put_seq:
            self.ack_wanted = max(self.ack_wanted, self.deferred)
            self.deferred = 0

    def _uncounted(self, rec: SuperstepRecord) -> SuperstepRecord:
        """``rec``, refused its counters with the reason when its backend cannot count through
        a daemon (:data:`OUTSIDE_ONLY`): it had none, and nothing said why (issue 34). Logged
        once per connection."""
        why = OUTSIDE_ONLY.get(rec.backend)
        if why is None or rec.counters:
            return rec
        if not self._said_uncounted:
            self._said_uncounted = True
            self.shared.log.warning("%s: COUNTERD_BACKEND=%s: %s", self.describe(), rec.backend,
                                    why)
        return replace(rec, flags=rec.flags | {"unsupported_counters"},
                       unsupported={**rec.unsupported, "*": rec.unsupported.get("*", why)})

    def _read(self, seq: int, payload: Mapping[str, Any]) -> None:
        """READ: cumulative counters of a process the client may read, since its first READ."""
        try:
            read = protocol.Read.decode(payload)
        except ProtocolError as exc:
            self.violation(exc.code, exc.message, seq)
            return
        pid = read.pid
        tid = read.tid if read.tid is not None else pid
        uids = owner_uids(pid)
        if uids is None or not Path(f"/proc/{pid}/task/{tid}").exists():
            self.violation("no_such_process", f"pid {pid} tid {tid} does not exist", seq)
            return
        if not self.shared.auth.may_read(self.peer, uids):
            self.violation("forbidden",
                           f"uid {self.uid} may not read counters of pid {pid} (owned by uid "
                           f"{uids[0]}): only root or members of socket.allowed_group may",
                           seq)
            return
        try:
            reading = self.counters.read(self.shared.counting, pid, tid, read.count)
        except NoSuchTarget:
            self.violation("no_such_process", f"pid {pid} exited", seq)
            return
        except CounterdError as exc:
            self.violation("unavailable", str(exc), seq)
            return
        self.send(protocol.Reading(
            seq, {k: (v.value, v.ratio) for k, v in reading.values.items()},
            dict(reading.unsupported)).encode(self.version))


def _incomplete_record(line: Begun) -> SuperstepRecord:
    """The ``incomplete`` record of a begin never ended (a BEGIN's line or an OPEN)."""
    if isinstance(line, Opened):
        ctx, op = line.context, line.open
        line = {"run_id": ctx.run_id, "index": op.index, "name": op.name, "rank": op.rank,
                "pid": ctx.pid, "cpu": op.cpu, "begin_ns": op.begin_ns, "params": op.params,
                "backend": ctx.backend, "host": ctx.host}
    return incomplete_record(line)
