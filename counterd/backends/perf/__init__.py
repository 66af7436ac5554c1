"""Linux ``perf_event_open(2)`` counters through ctypes (DESIGN.md section 4, backend ``perf``).

:class:`PerfBackend` is the backend; it builds on one module per concept, each importing only
the ones listed before it:

- :mod:`~counterd.backends.perf.syscall`: ``struct perf_event_attr``, the ABI constants, the
  syscall with its ioctl and fd helpers, and errno translation (:func:`translate_errno`);
- :mod:`~counterd.backends.perf.tables`: the versioned event tables in ``events/`` (one JSON
  file per CPU family, plus ``generic.json``) and the CPU family detection;
- :mod:`~counterd.backends.perf.schedule`: the pure group scheduler (:func:`schedule_groups`);
- :mod:`~counterd.backends.perf.group`: opening kernel groups (EINVAL splitting) and reading
  them atomically (:class:`PerfGroup`, :class:`PerfReading`).

The names other code imports from ``counterd.backends.perf`` are re-exported here.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from counterd.backends import auto_picks_alone
from counterd.backends.base import THIS_THREAD, Capability, Target
from counterd.backends.perf.group import (
    GroupSample,
    PerfGroup,
    PerfReading,
    _Opener,
    make_attr,
    parse_group_read,
)
from counterd.backends.perf.schedule import (
    PmuLayout,
    assign_counters,
    counter_choices,
    schedule_groups,
)
from counterd.backends.perf.syscall import (
    BACKEND,
    PERF_COUNT_SW_CPU_CLOCK,
    PERF_COUNT_SW_TASK_CLOCK,
    PERF_EVENT_IOC_ENABLE,
    PERF_EVENT_IOC_RESET,
    PERF_FLAG_FD_CLOEXEC,
    PERF_IOC_FLAG_GROUP,
    PERF_TYPE_HW_CACHE,
    PERF_TYPE_RAW,
    PERF_TYPE_SOFTWARE,
    PerfEventAttr,
    Syscall,
    _close_all,
    perf_event_open,
    read_seccomp,
    translate_errno,
)
from counterd.backends.perf.tables import (
    PERF_EXTRA_NAMES,
    TABLE_FORMAT_VERSION,
    CounterConstraint,
    EventSpec,
    EventTable,
    FixedCounter,
    PmuFacts,
    TableError,
    amd_generation,
    amd_raw_config,
    cpu_label,
    event_table,
    family_table,
    hw_cache_config,
    intel_raw_config,
    load_tables,
    parse_table,
    pmu_facts,
)
from counterd.data.errors import CounterdError, EventNotSupported, UnknownCounter
from counterd.data.events import NAMES, Source, scale
from counterd.data.host import core_pmu, no_pmu_reason, parse_cpuinfo, read_paranoid
from counterd.perf_abi import PerfPlan, parse_single_read

# Files under <sysfs>/bus/event_source/devices/<pmu>/caps/ that would give the number of
# general counters. Linux up to 6.1x exports no such file for x86 core PMUs (caps/ holds
# max_precise, pmu_name, branches, branch_counter_nr, branch_counter_width), so the family
# table decides today; a kernel or a test fixture that writes one of these overrides it.
CAPS_GENERAL_COUNTER_FILES: tuple[str, ...] = ("num_counters", "num_gp_counters")


class PerfBackend:
    """Counters from the Linux kernel's perf_events subsystem.

    ``sysfs_root`` and ``procfs_root`` are where /sys and /proc are read from (the PMU list and
    its caps, SMT state, perf_event_paranoid, nmi_watchdog, cpuinfo), so tests can pass fixture
    trees. ``syscall`` replaces ``perf_event_open`` (same arguments: attr, pid, cpu, group_fd,
    flags; returns an fd or raises OSError), e.g. with a model of a PMU in tests.
    """

    name = "perf"
    source = Source.MEASURED

    def __init__(self, sysfs_root: str | os.PathLike[str] = "/sys",
                 procfs_root: str | os.PathLike[str] = "/proc", *,
                 syscall: Syscall | None = None) -> None:
        self.sysfs_root = Path(sysfs_root)
        self.procfs_root = Path(procfs_root)
        self._syscall: Syscall = syscall or perf_event_open

    # Host facts -------------------------------------------------------------------------

    def cpu(self) -> tuple[str, int, int]:
        """(vendor, family, model) from <procfs_root>/cpuinfo."""
        try:
            return parse_cpuinfo(Path(self.procfs_root, "cpuinfo").read_text())
        except OSError:
            return "", 0, 0

    def table(self) -> dict[str, EventSpec | str]:
        return event_table(*self.cpu())

    def paranoid(self) -> int | None:
        return read_paranoid(self.procfs_root)

    def smt_splits_counters(self) -> bool:
        """Whether sibling hardware threads share the core's general counters (Intel cores
        before Ice Lake give each thread half). Only ``smt/control`` = ``notsupported`` (no
        sibling threads: SMT absent or off in firmware) counts as unshared: when the kernel
        turned SMT off (``off``/``forceoff``) the firmware still split the counters at boot;
        unknown means shared, the smaller count."""
        try:
            control = Path(self.sysfs_root, "devices/system/cpu/smt/control").read_text()
        except OSError:
            return True
        return control.strip() != "notsupported"

    def nmi_watchdog(self) -> bool:
        """kernel.nmi_watchdog=1: the hard-lockup detector holds a cycles counter per CPU."""
        try:
            return Path(self.procfs_root, "sys/kernel/nmi_watchdog").read_text().strip() == "1"
        except OSError:
            return False

    def caps_general_counters(self) -> int | None:
        """The general-counter count from the core PMU's sysfs caps, where one is exported."""
        pmu = core_pmu(self.sysfs_root)
        for device in dict.fromkeys(p for p in (pmu, "cpu", "cpu_core") if p):
            for file in CAPS_GENERAL_COUNTER_FILES:
                path = Path(self.sysfs_root, "bus/event_source/devices", device, "caps", file)
                try:
                    return int(path.read_text().strip(), 0)
                except (OSError, ValueError):
                    continue
        return None

    def pmu_layout(self) -> PmuLayout:
        """The counters the group scheduler plans with on this host (see :class:`PmuLayout`)."""
        vendor, family, model = self.cpu()
        facts = pmu_facts(vendor, family, model)
        caps = self.caps_general_counters()
        smt = self.smt_splits_counters()
        where = (f"sysfs caps ({caps} general counters)" if caps is not None else
                 f"{cpu_label(vendor, family, model)} table, SMT {'on' if smt else 'off'}")
        return PmuLayout.from_facts(facts, smt=smt, general=caps, watchdog=self.nmi_watchdog(),
                                    source=where)

    def plan(self, events: Sequence[str]) -> list[tuple[str, ...]]:
        """The kernel groups :meth:`open` would try for these counters on this host (counters
        the table cannot count, or hardware ones without a PMU, are left out)."""
        wanted, _ = self._resolve(self._check_names(events), strict=False)
        return schedule_groups(wanted, self.pmu_layout())

    # Backend protocol -------------------------------------------------------------------

    def available(self) -> Capability:
        """What perf can count here; never raises. Each counter is tried alone on the calling
        thread (user space only); hardware counters are not tried when sysfs lists no core PMU.
        """
        paranoid = self.paranoid()
        probe = load_tables()[0].software["task_clock_ns"]
        assert isinstance(probe, EventSpec)
        try:
            self._probe(probe, Target(), include_kernel=False)
        except (OSError, CounterdError) as exc:
            reason = exc.what if isinstance(exc, CounterdError) else str(
                translate_errno(exc.errno or 0, "task_clock_ns", Target(), paranoid,
                                seccomp=read_seccomp(self.procfs_root)))
            return Capability(self.name, False, f"perf_event_open does not work here: {reason}")
        pmu = core_pmu(self.sysfs_root)
        counters: dict[str, str | None] = {}
        for name, entry in self.table().items():
            if isinstance(entry, str):
                counters[name] = entry
            elif entry.is_hardware and pmu is None:
                counters[name] = no_pmu_reason(self.sysfs_root)
            else:
                try:
                    self._probe(entry, Target(), include_kernel=False)
                    counters[name] = None
                except OSError as exc:
                    counters[name] = self.open_error(exc.errno or 0, name, Target())
        reason = (f"perf_event_open works (kernel.perf_event_paranoid={paranoid}); "
                  + (f"core PMU {pmu}" if pmu else "software events only: "
                     + no_pmu_reason(self.sysfs_root)))
        return Capability(self.name, True, reason, counters)

    def open(self, events: Sequence[str], target: Target = THIS_THREAD, *, strict: bool = True,
             include_kernel: bool = False) -> PerfGroup:
        """Open ``events`` on ``target`` as kernel groups that fit the PMU (see
        :func:`schedule_groups` and :class:`PerfGroup`).

        ``strict``: the first event that cannot be counted raises (EventNotSupported,
        CounterAccessDenied, ...); otherwise it is left out and listed in
        ``Reading.unsupported`` with the reason. Only an event that fails when opened alone is
        left out: a group the kernel rejects with EINVAL is split. A missing target
        (NoSuchTarget) and the fd limit always raise. ``include_kernel`` also counts kernel
        mode (needs perf_event_paranoid <= 1 or privileges).
        """
        names = self._check_names(events)
        wanted, unsupported = self._resolve(names, strict)
        specs = dict(wanted)
        if target.inherit:
            plan: list[tuple[str, ...]] = [(name,) for name, _ in wanted]
        else:
            plan = schedule_groups(wanted, self.pmu_layout())
        return self.open_groups([[(n, specs[n]) for n in group] for group in plan], target,
                                strict=strict, include_kernel=include_kernel,
                                unsupported=unsupported, order=names)

    def open_groups(self, groups: Sequence[Sequence[tuple[str, EventSpec]]],
                    target: Target = THIS_THREAD, *, strict: bool = True,
                    include_kernel: bool = False, unsupported: Mapping[str, str] | None = None,
                    order: Sequence[str] | None = None) -> PerfGroup:
        """Open the given kernel groups as they are (no scheduling; EINVAL still splits), e.g.
        events that are not canonical counters. ``order`` is the order of ``events`` and of
        reading values (default: the groups' order); with ``target.inherit`` every event is
        opened on its own."""
        grouped = not target.inherit
        opener = _Opener(self._syscall, target, grouped=grouped, strict=strict,
                         include_kernel=include_kernel, paranoid=self.paranoid(),
                         seccomp=read_seccomp(self.procfs_root))
        opener.unsupported.update(unsupported or {})
        try:
            for members in groups:
                if grouped:
                    opener.open(list(members))
                else:
                    for member in members:
                        opener.open([member])
            for _, fds in opener.groups:
                if grouped:
                    fcntl.ioctl(fds[0], PERF_EVENT_IOC_RESET, PERF_IOC_FLAG_GROUP)
                    fcntl.ioctl(fds[0], PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)
                else:
                    fcntl.ioctl(fds[0], PERF_EVENT_IOC_RESET, 0)
                    fcntl.ioctl(fds[0], PERF_EVENT_IOC_ENABLE, 0)
        except BaseException:
            _close_all(opener.fds)
            raise
        opened = {name for names, _ in opener.groups for name in names}
        sequence = order if order is not None else [n for g in groups for n, _ in g]
        events = tuple(n for n in sequence if n in opened)
        return PerfGroup(events, target, opener.fds, opener.ids, grouped, opener.unsupported,
                         groups=opener.groups if grouped else None)

    def whole_command_plan(self, events: Sequence[str] = (), cap: Capability | None = None
                           ) -> PerfPlan:
        """The attributes that count ``events`` (default: every counter :meth:`available`
        finds here) over a command's whole process tree, for :func:`counterd.launch.open_plan`:
        each event on its own (inherit), created disabled and enabled by the kernel when the
        command execs (enable_on_exec), user space only. A counter the table or the PMU cannot
        give is in ``unsupported`` with the reason; ``auto`` says whether ``counterd record
        --backend auto`` picks perf on this capability alone. ``cap``: a probe already made
        (None: probe)."""
        cap = cap if cap is not None else self.available()
        if not events:
            events = tuple(c for c, why in cap.counters.items() if why is None)
        wanted, unsupported = self._resolve(self._check_names(events), strict=False)
        attrs = []
        for _, spec in wanted:
            attr = make_attr(spec, leader=True, inherit=True, include_kernel=False,
                             group=False)
            attr.enable_on_exec = 1
            attrs.append(bytes(attr))
        return PerfPlan([name for name, _ in wanted], attrs, unsupported,
                        auto=auto_picks_alone("record", "perf", cap))

    def open_error(self, err: int, event: str, target: Target) -> str:
        """Why ``event`` could not be opened on ``target`` with errno ``err``, as :meth:`open`
        says it."""
        entry = self.table().get(event)
        spec = entry if isinstance(entry, EventSpec) else None
        return str(translate_errno(err, event, target, self.paranoid(),
                                   include_kernel=spec is not None and spec.kernel_side,
                                   encoding=spec.describe() if spec is not None else "",
                                   seccomp=read_seccomp(self.procfs_root)))

    # Internals --------------------------------------------------------------------------

    def _resolve(self, names: tuple[str, ...], strict: bool
                 ) -> tuple[list[tuple[str, EventSpec]], dict[str, str]]:
        """The table's EventSpec for each name, or (strict) EventNotSupported / (lenient) the
        reason in the second dict; hardware events need a core PMU in sysfs."""
        table = self.table()
        pmu = core_pmu(self.sysfs_root)
        unsupported: dict[str, str] = {}
        wanted: list[tuple[str, EventSpec]] = []
        for name in names:
            entry = table.get(name, f"no perf event is known for {name}")
            if isinstance(entry, EventSpec) and entry.is_hardware and pmu is None:
                entry = no_pmu_reason(self.sysfs_root)
            if isinstance(entry, str):
                if strict:
                    raise EventNotSupported(name, BACKEND, entry)
                unsupported[name] = entry
            else:
                wanted.append((name, entry))
        return wanted, unsupported

    @staticmethod
    def _check_names(events: Sequence[str]) -> tuple[str, ...]:
        for name in events:
            if name not in NAMES and name not in PERF_EXTRA_NAMES:
                raise UnknownCounter(name, NAMES)
        if len(set(events)) != len(events):
            raise CounterdError(f"counter listed twice in {list(events)}",
                                "list each counter once")
        return tuple(events)

    def _probe(self, spec: EventSpec, target: Target, include_kernel: bool) -> None:
        attr = make_attr(spec, leader=True, inherit=False, include_kernel=include_kernel,
                         group=False)
        os.close(self._syscall(attr, target.kernel_tid, target.cpu, -1, PERF_FLAG_FD_CLOEXEC))


__all__ = [
    "CAPS_GENERAL_COUNTER_FILES", "CounterConstraint", "EventSpec", "EventTable",
    "FixedCounter", "GroupSample", "PERF_EXTRA_NAMES", "PerfBackend", "PerfEventAttr",
    "PerfGroup", "PerfReading", "PmuFacts", "PmuLayout", "TableError", "amd_raw_config",
    "assign_counters", "counter_choices", "event_table", "family_table", "hw_cache_config",
    "intel_raw_config", "load_tables", "parse_cpuinfo", "parse_group_read",
    "parse_single_read", "parse_table", "pmu_facts", "scale", "schedule_groups",
    "translate_errno",
    # Re-exported from the modules above for the tests, which use them through this package.
    "PERF_COUNT_SW_CPU_CLOCK", "PERF_COUNT_SW_TASK_CLOCK", "PERF_TYPE_HW_CACHE", "PERF_TYPE_RAW",
    "PERF_TYPE_SOFTWARE", "TABLE_FORMAT_VERSION", "amd_generation", "core_pmu", "cpu_label",
    "perf_event_open",
]
