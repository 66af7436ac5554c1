"""What the sessions of one daemon share (:class:`Shared`): the metric state, the authority,
the writer, the connected clients (:class:`Clients`, which the sampler reads), the limits, the
bytes each uid's connections hold, the query worker, this kernel's clock identity, and the log
for what clients cause (:class:`ThrottledLog`). One per daemon, made by
:mod:`counterd.daemon.service`, handed to each :class:`counterd.daemon.session.Session`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from counterd.daemon.auth import Authority
from counterd.daemon.behalf import Counting
from counterd.daemon.config import Limits
from counterd.daemon.metrics_state import Workload
from counterd.daemon.query import Queries, QueryWorker
from counterd.daemon.writer import Writer
from counterd.data.clocks import boot_id, time_namespace

if TYPE_CHECKING:
    from counterd.daemon.metrics_state import MetricsState

log = logging.getLogger("counterd.daemon")


class ThrottledLog:
    """The daemon's log for what clients cause: at most ``burst`` messages per ``interval_s``,
    then one line saying how many were not logged, so no client can flood the log (or the
    disk under it). Used by the loop's thread only."""

    def __init__(self, burst: int = 100, interval_s: float = 10.0) -> None:
        self.burst = burst
        self.interval_s = interval_s
        self._window_end = 0.0
        self._logged = 0
        self._skipped = 0

    def warning(self, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now >= self._window_end:
            if self._skipped:
                log.warning("%d more messages about clients in the last %g s not logged",
                            self._skipped, self.interval_s)
            self._window_end, self._logged, self._skipped = now + self.interval_s, 0, 0
        if self._logged < self.burst:
            self._logged += 1
            log.warning(msg, *args)
        else:
            self._skipped += 1


class Clients:
    """pid -> workload (the client's uid and job) of the connected marker clients (the sampler
    samples them as workloads). Written by the loop's thread, read by the sampler's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[int, Workload] = {}

    def add(self, pid: int, job: Workload) -> None:
        with self._lock:
            self._jobs[pid] = job

    def discard(self, pid: int) -> None:
        with self._lock:
            self._jobs.pop(pid, None)

    def snapshot(self) -> dict[int, Workload]:
        with self._lock:
            return dict(self._jobs)


@dataclass
class Shared:
    """What the sessions of one daemon share. ``counting`` is replaced when the config is."""

    state: MetricsState
    auth: Authority
    writer: Writer
    clients: Clients
    counting: Counting = field(default_factory=Counting)
    limits: Limits = field(default_factory=Limits)
    held: dict[int, int] = field(default_factory=dict)  # uid -> bytes its connections hold
    log: ThrottledLog = field(default_factory=ThrottledLog)
    queries: Queries = field(default_factory=Queries)
    query_worker: QueryWorker | None = None  # None: QUERY answered in the loop (tests)
    boot_id: str = field(default_factory=boot_id)  # this kernel's (counterd.data.clocks)
    timens: str = field(default_factory=time_namespace)  # the daemon's time namespace
