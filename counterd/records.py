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

from counterd.backends.base import CounterValue
from counterd.errors import BadInput
from counterd.events import Source

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
