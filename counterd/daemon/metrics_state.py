"""The daemon's in-memory metric state: what /metrics shows, kept bounded.

The daemon updates :class:`MetricsState` as records are committed and samples are taken; a
scrape (:mod:`counterd.daemon.collector`) reads a snapshot of it and never touches the store or
a counter, so a failing event yields fewer samples (its availability says 0 and why), never a
failed scrape.

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
``LSB_JOBID`` or ``COUNTERD_BATCH_JOB``: :func:`counterd.data.env.batch_job`; ``""``, which
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
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from counterd.data.records import Superstep, SuperstepRecord
from counterd.data.units import NS_PER_S
from counterd.prediction import PredictFn, Prediction

_T = TypeVar("_T")

log = logging.getLogger("counterd.daemon.exporter")  # the daemon's /metrics log, as before

OTHER = "_other"
CONFIG_UID = ""  # the uid label of a watch rule's workload: the operator named it, no client
WORKLOAD = ("uid", "workload", "batch_job")  # the labels that say whose workload a series is
_OTHER_SLOT = (OTHER, "")  # (workload, batch_job) of a uid's _other


class Workload(NamedTuple):
    """Whose workload a series is: ``uid``, the uid of the client that named it (SO_PEERCRED
    at connect; None for a watch rule of the daemon's config), ``name``, the name it gave
    (HELLO's ``job``, ``COUNTERD_JOB``; the watch rule's ``job``) and ``batch_job``, the batch
    system's job it runs in (HELLO's ``batch_job``: counterd.data.env.batch_job; "" outside one)."""

    uid: int | None
    name: str
    batch_job: str = ""


MAX_LAST_PROCESSORS = 4096  # records kept for the last superstep of a job (for predictions)

# Upper bounds (seconds) of counterd_superstep_duration_seconds's buckets: supersteps from
# 10 us (a marker pair costs a few us) to 10 s, 1-2.5-5 per decade as client_python's default
# buckets are spaced (19 buckets and +Inf: a quantile within a factor of 2.5).
DURATION_BUCKETS_S = tuple(m * 10.0 ** e for e in range(-5, 1) for m in (1.0, 2.5, 5.0)
                           ) + (10.0,)


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
        (:class:`counterd.data.records.Superstep`); span and work None unless every processor
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
