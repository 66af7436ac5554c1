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
from typing import TYPE_CHECKING, Any

from counterd.data.errors import BadInput
from counterd.data.events import CounterValue, Source

if TYPE_CHECKING:
    from counterd.data.clocks import ClockDomain

# Format history:
#   1 - first version (run_id, index, name, rank, pid, cpu, begin/end ns, counters with source,
#       ratio and raw, params, flags, unsupported, backend, host). Optional keys added since,
#       absent when unset so that older readers and records are unchanged: marker_ns;
#       exception ("ValueError: bad input", with the flag exception; issue 34).
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
    "cpu_features_hidden": "the timed run hid the CPU features valgrind lacks (AVX-512) from "
                           "run-time code dispatch, so that it ran the code Callgrind counted",
    "counted_other_code": "timed as the program runs natively, counted under valgrind, whose "
                          "CPU lacks features this one has (AVX-512): where the program "
                          "dispatches on them (numpy, BLAS, glibc) the counts are of other code "
                          "(--cpu-features as-counted times the counted code)",
    "counters_missing": "the counted run produced no counters for this superstep",
    "target_changed": "the process the daemon counted for the client exec'd, changed owner or "
    "was replaced (reused pid): its counts were dropped (see unsupported)",
    "sampled": "its counters were not read (1-in-k sampling of supersteps shorter than a "
               "threshold): they are the last measured superstep's of the same name, scaled by "
               "time (source 'sampled')",
    "dropped_params": "a param (or the name) could not be recorded as given: not finite, not "
                      "text, or beyond its limits; unsupported says which and why",
}

_KNOWN_FLAGS = frozenset(FLAGS)

# Flags that describe provenance rather than a reason to doubt the superstep's numbers: not
# counted as flagged by counterd record, shown by counterd report's text and HTML only with
# --verbose (always in its JSON and CSV). A processor that migrated between CPUs took its
# counters with it (they follow the thread), so "migrated" is one of them (issue 34).
INFO_FLAGS = frozenset({"unsupported_counters", "whole_command", "counters_from_separate_run",
                        "cpu_features_hidden", "counted_other_code", "sampled", "migrated"})

Param = int | float | str | bool

# Two processors of one superstep that began it on one CPU and whose times overlapped by at
# least this share of the shorter one's time shared that CPU (:func:`shared_cpus`).
SHARED_OVERLAP = 0.25

# Bounds of a record's fields: what SQLite and the wire's packed integers hold, and sizes no
# honest program reaches (a name or param is a label, not a payload).
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
MAX_ID_CHARS = 256  # run_id, host, backend
MAX_NAME_CHARS = 1024  # a superstep's name, a param's name
MAX_VALUE_CHARS = 4096  # a string param, an unsupported counter's reason
MAX_PARAMS = 256  # params (and unsupported counters) of one record
MAX_EXCEPTION_CHARS = 200  # a superstep's exception: its type and message, one line


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
    # The cost of one begin + end marker pair in the process that recorded this, in ns,
    # calibrated when its first superstep began (None: not measured, e.g. an older recorder).
    marker_ns: int | None = None
    # What the superstep's body raised, "<type>: <message>" on one line, at most
    # MAX_EXCEPTION_CHARS (flag "exception"; None: not kept, e.g. an older recorder).
    exception: str | None = None

    def __post_init__(self) -> None:
        # Ranges as the store and the wire hold them (SQLite and struct: 64-bit signed
        # integers; rank and cpu 32-bit), so a record that exists can be stored and sent.
        if not self.run_id or len(self.run_id) > MAX_ID_CHARS:
            raise ValueError(f"run_id must have 1 to {MAX_ID_CHARS} characters")
        if not 0 <= self.index <= INT64_MAX:
            raise ValueError(f"superstep index {self.index} outside [0, 2^63)")
        if not 0 <= self.begin_ns <= INT64_MAX:
            raise ValueError(f"begin_ns {self.begin_ns} outside [0, 2^63)")
        if self.end_ns is not None and not self.begin_ns <= self.end_ns <= INT64_MAX:
            raise ValueError(f"end_ns {self.end_ns} before begin_ns {self.begin_ns} "
                             "or beyond 2^63")
        if not (INT32_MIN <= self.rank <= INT32_MAX and 0 <= self.pid <= INT32_MAX
                and INT32_MIN <= self.cpu <= INT32_MAX):
            raise ValueError(f"rank {self.rank}, pid {self.pid} or cpu {self.cpu} outside "
                             "32 bits")
        if len(self.name) > MAX_NAME_CHARS or len(self.host) > MAX_ID_CHARS \
                or len(self.backend) > MAX_ID_CHARS:
            raise ValueError(f"name, host or backend longer than {MAX_NAME_CHARS}, "
                             f"{MAX_ID_CHARS}, {MAX_ID_CHARS} characters")
        if not self.flags <= _KNOWN_FLAGS:
            raise ValueError(f"unknown flags {sorted(set(self.flags) - _KNOWN_FLAGS)}")
        if self.end_ns is None and "incomplete" not in self.flags:
            raise ValueError("a record without end_ns must carry the flag 'incomplete'")
        if self.marker_ns is not None and not 0 <= self.marker_ns <= INT64_MAX:
            raise ValueError(f"marker_ns {self.marker_ns} outside [0, 2^63)")
        if self.exception is not None and (
                "exception" not in self.flags or len(self.exception) > MAX_EXCEPTION_CHARS
                or not self.exception.isprintable()):
            raise ValueError(f"exception text needs the flag 'exception' and at most "
                             f"{MAX_EXCEPTION_CHARS} printable characters on one line")
        for name, cv in self.counters.items():
            if not 0.0 <= cv.value < math.inf:  # False for NaN too
                raise ValueError(f"counter {name} is not a finite count >= 0: {cv.value}")
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
        out = {
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
        if self.marker_ns is not None:  # absent when not measured: records of before unchanged
            out["marker_ns"] = self.marker_ns
        if self.exception is not None:  # likewise
            out["exception"] = self.exception
        return out

    @classmethod
    def from_json(cls, d: Any) -> SuperstepRecord:
        """The record of a JSON object as :meth:`to_json` writes it, every field checked for
        its type and range (a boundary: files, RECORD frames, the store). BadInput says which
        field is wrong."""
        if not isinstance(d, Mapping):
            raise BadInput(f"a superstep record is a JSON object, not {type(d).__name__}",
                           _NOT_RECORDS)
        if d.get("format") != RECORD_FORMAT:
            raise not_a_record(d)
        try:
            end = d.get("end_ns")
            return cls(
                run_id=_str(d, "run_id"), index=_int(d, "index"), name=_str(d, "name"),
                rank=_int(d, "rank"), pid=_int(d, "pid"), cpu=_int(d, "cpu"),
                begin_ns=_int(d, "begin_ns"), end_ns=None if end is None else _int(d, "end_ns"),
                counters=_counters(d.get("counters", {})), params=params(d.get("params", {})),
                flags=frozenset(_strs(d.get("flags", []), "flags")),
                unsupported=_str_map(d.get("unsupported", {}), "unsupported"),
                backend=_str(d, "backend", "none"), host=_str(d, "host", ""),
                marker_ns=None if d.get("marker_ns") is None else _int(d, "marker_ns"),
                exception=None if d.get("exception") is None else _str(d, "exception"),
            )
        except (KeyError, TypeError, ValueError, OverflowError) as exc:  # 10**400: float()
            raise BadInput(f"malformed superstep record ({exc})", _NOT_RECORDS) from None


_NOT_RECORDS = "the file is not counterd record output or is damaged"


def exception_text(exc: BaseException | type[BaseException]) -> str:
    """``SuperstepRecord.exception`` for ``exc`` (an exception, or its type where a context
    manager's ``__exit__`` was given none): its type (qualified outside builtins) and its
    message, never its traceback; one line of printable characters (a newline, a tab or a
    terminal escape written as ``\\n``, ``\\t``, ``\\x1b``), cut to
    :data:`MAX_EXCEPTION_CHARS` with ``...``. A message that cannot be made (its ``__str__``
    raised) is said so."""
    kind = exc if isinstance(exc, type) else type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"
    try:
        message = "" if isinstance(exc, type) else str(exc)
    except Exception:  # noqa: BLE001 - the program's own __str__: anything can fail
        message = "<its message could not be made>"
    text = f"{name}: {message}" if message else name
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= MAX_EXCEPTION_CHARS else \
        text[:MAX_EXCEPTION_CHARS - 3] + "..."

_RECORD_FIX = "give the records `counterd record --out FILE` writes"

# The other files of this project a user may pass where records are read: "format" -> what it
# is, what to do with it.
_OTHER_FILES = {
    "counterd-microbench": ("a microbench results file (microbench run --out), not superstep "
                            "records", "summarise it with `microbench show FILE`"),
    "counterd-machine-profile": ("a machine profile (predict calibrate --out), not superstep "
                                 "records", "give it as --profile; " + _RECORD_FIX),
    "counterd-memlogp": ("microbench memlogp measurements, not superstep records",
                         "give them to `predict memlogp`; " + _RECORD_FIX),
    "microbench-transfer": ("a microbench transfer results file, not superstep records",
                            "summarise it with `microbench show FILE`; " + _RECORD_FIX),
    "counterd-perf-plan": ("counterd's saved perf plan, not superstep records", _RECORD_FIX),
    "counterd-machine": ("a machine file (give it as --machine), not superstep records",
                         _RECORD_FIX),
}


def not_a_record(d: Mapping[str, Any]) -> BadInput:
    """What a JSON object read where a superstep record was expected is, and what to do, as one
    BadInput: another file of this project (by its ``format``), ``counterd report --json``'s
    output, records of a newer or unknown format, or a file of another tool."""
    fmt = d.get("format")
    if isinstance(fmt, str) and fmt in _OTHER_FILES:
        what, fix = _OTHER_FILES[fmt]
        return BadInput(f"this is {what}", fix)
    if fmt == 2 and "supersteps" in d and "runs" in d:
        return BadInput("this is a report (counterd report --json), not superstep records",
                        _RECORD_FIX)
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > RECORD_FORMAT:
        return BadInput(f"record format {fmt} is newer than this counterd reads "
                        f"({RECORD_FORMAT})", "upgrade counterd to read it, or re-record with "
                        "this version")
    if "format" not in d:
        keys = ", ".join(sorted(str(k) for k in d)[:5]) or "none"
        return BadInput(f"not counterd records: a JSON object without \"format\": "
                        f"{RECORD_FORMAT} (keys: {keys}), written by another tool", _RECORD_FIX)
    return BadInput(f"not a counterd superstep record (format {fmt!r:.40}; counterd's records "
                    f"are format {RECORD_FORMAT})", _RECORD_FIX)


# -- field checks of from_json (and of the daemon's frames): types as to_json writes them -------
def _int(d: Mapping[str, Any], key: str) -> int:
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{key} is {type(v).__name__}, not an integer")
    return v


def _str(d: Mapping[str, Any], key: str, default: str | None = None) -> str:
    v = d[key] if default is None else d.get(key, default)
    if not isinstance(v, str):
        raise TypeError(f"{key} is {type(v).__name__}, not a string")
    return v


def _strs(v: Any, what: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise TypeError(f"{what} is not a list of strings")
    return v


def _str_map(v: Any, what: str) -> dict[str, str]:
    if not isinstance(v, Mapping) or len(v) > MAX_PARAMS \
            or not all(isinstance(x, str) and len(x) <= MAX_VALUE_CHARS for x in v.values()):
        raise TypeError(f"{what} is not an object of at most {MAX_PARAMS} strings of at most "
                        f"{MAX_VALUE_CHARS} characters")
    return dict(v)


def _counters(v: Any) -> dict[str, CounterValue]:
    if not isinstance(v, Mapping):
        raise TypeError(f"counters is {type(v).__name__}, not an object")
    out = {}
    for name, c in v.items():
        if not isinstance(c, Mapping):
            raise TypeError(f"counter {name} is not an object")
        value, ratio, raw = c["value"], c.get("ratio", 1.0), c.get("raw")
        if not _is_number(value) or not _is_number(ratio):
            raise TypeError(f"counter {name}: value and ratio must be numbers")
        if raw is not None and (not isinstance(raw, int) or isinstance(raw, bool)
                                or not 0 <= raw <= UINT64_MAX):
            raise ValueError(f"counter {name}: raw count {raw!r} is not an integer in "
                             "[0, 2^64)")
        out[name] = CounterValue(float(value), Source(c["source"]), float(ratio), raw)
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def params(v: Any) -> dict[str, Param]:
    """``v`` as a superstep's params: an object of at most :data:`MAX_PARAMS` entries, each a
    bool, an integer within 64 bits, a finite number or a string of at most
    :data:`MAX_VALUE_CHARS` characters; ValueError or TypeError says what is not."""
    if not isinstance(v, Mapping) or len(v) > MAX_PARAMS:
        raise TypeError(f"params are not an object of at most {MAX_PARAMS} entries")
    for k, x in v.items():
        if not isinstance(k, str) or len(k) > MAX_NAME_CHARS:
            raise TypeError(f"param name {k!r:.40} is not a string of at most "
                            f"{MAX_NAME_CHARS} characters")
        if isinstance(x, bool):
            continue
        if isinstance(x, int):
            if not INT64_MIN <= x <= INT64_MAX:
                raise ValueError(f"param {k}: {x} is beyond 64 bits")
        elif isinstance(x, float):
            if not math.isfinite(x):
                raise ValueError(f"param {k}: {x} is not finite")
        elif not isinstance(x, str) or len(x) > MAX_VALUE_CHARS:
            raise TypeError(f"param {k} is not a bool, number or string of at most "
                            f"{MAX_VALUE_CHARS} characters")
    return dict(v)


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

    @property
    def slowest_work_ns(self) -> int | None:
        """The slowest processor's own time (its end minus its begin): the superstep's work,
        which is what a cost function such as F predicts; None unless every processor ended
        it. ``time_ns`` (the span) is this plus the start skew and the wait of whichever
        processor ended last."""
        if not self.complete:
            return None
        work = self.work_ns
        return max(work.values()) if work else None

    @property
    def skew_ns(self) -> int:
        """Start skew: the last processor's begin minus the first one's (0 for one
        processor). A span much longer than the slowest work is mostly skew or waiting,
        neither of which is the superstep's own cost."""
        begins = [r.begin_ns for r in self.records]
        return max(begins) - min(begins)

    @property
    def shared_cpus(self) -> frozenset[int]:
        """The CPUs two or more of its processors shared (:func:`shared_cpus`): each
        processor's first begin to last end, on the CPU all its records began on; none unless
        every processor ended it."""
        if not self.complete:
            return frozenset()
        ranks: dict[int, list[SuperstepRecord]] = {}
        for r in self.records:
            ranks.setdefault(r.rank, []).append(r)
        spans = []
        for rs in ranks.values():
            cpus = {r.cpu for r in rs}
            spans.append((cpus.pop() if len(cpus) == 1 else None, min(r.begin_ns for r in rs),
                          max(r.end_ns or 0 for r in rs)))
        return shared_cpus(spans)


def shared_cpus(spans: Iterable[tuple[int | None, int, int | None]]) -> frozenset[int]:
    """The CPUs that two or more of one superstep's processors shared: ``spans`` holds one
    (cpu, begin_ns, end_ns) per processor (rank), cpu the one it began on (None where its
    threads began on several, -1 where the recorder could not tell) and end None where it
    never ended; a processor whose time is empty (end = begin) shares nothing. Two processors
    that began on one CPU and whose times overlapped by :data:`SHARED_OVERLAP` of the shorter
    one's or more took turns on it, at least until the scheduler moved one (its record is then
    flagged ``migrated``): each one's time holds some of the other's work.

    Why this matters: a scheduler may put the processes of a program on one CPU while another
    is idle (forked workers start on their parent's CPU; wake-ups pull a process to its
    waker's) and move them apart only later. On a 2-CPU KVM guest the first supersteps of
    unpinned 2-process programs took 1.2 to 3.3 times as long in the runs where they shared a CPU
    (docs/results/2026-11-27-intel-xeon-kvm.md)."""
    by_cpu: dict[int, list[tuple[int, int]]] = {}
    for cpu, begin, end in spans:
        if cpu is not None and cpu >= 0 and end is not None and end > begin:  # -1: unknown
            by_cpu.setdefault(cpu, []).append((begin, end))
    return frozenset(cpu for cpu, times in by_cpu.items() if _overlap(sorted(times)))


def _overlap(times: list[tuple[int, int]]) -> bool:
    """Whether two of ``times`` (sorted by begin) overlap by :data:`SHARED_OVERLAP` of the
    shorter one's or more."""
    for k, (b1, e1) in enumerate(times):
        for b2, e2 in times[k + 1:]:
            if b2 >= e1:
                break  # this one, and every later one, begins after the first has ended
            if min(e1, e2) - b2 >= SHARED_OVERLAP * min(e1 - b1, e2 - b2):
                return True
    return False


def incomplete_record(begin: Mapping[str, Any]) -> SuperstepRecord:
    """The ``incomplete`` record of a superstep that began and never ended.

    ``begin`` is a begin line (the marker spool's ``begin`` event, a daemon BEGIN frame's line,
    or an OPEN frame's fields in that shape): run_id, index, name, rank, pid, cpu, begin_ns,
    and optionally params, backend and host. The one place that turns a begin into a record;
    raises KeyError, TypeError or ValueError for a malformed line.
    """
    return SuperstepRecord(
        run_id=_str(begin, "run_id"), index=_int(begin, "index"), name=_str(begin, "name"),
        rank=_int(begin, "rank"), pid=_int(begin, "pid"), cpu=_int(begin, "cpu"),
        begin_ns=_int(begin, "begin_ns"), end_ns=None, params=params(begin.get("params") or {}),
        flags=frozenset({"incomplete"}), backend=_str(begin, "backend", "none"),
        host=_str(begin, "host", ""),
        marker_ns=None if begin.get("marker_ns") is None else _int(begin, "marker_ns"))


@dataclass(frozen=True)
class RecordResult:
    """What ``counterd record`` (:func:`counterd.commands.recording.record`) returns."""

    exit_code: int  # the command's
    records: tuple[SuperstepRecord, ...]
    backend: str
    out: Path | None
    # The signal (SIGINT, SIGTERM...) that stopped the recording after the command's timed run
    # (backend callgrind: while counting it, or before): records left uncounted carry
    # ``counters_missing`` and say why in ``unsupported["*"]``. None: not stopped.
    stopped_by: int | None = None
    # What of the command's spool was not read (counterd.wire.spool_reader.Skipped.line), one per
    # file.
    skipped: tuple[str, ...] = ()
    # This node's clock domain for the run, with the recorder's anchors (counterd.data.clocks).
    domain: ClockDomain | None = None


def write_jsonl(records: Iterable[SuperstepRecord], path: Path,
                header: Iterable[Mapping[str, Any]] = ()) -> int:
    """Write records as JSON lines atomically (temp file + rename), after the ``header``
    lines (clock domains: :mod:`counterd.data.clocks`). Returns the count of records.

    On any error the temp file is removed, so no partial file pretends to be complete.
    """
    from counterd.util.fsutil import atomic_write_text

    head = [json.dumps(dict(h), sort_keys=True) for h in header]
    lines = [json.dumps(r.to_json(), sort_keys=True) for r in records]
    atomic_write_text(path, "".join(line + "\n" for line in head + lines))
    return len(lines)


# A records file holds at most this many clock-domain lines (a recorder writes one; a file
# gathered from a shared spool, one per node): a file with more is not counterd's.
MAX_DOMAINS_PER_FILE = 4096


def read_jsonl(path: Path, domains: list[ClockDomain] | None = None
               ) -> Iterator[SuperstepRecord]:
    """The records of a JSON-lines file, one at a time (a file of any size is read in bounded
    memory). BadInput, naming the line, for a line that is not a strict JSON record
    (:mod:`counterd.util.strictjson`, :meth:`SuperstepRecord.from_json`). Clock-domain lines
    (:mod:`counterd.data.clocks`) are checked and appended to ``domains`` (dropped when None)."""
    from counterd.data.clocks import CLOCK_FORMAT, ClockDomain
    from counterd.util.fsutil import bounded_lines
    from counterd.util.strictjson import Malformed, loads

    fix = "pass a file written by counterd record"
    seen = 0
    for lineno, line in bounded_lines(path, fix):
        if not line.strip():
            continue
        try:
            obj = loads(line)
            if isinstance(obj, Mapping) and obj.get("format") == CLOCK_FORMAT:
                seen += 1
                if seen > MAX_DOMAINS_PER_FILE:
                    raise BadInput(f"more than {MAX_DOMAINS_PER_FILE} clock-domain lines",
                                   _RECORD_FIX)
                domain = ClockDomain.from_json(obj)
                if domains is not None:
                    domains.append(domain)
                continue
            yield SuperstepRecord.from_json(obj)
        except Malformed as exc:
            if lineno == 1 and line.strip() in ("{", "[", b"{", b"["):  # a report --json, say
                raise BadInput(f"{path}: one JSON document over several lines (a counterd "
                               "report --json output?), not the records counterd record "
                               "writes, one per line", _RECORD_FIX) from None
            raise BadInput(f"{path}:{lineno}: not a JSON record ({exc})", fix) from None
        except BadInput as exc:
            raise BadInput(f"{path}:{lineno}: {exc.what}", exc.fix) from None
