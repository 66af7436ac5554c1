"""Plain tables in, :class:`Step` out: microbench results, ``counterd record`` JSON lines, CSV.

The predictor reads counterd's and microbench's files as plain JSON/CSV and imports only
counterd's data modules (counter names, the superstep time; DESIGN.md section 2). A
:class:`Step` is one superstep (or one repetition of a microbenchmark pattern): per-processor
counter arrays, optional per-bank counts, the BSP quantities H, K, M, M_b, the measured time if
any, and which inputs were assumed.
"""

from __future__ import annotations

import csv
import itertools
import math
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from counterd.data.clocks import CLOCK_FORMAT
from counterd.data.errors import BadInput as CounterdBadInput
from counterd.data.events import NAMES
from counterd.data.records import RECORD_FORMAT, not_a_record, span_ns
from counterd.util.fsutil import bounded_lines
from predictor.errors import BadCounterValue, BadInput, UnknownCounter

if TYPE_CHECKING:
    from counterd.machine.views import BankTable, GeometryTable

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
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer like 10**400
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
    geometry: GeometryTable  # the machine's sections (counterd.machine.views), typed
    bank_map: BankTable
    word_bytes: int
    patterns: tuple[Step, ...]

    @property
    def levels(self) -> tuple[int, ...]:
        """Cache levels of the geometry, e.g. (1, 2, 3)."""
        return self.geometry.levels

    @property
    def processors(self) -> int:
        """The largest processor count among the patterns (the machine's p in F2 and EBSP)."""
        return max((int(s.meta.get("procs") or s.processors) for s in self.patterns),
                   default=0)


_DAMAGED = "give the JSON file written by `microbench run` (this one is damaged)"


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise BadInput(f"{where} is {type(v).__name__}, not an object", _DAMAGED)
    return v


def _count(v: Any, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 31:
        raise BadInput(f"{where} = {v!r:.40} is not an integer in [0, 2^31)", _DAMAGED)
    return v


# Pattern fields the fits read (predictor/costs/fit.py), with the types microbench writes.
_META_TYPES: dict[str, tuple[type, ...]] = {
    "mnemonic": (str,), "suite": (str,), "op": (str,), "mode": (str,), "level": (str,),
    "coherence": (str,), "bkc": (int, float), "stride_words": (int,),
    "accesses_per_proc": (int,), "procs": (int,), "flags": (list,)}


def _pattern_step(i: int, d: Any, path: str = "<results>") -> Step:
    d = _mapping(d, f"{path}: pattern #{i}")
    where = f"{path}: pattern {str(d.get('mnemonic', i))[:60]!r}"
    for key, types in _META_TYPES.items():
        v = d.get(key)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
            raise BadInput(f"{where}: {key} is {type(v).__name__}", _DAMAGED)
    if d.get("procs") is not None:
        _count(d["procs"], f"{where}: procs")
    procs = d.get("processors")
    if not isinstance(procs, list) or not procs:
        raise BadInput(f"{where}: no processors", "each pattern lists its processors")
    names: list[str] = []
    for j, pr in enumerate(procs):
        for n in _mapping(_mapping(pr, f"{where} processor #{j}").get("counters", {}),
                          f"{where} processor #{j} counters"):
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
            vals.append(_number(f"{where} rank {str(pr.get('rank'))[:20]}", n, c[n]))
        counters[n] = np.array(vals)
    time = d.get("time_ns")
    t = None
    if isinstance(time, Mapping) and time.get("median") is not None:
        t = _number(where, "time_ns.median", time["median"])
    samples = time.get("samples") if isinstance(time, Mapping) else None
    banks = _mapping(d.get("banks") or {}, f"{where}: banks")
    bsp = _mapping(d.get("bsp") or {}, f"{where}: bsp")
    meta = {k: d.get(k) for k in _META_TYPES}
    if isinstance(samples, list):  # every repetition's time: other summaries, noise floors
        meta["time_samples"] = tuple(_number(where, "time_ns.samples", x) for x in samples)
    for key in ("H", "M"):
        if bsp.get(key) is not None:
            meta[key] = _number(where, f"bsp.{key}", bsp[key])
    return Step(
        name=str(d.get("mnemonic", f"pattern{i}")), counters=counters,
        ranks=tuple(_count(pr.get("rank", j), f"{where} processor #{j} rank")
                    for j, pr in enumerate(procs)),
        bank_lm=_bank_array(where, "lm", banks.get("lm")),
        bank_wb=_bank_array(where, "wb", banks.get("wb")),
        k=None if bsp.get("K") is None else _number(where, "bsp.K", bsp["K"]),
        m_b=None if bsp.get("M_b") is None else _number(where, "bsp.M_b", bsp["M_b"]),
        time_ns=t, meta=meta)


def machine_sections(geometry: Mapping[str, Any], bank_map: Mapping[str, Any]
                     ) -> tuple[GeometryTable, BankTable]:
    """The ``geometry`` and ``bank_map`` tables of a results file or a profile, typed
    (:class:`counterd.machine.views.GeometryTable`, :class:`~counterd.machine.views.BankTable`,
    which keep the tables as written). Imported on first use, so that importing the predictor
    loads no module of counterd's machine description."""
    from counterd.machine.views import BankTable, GeometryTable

    return GeometryTable.wrap(geometry), BankTable.wrap(bank_map)


def _geometry(v: Any, path: str) -> dict[str, Any]:
    """The geometry table, its levels checked (the profile's fingerprint and LLC come
    from them)."""
    g = dict(_mapping(v or {}, f"{path}: geometry"))
    levels = g.get("levels", [])
    if not isinstance(levels, list):
        raise BadInput(f"{path}: geometry.levels is not a list", _DAMAGED)
    for j, lv in enumerate(levels):
        lv = _mapping(lv, f"{path}: geometry.levels[{j}]")
        for key in ("level", "size_bytes", "ways", "line_bytes"):
            if _count(lv.get(key), f"{path}: geometry.levels[{j}].{key}") < 1:
                raise BadInput(f"{path}: geometry.levels[{j}].{key} is 0", _DAMAGED)
    return g


def results_from_json(d: Mapping[str, Any], path: str = "<results>") -> Results:
    """The results in ``d``, each field the predictor reads checked for its type and range
    (BadInput naming the file and the field)."""
    if d.get("format") != RESULTS_FORMAT:
        raise BadInput(f"{path}: format {d.get('format')!r:.40} is not {RESULTS_FORMAT!r}",
                       "give the JSON file written by `microbench run`")
    if d.get("version") not in RESULTS_VERSIONS:
        raise BadInput(f"{path}: microbench results version {d.get('version')!r:.40} is not "
                       f"supported (this predictor reads {RESULTS_VERSIONS})",
                       "use a predictor that matches the microbench version")
    pats = d.get("patterns")
    if not isinstance(pats, list):
        raise BadInput(f"{path}: no pattern list", "the results file is damaged")
    host = dict(_mapping(d.get("host") or {}, f"{path}: host"))
    for key in ("hostname", "cpu_model", "cpus_online", "page_bytes"):
        if host.get(key) is not None and not isinstance(host[key], (str, int)):
            raise BadInput(f"{path}: host.{key} is {type(host[key]).__name__}", _DAMAGED)
    bank_map = dict(_mapping(d.get("bank_map") or {}, f"{path}: bank_map"))
    if bank_map.get("banks") is not None and _count(bank_map["banks"],
                                                     f"{path}: bank_map.banks") < 1:
        raise BadInput(f"{path}: bank_map.banks is 0", _DAMAGED)
    word_bytes = _count(d.get("word_bytes", 8), f"{path}: word_bytes")
    # Compute patterns (microbench/compute.py) sit apart from the memory patterns, with
    # suite "compute": every reader of "patterns" keeps seeing memory patterns only.
    comp = _mapping(d.get("compute") or {}, f"{path}: compute").get("patterns") or []
    if not isinstance(comp, list):
        raise BadInput(f"{path}: compute.patterns is not a list", _DAMAGED)
    geometry, banks = machine_sections(_geometry(d.get("geometry"), path), bank_map)
    return Results(
        path=path, backend=str(d.get("backend", "?")), host=host,
        geometry=geometry, bank_map=banks,
        word_bytes=word_bytes,
        patterns=tuple(_pattern_step(i, p, path) for i, p in enumerate([*pats, *comp])))


MAX_RESULTS_BYTES = 1 << 28  # a full suite's results are a few MB


def read_json(path: str | Path, written_by: str, what: str = "results") -> Any:
    """A JSON document (:func:`counterd.util.strictjson.load_file`: no NaN, no 1e400, no deep
    nesting, at most MAX_RESULTS_BYTES); BadInput saying to give the file ``written_by``
    writes."""
    from counterd.util.strictjson import Malformed, load_file

    try:
        return load_file(path, MAX_RESULTS_BYTES)
    except OSError as exc:
        raise BadInput(f"cannot read {what} {path}: {exc.strerror}",
                       f"give the JSON file written by `{written_by}`") from None
    except Malformed as exc:
        raise BadInput(f"{path} is not usable JSON ({exc})",
                       f"give the JSON file written by `{written_by}`") from None


def check_format(doc: Any, fmt: str, versions: Sequence[int], where: str,
                 written_by: str) -> dict[str, Any]:
    """``doc`` if it is a JSON object of format ``fmt`` in one of ``versions``, else
    BadInput naming the file and saying to give (or rerun) what ``written_by`` writes."""
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        found = doc.get("format") if isinstance(doc, dict) else None
        raise BadInput(f"{where} is not a {written_by} file (format {found!r:.40})",
                       f"give a file written by {written_by}")
    version = doc.get("version")
    if isinstance(version, bool) or version not in versions:
        raise BadInput(f"{where} has format version {version!r:.40}; this predictor reads "
                       f"{', '.join(map(str, versions))}",
                       f"upgrade the predictor, or rerun {written_by}")
    return doc


def load_results(path: str | Path) -> Results:
    """A microbench results file (:func:`read_json`) checked pattern by pattern
    (:func:`results_from_json`)."""
    d = read_json(path, "microbench run")
    if not isinstance(d, dict):
        raise BadInput(f"{path} is not a microbench results object", "see predictor/README")
    return results_from_json(d, str(path))


# -- superstep records (counterd record JSONL) and CSV tables -------------------------------

_CSV_META = frozenset({"superstep", "rank", "name", "run_id", "begin_ns", "end_ns", "time_ns",
                       "cpu", "pid", "K", "M_b"})


class _Acc:
    """One superstep's rows while a file is read, compact (a 200 MB records file holds ~90k
    supersteps): per rank an array of counter values indexed by the file's counter names
    (``names``: name -> slot), NaN where a rank did not report a counter."""

    __slots__ = ("name", "ranks", "rows", "begin", "end", "time_ns", "k", "m_b", "incomplete")

    def __init__(self, name: str) -> None:
        self.name = name
        self.ranks: list[int] = []
        self.rows: list[array[float]] = []
        self.begin = array("d")
        self.end = array("d")
        self.time_ns: float | None = None
        self.k: float | None = None
        self.m_b: float | None = None
        self.incomplete = False

    def add(self, rank: int, row: Mapping[str, float], names: dict[str, int]) -> None:
        values = array("d")
        for n, v in row.items():
            slot = names.setdefault(n, len(names))
            if slot >= len(values):
                values.extend([math.nan] * (slot + 1 - len(values)))
            values[slot] = v
        self.ranks.append(rank)
        self.rows.append(values)


def _steps_from_acc(accs: list[_Acc | None], names: Mapping[str, int]) -> Iterator[Step]:
    """The steps of ``accs`` in order, each accumulator dropped once its step is built."""
    order = list(names)
    for i, a in enumerate(accs):
        assert a is not None
        accs[i] = None
        slots = sorted({j for r in a.rows for j, v in enumerate(r) if not math.isnan(v)},
                       key=lambda j: order[j])
        counters = {}
        for j in slots:
            col = [r[j] if j < len(r) else math.nan for r in a.rows]
            missing = [rk for rk, v in zip(a.ranks, col, strict=True) if math.isnan(v)]
            if missing:
                raise BadInput(f"superstep {a.name}: counter {order[j]!r} is missing for "
                               f"rank(s) {missing}", "every processor of a superstep must "
                               "report the same counters; re-record, or drop the counter")
            counters[order[j]] = np.array(col)
        t = a.time_ns
        meta: dict[str, Any] = {"incomplete": a.incomplete}
        if a.begin and a.end and not a.incomplete:
            t = span_ns(a.begin, a.end) if t is None else t
            # The slowest processor's own time (begin to end): the span less the skew of the
            # processors' starts, which is the barrier's, not the superstep's work.
            meta["work_ns"] = max(e - b for b, e in zip(a.begin, a.end, strict=True))
        yield Step(name=a.name, counters=counters, ranks=tuple(a.ranks), k=a.k,
                   m_b=a.m_b, time_ns=t, meta=meta)


def _int_field(d: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    v = d.get(key, default)
    if not isinstance(v, int) or isinstance(v, bool) or not -(1 << 63) <= v < 1 << 63:
        raise BadInput(f"{where}: {key} = {v!r:.40} is not a 64-bit integer",
                       "give the JSON lines written by `counterd record`")
    return v


def steps_from_records(lines: Iterable[str | bytes], path: str = "<records>") -> list[Step]:
    """Group ``counterd record`` JSON lines (one per processor per superstep) into steps.
    Each line is strict JSON (:mod:`counterd.util.strictjson`); BadInput names the line."""
    return list(_records_steps(lines, path))


def _records_steps(lines: Iterable[str | bytes], path: str) -> Iterator[Step]:
    from counterd.util.strictjson import Malformed, loads

    groups: dict[tuple[str, int], _Acc] = {}
    names: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            d = loads(line)
        except Malformed as exc:
            raise BadInput(f"{where} is not JSON ({exc})",
                           "give the JSON lines written by `counterd record`") from None
        if isinstance(d, dict) and d.get("format") == CLOCK_FORMAT:
            continue  # the recorder's clock-domain line (counterd.data.clocks), not a record
        if isinstance(d, dict) and (d.get("format") not in (None, RECORD_FORMAT)
                                    or "index" not in d or "counters" not in d):
            err = not_a_record(d)  # another file of this project, or of another tool
            raise BadInput(f"{where}: {err.what}", err.fix)
        if not isinstance(d, dict) or "index" not in d or not isinstance(d.get("counters"),
                                                                          dict):
            raise BadInput(f"{where} is not a superstep record (no index or counters)",
                           "give the JSON lines written by `counterd record`")
        index = _int_field(d, "index", where)
        run_id, step_name = d.get("run_id", ""), d.get("name", "")
        if not isinstance(run_id, str) or not isinstance(step_name, str):
            raise BadInput(f"{where}: run_id and name must be strings",
                           "give the JSON lines written by `counterd record`")
        key = (run_id, index)
        name = f"{index}:{step_name}"
        a = groups.setdefault(key, _Acc(name=name))
        rank = _int_field(d, "rank", where, len(a.ranks))
        if rank in a.ranks:
            raise BadInput(f"{where}: rank {rank} appears twice in superstep {name}",
                           "give one record file per run")
        swhere = f"{where}: superstep {name} rank {rank}"
        row = {}
        for n, v in d["counters"].items():
            _check_name(n, swhere)
            row[n] = _number(swhere, n, v)
        a.add(rank, row, names)
        if d.get("end_ns") is None:
            a.incomplete = True
        else:
            begin, end = _int_field(d, "begin_ns", where), _int_field(d, "end_ns", where)
            a.begin.append(float(begin))
            a.end.append(float(end))
    accs: list[_Acc | None] = list(groups.values())
    groups.clear()
    return _steps_from_acc(accs, names)


def steps_from_csv(text: str | Iterable[str], path: str = "<csv>") -> list[Step]:
    """A plain table: columns ``superstep``, ``rank`` and canonical counter names; optional
    ``time_ns`` (the superstep's time) or ``begin_ns``/``end_ns``, ``K``, ``M_b``. ``text``
    is the table or its lines; BadInput names the line of anything malformed."""
    reader = csv.DictReader(text.splitlines() if isinstance(text, str) else text)
    try:
        return list(_csv_steps(reader, path))
    except csv.Error as exc:
        raise BadInput(f"{path}:{reader.line_num}: not a CSV table ({exc})",
                       "a counter table has columns superstep, rank and canonical "
                       "counters") from None


def _csv_steps(reader: csv.DictReader[str], path: str) -> Iterator[Step]:
    cols = reader.fieldnames or []
    if "superstep" not in cols or "rank" not in cols:
        raise BadInput(f"{path}: no 'superstep' and 'rank' columns",
                       "a counter table has columns superstep, rank and canonical counters")
    for c in cols:
        if c not in _CSV_META:
            _check_name(c, f"{path} header")
    groups: dict[str, _Acc] = {}
    names: dict[str, int] = {}
    for r in reader:
        where = f"{path}:{reader.line_num}"
        key, rank = r["superstep"], r["rank"]
        if key is None or rank is None or not (rank.strip().isdecimal()
                                               and len(rank.strip()) <= 9):
            raise BadInput(f"{where}: no superstep, or rank {rank!r:.40} is not a processor "
                           "number", "every row has a superstep and a rank (an integer >= 0)")
        a = groups.setdefault(key, _Acc(name=key if not r.get("name") else f"{key}:{r['name']}"))
        row = {c: _number(where, c, r[c]) for c in cols
               if c not in _CSV_META and r[c] not in ("", None)}
        a.add(int(rank), row, names)
        if r.get("time_ns"):
            a.time_ns = _number(where, "time_ns", r["time_ns"])
        if r.get("begin_ns") and r.get("end_ns"):
            a.begin.append(_number(where, "begin_ns", r["begin_ns"]))
            a.end.append(_number(where, "end_ns", r["end_ns"]))
        for col in ("K", "M_b"):
            if r.get(col):
                setattr(a, col.lower(), _number(where, col, r[col]))
    return _steps_from_acc(list(groups.values()), names)


def _lines(path: str | Path) -> Iterator[bytes]:
    """The lines of ``path``, read one at a time (:func:`counterd.util.fsutil.bounded_lines`)."""
    try:
        for _, line in bounded_lines(path, _COUNTERS_FIX):
            yield line
    except CounterdBadInput as exc:  # the predictor's own error type, for its CLI
        raise BadInput(str(exc)) from None


_COUNTERS_FIX = "give a counterd record JSONL file or a CSV counter table"


def _text_lines(lines: Iterable[bytes], path: str | Path) -> Iterator[str]:
    for lineno, line in enumerate(lines, 1):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadInput(f"{path}:{lineno}: not UTF-8 (byte {exc.start})",
                           "give a counterd record JSONL file or a CSV counter table") from None


def load_counters(path: str | Path) -> list[Step]:
    """Steps from a ``counterd record`` JSONL file or a CSV counter table (by content)."""
    return list(iter_counters(path))


def iter_counters(path: str | Path) -> Iterator[Step]:
    """The steps of :func:`load_counters` one at a time: the file is read line by line and
    each superstep's rows are dropped once its step is made, so a caller that does not keep
    the steps holds only the compact rows (``predict --counters``)."""
    lines = _lines(path)
    first = b""
    for first in lines:
        if first.strip():
            break
    if not first.strip():
        raise BadInput(f"{path} is empty", "record a run first (counterd record)")
    rest = itertools.chain([first], lines)
    if first.lstrip()[:1] in (b"{", b"["):
        steps = _records_steps(rest, str(path))
    else:
        reader = csv.DictReader(_text_lines(rest, path))
        try:
            steps = _csv_steps(reader, str(path))
        except csv.Error as exc:
            raise BadInput(f"{path}:{reader.line_num}: not a CSV table ({exc})",
                           "a counter table has columns superstep, rank and canonical "
                           "counters") from None
    any_step = False
    try:
        for step in steps:
            any_step = True
            yield step
    except BadInput as exc:  # about a superstep: say which file holds it
        if type(exc) is not BadInput or str(path) in exc.what:
            raise
        raise BadInput(f"{path}: {exc.what}", exc.fix) from None
    if not any_step:
        raise BadInput(f"{path} holds no supersteps", "record a run first (counterd record)")
