"""The Prometheus families /metrics shows: a custom Collector over a snapshot of
:class:`~counterd.daemon.metrics_state.MetricsState` at each scrape (the labels and their
bounds are said there).

Names carry units and ``_total`` (``counterd_superstep_task_clock_seconds_total``); counts of
things are named for the thing (``..._l1d_misses_total``); writebacks say their unit, cache
lines (seed 004 counted quadwords). Labels are bounded.

Other labels: ``superstep`` (the superstep name; at most ``max_superstep_names`` per
workload, then ``_other``), ``counter``, ``source``, ``origin``, ``term``, ``flag`` and
``reason`` from fixed sets. Raw pids are never labels unless ``export_pids`` is set.

Families (``<c>`` is a canonical counter with its unit, e.g. ``loads``, ``task_clock_seconds``;
``workload`` stands for the pair ``uid, workload``):

* ``counterd_superstep_<c>_total{workload,superstep,source}``  summed over committed records
* ``counterd_superstep_duration_seconds{workload,superstep}``   histogram of each processor's
  own time (one observation per record that ended: its end minus its begin; not the span),
  buckets :data:`DURATION_BUCKETS_S` (10 us to 10 s, 1-2.5-5 per decade), so that quantiles
  (``histogram_quantile(0.99, ...)``) aggregate across nodes. A summary without quantiles
  until issue 34: ``_count`` and ``_sum`` keep their names; ``_count`` no longer counts records
  that never ended (``counterd_supersteps_flagged_total{flag="incomplete"}`` does)
* ``counterd_supersteps_flagged_total{workload,flag}``          every record flag, 0 until seen
* ``counterd_last_superstep_seconds{workload}``                 span of the job's last superstep
  (max end - min begin over its processors: the work plus at most the start skew)
* ``counterd_last_superstep_work_seconds{workload}``            work of the job's last superstep
  (its slowest processor's own time): what F predicts (counterd.report.model says why)
* ``counterd_last_superstep_skew_seconds{workload}``            start skew of the job's last
  superstep (the last processor's begin minus the first one's)
* ``counterd_last_superstep_predicted_seconds{workload}``,
  ``counterd_last_superstep_term_seconds{workload,term}``,
  ``counterd_last_superstep_dominating{workload,term}`` (1 for the dominating term), when a
  machine profile is configured; ``counterd_last_superstep_unpredicted{workload,reason}`` (1)
  when it is and the superstep cannot be predicted, the reason from a fixed set
  (counterd.prediction.NO_PREDICTION_REASONS: e.g. no memory-hierarchy counters, and the
  action that supplies them), also logged once per reason
* ``counterd_sampled_<c>_total{workload}``                      watched processes, per job
* ``counterd_event_available{counter,origin}``           1 or 0
* ``counterd_event_multiplex_ratio{workload,counter,origin}`` last time_running/time_enabled
* ``counterd_watched_threads{workload}``, ``counterd_clients``, ``counterd_records_stored_total``,
  ``counterd_records_refused_total{reason}``, ``counterd_protocol_errors_total{reason}``,
  ``counterd_store_commit_seconds`` (summary), ``counterd_sample_errors_total{reason}``,
  ``counterd_metrics_refused_total{reason}`` (scrapers refused: :mod:`scrape_access`); the
  reasons of these four are exported at 0 before their first increment
  (:data:`KNOWN_REASONS`), so that ``rate()`` and alerts see a series from the start
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from counterd.daemon.metrics_state import DURATION_BUCKETS_S, WORKLOAD, MetricsState
from counterd.data.events import BY_NAME
from counterd.data.records import FLAGS
from counterd.data.units import NS_PER_S, is_time
from counterd.prediction import NO_PREDICTION_REASONS, TERMS, NoPrediction

_BUCKET_LE = tuple(floatToGoString(b) for b in DURATION_BUCKETS_S)

# The label values of the labelled counters that exist before their first increment: exported
# at 0 (a counter that appears only once non-zero hides its first increase from rate()).
KNOWN_REASONS: dict[str, tuple[str, ...]] = {
    "refused": ("malformed", "quota", "store"),
    # ProtocolError codes and the daemon's own violations (session, server)
    "protocol_errors": (
        "bad_begin", "bad_buffer", "bad_close", "bad_context", "bad_frame", "bad_json",
        "bad_order", "bad_query", "bad_read", "bad_record", "bad_reply", "bad_seq",
        "bad_type", "forbidden", "idle", "internal", "no_file_descriptors", "no_hello",
        "no_such_process", "no_such_run", "oversized", "quota", "refused", "slow_reader",
        "stalled", "too_many_clients", "too_many_contexts", "too_many_open", "too_much_held",
        "truncated", "unavailable", "unknown_begin", "unknown_context", "version"),
    # a failed read, or the error that kept a watched thread from being counted (sampling)
    "sample_errors": ("read", "BackendUnavailable", "CounterAccessDenied",
                      "EventNotSupported"),
    # scrape connections refused or closed (counterd.daemon.scrape_access)
    "metrics_refused": ("busy", "not_allowed", "timeout", "tls", "unauthorized"),
}


def metric_fragment(counter: str) -> tuple[str, float]:
    """(name fragment with unit, scale to that unit) for a canonical counter."""
    if is_time(counter):
        return counter[:-3] + "_seconds", 1 / NS_PER_S
    if counter.endswith("_writebacks"):
        return counter + "_lines", 1.0
    return counter, 1.0


def _help(counter: str) -> str:
    """The counter's description and the unit of the exported value (seconds for a counter
    recorded in nanoseconds: :func:`metric_fragment` scales it)."""
    c = BY_NAME.get(counter)
    if c is None:
        return counter
    return f"{c.description} ({'seconds' if is_time(counter) else c.unit})"



class CounterdCollector(Collector):
    """Builds the families from a snapshot of :class:`MetricsState` at each scrape."""

    def __init__(self, state: MetricsState) -> None:
        self.state = state

    def _predictions(self) -> None:
        """Predict the last superstep of every job whose last superstep changed (outside the
        scrape's lock on the records; a predictor error means no prediction, never a failed
        scrape)."""
        st = self.state
        with st.lock:
            fn = st.predict
            todo = [s.last for s in st.jobs.values()
                    if s.last is not None and not s.last.predicted]
            work = [(last, list(last.records)) for last in todo]
        for last, records in work:
            pred, why = None, ""
            if fn is None:
                pass
            elif not all(r.end_ns is not None for r in records):
                why = "incomplete"
            else:
                try:
                    pred = fn(records)
                except Exception as exc:
                    why = exc.code if isinstance(exc, NoPrediction) else "error"
                    st.log_once(why, "no prediction for %s superstep %d: %s", last.run_id,
                                last.index, exc)
            with st.lock:
                last.prediction = pred
                last.no_prediction = why
                last.predicted = True

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | SummaryMetricFamily
                                  | HistogramMetricFamily]:
        self._predictions()
        st = self.state
        with st.lock:
            jobs = {job: (dict(s.steps), dict(s.flags), dict(s.ratios), s.last,
                          dict(s.sampled), dict(s.sampled_by_pid), s.threads)
                    for job, s in st.jobs.items()}
            steps_copy = {job: {n: (list(v.buckets), v.duration_sum_s, dict(v.counters))
                                for n, v in j[0].items()} for job, j in jobs.items()}
            available = dict(st.available)

            def known(table: str) -> dict[str, int]:
                return {**dict.fromkeys(KNOWN_REASONS[table], 0), **getattr(st, table)}

            refused, perrors = known("refused"), known("protocol_errors")
            serrors, mrefused = known("sample_errors"), known("metrics_refused")
            dropped = {**dict.fromkeys(("uid", "workload", "superstep"), 0), **st.series_dropped}
            expired = st.series_expired
            scalars = (st.clients, st.records_stored, st.commit_count, st.commit_sum_s)
        yield from self._superstep_families(steps_copy)
        flagged = CounterMetricFamily("counterd_supersteps_flagged",
                                      "superstep records carrying a flag",
                                      labels=[*WORKLOAD, "flag"])
        last_s = GaugeMetricFamily("counterd_last_superstep_seconds",
                                   "span of the job's last superstep: max end - min begin over "
                                   "its processors, which holds their start skew and waiting "
                                   "(seconds; its work is counterd_last_superstep_work_seconds)",
                                   labels=WORKLOAD)
        work_s = GaugeMetricFamily("counterd_last_superstep_work_seconds",
                                   "work of the job's last superstep: its slowest processor's "
                                   "own time, end minus begin, without start skew (seconds; "
                                   "what counterd_last_superstep_predicted_seconds predicts)",
                                   labels=WORKLOAD)
        skew_s = GaugeMetricFamily("counterd_last_superstep_skew_seconds",
                                   "start skew of the job's last superstep: its last "
                                   "processor's begin minus its first one's (seconds)",
                                   labels=WORKLOAD)
        pred_s = GaugeMetricFamily("counterd_last_superstep_predicted_seconds",
                                   "predicted time F = max(F1, F2, F3) of the job's last "
                                   "superstep, to compare with its work "
                                   "counterd_last_superstep_work_seconds (Amato et al., "
                                   "Predicting performance on SMPs; seconds)",
                                   labels=WORKLOAD)
        term_s = GaugeMetricFamily("counterd_last_superstep_term_seconds",
                                   "F1 (hierarchy), F2 (bus), F3 (bank) of the job's last "
                                   "superstep (seconds)", labels=[*WORKLOAD, "term"])
        unpred = GaugeMetricFamily(
            "counterd_last_superstep_unpredicted",
            "1 when the job's last superstep has no prediction, by reason: "
            + "; ".join(f"{k}: {v}" for k, v in NO_PREDICTION_REASONS.items()),
            labels=[*WORKLOAD, "reason"])
        dom = GaugeMetricFamily("counterd_last_superstep_dominating",
                                "1 for the term that dominates the job's last superstep",
                                labels=[*WORKLOAD, "term"])
        ratio = GaugeMetricFamily("counterd_event_multiplex_ratio",
                                  "time_running/time_enabled of the counter's last reading",
                                  labels=[*WORKLOAD, "counter", "origin"])
        threads = GaugeMetricFamily("counterd_watched_threads",
                                    "threads sampled for the job", labels=WORKLOAD)
        sampled: dict[str, CounterMetricFamily] = {}
        for job, (_, flags, ratios, last, samp, by_pid, nthreads) in sorted(jobs.items()):
            for flag, n in sorted({**dict.fromkeys(FLAGS, 0), **flags}.items()):
                flagged.add_metric([*job, flag], n)
            for (counter, origin), r in sorted(ratios.items()):
                ratio.add_metric([*job, counter, origin], r)
            if last is not None:
                span, work, skew = last.times_s()
                if span is not None:
                    last_s.add_metric([*job], span)
                if work is not None:
                    work_s.add_metric([*job], work)
                skew_s.add_metric([*job], skew)
                if last.no_prediction:
                    unpred.add_metric([*job, last.no_prediction], 1.0)
                if last.prediction is not None:
                    p = last.prediction
                    pred_s.add_metric([*job], p.total_s)
                    for term in TERMS:
                        term_s.add_metric([*job, term], p.terms_s[term])
                        dom.add_metric([*job, term], 1.0 if term == p.dominating else 0.0)
            if samp or nthreads:
                threads.add_metric([*job], nthreads)
            for counter, value in sorted(samp.items()):
                frag, scale = metric_fragment(counter)
                fam = sampled.get(counter)
                if fam is None:
                    labels = [*WORKLOAD, "pid"] if st.export_pids else list(WORKLOAD)
                    fam = sampled[counter] = CounterMetricFamily(
                        f"counterd_sampled_{frag}", f"watched processes: {_help(counter)}",
                        labels=labels)
                if st.export_pids:
                    for (pid, c), v in sorted(by_pid.items()):
                        if c == counter:
                            fam.add_metric([*job, str(pid)], v * scale)
                else:
                    fam.add_metric([*job], value * scale)
        yield flagged
        yield last_s
        yield work_s
        yield skew_s
        yield pred_s
        yield unpred
        yield term_s
        yield dom
        yield ratio
        yield threads
        yield from sampled.values()
        avail = GaugeMetricFamily("counterd_event_available",
                                  "1 if the counter can be counted here (0: see the daemon log)",
                                  labels=["counter", "origin"])
        for (counter, origin), (ok, _) in sorted(available.items()):
            avail.add_metric([counter, origin], 1.0 if ok else 0.0)
        yield avail
        clients, stored, commits, commit_sum = scalars
        yield GaugeMetricFamily("counterd_clients", "connected marker clients", value=clients)
        yield CounterMetricFamily("counterd_records_stored", "superstep records committed",
                                  value=stored)
        yield SummaryMetricFamily("counterd_store_commit_seconds",
                                  "time of one store transaction (group commit; seconds)",
                                  count_value=commits, sum_value=commit_sum)
        for name, doc, table in (
                ("counterd_records_refused", "records refused", refused),
                ("counterd_protocol_errors", "malformed or refused frames", perrors),
                ("counterd_sample_errors", "failed counter reads of watched targets", serrors),
                ("counterd_metrics_refused", "scrape connections refused or closed: peer not "
                 "in metrics.allow, too many at once, silent, failed TLS, wrong credentials",
                 mrefused)):
            fam = CounterMetricFamily(name, doc, labels=["reason"])
            for reason, n in sorted(table.items()):
                fam.add_metric([reason], n)
            yield fam
        fam = CounterMetricFamily("counterd_series_dropped",
                                  "label values folded into _other because their limit was "
                                  "reached (metrics.max_uids, max_jobs, max_superstep_names), "
                                  "each value once while its _other lives", labels=["label"])
        for label, n in sorted(dropped.items()):
            fam.add_metric([label], n)
        yield fam
        yield CounterMetricFamily("counterd_workloads_expired",
                                  "workloads whose series left /metrics: no live client or "
                                  "target and no update for metrics.grace_s", value=expired)

    @staticmethod
    def _superstep_families(
            steps: Mapping[tuple[str, str, str], Mapping[str, tuple[Sequence[int], float,
                                                   Mapping[tuple[str, str], float]]]],
    ) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        duration = HistogramMetricFamily("counterd_superstep_duration_seconds",
                                         "each processor's own time in the superstep, one "
                                         "observation per record that ended: its end minus "
                                         "its begin, not the span over processors (seconds)",
                                         labels=[*WORKLOAD, "superstep"])
        fams: dict[str, CounterMetricFamily] = {}
        for job, by_name in sorted(steps.items()):
            for name, (buckets, dsum, counters) in sorted(by_name.items()):
                cumulative, total = [], 0
                for le, n in zip((*_BUCKET_LE, "+Inf"), buckets, strict=True):
                    total += n
                    cumulative.append((le, float(total)))
                duration.add_metric([*job, name], cumulative, dsum)
                for (counter, source), value in sorted(counters.items()):
                    fam = fams.get(counter)
                    if fam is None:
                        frag, _ = metric_fragment(counter)
                        fam = fams[counter] = CounterMetricFamily(
                            f"counterd_superstep_{frag}", f"supersteps: {_help(counter)}",
                            labels=[*WORKLOAD, "superstep", "source"])
                    fam.add_metric([*job, name, source], value * metric_fragment(counter)[1])
        yield duration
        yield from fams.values()


def registry(state: MetricsState, *, process_metrics: bool = True) -> CollectorRegistry:
    """A registry with the counterd collector (and the daemon's own process metrics:
    ``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ...)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(CounterdCollector(state))
    if process_metrics:
        from prometheus_client import ProcessCollector

        ProcessCollector(registry=reg)
    return reg
