"""Prometheus export: the daemon's in-memory metric state and a custom Collector over it.

The daemon updates :class:`MetricsState` as records are committed and samples are taken; a
scrape reads a snapshot of it and never touches the store or a counter, so a failing event
yields fewer samples (its availability says 0 and why), never a failed scrape.

Names carry units and ``_total`` (``counterd_superstep_task_clock_seconds_total``); counts of
things are named for the thing (``..._l1d_misses_total``); writebacks say their unit, cache
lines (seed 004 counted quadwords). Labels are bounded.

**Whose workload: ``uid`` and ``workload`` together.** Every per-workload series carries both:
``uid`` is the uid of the client that sent it, as the kernel said at connect (SO_PEERCRED;
``""`` for a watch rule of the daemon's config, which the operator named), ``workload`` the
name that client gave (HELLO's ``job``: ``COUNTERD_JOB``; the watch rule's ``job``). A name
is therefore the user's own: another user's HELLO with the same ``job`` makes
``{uid="65534",workload="victimjob"}``, a different series, and never writes into the
victim's (the Reliability issue: an attacker's record of end_ns 3.6e12 set the victim's
``counterd_last_superstep_seconds`` to 3600). Slots are per uid: each uid has ``max_jobs``
workload values (the last of them ``_other``, for its later names), so no user's names push
another's into ``_other`` (40 names of an attacker once took all 32 shared slots); at most
``max_uids`` uid values (the last ``_other``, shared by the users beyond; the config's ``""``
is not counted). Each overflow is logged once. The uid is a number, not a user name: no
name-service lookup (NSS, LDAP) in the daemon, and the same number the kernel checked;
``sum without (uid) (...)`` aggregates a workload name over users, and Grafana's value
mappings or a ``group_left`` join can show names. Series of workloads are bounded per node by
(max_uids x max_jobs + watch rules) x max_superstep_names x counters. ``workload`` is not
called ``job`` because Prometheus sets ``job`` to the scrape job and would rename ours.

**Batch job: ``batch_job``.** Every per-workload series also carries ``batch_job``, the
batch system's job the client runs in (its HELLO's, from ``SLURM_JOB_ID``, ``PBS_JOBID``,
``LSB_JOBID`` or ``COUNTERD_BATCH_JOB``: :func:`counterd.env.batch_job`; ``""``, which
Prometheus treats as no label, outside one and for watch rules): a series is keyed by
``(uid, workload, batch_job)`` and ``max_jobs`` bounds these triples per uid. A label, not an
info metric ``counterd_run_info`` joined with ``group_left``: counted by
``bench/series_per_node.py``, 8 live jobs x 16 superstep names x 15 counters are 5,052 series
on a node either way (the info metric adds one per live run), but two batch jobs of one user
running the same program on a shared node would share one series set under the info metric
and make its join many-to-many; with the label they are apart and every job-level rule is a
plain ``by (batch_job)``.

**Labels live as long as the job.** A workload with no connected client that nothing updated
for ``metrics.grace_s`` (default 60 s: four scrapes at 15 s, two at 30 s) leaves /metrics and
frees its slot (:meth:`MetricsState.expire`, from the daemon loop's housekeeping every
second); so ``_other`` appears only when more than ``max_jobs - 1`` workloads of one uid are
live at once, and ``counterd_series_dropped_total{label}`` counts each uid, workload or
superstep value folded into ``_other`` (once per value while its ``_other`` lives). A workload
that comes back starts its counters at 0: a counter reset, which ``rate()`` handles.
``counterd_workloads_expired_total`` counts the workloads dropped.

**Cardinality per node** (``bench/series_per_node.py`` counts it): a workload has
S x (23 + C) superstep series (S names, C counters per source: 20 duration buckets, ``_sum``,
``_count``) plus 15 flags + C multiplex ratios + 3 last-superstep gauges, + 2C + 1 when it is
sampled and + 7 with a prediction. With C = 15: 625 series for a job of 16 names, 5,000 for 8
such jobs live (5,052 with the daemon's own 52); idle, 52. The bound is (max_uids x max_jobs
+ watch rules) x that at S = max_superstep_names: 642,560 at the defaults (512 live
workloads), far above a batch node's few live jobs; a cluster that wants a tighter guarantee
sets ``max_uids`` and ``max_jobs`` to the jobs a node may run at once (an exclusive node:
``max_uids = 2``, ``max_jobs = 2`` bound it at 4 x 1,255 = 5,020).

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

import logging
import socket
import threading
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from prometheus_client import exposition
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from counterd.events import BY_NAME
from counterd.prediction import (
    NO_PREDICTION_REASONS,
    TERMS,
    NoPrediction,
    PredictFn,
    Prediction,
)
from counterd.records import FLAGS, Superstep, SuperstepRecord
from counterd.units import NS_PER_S, is_time

if TYPE_CHECKING:
    from counterd.daemon.scrape_access import ScrapeAccess

_T = TypeVar("_T")

log = logging.getLogger("counterd.daemon.exporter")

OTHER = "_other"
CONFIG_UID = ""  # the uid label of a watch rule's workload: the operator named it, no client
WORKLOAD = ("uid", "workload", "batch_job")  # the labels that say whose workload a series is
_OTHER_SLOT = (OTHER, "")  # (workload, batch_job) of a uid's _other


class Workload(NamedTuple):
    """Whose workload a series is: ``uid``, the uid of the client that named it (SO_PEERCRED
    at connect; None for a watch rule of the daemon's config), ``name``, the name it gave
    (HELLO's ``job``, ``COUNTERD_JOB``; the watch rule's ``job``) and ``batch_job``, the batch
    system's job it runs in (HELLO's ``batch_job``: counterd.env.batch_job; "" outside one)."""

    uid: int | None
    name: str
    batch_job: str = ""
MAX_LAST_PROCESSORS = 4096  # records kept for the last superstep of a job (for predictions)

# Upper bounds (seconds) of counterd_superstep_duration_seconds's buckets: supersteps from
# 10 us (a marker pair costs a few us) to 10 s, 1-2.5-5 per decade as client_python's default
# buckets are spaced (19 buckets and +Inf: a quantile within a factor of 2.5).
DURATION_BUCKETS_S = tuple(m * 10.0 ** e for e in range(-5, 1) for m in (1.0, 2.5, 5.0)
                           ) + (10.0,)
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


@dataclass
class _StepStats:
    count: int = 0  # records
    duration_sum_s: float = 0.0
    counters: dict[tuple[str, str], float] = field(default_factory=dict)  # (counter, source)
    # records that ended, per bucket of DURATION_BUCKETS_S (not cumulative; the last: +Inf)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(DURATION_BUCKETS_S) + 1))


@dataclass
class _LastStep:
    run_id: str
    index: int
    name: str
    records: list[SuperstepRecord] = field(default_factory=list)
    prediction: Prediction | None = None
    predicted: bool = False
    no_prediction: str = ""  # a NO_PREDICTION_REASONS code when predicted and none came

    def times_s(self) -> tuple[float | None, float | None, float]:
        """Span, work (the slowest processor's own time) and start skew, in seconds
        (:class:`counterd.records.Superstep`); span and work None unless every processor
        ended the superstep."""
        step = Superstep(self.run_id, self.index, self.name, tuple(self.records))
        span, work = step.time_ns, step.slowest_work_ns
        return (None if span is None else span / NS_PER_S,
                None if work is None else work / NS_PER_S, step.skew_ns / NS_PER_S)


@dataclass
class _JobStats:
    steps: dict[str, _StepStats] = field(default_factory=dict)
    flags: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    ratios: dict[tuple[str, str], float] = field(default_factory=dict)  # (counter, origin)
    last: _LastStep | None = None
    sampled: dict[str, float] = field(default_factory=dict)
    sampled_by_pid: dict[tuple[int, str], float] = field(default_factory=dict)
    threads: int = 0
    seen: float = field(default_factory=time.monotonic)  # last update (monotonic seconds)



def _bounded(table: dict[str, _T], key: str, limit: int, new: Callable[[], _T]) -> _T:
    """``table[key]``, created on first use; once ``limit`` keys exist, new keys share the
    entry ``OTHER`` (bounded label cardinality: no label value grows without limit)."""
    entry = table.get(key)
    if entry is None:
        if len(table) >= limit - (0 if OTHER in table else 1):
            key = OTHER
        entry = table.setdefault(key, new())
    return entry

class MetricsState:
    """Everything /metrics shows, updated by the daemon's threads under one lock."""

    def __init__(self, *, max_jobs: int = 32, max_superstep_names: int = 32,
                 max_uids: int = 16, export_pids: bool = False, grace_s: float = 60.0) -> None:
        self.max_jobs = max_jobs
        self.grace_s = grace_s
        self.max_names = max_superstep_names
        self.export_pids = export_pids
        self.lock = threading.Lock()
        self.max_uids = max_uids
        # (uid, workload, batch_job) labels -> stats; every key's uid label is in self.users
        self.jobs: dict[tuple[str, str, str], _JobStats] = {}
        self.users: dict[str, set[tuple[str, str]]] = {}  # uid -> its (workload, batch_job)s
        self.available: dict[tuple[str, str], tuple[bool, str]] = {}  # (counter, origin)
        self.clients = 0
        self.records_stored = 0
        self.refused: dict[str, int] = defaultdict(int)
        self.protocol_errors: dict[str, int] = defaultdict(int)
        self.sample_errors: dict[str, int] = defaultdict(int)
        self.metrics_refused: dict[str, int] = defaultdict(int)
        self.commit_count = 0
        self.commit_sum_s = 0.0
        self.predict: PredictFn | None = None
        self.predict_reason = "no machine profile configured"
        self._logged: set[str] = set()
        # label values folded into _other, per bucket: ("uid",), ("workload", uid label),
        # ("superstep", uid label, workload label); counted once each while the bucket lives
        self._folded: dict[tuple[str, ...], set[str]] = {}
        self.series_dropped: dict[str, int] = defaultdict(int)  # label -> values folded
        self.series_expired = 0  # workloads whose series left /metrics after the grace period
        self.version = 0  # bumped by every update: the exposition cache re-renders on change

    # -- label bounding ----------------------------------------------------------------------
    def _job(self, w: Workload) -> _JobStats:
        """The stats of workload ``w`` in its uid's own slots (under the lock). A uid beyond
        ``max_uids`` uids, or a workload beyond its uid's ``max_jobs``, is ``_other`` (said once
        in the log): one user's names never take another's slots or series."""
        user = CONFIG_UID if w.uid is None else str(w.uid)
        names = self.users.get(user)
        if names is None:
            if user != CONFIG_UID and sum(1 for u in self.users if u != CONFIG_UID) >= \
                    self.max_uids - (0 if OTHER in self.users else 1):
                self._note_once(f"uids {w.uid}", "uid %s: more than %d users have workloads "
                                "(metrics.max_uids): its series are exported as uid=\"_other\"",
                                w.uid, self.max_uids)
                self._fold(("uid",), user, "uid")
                user = OTHER
            names = self.users.setdefault(user, set())
        key = (user, w.name, w.batch_job)
        stats = self.jobs.get(key)
        if stats is None:
            if key[1:] not in names and len(names) >= self.max_jobs - (
                    0 if _OTHER_SLOT in names else 1):
                self._note_once(f"jobs {user}", "uid %s: more than %d workloads "
                                "(metrics.max_jobs, per uid): later ones are exported as "
                                "workload=\"_other\"", user, self.max_jobs)
                self._fold(("workload", user), f"{w.name}\0{w.batch_job}", "workload")
                key = (user, *_OTHER_SLOT)
            names.add((key[1], key[2]))
            stats = self.jobs.setdefault(key, _JobStats())
        stats.seen = time.monotonic()
        return stats

    MAX_FOLDED = 4096  # distinct values remembered per _other bucket; beyond, each fold counts

    def _fold(self, bucket: tuple[str, ...], value: str, label: str) -> None:
        """Count ``value`` of ``label`` folded into ``_other`` (once per value while its
        bucket lives: counterd_series_dropped_total)."""
        seen = self._folded.setdefault(bucket, set())
        if value in seen:
            return
        if len(seen) < self.MAX_FOLDED:
            seen.add(value)
        self.series_dropped[label] += 1

    def _live_key(self, w: Workload) -> tuple[str, str, str] | None:
        """The key ``w``'s series are under now, without creating one (None: none yet)."""
        user = CONFIG_UID if w.uid is None else str(w.uid)
        if user not in self.users:
            user = OTHER
        for key in ((user, w.name, w.batch_job), (user, *_OTHER_SLOT)):
            if key in self.jobs:
                return key
        return None

    def expire(self, live: Iterable[Workload], now: float | None = None) -> int:
        """Drop the series of every workload that no live client or watch target has
        (``live``) and that nothing updated for ``grace_s``: a finished run's series leave
        /metrics (after at least two scrapes at the default), and its slot is free again, so
        ``_other`` holds only workloads beyond ``max_jobs`` live at once. Returns how many
        were dropped. A workload that comes back starts its counters at 0 (a counter reset,
        which ``rate()`` and ``increase()`` handle)."""
        now = time.monotonic() if now is None else now
        with self.lock:
            keep = {k for k in map(self._live_key, live) if k is not None}
            gone = [k for k, st in self.jobs.items()
                    if k not in keep and now - st.seen > self.grace_s]
            for user, name, batch in gone:
                del self.jobs[(user, name, batch)]
                names = self.users.get(user)
                if names is not None:
                    names.discard((name, batch))
                    if not names:
                        del self.users[user]
                if (name, batch) == _OTHER_SLOT:
                    self._folded.pop(("workload", user), None)
                self._folded.pop(("superstep", user, name, batch), None)
                if user == OTHER and not any(u == OTHER for u, _, _ in self.jobs):
                    self._folded.pop(("uid",), None)
            if gone:
                self.version += 1
                self.series_expired += len(gone)
            return len(gone)

    def _note_once(self, key: str, msg: str, *args: object) -> None:
        """:meth:`log_once` for a caller that holds the lock."""
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)

    def _step(self, stats: _JobStats, name: str, key: tuple[str, str, str] | None = None
              ) -> _StepStats:
        step = stats.steps.get(name)
        if step is None:
            step = _bounded(stats.steps, name, self.max_names, _StepStats)
            if key is not None and step is stats.steps.get(OTHER) and name != OTHER:
                self._fold(("superstep", *key), name, "superstep")
        return step

    # -- updates -------------------------------------------------------------------------------
    def observe_records(self, records: Sequence[tuple[SuperstepRecord, Workload]],
                        commit_s: float) -> None:
        """Records just committed to the store, each with its workload (sender's uid, job)."""
        with self.lock:
            self.version += 1
            self.commit_count += 1
            self.commit_sum_s += commit_s
            self.records_stored += len(records)
            for rec, job in records:
                stats = self._job(job)
                step = self._step(stats, rec.name, self._live_key(job))
                step.count += 1
                if rec.duration_ns is not None:
                    d = rec.duration_ns / NS_PER_S
                    step.duration_sum_s += d
                    step.buckets[bisect_left(DURATION_BUCKETS_S, d)] += 1  # le: d <= bound
                for name, cv in rec.counters.items():
                    key = (name, cv.source.value)
                    step.counters[key] = step.counters.get(key, 0.0) + cv.value
                    stats.ratios[(name, "superstep")] = cv.ratio
                for flag in rec.flags:
                    stats.flags[flag] += 1
                last = stats.last
                if last is None or (rec.run_id, rec.index) != (last.run_id, last.index):
                    if last is None or rec.run_id != last.run_id or rec.index > last.index:
                        stats.last = last = _LastStep(rec.run_id, rec.index, rec.name)
                    else:
                        continue  # a late record of an earlier superstep
                if len(last.records) < MAX_LAST_PROCESSORS:
                    last.records.append(rec)
                    last.predicted = False

    def observe_samples(self, job: Workload, totals: Mapping[str, float],
                        ratios: Mapping[str, float], threads: int,
                        by_pid: Mapping[tuple[int, str], float] | None = None) -> None:
        with self.lock:
            self.version += 1
            stats = self._job(job)
            stats.sampled = dict(totals)
            stats.threads = threads
            for counter, ratio in ratios.items():
                stats.ratios[(counter, "sampled")] = ratio
            if self.export_pids and by_pid is not None:
                stats.sampled_by_pid = dict(by_pid)

    def set_available(self, origin: str, counters: Mapping[str, str | None]) -> None:
        with self.lock:
            self.version += 1
            for counter, why in counters.items():
                self.available[(counter, origin)] = (why is None, why or "")

    def log_once(self, key: str, msg: str, *args: object) -> None:
        """Log a warning the first time ``key`` is seen (say a missing prediction once, not
        once per superstep); the metric keeps saying it."""
        with self.lock:
            if key in self._logged:
                return
            self._logged.add(key)
        log.warning(msg, *args)

    def count(self, table: str, reason: str, n: int = 1) -> None:
        with self.lock:
            self.version += 1
            getattr(self, table)[reason] += n

    def set_clients(self, n: int) -> None:
        self.clients = n
        self.version += 1

    def set_predictor(self, fn: PredictFn | None, reason: str) -> None:
        with self.lock:
            self.version += 1
            self.predict = fn
            self.predict_reason = reason
            for stats in self.jobs.values():
                if stats.last is not None:
                    stats.last.predicted = False


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


MAX_ACCEPT_CHARS = 8192  # a longer Accept header is not read: the text format


@dataclass(frozen=True)
class ExpositionFormat:
    """A rendering /metrics serves: its name, Content-Type and encoder (prometheus-client's)."""

    name: str
    content_type: str
    encode: Callable[[Collector], bytes]


TEXT = ExpositionFormat("text", exposition.CONTENT_TYPE_PLAIN_0_0_4, exposition.generate_latest)
OPENMETRICS = ExpositionFormat("openmetrics", om.CONTENT_TYPE_LATEST, om.generate_latest)


def negotiate(accept: str | None) -> ExpositionFormat:
    """The format for a scrape's ``Accept`` header, as prometheus-client's ``choose_encoder``
    decides: OpenMetrics where the scraper asks for it (Prometheus sends ``Accept:
    application/openmetrics-text;version=1.0.0,...``), else the text format 0.0.4. Bounded to
    these two renderings, each cached (:class:`ExpositionCache`): OpenMetrics is served as
    version 1.0.0 whatever version >= 1.0.0 was asked (its Content-Type says so; the version
    ``choose_encoder`` would echo is the client's text), and text/plain as 0.0.4 (the same
    exposition for our names, which need no escaping). An Accept header longer than
    :data:`MAX_ACCEPT_CHARS`, or one ``choose_encoder`` cannot read (a version such as ``1.x``
    makes it compare text with numbers: TypeError), gets the text format."""
    if not accept or len(accept) > MAX_ACCEPT_CHARS:
        return TEXT
    try:
        _, content_type = exposition.choose_encoder(accept)
    except Exception:  # prometheus-client's parsing of a hostile header: not the scrape's end
        return TEXT
    return OPENMETRICS if content_type.startswith("application/openmetrics-text") else TEXT


class _Collected(Collector):
    """The families of one collection, encoded in every format wanted (one collection, so
    every format shows the same state)."""

    def __init__(self, families: Sequence[Any]) -> None:
        self.families = families

    def collect(self) -> Iterator[Any]:
        return iter(self.families)


class ExpositionCache:
    """The rendered exposition, refreshed in the background, so a scrape costs a copy.

    Rendering 10,000 series through prometheus-client takes ~130 ms of Python on the
    development VM; doing it inside every scrape would put the scrape's p99 far above 50 ms.
    A scrape returns the latest rendering; a background thread re-renders when the state
    changed, at most every ``min_interval_s`` (``metrics.refresh_s``) and only while someone
    scrapes (none for ``idle_s``: no rendering at all). A scrape therefore sees data at most
    ``min_interval_s`` plus one rendering old; a rendering older than ``max_age_s`` (and the
    first) is redone inside the scrape. Each :class:`ExpositionFormat` scraped within
    ``idle_s`` is encoded from the same collection, plain and gzipped.
    """

    def __init__(self, reg: CollectorRegistry, state: MetricsState, *,
                 min_interval_s: float = 1.0, idle_s: float = 60.0, max_age_s: float = 30.0
                 ) -> None:
        self.registry = reg
        self.state = state
        self.min_interval_s = min_interval_s
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._render_lock = threading.Lock()
        self._bodies: dict[str, tuple[bytes, bytes]] = {}  # format name -> (plain, gzipped)
        self._scraped: dict[str, tuple[ExpositionFormat, float]] = {}  # name -> (format, when)
        self._version = -1
        self._rendered_at = 0.0
        self._last_scrape = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="counterd-exposition",
                                        daemon=True)
        self._thread.start()

    def _render(self) -> None:
        import gzip

        with self._render_lock:
            version = self.state.version
            now = time.monotonic()
            with self._lock:
                formats = [f for f, when in self._scraped.values() if now - when < self.idle_s]
            collected = _Collected(list(self.registry.collect()))
            bodies = {}
            for fmt in formats:
                body = fmt.encode(collected)
                bodies[fmt.name] = (body, gzip.compress(body, compresslevel=1))
            with self._lock:
                self._bodies, self._version = bodies, version
                self._rendered_at = time.monotonic()

    def body(self, gzip_ok: bool = False, fmt: ExpositionFormat = TEXT) -> bytes:
        now = self._last_scrape = time.monotonic()
        with self._lock:
            self._scraped[fmt.name] = (fmt, now)
            have = self._bodies.get(fmt.name)
        if have is None or now - self._rendered_at > self.max_age_s:
            self._render()
            with self._lock:
                have = self._bodies.get(fmt.name)
        assert have is not None
        return have[1] if gzip_ok else have[0]

    def _loop(self) -> None:
        while not self._stop.wait(min(0.25, self.min_interval_s / 4)):
            now = time.monotonic()
            if (self._bodies and self.state.version != self._version
                    and now - self._last_scrape < self.idle_s
                    and now - self._rendered_at >= self.min_interval_s):
                try:
                    self._render()
                except Exception:  # a broken collector must not kill the refresher
                    log.exception("rendering /metrics failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def serve(cache: ExpositionCache, host: str, port: int, access: ScrapeAccess | None = None
          ) -> Any:
    """An HTTP(S) server for ``/metrics`` (and ``/``) in a daemon thread; returns the server
    (``shutdown()``, ``server_close()``, ``server_port``). ``access`` (default: anyone who
    reaches the socket, plain HTTP) is enforced as :mod:`counterd.daemon.scrape_access` says:
    the allow-list and the connection bound in the accepting thread (a refused peer is closed
    before a byte is read, no thread spawned), TLS and basic auth in the connection's thread.
    """
    import ssl
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    guard = access

    class Handler(BaseHTTPRequestHandler):
        timeout = guard.timeout_s if guard is not None else None

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if guard is not None and not guard.authorized(self.headers.get("Authorization")):
                guard.refused("unauthorized")
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="counterd"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served")
                return
            fmt = negotiate(self.headers.get("Accept"))
            gz = exposition.gzip_accepted(self.headers.get("Accept-Encoding", ""))
            try:
                data = cache.body(gzip_ok=gz, fmt=fmt)
            except Exception as exc:
                log.exception("scrape failed")
                self.send_error(500, str(exc))
                return
            self.send_response(200)
            self.send_header("Content-Type", fmt.content_type)
            self.send_header("Vary", "Accept, Accept-Encoding")
            if gz:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("metrics: " + format, *args)

        def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
            # http.server catches a request line's timeout itself and only says so here
            if guard is not None and format.startswith("Request timed out"):
                guard.refused("timeout")
            log.debug("metrics: " + format, *args)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def verify_request(self, request: Any, client_address: Any) -> bool:
            """In the accepting thread: False closes the connection at once."""
            if guard is None:
                return True
            if not guard.allows(str(client_address[0])):
                guard.refused("not_allowed")
                return False
            if not guard.slots.acquire(blocking=False):
                guard.refused("busy")
                return False
            return True

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                if guard is not None:
                    guard.slots.release()

        def finish_request(self, request: Any, client_address: Any) -> None:
            if guard is None:
                super().finish_request(request, client_address)
                return
            request.settimeout(guard.timeout_s)
            if guard.tls is None:
                super().finish_request(request, client_address)
                return
            try:
                conn = guard.tls.wrap_socket(request, server_side=True)
            except TimeoutError:
                guard.refused("timeout")
                return
            except (ssl.SSLError, OSError):
                guard.refused("tls")
                return
            try:
                super().finish_request(conn, client_address)
            finally:
                conn.close()

        def handle_error(self, request: Any, client_address: Any) -> None:
            import sys

            exc = sys.exc_info()[1]
            if isinstance(exc, TimeoutError) and guard is not None:
                guard.refused("timeout")
            elif not isinstance(exc, (ConnectionError, ssl.SSLError)):
                log.exception("metrics: request from %s failed", client_address)

    server = Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="counterd-metrics", daemon=True).start()
    return server
