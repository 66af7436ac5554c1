"""The marker spool: one JSON-lines file per process, ``<spool>/<pid>.jsonl``.

Programs started by ``counterd record`` (and counted runs under Callgrind) write their markers
here (:class:`counterd.markers.sinks.SpoolSink`): a ``begin`` line before a superstep's work, a
``record`` line (a :class:`~counterd.records.SuperstepRecord` in its JSON form) after it. Each
line is one ``write(2)`` on an O_APPEND descriptor, so a process killed at any point leaves
whole lines only. This module is the format's one home: encoding a line, reading a file back
(torn or damaged lines skipped), and collecting a spool directory into records.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from counterd.records import SuperstepRecord, incomplete_record

BEGIN = "begin"
RECORD = "record"

_encode = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps builds one per call


def encode_line(event: str, fields: Mapping[str, Any]) -> bytes:
    """One spool line: ``{"ev": event, **fields}`` and a newline."""
    return (_encode({"ev": event, **fields}) + "\n").encode()


def path_for(directory: Path, pid: int) -> Path:
    return Path(directory) / f"{pid}.jsonl"


def files(directory: Path) -> list[Path]:
    """The spool files of a directory, in a stable order."""
    return sorted(Path(directory).glob("*.jsonl"))


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The events of one spool file, in write order. A line that is not a JSON object (a torn
    last line after a full disk, say) is skipped."""
    with Path(path).open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                d = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # damaged, or nested beyond depth
                continue
            if isinstance(d, dict):
                yield d


def collect(directory: Path) -> Iterator[SuperstepRecord]:
    """Records from every ``<pid>.jsonl`` in ``directory``; a begin without a record becomes an
    ``incomplete`` record (the process died inside the superstep). A torn last line (killed
    mid-write is impossible for one write(2) below PIPE_BUF, but a full disk is not) is
    skipped and reported as an incomplete record if its begin survived."""
    for path in files(directory):
        begins: dict[tuple[str, int], dict[str, Any]] = {}
        ended: set[tuple[str, int]] = set()
        for d in read_lines(path):
            key = (str(d.get("run_id")), int(d.get("index", -1)))
            if d.get("ev") == BEGIN:
                begins[key] = d
            elif d.get("ev") == RECORD:
                ended.add(key)
                yield SuperstepRecord.from_json(d)
        for key, d in begins.items():
            if key not in ended:
                yield incomplete_record(d)
