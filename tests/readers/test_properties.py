"""Property-based hostile input for every file reader (issue 14, item 7).

For each reader: random bytes, random JSON (or TOML) values, and random mutations of a valid
file (one field replaced by a random value, a huge number, NaN, a negative number, deep nesting
or a lone surrogate escape) give either a valid result or the reader's one typed error
(counterd's or the predictor's BadInput), never another exception. The commands that render
what a reader accepted (``microbench show``, ``predict``, ``counterd report``) are driven the
same way and must exit 0 or 2.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from counterd import report
from counterd.daemon import config as daemon_config
from counterd.data.errors import BadInput
from counterd.data.records import SuperstepRecord, read_jsonl
from counterd.machine.files import load_file as load_machine
from counterd.wire import spool_reader
from microbench import cli as microbench_cli
from microbench import results as mb_results
from predictor import cli as predict_cli
from predictor.costs.profile import _scalar, load_profile, profile_to_toml, sgi_power_challenge
from predictor.errors import PredictorError
from predictor.inputs import load_counters, load_results
from predictor.synthetic import make_results, reference_model
from tests.readers.files import MARK, records_bytes

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow,
                                           HealthCheck.function_scoped_fixture])
TYPED = (BadInput, PredictorError)

# What the issue tried in place of one field, as raw JSON tokens.
JSON_TOKENS = ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "-5", "-5.5", "0",
               "1" + "0" * 400, str(2**64), str(-(2**63) - 1), '"\\ud800"', '"\\udfffx"',
               "[" * 2000 + "]" * 2000, '{"a": ' * 200 + "1" + "}" * 200, "true", "null",
               '""', "[]", "{}", '"x"']
TOML_TOKENS = ["nan", "inf", "-inf", "1e400", "-5", "-5.5", "0", "1" + "0" * 40,
               '"\\ud800"', "[" * 2000 + "]" * 2000, "true", '""', "[]", "{}", '"x"',
               "1979-05-27T07:32:00Z"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                          allow_infinity=False) | st.text(),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=16)
toml_values = st.recursive(
    st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats() | st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.from_regex(r"[a-z_]{1,6}",
                                                                      fullmatch=True),
                                                        c, max_size=4), max_leaves=12)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and list indices) to a value inside ``doc``."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) \
        if isinstance(doc, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        doc = doc[k]
    doc[path[-1]] = value


@st.composite
def json_mutation(draw: st.DrawFn, doc: Any) -> bytes:
    """``doc`` with one field replaced by a random JSON value or a hostile token."""
    doc = json.loads(json.dumps(doc))
    path = draw(st.sampled_from(_paths(doc)))
    _set(doc, path, MARK)
    token = draw(st.sampled_from(JSON_TOKENS) | json_values.map(json.dumps))
    return json.dumps(doc).replace(json.dumps(MARK), token, 1).encode()


@st.composite
def toml_mutation(draw: st.DrawFn, doc: dict[str, Any], dumps: Callable[[Any], str]) -> bytes:
    doc = tomllib.loads(dumps(doc))
    path = draw(st.sampled_from(_paths(doc)))
    _set(doc, path, MARK)
    token = draw(st.sampled_from(TOML_TOKENS) | toml_values.map(_scalar))
    return dumps(doc).replace(json.dumps(MARK), token, 1).encode()


# Every file the examples write goes under one directory, removed when the run ends (hypothesis
# examples cannot take pytest's tmp_path; a directory per example left 50,000 of them in /tmp).
_TMP = tempfile.TemporaryDirectory(prefix="counterd-readers-")


def _dir() -> Path:
    return Path(tempfile.mkdtemp(dir=_TMP.name))


def _file(data: bytes, suffix: str = "") -> Path:
    f = _dir() / f"f{suffix}"
    f.write_bytes(data)
    return f


class Refused(NamedTuple):
    """A reader's typed error, and the file it was given."""

    error: Exception
    path: Path


def _typed(read: Callable[[Path], Any], data: bytes) -> Any:
    """``read`` the bytes as a file: a value, or :class:`Refused` for a typed error; any
    other exception propagates (and fails the test)."""
    path = _file(data)
    try:
        return read(path)
    except TYPED as exc:
        return Refused(exc, path)


def _well_refused(got: Any) -> bool:
    """A refusal as the CLIs print it: one line that names the file."""
    return isinstance(got, Refused) and "\n" not in str(got.error) \
        and str(got.path) in str(got.error)


def _accepted(got: Any) -> bool:
    """A value a reader returns: records or steps (a list), results or a profile or config."""
    return not isinstance(got, (Refused, BaseException))


def _exit(main: Callable[[list[str]], int], argv: list[str]) -> int:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code in (0, 2), err.getvalue()
    assert "Traceback" not in err.getvalue()
    return code


# -- seeds ------------------------------------------------------------------------------------

RECORDS = records_bytes(_dir())
RECORD = json.loads(RECORDS.splitlines()[0])
RESULTS = make_results(reference_model(const=1500.0), noise=0.01, seed=2)
RESULTS["patterns"] = RESULTS["patterns"][:6]  # small: mutations reach every part
PROFILE = sgi_power_challenge().to_dict()
MACHINE = {"format": "counterd-machine", "version": 1, "page_bytes": 4096,
           "caches": [{"level": 1, "type": "data", "size": "32K", "ways": 8,
                       "line_bytes": 64}],
           "bank_map": {"banks": 8, "interleave_bytes": 256}}
CONFIG = {"socket": {"path": "/tmp/x.sock", "max_clients_per_uid": 4},
          "store": {"path": "/tmp/x.db", "retention_days": 2.0},
          "sampling": {"interval_s": 1.0}, "log_level": "info"}


def _mb_results() -> dict[str, Any]:
    """A microbench results document as microbench writes it (one pattern)."""
    proc = {"rank": 0, "cpu": 0, "time_ns_samples": [10], "begin_ns": [1, 20],
            "end_ns": [11, 30], "involuntary_switches": 0, "checksum": 1,
            "counters": {"loads": {"value": 100, "source": "simulated"}},
            "counters_simulated": {"loads": 100}, "banks": {"lm": [0], "wb": [0]}}
    pattern = {"mnemonic": "p1.s1.b0.LE", "suite": "table1", "procs": 1, "stride_words": 1,
               "bkc": 1.0, "bkc_fraction": "1", "op": "load", "mode": "exclusive",
               "level": "mem", "coherence": None, "ws_factor": None,
               "time_ns": {"samples": [10], "median": 10.0, "spread": 0.0, "reps": 1},
               "per_access_ns": 0.1, "processors": [proc], "flags": []}
    return {"format": "counterd-microbench", "version": 1, "created": "2026-01-01",
            "backend": "sim", "suite": "table1", "complete": True, "host": {"hostname": "h"},
            "geometry": {"spec": "L1=32K/8/64", "levels": []},
            "bank_map": {"banks": 8, "interleave_bytes": 256, "provenance": "assumed: x"},
            "word_bytes": 8, "patterns": [pattern]}


MB_RESULTS = _mb_results()


def _report(path: Path) -> Any:
    rep = report.build(read_jsonl(path), source=str(path))
    for fmt in ("text", "json", "csv", "html"):
        report.render(rep, fmt)
    return rep


JSONL_READERS: dict[str, Callable[[Path], Any]] = {
    "read_jsonl": lambda p: list(read_jsonl(p)),
    "counterd report": _report,
    "predict load_counters": load_counters,
}
RESULTS_READERS: dict[str, Callable[[Path], Any]] = {
    "predict load_results": load_results,
    "microbench results.load": mb_results.load,
}
TOML_READERS: dict[str, tuple[Callable[[Path], Any], dict[str, Any]]] = {
    "load_profile": (load_profile, PROFILE),
    "machine load_file": (load_machine, MACHINE),
    "daemon config load": (lambda p: daemon_config.load(p, env={}), CONFIG),
}


# -- random bytes ----------------------------------------------------------------------------

ALL_READERS = {**JSONL_READERS, **RESULTS_READERS,
               **{k: v[0] for k, v in TOML_READERS.items()}}


@pytest.mark.parametrize("reader", list(ALL_READERS))
@SETTINGS
@given(data=st.binary(max_size=400) | st.text(max_size=200).map(str.encode))
def test_random_bytes(reader: str, data: bytes) -> None:
    got = _typed(ALL_READERS[reader], data)
    assert _well_refused(got) or _accepted(got), got


@pytest.mark.parametrize("reader", list(JSONL_READERS) + list(RESULTS_READERS))
@SETTINGS
@given(value=json_values)
def test_random_json_values(reader: str, value: Any) -> None:
    got = _typed(ALL_READERS[reader], json.dumps(value).encode() + b"\n")
    assert _well_refused(got) or _accepted(got), got


# -- mutations of valid files ------------------------------------------------------------------

@pytest.mark.parametrize("reader", list(JSONL_READERS))
@SETTINGS
@given(line=json_mutation(RECORD), where=st.integers(0, 5))
def test_mutated_records(reader: str, line: bytes, where: int) -> None:
    lines = RECORDS.splitlines()
    lines[where] = line
    got = _typed(JSONL_READERS[reader], b"\n".join(lines) + b"\n")
    assert _well_refused(got) or _accepted(got), got
    if isinstance(got, list) and got and isinstance(got[0], SuperstepRecord):
        for r in got:  # what a reader accepts is a record the store and the wire hold
            SuperstepRecord.from_json(json.loads(json.dumps(r.to_json())))


@pytest.mark.parametrize("reader", list(RESULTS_READERS))
@SETTINGS
@given(data=st.data())
def test_mutated_results(reader: str, data: st.DataObject) -> None:
    seed = RESULTS if reader.startswith("predict") else MB_RESULTS
    got = _typed(RESULTS_READERS[reader], data.draw(json_mutation(seed)))
    assert _well_refused(got) or _accepted(got), got


@pytest.mark.parametrize("reader", list(TOML_READERS))
@SETTINGS
@given(data=st.data())
def test_mutated_toml(reader: str, data: st.DataObject) -> None:
    from predictor.costs.profile import dumps

    read, seed = TOML_READERS[reader]
    got = _typed(read, data.draw(toml_mutation(seed, dumps)))
    assert _well_refused(got) or _accepted(got), got


# -- the commands that use what the readers accepted -----------------------------------------

@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_microbench_show_and_predict_on_mutated_files(data: st.DataObject) -> None:
    f = _file(data.draw(json_mutation(MB_RESULTS)))
    assert _exit(microbench_cli.main, ["show", str(f)]) in (0, 2)
    assert _exit(microbench_cli.main, ["show", "--json", str(f)]) in (0, 2)
    r = _file(data.draw(json_mutation(RESULTS)))
    assert _exit(predict_cli.main, ["validate", "--results", str(r), "--profile",
                                    "sgi-power-challenge"]) in (0, 2)


def test_validate_on_results_without_cache_geometry_is_one_line_exit_2(capsys) -> None:
    """Found by the test above in a fresh clone's .ci/run: results whose geometry names no
    cache level (``"geometry": null``), validated by cross-validation (no validation patterns),
    refitted F on them and failed with max() of an empty sequence. Every fit of F now reads
    the levels through one check."""
    doc = {**json.loads(json.dumps(RESULTS)), "geometry": None}
    r = _file(json.dumps(doc).encode())
    assert predict_cli.main(["validate", "--results", str(r), "--profile",
                             "sgi-power-challenge"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no cache geometry (geometry.levels)" in err and len(err.splitlines()) == 1, err


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_predict_with_mutated_profile(data: st.DataObject) -> None:
    from predictor.costs.profile import dumps

    records = _file(RECORDS)
    prof = _file(data.draw(toml_mutation(tomllib.loads(profile_to_toml(
        sgi_power_challenge())), dumps)))
    assert _exit(predict_cli.main, ["--profile", str(prof), "--counters", str(records)]) \
        in (0, 2)
    assert _exit(predict_cli.main, ["profile", str(prof)]) in (0, 2)


# -- the marker spool: damaged lines are skipped, never raised -------------------------------

@SETTINGS
@given(lines=st.lists(json_mutation({"ev": "record", **RECORD}) | st.binary(max_size=60),
                      max_size=6))
def test_spool_collect_never_raises(lines: list[bytes]) -> None:
    d = _dir()
    (d / "1.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    for r in spool_reader.collect(d):
        assert isinstance(r, SuperstepRecord)
