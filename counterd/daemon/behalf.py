"""Counting on a client's behalf (DESIGN.md section 6).

Where the kernel forbids a program to count itself (``perf_event_paranoid``), a client asks the
daemon: a BEGIN with ``"count"`` has the daemon open counters for the client's thread and read
them at the superstep's start (:meth:`ClientCounters.start`); the matching RECORD gets the
difference added (:meth:`ClientCounters.finish`). A READ has the daemon read another process's
counters, cumulative since its first READ (:meth:`ClientCounters.read`). Who may read what is
:mod:`counterd.daemon.auth`'s decision, made before.

Binding (the Reliability issue: a client that forked and let its parent exec a setuid program
had that program counted into its record; with pid reuse, a client got a root process's task
clock). A perf event stays on the task it was opened on across an exec, and a pid names
whichever process has it now. So the daemon binds each target to the process that is there:
its :class:`Identity` (start time, uids, executable, image addresses) is taken when the client
connects (the SO_PEERCRED pid), checked at every BEGIN against that, and checked again after
every read of the counters, with a pidfd (Linux >= 5.3) saying whether the bound process is
still alive. A BEGIN for a process that is not the one that connected is refused; counts read
from a process that changed (exec'd, changed owner, exited and the pid reused) are thrown away:
the record gets the flag ``target_changed`` and its counters go to ``unsupported`` with the
reason, and a READ gets an error (:class:`TargetChanged`).

:class:`Counting` is how the daemon counts, from the config (the sampler uses it too); a
connection's :class:`ClientCounters` holds the groups opened for it until it closes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterd.backends.base import CounterValue, Reading, Target
from counterd.data.errors import CounterdError, NoSuchTarget
from counterd.data.records import SuperstepRecord

log = logging.getLogger("counterd.daemon")

PROCFS = Path("/proc")


@dataclass(frozen=True)
class Identity:
    """What makes a thread the one the daemon bound, as /proc shows it. ``start_ticks``: field
    22 of ``stat`` (a reused pid or tid has another); ``uids``: real, effective, saved and
    filesystem uids (a setuid exec changes them); ``exe``: device and inode of the executable,
    ``image``: the start of code, of the stack and of the arguments (fields 26, 28, 48 of
    ``stat``; an exec replaces them, even of the same file, and the kernel shows zeros to a
    reader without ptrace access, so a setuid exec does not look unchanged to one either).
    ``exe`` is None when the reader may not see it."""

    start_ticks: int
    uids: tuple[int, ...]
    exe: tuple[int, int] | None
    image: tuple[int, int, int]

    def change(self, now: Identity | None) -> str | None:
        """Why ``now`` is not this thread (None: it is)."""
        if now is None:
            return "it exited"
        if now.start_ticks != self.start_ticks:
            return "its pid now names another process (it exited and the pid was reused)"
        if now.uids != self.uids:
            return (f"its owner changed (uids {'/'.join(map(str, self.uids))} -> "
                    f"{'/'.join(map(str, now.uids))}: a setuid exec?)")
        if now.exe != self.exe or now.image != self.image:
            return "it exec'd another program"
        return None


# Identities are taken at every counted BEGIN and end, so /proc is read with os.open/os.read
# (a tenth of Path.read_text's cost: no text layer, no line splitting).
def _read_proc(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 8192)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat_fields(path: Path | str) -> list[str] | None:
    """``stat``'s fields from field 3 on (after the command name, which may hold anything)."""
    data = _read_proc(str(path))
    if data is None:
        return None
    return data[data.rfind(b")") + 2:].decode("ascii", "replace").split()


def _uids(pid: int, tid: int, procfs: Path) -> tuple[int, ...] | None:
    """The real, effective, saved and filesystem uids of thread ``tid`` of ``pid`` (None: it is
    gone)."""
    data = _read_proc(f"{procfs}/{pid}/task/{tid}/status")
    start = -1 if data is None else data.find(b"\nUid:")
    if data is None or start < 0:
        return None
    try:
        return tuple(int(u) for u in data[start + 5:data.index(b"\n", start + 1)].split())
    except ValueError:
        return None


def _exe(pid: int, procfs: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(f"{procfs}/{pid}/exe")
    except OSError:
        return None
    return st.st_dev, st.st_ino


# A process in the last steps of an exec shows start_code and start_stack as 0: the kernel
# closes close-on-exec descriptors (which is when a parent's Popen returns) before the ELF
# loader sets them. Read again for up to this long before taking such an identity as it is
# (a kernel thread or a zombie has no image at all).
_EXEC_SETTLE_S = 0.05


def identify(pid: int, tid: int, procfs: Path = PROCFS) -> Identity | None:
    """Thread ``tid`` of process ``pid`` as it is now (None: no such thread of that process)."""
    deadline = time.monotonic() + _EXEC_SETTLE_S
    while True:
        fields = _stat_fields(f"{procfs}/{pid}/task/{tid}/stat")
        uids = _uids(pid, tid, procfs)
        if fields is None or uids is None or len(fields) < 46:
            return None
        try:
            start = int(fields[19])
            image = (int(fields[23]), int(fields[25]), int(fields[45]))
        except ValueError:
            return None
        if (image[0] and image[1]) or time.monotonic() > deadline:
            return Identity(start, uids, _exe(pid, procfs), image)
        time.sleep(0.0005)


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (None where the kernel or Python has none: Linux < 5.3)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _exited(pidfd: int | None) -> bool:
    """Whether the process of ``pidfd`` has exited (a pidfd polls readable then)."""
    if pidfd is None:
        return False
    poller = select.poll()  # not select(): the daemon's fds go beyond FD_SETSIZE
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


class TargetChanged(CounterdError):
    """The process counters were opened on is no longer the one bound (exec, new owner,
    reused pid): counting it ended, and its counts are not given to anyone."""

    def __init__(self, pid: int, tid: int, why: str) -> None:
        self.pid = pid
        self.tid = tid
        self.why = why
        super().__init__(f"pid {pid} tid {tid} is not the process the daemon began counting: "
                         f"{why}; counting it ended",
                         "count a process that keeps running the same program")


@dataclass
class _Bound:
    """A counter group and the thread it counts: its identity and its process's pidfd."""

    pid: int
    tid: int
    group: Any
    identity: Identity
    pidfd: int | None

    def change(self, procfs: Path) -> str | None:
        if _exited(self.pidfd):
            return "it exited"
        return self.identity.change(identify(self.pid, self.tid, procfs))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.group.close()
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


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
    """The counter groups the daemon opened for one connection (client process ``pid``, the
    SO_PEERCRED pid). Made when the client connects: the process that is ``pid`` then is the
    only one counted for BEGINs (``procfs``: /proc, or a fixture tree in tests)."""

    def __init__(self, pid: int, procfs: Path = PROCFS) -> None:
        self.pid = pid
        self.procfs = procfs
        self.peer = identify(pid, pid, procfs)  # None: gone already, nothing will be counted
        self._groups: dict[int, _Bound] = {}  # tid -> group, for BEGIN with "count"
        self._started: dict[tuple[str, int], tuple[int, Reading]] = {}  # superstep -> start
        self._read_groups: dict[tuple[int, int], _Bound] = {}  # (pid, tid) -> group, for READ

    def start(self, counting: Counting, key: tuple[str, int], tid: Any, count: Any) -> None:
        """Superstep ``key`` (run id, index) begins on the client's thread ``tid`` (falsy: its
        main thread): open its counters (``count``, as the BEGIN sent it) if not yet, and read
        them. Refused (CounterdError) when the client's pid is no longer the process that
        connected, or ``tid`` is not one of its threads. Raises CounterdError, OSError,
        TypeError or ValueError, the reason the client gets back in STARTED."""
        tid = int(tid or self.pid)
        now = identify(self.pid, self.pid, self.procfs)
        why = self.peer.change(now) if self.peer is not None else \
            "it exited before it connected"
        if why is not None:
            raise CounterdError(f"client pid {self.pid} is not the process that connected: "
                                f"{why}; the daemon counts only that one",
                                "connect again from the process to be counted")
        thread = now if tid == self.pid else identify(self.pid, tid, self.procfs)
        if thread is None:
            raise CounterdError(f"tid {tid} is not a thread of pid {self.pid}",
                                "send the calling thread's id")
        bound = self._groups.get(tid)
        if bound is not None and bound.identity != thread:  # the tid was reused in-process
            self._groups.pop(tid).close()
            bound = None
        if bound is None:
            bound = self._bind(counting, count, self.pid, tid, thread)
            self._groups[tid] = bound
            fresh = True
        else:
            fresh = False
        self._started[key] = (tid, bound.group.read())
        # A change between the check above and the read is caught by finish()'s check against
        # the same identity; a group just opened is checked now as well, so a BEGIN is not
        # answered STARTED for a process that is already another.
        why = bound.change(self.procfs) if fresh else None
        if why is not None:
            self._started.pop(key)
            self._groups.pop(tid).close()
            raise TargetChanged(self.pid, tid, why)

    def _bind(self, counting: Counting, count: Any, pid: int, tid: int, thread: Identity
              ) -> _Bound:
        """Counters opened on ``pid``/``tid``, bound to the thread seen as ``thread`` before
        they were opened (the caller checks again after the first read)."""
        pidfd = _pidfd(pid)
        try:
            group = counting.open(count, Target(pid=pid, tid=tid))
        except BaseException:
            if pidfd is not None:
                os.close(pidfd)
            raise
        return _Bound(pid, tid, group, thread, pidfd)

    def finish(self, key: tuple[str, int], rec: SuperstepRecord, describe: str
               ) -> SuperstepRecord:
        """``rec`` with the counts since :meth:`start` of ``key`` added (``rec`` as it is if
        counting did not start); flagged ``target_changed``, without counts, when the thread
        counted is no longer the one bound at the start."""
        started = self._started.pop(key, None)
        if started is None:
            return rec
        tid, start = started
        bound = self._groups.get(tid)
        if bound is None:
            return rec
        try:
            stop = bound.group.read()
        except (CounterdError, OSError) as exc:
            log.info("%s: end reading failed: %s", describe, exc)
            return rec
        why = bound.change(self.procfs)
        if why is not None:
            log.warning("%s: superstep %d of run %s: %s", describe, rec.index, rec.run_id,
                        TargetChanged(self.pid, tid, why))
            self._groups.pop(tid).close()
            return target_changed(rec, [*start.values, *start.unsupported],
                                  f"not counted: pid {self.pid} tid {tid} {why} during the "
                                  "superstep")
        return add_counts(rec, start, stop)

    def read(self, counting: Counting, pid: int, tid: int, events: Iterable[str]) -> Reading:
        """The counters of ``pid``/``tid`` since the first read of them (opened then, bound to
        the process there then). Raises NoSuchTarget when it exited before, TargetChanged when
        it is no longer that process (the counting ends), CounterdError when the daemon cannot
        count it."""
        bound = self._read_groups.get((pid, tid))
        if bound is None:
            thread = identify(pid, tid, self.procfs)
            if thread is None:
                raise NoSuchTarget(f"pid {pid} tid {tid}")
            bound = self._bind(counting, events, pid, tid, thread)
            self._read_groups[(pid, tid)] = bound
        reading: Reading = bound.group.read()
        why = bound.change(self.procfs)
        if why is not None:
            self._read_groups.pop((pid, tid)).close()
            raise TargetChanged(pid, tid, why)
        return reading

    def close(self) -> None:
        for bound in [*self._groups.values(), *self._read_groups.values()]:
            bound.close()
        self._groups.clear()
        self._read_groups.clear()


def target_changed(rec: SuperstepRecord, names: Iterable[str], why: str) -> SuperstepRecord:
    """``rec`` flagged ``target_changed``: the counters ``names`` the daemon was counting are
    ``unsupported`` with ``why``, never given values (those of the client's own are kept)."""
    unsupported = dict(rec.unsupported)
    for name in names:
        if name not in rec.counters:
            unsupported[name] = why
    flags = set(rec.flags) | {"target_changed"}
    if unsupported:
        flags.add("unsupported_counters")
    return dataclasses.replace(rec, unsupported=unsupported, flags=frozenset(flags))


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
