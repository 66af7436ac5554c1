"""Clock domains (issue 32 item 2): anchors, the monotonic-to-realtime mapping and its
bound, the domain's JSON line, and the one counterd record writes ahead of its records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from counterd.data.clocks import (
    Anchor,
    ClockDomain,
    local_domain,
    take_anchor,
    time_namespace,
)
from counterd.data.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]


def domain(*anchors: Anchor) -> ClockDomain:
    return ClockDomain("r", "h", "b", "t", anchors)


def test_an_anchor_brackets_its_realtime_read() -> None:
    m1 = time.monotonic_ns()
    a = take_anchor()
    m2 = time.monotonic_ns()
    assert m1 <= a.mono_ns <= m2 and 0 < a.read_ns <= m2 - m1 + 1
    # realtime minus monotonic is this process's offset between the clocks, to the read
    off = time.time_ns() - time.monotonic_ns()
    assert abs(a.offset_ns - off) < 50_000_000


def test_mapping_between_anchors_of_one_offset_is_off_by_half_the_read() -> None:
    d = domain(Anchor(1000, 5000, 10), Anchor(9000, 13000, 20))
    assert d.to_real(1000) == (5000, 5, True)  # at an anchor: its own read
    assert d.to_real(4000) == (8000, 10, True)  # the wider read of the two around it


def test_a_clock_step_between_anchors_puts_the_time_midway_with_half_the_step() -> None:
    d = domain(Anchor(1000, 5000, 10), Anchor(9000, 13600, 10), Anchor(20000, 24600, 10))
    real, err, inside = d.to_real(5000)
    assert real == 5000 + 4300 and err == 300 + 5 and inside
    assert d.to_real(15000) == (19600, 5, True)  # after the step: its anchors agree


def test_times_outside_the_anchors_use_the_nearest_and_say_so() -> None:
    d = domain(Anchor(1000, 5000, 10), Anchor(9000, 13600, 10))
    assert d.to_real(500) == (4500, 5, False)
    assert d.to_real(10_000) == (14600, 5, False)
    assert domain(Anchor(1000, 5000, 10)).to_real(1000)[2] is False  # one anchor brackets nothing


def test_a_domain_survives_its_json_line() -> None:
    d = ClockDomain("job", "node1", "b", "time:[9]", (Anchor(1, 2, 3), Anchor(4, 5, 6)),
                    7000, "slurm")
    assert ClockDomain.from_json(json.loads(json.dumps(d.to_json()))) == d
    no_bound = ClockDomain("job", "n", "b", "", (Anchor(1, 2, 3),))
    assert "sync_bound_ns" not in no_bound.to_json()
    assert ClockDomain.from_json(no_bound.to_json()) == no_bound


@pytest.mark.parametrize("change,said", [
    ({"version": 2}, "version 2"),
    ({"run_id": ""}, "without a run_id"),
    ({"host": 5}, "host is not a string"),
    ({"run_id_source": "guess"}, "run_id_source 'guess'"),
    ({"anchors": []}, "anchors are not a list of 1 to"),
    ({"anchors": [[1, 2]]}, "is not [mono_ns, real_ns, read_ns]"),
    ({"anchors": [[1, 2, True]]}, "is not [mono_ns, real_ns, read_ns]"),
    ({"anchors": [[-1, 2, 3]]}, "out of range"),
    ({"anchors": [[1, 2, 2 * 10**9]]}, "out of range"),
    ({"anchors": [[5, 2, 3], [5, 9, 3]]}, "increasing"),
    ({"sync_bound_ns": -1}, "sync_bound_ns -1"),
    ({"boot_id": "x" * 65}, "boot_id is not a string"),
])
def test_a_bad_domain_line_is_bad_input(change: dict[str, object], said: str) -> None:
    d = {**ClockDomain("job", "n", "b", "", (Anchor(1, 2, 3),)).to_json(), **change}
    with pytest.raises(BadInput) as exc:
        ClockDomain.from_json(d)
    assert said in str(exc.value)


def test_the_local_domain_is_this_kernels_and_namespaces() -> None:
    a, b = take_anchor(), take_anchor()
    d = local_domain("r", [b, a, a], "recorder")
    assert d.anchors == tuple(sorted({a, b}, key=lambda x: x.mono_ns))
    assert d.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert d.timens == time_namespace() and d.host == os.uname().nodename
    assert d.sync_bound_ns is None or d.sync_bound_ns >= 0


def test_counterd_record_writes_its_nodes_clock_domain_first(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record", "--backend",
                           "none",
                           "--out", str(out), "--", sys.executable, "-c", "pass"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, *rest = [json.loads(line) for line in out.read_text().splitlines()]
    d = ClockDomain.from_json(first)
    (rec,) = rest
    assert d.run_id == rec["run_id"] and d.run_id_source == "recorder"
    assert d.host == rec["host"] == os.uname().nodename
    assert len(d.anchors) >= 2  # before the command and after it
    for t in (rec["begin_ns"], rec["end_ns"]):
        assert d.to_real(t)[2]  # the record lies between the anchors
    # a run id given to the recorder is said to be given
    env["COUNTERD_RUN_ID"] = "job-7"
    proc = subprocess.run([sys.executable, "-m", "counterd.commands.cli", "record", "--backend",
                           "none",
                           "--out", str(out), "--", sys.executable, "-c", "pass"],
                          env=env, capture_output=True, text=True, timeout=60)
    first = json.loads(out.read_text().splitlines()[0])
    assert (first["run_id"], first["run_id_source"]) == ("job-7", "given")


def test_the_recorder_anchors_periodically_while_its_command_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from counterd.commands import recording

    monkeypatch.setattr(recording, "ANCHOR_PERIOD_S", 0.1)
    monkeypatch.delenv("COUNTERD_RUN_ID", raising=False)
    result = recording.record([sys.executable, "-c", "import time; time.sleep(0.6)"],
                              out=tmp_path / "r.jsonl", backend="none")
    d = result.domain
    assert d is not None and len(d.anchors) >= 4  # start, some periodic ones, end
    gaps = [b.mono_ns - a.mono_ns for a, b in zip(d.anchors, d.anchors[1:], strict=False)]
    assert max(gaps) < 500_000_000  # none missed for long while the command ran
