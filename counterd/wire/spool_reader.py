"""Reading a spool back (the format: :mod:`counterd.wire.spool`): a file of either form read as the
same events, torn or damaged parts skipped and reported (:class:`Skipped`), and a spool
directory collected into records (:func:`collect`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.data.errors import BadInput
from counterd.data.records import MAX_VALUE_CHARS, SuperstepRecord, incomplete_record
from counterd.wire.spool import (
    BEGIN,
    FRAMES,
    HEAD,
    HEAD_BYTES,
    MAGIC,
    MAX_FRAMES_BYTES,
    RECORD,
    files,
)

if TYPE_CHECKING:
    from counterd.wire import binary_frames, protocol


# -- reading a spool back -----------------------------------------------------------------------
# The spool is written by the program being recorded, and whatever it left there is read by the
# recorder after it: a file that is not a regular file (a FIFO, a device, a socket, a
# directory), a symbolic link (to /dev/zero, to another user's file), a sparse file of many
# gigabytes, a head claiming 4 GiB of frames, or a file truncated while it is read must cost
# the recorder neither its time nor its memory. So a spool file is opened without following a
# link and without blocking, and read only if it is a regular file (of the expected owner);
# it is read in chunks of READ_CHUNK bytes fed to the decoder (never the whole file in
# memory, never a mapping: a file truncated under a mapping faults), up to a cap on the bytes
# one file may hold; and what is skipped is reported, one line per file (Skipped).

READ_CHUNK = 1 << 20  # bytes read at once
# What one spool file may hold by default: the mapped form's own bound (its writer goes on in
# JSON lines beyond it), larger than any real run's file (a superstep costs ~100 bytes of
# frames or ~600 of JSON lines per process: 4 GiB is 7-40 million supersteps of one process).
MAX_FILE_BYTES = MAX_FRAMES_BYTES
ENV_MAX_FILE_BYTES = "COUNTERD_SPOOL_MAX_BYTES"  # the knob: a byte count like 4G, 512M


def max_file_bytes() -> int:
    """What one spool file may hold: ``$COUNTERD_SPOOL_MAX_BYTES`` (a byte count, ``K``,
    ``M`` or ``G`` binary suffixes), else :data:`MAX_FILE_BYTES`. BadInput for a bad value."""
    text = os.environ.get(ENV_MAX_FILE_BYTES)
    if not text:
        return MAX_FILE_BYTES
    from counterd.machine.geometry import parse_size

    try:
        n = parse_size(text)
    except BadInput:
        n = 0
    if n < HEAD_BYTES:
        raise BadInput(f"{ENV_MAX_FILE_BYTES}={text!r} is not a size of at least "
                       f"{HEAD_BYTES} bytes",
                       f"set it to a byte count like 4G or 512M, or unset it "
                       f"(default {MAX_FILE_BYTES >> 30}G)")
    return n


@dataclass(frozen=True)
class Skipped:
    """A spool file, or part of one, that was not read, and why."""

    path: str
    why: str
    part: bool = False  # read in part (its records before the cut are kept)

    def line(self) -> str:
        return (f"spool file {os.path.basename(self.path)} "
                f"{'read in part' if self.part else 'skipped'}: {self.why}")


Report = Callable[[Skipped], None]

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"),
          (stat.S_ISLNK, "a symbolic link"))


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} bytes"


def open_regular(path: Path, owner: int | None = None) -> tuple[int, os.stat_result] | str:
    """``path`` opened for reading if it is a regular file (owned by uid ``owner``, when
    given): (the descriptor, its fstat), else why not. Never follows a link
    (``O_NOFOLLOW``), never blocks on a FIFO or a device (``O_NONBLOCK``, and the type is
    checked with lstat before the open and fstat after it, so a device is not opened unless
    it replaced the file in between), never becomes a controlling terminal."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link (spool files are not followed)"
    if not stat.S_ISREG(st.st_mode):
        return f"{_kind(st.st_mode)}, not a regular file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a symbolic link (spool files are not followed)"
        return f"cannot be read ({exc.strerror})"
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        return f"cannot be read ({exc.strerror})"
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = f"{_kind(st.st_mode)}, not a regular file"
    elif owner is not None and st.st_uid != owner:
        why = f"owned by uid {st.st_uid}, not by the recording user (uid {owner})"
    if why is not None:
        os.close(fd)
        return why
    return fd, st


def _decoded(dec: protocol.Decoder) -> Iterator[protocol.Frame]:
    """The frames ``dec`` holds whole, typed; a frame that does not decode is dropped."""
    from counterd.wire.framing import ProtocolError

    frames = dec.typed_frames()
    while not dec.broken:
        try:
            frame = next(frames)
        except StopIteration:
            return
        except ProtocolError:
            frames = dec.typed_frames()  # a bad frame is dropped; go on with the next
            continue
        yield frame


Note = Callable[[str], None]  # hears what of one file was not read, in a few words


def _frames(fd: int, st: os.stat_result, cap: int, note: Note) -> Iterator[protocol.Frame]:
    """The committed frames of a mapped spool file, typed, read in chunks up to the file's
    size when opened (a process still writing does not keep the reader going): a frame that
    does not decode is skipped, and the rest of a file whose framing broke is dropped
    (noted)."""
    head = os.pread(fd, HEAD_BYTES, 0)
    if len(head) < HEAD.size:
        return
    magic, committed = HEAD.unpack_from(head)
    if magic != MAGIC:
        note("not a spool file of frames (no CDSPOOL1 head): nothing read")
        return
    if committed > MAX_FRAMES_BYTES:
        note(f"its head claims {committed} bytes of frames, more than a spool file holds "
             f"({_size(MAX_FRAMES_BYTES)}): nothing read")
        return
    have = max(st.st_size - HEAD_BYTES, 0)
    end = HEAD_BYTES + min(committed, max(cap - HEAD_BYTES, 0), have)
    from counterd.wire import protocol  # the typed frames: for readers, not for the markers

    dec = protocol.Decoder(max_frame=protocol.MAX_FRAME_BYTES,
                           versions=protocol.ACCEPTED_VERSIONS)
    at = HEAD_BYTES
    while at < end:
        chunk = os.pread(fd, min(READ_CHUNK, end - at), at)
        if not chunk:  # shorter than its head says (truncated, before or while read)
            note(f"it ends at byte {at}, its head says {HEAD_BYTES + committed}: the frames "
                 f"beyond are lost")
            return
        at += len(chunk)
        dec.feed(chunk)
        yield from _decoded(dec)
        if dec.broken:
            note(f"its frames break at byte {at - dec.pending} (of "
                 f"{_size(HEAD_BYTES + committed)} its head claims): the rest is not read")
            return
    if committed > have and have <= cap - HEAD_BYTES:
        note(f"it ends at byte {st.st_size}, its head says {HEAD_BYTES + committed}: the "
             f"frames beyond are lost")
    elif committed > cap - HEAD_BYTES:
        note(_cut(cap, HEAD_BYTES + committed))


def _cut(cap: int, size: int) -> str:
    return (f"only its first {_size(cap)} of {_size(size)} were read, what one spool file may "
            f"hold ({ENV_MAX_FILE_BYTES} sets it)")


def _frame_events(fd: int, st: os.stat_result, cap: int, note: Note
                  ) -> Iterator[dict[str, Any]]:
    """A mapped spool file's events as :func:`read_lines` gives them: begin lines and
    record objects."""
    from counterd.wire import binary_frames, protocol

    contexts: dict[int, protocol.Context] = {}
    # By run and index, as the daemon holds them: a CLOSE names the context of its counters,
    # which need not be its OPEN's.
    opened: dict[tuple[str, int], binary_frames.Open] = {}
    for f in _frames(fd, st, cap, note):
        if isinstance(f, protocol.Context):
            contexts[f.c] = f
        elif isinstance(f, binary_frames.Open):
            ctx = contexts.get(f.c)
            if ctx is not None:
                opened[(ctx.run_id, f.index)] = f
                yield {"ev": BEGIN, **protocol.begin_line(ctx, f)}
        elif isinstance(f, binary_frames.Close):
            ctx = contexts.get(f.c)
            op = opened.pop((ctx.run_id, f.index), None) if ctx is not None else None
            if ctx is None or op is None:
                continue
            try:
                rec = protocol.record_of(ctx, op, f)
            except ValueError:
                continue
            yield {"ev": RECORD, **rec.to_json()}
        elif isinstance(f, protocol.Begin):
            yield {"ev": BEGIN, **f.line}
        elif isinstance(f, protocol.Record):
            yield {"ev": RECORD, **f.rec.to_json()}


def read_events(path: Path, report: Report | None = None, owner: int | None = None,
                cap: int | None = None) -> Iterator[dict[str, Any]]:
    """The events of a spool file of either form, in write order (:func:`read_lines`). A file
    that is not a regular file (of uid ``owner``, when given) yields nothing; one that holds
    more than ``cap`` bytes (:func:`max_file_bytes` when None) is read up to it; what was not
    read (that, a framing that broke, lines that are not events) is told to ``report`` in one
    :class:`Skipped` once the file is read."""
    return _events(path, Path(path).suffix == FRAMES, report, owner, cap)


MAX_LINE_BYTES = 1 << 20  # a spool line is one record; the marker API caps a record's fields


def read_lines(path: Path, report: Report | None = None, owner: int | None = None,
               cap: int | None = None) -> Iterator[dict[str, Any]]:
    """The events of one spool file of JSON lines, in write order: JSON objects with a string
    ``ev`` and, if any, an integer ``index``. A line that is not one (a torn last line after a
    full disk, damage, a line longer than :data:`MAX_LINE_BYTES`) is skipped: the program that
    wrote the spool is the one being recorded, and its damage must not cost the records that
    are whole. Lines are strict JSON (:mod:`counterd.util.strictjson`), read in chunks of
    :data:`READ_CHUNK` bytes with ``pread`` (a file truncated meanwhile ends where it ends),
    up to ``cap`` bytes. What was skipped is told to ``report`` (:func:`read_events`)."""
    return _events(path, False, report, owner, cap)


def _events(path: Path, frames: bool, report: Report | None, owner: int | None,
            cap: int | None) -> Iterator[dict[str, Any]]:
    got = open_regular(path, owner)
    if isinstance(got, str):
        if report is not None:
            report(Skipped(str(path), got))
        return
    fd, st = got
    notes: list[str] = []
    cap = max_file_bytes() if cap is None else cap
    try:
        if frames:
            yield from _frame_events(fd, st, cap, notes.append)
        else:
            yield from _line_events(fd, st, cap, notes.append)
    finally:
        os.close(fd)
    if notes and report is not None:
        report(Skipped(str(path), "; ".join(notes), part=True))


def _next_data(fd: int, at: int) -> int | None:
    """The first offset from ``at`` that is not in a hole of the file (SEEK_DATA), ``at``
    where holes are not known, None where only a hole follows. A hole reads as zero bytes,
    none of them a newline: inside a line being skipped it is skipped without reading it."""
    try:
        return os.lseek(fd, at, os.SEEK_DATA)
    except OSError as exc:
        return None if exc.errno == errno.ENXIO else at


def _lines(fd: int, st: os.stat_result, cap: int, note: Note) -> Iterator[bytes]:
    """The lines of a file (the last one without its newline, if so written) within its
    first ``cap`` bytes and its size when opened (a process still writing does not keep the
    reader going), each shorter than :data:`MAX_LINE_BYTES`: a longer one is skipped to its
    end, over holes without reading them (noted)."""
    at = 0  # the file offset read up to
    pending = b""  # the start of a line whose end is not read yet
    skipping = False  # inside a line too long to keep
    long_lines = 0
    limit = min(cap, st.st_size)
    while at < limit:
        chunk = os.pread(fd, min(READ_CHUNK, limit - at), at)
        if not chunk:
            break
        at += len(chunk)
        if skipping:
            nl = chunk.find(b"\n")
            if nl < 0:
                nxt = _next_data(fd, at)
                if nxt is None:  # a hole to the end: no newline, the line goes on to EOF
                    break
                at = nxt
                continue
            skipping = False
            chunk = chunk[nl + 1:]
        parts = (pending + chunk if pending else chunk).split(b"\n")
        pending = parts.pop()
        for line in parts:
            if len(line) < MAX_LINE_BYTES:
                yield line
            else:
                long_lines += 1
        if len(pending) > MAX_LINE_BYTES:
            pending, skipping = b"", True
            long_lines += 1
    if long_lines:
        note(f"{long_lines} line{'s' if long_lines > 1 else ''} of {_size(MAX_LINE_BYTES)} or "
             f"more (damage, or a hole of zero bytes) skipped")
    if at >= cap and st.st_size > cap:
        # The line across the cap is not whole: dropped with what follows.
        note(_cut(cap, st.st_size))
        return
    if pending and not skipping:
        yield pending  # a last line without its newline (a torn one does not decode)


def _line_events(fd: int, st: os.stat_result, cap: int, note: Note
                 ) -> Iterator[dict[str, Any]]:
    from counterd.util.strictjson import Malformed, loads

    bad = 0
    for line in _lines(fd, st, cap, note):
        try:
            d = loads(line)
        except Malformed:
            bad += 1
            continue
        if isinstance(d, dict) and isinstance(d.get("ev"), str) and (
                "index" not in d or (isinstance(d["index"], int)
                                     and not isinstance(d["index"], bool))):
            yield d
        else:
            bad += 1
    if bad:
        note(f"{bad} line{'s' if bad > 1 else ''} that {'are' if bad > 1 else 'is'} not a "
             f"spool event skipped")


def collect(directory: Path, report: Report | None = None, owner: int | None = None,
            cap: int | None = None) -> Iterator[SuperstepRecord]:
    """Records from every spool file in ``directory``; a begin without a record becomes an
    ``incomplete`` record (the process died inside the superstep). A torn last line (killed
    mid-write is impossible for one write(2) below PIPE_BUF, but a full disk is not) or a
    record that is not valid (:meth:`SuperstepRecord.from_json`) is skipped and reported as
    an incomplete record if its begin survived. A process whose mapped file could not grow
    went on in JSON lines: a begin in one file and its record in the other are one superstep
    (keyed by run, pid and index).

    Files that are not regular files (of uid ``owner``, when given) are skipped, and one
    holding more than ``cap`` bytes is read up to it (:func:`read_events`), each told to
    ``report`` once; a begin whose file was read in part becomes an incomplete record that
    says so (``unsupported["*"]``): its end may lie in what was not read."""
    begins: dict[tuple[str, Any, Any], tuple[dict[str, Any], str]] = {}
    ended: set[tuple[str, Any, Any]] = set()
    cut: dict[str, str] = {}

    def told(s: Skipped) -> None:
        if s.part:
            cut[s.path] = s.why
        if report is not None:
            report(s)

    cap = max_file_bytes() if cap is None else cap
    for path in files(directory):
        for d in read_events(path, told, owner, cap):
            key = (str(d.get("run_id")), d.get("pid"), d.get("index", -1))
            if d["ev"] == BEGIN:
                begins[key] = (d, str(path))
            elif d["ev"] == RECORD:
                try:
                    record = SuperstepRecord.from_json(d)
                except BadInput:
                    continue
                ended.add(key)
                yield record
    for key, (d, where) in begins.items():
        if key not in ended:
            try:
                rec = incomplete_record(d)
            except (KeyError, TypeError, ValueError):  # a damaged begin line: no record
                continue
            if where in cut:
                why = f"its end may lie in what was not read of spool file " \
                      f"{os.path.basename(where)}: {cut[where]}"
                rec = replace(rec, unsupported={**rec.unsupported, "*": why[:MAX_VALUE_CHARS]})
            yield rec
