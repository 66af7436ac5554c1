"""Plain tables in, :class:`Step` out: microbench results, ``counterd record`` JSON lines, CSV.

The predictor reads counterd's and microbench's files as plain JSON/CSV and imports only
counterd's data modules (counter names, the superstep time; DESIGN.md section 2). A
:class:`Step` is one superstep (or one repetition of a microbenchmark pattern): per-processor
counter arrays, optional per-bank counts, the BSP quantities H, K, M, M_b, the measured time if
any, and which inputs were assumed.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from counterd.events import NAMES
from counterd.records import span_ns
from predictor.errors import BadCounterValue, BadInput, UnknownCounter

Array = NDArray[np.float64]

# The canonical counter names: the contract between layers (DESIGN.md section 3).
CANONICAL: tuple[str, ...] = NAMES


def miss_counter(level: int) -> str:
    """Canonical miss counter of cache level ``level`` (1 -> l1d_misses, 2 -> l2_misses...)."""
    return "l1d_misses" if level == 1 else f"l{level}_misses"


def writeback_counter(level: int) -> str:
    return "l1d_writebacks" if level == 1 else f"l{level}_writebacks"


RESULTS_FORMAT = "counterd-microbench"
RESULTS_VERSIONS = (1,)


@dataclass(frozen=True, eq=False)
class Step:
    """One superstep: what every processor counted and, optionally, how long it took."""

    name: str
    counters: Mapping[str, Array]  # canonical name -> (n,) values, one per processor
    ranks: tuple[int, ...] = ()
    bank_lm: Array | None = None  # (B,) last-level misses served by each bank, lines
    bank_wb: Array | None = None  # (B,) last-level writebacks to each bank, lines
    k: float | None = None  # max accesses to one word (QSM's K)
    m_b: float | None = None  # max accesses to one bank (DXBSP's M_b)
    time_ns: float | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def processors(self) -> int:
        return len(next(iter(self.counters.values()))) if self.counters else 0

    def counter(self, name: str) -> Array:
        """Per-processor values of ``name``; zeros when absent (callers check what they need
        first with ``missing``)."""
        v = self.counters.get(name)
        return v if v is not None else np.zeros(self.processors)

    def missing(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if n not in self.counters]


def _number(where: str, name: str, raw: Any) -> float:
    if isinstance(raw, Mapping):
        raw = raw.get("value")
    if isinstance(raw, bool) or raw is None:
        raise BadCounterValue(name, where, raw)
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise BadCounterValue(name, where, raw) from None
    if not math.isfinite(v) or v < 0:
        raise BadCounterValue(name, where, raw)
    return v


def _check_name(name: str, where: str) -> None:
    if name not in CANONICAL:
        raise UnknownCounter(name, where, CANONICAL)


def _bank_array(where: str, what: str, raw: Any) -> Array | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        raise BadInput(f"{where}: banks.{what} is not a non-empty list",
                       "per-bank counts are a list with one number per bank")
    return np.array([_number(where, f"banks.{what}[{i}]", x) for i, x in enumerate(raw)])


# -- microbench results --------------------------------------------------------------------

@dataclass(frozen=True)
class Results:
    """A microbench results file (the contract of issue 4), read as plain data."""

    path: str
    backend: str
    host: Mapping[str, Any]
    geometry: Mapping[str, Any]
    bank_map: Mapping[str, Any]
    word_bytes: int
    patterns: tuple[Step, ...]

    @property
    def levels(self) -> tuple[int, ...]:
        """Cache levels of the geometry, e.g. (1, 2, 3)."""
        return tuple(sorted(int(lv["level"]) for lv in self.geometry.get("levels", ())))

    @property
    def processors(self) -> int:
        """The largest processor count among the patterns (the machine's p in F2 and EBSP)."""
        return max((int(s.meta.get("procs", s.processors)) for s in self.patterns), default=0)


def _pattern_step(i: int, d: Mapping[str, Any]) -> Step:
    where = f"pattern {d.get('mnemonic', i)!r}"
    procs = d.get("processors")
    if not isinstance(procs, list) or not procs:
        raise BadInput(f"{where}: no processors", "each pattern lists its processors")
    names: list[str] = []
    for pr in procs:
        for n in pr.get("counters", {}):
            _check_name(n, where)
            if n not in names:
                names.append(n)
    counters: dict[str, Array] = {}
    for n in names:
        vals = []
        for pr in procs:
            c = pr.get("counters", {})
            if n not in c:
                raise BadInput(f"{where}: counter {n!r} is given for some processors only",
                               "every processor of a pattern must report the same counters")
            vals.append(_number(f"{where} rank {pr.get('rank')}", n, c[n]))
        counters[n] = np.array(vals)
    time = d.get("time_ns")
    t = None
    if isinstance(time, Mapping) and time.get("median") is not None:
        t = _number(where, "time_ns.median", time["median"])
    banks = d.get("banks") or {}
    bsp = d.get("bsp") or {}
    meta = {k: d.get(k) for k in ("mnemonic", "suite", "procs", "stride_words", "bkc", "op",
                                  "mode", "level", "coherence", "accesses_per_proc", "flags")}
    for key in ("H", "M"):
        if bsp.get(key) is not None:
            meta[key] = _number(where, f"bsp.{key}", bsp[key])
    return Step(
        name=str(d.get("mnemonic", f"pattern{i}")), counters=counters,
        ranks=tuple(int(pr.get("rank", j)) for j, pr in enumerate(procs)),
        bank_lm=_bank_array(where, "lm", banks.get("lm")),
        bank_wb=_bank_array(where, "wb", banks.get("wb")),
        k=None if bsp.get("K") is None else _number(where, "bsp.K", bsp["K"]),
        m_b=None if bsp.get("M_b") is None else _number(where, "bsp.M_b", bsp["M_b"]),
        time_ns=t, meta=meta)


def results_from_json(d: Mapping[str, Any], path: str = "<results>") -> Results:
    if d.get("format") != RESULTS_FORMAT:
        raise BadInput(f"{path}: format {d.get('format')!r} is not {RESULTS_FORMAT!r}",
                       "give the JSON file written by `microbench run`")
    if d.get("version") not in RESULTS_VERSIONS:
        raise BadInput(f"{path}: microbench results version {d.get('version')!r} is not "
                       f"supported (this predictor reads {RESULTS_VERSIONS})",
                       "use a predictor that matches the microbench version")
    pats = d.get("patterns")
    if not isinstance(pats, list):
        raise BadInput(f"{path}: no pattern list", "the results file is damaged")
    return Results(
        path=path, backend=str(d.get("backend", "?")), host=dict(d.get("host") or {}),
        geometry=dict(d.get("geometry") or {}), bank_map=dict(d.get("bank_map") or {}),
        word_bytes=int(d.get("word_bytes", 8)),
        patterns=tuple(_pattern_step(i, p) for i, p in enumerate(pats)))


def load_results(path: str | Path) -> Results:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read results {path}: {exc.strerror}",
                       "give the JSON file written by `microbench run`") from exc
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path} is not JSON ({exc.msg} at line {exc.lineno})",
                       "give the JSON file written by `microbench run`") from exc
    if not isinstance(d, dict):
        raise BadInput(f"{path} is not a microbench results object", "see predictor/README")
    return results_from_json(d, str(path))


# -- superstep records (counterd record JSONL) and CSV tables -------------------------------

_CSV_META = frozenset({"superstep", "rank", "name", "run_id", "begin_ns", "end_ns", "time_ns",
                       "cpu", "pid", "K", "M_b"})


@dataclass
class _Acc:
    name: str
    ranks: list[int] = field(default_factory=list)
    rows: list[dict[str, float]] = field(default_factory=list)
    begin: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    time_ns: float | None = None
    k: float | None = None
    m_b: float | None = None
    incomplete: bool = False


def _steps_from_acc(accs: Iterable[_Acc]) -> list[Step]:
    steps = []
    for a in accs:
        names = sorted({n for r in a.rows for n in r})
        counters = {}
        for n in names:
            missing = [rk for rk, r in zip(a.ranks, a.rows, strict=True) if n not in r]
            if missing:
                raise BadInput(f"superstep {a.name}: counter {n!r} is missing for rank(s) "
                               f"{missing}", "every processor of a superstep must report the "
                               "same counters; re-record, or drop the counter")
            counters[n] = np.array([r[n] for r in a.rows])
        t = a.time_ns
        if t is None and a.begin and a.end and not a.incomplete:
            t = span_ns(a.begin, a.end)
        steps.append(Step(name=a.name, counters=counters, ranks=tuple(a.ranks), k=a.k,
                          m_b=a.m_b, time_ns=t, meta={"incomplete": a.incomplete}))
    return steps


def steps_from_records(lines: Iterable[str], path: str = "<records>") -> list[Step]:
    """Group ``counterd record`` JSON lines (one per processor per superstep) into steps."""
    groups: dict[tuple[str, int], _Acc] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadInput(f"{where} is not JSON ({exc.msg})",
                           "give the JSON lines written by `counterd record`") from exc
        if not isinstance(d, dict) or "index" not in d or "counters" not in d:
            raise BadInput(f"{where} is not a superstep record (no index or counters)",
                           "give the JSON lines written by `counterd record`")
        key = (str(d.get("run_id", "")), int(d["index"]))
        name = f"{d['index']}:{d.get('name', '')}"
        a = groups.setdefault(key, _Acc(name=name))
        rank = int(d.get("rank", len(a.ranks)))
        if rank in a.ranks:
            raise BadInput(f"{where}: rank {rank} appears twice in superstep {name}",
                           "give one record file per run")
        swhere = f"superstep {name} rank {rank}"
        row = {}
        for n, v in d["counters"].items():
            _check_name(n, swhere)
            row[n] = _number(swhere, n, v)
        a.ranks.append(rank)
        a.rows.append(row)
        if d.get("end_ns") is None:
            a.incomplete = True
        else:
            a.begin.append(float(d["begin_ns"]))
            a.end.append(float(d["end_ns"]))
    return _steps_from_acc(groups.values())


def steps_from_csv(text: str, path: str = "<csv>") -> list[Step]:
    """A plain table: columns ``superstep``, ``rank`` and canonical counter names; optional
    ``time_ns`` (the superstep's time) or ``begin_ns``/``end_ns``, ``K``, ``M_b``."""
    reader = csv.DictReader(text.splitlines())
    cols = reader.fieldnames or []
    if "superstep" not in cols or "rank" not in cols:
        raise BadInput(f"{path}: no 'superstep' and 'rank' columns",
                       "a counter table has columns superstep, rank and canonical counters")
    for c in cols:
        if c not in _CSV_META:
            _check_name(c, f"{path} header")
    groups: dict[str, _Acc] = {}
    for lineno, r in enumerate(reader, 2):
        where = f"{path}:{lineno}"
        key = r["superstep"]
        a = groups.setdefault(key, _Acc(name=key if not r.get("name") else f"{key}:{r['name']}"))
        row = {c: _number(where, c, r[c]) for c in cols
               if c not in _CSV_META and r[c] not in ("", None)}
        a.ranks.append(int(r["rank"]))
        a.rows.append(row)
        if r.get("time_ns"):
            a.time_ns = _number(where, "time_ns", r["time_ns"])
        if r.get("begin_ns") and r.get("end_ns"):
            a.begin.append(float(r["begin_ns"]))
            a.end.append(float(r["end_ns"]))
        for col in ("K", "M_b"):
            if r.get(col):
                setattr(a, col.lower(), _number(where, col, r[col]))
    return _steps_from_acc(groups.values())


def load_counters(path: str | Path) -> list[Step]:
    """Steps from a ``counterd record`` JSONL file or a CSV counter table (by content)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read counters {path}: {exc.strerror}",
                       "give a counterd record JSONL file or a CSV counter table") from exc
    first = text.lstrip()[:1]
    steps = (steps_from_records(text.splitlines(), str(path)) if first == "{"
             else steps_from_csv(text, str(path)))
    if not steps:
        raise BadInput(f"{path} holds no supersteps", "record a run first (counterd record)")
    return steps
