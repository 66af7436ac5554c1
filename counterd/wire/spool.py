"""The marker spool: one file per process in the spool directory.

Programs started by ``counterd record`` (and counted runs under Callgrind) write their markers
here (:class:`counterd.markers.sinks.SpoolSink`), in one of two forms:

* ``<pid>.frames`` (the default): the marker socket's frames (docs/protocol.md: a
  CONTEXT once, then per superstep a binary OPEN before its work and a binary CLOSE after it;
  a JSON BEGIN or RECORD where those do not fit) appended to a shared file mapping
  (:class:`MappedWriter`). No system call per marker: the frame is copied into the mapping
  and a commit counter in the file's head is advanced after it, so a process killed at any
  point leaves every committed frame in the page cache, and the kernel writes it back. The
  file grows by :data:`CHUNK` bytes at a time, each chunk's blocks allocated first
  (``posix_fallocate``), so a full disk is an error at growth, never a SIGBUS at a store.
* ``<pid>.jsonl`` (where a mapping cannot be had): a ``begin`` line before a superstep's work,
  a ``record`` line (a :class:`~counterd.data.records.SuperstepRecord` in its JSON form) after it,
  each one ``write(2)`` on an O_APPEND descriptor, so a killed process leaves whole lines.

The mapped form serves the daemon's socket too, as the marker client's *black box*
(:meth:`MappedWriter.memory`, :func:`read_box`): the same frames in an anonymous memory file
the daemon holds a descriptor of, emptied each time a batch has been sent, its head also
giving the stream offset of its first frame byte, so that the daemon can read what a client
that died had written but not sent.

This module is the format's one home: its constants and encoding, the writers, and the black
box's read (:func:`read_box`). Reading a file of either form back as the same events (torn or
damaged parts skipped) and collecting a spool directory into records:
:mod:`counterd.wire.spool_reader`.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd import _native

if TYPE_CHECKING:
    import socket

BEGIN = "begin"
RECORD = "record"

_encode = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps builds one per call


def encode_line(event: str, fields: Mapping[str, Any]) -> bytes:
    """One spool line: ``{"ev": event, **fields}`` and a newline."""
    return (_encode({"ev": event, **fields}) + "\n").encode()


def path_for(directory: Path, pid: int, suffix: str = ".jsonl") -> Path:
    return Path(directory) / f"{pid}{suffix}"


FRAMES = ".frames"


def files(directory: Path) -> list[Path]:
    """The spool files of a directory (both forms), in a stable order."""
    d = Path(directory)
    return sorted([*d.glob("*.jsonl"), *d.glob("*" + FRAMES)])


# -- the mapped form ----------------------------------------------------------------------------

MAGIC = b"CDSPOOL1"
# The same form in a memory file, as the marker client's black box (counterd.markers.sinks.socket):
# the frames written but not yet sent to the daemon, which reads them if the client dies.
BOX_MAGIC = b"CDSBOX01"
HEAD = struct.Struct("<8sQ")  # magic, bytes of frames committed after the head
_COMMITTED = struct.Struct("<Q")
# At offset 16, in a black box: the stream offset (bytes sent on the connection before) of
# the first frame byte; at 24, the connection it serves (BUFFER's "box"). 0 in a spool file.
_BASE = struct.Struct("<Q")
_BOX = struct.Struct("<Q")
HEAD_BYTES = 64  # frames start here
CHUNK = 1 << 20  # the file grows by this much, its blocks allocated before they are mapped
MAX_FRAMES_BYTES = 1 << 32  # a reader's bound on the committed bytes it trusts


class MappedWriter:
    """Appends frames to a spool file through a shared mapping (see the module docstring).
    OSError from the constructor or :meth:`append` (no mapping, a full disk) leaves the
    committed frames intact; the caller falls back to the JSON-lines form. Where the markers'
    hot path is built, its ``MappedFile`` (:attr:`native`) does the work, and the markers
    write their OPEN and CLOSE frames through it without a call into Python.

    :meth:`memory` makes one in an anonymous memory file instead (the client's black box):
    :attr:`fd` is that file, to be passed to the daemon. Its frames leave in batches
    (:meth:`batching`, :meth:`due`): :meth:`drain` sends what waits to the socket and empties
    the file once all is taken (:meth:`reset`), the first frame byte's stream offset in its
    head. :attr:`seq` numbers the frames of a connection (the lanes' and the sink's alike),
    :attr:`gen` names that connection, and :attr:`paused` keeps the lanes out."""

    fd: int | None = None  # the memory file of a black box (a spool file's is not kept)

    def __init__(self, path: Path) -> None:
        # A new file, never another's: a pid the kernel gave again in the same run writes
        # next to the first process's file (<pid>-1.frames, ...), never over it.
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        for k in range(1, 1000):
            try:
                fd = os.open(path, flags, 0o644)
                break
            except FileExistsError:
                path = path.with_name(f"{path.name.split('.')[0].split('-')[0]}-{k}{FRAMES}")
        else:
            raise FileExistsError(errno.EEXIST, "no free spool file name", str(path))
        self.path = path
        try:
            self._map_fd(fd, MAGIC)
        finally:
            os.close(fd)

    @classmethod
    def memory(cls, name: str) -> MappedWriter:
        """A black box: the mapped form in a new anonymous memory file (``memfd_create``), its
        first byte the stream's byte 0 until :meth:`reset`. OSError where there is none."""
        self = cls.__new__(cls)
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        self.path = Path(f"/memfd:{name}")
        try:
            self._map_fd(fd, BOX_MAGIC)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def _map_fd(self, fd: int, magic: bytes) -> None:
        self._seq = 0
        self._taken = 0  # the black box's state, where the compiled engine does not keep it
        self._base = 0
        self._batch = (0, 0)
        self._batch_at = 0
        hot = _native.hotpath()
        if hot is not None:
            # The compiled engine (counterd/_native/hotpath_src/): the same file, written the
            # same way, and the markers' lanes write their frames into it directly.
            self.native = hot.MappedFile(fd, CHUNK, HEAD_BYTES, MAX_FRAMES_BYTES, magic)
            self.append = self.native.append  # type: ignore[method-assign]
            self.next_seq = self.native.next_seq  # type: ignore[method-assign]
            self.reset = self.native.reset  # type: ignore[method-assign]
            self.drain = self.native.drain  # type: ignore[method-assign]
            self.due = self.native.due  # type: ignore[method-assign]
            self.batching = self.native.batching  # type: ignore[method-assign]
            return
        self.native = None
        self._pid = os.getpid()  # a forked child never writes into its parent's file
        os.posix_fallocate(fd, 0, CHUNK)
        self._map = mmap.mmap(fd, CHUNK, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._fd = os.dup(fd)  # for growing the file (the mapping keeps its own)
        HEAD.pack_into(self._map, 0, magic, 0)
        self._end = HEAD_BYTES
        self._lock = threading.Lock()  # threads of one process share its file

    def next_seq(self) -> int:
        """The next frame number of this file (its frames are numbered 1, 2, ...)."""
        with self._lock:
            self._seq += 1
            return self._seq

    @property
    def committed(self) -> int:
        """Bytes of frames committed."""
        if self.native is not None:
            return int(self.native.committed)
        return self._end - HEAD_BYTES

    @property
    def waiting(self) -> int:
        """Bytes of frames committed and not taken by :meth:`drain`."""
        if self.native is not None:
            return int(self.native.waiting)
        return self._end - HEAD_BYTES - self._taken

    @property
    def seq(self) -> int:
        """The last frame number given."""
        return int(self.native.seq) if self.native is not None else self._seq

    @seq.setter
    def seq(self, value: int) -> None:
        if self.native is not None:
            self.native.seq = value
        else:
            self._seq = value

    # Only the compiled engine's lanes read these (no lane writes where it is not built).
    @property
    def gen(self) -> int:
        return int(self.native.gen) if self.native is not None else 0

    @gen.setter
    def gen(self, value: int) -> None:
        if self.native is not None:
            self.native.gen = value

    @property
    def paused(self) -> bool:
        return bool(self.native.paused) if self.native is not None else True

    @paused.setter
    def paused(self, value: bool) -> None:
        if self.native is not None:
            self.native.paused = value

    def batching(self, nbytes: int, ns: int) -> None:
        """A batch is due once ``nbytes`` bytes wait, or the first of them waited ``ns``."""
        self._batch = (nbytes, ns)

    def due(self) -> bool:
        """Whether the frames waiting make a batch to send now."""
        nbytes, ns = self._batch
        waiting = self.waiting
        return bool(nbytes and waiting) and (
            waiting >= nbytes or time.monotonic_ns() - self._batch_at >= ns)

    def drain(self, sock: socket.socket) -> int:
        """Send what waits to ``sock`` as far as it takes it now; once all is taken the file
        starts again empty. Returns the bytes still waiting. (The sink's lock keeps other
        writers out meanwhile.)"""
        import socket

        self._own()
        with self._lock:
            while self._taken < self._end - HEAD_BYTES:
                try:
                    n = sock.send(self._map[HEAD_BYTES + self._taken:self._end],
                                  socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL)
                except BlockingIOError:
                    break
                self._taken += n
            left = self._end - HEAD_BYTES - self._taken
        if not left and self._taken:
            self.reset(self._base + self._taken)
        return left

    def _own(self) -> None:
        if os.getpid() != self._pid:
            raise OSError(errno.EBADF, "a parent's mapping: the child has its own file")

    def append(self, frame: bytes) -> None:
        self._own()
        with self._lock:
            if self._batch[0] and self._end - HEAD_BYTES == self._taken:
                self._batch_at = time.monotonic_ns()
            start = self._end
            end = start + len(frame)
            if end - HEAD_BYTES > MAX_FRAMES_BYTES:  # what a reader trusts: go on in lines
                raise OSError(errno.EFBIG, "the mapped spool file is full")
            if end > len(self._map):
                self._grow(end)
            self._map[start:end] = frame
            # The commit: a reader (and a crash) sees the frame only after its bytes.
            _COMMITTED.pack_into(self._map, 8, end - HEAD_BYTES)
            self._end = end

    def serve(self, box: int) -> None:
        """Name the connection the file serves now (head offset 24; before :meth:`reset`)."""
        os.pwrite(self.fd if self.fd is not None else -1, _BOX.pack(box), 24)

    def reset(self, base: int) -> None:
        """Empty again, the first frame byte now the stream's byte ``base``: the commit
        counter goes to 0 before the base moves, so a reader finds the old frames under the
        old base, or none."""
        self._own()
        with self._lock:
            self._end = HEAD_BYTES
            self._taken, self._base = 0, base
            _COMMITTED.pack_into(self._map, 8, 0)
            _BASE.pack_into(self._map, 16, base)

    def _grow(self, need: int) -> None:
        size = -(-need // CHUNK) * CHUNK
        os.posix_fallocate(self._fd, 0, size)
        self._map.resize(size)

    def close(self) -> None:
        if self.native is not None:
            self.native.close()
        else:
            with self._lock:
                if not self._map.closed:
                    self._map.close()
                    os.close(self._fd)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def read_box(fd: int, received: int, limit: int, box: int) -> bytes:
    """What a black box (:meth:`MappedWriter.memory`) holds beyond the first ``received``
    bytes of connection ``box``'s stream: the frames its writer committed but had not sent.
    ``b""`` for a file that is not a black box, serves another connection now, or whose head
    does not cover byte ``received``. At most ``limit`` bytes are read, with ``pread`` (a
    mapping could fault if the writer truncates the file)."""
    head = os.pread(fd, HEAD_BYTES, 0)
    if len(head) < 32:
        return b""
    magic, committed = HEAD.unpack_from(head)
    (base,) = _BASE.unpack_from(head, 16)
    (serves,) = _BOX.unpack_from(head, 24)
    if magic != BOX_MAGIC or serves != box or not base <= received <= base + committed:
        return b""
    want = min(base + committed - received, limit)
    return os.pread(fd, want, HEAD_BYTES + received - base) if want > 0 else b""
