"""The results file: versioned, self-describing JSON, written atomically (pyperf's lesson).

A contract with the predictor (issue 5), which calibrates seed 004's cost functions from it.
Fields may be added; none may be renamed or change meaning without a new version.

Format history (``"format": "counterd-microbench"``):

* version 1 (issue 4): host metadata, geometry, declared bank map, word size, run config; per
  pattern the raw superstep times of the measured repetitions (warm-ups kept apart), median,
  spread, per-processor times and counters of one superstep (each with its source), per-bank
  LM(b)/WB(b), the BSP quantities H, K, M, M_b, and flags. ``complete`` is false while a run
  is in progress or after it was interrupted; the finished patterns are kept. Added since,
  optional (files without them are read as before): ``memory``, the NUMA nodes, channels and
  interleave the bank map derives from, each with its provenance
  (:meth:`counterd.machine.memory.MemoryLayout.to_json`), and ``rank_cpus``, the CPUs in the
  order ranks are pinned to them (rank k on ``rank_cpus[k]``).

Readers must reject versions they do not know (:func:`load`).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from counterd.data.errors import BadInput
from counterd.machine.views import NodeView
from counterd.util.fsutil import atomic_write_text
from microbench.patterns import Pattern, bsp_quantities
from predictor.inputs import RESULTS_FORMAT, RESULTS_VERSIONS

FORMAT = RESULTS_FORMAT  # the reader's (predictor.inputs) one name for it
VERSION = 1
SUPPORTED_VERSIONS = RESULTS_VERSIONS


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def new_document(*, machine: NodeView, backend: str, suite: str, host: Mapping[str, Any],
                 config: Mapping[str, Any], notes: Sequence[str]) -> dict[str, Any]:
    doc: dict[str, Any] = {"format": FORMAT, "version": VERSION, "created": now_iso(),
                           "backend": backend, "suite": suite, "complete": False,
                           "host": dict(host)}
    doc.update(machine.to_json())
    doc["config"] = dict(config)
    doc["notes"] = list(notes)
    doc["patterns"] = []
    return doc


def check_document(doc: Any, where: str) -> dict[str, Any]:
    """Validate the envelope and every field ``show``, ``--resume`` and the summaries read;
    raise BadInput (one line: the file, the field, the fix)."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BadInput(f"{where} is not a microbench results file (format "
                       f"{doc.get('format') if isinstance(doc, dict) else None!r:.40})",
                       "give a file written by microbench run")
    version = doc.get("version")
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        raise BadInput(f"{where} has results format version {version!r:.40}; this microbench "
                       f"reads {', '.join(map(str, SUPPORTED_VERSIONS))}",
                       "upgrade microbench, or rerun the suite with this version")
    if not isinstance(doc.get("patterns"), list):
        raise BadInput(f"{where} has no pattern list", "rerun microbench run")
    try:
        _check_fields(doc, _DOC_FIELDS, "")
        for key, types in (("geometry", {"spec": str}), ("bank_map", _BANK_FIELDS)):
            _check_fields(doc[key], types, key)
        for i, p in enumerate(doc["patterns"]):
            _check_pattern(p, f"patterns[{i}]")
    except _Damaged as exc:
        raise BadInput(f"{where}: {exc}", "the file is damaged: rerun microbench run "
                       "(--force), or restore it") from None
    return doc


class _Damaged(Exception):
    """A field of a results document with the wrong type or range (``where: why``)."""


_NUM = (int, float)  # strict JSON (counterd.util.strictjson) has made every float finite
_DOC_FIELDS: dict[str, Any] = {"created": str, "backend": str, "suite": str, "host": dict,
                               "geometry": dict, "bank_map": dict, "complete": bool}
_BANK_FIELDS: dict[str, Any] = {"banks": int, "interleave_bytes": int, "provenance": str}
_PATTERN_FIELDS: dict[str, Any] = {
    "mnemonic": str, "level": str, "suite": str, "op": str, "mode": str, "procs": int,
    "bkc": _NUM, "bkc_fraction": str, "per_access_ns": _NUM, "time_ns": dict,
    "flags": list, "processors": list}
_TIME_FIELDS: dict[str, Any] = {"spread": _NUM, "reps": int, "median": _NUM}


def _check_fields(d: Any, fields: Mapping[str, Any], where: str) -> None:
    if not isinstance(d, dict):
        raise _Damaged(f"{where or 'the document'} is {type(d).__name__}, not an object")
    for key, types in fields.items():
        v = d.get(key)
        if not isinstance(v, types) or (isinstance(v, bool) and types is not bool):
            raise _Damaged(f"{where + '.' if where else ''}{key} is "
                           + (f"{type(v).__name__}, not "
                              f"{getattr(types, '__name__', 'a number')}" if key in d
                              else "missing"))
        if isinstance(v, _NUM) and not isinstance(v, bool) and not _count(v):
            raise _Damaged(f"{where + '.' if where else ''}{key} = {v!r:.40} is not a number "
                           "in [0, 2^63]")


def _count(v: float) -> bool:
    """Whether ``v`` is a number a count, a time or a ratio can be: >= 0 and within 64 bits
    (an integer like 10**400 passes strict JSON and overflows every float use)."""
    return 0 <= v <= 1 << 63


def _check_pattern(p: Any, where: str) -> None:
    _check_fields(p, _PATTERN_FIELDS, where)
    _check_fields(p["time_ns"], _TIME_FIELDS, f"{where}.time_ns")
    if not all(isinstance(f, str) for f in p["flags"]):
        raise _Damaged(f"{where}.flags is not a list of strings")
    for j, pr in enumerate(p["processors"]):
        pw = f"{where}.processors[{j}]"
        _check_fields(pr, {"rank": int, "counters": dict, "begin_ns": list, "end_ns": list},
                      pw)
        for key in ("begin_ns", "end_ns"):
            if not all(isinstance(t, int) and not isinstance(t, bool) and _count(t)
                       for t in pr[key]):
                raise _Damaged(f"{pw}.{key} is not a list of integers in [0, 2^63]")
        for name, c in pr["counters"].items():
            value = c.get("value") if isinstance(c, dict) else None
            if not isinstance(value, _NUM) or isinstance(value, bool) or not _count(value):
                raise _Damaged(f"{pw}.counters.{name} has value {value!r:.40}: counters are "
                               "finite event counts >= 0")


MAX_BYTES = 1 << 28  # a full suite's results are a few MB


def read_json(path: str | Path, written_by: str = "microbench run") -> Any:
    """Strict JSON (:func:`counterd.util.strictjson.load_file`: no NaN, no 1e400, no deep nesting,
    UTF-8, at most MAX_BYTES); BadInput saying to give a file ``written_by`` wrote."""
    from counterd.util.strictjson import Malformed, load_file

    try:
        return load_file(path, MAX_BYTES)
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}", "check the path") from exc
    except Malformed as exc:
        raise BadInput(f"{path} is not usable JSON ({exc})",
                       f"give a file written by {written_by}") from None


def load(path: str | Path) -> dict[str, Any]:
    """The results document at ``path`` (:func:`read_json`), checked by
    :func:`check_document`."""
    return check_document(read_json(path), str(path))


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":")) + "\n"


def write(path: str | Path, doc: Mapping[str, Any]) -> None:
    """Atomic replace (temp file in the same directory, fsync, rename)."""
    atomic_write_text(Path(path), dumps(doc))


# --------------------------------------------------------------------------------------------
# One pattern's record


def served_level(counters: Mapping[str, float], pattern: Pattern,
                 line_bytes: Sequence[int]) -> str:
    """Where the simulated accesses were served: the first level that missed on fewer than
    half of the accesses that could miss there (one per line when the stride is shorter)."""
    elements = pattern.count * pattern.sweeps
    names = ("l1d_misses", "l2_misses", "l3_misses")
    for i, line in enumerate(line_bytes):
        could = elements * min(1.0, pattern.stride_bytes / line)
        if i >= len(names) or counters.get(names[i], 0) < 0.5 * could:
            return f"L{i + 1}"
    return "mem"


@dataclass(frozen=True)
class ProcessorRecord:
    rank: int
    cpu: int
    begin_ns: Sequence[int]
    end_ns: Sequence[int]
    nivcsw: int
    checksum: int
    counters: Mapping[str, Mapping[str, Any]]
    counters_simulated: Mapping[str, int]
    lm: Sequence[int]
    wb: Sequence[int]


def pattern_record(pattern: Pattern, machine: NodeView, *, samples_ns: Sequence[int],
                   warmup_samples_ns: Sequence[int], processors: Sequence[ProcessorRecord],
                   warmup: int, flags: Iterable[str], load: Mapping[str, Any],
                   sim: Mapping[str, Any], wall_s: float) -> dict[str, Any]:
    """The JSON object of one finished pattern (shape: the issue 4 contract)."""
    samples = np.asarray(samples_ns, dtype=float)
    median = float(np.median(samples)) if samples.size else float("nan")
    from microbench.repetition import mad_ratio, spread  # imports nothing from here

    rec = pattern.to_json()
    rec["time_ns"] = {"samples": [int(x) for x in samples_ns], "median": median,
                      "spread": spread(samples), "spread_definition": "(p90-p10)/median",
                      "mad_ratio": mad_ratio(samples), "warmup_dropped": warmup,
                      "warmup_samples": [int(x) for x in warmup_samples_ns],
                      "reps": int(samples.size)}
    rec["per_access_ns"] = median / pattern.accesses_per_proc
    procs = []
    banks = machine.bank_map.banks
    lm_total, wb_total = [0] * banks, [0] * banks
    for pr in processors:
        per = [e - b for b, e in zip(pr.begin_ns[warmup:], pr.end_ns[warmup:], strict=True)]
        procs.append({
            "rank": pr.rank, "cpu": pr.cpu, "time_ns_samples": per,
            "begin_ns": list(pr.begin_ns), "end_ns": list(pr.end_ns),
            "involuntary_switches": pr.nivcsw, "checksum": pr.checksum,
            "counters": {k: dict(v) for k, v in pr.counters.items()},
            "counters_simulated": dict(pr.counters_simulated),
            "banks": {"lm": list(pr.lm), "wb": list(pr.wb)},
        })
        lm_total = [a + b for a, b in zip(lm_total, pr.lm, strict=True)]
        wb_total = [a + b for a, b in zip(wb_total, pr.wb, strict=True)]
    rec["processors"] = procs
    rec["banks"] = {"lm": lm_total, "wb": wb_total}
    rec["bsp"] = bsp_quantities(pattern, machine.bank_map).to_json()
    rec["load"] = dict(load)
    rec["sim"] = dict(sim)
    rec["flags"] = sorted(set(flags))
    rec["wall_s"] = round(wall_s, 3)  # the timed part: pre-fault, warm-ups, repetitions
    return rec


# --------------------------------------------------------------------------------------------
# Summaries (used by `microbench show`)


def _median(values: Iterable[float]) -> float | None:
    v = [x for x in values if x == x]
    return float(np.median(v)) if v else None


def figure1_tables(doc: Mapping[str, Any], suite: str = "table1"
                   ) -> tuple[list[str], dict[str, dict[str, float | None]],
                              list[str], dict[str, dict[str, float | None]]]:
    """Seed 004 Figure 1, as tables of median ns per access of memory patterns:
    (a) per combination (LE, SE, LC, SC) against BKC; (b) against active processors, at
    BKC = 1 where it exists for that processor count, else the pattern nearest to it."""
    pats = [p for p in doc["patterns"] if p["level"] == "mem" and p.get("ws_factor") is None
            and p.get("coherence") is None and p["op"] in ("load", "store")
            and p["suite"] == suite]
    combo = {("load", "exclusive"): "LE", ("store", "exclusive"): "SE",
             ("load", "concurrent"): "LC", ("store", "concurrent"): "SC"}
    bkcs = sorted({p["bkc"] for p in pats})
    bkc_labels = {p["bkc"]: p["bkc_fraction"] for p in pats}
    cols_a = [bkc_labels[b] for b in bkcs]
    table_a: dict[str, dict[str, float | None]] = {}
    for key, name in combo.items():
        row = {}
        for b in bkcs:
            row[bkc_labels[b]] = _median(p["per_access_ns"] for p in pats
                                         if (p["op"], p["mode"]) == key and p["bkc"] == b)
        table_a[name] = row
    procs = sorted({p["procs"] for p in pats})
    cols_b = [f"p{n}" for n in procs]
    table_b: dict[str, dict[str, float | None]] = {}
    for key, name in combo.items():
        row = {}
        for n in procs:
            cands = [p for p in pats if (p["op"], p["mode"]) == key and p["procs"] == n]
            if n == 1 and key[1] == "concurrent":
                cands = [p for p in pats if (p["op"], "exclusive") == (key[0], p["mode"])
                         and p["procs"] == 1]
            if not cands:
                row[f"p{n}"] = None
                continue
            best = min(abs(float(np.log2(p["bkc"]))) for p in cands)
            row[f"p{n}"] = _median(p["per_access_ns"] for p in cands
                                   if abs(float(np.log2(p["bkc"]))) == best)
        table_b[name] = row
    return cols_a, table_a, cols_b, table_b


__all__ = ["FORMAT", "ProcessorRecord", "SUPPORTED_VERSIONS", "VERSION", "check_document",
           "dumps", "figure1_tables", "load", "new_document", "now_iso",
           "pattern_record", "served_level", "write"]


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Pattern count, completeness, median timing spread and flag counts of a results file."""
    pats = doc["patterns"]
    spreads = sorted(p["time_ns"]["spread"] for p in pats)
    flags: dict[str, int] = {}
    for p in pats:
        for f in p["flags"]:
            flags[f] = flags.get(f, 0) + 1
    return {"patterns": len(pats), "complete": doc.get("complete", False),
            "median_spread": spreads[len(spreads) // 2] if spreads else float("nan"),
            "p90_spread": spreads[int(0.9 * len(spreads))] if spreads else float("nan"),
            "flags": dict(sorted(flags.items()))}
