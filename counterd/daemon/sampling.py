"""Sampling of watched processes: per-thread counter groups, aggregated per job.

Targets are the processes matched by the config's watch rules plus the processes connected to
the marker socket (workload = the client's uid and job name, :class:`metrics_state.Workload`).
Every thread of a target gets its own perf group (counting a thread needs no inheritance, so
values are exact and grouped); at each interval every group is read once and the values are
summed per job. A thread that exits is
read one last time and its final counts are kept in the job's retired total, so the per-job
series stays monotonic (a Prometheus counter) however many threads come and go; label
cardinality is the number of jobs, not of threads.

``procfs`` is a parameter so tests can pass a fixture tree. :func:`sample_forever` is the
daemon's sampler thread: it exports each sample to the metrics and queues it for the store.
"""

from __future__ import annotations

import logging
import os
import pwd
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.backends.base import Target
from counterd.daemon.config import Config, WatchRule
from counterd.daemon.metrics_state import Workload
from counterd.daemon.store import Sample
from counterd.data.errors import CounterdError, NoSuchTarget

if TYPE_CHECKING:
    from counterd.daemon.behalf import Counting
    from counterd.daemon.metrics_state import MetricsState

log = logging.getLogger("counterd.daemon.sampling")
_daemon_log = logging.getLogger("counterd.daemon")  # where the sampler thread logs


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    comm: str
    uids: tuple[int, ...]  # real, effective, saved, fs
    cgroup: str


def read_proc(pid: int, procfs: Path = Path("/proc")) -> ProcInfo | None:
    """comm, uids and cgroup (v2 path) of ``pid``; None if it is gone."""
    base = procfs / str(pid)
    try:
        comm = (base / "comm").read_text().strip()
        uids: tuple[int, ...] = ()
        for line in (base / "status").read_text().splitlines():
            if line.startswith("Uid:"):
                uids = tuple(int(x) for x in line.split()[1:5])
                break
        cgroup = ""
        try:
            for line in (base / "cgroup").read_text().splitlines():
                if line.startswith("0::"):
                    cgroup = line[3:]
        except OSError:
            pass
        return ProcInfo(pid, comm, uids, cgroup)
    except (OSError, ValueError):
        return None


def owner_uids(pid: int, procfs: Path = Path("/proc")) -> tuple[int, ...] | None:
    info = read_proc(pid, procfs)
    return None if info is None else info.uids


def matches(rule: WatchRule, info: ProcInfo) -> bool:
    if not (rule.comm or rule.user is not None or rule.cgroup or rule.pids):
        return False
    if rule.pids and info.pid not in rule.pids:
        return False
    if rule.comm and not (rule.comm_re and rule.comm_re.search(info.comm)):
        return False
    if rule.user is not None and (not info.uids or info.uids[0] != rule.user):
        return False
    return not (rule.cgroup and not info.cgroup.startswith(rule.cgroup))


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass
class _Thread:
    group: Any
    last: dict[str, float] = field(default_factory=dict)
    ratio: dict[str, float] = field(default_factory=dict)


@dataclass
class _Job:
    retired: dict[str, float] = field(default_factory=dict)
    threads: dict[tuple[int, int], _Thread] = field(default_factory=dict)  # (pid, tid)


class Sampler:
    """Opens, reads and retires per-thread groups; one :meth:`sample` per interval.

    ``open_group(events, target)`` is the backend's ``open`` (perf); injectable for tests.
    """

    def __init__(self, events: tuple[str, ...], open_group: Callable[..., Any], *,
                 procfs: Path = Path("/proc"), on_error: Callable[[str], None] | None = None
                 ) -> None:
        self.events = events
        self.open_group = open_group
        self.procfs = procfs
        self.on_error = on_error or (lambda reason: None)
        self.jobs: dict[Workload, _Job] = {}
        self._failed: set[tuple[int, int]] = set()  # threads we could not open (logged once)
        self.unsupported: dict[str, str] = {}

    def discover(self, rules: Iterable[WatchRule], clients: Mapping[int, Workload]
                 ) -> dict[int, Workload]:
        """pid -> workload for every target now: watch-rule matches (the config's: uid None),
        then marker clients (their uid and job)."""
        targets: dict[int, Workload] = {}
        rules = list(rules)
        for rule in rules:  # pid-only rules need no scan of /proc
            if rule.pids and not (rule.comm or rule.user is not None or rule.cgroup):
                for pid in rule.pids:
                    if pid not in targets and (self.procfs / str(pid)).exists():
                        targets[pid] = Workload(None, rule.job)
        rules = [r for r in rules if r.comm or r.user is not None or r.cgroup]
        if rules:
            for entry in os.scandir(self.procfs):
                if not entry.name.isdigit():
                    continue
                pid = int(entry.name)
                if pid == os.getpid():
                    continue
                info = read_proc(pid, self.procfs)
                if info is None:
                    continue
                for rule in rules:
                    if pid not in targets and matches(rule, info):
                        targets[pid] = Workload(None, rule.job)
                        break
        for pid, job in clients.items():
            targets.setdefault(pid, job)
        return targets

    def _tids(self, pid: int) -> list[int]:
        try:
            return [int(t) for t in os.listdir(self.procfs / str(pid) / "task")]
        except OSError:
            return []

    def sample(self, targets: Mapping[int, Workload]
               ) -> dict[Workload, tuple[dict[str, float], dict[str, float], int]]:
        """Read every thread of every target; returns job -> (totals, min ratios, threads)."""
        live: set[tuple[Workload, int, int]] = set()
        for pid, job in targets.items():
            jstate = self.jobs.setdefault(job, _Job())
            for tid in self._tids(pid):
                live.add((job, pid, tid))
                if (pid, tid) in jstate.threads or (pid, tid) in self._failed:
                    continue
                try:
                    group = self.open_group(self.events, Target(pid=pid, tid=tid))
                except NoSuchTarget:
                    continue
                except CounterdError as exc:
                    self._failed.add((pid, tid))
                    self.on_error(type(exc).__name__)
                    log.warning("cannot sample pid %d tid %d (job %s): %s", pid, tid, job.name,
                                exc)
                    continue
                jstate.threads[(pid, tid)] = _Thread(group)
        out: dict[Workload, tuple[dict[str, float], dict[str, float], int]] = {}
        for job, jstate in self.jobs.items():
            totals = dict(jstate.retired)
            ratios: dict[str, float] = {}
            for (pid, tid), th in list(jstate.threads.items()):
                try:
                    reading = th.group.read()
                    th.last = {k: v.value for k, v in reading.values.items()}
                    th.ratio = {k: v.ratio for k, v in reading.values.items()}
                    self.unsupported.update(reading.unsupported)
                except (OSError, CounterdError) as exc:
                    self.on_error("read")
                    log.debug("read of pid %d tid %d failed: %s", pid, tid, exc)
                if (job, pid, tid) not in live:  # exited: keep its final counts
                    for k, v in th.last.items():
                        jstate.retired[k] = jstate.retired.get(k, 0.0) + v
                    th.group.close()
                    del jstate.threads[(pid, tid)]
                for k, v in th.last.items():
                    totals[k] = totals.get(k, 0.0) + v
                for k, r in th.ratio.items():
                    ratios[k] = min(r, ratios.get(k, 1.0))
            out[job] = (totals, ratios, len(jstate.threads))
        self._failed = {(p, t) for (p, t) in self._failed
                        if (self.procfs / str(p) / "task" / str(t)).exists()}
        return out

    def by_pid(self, job: Workload) -> dict[tuple[int, str], float]:
        """(pid, counter) -> value for the live threads of ``job`` (export_pids only)."""
        out: dict[tuple[int, str], float] = {}
        for (pid, _), th in self.jobs.get(job, _Job()).threads.items():
            for k, v in th.last.items():
                out[(pid, k)] = out.get((pid, k), 0.0) + v
        return out

    def close(self) -> None:
        for jstate in self.jobs.values():
            for th in jstate.threads.values():
                th.group.close()
            jstate.threads.clear()


# -- the daemon's sampler thread ----------------------------------------------------------------
def sample_forever(stop: threading.Event, settings: Callable[[], tuple[Config, Counting]],
                   clients: Callable[[], Mapping[int, Workload]], state: MetricsState,
                   emit: Callable[[list[Sample]], None]) -> None:
    """Every ``sampling.interval_s`` until ``stop``: sample the watched processes and the
    marker ``clients`` (pid -> job), export the totals to ``state`` and ``emit`` them as rows
    for the store. ``settings`` gives the current config and means of counting (they change
    on SIGHUP); the groups are reopened when the counters or the backend change."""
    sampler: Sampler | None = None
    key: tuple[Any, ...] | None = None
    while not stop.is_set():
        cfg, counting = settings()
        started = time.monotonic()
        backend = counting.backend
        if backend is not None:
            want = (cfg.sample_events or counting.default_events, id(backend))
            if sampler is None or key != want:
                if sampler is not None:
                    sampler.close()
                key = want
                sampler = Sampler(want[0], lambda ev, t, b=backend: b.open(
                    ev, t, strict=False), on_error=lambda r: state.count("sample_errors", r))
            try:
                _sample_once(sampler, cfg, clients(), state, emit)
            except Exception:  # sampling must never take the daemon down
                _daemon_log.exception("sampling failed")
        stop.wait(max(0.0, cfg.sample_interval_s - (time.monotonic() - started)))
    if sampler is not None:
        sampler.close()


def _sample_once(sampler: Sampler, cfg: Config, clients: Mapping[int, Workload],
                 state: MetricsState, emit: Callable[[list[Sample]], None]) -> None:
    targets = sampler.discover(cfg.watch, clients)
    result = sampler.sample(targets)
    now = time.time_ns()
    rows: list[Sample] = []
    for job, (totals, ratios, threads) in result.items():
        state.observe_samples(job, totals, ratios, threads,
                              sampler.by_pid(job) if cfg.export_pids else None)
        rows.extend(Sample(now, job.name, c, v, ratios.get(c, 1.0)) for c, v in totals.items())
    if sampler.unsupported:
        state.set_available("sampled", dict.fromkeys(sampler.events) | {
            k: v for k, v in sampler.unsupported.items()})
    if rows:
        emit(rows)
