"""The daemon client: a sink that sends a program's begins and records to counterd's socket
(its connection below the sink interface: :mod:`counterd.markers.sinks.link`)."""

from __future__ import annotations

import itertools
import logging
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.data.records import Param, SuperstepRecord
from counterd.markers import identity
from counterd.markers.sinks.link import BLOCK_S, DaemonLink, line_of
from counterd.markers.sinks.memory import MemorySink
from counterd.markers.sinks.spill import SpillFile

if TYPE_CHECKING:
    from counterd.markers.sinks.base import Sink
    from counterd.markers.sinks.spool import SpoolSink
    from counterd.markers.step import Step

log = logging.getLogger("counterd.markers")


class SocketSink(DaemonLink):
    """Sends begins and records to the daemon over its Unix socket (docs/protocol.md).

    Every record stays in ``unacked`` until the daemon acknowledges it (acknowledged =
    committed to the daemon's store; a step a compiled lane ended waits in ``_ended`` until
    the next look at the socket moves it there); acknowledgements are looked for after each
    batch, or every ``ACK_EVERY`` frames sent one by one, without blocking. A full socket
    makes a send wait (``BLOCK_S`` at most) only while the daemon shows that it takes
    records; otherwise what the socket does not take waits (in an output buffer, or the black
    box), and a daemon that reads nothing is left for a new connection.

    Where the daemon offers it (WELCOME ``"buffer"``), frames go first to a *black box*, a
    memory file the daemon holds too (:class:`counterd.wire.spool.MappedWriter`, passed once per
    connection with a BUFFER frame), and leave in batches (``BATCH_BYTES``, ``BATCH_S``): a
    marker costs no system call, and a process killed between two batches loses nothing,
    since the daemon reads what was never sent from the black box when the connection ends.

    When the connection breaks (or was never made: no daemon at start), ``degraded`` says why
    and the sink keeps trying to reconnect with backoff (``BACKOFF_MIN_S`` doubling to
    ``BACKOFF_MAX_S``) for as long as the program runs; once reconnected it resends everything
    unacknowledged and the begins of supersteps still open. Meanwhile records are held in
    ``unacked``, at most ``high_water`` of them: at the mark the sink waits up to ``BLOCK_S``
    for acknowledgements if the daemon is acknowledging, and appends what still exceeds it to
    this process's spill file (:mod:`counterd.markers.sinks.spill`), which ``counterd import``
    sends on. At :meth:`close` (interpreter exit) whatever is still unacknowledged after the
    flush goes there too, and one warning line says where.

    Records the daemon refuses are counted in ``refused_count`` (the first ``REFUSED_KEPT``
    kept in ``refused`` with the reason); :meth:`flush` returns False then. No method raises
    for the daemon's sake. One connection per process: a forked child gets its own sink
    (``counterd.markers.api._fork_copy``); one that uses its parent's anyway writes to
    ``fallback``. Thread-safe.

    A ``scratch`` sink (the markers' calibration, :meth:`Recorder.calibrate`) declares its
    contexts scratch: the daemon acknowledges their supersteps and keeps none. It sends
    nothing else that could be kept (no BEGIN, no RECORD, no resend after a reconnection) and
    never spills: what does not go as a scratch OPEN and CLOSE is dropped. Use one only with a
    daemon whose WELCOME says ``"scratch": true`` (:attr:`takes_scratch`).
    """

    def __init__(self, path: Path | str, *, job: str | None = None,
                 fallback: MemorySink | SpoolSink | None = None, timeout_s: float = 5.0,
                 high_water: int = 8192, spill: SpillFile | None = None,
                 scratch: bool = False) -> None:
        super().__init__(path, job, timeout_s, scratch)
        self.fallback: MemorySink | SpoolSink = fallback or MemorySink()
        self.high_water = max(1, high_water)
        self.spill = spill or SpillFile()
        self._flushed_refused = 0  # refused_count and spill.records at the last flush
        self._flushed_spilled = 0
        self._attempt(force=True)
        self._resume_lanes()

    def _pump(self) -> None:
        """The lanes' call when the black box's batch is due: send it, look for
        acknowledgements, hold the steps the lanes ended and keep ``high_water``."""
        if not self._mine():  # a forked child: its parent's connection is not its own
            return
        with self._lock:
            if self._sock is not None:
                self._push(self._sock, True)
            self._take_ended()
            self._after_record()

    # -- sink interface ----------------------------------------------------------------------
    def open(self, ctx: identity.Ctx, index: int, name: str, rank: int, cpu: int,
             begin_ns: int, params: dict[str, Param]) -> int:
        """Send the begin of a superstep as an OPEN (a BEGIN where OPEN does not fit). Returns
        the connection number the OPEN went on, 0 if none (then its end goes as a RECORD)."""
        fields = (ctx, index, name, rank, cpu, begin_ns, params)
        with self._lock:
            if self._pid != identity.pid:
                self.fallback.begin(line_of(fields))
                return 0
            self._open[(ctx[0], index)] = fields  # resent after a reconnection until it ends
            if self._sock is None and not self._attempt():
                return 0
            p = self._protocol
            c = self._context_id(ctx, ())
            frame = None
            if c is not None:
                try:
                    frame = p.encode_open(self._seq + 1, c, index, begin_ns, rank, cpu, name,
                                          params)
                except (struct.error, ValueError):  # beyond the packed fields, or not JSON
                    pass
            if self._sock is None:
                return 0
            self._seq += 1
            gen = self._gen
            if frame is None:
                if not self.scratch:  # a BEGIN would be kept (as an incomplete record)
                    self._send(p.FrameType.BEGIN, {"s": self._seq, "line": line_of(fields)})
                return 0
            self._write(frame)
            return gen

    def begin(self, line: Mapping[str, Any], count: Sequence[str] | None = None
              ) -> dict[str, Any] | None:
        """Send a begin line; with ``count``, ask the daemon to count this superstep's thread
        and wait (``BLOCK_S`` at most) until it has started (returns the daemon's reply)."""
        with self._lock:
            if not self._mine():
                self.fallback.begin(line)
                return None
            self._open[(line["run_id"], line["index"])] = dict(line)
            if self._sock is None and not self._attempt():
                return None
            self._seq += 1
            seq = self._seq
            payload: dict[str, Any] = {"s": seq, "line": line}
            if count is not None:
                payload["count"] = list(count)
            if count is None:
                self._send(self._protocol.FrameType.BEGIN, payload)
                return None
            self._awaited.add(seq)
            if not self._send(self._protocol.FrameType.BEGIN, payload, now=True):
                self._awaited.discard(seq)
                return None
            self._wait(lambda: seq in self._replies, min(self.timeout_s, BLOCK_S),
                       reconnect=False)
            self._awaited.discard(seq)
            return self._replies.pop(seq, None)

    def record(self, rec: SuperstepRecord) -> None:
        with self._lock:
            if not self._mine():
                self.fallback.record(rec)
                return
            self._open.pop((rec.run_id, rec.index), None)
            self._take_ended()
            self._seq += 1
            self.unacked[self._seq] = rec
            if self._sock is not None or self._attempt():
                self._send_record(self._seq, rec)
            self._after_record()

    def closed(self, step: Step) -> None:
        """A superstep ended: a CLOSE if its OPEN went on this connection, else a RECORD."""
        with self._lock:
            if self._pid != identity.pid:
                self.fallback.record(step)
                return
            self._open.pop((step.recorder.run_id, step.index), None)
            frame = None
            if (self._sock is not None or self._attempt()) and step.sent == self._gen:
                frame = self._close_frame(step)  # may declare a CONTEXT, and lose the socket
            self._take_ended()
            self._seq += 1
            self.unacked[self._seq] = step
            if self._sock is not None:
                if frame is None:
                    self._send_record(self._seq, step)
                else:
                    self._write(frame)
            self._after_record()

    # -- the rest of the sink interface (counterd.markers.sinks.base.Sink) ----------------
    durable = True
    daemon = True

    def release(self, timeout_s: float | None = None) -> None:
        """At exit, or when the recorder is replaced: flushed, closed, the rest spilled."""
        self.close(timeout_s)

    def prepare(self, ctx: identity.Ctx) -> None:
        with self._lock:
            if self._mine():
                self._context_id(ctx, ())

    def lane_args(self, ctx: identity.Ctx, names: tuple[str, ...]) -> dict[str, Any] | None:
        """Through the black box: the lane writes the frames there and hands each step it
        closed to the sink, which holds it until acknowledged and sends the batch when due
        (:meth:`_pump`). None with no connection now, or an older daemon (frames one by one)."""
        with self._lock:
            box = self._box if self._boxed else None
            if box is None or box.native is None or not self._mine():
                return None
            c_open = self._context_id(ctx, ())
            c_close = self._context_id(ctx, names)
        if c_open is None or c_close is None:
            return None
        return dict(on_closed=self._ended.append, writer=box.native, sink_open=self.open,
                    sink_closed=self.closed, c_open=c_open, c_close=c_close, pump=self._pump)

    def lane_made(self, lane: Any) -> None:
        self._lanes.add(lane)  # its open steps are begun again on a new connection

    def kept(self) -> list[SuperstepRecord]:
        return self.fallback.kept()  # what a forked child that used it anyway kept

    def where(self) -> tuple[Path | None, Path | str]:
        return None, self.path

    def in_child(self, fresh: Sink) -> Sink:
        return fresh  # a connection of its own

    def scratch_sink(self, wait_s: float) -> SocketSink | None:
        """A second connection to the same daemon whose supersteps it keeps none of; None
        where the daemon does not offer that (or went, or changed, meanwhile)."""
        if not self.takes_scratch:
            return None
        sink = SocketSink(self.path, job=self.job, timeout_s=wait_s, scratch=True)
        if not sink.takes_scratch:
            sink.discard(wait_s)
            return None
        return sink

    def discard(self, wait_s: float) -> None:
        """Until the daemon has acknowledged the scratch supersteps (it keeps none): its
        handling of them then disturbs none of the program's own."""
        self.close(timeout_s=wait_s, spill=False)

    def _after_record(self) -> None:
        """Enforce ``high_water``: wait for acknowledgements if the daemon gives them (a
        slower daemon slows the program down, as a full pipe would), spill the rest."""
        if len(self.unacked) <= self.high_water:
            return
        if self._sock is not None:
            self._poll()
            if len(self.unacked) > self.high_water and \
                    time.monotonic() - self._alive_at < BLOCK_S:
                self._wait(lambda: len(self.unacked) <= self.high_water // 2, BLOCK_S,
                           reconnect=False)
        self._spill(len(self.unacked) - self.high_water)

    def _spill(self, n: int) -> None:
        """Move the ``n`` oldest held records to the spill file (kept held if it fails); a
        scratch sink drops them."""
        if n <= 0:
            return
        seqs = list(itertools.islice(self.unacked, n))
        if self.scratch:
            for s in seqs:
                del self.unacked[s]
            return
        if self.spill.write([self.unacked[s] for s in seqs]):
            for s in seqs:
                del self.unacked[s]

    def read(self, pid: int, events: Sequence[str] = (), tid: int | None = None
             ) -> dict[str, Any]:
        """Ask the daemon for the counters of ``pid`` (cumulative since the first READ); returns
        the READING or ERROR payload."""
        if not self._mine():  # a forked child: its parent's connection is not its own
            return {"code": "unreachable", "message": "a forked child of the process that "
                    "connected: it has no connection of its own"}
        with self._lock:
            if self._sock is None and not self._attempt(force=True):
                return {"code": "unreachable", "message": str(self.degraded)}
            self._seq += 1
            seq = self._seq
            self._awaited.add(seq)
            if not self._send(self._protocol.FrameType.READ,
                              {"s": seq, "pid": pid, "tid": tid, "count": list(events)},
                              now=True):
                self._awaited.discard(seq)
                return {"code": "bad_read", "message": "the request is not JSON"}
            self._wait(lambda: seq in self._replies, self.timeout_s, reconnect=False)
            self._awaited.discard(seq)
            return self._replies.pop(seq, {"code": "timeout", "message": "no reply"})

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every record given so far is acknowledged (reconnecting meanwhile if
        need be). True only if all are and none was refused or spilled since the last
        flush."""
        with self._lock:
            if not self._mine():
                return False
            self._take_ended()
            if self.unacked:
                if self._sock is not None or self._attempt(force=True):
                    self._seq += 1
                    self._send(self._protocol.FrameType.SYNC, {"s": self._seq}, now=True)
                self._wait(lambda: not self.unacked,
                           self.timeout_s if timeout_s is None else timeout_s, reconnect=True)
            ok = not self.unacked and self.refused_count == self._flushed_refused \
                and self.spill.records == self._flushed_spilled
            self._flushed_refused, self._flushed_spilled = self.refused_count, \
                self.spill.records
            return ok

    def close(self, timeout_s: float | None = None, *, spill: bool = True) -> None:
        """Flush (one connection attempt if disconnected: an exit never waits for a daemon
        that is not there), close, and (with ``spill``) write what is still unacknowledged to
        the spill file; one warning names it and how to import it."""
        with self._lock:
            if not self._mine():
                return
            self._take_ended()
            if self.unacked and (self._sock is not None or self._attempt(force=True)):
                self.flush(timeout_s)
            if self._sock is not None:
                self._sock.close()  # the daemon reads what the black box still holds
                self._sock = None
            if self._box is not None:
                self._take_ended()
                self._n, self._boxed = int(self._box.seq), False
                self._box.close()
                self._box = None
            self.degraded = "closed"
            held = len(self.unacked)
            if spill and held:
                self._spill(held)
            self.spill.close()
            if self.spill.records:
                log.warning("counterd: %d records the daemon did not acknowledge are in %s; "
                            "send them with: counterd import %s", self.spill.records,
                            self.spill.path, self.spill.path)
            if spill and self.unacked:
                log.warning("counterd: %d records the daemon did not acknowledge are lost: "
                            "the spill file could not be written", len(self.unacked))
