"""``counterd import``: the records of spill files sent on to the daemon, or into a store.

A program's :class:`~counterd.markers.sinks.socket.SocketSink` appends what the daemon did not
acknowledge to a private spill file (:mod:`counterd.markers.sinks.spill`). :func:`import_files`
reads such files back, sends them to the daemon (or writes them into a store) and removes a file
only once every record in it was acknowledged. Importing twice is harmless: the store keeps one
record per ``(run_id, host, pid, index)``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from counterd.data.errors import BadInput
from counterd.data.records import SuperstepRecord
from counterd.markers.sinks.socket import SocketSink
from counterd.markers.sinks.spill import default_dir
from counterd.wire import spool, spool_reader


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
    and so does what of the file was not read (:func:`counterd.wire.spool_reader.read_events`: not a
    regular file, a link, beyond the cap on one spool file, damage), after its records."""
    skipped: list[spool_reader.Skipped] = []
    for d in spool_reader.read_events(path, skipped.append):
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
    result = ImportResult()
    files = spill_files(paths)
    sink: SocketSink | None = None
    if store is None and files:
        if socket is None:
            from counterd.data.env import default_socket_path

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
