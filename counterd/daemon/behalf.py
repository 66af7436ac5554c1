"""Counting on a client's behalf (DESIGN.md section 6).

Where the kernel forbids a program to count itself (``perf_event_paranoid``), a client asks the
daemon: a BEGIN with ``"count"`` has the daemon open counters for the client's thread and read
them at the superstep's start (:meth:`ClientCounters.start`); the matching RECORD gets the
difference added (:meth:`ClientCounters.finish`). A READ has the daemon read another process's
counters, cumulative since its first READ (:meth:`ClientCounters.read`). Who may read what is
:mod:`counterd.daemon.auth`'s decision, made before.

:class:`Counting` is how the daemon counts, from the config (the sampler uses it too); a
connection's :class:`ClientCounters` holds the groups opened for it until it closes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterd.backends.base import CounterValue, Reading, Target
from counterd.errors import CounterdError
from counterd.records import SuperstepRecord

log = logging.getLogger("counterd.daemon")


def resolve_backend(name: str) -> tuple[Any, str, dict[str, str | None] | None]:
    """``sampling.backend`` -> (backend or None, why, counter -> None or why it is unavailable;
    None for backend ``none``), as :func:`counterd.backends.resolve` decides for purpose
    ``sampling``."""
    from counterd import backends

    res = backends.resolve(name, "sampling")
    if name == "none":
        return None, res.reason, None
    cap = res.capabilities.get("perf") or backends.capability("perf")
    if res.backend is None:
        log.warning("counters unavailable to the daemon: %s", res.reason)
        return None, res.reason, dict(cap.counters)
    return res.get(), cap.reason, dict(cap.counters)


@dataclass(frozen=True)
class Counting:
    """How the daemon counts: ``backend`` (None when it cannot, ``reason`` says why), and what
    it counts when a client names no counters: the config's ``sampling.events``, else every
    counter the backend has (``default_events``). Replaced, not changed, when the config is."""

    backend: Any = None
    reason: str = ""
    default_events: tuple[str, ...] = ()
    sample_events: tuple[str, ...] = ()

    def open(self, asked: Iterable[str], target: Target) -> Any:
        """A counter group on ``target``; CounterdError when the daemon cannot count."""
        if self.backend is None:
            raise CounterdError(f"the daemon cannot count: {self.reason}")
        events = tuple(asked) or self.sample_events or self.default_events
        return self.backend.open(events, target, strict=False)


class ClientCounters:
    """The counter groups the daemon opened for one connection (client process ``pid``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._groups: dict[int, Any] = {}  # tid -> group, for BEGIN with "count"
        self._started: dict[tuple[str, int], tuple[int, Reading]] = {}  # superstep -> start
        self._read_groups: dict[tuple[int, int], Any] = {}  # (pid, tid) -> group, for READ

    def start(self, counting: Counting, key: tuple[str, int], tid: Any, count: Any) -> None:
        """Superstep ``key`` (run id, index) begins on the client's thread ``tid`` (falsy: its
        main thread): open its counters (``count``, as the BEGIN sent it) if not yet, and read
        them. Raises CounterdError, OSError, TypeError or ValueError, the reason the client
        gets back in STARTED."""
        tid = int(tid or self.pid)
        if not Path(f"/proc/{self.pid}/task/{tid}").exists():
            raise CounterdError(f"tid {tid} is not a thread of pid {self.pid}",
                                "send the calling thread's id")
        group = self._groups.get(tid)
        if group is None:
            group = counting.open(count, Target(pid=self.pid, tid=tid))
            self._groups[tid] = group
        self._started[key] = (tid, group.read())

    def finish(self, key: tuple[str, int], rec: SuperstepRecord, describe: str
               ) -> SuperstepRecord:
        """``rec`` with the counts since :meth:`start` of ``key`` added (``rec`` as it is if
        counting did not start)."""
        started = self._started.pop(key, None)
        if started is None:
            return rec
        tid, start = started
        group = self._groups.get(tid)
        if group is None:
            return rec
        try:
            stop = group.read()
        except (CounterdError, OSError) as exc:
            log.info("%s: end reading failed: %s", describe, exc)
            return rec
        return add_counts(rec, start, stop)

    def read(self, counting: Counting, pid: int, tid: int, events: Iterable[str]) -> Reading:
        """The counters of ``pid``/``tid`` since the first read of them (opened then). Raises
        NoSuchTarget when it exited, CounterdError when the daemon cannot count it."""
        group = self._read_groups.get((pid, tid))
        if group is None:
            group = counting.open(events, Target(pid=pid, tid=tid))
            self._read_groups[(pid, tid)] = group
        return group.read()

    def close(self) -> None:
        for group in [*self._groups.values(), *self._read_groups.values()]:
            with contextlib.suppress(Exception):
                group.close()


def add_counts(rec: SuperstepRecord, start: Reading, stop: Reading) -> SuperstepRecord:
    """``rec`` with the counters counted from ``start`` to ``stop`` (those it lacks), their
    unsupported counters and the flags that follow from them."""
    counters: dict[str, CounterValue] = dict(rec.counters)
    for name, cv in stop.delta(start).items():
        counters.setdefault(name, cv)
    unsupported = {k: v for k, v in rec.unsupported.items() if k != "*"}
    unsupported.update(stop.unsupported)
    flags = set(rec.flags) - {"unsupported_counters", "multiplexed"}
    if unsupported:
        flags.add("unsupported_counters")
    if any(cv.ratio < 1.0 for cv in counters.values()):
        flags.add("multiplexed")
    return dataclasses.replace(rec, counters=counters, unsupported=unsupported,
                               flags=frozenset(flags))
