"""Records a program could not hand to the daemon: one private spool file per process, and
``counterd import`` that sends them on later.

A :class:`~counterd.markers.client.SocketSink` holds at most ``high_water`` unacknowledged
records in memory; beyond that, and at exit for whatever the daemon has not acknowledged, it
appends them here, in the marker spool format (:mod:`counterd.spool`, ``record`` lines), so
that nothing is lost when the daemon is down or stuck. The directory is private (0700, owned
by the user; a directory that is not is never used, since another user could read or plant
records there) and each file is 0600.

:func:`import_files` reads such files back, sends them to the daemon (or writes them into a
store) and removes a file only once every record in it was acknowledged. Importing twice is
harmless: the store keeps one record per ``(run_id, host, pid, index)``.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from counterd import spool
from counterd.env import ENV_SPILL
from counterd.errors import BadInput
from counterd.records import SuperstepRecord

if TYPE_CHECKING:
    from counterd.markers.recorder import Step

log = logging.getLogger("counterd.markers")


def default_dir() -> Path:
    """``$COUNTERD_SPILL``, else ``$XDG_RUNTIME_DIR/counterd-spill`` (a per-user tmpfs under
    systemd), else ``<temp dir>/counterd-spill-<uid>``."""
    env = os.environ.get(ENV_SPILL)
    if env:
        return Path(env)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "counterd-spill"
    return Path(tempfile.gettempdir()) / f"counterd-spill-{os.getuid()}"


def _private_dir(directory: Path) -> Path:
    """``directory``, created 0700 if missing; OSError if it is not ours alone."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{directory} is not a directory private to uid {os.getuid()}")
    return directory


class SpillFile:
    """The spill file of one process, created at the first record spilled.

    ``write`` returns False when the file cannot be written (the caller keeps the records in
    memory then: a full disk never loses a record that memory can still hold).
    """

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory
        self.path: Path | None = None
        self.records = 0  # written so far
        self._fd: int | None = None
        self._failed: str | None = None  # why the file cannot be written (logged once)

    def _open(self) -> int:
        if self._fd is not None:
            return self._fd
        wanted = self.directory or default_dir()
        try:
            directory = _private_dir(wanted)
        except OSError as exc:  # planted by someone else, or not creatable: a fresh private one
            log.info("spill directory %s unusable (%s); using a new one", wanted, exc)
            directory = Path(tempfile.mkdtemp(prefix="counterd-spill-"))
        path = directory / f"{os.getpid()}-{time.time_ns()}.jsonl"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                           | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self.path = path
        return self._fd

    def write(self, items: Sequence[SuperstepRecord | Step]) -> bool:
        """Append ``items`` (one ``write(2)`` per record: a kill leaves whole lines)."""
        from counterd.markers.sinks import _as_record

        try:
            fd = self._open()
            for item in items:
                os.write(fd, spool.encode_line(spool.RECORD, _as_record(item).to_json()))
                self.records += 1
        except (OSError, ValueError) as exc:
            if self._failed is None:
                log.warning("cannot write the counterd spill file in %s (%s): records stay "
                            "in memory", self.directory or default_dir(), exc)
            self._failed = str(exc)
            return False
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# -- counterd import -------------------------------------------------------------------------
@dataclass
class ImportResult:
    """What ``counterd import`` did: per file, the records sent and whether it was removed."""

    records: int = 0
    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # path -> why it was kept

    def to_json(self) -> dict[str, object]:
        return {"records": self.records, "removed": self.removed, "kept": self.kept}


def spill_files(paths: Sequence[Path]) -> list[Path]:
    """The files named, and the ``*.jsonl`` files of the directories named (the default
    spill directory when none is)."""
    if not paths:
        d = default_dir()
        return spool.files(d) if d.is_dir() else []
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(spool.files(p))
        elif p.is_file():
            out.append(p)
        else:
            raise BadInput(f"{p}: no such file or directory",
                           "name spill files or directories (counterd import --help)")
    return out


def read_spill(path: Path) -> Iterator[SuperstepRecord | str]:
    """The records of a spill file in write order; a line that is not a record yields why,
    and so does what of the file was not read (:func:`counterd.spool.read_events`: not a
    regular file, a link, beyond the cap on one spool file, damage), after its records."""
    skipped: list[spool.Skipped] = []
    for d in spool.read_events(path, skipped.append):
        if d.get("ev") != spool.RECORD:
            yield f"a {d.get('ev')!r} line is not a spilled record"
            continue
        try:
            yield SuperstepRecord.from_json(d)
        except BadInput as exc:
            yield str(exc)
    for s in skipped:
        yield _UNREAD[0 if s.part else 1] + s.why


_UNREAD = ("read in part: ", "not read: ")  # read_spill's words for what it did not read


def import_files(paths: Sequence[Path], *, socket: Path | None = None,
                 store: Path | None = None, timeout_s: float = 30.0,
                 batch: int = 4096) -> ImportResult:
    """Send the records of spill files to the daemon at ``socket`` (or write them into
    ``store``), ``batch`` at a time; remove each file once all its records are acknowledged
    (committed). A file with a line that is not a record, or with records the daemon refused
    or did not acknowledge, is kept. Raises BadInput when the daemon cannot be reached."""
    from counterd.markers.client import SocketSink

    result = ImportResult()
    files = spill_files(paths)
    sink: SocketSink | None = None
    if store is None and files:
        if socket is None:
            from counterd.env import default_socket_path

            socket = default_socket_path()
        sink = SocketSink(socket, job="import", timeout_s=min(timeout_s, 5.0))
        if sink.degraded is not None:
            raise BadInput(f"cannot reach counterd at {socket}: {sink.degraded}",
                           "start it (counterd run), pass --socket, or import into --store")
    try:
        for path in files:
            why = _import_one(path, sink, store, timeout_s, batch, result)
            if why is None:
                path.unlink()
                result.removed.append(str(path))
            else:
                result.kept[str(path)] = why
    finally:
        if sink is not None:
            sink.close(timeout_s, spill=False)
    return result


def _import_one(path: Path, sink: object, store: Path | None, timeout_s: float, batch: int,
                result: ImportResult) -> str | None:
    """Import one file; None when every record is stored, else why the file is kept."""
    from counterd.markers.client import SocketSink

    bad: list[str] = []
    pending: list[SuperstepRecord] = []

    def send() -> str | None:
        if store is not None:
            from counterd.daemon.store import store_records

            result.records += store_records(store, pending, job="import", uid=os.getuid())
        else:
            assert isinstance(sink, SocketSink)
            refused = sink.refused_count
            for rec in pending:
                sink.record(rec)
            if not sink.flush(timeout_s):
                if sink.refused_count > refused:
                    return f"the daemon refused {sink.refused_count - refused} records " \
                           f"({sink.refused[-1][1]})"
                return f"{len(sink.unacked)} records not acknowledged within {timeout_s:g} s"
            result.records += len(pending)
        pending.clear()
        return None

    for item in read_spill(path):
        if isinstance(item, str):
            bad.append(item)
            continue
        pending.append(item)
        if len(pending) >= batch and (why := send()) is not None:
            return why
    if pending and (why := send()) is not None:
        return why
    unread = [b for b in bad if b.startswith(_UNREAD)]
    lines = [b for b in bad if not b.startswith(_UNREAD)]
    if lines:
        unread.append(f"{len(lines)} lines are not records ({lines[0]})")
    return "; ".join(unread) or None
