"""Records written to the process's file in the spool directory ``counterd record`` reads."""

from __future__ import annotations

import atexit
import collections
import errno
import os
import struct
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.data.env import ENV_SPOOL
from counterd.data.errors import BadInput
from counterd.data.records import SuperstepRecord
from counterd.markers import identity
from counterd.markers.sinks.base import as_record, begin_line, close_frame, context_payload
from counterd.wire import framing as protocol  # the framing, not the typed frames: cheap to import
from counterd.wire import spool

if TYPE_CHECKING:
    from counterd.markers.sinks.base import Sink
    from counterd.markers.step import Step


class SpoolSink:
    """Writes this process's markers to its spool file in ``<spool>/`` (:mod:`counterd.wire.spool`).

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
        self._scratch = False  # made by scratch_sink(): discard() removes its directory

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

    def close(self, timeout_s: float | None = None) -> None:
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

    # -- the sink interface (counterd.markers.sinks.base.Sink) ----------------------------
    takes_scratch = True  # a scratch_sink() of it keeps nothing
    durable = True
    daemon = False
    degraded: str | None = None

    def begin(self, line: Mapping[str, Any], count: Sequence[str] | None = None) -> None:
        if not self._append(protocol.FrameType.BEGIN, payload={"s": self._next_seq(),
                                                               "line": dict(line)}):
            self._write(spool.encode_line(spool.BEGIN, line))

    def record(self, rec: SuperstepRecord | Step) -> None:
        r = as_record(rec)
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

    def flush(self, timeout_s: float | None = None) -> bool:
        """True unless lines wait in the backlog (the mapped file's frames are in the file)."""
        return not self._backlog

    def release(self, timeout_s: float | None = None) -> None:
        pass  # its files stay open: a lane may still write; the spool keeps what they hold

    def prepare(self, ctx: identity.Ctx) -> None:
        self._context_id(ctx, ())  # its file mapped and the context declared

    def lane_args(self, ctx: identity.Ctx, names: tuple[str, ...]) -> dict[str, Any] | None:
        writer = self._writer()
        if writer is None or writer.native is None:
            return None  # JSON lines: a write(2) per marker, in Python
        c_open = self._context_id(ctx, ())
        c_close = self._context_id(ctx, names)
        if c_open is None or c_close is None:
            return None
        return dict(on_closed=None, writer=writer.native, sink_open=self.open,
                    sink_closed=self.closed, c_open=c_open, c_close=c_close)

    def lane_made(self, lane: Any) -> None:
        pass

    def kept(self) -> list[SuperstepRecord]:
        return []  # in the spool file

    def where(self) -> tuple[Path | None, Path | str]:
        return self.directory, "off"

    def in_child(self, fresh: Sink) -> Sink:
        return fresh  # its own file in the same spool

    def scratch_sink(self, wait_s: float) -> SpoolSink:
        """A spool sink in a fresh temporary directory, which :meth:`discard` removes."""
        from counterd import launch  # its spool directories: tempfile and shutil load more

        sink = SpoolSink(Path(launch.make_spool_dir("counterd-calibration-")))
        sink._scratch = True
        return sink

    def discard(self, wait_s: float) -> None:
        """Close a :meth:`scratch_sink` sink and remove its directory."""
        self.close()
        if self._scratch:
            from counterd import launch

            launch.remove_spool_dir(str(self.directory))
