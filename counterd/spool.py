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

from counterd.errors import BadInput
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


MAX_LINE_BYTES = 1 << 20  # a spool line is one record; the marker API caps a record's fields


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The events of one spool file, in write order: JSON objects with a string ``ev`` and,
    if any, an integer ``index``. A line that is not one (a torn last line after a full disk,
    damage, a line longer than :data:`MAX_LINE_BYTES`) is skipped: the program that wrote the
    spool is the one being recorded, and its damage must not cost the records that are whole.
    Lines are strict JSON (:mod:`counterd.strictjson`) and read one at a time."""
    from counterd.strictjson import Malformed, loads

    with Path(path).open("rb") as fh:
        while line := fh.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES:
                while line and not line.endswith(b"\n"):  # skip the rest of the long line
                    line = fh.readline(MAX_LINE_BYTES)
                continue
            try:
                d = loads(line)
            except Malformed:
                continue
            if isinstance(d, dict) and isinstance(d.get("ev"), str) and (
                    "index" not in d or (isinstance(d["index"], int)
                                         and not isinstance(d["index"], bool))):
                yield d


def collect(directory: Path) -> Iterator[SuperstepRecord]:
    """Records from every ``<pid>.jsonl`` in ``directory``; a begin without a record becomes an
    ``incomplete`` record (the process died inside the superstep). A torn last line (killed
    mid-write is impossible for one write(2) below PIPE_BUF, but a full disk is not) or a
    record line that is not a valid record (:meth:`SuperstepRecord.from_json`) is skipped and
    reported as an incomplete record if its begin survived."""
    for path in files(directory):
        begins: dict[tuple[str, int], dict[str, Any]] = {}
        ended: set[tuple[str, int]] = set()
        for d in read_lines(path):
            key = (str(d.get("run_id")), d.get("index", -1))
            if d["ev"] == BEGIN:
                begins[key] = d
            elif d["ev"] == RECORD:
                try:
                    record = SuperstepRecord.from_json(d)
                except BadInput:
                    continue
                ended.add(key)
                yield record
        for key, d in begins.items():
            if key not in ended:
                try:
                    yield incomplete_record(d)
                except (KeyError, TypeError, ValueError):  # a damaged begin line: no record
                    continue
