"""Valid seed files of every format the commands read, and the hostile variants of each.

A variant is what the issue's "Files" paragraph tried: binary garbage, 100k-deep nesting, a
JSON line ``[1, 2]``, ``begin_ns`` 1e400, a counter of -5, a NaN counter, an empty file, a
truncated file and a line longer than any reader takes. For the TOML formats the numeric
variants go into the field that plays the part (a coefficient, a size, a limit).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from counterd.backends.base import CounterValue
from counterd.data.events import Source
from counterd.data.records import SuperstepRecord, write_jsonl
from counterd.util.fsutil import MAX_LINE_BYTES

BINARY = bytes(range(256)) * 8 + b"\xff\xfe\x00\x80\xc3\x28" * 100
DEEP = b"[" * 100_000
HUGE = b'{"run_id": "' + b"x" * (MAX_LINE_BYTES + 16) + b'"}\n'
MARK = "__MARK__"  # a JSON string a variant replaces with a raw token (NaN, 1e400, -5)

VARIANTS = ("binary", "deep", "list_line", "begin_1e400", "counter_-5", "nan_counter", "empty",
            "truncated", "huge_line")


def records() -> list[SuperstepRecord]:
    """Two processors, three supersteps (tests/report's run)."""
    out = []
    for index in range(3):
        for rank in range(2):
            begin = 1_000 + rank * 1_000 + index * 10_000_000
            out.append(SuperstepRecord(
                run_id="rep", index=index, name=["load", "exchange", "reduce"][index],
                rank=rank, pid=100 + rank, cpu=rank, begin_ns=begin, end_ns=begin + 500_000,
                counters={n: CounterValue(100.0 * (rank + 1), Source.SIMULATED)
                          for n in ("loads", "stores", "l1d_misses", "l2_misses",
                                    "l1d_writebacks", "l2_writebacks")},
                backend="sim", host="h"))
    return out


def records_bytes(tmp: Path) -> bytes:
    write_jsonl(records(), tmp / "seed.jsonl")
    return (tmp / "seed.jsonl").read_bytes()


def _json_with(doc: Any, setter: Callable[[Any], None], token: str) -> bytes:
    setter(doc)
    return json.dumps(doc).replace(json.dumps(MARK), token).encode()


def jsonl_variant(valid: bytes, name: str) -> bytes:
    first, _, rest = valid.partition(b"\n")
    d = json.loads(first)

    def counter(d: Any) -> None:
        d["counters"]["loads"]["value"] = MARK

    def begin(d: Any) -> None:
        d["begin_ns"] = MARK

    line = {"begin_1e400": lambda: _json_with(d, begin, "1e400"),
            "counter_-5": lambda: _json_with(d, counter, "-5"),
            "nan_counter": lambda: _json_with(d, counter, "NaN")}
    if name in line:
        return line[name]() + b"\n" + rest
    return _common(valid, name, list_line=b"[1, 2]\n" + valid, deep=DEEP + b"\n")


def results_variant(valid: bytes, name: str) -> bytes:
    """Variants of a microbench results document (one JSON object)."""
    d = json.loads(valid)

    def counter(d: Any) -> None:
        c = d["patterns"][0]["processors"][0]["counters"]
        c[next(iter(c))]["value"] = MARK

    def begin(d: Any) -> None:
        d["patterns"][0]["processors"][0]["begin_ns"] = [MARK]

    doc = {"begin_1e400": lambda: _json_with(d, begin, "1e400"),
           "counter_-5": lambda: _json_with(d, counter, "-5"),
           "nan_counter": lambda: _json_with(d, counter, "NaN")}
    if name in doc:
        return doc[name]()
    return _common(valid, name, list_line=b"[1, 2]\n", deep=DEEP)


def toml_variant(valid: bytes, name: str, *, number_key: tuple[Any, ...],
                 counter_key: tuple[Any, ...]) -> bytes:
    """Variants of a TOML file: the field at ``number_key`` (a path of keys and list
    indices) takes 1e400 (TOML reads it as infinity), the one at ``counter_key`` -5 and nan."""
    import tomllib

    from predictor.costs.profile import dumps  # a generic TOML writer (tables, lists of tables)

    values = {"begin_1e400": (number_key, float("inf")), "counter_-5": (counter_key, -5),
              "nan_counter": (counter_key, float("nan"))}
    if name in values:
        key, value = values[name]
        doc = tomllib.loads(valid.decode())
        node = doc
        for k in key[:-1]:
            node = node.setdefault(k, {}) if isinstance(k, str) else node[k]
        node[key[-1]] = value
        text = dumps(doc)
        return text.replace(" = inf", " = 1e400").encode()
    return _common(valid, name, list_line=b"[1, 2]\n", deep=b"a = " + DEEP + b"\n")


def _common(valid: bytes, name: str, *, list_line: bytes, deep: bytes) -> bytes:
    return {"binary": BINARY, "deep": deep, "list_line": list_line, "empty": b"",
            "truncated": valid[: len(valid) // 2], "huge_line": HUGE}[name]
