from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from counterd.backends.base import CounterValue, Reading
from counterd.data.errors import BadInput
from counterd.data.events import Source
from counterd.data.records import SuperstepRecord, read_jsonl, write_jsonl
from counterd.util.fsutil import atomic_write_text


def _rec(**kw: object) -> SuperstepRecord:
    base: dict[str, object] = dict(run_id="r", index=0, name="s", rank=0, pid=1, cpu=0,
                                   begin_ns=100, end_ns=250)
    base.update(kw)
    return SuperstepRecord(**base)  # type: ignore[arg-type]


def test_json_roundtrip_is_exact(tmp_path: Path) -> None:
    rec = _rec(counters={"loads": CounterValue(1e6, Source.SIMULATED),
                         "task_clock_ns": CounterValue(2000.0, Source.MEASURED, 0.5, 1000)},
               params={"n": 7}, flags=frozenset({"multiplexed"}))
    path = tmp_path / "r.jsonl"
    assert write_jsonl([rec, _rec(index=1)], path) == 2
    back = list(read_jsonl(path))
    assert back[0] == rec
    assert back[0].duration_ns == 150
    assert back[0].multiplex_ratio == 0.5


def test_validation_rejects_bad_records() -> None:
    with pytest.raises(ValueError, match="before begin"):
        _rec(end_ns=50)
    with pytest.raises(ValueError, match="incomplete"):
        _rec(end_ns=None)
    with pytest.raises(ValueError, match="unknown flags"):
        _rec(flags=frozenset({"weird"}))
    with pytest.raises(ValueError, match="not a finite count"):
        _rec(counters={"loads": CounterValue(float("nan"), Source.MEASURED)})
    with pytest.raises(ValueError, match="not a finite count"):
        _rec(counters={"loads": CounterValue(-5.0, Source.MEASURED)})
    with pytest.raises(ValueError, match="outside"):
        _rec(index=1 << 63)
    with pytest.raises(ValueError, match="outside 32 bits"):
        _rec(cpu=1 << 31)


@pytest.mark.parametrize(("field", "value", "why"), [
    ("index", 10**30, "outside"), ("index", 1.5, "not an integer"), ("index", True,
                                                                       "not an integer"),
    ("begin_ns", "0", "not an integer"), ("run_id", 7, "not a string"),
    ("counters", [], "not an object"), ("counters", {"loads": 5}, "not an object"),
    ("counters", {"loads": {"value": -5, "source": "measured"}}, "finite count"),
    ("params", {"x": [1]}, "not a bool"), ("params", {"x": 2**70}, "beyond 64 bits"),
    ("flags", "incomplete", "not a list"), ("unsupported", {"x": 1}, "strings"),
])
def test_from_json_checks_every_field(field: str, value: object, why: str) -> None:
    d = _rec().to_json()
    d[field] = value
    with pytest.raises(BadInput, match=why):
        SuperstepRecord.from_json(d)


@pytest.mark.parametrize("line", [b"[1, 2]", b'{"format": 1, "begin_ns": 1e400}', b"\xff\xfe",
                                  b"[" * 100000, b'{"format": 1, "run_id": "\\ud800"}'])
def test_read_jsonl_refuses_a_bad_line_naming_it(tmp_path: Path, line: bytes) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(json.dumps(_rec().to_json()).encode() + b"\n" + line + b"\n")
    with pytest.raises(BadInput, match=r"x.jsonl:2: "):
        list(read_jsonl(path))


def test_unknown_format_version_is_rejected(tmp_path: Path) -> None:
    d = _rec().to_json()
    d["format"] = 99
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(d) + "\n")
    with pytest.raises(BadInput, match="format 99"):
        list(read_jsonl(path))


def test_reading_delta_scales_raw_deltas_by_the_span() -> None:
    # A counter that ran half of the span: raw delta 100 -> scaled 200, ratio 0.5.
    a = Reading({"cycles": CounterValue(0.0, Source.MEASURED, 1.0, 1000)}, 1000, 1000)
    b = Reading({"cycles": CounterValue(0.0, Source.MEASURED, 1.0, 1100)}, 1400, 1200)
    d = b.delta(a)["cycles"]
    assert d.raw == 100
    assert d.value == pytest.approx(100 * 400 / 200)
    assert d.ratio == pytest.approx(0.5)


def test_atomic_write_leaves_no_partial_file_on_full_disk(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(BadInput, match="No space left"):
        atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_write_respects_the_umask(tmp_path: Path, mask: int, mode: int) -> None:
    import os
    import stat

    from counterd.util.fsutil import umask

    old = os.umask(mask)
    try:
        assert umask() == mask
        atomic_write_text(tmp_path / "out.txt", "x\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out.txt").stat().st_mode) == mode


def test_an_exception_text_is_kept_and_older_records_still_read(tmp_path: Path) -> None:
    """Issue 34: a superstep that raised was flagged without what it raised. The record keeps
    "<type>: <message>" on one line; a record without it (every recorder before) reads as
    before, and the key is absent when unset, so older readers read new records unchanged."""
    from counterd.data.records import exception_text

    try:
        raise ValueError("bad input 42\nsecond line")
    except ValueError as exc:
        text = exception_text(exc)
    assert text == "ValueError: bad input 42\\nsecond line"
    raised = _rec(flags=frozenset({"exception"}), exception=text)
    plain = _rec(index=1)
    f = tmp_path / "r.jsonl"
    write_jsonl([raised, plain], f)
    assert list(read_jsonl(f)) == [raised, plain]
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    assert lines[0]["exception"] == text and "exception" not in lines[1]
    with pytest.raises(ValueError, match="needs the flag 'exception'"):
        _rec(exception=text)
    old = {k: v for k, v in raised.to_json().items() if k != "exception"}
    assert SuperstepRecord.from_json(old).exception is None
    with pytest.raises(BadInput, match="exception is int"):
        SuperstepRecord.from_json({**raised.to_json(), "exception": 3})
