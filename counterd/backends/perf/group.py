"""Opening and reading the kernel groups of one target.

The counters of one :class:`~counterd.backends.base.Target` form a :class:`PerfGroup`: one or
more kernel groups, each a disabled leader plus members opened with ``group_fd`` and read
atomically with one ``read(2)`` of ``PERF_FORMAT_GROUP | TOTAL_TIME_ENABLED |
TOTAL_TIME_RUNNING | ID``; values are scaled for multiplexing (``raw * enabled / running``)
and carry their group's ratio ``running / enabled``. A planned group the kernel still rejects
with EINVAL is split (:class:`_Opener`).

References: perf_event_open(2) ("Reading results"); kernel/events/core.c (perf_read_group);
arch/x86/events/core.c (validate_group).
"""

from __future__ import annotations

import ctypes
import os
import struct
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from counterd.backends.base import CounterValue, Reading, Target
from counterd.backends.perf.syscall import (
    PERF_FLAG_FD_CLOEXEC,
    PERF_FORMAT_GROUP,
    PERF_FORMAT_ID,
    PERF_FORMAT_TOTAL_TIME_ENABLED,
    PERF_FORMAT_TOTAL_TIME_RUNNING,
    PerfEventAttr,
    Syscall,
    _close_all,
    _event_id,
    translate_errno,
)
from counterd.backends.perf.tables import EventSpec
from counterd.data.errors import CounterAccessDenied, CounterdError, EventNotSupported
from counterd.data.events import Source, measured, scale
from counterd.perf_abi import parse_single_read

# --------------------------------------------------------------------------------------------
# Pure helpers: parsing and scaling group reads
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupSample:
    """One decoded read of a group: times in ns and raw counts by event name."""

    time_enabled_ns: int
    time_running_ns: int
    raw: dict[str, int]


def group_read_size(n_events: int) -> int:
    """Bytes of a PERF_FORMAT_GROUP|TOTAL_TIME_*|ID read: nr, enabled, running, {value, id}*n."""
    return 8 * (3 + 2 * n_events)


def parse_group_read(buf: bytes, ids: Mapping[int, str]) -> GroupSample:
    """Decode ``struct read_format`` for PERF_FORMAT_GROUP with TOTAL_TIME_ENABLED,
    TOTAL_TIME_RUNNING and ID (perf_event_open(2), "Reading results")::

        u64 nr; u64 time_enabled; u64 time_running; { u64 value; u64 id; } values[nr];

    ``ids`` maps the kernel's event ids (PERF_EVENT_IOC_ID) to names. Raises ValueError on a
    short buffer or an id it was not told about.
    """
    if len(buf) < 24:
        raise ValueError(f"group read of {len(buf)} bytes is shorter than its 24-byte header")
    nr, enabled, running = struct.unpack_from("=QQQ", buf, 0)
    if len(buf) < group_read_size(nr):
        raise ValueError(f"group read of {len(buf)} bytes cannot hold {nr} values")
    raw: dict[str, int] = {}
    for i in range(nr):
        value, event_id = struct.unpack_from("=QQ", buf, 24 + 16 * i)
        if event_id not in ids:
            raise ValueError(f"group read has unknown event id {event_id}")
        raw[ids[event_id]] = value
    return GroupSample(enabled, running, raw)


# --------------------------------------------------------------------------------------------
# Readings and the counter set
# --------------------------------------------------------------------------------------------


# A reading of counters from several kernel groups: each counter keeps its own group's
# (time_enabled, time_running) in ``Reading.times`` and is scaled by it (Reading.delta). The
# name stays for readers of this backend.
PerfReading = Reading


class _KernelGroup:
    """One kernel group: its members in the kernel's order (leader first, then siblings as
    they were attached: kernel/events/core.c perf_read_group), their fds and event ids."""

    __slots__ = ("names", "fds", "leader", "ids", "id_map", "struct", "size", "n")

    def __init__(self, names: Sequence[str], fds: Sequence[int], ids: Sequence[int]) -> None:
        self.names = tuple(names)
        self.fds = tuple(fds)
        self.leader = fds[0]
        self.ids = tuple(ids)
        self.id_map = dict(zip(self.ids, self.names, strict=True))
        self.n = len(self.names)
        self.struct = struct.Struct("=" + "Q" * (3 + 2 * self.n))
        self.size = self.struct.size


class PerfGroup:
    """Counters for one target, opened by :meth:`PerfBackend.open`; a context manager.

    Without ``inherit`` the events form one or more kernel groups (:attr:`groups`): in each,
    the leader is created disabled, members join it with ``group_fd``, and it is read with one
    ``read(2)`` on the leader, so its values share one time_enabled/time_running (the kernel
    schedules a group onto the PMU as a whole and multiplexes groups that do not all fit).
    Every value is scaled by its own group's times. With ``target.inherit`` each event is
    opened on its own: kernels before 4.13 reject ``inherit`` together with
    ``PERF_FORMAT_GROUP`` (kernel/events/core.c, perf_event_open), so such a read is one
    ``read(2)`` per event and not atomic across events; each value is scaled by its own times.
    """

    def __init__(self, events: tuple[str, ...], target: Target, fds: list[int],
                 ids: dict[int, str], grouped: bool, unsupported: dict[str, str],
                 groups: Sequence[tuple[Sequence[str], Sequence[int]]] | None = None) -> None:
        """``groups``: per kernel group, its member names in kernel order and their fds (the
        leader first); ``ids`` maps each event id (PERF_EVENT_IOC_ID) to its name. Without
        ``groups`` a grouped set is one kernel group led by ``fds[0]`` in ``events`` order."""
        self.events = events
        self.target = target
        self.grouped = grouped
        self._fds = fds
        self._ids = ids
        self._unsupported = unsupported
        by_name = {name: event_id for event_id, name in ids.items()}
        kernel: list[_KernelGroup] = []
        if grouped and fds:
            layout = groups if groups is not None else [(events, fds)]
            for names, group_fds in layout:
                kernel.append(_KernelGroup(names, group_fds,
                                           [by_name.get(n, -1) for n in names]))
        self._groups = tuple(kernel)
        # The raw-tuple layout of read_raw(): per group (enabled, running, values...) in kernel
        # order; _single is the one-group fast path (the common case: the marker's hot path).
        self._single = kernel[0] if len(kernel) == 1 else None
        self._raw_names = tuple(n for g in kernel for n in g.names)
        self._reorder = self._raw_names != tuple(events)
        # Closes the fds if the caller drops the group without close().
        self._finalizer = weakref.finalize(self, _close_all, fds)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def groups(self) -> tuple[tuple[str, ...], ...]:
        """The kernel groups, each in the kernel's member order (one per event with inherit)."""
        if self._groups:
            return tuple(g.names for g in self._groups)
        return tuple((name,) for name in self.events)

    def read(self) -> Reading:
        """Cumulative counts since open, scaled for multiplexing (one read(2) per group)."""
        if self.closed:
            raise CounterdError("read() on a closed perf group", "open a new group")
        if not self._fds:
            return Reading({}, 0, 0, dict(self._unsupported))
        if not self.grouped:
            return self._read_separate()
        return self._decode([os.read(g.leader, g.size) for g in self._groups])

    def _read_separate(self) -> Reading:
        raw: dict[str, int] = {}
        times: dict[str, tuple[int, int]] = {}
        for fd in self._fds:
            value, en, run, event_id = parse_single_read(os.read(fd, 32))
            raw[self._ids[event_id]] = value
            times[self._ids[event_id]] = (en, run)
        values = {name: measured(raw[name], *times[name]) for name in self.events}
        enabled, running = _most_multiplexed(times.values())
        return PerfReading(values, enabled, running, dict(self._unsupported), times)

    def _decode(self, bufs: Sequence[bytes]) -> Reading:
        """Values from one read(2) buffer per group: a precompiled unpack when the layout is
        the one opened, else the checked decoder (parse_group_read) on the same bytes."""
        src = Source.MEASURED
        values: dict[str, CounterValue] = {}
        times: dict[str, tuple[int, int]] = {}
        spans: list[tuple[int, int]] = []
        for g, buf in zip(self._groups, bufs, strict=True):
            fields = g.struct.unpack(buf) if len(buf) == g.size else ()
            if fields and fields[0] == g.n and fields[4::2] == g.ids:
                enabled, running = fields[1], fields[2]
                raws = dict(zip(g.names, fields[3::2], strict=True))
            else:
                sample = parse_group_read(buf, g.id_map)
                enabled, running, raws = (sample.time_enabled_ns, sample.time_running_ns,
                                          sample.raw)
            factor, ratio = scale(1, enabled, running)
            for name, raw in raws.items():
                values[name] = CounterValue(raw * factor, src, ratio, raw)
                times[name] = (enabled, running)
            spans.append((enabled, running))
        if self._reorder:
            values = {name: values[name] for name in self.events if name in values}
        if len(spans) == 1:
            return Reading(values, spans[0][0], spans[0][1], self._unsupported)
        enabled, running = _most_multiplexed(spans)
        return PerfReading(values, enabled, running, self._unsupported, times)

    def read_raw(self) -> tuple[int, ...] | Reading:
        """The marker's hot path: per kernel group ``(time_enabled, time_running, raw...)`` in
        the kernel's member order, concatenated, from one read(2) per group, with no objects
        built (about 1 us for one group, where ``read()`` costs about 6). Turned into counter
        values by :meth:`delta_raw` when a record is needed. When a buffer does not have the
        layout opened, the same bytes are decoded by the checked decoder and a Reading is
        returned (no second read); with inherit (no atomic group) it is ``read()``."""
        single = self._single
        if single is not None and self._finalizer.alive:
            buf = os.read(single.leader, single.size)
            if len(buf) == single.size:
                fields = single.struct.unpack(buf)
                if fields[0] == single.n and fields[4::2] == single.ids:
                    return fields[1:3] + fields[3::2]
            return self._decode([buf])
        if self._groups and self._finalizer.alive:
            bufs = [os.read(g.leader, g.size) for g in self._groups]
            out: tuple[int, ...] = ()
            for g, buf in zip(self._groups, bufs, strict=True):
                if len(buf) != g.size:
                    return self._decode(bufs)
                fields = g.struct.unpack(buf)
                if fields[0] != g.n or fields[4::2] != g.ids:
                    return self._decode(bufs)
                out += fields[1:3] + fields[3::2]
            return out
        return self.read()

    def delta_raw(self, start: tuple[int, ...] | Reading, stop: tuple[int, ...] | Reading
                  ) -> tuple[dict[str, CounterValue], Mapping[str, str]]:
        """Counter values of the span between two :meth:`read_raw` results, each group's
        values scaled by that group's own enabled/running span (as :meth:`Reading.delta`),
        and the counters that could not be opened."""
        if isinstance(start, Reading) or isinstance(stop, Reading):
            a = start if isinstance(start, Reading) else self._as_reading(start)
            b = stop if isinstance(stop, Reading) else self._as_reading(stop)
            return b.delta(a), b.unsupported
        src = Source.MEASURED
        if self._single is not None:
            de, dr = stop[0] - start[0], stop[1] - start[1]
            factor, ratio = scale(1, de, dr) if de > 0 else (1.0, 1.0)
            values = {name: CounterValue((y - x) * factor, src, ratio, y - x)
                      for name, x, y in zip(self._raw_names, start[2:], stop[2:], strict=True)}
        else:
            values = {}
            at = 0
            for g in self._groups:
                de, dr = stop[at] - start[at], stop[at + 1] - start[at + 1]
                factor, ratio = scale(1, de, dr) if de > 0 else (1.0, 1.0)
                for i, name in enumerate(g.names, at + 2):
                    d = stop[i] - start[i]
                    values[name] = CounterValue(d * factor, src, ratio, d)
                at += 2 + g.n
        if self._reorder:
            values = {name: values[name] for name in self.events}
        return values, self._unsupported

    def _as_reading(self, raw: tuple[int, ...]) -> Reading:
        src = Source.MEASURED
        values: dict[str, CounterValue] = {}
        times: dict[str, tuple[int, int]] = {}
        spans = []
        at = 0
        for names in [g.names for g in self._groups] or [self.events]:
            enabled, running = raw[at], raw[at + 1]
            factor, ratio = scale(1, enabled, running)
            for name, v in zip(names, raw[at + 2:at + 2 + len(names)], strict=True):
                values[name] = CounterValue(v * factor, src, ratio, v)
                times[name] = (enabled, running)
            spans.append((enabled, running))
            at += 2 + len(names)
        if self._reorder:
            values = {name: values[name] for name in self.events}
        if len(spans) == 1:
            return Reading(values, spans[0][0], spans[0][1], self._unsupported)
        enabled, running = _most_multiplexed(spans)
        return PerfReading(values, enabled, running, self._unsupported, times)

    def close(self) -> None:
        """Close every fd; safe to call more than once."""
        self._finalizer()

    def __enter__(self) -> PerfGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _most_multiplexed(spans: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """The (enabled, running) pair with the lowest running/enabled ratio."""
    return min(spans, key=lambda s: scale(1, s[0], s[1])[1], default=(0, 0))


# --------------------------------------------------------------------------------------------
# Opening groups: the attr of one event, EINVAL splitting
# --------------------------------------------------------------------------------------------


def make_attr(spec: EventSpec, *, leader: bool, inherit: bool, include_kernel: bool,
              group: bool) -> PerfEventAttr:
    """The ``perf_event_attr`` for one event (counting, not sampling)."""
    attr = PerfEventAttr()
    attr.type = spec.type
    attr.size = ctypes.sizeof(PerfEventAttr)
    attr.config = spec.config
    attr.config1 = spec.config1
    attr.read_format = (PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
                        | PERF_FORMAT_ID | (PERF_FORMAT_GROUP if group else 0))
    attr.disabled = 1 if leader else 0  # members follow their leader's enable state
    attr.inherit = 1 if inherit else 0
    kernel = include_kernel or spec.kernel_side
    attr.exclude_kernel = 0 if kernel else 1
    attr.exclude_hv = 0 if kernel else 1
    return attr


class _Opener:
    """Opens planned groups for :meth:`PerfBackend.open_groups`, splitting what the kernel
    rejects.

    A member the kernel refuses to add to a group (EINVAL: the group would not fit the PMU,
    or the member's encoding is bad; or an error of the event itself such as ENOENT or
    EACCES) leaves the group as it was (a failed perf_event_open changes nothing), so the
    group keeps the members already accepted, later members still try to join it, and the
    refused ones form the next group, split again the same way, down to single events. An
    event is left out only when it fails as the leader of a group of its own, i.e. alone
    (strict: that error is raised), with the errno translated for that event; errors that
    are not about the event (ESRCH, EMFILE, ...) always raise.
    """

    def __init__(self, syscall: Syscall, target: Target, *, grouped: bool, strict: bool,
                 include_kernel: bool, paranoid: int | None, seccomp: int | None = None
                 ) -> None:
        self.syscall = syscall
        self.target = target
        self.grouped = grouped
        self.strict = strict
        self.include_kernel = include_kernel
        self.paranoid = paranoid
        self.seccomp = seccomp  # for the EPERM the paranoid level does not explain
        self.groups: list[tuple[tuple[str, ...], list[int]]] = []
        self.ids: dict[int, str] = {}
        self.unsupported: dict[str, str] = {}
        self.splits = 0  # planned groups the kernel made us split (for tests and logs)

    @property
    def fds(self) -> list[int]:
        return [fd for _, fds in self.groups for fd in fds]

    def _error(self, err: int, name: str, spec: EventSpec) -> CounterdError:
        return translate_errno(err, name, self.target, self.paranoid,
                               include_kernel=self.include_kernel or spec.kernel_side,
                               encoding=spec.describe(), seccomp=self.seccomp)

    def open(self, members: Sequence[tuple[str, EventSpec]]) -> None:
        pid, cpu = self.target.kernel_tid, self.target.cpu
        pending = list(members)
        while pending:
            fds: list[int] = []
            names: list[str] = []
            refused: list[tuple[str, EventSpec]] = []
            for name, spec in pending:
                attr = make_attr(spec, leader=not fds, inherit=self.target.inherit,
                                 include_kernel=self.include_kernel, group=self.grouped)
                try:
                    fd = self.syscall(attr, pid, cpu, fds[0] if fds else -1,
                                      PERF_FLAG_FD_CLOEXEC)
                except OSError as exc:
                    err = self._error(exc.errno or 0, name, spec)
                    if not isinstance(err, EventNotSupported | CounterAccessDenied):
                        _close_all(fds)
                        raise err from exc
                    if fds:  # refused by this group: it tries the next one
                        refused.append((name, spec))
                    elif self.strict:  # refused alone: the event's own verdict
                        raise err from exc
                    else:
                        self.unsupported[name] = err.reason
                    continue
                fds.append(fd)
                names.append(name)
                try:
                    self.ids[_event_id(fd)] = name
                except OSError:
                    _close_all(fds)
                    raise
            if fds:
                self.groups.append((tuple(names), fds))
            if refused:
                self.splits += 1
            pending = refused
