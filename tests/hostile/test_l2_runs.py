"""The files of ``predict --pilot``'s L2 runs (predictor.pilot.regime) in a directory others can
write (``--keep DIR``): a planted link is replaced, never followed; a run or a plan that is a
link or another user's is not trusted (the runs are made again); a damaged plan is one error."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from predictor.errors import BadInput
from predictor.pilot import campaign
from predictor.pilot.campaign import cache_runs
from predictor.pilot.regime import load_regime, plan_path, run_path
from tests import machine_files
from tests.predictor.test_pilot import SIZES, _run, _write_records

TARGET = 2e6


def _runs():
    rng = np.random.default_rng(5)
    return [_run(n, rng) for n in SIZES]


def _fake_record_run(made: list[Path]):
    """record_run as the L2 runs call it, writing the records of a run of the synthetic
    program's two supersteps instead of running anything."""
    def record_run(template, n, backend, out, *, what, cpu_features="auto", extra=()):
        assert backend == "callgrind" and "--prefetch" in extra
        _write_records(Path(out), [("count elements", 1e6), ("move elements", 1e6)])
        made.append(Path(out))
        return []
    return record_run


def test_planted_links_are_replaced_not_followed(tmp_path: Path, monkeypatch) -> None:
    """Another user links the names the L2 runs write (the machine files, the plan) to a file
    of the victim: the victim's file is left as it was, the names become the campaign's own."""
    made: list[Path] = []
    monkeypatch.setattr(campaign, "record_run", _fake_record_run(made))
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    keep = tmp_path / "keep"
    keep.mkdir()
    m = machine_files.load("intel-2cpu-300m")
    host = m.levels[1].size_bytes
    for name in (f"l2-{host}.toml", f"l2-{host // 4}.toml", plan_path(keep, TARGET).name):
        (keep / name).symlink_to(victim)
    cache_runs("prog {n}", _runs(), TARGET, workdir=keep, machine=m)
    assert victim.read_text() == "precious\n"
    assert not (keep / f"l2-{host}.toml").is_symlink()
    assert not plan_path(keep, TARGET).is_symlink()
    assert len(made) == 2


def test_a_planted_run_is_not_trusted(tmp_path: Path, monkeypatch) -> None:
    """A record file already at an L2 run's name but a link is run again; the plan that names
    runs which are links is not read (no regime, not another's counts)."""
    made: list[Path] = []
    monkeypatch.setattr(campaign, "record_run", _fake_record_run(made))
    m = machine_files.load("intel-2cpu-300m")
    host = m.levels[1].size_bytes
    forged = tmp_path / "forged.jsonl"
    _write_records(forged, [("count elements", 1e6), ("move elements", 1e6)])
    run_path(tmp_path, SIZES[-1], host).symlink_to(forged)
    cache_runs("prog {n}", _runs(), TARGET, workdir=tmp_path, machine=m)
    assert run_path(tmp_path, SIZES[-1], host) in made  # run again, not reused
    plan = json.loads(plan_path(tmp_path, TARGET).read_text())
    os.replace(plan_path(tmp_path, TARGET), tmp_path / "real-plan")
    plan_path(tmp_path, TARGET).symlink_to(tmp_path / "real-plan")
    assert plan["size"] == SIZES[-1]
    assert load_regime(tmp_path, _runs(), TARGET) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another uid")
def test_another_users_run_is_not_trusted(tmp_path: Path, monkeypatch) -> None:
    made: list[Path] = []
    monkeypatch.setattr(campaign, "record_run", _fake_record_run(made))
    m = machine_files.load("intel-2cpu-300m")
    host = m.levels[1].size_bytes
    theirs = run_path(tmp_path, SIZES[-1], host)
    _write_records(theirs, [("count elements", 1e6), ("move elements", 1e6)])
    os.chown(theirs, 65534, 65534)
    cache_runs("prog {n}", _runs(), TARGET, workdir=tmp_path, machine=m)
    assert theirs in made


@pytest.mark.parametrize("garbage", [b"\x00\xff" * 100, b"{" * 10_000, b'{"size": "x"}',
                                     b'{"size": 1e400, "target": 1, "growth": 1, '
                                     b'"host_bytes": 1, "scaled_bytes": 1}'])
def test_a_garbage_plan_is_one_clear_error(tmp_path: Path, garbage: bytes) -> None:
    plan_path(tmp_path, TARGET).write_bytes(garbage)
    with pytest.raises(BadInput) as got:
        load_regime(tmp_path, _runs(), TARGET)
    assert "\n" not in str(got.value.what) and got.value.fix
