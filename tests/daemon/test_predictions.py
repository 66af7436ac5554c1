"""Predictions through the daemon: a superstep with memory counters is predicted on /metrics;
one with software events only says why, once, with the action that supplies them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon.conftest import ROOT, DaemonProc


@pytest.fixture
def predicting_daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path / "d", extra='[predictor]\nprofile = "sgi-power-challenge"\n')
    d.start()
    yield d
    if d.alive():
        d.stop()


def _run(code: str, d: DaemonProc, job: str) -> None:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                         env=d.env(COUNTERD_JOB=job), text=True,
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr


def _samples(d: DaemonProc, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(d.metrics()):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted((k, v) for k, v in s.labels.items()
                                 if (k, v) != ("batch_job", "")))] = s.value
    return out


def _wait(cond, what: str, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_declared_streams_are_predicted_and_software_events_say_why(
        predicting_daemon: DaemonProc) -> None:
    d = predicting_daemon
    _run("""
        import counterd
        from counterd.markers.api import recorder
        from counterd.sim import StridedStream
        counterd.configure(backend="sim")
        with counterd.superstep("stream", n=4096) as step:
            step.feed(StridedStream(1 << 30, 4096, 64, "load"))
        assert recorder().sink.flush(10)
    """, d, "streams")
    _run("""
        import counterd
        from counterd.markers.api import recorder
        counterd.configure(backend="none")
        with counterd.superstep("no counters"):
            sum(range(10000))
        assert recorder().sink.flush(10)
    """, d, "software")
    predicted = _wait(lambda: _samples(d, "counterd_last_superstep_predicted_seconds"),
                      "a predicted superstep")
    me = ("uid", str(os.getuid()))
    assert predicted[(me, ("workload", "streams"))] > 0
    assert (me, ("workload", "software")) not in predicted
    unpredicted = _wait(lambda: _samples(d, "counterd_last_superstep_unpredicted"),
                        "the reason for the missing prediction")
    assert unpredicted == {(("reason", "no_memory_counters"), me, ("workload", "software")): 1.0}
    # Said once in the log, with the action that supplies memory counters.
    log = d.log_text()
    assert log.count("has no memory-hierarchy counters") == 1
    assert "counterd record --backend callgrind" in log
