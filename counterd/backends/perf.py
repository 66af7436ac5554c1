"""Linux ``perf_event_open(2)`` counters through ctypes (DESIGN.md section 4, backend ``perf``).

The counters of one :class:`~counterd.backends.base.Target` form a :class:`PerfGroup`: one or
more kernel groups, each a disabled leader plus members opened with ``group_fd`` and read
atomically with one ``read(2)`` of ``PERF_FORMAT_GROUP | TOTAL_TIME_ENABLED |
TOTAL_TIME_RUNNING | ID``; values are scaled for multiplexing (``raw * enabled / running``)
and carry their group's ratio ``running / enabled``.

Which event counts which canonical counter depends on the CPU: versioned data files in
``perf_events/`` (one per CPU family, plus ``generic.json``) give, per canonical counter, an
:class:`EventSpec` or the reason it cannot be had, with the source each encoding was checked
against, and the family's PMU facts (general counters with SMT on/off, fixed counters,
counter constraints). :func:`schedule_groups` partitions the requested events into groups
that fit those counters (a bipartite matching per group); the kernel multiplexes the groups,
and a group it still rejects with EINVAL is split (:class:`_Opener`). Errors from the kernel
become :mod:`counterd.errors` in one pure function, :func:`translate_errno`.

References: perf_event_open(2) man page; include/uapi/linux/perf_event.h;
kernel/events/core.c (perf_copy_attr, perf_read_group); arch/x86/events/core.c
(validate_group, x86_schedule_events); arch/x86/events/intel/core.c and amd/core.c (event
constraints, generic event maps); the encodings cite intel/perfmon and the kernel's
tools/perf/pmu-events/arch/x86/<cpu>/*.json in each data file.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import fcntl
import functools
import importlib.resources
import json
import os
import platform
import struct
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterd.backends.base import THIS_THREAD, Capability, CounterValue, Reading, Target
from counterd.errors import (
    BackendUnavailable,
    CounterAccessDenied,
    CounterdError,
    EventNotSupported,
    NoSuchTarget,
    UnknownCounter,
)
from counterd.events import NAMES, Source
from counterd.host import core_pmu, no_pmu_reason, parse_cpuinfo, read_paranoid

BACKEND = "perf"

# --------------------------------------------------------------------------------------------
# ABI constants (include/uapi/linux/perf_event.h)
# --------------------------------------------------------------------------------------------

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_TYPE_TRACEPOINT = 2
PERF_TYPE_HW_CACHE = 3
PERF_TYPE_RAW = 4

PERF_COUNT_HW_CPU_CYCLES = 0
PERF_COUNT_HW_INSTRUCTIONS = 1

PERF_COUNT_SW_CPU_CLOCK = 0
PERF_COUNT_SW_TASK_CLOCK = 1
PERF_COUNT_SW_PAGE_FAULTS = 2
PERF_COUNT_SW_CONTEXT_SWITCHES = 3

# PERF_TYPE_HW_CACHE config = id | (op << 8) | (result << 16)
PERF_COUNT_HW_CACHE_L1D = 0
PERF_COUNT_HW_CACHE_LL = 2
PERF_COUNT_HW_CACHE_DTLB = 3
PERF_COUNT_HW_CACHE_OP_READ = 0
PERF_COUNT_HW_CACHE_OP_WRITE = 1
PERF_COUNT_HW_CACHE_RESULT_ACCESS = 0
PERF_COUNT_HW_CACHE_RESULT_MISS = 1

PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_ID = 1 << 2
PERF_FORMAT_GROUP = 1 << 3

PERF_FLAG_FD_CLOEXEC = 1 << 3

# ioctls: _IO('$', n) = 0x2400 | n; PERF_EVENT_IOC_ID is _IOR('$', 7, __u64).
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_RESET = 0x2403
PERF_EVENT_IOC_ID = 0x80082407
PERF_IOC_FLAG_GROUP = 1

# __NR_perf_event_open: arch/x86/entry/syscalls/syscall_64.tbl (298) and
# include/uapi/asm-generic/unistd.h, used by arm64 (241).
SYSCALL_NUMBERS: dict[str, int] = {"x86_64": 298, "aarch64": 241, "arm64": 241}

HARDWARE_TYPES = frozenset({PERF_TYPE_HARDWARE, PERF_TYPE_HW_CACHE, PERF_TYPE_RAW})

class PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` as of PERF_ATTR_SIZE_VER8 (136 bytes, Linux 6.3+: config3).

    Older kernels accept a larger ``size`` as long as the bytes they do not know are zero
    (kernel/events/core.c: perf_copy_attr), so one layout serves every kernel >= 2.6.32;
    E2BIG means a non-zero field beyond the running kernel's size.
    """

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),  # union with sample_freq
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        # The flag bitfield, in declaration order from perf_event.h.
        ("disabled", ctypes.c_uint64, 1),
        ("inherit", ctypes.c_uint64, 1),
        ("pinned", ctypes.c_uint64, 1),
        ("exclusive", ctypes.c_uint64, 1),
        ("exclude_user", ctypes.c_uint64, 1),
        ("exclude_kernel", ctypes.c_uint64, 1),
        ("exclude_hv", ctypes.c_uint64, 1),
        ("exclude_idle", ctypes.c_uint64, 1),
        ("mmap", ctypes.c_uint64, 1),
        ("comm", ctypes.c_uint64, 1),
        ("freq", ctypes.c_uint64, 1),
        ("inherit_stat", ctypes.c_uint64, 1),
        ("enable_on_exec", ctypes.c_uint64, 1),
        ("task", ctypes.c_uint64, 1),
        ("watermark", ctypes.c_uint64, 1),
        ("precise_ip", ctypes.c_uint64, 2),
        ("mmap_data", ctypes.c_uint64, 1),
        ("sample_id_all", ctypes.c_uint64, 1),
        ("exclude_host", ctypes.c_uint64, 1),
        ("exclude_guest", ctypes.c_uint64, 1),
        ("exclude_callchain_kernel", ctypes.c_uint64, 1),
        ("exclude_callchain_user", ctypes.c_uint64, 1),
        ("mmap2", ctypes.c_uint64, 1),
        ("comm_exec", ctypes.c_uint64, 1),
        ("use_clockid", ctypes.c_uint64, 1),
        ("context_switch", ctypes.c_uint64, 1),
        ("write_backward", ctypes.c_uint64, 1),
        ("namespaces", ctypes.c_uint64, 1),
        ("ksymbol", ctypes.c_uint64, 1),
        ("bpf_event", ctypes.c_uint64, 1),
        ("aux_output", ctypes.c_uint64, 1),
        ("cgroup", ctypes.c_uint64, 1),
        ("text_poke", ctypes.c_uint64, 1),
        ("build_id", ctypes.c_uint64, 1),
        ("inherit_thread", ctypes.c_uint64, 1),
        ("remove_on_exec", ctypes.c_uint64, 1),
        ("sigtrap", ctypes.c_uint64, 1),
        ("reserved_1", ctypes.c_uint64, 26),
        ("wakeup_events", ctypes.c_uint32),  # union with wakeup_watermark
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),  # union with bp_addr, kprobe_func, uprobe_path
        ("config2", ctypes.c_uint64),  # union with bp_len, kprobe_addr, probe_offset
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
        ("aux_sample_size", ctypes.c_uint32),
        ("reserved_3", ctypes.c_uint32),  # aux_start_paused/aux_pause/aux_resume bits (6.13)
        ("sig_data", ctypes.c_uint64),
        ("config3", ctypes.c_uint64),
    ]


PERF_ATTR_SIZE_VER8 = 136
assert ctypes.sizeof(PerfEventAttr) == PERF_ATTR_SIZE_VER8  # layout guard, not input checking


# --------------------------------------------------------------------------------------------
# Event tables: versioned data files in counterd/backends/perf_events/*.json
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventSpec:
    """How to count one canonical counter: ``perf_event_attr.type``/``config`` (+ config1).

    ``event`` is the vendor's or perf's name for it; ``note`` says where it differs from the
    canonical definition in counterd/events.py (an honest caveat, empty when it matches);
    ``source`` what the encoding was checked against; ``verified`` is False where no vendor
    or kernel list has the event (the note says which list it comes from).
    ``kernel_side``: the event only ever fires in kernel mode, so it is opened without
    ``exclude_kernel`` (which would filter every occurrence out, kernel/events/core.c
    perf_exclude_event) and needs perf_event_paranoid <= 1 or privileges.
    ``kernel_config``: for perf's generic events (PERF_TYPE_HARDWARE / HW_CACHE), the raw event
    the kernel programs for them on this CPU family, which decides the counters it may use.
    """

    type: int
    config: int
    event: str
    note: str = ""
    config1: int = 0
    kernel_side: bool = False
    source: str = ""
    kernel_config: int | None = None
    verified: bool = True

    @property
    def is_hardware(self) -> bool:
        return self.type in HARDWARE_TYPES

    @property
    def raw_config(self) -> int | None:
        """The raw event the PMU is programmed with (None: not known for this CPU)."""
        return self.config if self.type == PERF_TYPE_RAW else self.kernel_config

    def describe(self) -> str:
        kind = TYPE_NAMES.get(self.type, str(self.type))
        return f"{self.event} ({kind} config {self.config:#x})"


def hw_cache_config(cache: int, op: int, result: int) -> int:
    """``PERF_TYPE_HW_CACHE`` config: ``id | op << 8 | result << 16`` (perf_event_open(2))."""
    return cache | (op << 8) | (result << 16)


def intel_raw_config(event: int, umask: int, cmask: int = 0, inv: bool = False,
                     edge: bool = False) -> int:
    """``PERF_TYPE_RAW`` config for an Intel core event: IA32_PERFEVTSELx layout
    (SDM vol. 3B 20.2.1.1): event[7:0], umask[15:8], edge[18], inv[23], cmask[31:24];
    the same fields as /sys/bus/event_source/devices/cpu/format/*."""
    return (event & 0xFF) | (umask & 0xFF) << 8 | int(edge) << 18 | int(inv) << 23 | (
        cmask & 0xFF) << 24


def amd_raw_config(event: int, umask: int) -> int:
    """``PERF_TYPE_RAW`` config for an AMD core event: PERF_CTL layout, event[7:0],
    umask[15:8], event[11:8] in bits [35:32] (/sys/.../cpu/format/event = config:0-7,32-35)."""
    return (event & 0xFF) | (umask & 0xFF) << 8 | ((event >> 8) & 0xF) << 32


# Counters that only perf provides; accepted by open() even if events.py does not list them.
PERF_EXTRA_NAMES: tuple[str, ...] = ("context_switches",)

TABLE_FORMAT_VERSION = 1  # the data-file layout this module reads (perf_events/README.md)
TYPE_NAMES: dict[int, str] = {PERF_TYPE_HARDWARE: "hardware", PERF_TYPE_SOFTWARE: "software",
                              PERF_TYPE_HW_CACHE: "hw_cache", PERF_TYPE_RAW: "raw"}
_TYPES_BY_NAME = {name: number for number, name in TYPE_NAMES.items()}
_ENCODERS = {"GenuineIntel": intel_raw_config, "AuthenticAMD": amd_raw_config}


class TableError(CounterdError):
    """A perf_events/*.json file is malformed or newer than this code."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"perf event table {path}: {what}",
                         "the tables are package data of counterd: reinstall it, or fix the "
                         "file (perf_events/README.md describes the format)")


@dataclass(frozen=True)
class FixedCounter:
    """A fixed-function counter: it counts one event (``config``, event | umask << 8) only.
    The kernel also lets that event use a general counter unless ``fixed_only`` (the
    pseudo-encodings with event code 0, arch/x86/events/intel/core.c
    intel_pmu_check_event_constraints)."""

    index: int
    event: str
    config: int
    serves: tuple[str, ...] = ()
    fixed_only: bool = False


@dataclass(frozen=True)
class CounterConstraint:
    """General counters an event may use, matched on the event-select byte (and the umask when
    given), as the kernel's INTEL_EVENT_CONSTRAINT(_RANGE)/INTEL_UEVENT_CONSTRAINT entries;
    the first matching constraint of a family applies (x86_get_event_constraints)."""

    codes: tuple[tuple[int, int], ...]
    counters: frozenset[int]
    umask: int | None = None
    source: str = ""

    def matches(self, config: int) -> bool:
        code, umask = config & 0xFF, (config >> 8) & 0xFF
        if self.umask is not None and umask != self.umask:
            return False
        return any(lo <= code <= hi for lo, hi in self.codes)


@dataclass(frozen=True)
class PmuFacts:
    """What a CPU family's core PMU offers one logical CPU, from its table's ``pmu`` section."""

    general_smt_on: int
    general_smt_off: int
    fixed: tuple[FixedCounter, ...] = ()
    constraints: tuple[CounterConstraint, ...] = ()
    watchdog_config: int | None = None
    source: str = ""


@dataclass(frozen=True)
class EventTable:
    """One data file: a CPU family's encodings (or the generic ones) and its PMU facts."""

    name: str
    label: str
    revision: int
    path: str
    events: Mapping[str, EventSpec | str]
    pmu: PmuFacts
    matches: tuple[tuple[str, int, tuple[tuple[int, int], ...]], ...] = ()
    model_labels: Mapping[int, str] = field(default_factory=dict)
    software: Mapping[str, EventSpec | str] = field(default_factory=dict)
    label_appended: frozenset[str] = frozenset()

    def covers(self, vendor: str, family: int, model: int) -> bool:
        return any(v == vendor and f == family and any(lo <= model <= hi for lo, hi in ranges)
                   for v, f, ranges in self.matches)


def _int(value: object, path: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TableError(path, f"{what} must be an integer or a hex string, not {value!r}")
    try:
        return value if isinstance(value, int) else int(value, 0)
    except ValueError:
        raise TableError(path, f"{what}: {value!r} is not a number") from None


def _ranges(items: Sequence[object], path: str, what: str) -> tuple[tuple[int, int], ...]:
    """``["0x01-0x8f", "0xce"]`` -> ((1, 0x8f), (0xce, 0xce))."""
    out = []
    for item in items:
        lo, _, hi = str(item).partition("-")
        out.append((_int(lo, path, what), _int(hi or lo, path, what)))
    return tuple(out)


def _counter_set(text: object, path: str) -> frozenset[int]:
    return frozenset(i for lo, hi in _ranges(str(text).split(","), path, "counters")
                     for i in range(lo, hi + 1))


def _event_entry(name: str, entry: Mapping[str, Any], vendor: str | None,
                 path: str) -> EventSpec | str:
    if "unsupported" in entry:
        return str(entry["unsupported"])
    kind = entry.get("type")
    if kind not in _TYPES_BY_NAME:
        raise TableError(path, f"{name}: type {kind!r} is not one of {sorted(_TYPES_BY_NAME)}")
    config = _int(entry.get("config"), path, f"{name}.config")
    encoding = entry.get("encoding")
    if encoding is not None:  # the vendor's EventCode/UMask must give the same config
        encode = _ENCODERS.get(vendor or "")
        if encode is None:
            raise TableError(path, f"{name}: an encoding needs a vendor in the match rules")
        expected = encode(_int(encoding.get("EventCode"), path, f"{name}.EventCode"),
                          _int(encoding.get("UMask", 0), path, f"{name}.UMask"))
        if expected != config:
            raise TableError(path, f"{name}: config {config:#x} does not match its encoding "
                             f"{dict(encoding)} ({expected:#x})")
    kernel = entry.get("kernel_event")
    return EventSpec(
        type=_TYPES_BY_NAME[kind], config=config, event=str(entry.get("event", name)),
        note=str(entry.get("note", "")),
        config1=_int(entry.get("config1", 0), path, f"{name}.config1"),
        kernel_side=bool(entry.get("kernel_side", False)), source=str(entry.get("source", "")),
        kernel_config=None if kernel is None else _int(kernel.get("config"), path,
                                                       f"{name}.kernel_event"),
        verified=bool(entry.get("verified", True)))


def _pmu_facts(section: Mapping[str, Any], path: str) -> PmuFacts:
    general = section.get("general_counters") or {}
    fixed = tuple(
        FixedCounter(index=_int(f.get("index"), path, "fixed index"), event=str(f.get("event")),
                     config=_int(f.get("config"), path, "fixed config"),
                     serves=tuple(f.get("serves", ())), fixed_only=bool(f.get("fixed_only")))
        for f in section.get("fixed_counters", ()))
    constraints = tuple(
        CounterConstraint(codes=_ranges(c.get("event_codes", ()), path, "event_codes"),
                          counters=_counter_set(c.get("counters", ""), path),
                          umask=None if c.get("umask") is None else _int(c["umask"], path,
                                                                         "umask"),
                          source=str(c.get("source", "")))
        for c in section.get("constraints", ()))
    watchdog = (section.get("nmi_watchdog") or {}).get("config")
    return PmuFacts(
        general_smt_on=_int(general.get("smt_on"), path, "general_counters.smt_on"),
        general_smt_off=_int(general.get("smt_off"), path, "general_counters.smt_off"),
        fixed=fixed, constraints=constraints,
        watchdog_config=None if watchdog is None else _int(watchdog, path, "nmi_watchdog"),
        source=str(general.get("source", "")))


def parse_table(doc: Mapping[str, Any], path: str) -> EventTable:
    """One data file's JSON -> :class:`EventTable`; raises :class:`TableError` on anything
    malformed, including an ``encoding`` that does not give the stated ``config``."""
    version = doc.get("format_version")
    if version != TABLE_FORMAT_VERSION:
        raise TableError(path, f"format_version {version!r}, this counterd reads "
                         f"{TABLE_FORMAT_VERSION}")
    matches = tuple(
        (str(m.get("vendor")), _int(m.get("family"), path, "family"),
         _ranges(m.get("models", ()), path, "models"))
        for m in doc.get("match", ()))
    vendors = {m[0] for m in matches}
    vendor = vendors.pop() if len(vendors) == 1 else None
    events = {name: _event_entry(name, entry, vendor, path)
              for name, entry in doc.get("events", {}).items()}
    software = {name: _event_entry(name, entry, vendor, path)
                for name, entry in doc.get("software", {}).items()}
    appended = frozenset(name for name, entry in doc.get("events", {}).items()
                         if entry.get("append_cpu_label"))
    return EventTable(
        name=str(doc.get("table")), label=str(doc.get("label", doc.get("table"))),
        revision=_int(doc.get("revision", 0), path, "revision"), path=path, events=events,
        pmu=_pmu_facts(doc.get("pmu") or {}, path), matches=matches,
        model_labels={_int(k, path, "model"): str(v)
                      for k, v in (doc.get("model_labels") or {}).items()},
        software=software, label_appended=appended)


@functools.lru_cache(maxsize=1)
def load_tables() -> tuple[EventTable, tuple[EventTable, ...]]:
    """``(generic, families)`` from the package's perf_events/*.json (read once)."""
    generic: EventTable | None = None
    families: list[EventTable] = []
    folder = importlib.resources.files("counterd.backends").joinpath("perf_events")
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".json"):
            continue
        path = f"counterd/backends/perf_events/{item.name}"
        try:
            doc = json.loads(item.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TableError(path, f"cannot be read: {exc}") from exc
        table = parse_table(doc, path)
        if table.name == "generic":
            generic = table
        else:
            families.append(table)
    if generic is None:
        raise TableError("counterd/backends/perf_events/generic.json", "missing")
    return generic, tuple(families)


def family_table(vendor: str, family: int, model: int) -> EventTable | None:
    """The data file whose match rules cover this CPU, or None (generic events only)."""
    return next((t for t in load_tables()[1] if t.covers(vendor, family, model)), None)


def amd_generation(family: int, model: int) -> str | None:
    """Zen generation ("zen1".."zen4") from family/model, by the AMD tables' match rules:
    family 0x17 models 0x00-0x2f Zen 1 and the rest Zen 2, as tools/perf/pmu-events/arch/x86/
    mapfile.csv maps them; family 0x19 models 0x00-0x0f and 0x20-0x5f Zen 3, the rest Zen 4,
    as arch/x86/kernel/cpu/amd.c (bsp_init_amd) does. mapfile.csv differs there: its amdzen3
    pattern leaves models 0x30-0x3f to amdzen4 (see amdzen3.json)."""
    table = family_table("AuthenticAMD", family, model)
    return table.name.removeprefix("amd") if table is not None else None


def cpu_label(vendor: str, family: int, model: int) -> str:
    """A human name for the CPU the tables know it as, for messages."""
    table = family_table(vendor, family, model)
    if table is not None:
        return table.model_labels.get(model, table.label)
    return f"{vendor or 'unknown vendor'} family {family:#x} model {model:#x}"


def event_table(vendor: str, family: int, model: int) -> dict[str, EventSpec | str]:
    """Canonical counter -> how to count it on this CPU, or why it cannot be counted.

    Pure: reads nothing from the host but the package's data files. Software events and
    perf's generic events (generic.json) come first; a family's table (Intel family 6 models
    0x55, 0x6a, 0x6c, 0x8f, 0xcf; AMD families 0x17 and 0x19) replaces them where the generic
    event is missing or means something else (e.g. amd_hw_cache_event_ids_f17h maps L1D read
    access to ls_dc_accesses, loads and stores, so the generic "loads" is wrong on Zen).
    """
    generic, _ = load_tables()
    table: dict[str, EventSpec | str] = {**generic.events, **generic.software}
    specific = family_table(vendor, family, model)
    if specific is None:
        label = cpu_label(vendor, family, model)
        for name in generic.label_appended:
            table[name] = f"{table[name]} ({label})"
    else:
        table.update(specific.events)
    return table


def pmu_facts(vendor: str, family: int, model: int) -> PmuFacts:
    """The PMU facts of this CPU's family table, or the generic assumption."""
    specific = family_table(vendor, family, model)
    return (specific or load_tables()[0]).pmu


# --------------------------------------------------------------------------------------------
# The group scheduler (pure): which events can share a kernel group
# --------------------------------------------------------------------------------------------

Slot = tuple[str, int]  # ("fixed", index) or ("general", index)


@dataclass(frozen=True)
class PmuLayout:
    """The counters one logical CPU offers, as the scheduler sees them: ``general`` general
    counters (from sysfs caps where the kernel exports a count, else the family table for
    the SMT state), the family's fixed counters and constraints, and the raw config of the
    NMI watchdog's pinned cycles event when kernel.nmi_watchdog=1 (it holds a counter the
    kernel's open-time group check does not see)."""

    general: int
    fixed: tuple[FixedCounter, ...] = ()
    constraints: tuple[CounterConstraint, ...] = ()
    watchdog_config: int | None = None
    source: str = ""

    @classmethod
    def from_facts(cls, facts: PmuFacts, *, smt: bool = True, general: int | None = None,
                   watchdog: bool = False, source: str = "") -> PmuLayout:
        count = general if general is not None else (
            facts.general_smt_on if smt else facts.general_smt_off)
        return cls(count, facts.fixed, facts.constraints,
                   facts.watchdog_config if watchdog else None, source or facts.source)


def counter_choices(config: int | None, layout: PmuLayout) -> frozenset[Slot]:
    """The counters the kernel may put an event with this raw config on: its fixed counter
    (and every general counter unless the fixed encoding is a pseudo-event), else the
    general counters of the first matching constraint, else all general counters. ``None``
    (an encoding unknown for this CPU) may use any general counter."""
    everything = frozenset(("general", i) for i in range(layout.general))
    if config is None:
        return everything
    for fixed in layout.fixed:
        if config == fixed.config:
            slot = frozenset({("fixed", fixed.index)})
            return slot if fixed.fixed_only else slot | everything
    for constraint in layout.constraints:
        if constraint.matches(config):
            return frozenset(("general", i) for i in constraint.counters if i < layout.general)
    return everything


def assign_counters(choices: Sequence[frozenset[Slot]]) -> list[Slot] | None:
    """A counter for each event, all different, each among its choices (a maximum bipartite
    matching by augmenting paths, Kuhn's algorithm); None when no such assignment exists."""
    owner: dict[Slot, int] = {}

    def place(i: int, seen: set[Slot]) -> bool:
        for slot in sorted(choices[i]):
            if slot in seen:
                continue
            seen.add(slot)
            if slot not in owner or place(owner[slot], seen):
                owner[slot] = i
                return True
        return False

    for i in range(len(choices)):
        if not place(i, set()):
            return None
    by_event = {i: slot for slot, i in owner.items()}
    return [by_event[i] for i in range(len(choices))]


def schedule_groups(events: Sequence[tuple[str, EventSpec]], layout: PmuLayout
                    ) -> list[tuple[str, ...]]:
    """Partition events into kernel groups that each fit the PMU at once.

    Hardware events are placed first-fit in the order given: an event joins the first group
    in which every member (plus the NMI watchdog's event, when it holds a counter) still gets
    a counter of its own (:func:`assign_counters`), else it starts a group. Software events
    use no PMU counter and form one group of their own, last. Groups the kernel multiplexes
    are each read atomically, so every value keeps its own group's running/enabled ratio.
    """
    watchdog = ([counter_choices(layout.watchdog_config, layout)]
                if layout.watchdog_config is not None else [])
    hardware: list[tuple[list[str], list[frozenset[Slot]]]] = []
    software: list[str] = []
    for name, spec in events:
        if not spec.is_hardware:
            software.append(name)
            continue
        choice = counter_choices(spec.raw_config, layout)
        for names, choices in hardware:
            if assign_counters([*choices, choice, *watchdog]) is not None:
                names.append(name)
                choices.append(choice)
                break
        else:
            hardware.append(([name], [choice]))
    groups = [tuple(names) for names, _ in hardware]
    if software:
        groups.append(tuple(software))
    return groups

# --------------------------------------------------------------------------------------------
# Pure helpers: parsing, scaling, errno translation, host facts from injectable roots
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


def parse_single_read(buf: bytes) -> tuple[int, int, int, int]:
    """Decode a non-group read with TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING|ID:
    ``value, time_enabled, time_running, id``."""
    if len(buf) < 32:
        raise ValueError(f"event read of {len(buf)} bytes is shorter than 32")
    value, enabled, running, event_id = struct.unpack_from("=QQQQ", buf, 0)
    return value, enabled, running, event_id


def scale(raw: int, enabled: int, running: int) -> tuple[float, float]:
    """Multiplexing correction: ``(raw * enabled / running, running / enabled)``.

    A counter that was never on the PMU (``running == 0``) gives ``(0.0, 0.0)``: nothing can be
    extrapolated from it. ``running > enabled`` (clock skew) is clamped to ratio 1.
    """
    if running <= 0:
        return 0.0, 0.0
    if running >= enabled:
        return float(raw), 1.0
    return raw * enabled / running, running / enabled


def paranoid_level_needed(target: Target, include_kernel: bool) -> int:
    """The highest kernel.perf_event_paranoid at which an unprivileged user may count this
    (Documentation/admin-guide/perf-security.rst): 2 user space of own processes, 1 also the
    kernel, 0 also system-wide (per-CPU) events, -1 everything."""
    if target.pid == -1:
        return 0
    return 1 if include_kernel else 2


def translate_errno(err: int, event: str, target: Target, paranoid: int | None, *,
                    include_kernel: bool = False, attr_size: int = PERF_ATTR_SIZE_VER8,
                    encoding: str = "") -> CounterdError:
    """The typed error for a failed ``perf_event_open`` of one event opened on its own (errno
    list: perf_event_open(2)); a group that does not fit is split before it comes to this.

    Pure, so every branch is testable with an injected errno. ``paranoid`` is the value of
    /proc/sys/kernel/perf_event_paranoid, or None when it could not be read; ``encoding``
    names the event's encoding in the message (EventSpec.describe()).
    """
    what = f"{encoding}: " if encoding else ""
    who = target.describe()
    level = "unknown" if paranoid is None else str(paranoid)
    if err in (_errno.EACCES, _errno.EPERM):
        needed = paranoid_level_needed(target, include_kernel)
        if paranoid is not None and paranoid > needed:
            reason = f"kernel.perf_event_paranoid={paranoid} forbids this without privileges"
        else:
            reason = (f"permission denied (kernel.perf_event_paranoid={level}); counting another "
                      "user's process also needs ptrace access to it")
        fix = (f"run as root, or give CAP_PERFMON (Linux >= 5.8; CAP_SYS_ADMIN before), or "
               f"lower kernel.perf_event_paranoid to {needed} "
               f"(sysctl -w kernel.perf_event_paranoid={needed})")
        return CounterAccessDenied(event, who, reason, fix)
    if err == _errno.ESRCH:
        return NoSuchTarget(who)
    if err in (_errno.EMFILE, _errno.ENFILE):
        return CounterdError(
            f"cannot open counter {event} on {who}: too many open files "
            f"({os.strerror(err)}); perf uses one file descriptor per event and thread",
            "raise the file-descriptor limit (ulimit -n, or RLIMIT_NOFILE), or count fewer "
            "events or threads at once")
    if err == _errno.E2BIG:
        return CounterdError(
            f"the kernel rejected perf_event_attr of {attr_size} bytes for {event} (E2BIG): it "
            "is older than this layout and a field it does not know was set",
            "report this with `uname -r`; counterd only sets fields known since Linux 2.6.32")
    if err == _errno.ENOENT:
        return EventNotSupported(event, BACKEND, f"{what}not on this PMU: the kernel has no "
                                 "such event for this CPU (ENOENT: type/config unknown to its "
                                 "PMU driver)")
    if err in (_errno.EOPNOTSUPP, _errno.ENODEV):
        return EventNotSupported(event, BACKEND, f"{what}the PMU cannot count it "
                                 f"({_errno.errorcode.get(err, err)}: hardware lacks the event "
                                 "or the requested exclusion filter)")
    if err == _errno.EINVAL:
        return EventNotSupported(event, BACKEND, f"{what}the kernel rejected the event "
                                 "encoding (EINVAL when opened alone, so not a group that does "
                                 "not fit: invalid config bits, or a CPU the target cannot run "
                                 "on)")
    if err == _errno.EBUSY:
        return EventNotSupported(event, BACKEND, "the PMU is held exclusively by another user "
                                 "(EBUSY)", "stop the other profiler and retry")
    name = _errno.errorcode.get(err, str(err))
    return CounterdError(f"perf_event_open failed for {event} on {who}: {name} "
                         f"({os.strerror(err)})")


# --------------------------------------------------------------------------------------------
# The syscall
# --------------------------------------------------------------------------------------------

_libc: ctypes.CDLL | None = None


def syscall_number(machine: str | None = None) -> int:
    """__NR_perf_event_open for ``machine`` (default: this host's ``uname -m``)."""
    machine = machine or platform.machine()
    if machine not in SYSCALL_NUMBERS:
        raise BackendUnavailable(BACKEND, f"perf_event_open's syscall number is not known for "
                                 f"{machine}", "use --backend sim or papi on this machine")
    return SYSCALL_NUMBERS[machine]


def _syscall() -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


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


def perf_event_open(attr: PerfEventAttr, pid: int, cpu: int, group_fd: int = -1,
                    flags: int = PERF_FLAG_FD_CLOEXEC) -> int:
    """The raw syscall; returns an fd or raises OSError with the kernel's errno."""
    fd = _syscall()(ctypes.c_long(syscall_number()), ctypes.byref(attr), ctypes.c_int(pid),
                    ctypes.c_int(cpu), ctypes.c_int(group_fd), ctypes.c_ulong(flags))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def _event_id(fd: int) -> int:
    buf = bytearray(8)
    fcntl.ioctl(fd, PERF_EVENT_IOC_ID, buf, True)
    return int(struct.unpack("=Q", buf)[0])


def _close_all(fds: list[int]) -> None:
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass


# --------------------------------------------------------------------------------------------
# Readings, the counter set and the backend
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PerfReading(Reading):
    """A :class:`Reading` of counters from several kernel groups (or from separately opened
    events): ``times`` holds each counter's own ``(time_enabled, time_running)``, and
    :meth:`delta` scales each counter by its own group's span. The reading-level times are
    those of the group with the lowest running/enabled ratio (the most multiplexed)."""

    times: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def delta(self, earlier: Reading) -> dict[str, CounterValue]:
        theirs = earlier.times if isinstance(earlier, PerfReading) else {}
        default_now = (self.time_enabled_ns, self.time_running_ns)
        default_then = (earlier.time_enabled_ns, earlier.time_running_ns)
        out: dict[str, CounterValue] = {}
        for name, now in self.values.items():
            before = earlier.values.get(name)
            if before is None:
                continue
            if now.source is Source.MEASURED and now.raw is not None and before.raw is not None:
                en, run = self.times.get(name, default_now)
                en0, run0 = theirs.get(name, default_then)
                de, dr = en - en0, run - run0
                raw = now.raw - before.raw  # the same rules as Reading.delta, per group
                if de > 0 and dr > 0:
                    out[name] = CounterValue(raw * de / dr, now.source, min(1.0, dr / de), raw)
                elif de > 0:
                    out[name] = CounterValue(0.0, now.source, 0.0, raw)
                else:
                    out[name] = CounterValue(float(raw), now.source, 1.0, raw)
            else:
                out[name] = CounterValue(now.value - before.value, now.source,
                                         min(now.ratio, before.ratio), None)
        return out


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
        values = {}
        for name in self.events:
            en, run = times[name]
            scaled_value, ratio = scale(raw[name], en, run)
            values[name] = CounterValue(scaled_value, Source.MEASURED, ratio, raw[name])
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


Syscall = Callable[[PerfEventAttr, int, int, int, int], int]


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
                 include_kernel: bool, paranoid: int | None) -> None:
        self.syscall = syscall
        self.target = target
        self.grouped = grouped
        self.strict = strict
        self.include_kernel = include_kernel
        self.paranoid = paranoid
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
                               encoding=spec.describe())

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
                translate_errno(exc.errno or 0, "task_clock_ns", Target(), paranoid))
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
                    counters[name] = str(translate_errno(exc.errno or 0, name, Target(),
                                                         paranoid,
                                                         include_kernel=entry.kernel_side,
                                                         encoding=entry.describe()))
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
                         include_kernel=include_kernel, paranoid=self.paranoid())
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
                raise UnknownCounter(name)
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
]
