"""Labels live as long as the job (issue 31 item 2): a finished workload's series leave
/metrics after metrics.grace_s, so _other appears only when more workloads than max_jobs
are live at once; counterd_series_dropped_total counts the values folded into _other.
Driven with an explicit clock: nothing here waits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from counterd.daemon import config as config_mod
from counterd.daemon.collector import registry
from counterd.daemon.metrics_state import MetricsState, Workload
from counterd.data.errors import BadInput
from counterd.data.records import SuperstepRecord

UID = 1000


def _records(state: MetricsState, w: Workload, names: tuple[str, ...] = ("step",)) -> None:
    recs = [(SuperstepRecord(run_id=f"r-{w.name}", index=i, name=n, rank=0, pid=1, cpu=0,
                             begin_ns=1000 * i, end_ns=1000 * i + 500), w)
            for i, n in enumerate(names)]
    state.observe_records(recs, 0.001)


def _samples(state: MetricsState) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value)
            for fam in registry(state, process_metrics=False).collect() for s in fam.samples]


def _workloads(state: MetricsState) -> set[tuple[str, str]]:
    return {(lab["uid"], lab["workload"]) for _, lab, _ in _samples(state) if "workload" in lab}


def _value(state: MetricsState, name: str, **labels: str) -> float:
    return next(v for n, lab, v in _samples(state) if n == name and lab == labels)


def _later(state: MetricsState) -> float:
    return time.monotonic() + state.grace_s + 1


def test_finished_jobs_leave_and_later_jobs_never_become_other() -> None:
    st = MetricsState(max_jobs=3, grace_s=30)
    for i in range(10):  # one job at a time, 10 in all: more than max_jobs over the day
        w = Workload(UID, f"job{i}")
        _records(st, w)
        assert _workloads(st) == {(str(UID), f"job{i}")}
        assert st.expire([], now=time.monotonic() + 10) == 0  # within the grace period
        assert st.expire([], now=_later(st)) == 1
    assert _workloads(st) == set()
    assert _value(st, "counterd_series_dropped_total", label="workload") == 0
    assert _value(st, "counterd_workloads_expired_total") == 10


def test_a_connected_client_keeps_its_series_past_the_grace_period() -> None:
    st = MetricsState(grace_s=30)
    live, done = Workload(UID, "long"), Workload(UID, "done")
    _records(st, live)
    _records(st, done)
    assert st.expire([live, Workload(UID + 1, "never-seen")], now=_later(st)) == 1
    assert _workloads(st) == {(str(UID), "long")}


def test_other_only_when_more_than_max_jobs_are_live_and_each_fold_counted_once() -> None:
    st = MetricsState(max_jobs=3, grace_s=30)  # 2 named slots and _other
    live = [Workload(UID, f"live{i}") for i in range(4)]
    for w in live + live:  # the same four twice: two folded names, each counted once
        _records(st, w)
    assert _workloads(st) == {(str(UID), "live0"), (str(UID), "live1"), (str(UID), "_other")}
    assert _value(st, "counterd_series_dropped_total", label="workload") == 2
    st.expire([], now=_later(st))  # all finished: slots and the fold memory are free again
    assert _workloads(st) == set()
    _records(st, Workload(UID, "live2"))  # a name that was folded before: its own slot now
    assert _workloads(st) == {(str(UID), "live2")}


def test_uid_and_superstep_overflow_are_counted() -> None:
    st = MetricsState(max_uids=2, max_superstep_names=2, grace_s=30)
    for uid in (1, 2, 3):  # one named uid and _other: uids 2 and 3 fold
        _records(st, Workload(uid, "w"), names=("a", "b", "c"))  # b and c fold into _other
    dropped = {lab["label"]: v for n, lab, v in _samples(st)
               if n == "counterd_series_dropped_total"}
    assert dropped == {"uid": 2, "workload": 0, "superstep": 4}  # b, c of uid 1 and of _other


def test_the_series_count_returns_to_its_idle_value_after_the_jobs_end() -> None:
    st = MetricsState(grace_s=30)
    idle = len(_samples(st))
    jobs = [Workload(UID, f"j{i}") for i in range(8)]
    for w in jobs:
        _records(st, w, names=tuple(f"s{k}" for k in range(16)))
    busy = len(_samples(st))
    assert busy > idle + 8 * 16
    st.expire([], now=_later(st))
    assert len(_samples(st)) == idle


@pytest.mark.parametrize("grace", ["0.5", "1e9"])
def test_a_grace_period_below_the_sampling_interval_is_refused(grace: str) -> None:
    with pytest.raises(BadInput, match="grace_s"):
        config_mod.load(None, env={"COUNTERD_METRICS_GRACE": grace,
                                   "COUNTERD_SAMPLE_INTERVAL": "1"})


@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"SLURM_JOB_ID": "4242"}, "4242"),
    ({"PBS_JOBID": "17.pbs-server"}, "17.pbs-server"),
    ({"LSB_JOBID": "99", "LSB_JOBINDEX": "3"}, "99[3]"),
    ({"LSB_JOBID": "99", "LSB_JOBINDEX": "0"}, "99"),
    ({"COUNTERD_BATCH_JOB": "mine", "SLURM_JOB_ID": "4242"}, "mine"),
    ({"SLURM_JOB_ID": "bad\x00id"}, None),
])
def test_batch_job_comes_from_the_batch_systems_variables(env: dict[str, str],
                                                          expected: str | None) -> None:
    from counterd.data.env import batch_job

    assert batch_job(env) == expected


def test_hello_keeps_only_a_short_printable_batch_job() -> None:
    from counterd.wire.protocol import MAX_BATCH_JOB, Hello

    assert Hello.decode({"job": "w", "batch_job": "4242"}).batch_job == "4242"
    for bad in ("x" * (MAX_BATCH_JOB + 1), "a\nb", 4242, "", ["1"]):
        assert Hello.decode({"job": "w", "batch_job": bad}).batch_job is None
    assert Hello(job="w", batch_job="7").payload()["batch_job"] == "7"


def test_two_batch_jobs_of_one_workload_name_are_two_series_sets() -> None:
    """Two Slurm jobs of one user running the same program on a shared node: each its own
    series (an info metric joined on uid and workload could not tell them apart)."""
    st = MetricsState(max_jobs=4, grace_s=30)
    _records(st, Workload(UID, "cg", "101"))
    _records(st, Workload(UID, "cg", "102"))
    jobs = {(lab["workload"], lab["batch_job"]) for _, lab, _ in _samples(st)
            if "batch_job" in lab}
    assert jobs == {("cg", "101"), ("cg", "102")}
    st.expire([Workload(UID, "cg", "102")], now=_later(st))  # 101 ended, 102 runs on
    assert {lab["batch_job"] for _, lab, _ in _samples(st) if "batch_job" in lab} == {"102"}


def test_the_daemon_labels_the_batch_job_and_drops_a_finished_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: a marker client inside Slurm job 777 makes batch_job="777" series; once it
    disconnected and metrics.grace_s passed, the loop's housekeeping drops them."""
    import threading
    import urllib.request

    from counterd.daemon.config import Config
    from counterd.daemon.service import Daemon
    from counterd.markers.sinks.socket import SocketSink

    d = Daemon(Config(metrics_listen="127.0.0.1:0", metrics_grace_s=0.3, metrics_refresh_s=0.05,
                      sample_interval_s=0.1, sample_backend="none", store_synchronous="normal",
                      socket_path=tmp_path / "s.sock", store_path=tmp_path / "s.db"))
    d.start()
    loop = threading.Thread(target=d.serve)
    loop.start()
    url = f"http://127.0.0.1:{d.metrics_port}/metrics"
    scrape = lambda: urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: E731
    try:
        monkeypatch.setenv("SLURM_JOB_ID", "777")
        sink = SocketSink(d.config.socket_path, job="bsp")
        sink.record(SuperstepRecord(run_id="r", index=0, name="s", rank=0, pid=1, cpu=0,
                                    begin_ns=0, end_ns=500))
        assert sink.flush(10)
        deadline = time.monotonic() + 5
        while 'batch_job="777"' not in scrape() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f'batch_job="777",superstep="s",uid="{os.getuid()}",workload="bsp"' in scrape()
        time.sleep(1.1)  # connected: kept past the grace period and a housekeeping
        assert 'batch_job="777"' in scrape()
        sink.close()
        deadline = time.monotonic() + 5  # housekeeping runs every second
        while 'batch_job="777"' in scrape() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = scrape()
        assert 'batch_job="777"' not in text
        assert "counterd_workloads_expired_total 1.0" in text
    finally:
        d.request_stop()
        loop.join(30)
