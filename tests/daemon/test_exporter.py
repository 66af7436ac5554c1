"""The Prometheus collector: units, bounded labels, predictions, degradation per event."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from counterd.backends.base import CounterValue, Reading, Target
from counterd.daemon.collector import CounterdCollector, registry
from counterd.daemon.config import WatchRule
from counterd.daemon.metrics_state import MetricsState, Workload
from counterd.daemon.sampling import Sampler
from counterd.data.errors import CounterAccessDenied
from counterd.data.events import Source
from counterd.data.records import SuperstepRecord
from counterd.prediction import Prediction

BSP = Workload(1000, "bsp")  # uid 1000's job "bsp"
W1 = (("uid", "1000"), ("workload", "bsp"))  # its labels


def rec(run: str, index: int, rank: int, begin: int, end: int, name: str = "s",
        loads: float = 100.0) -> SuperstepRecord:
    return SuperstepRecord(run_id=run, index=index, name=name, rank=rank, pid=10 + rank, cpu=0,
                           begin_ns=begin, end_ns=end,
                           counters={"loads": CounterValue(loads, Source.SIMULATED),
                                     "task_clock_ns": CounterValue(2e9, Source.MEASURED, 0.5)})


def samples(state: MetricsState) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry(state, process_metrics=False)).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            # batch_job="" is no label to Prometheus: keyed without it
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items()
                                      if (k, v) != ("batch_job", ""))))] = s.value
    return out


def fake_predict(records: Sequence[SuperstepRecord]) -> Prediction:
    loads = sum(r.counters["loads"].value for r in records)
    return Prediction({"F1": 1e-3, "F2": loads * 1e-6, "F3": 2e-4}, max(1e-3, loads * 1e-6))


def test_units_totals_last_superstep_and_prediction() -> None:
    st = MetricsState()
    st.set_predictor(fake_predict, "fake")
    st.observe_records([(rec("r", 0, 0, 0, 10), BSP),
                        (rec("r", 1, 0, 100, 1_000_100, loads=1500.0), BSP),
                        (rec("r", 1, 1, 200, 2_000_300, loads=1500.0), BSP)], 0.001)
    got = samples(st)
    w = (("superstep", "s"), ("uid", "1000"), ("workload", "bsp"))
    assert got[("counterd_superstep_loads_total", (("source", "simulated"),) + w)] == 3100.0
    assert got[("counterd_superstep_task_clock_seconds_total",
                (("source", "measured"),) + w)] == 6.0  # ns -> seconds
    assert got[("counterd_superstep_duration_seconds_count", w)] == 3
    # last superstep: span max end - min begin over its two processors; work the slowest
    # processor's own time (rank 1: 2_000_100 ns); skew the later begin minus the earlier
    assert abs(got[("counterd_last_superstep_seconds", W1)]
               - 2_000_200e-9) < 1e-12
    assert abs(got[("counterd_last_superstep_work_seconds", W1)]
               - 2_000_100e-9) < 1e-12
    assert abs(got[("counterd_last_superstep_skew_seconds", W1)]
               - 100e-9) < 1e-12
    assert got[("counterd_last_superstep_predicted_seconds", W1)] == 3e-3
    assert got[("counterd_last_superstep_dominating", (("term", "F2"), *W1))] == 1
    assert got[("counterd_last_superstep_dominating", (("term", "F1"), *W1))] == 0
    assert got[("counterd_event_multiplex_ratio", (("counter", "task_clock_ns"),
                                                   ("origin", "superstep"),
                                                   ("uid", "1000"), ("workload", "bsp")))] == 0.5


def test_last_superstep_says_span_and_work_apart() -> None:
    """Processors that begin 50 ms apart for 1 ms of work each: the span gauge says 51 ms and
    that it is the span; the work gauge beside it says 1 ms, the slowest processor's own time,
    which is what the prediction is for; the skew gauge says 50 ms."""
    st = MetricsState()
    st.set_predictor(fake_predict, "fake")
    st.observe_records([(rec("r", 0, 0, 0, 1_000_000), BSP),
                        (rec("r", 0, 1, 50_000_000, 50_900_000), BSP)], 0.001)
    text = generate_latest(registry(st, process_metrics=False)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    span, work, skew, pred = (fams[f"counterd_last_superstep{n}_seconds"] for n in (
        "", "_work", "_skew", "_predicted"))
    assert [f.samples[0].value for f in (span, work, skew)] == pytest.approx(
        [0.0509, 0.001, 0.05])
    assert "span" in span.documentation and "max end - min begin" in span.documentation
    assert "slowest processor's own time" in work.documentation
    assert "counterd_last_superstep_work_seconds" in pred.documentation
    assert "not the span" in fams["counterd_superstep_duration_seconds"].documentation
    # An unfinished superstep has neither span nor work, only its skew so far.
    st.observe_records([(rec("r", 1, 0, 60_000_000, 61_000_000), BSP)], 0.001)
    st.observe_records([(SuperstepRecord(
        run_id="r", index=1, name="s", rank=1, pid=11, cpu=0, begin_ns=60_500_000, end_ns=None,
        flags=frozenset({"incomplete"})), BSP)], 0.001)
    got = samples(st)
    assert ("counterd_last_superstep_seconds", W1) not in got
    assert ("counterd_last_superstep_work_seconds", W1) not in got
    assert got[("counterd_last_superstep_skew_seconds", W1)] == 0.0005


def test_failing_predictor_and_failing_event_give_fewer_samples_not_a_failed_scrape() -> None:
    st = MetricsState()

    def broken(records: Sequence[SuperstepRecord]) -> Prediction:
        raise RuntimeError("model needs l2_misses")

    st.set_predictor(broken, "broken")
    st.observe_records([(rec("r", 0, 0, 0, 10), BSP)], 0.001)
    st.set_available("sampled", {"loads": "no PMU", "task_clock_ns": None})
    got = samples(st)
    assert not any(name.startswith("counterd_last_superstep_predicted") for name, _ in got)
    assert got[("counterd_event_available", (("counter", "loads"), ("origin", "sampled")))] == 0
    assert got[("counterd_event_available",
                (("counter", "task_clock_ns"), ("origin", "sampled")))] == 1


def test_labels_are_bounded() -> None:
    st = MetricsState(max_jobs=3, max_superstep_names=4)
    recs = [(rec(f"r{j}", i, 0, 0, 10, name=f"step{i}"), Workload(1000, f"job{j}"))
            for j in range(10) for i in range(20)]
    st.observe_records(recs, 0.0)
    got = samples(st)
    workloads = {dict(labels)["workload"] for _, labels in got if "workload" in dict(labels)}
    assert workloads == {"job0", "job1", "_other"}
    steps = {dict(labels)["superstep"] for name, labels in got
             if name == "counterd_superstep_duration_seconds_count"
             and dict(labels)["workload"] == "job0"}
    assert steps == {"step0", "step1", "step2", "_other"}
    # nothing is dropped, only folded
    total = sum(v for (name, _), v in got.items()
                if name == "counterd_superstep_duration_seconds_count")
    assert total == 200


def _series(got: dict[tuple[str, tuple[tuple[str, str], ...]], float], uid: str
            ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in got.items() if ("uid", uid) in k[1]}


def test_each_uid_has_its_own_slots_and_series() -> None:
    """Issue 29 item 4: one user's 40 job names fold into its own ``_other`` and leave
    another user's job its name; the same job name from two users is two series, so an
    attacker's record of end 3600 s leaves the victim's last-superstep gauges as they were."""
    st = MetricsState(max_jobs=32)
    victim = Workload(65533, "victimjob")
    st.observe_records([(rec("v", 0, 0, 0, 2_000_000), victim)], 0.0)
    before = _series(samples(st), "65533")
    assert before[("counterd_last_superstep_seconds",
                   (("uid", "65533"), ("workload", "victimjob")))] == 0.002
    st.observe_records([(rec(f"a{j}", 0, 0, 0, 10), Workload(65534, f"job{j}"))
                        for j in range(40)], 0.0)
    st.observe_records([(rec("a", 0, 0, 0, 3_600_000_000_000), Workload(65534, "victimjob"))],
                       0.0)
    got = samples(st)
    assert _series(got, "65533") == before
    attacker = {dict(labels)["workload"] for _, labels in _series(got, "65534")}
    assert len(attacker) == 32 and "_other" in attacker and "victimjob" not in attacker
    st.observe_records([(rec("v", 1, 0, 0, 1_000_000), Workload(65533, "secondjob"))], 0.0)
    assert ("counterd_last_superstep_seconds",
            (("uid", "65533"), ("workload", "secondjob"))) in samples(st)


def test_uids_are_bounded_and_the_config_is_not_counted() -> None:
    """At most ``max_uids`` uid label values (the last ``_other``); watch rules (uid "") come
    on top, whenever they first appear."""
    st = MetricsState(max_uids=3)
    st.observe_records([(rec(f"r{u}", 0, 0, 0, 10), Workload(u, "j")) for u in range(1000, 1010)],
                       0.0)
    st.observe_samples(Workload(None, "web"), {"loads": 1.0}, {}, threads=1)
    got = samples(st)
    uids = {dict(labels)["uid"] for _, labels in got if "uid" in dict(labels)}
    assert uids == {"1000", "1001", "_other", ""}
    assert got[("counterd_superstep_duration_seconds_count",
                (("superstep", "s"), ("uid", "_other"), ("workload", "j")))] == 8


class _Group:
    def __init__(self, values: dict[str, float], fail: bool = False) -> None:
        self.values = values
        self.fail = fail
        self.closed = False

    def read(self) -> Reading:
        if self.fail:
            raise OSError(5, "EIO")
        return Reading({k: CounterValue(v, Source.MEASURED, 0.8) for k, v in self.values.items()})

    def close(self) -> None:
        self.closed = True


def test_sampler_aggregates_threads_per_job_and_survives_failures(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    for pid, tids, comm in ((100, (100, 101, 102), "worker"), (200, (200,), "other"),
                            (300, (300,), "worker")):
        for tid in tids:
            (proc / str(pid) / "task" / str(tid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        (proc / str(pid) / "status").write_text(f"Name:\t{comm}\nUid:\t0\t0\t0\t0\n")
    errors: list[str] = []

    def open_group(events: tuple[str, ...], target: Target) -> _Group:
        if target.tid == 102:
            raise CounterAccessDenied("loads", "tid 102", "paranoid")
        return _Group({"loads": 10.0 * target.tid}, fail=target.pid == 300)

    sampler = Sampler(("loads",), open_group, procfs=proc, on_error=errors.append)
    me, w = Workload(1000, "me"), Workload(None, "w")
    targets = sampler.discover([WatchRule(job="w", comm="^worker$")], {os.getpid(): me})
    assert targets == {100: w, 300: w, os.getpid(): me}
    out = sampler.sample({100: w, 300: w})
    totals, ratios, threads = out[w]
    assert totals == {"loads": 1000.0 + 1010.0}  # tid 102 refused, pid 300 unreadable
    assert ratios == {"loads": 0.8} and threads == 3
    assert sorted(set(errors)) == ["CounterAccessDenied", "read"]
    # thread 101 exits: its final count stays in the job's total (monotonic counter)
    (proc / "100" / "task" / "101").rmdir()
    totals, _, threads = sampler.sample({100: w, 300: w})[w]
    assert totals == {"loads": 2010.0} and threads == 2


def test_collector_alone_never_raises_on_empty_state() -> None:
    list(CounterdCollector(MetricsState()).collect())


def test_every_seconds_metric_says_seconds_in_its_help() -> None:
    """A ..._seconds(_total) family holds seconds and its HELP says so, never "ns"."""
    st = MetricsState()
    st.set_predictor(fake_predict, "fake")
    st.observe_records([(rec("r", 0, 0, 0, 1_000_000), BSP)], 0.001)
    st.observe_samples(BSP, {"task_clock_ns": 3e9, "loads": 5.0},
                       {"task_clock_ns": 1.0, "loads": 1.0}, threads=1)
    text = generate_latest(registry(st, process_metrics=False)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    timed = [n for n in fams if n.endswith("_seconds")]
    assert {"counterd_superstep_task_clock_seconds", "counterd_sampled_task_clock_seconds",
            "counterd_superstep_duration_seconds", "counterd_last_superstep_seconds",
            "counterd_last_superstep_work_seconds", "counterd_last_superstep_skew_seconds",
            "counterd_last_superstep_predicted_seconds", "counterd_last_superstep_term_seconds",
            "counterd_store_commit_seconds"} <= set(timed)
    for name in timed:
        doc = fams[name].documentation
        assert "seconds" in doc and "(ns)" not in doc and " ns" not in doc, (name, doc)
    assert "# HELP counterd_sampled_task_clock_seconds_total watched processes: CPU time of " \
           "the target (kernel task clock) (seconds)" in text
    assert fams["counterd_sampled_task_clock_seconds"].samples[0].value == 3.0


def test_superstep_durations_are_a_histogram_with_buckets_from_10us_to_10s() -> None:
    """Issue 34: a summary without quantiles gave dashboards no p99 and does not aggregate
    across nodes. Each record that ended is one observation in the bucket of its own time
    (le inclusive); one that never ended is not observed."""
    from counterd.daemon.metrics_state import DURATION_BUCKETS_S

    assert DURATION_BUCKETS_S[0] == pytest.approx(1e-5) and DURATION_BUCKETS_S[-1] == 10.0
    assert all(b / a <= 2.5 + 1e-9 for a, b in zip(DURATION_BUCKETS_S[:-1], DURATION_BUCKETS_S[1:],
                                                   strict=True))
    st = MetricsState()
    ends = (10_000, 12_000, 1_000_000, 3_000_000, 20_000_000_000)  # 10 us ... 20 s, begin 0
    st.observe_records([(rec("r", i, 0, 0, e), BSP) for i, e in enumerate(ends)], 0.0)
    st.observe_records([(SuperstepRecord(run_id="r", index=9, name="s", rank=0, pid=1, cpu=0,
                                         begin_ns=0, end_ns=None,
                                         flags=frozenset({"incomplete"})), BSP)], 0.0)
    got = samples(st)
    w = (("superstep", "s"), ("uid", "1000"), ("workload", "bsp"))

    def le(bound: str) -> float:
        return got[("counterd_superstep_duration_seconds_bucket", (("le", bound),) + w)]

    assert le("1e-05") == 1 and le("2.5e-05") == 2 and le("0.001") == 3
    assert le("0.0025") == 3 and le("0.005") == 4 and le("10.0") == 4 and le("+Inf") == 5
    assert got[("counterd_superstep_duration_seconds_count", w)] == 5
    assert got[("counterd_superstep_duration_seconds_sum", w)] == pytest.approx(
        sum(ends) / 1e9)
    text = generate_latest(registry(st, process_metrics=False)).decode()
    assert "# TYPE counterd_superstep_duration_seconds histogram" in text


def test_labelled_counters_are_exported_at_zero_before_their_first_increment() -> None:
    """Issue 34: labelled counters appeared only once non-zero, hiding their first increase
    from rate(). Every known reason, and every record flag of a workload, is there at 0."""
    from counterd.daemon.collector import KNOWN_REASONS
    from counterd.data.records import FLAGS

    st = MetricsState()
    st.observe_records([(rec("r", 0, 0, 0, 10), BSP)], 0.0)
    st.count("protocol_errors", "bad_seq", 2)
    got = samples(st)
    for family, table in (("counterd_records_refused_total", "refused"),
                          ("counterd_protocol_errors_total", "protocol_errors"),
                          ("counterd_sample_errors_total", "sample_errors")):
        for reason in KNOWN_REASONS[table]:
            value = got[(family, (("reason", reason),))]
            assert value == (2 if reason == "bad_seq" else 0), (family, reason)
    for flag in FLAGS:
        assert got[("counterd_supersteps_flagged_total",
                    (("flag", flag), ("uid", "1000"), ("workload", "bsp")))] == 0
