"""Where a program's records go when no daemon takes them: memory or a spool file."""

from __future__ import annotations

import atexit
import collections
import errno
import os
import struct
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from counterd import spool
from counterd import wire as protocol  # the framing, not the typed frames: cheap to import
from counterd.env import ENV_SPOOL
from counterd.errors import BadInput
from counterd.markers import identity
from counterd.records import SuperstepRecord

if TYPE_CHECKING:
    from counterd.markers.client import SocketSink
    from counterd.markers.recorder import Step


def is_socket_sink(sink: object) -> TypeGuard[SocketSink]:
    """``isinstance(sink, SocketSink)`` without loading the daemon's client (socket, select,
    logging, the spill file: about 10 ms before a program's first superstep) where no sink of
    it can exist: a program that has made one has loaded it."""
    client = sys.modules.get("counterd.markers.client")
    return client is not None and isinstance(sink, client.SocketSink)


def _as_record(item: SuperstepRecord | Step) -> SuperstepRecord:
    return item if isinstance(item, SuperstepRecord) else item.record()


# What the binary-frame sinks (the spool's mapped file, the daemon's socket) send alike.

def context_payload(seq: int, c: int, ctx: identity.Ctx, names: Sequence[str],
                    scratch: bool = False) -> dict[str, Any]:
    """The CONTEXT frame's payload declaring ``ctx`` with counter ``names`` as ``c`` (a
    ``scratch`` one: of a calibration, nothing kept; see counterd.protocol)."""
    return {"s": seq, "c": c, "run_id": ctx[0], "pid": ctx[1], "host": ctx[2],
            "backend": ctx[3], "counters": list(names),
            **({} if ctx[4] is None else {"marker_ns": ctx[4]}),
            **({"scratch": True} if scratch else {})}


def begin_line(ctx: identity.Ctx, index: int, name: str, rank: int, cpu: int, begin_ns: int,
               params: Mapping[str, Any]) -> dict[str, Any]:
    """The begin line of a superstep of ``ctx`` (what an OPEN stands for)."""
    return {"run_id": ctx[0], "index": index, "name": name, "rank": rank, "pid": ctx[1],
            "cpu": cpu, "begin_ns": begin_ns, "params": params, "backend": ctx[3],
            "host": ctx[2], "marker_ns": ctx[4]}


def close_frame(step: Step, context_id: Callable[[identity.Ctx, tuple[str, ...]], int | None],
                next_seq: Callable[[], int]) -> bytes | None:
    """The CLOSE frame of an ended ``step``, its counters named by the context
    ``context_id`` gives (declaring it if new), numbered ``next_seq()``; None when it does not
    fit one (an unknown flag or source, a value out of range, no context, the text of an
    exception: a CLOSE has no room for it, the RECORD sent instead carries it; the compiled
    lane hands such a step to the Python path alike)."""
    if step.end_ns is None or step.exception is not None:
        return None
    counters, flags, unsupported = step.recorder._parts(step)
    bits = protocol.flag_bits(flags)
    if bits is None:
        return None
    try:
        c = context_id(step.recorder._ctx, tuple(counters))
        if c is None:
            return None
        return protocol.encode_close(next_seq(), c, step.index, step.begin_ns, step.end_ns,
                                     bits, counters.values(), unsupported)
    except (KeyError, struct.error, ValueError):
        return None


class MemorySink:
    """Keeps records in the process (the default when nothing else is configured).

    A superstep ended by the marker is kept as its closed :class:`Step`; the record is built
    when :attr:`records` is read (building and validating a record costs more than the rest of
    a marker pair). The records are identical to ones built at the end marker.
    """

    def __init__(self, unkept: str | None = None) -> None:
        self._items: list[SuperstepRecord | Step] = []
        if unkept:  # no sink was configured at all: say so at the first record, on rank 0
            self.unkept = unkept
            self.record = self.closed = self._first  # type: ignore[method-assign]

    def _first(self, rec: SuperstepRecord | Step) -> None:
        """The first record of a sink nobody configured: one line on stderr (from processor
        0, so once per run), then plain appends. A multiprocessing worker ends with
        os._exit, so an end-of-run message would never be written. (A compiled lane that took
        this method before the first record calls it again: it appends then.)"""
        vars(self).pop("record", None)  # back to the class's plain append
        vars(self).pop("closed", None)
        self._items.append(rec)
        unkept, self.unkept = self.unkept, ""
        if unkept and getattr(rec, "rank", 0) in (0, None):
            print(f"counterd: supersteps are kept in this process's memory only and are lost "
                  f"at exit ({unkept}); run the program under `counterd record --out FILE "
                  "-- CMD`, or start the daemon, to keep them", file=sys.stderr, flush=True)

    @property
    def records(self) -> list[SuperstepRecord]:
        items = self._items
        n = len(items)  # appended concurrently beyond n: left for the next read
        for i in range(n):
            item = items[i]
            if not isinstance(item, SuperstepRecord):
                items[i] = item.record()  # assignment of one element is atomic under the GIL
        return items[:n]  # type: ignore[return-value]

    def begin(self, line: Mapping[str, Any]) -> None:  # begins need no durability in memory
        pass

    def record(self, rec: SuperstepRecord | Step) -> None:
        self._items.append(rec)  # list.append is atomic under the GIL

    closed = record


class SpoolSink:
    """Writes this process's markers to its spool file in ``<spool>/`` (:mod:`counterd.spool`).

    The default is ``<pid>.frames``, a shared file mapping of the marker socket's frames: an
    OPEN at begin, a CLOSE at end, copied into the mapping, no system call per marker, and a
    process killed at any point leaves every frame before its last marker. Where no mapping
    can be had (or the disk fills as it grows), the rest goes to ``<pid>.jsonl``: one JSON line
    per begin and per record, each one ``write(2)`` on an O_APPEND descriptor. A write that
    fails there (a full disk) never raises into the program: the line waits in a backlog of
    at most :data:`BACKLOG_LINES` lines, written before the next line once the disk takes it
    again; lines pushed out of a full backlog are counted in ``lost`` and reported once on
    stderr. A begin in one form and its end in the other are collected as one record.
    """

    BACKLOG_LINES = 65536

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._fd: int | None = None
        self._pid = -1
        self._backlog: collections.deque[bytes] = collections.deque()
        self.lost = 0
        self._mapped: spool.MappedWriter | None = None
        self._mapped_pid = -1
        self._contexts: dict[tuple[Any, ...], int] = {}  # (ctx, counter names) -> CONTEXT id
        # Guards creating the writer and numbering contexts (threads of one process share
        # them); a forked child (one thread) makes its own.
        self._lock = threading.RLock()
        self._lock_pid = identity.pid

    # -- the mapped form ---------------------------------------------------------------------
    def _guard(self) -> threading.RLock:
        if self._lock_pid != identity.pid:
            self._lock, self._lock_pid = threading.RLock(), identity.pid
        return self._lock

    def _writer(self) -> spool.MappedWriter | None:
        """This process's mapped writer, created on first use (and anew in a forked child);
        None once mapping has failed in this process."""
        pid = identity.pid
        with self._guard():
            if self._mapped_pid == pid:
                return self._mapped
            self._mapped, self._contexts = None, {}
            try:
                self._mapped = spool.MappedWriter(spool.path_for(self.directory, pid,
                                                                 spool.FRAMES))
            except OSError as exc:
                self._mapping_failed(exc)
            self._mapped_pid = pid  # last: other threads wait for the writer above
            return self._mapped

    def _mapping_failed(self, exc: OSError) -> None:
        if self._mapped is not None:
            self._mapped.close()  # what it committed stays in the file
        self._mapped = None
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):  # a full disk is said by _failed
            print(f"counterd: cannot map the marker spool in {self.directory} "
                  f"({exc.strerror}); writing it line by line instead", file=sys.stderr)

    def _append(self, ftype: Any, frame: bytes | None = None,
                payload: Mapping[str, Any] | None = None) -> bool:
        """Append a frame (``frame`` bytes, or ``payload`` encoded as a JSON frame of
        ``ftype``) to the mapped file; False where the mapping is not (or no longer) there."""
        w = self._mapped if self._mapped_pid == identity.pid else self._writer()
        if w is None:
            return False
        data = frame if frame is not None else protocol.encode(ftype, payload or {})
        if len(data) - 4 > protocol.MAX_FRAME_BYTES:  # a reader stops at it: a line instead
            return False
        try:
            w.append(data)
        except OSError as exc:  # the disk is full: the file keeps what it committed
            self._mapping_failed(exc)
            return False
        return True

    def _context_id(self, ctx: identity.Ctx, names: tuple[str, ...]) -> int | None:
        """The CONTEXT id of ``ctx`` and counter ``names`` in this process's file, declared
        there first if new; None where it cannot be."""
        if self._mapped_pid != identity.pid:  # a forked child: its own file, its own contexts
            self._writer()
        key = (ctx, names)
        c = self._contexts.get(key)
        if c is not None:
            return c
        if self._writer() is None:
            return None
        with self._guard():  # two threads must not give two contexts one number
            c = self._contexts.get(key)
            if c is None:
                if len(self._contexts) >= 0xFFFF:
                    return None
                c = len(self._contexts) + 1
                if not self._append(protocol.FrameType.CONTEXT,
                                    payload=context_payload(self._next_seq(), c, ctx, names)):
                    return None
                self._contexts[key] = c
            return c

    def open(self, ctx: identity.Ctx, index: int, name: str, rank: int, cpu: int,
             begin_ns: int, params: dict[str, Any]) -> int:
        """A superstep begins: an OPEN frame (a BEGIN where one does not fit, a begin line
        where there is no mapping). Returns 1 if its end may be a CLOSE, else 0."""
        c = self._context_id(ctx, ())
        if c is not None:
            try:
                frame = protocol.encode_open(self._next_seq(), c, index, begin_ns, rank, cpu, name,
                                             params)
            except (struct.error, ValueError):  # beyond the packed fields, or not JSON
                frame = None
            if frame is not None and self._append(protocol.FrameType.OPEN, frame):
                return 1
        self.begin(begin_line(ctx, index, name, rank, cpu, begin_ns, params))
        return 0

    def _next_seq(self) -> int:
        """The next frame number of this process's mapped file (its writer numbers the frames
        the markers' hot path writes too); 0 where there is none."""
        w = self._mapped if self._mapped_pid == identity.pid else self._writer()
        return w.next_seq() if w is not None else 0  # 0: no mapping, a line (no number)

    def close(self) -> None:
        """Close this process's files (the spool keeps what they hold)."""
        if self._mapped is not None and self._mapped_pid == identity.pid:
            self._mapped.close()
            self._mapped, self._mapped_pid = None, -1
        if self._fd is not None and self._pid == identity.pid:
            os.close(self._fd)
            self._fd, self._pid = None, -1

    # -- the JSON-lines form -----------------------------------------------------------------
    def _descriptor(self) -> int:
        pid = identity.pid
        if self._fd is None or self._pid != pid:  # first use, or we are a forked child
            path = spool.path_for(self.directory, pid)
            try:
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                                   0o644)
            except OSError as exc:
                raise BadInput(f"cannot write the marker spool {path}: {exc.strerror}",
                               f"make {self.directory} writable or unset {ENV_SPOOL}") from exc
            self._pid = pid
        return self._fd

    def _write(self, line: bytes) -> None:
        fd = self._descriptor()
        if not self._backlog:
            try:
                os.write(fd, line)
                return
            except OSError as exc:
                self._failed(exc)
        self._backlog.append(line)
        try:  # oldest first, so the file keeps the program's order
            while self._backlog:
                os.write(fd, self._backlog[0])
                self._backlog.popleft()
        except OSError:
            if len(self._backlog) > self.BACKLOG_LINES:
                self._backlog.popleft()
                self.lost += 1

    def _failed(self, exc: OSError) -> None:
        if not self._backlog and self.lost == 0:
            print(f"counterd: cannot write the marker spool {self.directory}: {exc.strerror}; "
                  f"keeping up to {self.BACKLOG_LINES} lines in memory until it can",
                  file=sys.stderr)
            atexit.register(self._report_loss)

    def _report_loss(self) -> None:
        if self.lost or self._backlog:
            print(f"counterd: {self.lost + len(self._backlog)} marker spool lines were not "
                  f"written to {self.directory} (disk full?): those supersteps have no record",
                  file=sys.stderr)

    # -- sink interface ----------------------------------------------------------------------
    def begin(self, line: Mapping[str, Any]) -> None:
        if not self._append(protocol.FrameType.BEGIN, payload={"s": self._next_seq(),
                                                               "line": dict(line)}):
            self._write(spool.encode_line(spool.BEGIN, line))

    def record(self, rec: SuperstepRecord | Step) -> None:
        r = _as_record(rec)
        if not self._append(protocol.FrameType.RECORD, payload={"s": self._next_seq(),
                                                                "rec": r.to_json()}):
            self._write(spool.encode_line(spool.RECORD, r.to_json()))

    def closed(self, step: Step) -> None:
        """A superstep ended: a CLOSE if its OPEN went to this process's mapped file, else
        a RECORD (or a record line)."""
        if step.sent and self._mapped_pid == identity.pid and self._mapped is not None:
            frame = close_frame(step, self._context_id, self._next_seq)
            if frame is not None and self._append(protocol.FrameType.CLOSE, frame):
                return
        self.record(step)
