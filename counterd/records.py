"""Typed records: what one processor did in one superstep.

A :class:`SuperstepRecord` is written once per processor per superstep (DESIGN.md section 3).
JSON lines are the exchange format (``counterd record --out FILE.jsonl``); ``to_json`` /
``from_json`` are exact inverses and reject records of an unknown format version.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterd.errors import BadInput
from counterd.events import CounterValue, Source

# Format history:
#   1 - first version (run_id, index, name, rank, pid, cpu, begin/end ns, counters with source,
#       ratio and raw, params, flags, unsupported, backend, host).
RECORD_FORMAT = 1

# Flags a record can carry. Every irregularity is a flag on a record, never a dropped record.
FLAGS = {
    "incomplete": "the superstep began but never ended (process died or exited inside it)",
    "unmatched_end": "an end marker without a matching begin",
    "nested": "began while another superstep of the same processor was open",
    "exception": "the superstep's body raised an exception",
    "multiplexed": "at least one counter ran less than the whole superstep (values scaled)",
    "migrated": "the processor ran on a different CPU at the end than at the begin",
    "unsupported_counters": "some requested counters could not be counted (see unsupported)",
    "whole_command": "the command had no markers; it is recorded as one superstep",
    "counters_from_separate_run": "time from a timed run, counters from a separate counted run",
    "counters_missing": "the counted run produced no counters for this superstep",
}

_KNOWN_FLAGS = frozenset(FLAGS)

# Flags that describe provenance rather than a problem with the superstep.
INFO_FLAGS = frozenset({"unsupported_counters", "whole_command", "counters_from_separate_run"})

Param = int | float | str | bool


@dataclass(frozen=True)
class SuperstepRecord:
    run_id: str
    index: int
    name: str
    rank: int
    pid: int
    cpu: int
    begin_ns: int  # CLOCK_MONOTONIC
    end_ns: int | None  # None when the superstep never ended (flag "incomplete")
    counters: Mapping[str, CounterValue] = field(default_factory=dict)
    params: Mapping[str, Param] = field(default_factory=dict)
    flags: frozenset[str] = frozenset()
    unsupported: Mapping[str, str] = field(default_factory=dict)
    backend: str = "none"
    host: str = ""

    def __post_init__(self) -> None:
        if not self.run_id:
            raise ValueError("run_id is empty")
        if self.index < 0:
            raise ValueError(f"superstep index {self.index} < 0")
        if self.end_ns is not None and self.end_ns < self.begin_ns:
            raise ValueError(f"end_ns {self.end_ns} before begin_ns {self.begin_ns}")
        if not self.flags <= _KNOWN_FLAGS:
            raise ValueError(f"unknown flags {sorted(set(self.flags) - _KNOWN_FLAGS)}")
        if self.end_ns is None and "incomplete" not in self.flags:
            raise ValueError("a record without end_ns must carry the flag 'incomplete'")
        for name, cv in self.counters.items():
            if not math.isfinite(cv.value):
                raise ValueError(f"counter {name} is not finite: {cv.value}")
            if not 0.0 <= cv.ratio <= 1.0:
                raise ValueError(f"counter {name}: multiplexing ratio {cv.ratio} outside [0, 1]")

    @property
    def duration_ns(self) -> int | None:
        return None if self.end_ns is None else self.end_ns - self.begin_ns

    @property
    def multiplex_ratio(self) -> float:
        """Smallest time_running/time_enabled over the measured counters (1.0 if none)."""
        ratios = [cv.ratio for cv in self.counters.values() if cv.source is Source.MEASURED]
        return min(ratios, default=1.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "run_id": self.run_id,
            "index": self.index,
            "name": self.name,
            "rank": self.rank,
            "pid": self.pid,
            "cpu": self.cpu,
            "begin_ns": self.begin_ns,
            "end_ns": self.end_ns,
            "duration_ns": self.duration_ns,
            "counters": {
                k: {"value": v.value, "source": v.source.value, "ratio": v.ratio, "raw": v.raw}
                for k, v in sorted(self.counters.items())
            },
            "multiplex_ratio": self.multiplex_ratio,
            "params": dict(self.params),
            "flags": sorted(self.flags),
            "unsupported": dict(self.unsupported),
            "backend": self.backend,
            "host": self.host,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SuperstepRecord:
        fmt = d.get("format")
        if fmt != RECORD_FORMAT:
            raise BadInput(f"record format {fmt!r} is not {RECORD_FORMAT}",
                           "re-record with this version of counterd")
        try:
            counters = {
                k: CounterValue(float(v["value"]), Source(v["source"]), float(v.get("ratio", 1.0)),
                                v.get("raw"))
                for k, v in d.get("counters", {}).items()
            }
            return cls(
                run_id=str(d["run_id"]), index=int(d["index"]), name=str(d["name"]),
                rank=int(d["rank"]), pid=int(d["pid"]), cpu=int(d["cpu"]),
                begin_ns=int(d["begin_ns"]),
                end_ns=None if d.get("end_ns") is None else int(d["end_ns"]),
                counters=counters, params=dict(d.get("params", {})),
                flags=frozenset(d.get("flags", ())), unsupported=dict(d.get("unsupported", {})),
                backend=str(d.get("backend", "none")), host=str(d.get("host", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"malformed superstep record ({exc})",
                           "the file is not counterd record output or is damaged") from exc


def span_ns(begin_ns: Any, end_ns: Any) -> Any:
    """Superstep time (DESIGN.md section 3): max over processors of end minus min over
    processors of begin. Sequences give an int; 2-D arrays (repetitions x processors) give one
    time per repetition (the reduction runs over the last axis)."""
    import numpy as np

    span = np.max(end_ns, axis=-1) - np.min(begin_ns, axis=-1)
    return int(span) if np.ndim(span) == 0 else span


@dataclass(frozen=True)
class Superstep:
    """One superstep of one run over all its processors: the aggregate of its records.

    ``time_ns`` is the superstep time (:func:`span_ns`), None unless every processor ended it.
    Each processor also stops its own clock before the closing barrier, so per-processor work
    (its own end minus begin; the longest where a rank has several threads) and barrier wait
    (the superstep time minus that work) are both here.
    """

    run_id: str
    index: int
    name: str
    records: tuple[SuperstepRecord, ...]

    @classmethod
    def group(cls, records: Iterable[SuperstepRecord]) -> list[Superstep]:
        """The supersteps of ``records``, by (run, index, name), in that order."""
        groups: dict[tuple[str, int, str], list[SuperstepRecord]] = {}
        for r in records:
            groups.setdefault((r.run_id, r.index, r.name), []).append(r)
        return [cls(k[0], k[1], k[2], tuple(v)) for k, v in sorted(groups.items())]

    @property
    def complete(self) -> bool:
        return bool(self.records) and all(r.end_ns is not None for r in self.records)

    @property
    def begin_ns(self) -> int:
        return min(r.begin_ns for r in self.records)

    @property
    def end_ns(self) -> int | None:
        return max(r.end_ns for r in self.records if r.end_ns is not None) \
            if self.complete else None

    @property
    def time_ns(self) -> int | None:
        end = self.end_ns
        return None if end is None else end - self.begin_ns

    @property
    def work_ns(self) -> dict[int, int]:
        """Per rank: the time its processor worked (the longest of its records)."""
        work: dict[int, int] = {}
        for r in self.records:
            d = r.duration_ns
            if d is not None:
                work[r.rank] = max(work.get(r.rank, 0), d)
        return work

    @property
    def wait_ns(self) -> dict[int, int]:
        """Per rank: superstep time minus its work (the time it waited at the barrier)."""
        t = self.time_ns
        return {} if t is None else {rank: t - w for rank, w in self.work_ns.items()}


def incomplete_record(begin: Mapping[str, Any]) -> SuperstepRecord:
    """The ``incomplete`` record of a superstep that began and never ended.

    ``begin`` is a begin line (the marker spool's ``begin`` event, a daemon BEGIN frame's line,
    or an OPEN frame's fields in that shape): run_id, index, name, rank, pid, cpu, begin_ns,
    and optionally params, backend and host. The one place that turns a begin into a record;
    raises KeyError, TypeError or ValueError for a malformed line.
    """
    return SuperstepRecord(
        run_id=str(begin["run_id"]), index=int(begin["index"]), name=str(begin["name"]),
        rank=int(begin["rank"]), pid=int(begin["pid"]), cpu=int(begin["cpu"]),
        begin_ns=int(begin["begin_ns"]), end_ns=None, params=dict(begin.get("params") or {}),
        flags=frozenset({"incomplete"}), backend=str(begin.get("backend", "none")),
        host=str(begin.get("host", "")))


def write_jsonl(records: Iterable[SuperstepRecord], path: Path) -> int:
    """Write records as JSON lines atomically (temp file + rename). Returns the count.

    On any error the temp file is removed, so no partial file pretends to be complete.
    """
    from counterd.fsutil import atomic_write_text

    lines = [json.dumps(r.to_json(), sort_keys=True) for r in records]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def read_jsonl(path: Path) -> Iterator[SuperstepRecord]:
    try:
        fh = path.open(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}", "check the path") from exc
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BadInput(f"{path}:{lineno}: not JSON ({exc.msg})",
                               "pass a file written by counterd record") from exc
            yield SuperstepRecord.from_json(d)
