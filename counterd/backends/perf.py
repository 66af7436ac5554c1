"""Linux ``perf_event_open(2)`` counters through ctypes (DESIGN.md section 4, backend ``perf``).

One :class:`PerfGroup` per :class:`~counterd.backends.base.Target`: a disabled leader plus
members opened with ``group_fd``, read atomically with one ``read(2)`` of
``PERF_FORMAT_GROUP | TOTAL_TIME_ENABLED | TOTAL_TIME_RUNNING | ID``; values are scaled for
multiplexing (``raw * enabled / running``) and carry the ratio ``running / enabled``.

Which event counts which canonical counter depends on the CPU: :func:`event_table` gives, per
vendor/family/model, an :class:`EventSpec` or the reason the counter cannot be had, so tables
can be checked without the hardware. Errors from the kernel become :mod:`counterd.errors` in
one pure function, :func:`translate_errno`.

References: perf_event_open(2) man page; include/uapi/linux/perf_event.h;
kernel/events/core.c (perf_copy_attr, perf_read_group); the event encodings cite
intel/perfmon and the kernel's tools/perf/pmu-events/arch/x86/<cpu>/*.json next to each table.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import fcntl
import os
import platform
import struct
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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
# Event tables
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EventSpec:
    """How to count one canonical counter: ``perf_event_attr.type``/``config`` (+ config1).

    ``event`` is the vendor's or perf's name for it; ``note`` says where it differs from the
    canonical definition in counterd/events.py (an honest caveat, empty when it matches).
    ``kernel_side``: the event only ever fires in kernel mode, so it is opened without
    ``exclude_kernel`` (which would filter every occurrence out, kernel/events/core.c
    perf_exclude_event) and needs perf_event_paranoid <= 1 or privileges.
    """

    type: int
    config: int
    event: str
    note: str = ""
    config1: int = 0
    kernel_side: bool = False

    @property
    def is_hardware(self) -> bool:
        return self.type in HARDWARE_TYPES


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

_SOFTWARE: dict[str, EventSpec] = {
    "task_clock_ns": EventSpec(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, "task-clock"),
    "page_faults": EventSpec(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS, "page-faults",
                             "faults taken in user mode; kernel-mode faults (e.g. read() into "
                             "a fresh buffer) count only with include_kernel"),
    "context_switches": EventSpec(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES,
                                  "context-switches", kernel_side=True),
}

_L3_WB_REASON = ("L3-to-memory writebacks are counted by the memory controller's uncore PMU "
                 "(Intel IMC CAS_COUNT.WR, AMD DF/UMC), per socket and system-wide, not per "
                 "thread")
_NO_GENERIC_L2 = ("perf has no generic L2 event (PERF_COUNT_HW_CACHE_* covers L1D, L1I, LL, "
                  "DTLB, ITLB, BPU, NODE) and counterd has no raw-event table for this CPU")
_NO_GENERIC_WB = ("perf has no generic writeback event and counterd has no raw-event table "
                  "for this CPU")

# Generic events: the kernel maps each onto the CPU's own event (arch/x86/events/intel/core.c
# *_hw_cache_event_ids, arch/x86/events/amd/core.c amd_hw_cache_event_ids_f17h). Vendor tables
# below override the ones that are wrong or vague on that vendor.
_GENERIC: dict[str, EventSpec | str] = {
    "cycles": EventSpec(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, "cycles"),
    "instructions": EventSpec(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, "instructions"),
    "loads": EventSpec(PERF_TYPE_HW_CACHE, hw_cache_config(
        PERF_COUNT_HW_CACHE_L1D, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_ACCESS),
        "L1-dcache-loads", "generic L1D read accesses; the kernel's mapping varies by CPU"),
    "stores": EventSpec(PERF_TYPE_HW_CACHE, hw_cache_config(
        PERF_COUNT_HW_CACHE_L1D, PERF_COUNT_HW_CACHE_OP_WRITE, PERF_COUNT_HW_CACHE_RESULT_ACCESS),
        "L1-dcache-stores", "generic L1D write accesses; many CPUs do not map it"),
    "l1d_misses": EventSpec(PERF_TYPE_HW_CACHE, hw_cache_config(
        PERF_COUNT_HW_CACHE_L1D, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS),
        "L1-dcache-load-misses", "generic L1D read misses: may leave out store misses"),
    "l2_misses": _NO_GENERIC_L2,
    "l3_misses": EventSpec(PERF_TYPE_HW_CACHE, hw_cache_config(
        PERF_COUNT_HW_CACHE_LL, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS),
        "LLC-load-misses", "generic last-level read misses (demand data reads on Intel)"),
    "l1d_writebacks": _NO_GENERIC_WB,
    "l2_writebacks": _NO_GENERIC_WB,
    "l3_writebacks": _L3_WB_REASON,
    "dtlb_misses": EventSpec(PERF_TYPE_HW_CACHE, hw_cache_config(
        PERF_COUNT_HW_CACHE_DTLB, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS),
        "dTLB-load-misses", "load DTLB misses (Intel: completed page walks; AMD: L1 DTLB)"),
}


def _intel(event: int, umask: int, name: str, note: str = "") -> EventSpec:
    return EventSpec(PERF_TYPE_RAW, intel_raw_config(event, umask), name, note)


def _amd(event: int, umask: int, name: str, note: str = "") -> EventSpec:
    return EventSpec(PERF_TYPE_RAW, amd_raw_config(event, umask), name, note)


_INTEL_LLC_NOTE = ("core-originated cacheable requests missing L3: data and code reads, RFOs "
                   "and L1/L2 prefetches")
_INTEL_L2_IN_NOTE = "lines filled into L2 (data, code, RFO and prefetch): L2 miss traffic"

# Skylake-SP / Cascade Lake / Cooper Lake, family 6 model 0x55.
# Source: intel/perfmon SKX/events/skylakex_core.json V1.37 (= kernel
# tools/perf/pmu-events/arch/x86/skylakex/{memory,cache}.json).
_SKYLAKE_X: dict[str, EventSpec | str] = {
    "loads": _intel(0xD0, 0x81, "MEM_INST_RETIRED.ALL_LOADS"),
    "stores": _intel(0xD0, 0x82, "MEM_INST_RETIRED.ALL_STORES"),
    "l1d_misses": _intel(0x51, 0x01, "L1D.REPLACEMENT"),
    "l2_misses": _intel(0xF1, 0x1F, "L2_LINES_IN.ALL", _INTEL_L2_IN_NOTE),
    "l3_misses": _intel(0x2E, 0x41, "LONGEST_LAT_CACHE.MISS", _INTEL_LLC_NOTE),
    # Not in Intel's published SKX list; LIKWID measures L1->L2 evictions with it
    # (groups/skylakeX/L2.txt, src/includes/perfmon_skylakeX_events.txt).
    "l1d_writebacks": _intel(0x51, 0x04, "L1D.M_EVICT",
                             "undocumented by Intel for SKX (used by LIKWID); validate first"),
    "l2_writebacks": _intel(0xF2, 0x02, "L2_LINES_OUT.NON_SILENT",
                            "upper bound: also counts clean lines the non-inclusive L3 keeps "
                            "(skylakex_core.json: 'either in modified state or clean state')"),
    "l3_writebacks": _L3_WB_REASON,
}

# Ice Lake-SP / -D, family 6 models 0x6a, 0x6c. Source: intel/perfmon
# ICX/events/icelakex_core.json V1.30 (= kernel .../x86/icelakex/{memory,cache}.json).
_ICELAKE_X: dict[str, EventSpec | str] = {
    **_SKYLAKE_X,
    "l1d_writebacks": ("no documented core event counts dirty L1D evictions on Ice Lake-SP "
                       "(icelakex_core.json has none; L1D.M_EVICT 0x51/0x04 is untested there)"),
    "l2_writebacks": _intel(0xF2, 0x02, "L2_LINES_OUT.NON_SILENT",
                            "upper bound: lines evicted from L2 to L3, clean or modified "
                            "(icelakex_core.json)"),
}

# Sapphire Rapids (0x8f) and Emerald Rapids (0xcf); L2 events moved to 0x23-0x26. Source:
# intel/perfmon SPR/events/sapphirerapids_core.json V1.39, EMR/events/emeraldrapids_core.json
# V1.24 (= kernel tools/perf/pmu-events/arch/x86/emeraldrapids/cache.json: L1D.REPLACEMENT
# 0x51/0x1, L2_LINES_IN.ALL 0x25/0x1f, L2_LINES_OUT.NON_SILENT 0x26/0x2).
_SAPPHIRE_RAPIDS: dict[str, EventSpec | str] = {
    "loads": _intel(0xD0, 0x81, "MEM_INST_RETIRED.ALL_LOADS"),
    "stores": _intel(0xD0, 0x82, "MEM_INST_RETIRED.ALL_STORES"),
    "l1d_misses": _intel(0x51, 0x01, "L1D.REPLACEMENT"),
    "l2_misses": _intel(0x25, 0x1F, "L2_LINES_IN.ALL", _INTEL_L2_IN_NOTE),
    "l3_misses": _intel(0x2E, 0x41, "LONGEST_LAT_CACHE.MISS", _INTEL_LLC_NOTE),
    "l1d_writebacks": ("no published core event counts dirty L1D evictions on Sapphire/Emerald "
                       "Rapids (L2_TRANS.L1D_WB 0x23/0x10 is undocumented; LIKWID marks it "
                       "'not officially supported')"),
    "l2_writebacks": _intel(0x26, 0x02, "L2_LINES_OUT.NON_SILENT"),
    "l3_writebacks": _L3_WB_REASON,
}

_INTEL_TABLES: dict[int, tuple[str, dict[str, EventSpec | str]]] = {
    0x55: ("Skylake-SP/Cascade Lake-SP", _SKYLAKE_X),
    0x6A: ("Ice Lake-SP", _ICELAKE_X),
    0x6C: ("Ice Lake-D", _ICELAKE_X),
    0x8F: ("Sapphire Rapids", _SAPPHIRE_RAPIDS),
    0xCF: ("Emerald Rapids", _SAPPHIRE_RAPIDS),
}

# AMD Zen. ls_dispatch (0x29) counts dispatched, not retired, ops; umask 0x04 (load-op-store)
# is added to both loads and stores ("Unit Masks ADDed"). Sources: kernel
# tools/perf/pmu-events/arch/x86/amdzen{1,2,3,4}/{memory,cache}.json and LIKWID
# src/includes/perfmon_zen*_events.txt.
_AMD_DISPATCH_NOTE = "dispatched load/store ops (speculative), not retired instructions"
_AMD_L2_NOTE = "data-cache requests missing L2; excludes L2 hardware-prefetch misses"
_AMD_DRAM_NOTE = ("proxy: L1D fills sourced from DRAM/IO (the L3 is counted per CCX by the "
                  "amd_l3 PMU, not per thread); misses that stop in L2 are not seen")
_AMD_L1WB = ("Zen core PMUs have no event for dirty L1D evictions (none in the PPR event lists "
             "behind tools/perf/pmu-events/arch/x86/amdzen*)")
_AMD_L2WB = ("Zen has no per-core event for L2 victim writebacks; the L3 victim cache is "
             "counted per CCX by the amd_l3 PMU, not per thread")

_ZEN_COMMON: dict[str, EventSpec | str] = {
    "loads": _amd(0x29, 0x05, "ls_dispatch.ld_dispatch+ld_st_dispatch", _AMD_DISPATCH_NOTE),
    "stores": _amd(0x29, 0x06, "ls_dispatch.store_dispatch+ld_st_dispatch", _AMD_DISPATCH_NOTE),
    "l2_misses": _amd(0x64, 0x08, "l2_cache_req_stat.ls_rd_blk_c", _AMD_L2_NOTE),
    "l1d_writebacks": _AMD_L1WB,
    "l2_writebacks": _AMD_L2WB,
    "l3_writebacks": _L3_WB_REASON,
}
# Zen 1/2: ls_refills_from_sys (0x43) counts demand fills only; 0x5B = all sources.
_ZEN12: dict[str, EventSpec | str] = {
    **_ZEN_COMMON,
    "l1d_misses": _amd(0x43, 0x5B, "ls_refills_from_sys (all sources)",
                       "demand L1D fills only; hardware-prefetch fills are not counted"),
    "l3_misses": _amd(0x43, 0x48, "ls_refills_from_sys.ls_mabresp_{lcl,rmt}_dram",
                      _AMD_DRAM_NOTE),
}
# Zen 3: ls_any_fills_from_sys (0x44), demand and prefetch; 0x5F = every documented source.
_ZEN3: dict[str, EventSpec | str] = {
    **_ZEN_COMMON,
    "l1d_misses": _amd(0x44, 0x5F, "ls_any_fills_from_sys (all sources)"),
    "l3_misses": _amd(0x44, 0x48, "ls_any_fills_from_sys.mem_io_{local,remote}", _AMD_DRAM_NOTE),
}
# Zen 4: ls_any_fills_from_sys.all = 0x44/0xff, .dram_io_all = 0x44/0x48.
_ZEN4: dict[str, EventSpec | str] = {
    **_ZEN_COMMON,
    "l1d_misses": _amd(0x44, 0xFF, "ls_any_fills_from_sys.all"),
    "l3_misses": _amd(0x44, 0x48, "ls_any_fills_from_sys.dram_io_all", _AMD_DRAM_NOTE),
}


def amd_generation(family: int, model: int) -> str | None:
    """Zen generation from family/model, as tools/perf/pmu-events/arch/x86/mapfile.csv maps
    them: family 0x17 models < 0x30 Zen 1, else Zen 2; family 0x19 models 0x00-0x0f and
    0x20-0x5f Zen 3, else Zen 4."""
    if family == 0x17:
        return "zen1" if model < 0x30 else "zen2"
    if family == 0x19:
        return "zen3" if model < 0x10 or 0x20 <= model <= 0x5F else "zen4"
    return None


_AMD_TABLES: dict[str, dict[str, EventSpec | str]] = {
    "zen1": _ZEN12, "zen2": _ZEN12, "zen3": _ZEN3, "zen4": _ZEN4,
}


def cpu_label(vendor: str, family: int, model: int) -> str:
    """A human name for the CPU the tables know it as, for messages."""
    if vendor == "GenuineIntel" and family == 6 and model in _INTEL_TABLES:
        return _INTEL_TABLES[model][0]
    if vendor == "AuthenticAMD" and (gen := amd_generation(family, model)):
        return gen.replace("zen", "Zen ")
    return f"{vendor or 'unknown vendor'} family {family:#x} model {model:#x}"


def event_table(vendor: str, family: int, model: int) -> dict[str, EventSpec | str]:
    """Canonical counter -> how to count it on this CPU, or why it cannot be counted.

    Pure: reads nothing from the host. Software events and perf's generic events come first;
    a per-vendor raw table (Intel family 6 models 0x55, 0x6a, 0x6c, 0x8f, 0xcf; AMD families
    0x17 and 0x19) overrides them where the generic event is missing or means something else.
    """
    table: dict[str, EventSpec | str] = {**_GENERIC, **_SOFTWARE}
    specific: dict[str, EventSpec | str] | None = None
    if vendor == "GenuineIntel" and family == 6 and model in _INTEL_TABLES:
        specific = _INTEL_TABLES[model][1]
    elif vendor == "AuthenticAMD" and (gen := amd_generation(family, model)):
        specific = _AMD_TABLES[gen]
        # amd_hw_cache_event_ids_f17h maps L1D read access to ls_dc_accesses (loads and
        # stores), so the generic "loads" is wrong on Zen; the raw table replaces it.
    if specific is None:
        label = cpu_label(vendor, family, model)
        for name, entry in table.items():
            if isinstance(entry, str) and entry in (_NO_GENERIC_L2, _NO_GENERIC_WB):
                table[name] = f"{entry} ({label})"
    else:
        table.update(specific)
    return table


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
                    ) -> CounterdError:
    """The typed error for a failed ``perf_event_open`` (errno list: perf_event_open(2)).

    Pure, so every branch is testable with an injected errno. ``paranoid`` is the value of
    /proc/sys/kernel/perf_event_paranoid, or None when it could not be read.
    """
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
        return EventNotSupported(event, BACKEND, "the kernel has no such event for this CPU "
                                 "(ENOENT: type/config unknown to its PMU driver)")
    if err in (_errno.EOPNOTSUPP, _errno.ENODEV):
        return EventNotSupported(event, BACKEND, f"the PMU cannot count it "
                                 f"({_errno.errorcode.get(err, err)}: hardware lacks the event "
                                 "or the requested exclusion filter)")
    if err == _errno.EINVAL:
        return EventNotSupported(event, BACKEND, "the kernel rejected the event encoding "
                                 "(EINVAL: invalid config, or a CPU the target cannot run on)")
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
# The group and the backend
# --------------------------------------------------------------------------------------------


class PerfGroup:
    """Counters for one target, opened by :meth:`PerfBackend.open`; a context manager.

    Without ``inherit`` the events form one kernel group: the leader (first opened event) is
    created disabled, members join it with ``group_fd``, and ``read()`` is one ``read(2)`` on
    the leader, so all values share the same time_enabled/time_running (the group is scheduled
    onto the PMU as a whole). With ``target.inherit`` each event is opened on its own: kernels
    before 4.13 reject ``inherit`` together with ``PERF_FORMAT_GROUP``
    (kernel/events/core.c, perf_event_open), so such a read is one ``read(2)`` per event and
    not atomic across events; each value is still scaled by its own times.
    """

    def __init__(self, events: tuple[str, ...], target: Target, fds: list[int],
                 ids: dict[int, str], grouped: bool, unsupported: dict[str, str]) -> None:
        self.events = events
        self.target = target
        self.grouped = grouped
        self._fds = fds
        self._ids = ids
        self._unsupported = unsupported
        self._group_struct = struct.Struct("=" + "Q" * (3 + 2 * len(events)))
        by_name = {name: event_id for event_id, name in ids.items()}
        self._id_order = tuple(by_name.get(name, -1) for name in events)
        # Closes the fds if the caller drops the group without close().
        self._finalizer = weakref.finalize(self, _close_all, fds)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def read(self) -> Reading:
        """Cumulative counts since open, scaled for multiplexing."""
        if self.closed:
            raise CounterdError("read() on a closed perf group", "open a new group")
        if not self._fds:
            return Reading({}, 0, 0, dict(self._unsupported))
        if self.grouped:
            # Hot path (two reads per superstep marker pair): one read(2), one unpack of the
            # whole buffer with a precompiled struct; parse_group_read is the checked decoder
            # used when the fast layout does not match.
            buf = os.read(self._fds[0], self._group_struct.size)
            if len(buf) == self._group_struct.size:
                fields = self._group_struct.unpack(buf)
                if fields[0] == len(self.events) and fields[4::2] == self._id_order:
                    enabled, running = fields[1], fields[2]
                    scaled, ratio = scale(1, enabled, running)
                    src = Source.MEASURED
                    values = {name: CounterValue(raw * scaled, src, ratio, raw)
                              for name, raw in zip(self.events, fields[3::2], strict=True)}
                    return Reading(values, enabled, running, self._unsupported)
            sample = parse_group_read(buf, self._ids)
            times = {name: (sample.time_enabled_ns, sample.time_running_ns)
                     for name in sample.raw}
            raw = sample.raw
            enabled, running = sample.time_enabled_ns, sample.time_running_ns
        else:
            raw, times = {}, {}
            for fd in self._fds:
                value, en, run, event_id = parse_single_read(os.read(fd, 32))
                raw[self._ids[event_id]] = value
                times[self._ids[event_id]] = (en, run)
            enabled, running = times[self.events[0]]
        values = {}
        for name in self.events:
            en, run = times[name]
            scaled_value, ratio = scale(raw[name], en, run)
            values[name] = CounterValue(scaled_value, Source.MEASURED, ratio, raw[name])
        return Reading(values, enabled, running, dict(self._unsupported))

    def read_raw(self) -> tuple[int, ...] | Reading:
        """The marker's hot path: ``(time_enabled, time_running, raw0, raw1, ...)`` in
        ``events`` order from one read(2), with no objects built (about 1 us, where ``read()``
        costs about 6). Turned into counter values by :meth:`delta_raw` when a record is
        needed. Falls back to ``read()`` (a Reading) when the group is not one atomic group."""
        if self.grouped and self._fds and not self.closed:
            buf = os.read(self._fds[0], self._group_struct.size)
            if len(buf) == self._group_struct.size:
                fields = self._group_struct.unpack(buf)
                if fields[0] == len(self.events) and fields[4::2] == self._id_order:
                    return fields[1:3] + fields[3::2]
        return self.read()

    def delta_raw(self, start: tuple[int, ...] | Reading, stop: tuple[int, ...] | Reading
                  ) -> tuple[dict[str, CounterValue], Mapping[str, str]]:
        """Counter values of the span between two :meth:`read_raw` results, scaled by the
        span's own enabled/running times (as :meth:`Reading.delta`), and the counters that
        could not be opened."""
        if isinstance(start, Reading) or isinstance(stop, Reading):
            a = start if isinstance(start, Reading) else self._as_reading(start)
            b = stop if isinstance(stop, Reading) else self._as_reading(stop)
            return b.delta(a), b.unsupported
        de, dr = stop[0] - start[0], stop[1] - start[1]
        factor, ratio = scale(1, de, dr) if de > 0 else (1.0, 1.0)
        src = Source.MEASURED
        values = {name: CounterValue((y - x) * factor, src, ratio, y - x)
                  for name, x, y in zip(self.events, start[2:], stop[2:], strict=True)}
        return values, self._unsupported

    def _as_reading(self, raw: tuple[int, ...]) -> Reading:
        enabled, running = raw[0], raw[1]
        factor, ratio = scale(1, enabled, running)
        return Reading({name: CounterValue(v * factor, Source.MEASURED, ratio, v)
                        for name, v in zip(self.events, raw[2:], strict=True)},
                       enabled, running, self._unsupported)

    def close(self) -> None:
        """Close every fd; safe to call more than once."""
        self._finalizer()

    def __enter__(self) -> PerfGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PerfBackend:
    """Counters from the Linux kernel's perf_events subsystem.

    ``sysfs_root`` and ``procfs_root`` are where /sys and /proc are read from (the PMU list,
    perf_event_paranoid, cpuinfo), so tests can pass fixture trees; the syscall is always real.
    """

    name = "perf"
    source = Source.MEASURED

    def __init__(self, sysfs_root: str | os.PathLike[str] = "/sys",
                 procfs_root: str | os.PathLike[str] = "/proc") -> None:
        self.sysfs_root = Path(sysfs_root)
        self.procfs_root = Path(procfs_root)

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

    # Backend protocol -------------------------------------------------------------------

    def available(self) -> Capability:
        """What perf can count here; never raises. Each counter is tried alone on the calling
        thread (user space only); hardware counters are not tried when sysfs lists no core PMU.
        """
        paranoid = self.paranoid()
        probe = _SOFTWARE["task_clock_ns"]
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
                                                         include_kernel=entry.kernel_side))
        reason = (f"perf_event_open works (kernel.perf_event_paranoid={paranoid}); "
                  + (f"core PMU {pmu}" if pmu else "software events only: "
                     + no_pmu_reason(self.sysfs_root)))
        return Capability(self.name, True, reason, counters)

    def open(self, events: Sequence[str], target: Target = THIS_THREAD, *, strict: bool = True,
             include_kernel: bool = False) -> PerfGroup:
        """Open ``events`` on ``target`` as one group (see :class:`PerfGroup`).

        ``strict``: the first event that cannot be counted raises (EventNotSupported,
        CounterAccessDenied, ...); otherwise it is left out and listed in
        ``Reading.unsupported`` with the reason. A missing target (NoSuchTarget) and the fd
        limit always raise. ``include_kernel`` also counts kernel mode (needs
        perf_event_paranoid <= 1 or privileges).
        """
        names = self._check_names(events)
        table = self.table()
        pmu = core_pmu(self.sysfs_root)
        paranoid = self.paranoid()
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
        # Hardware first, so the leader is a hardware event and software members join its
        # context (a software leader would have to be moved; kernel/events/core.c move_group).
        wanted.sort(key=lambda item: not item[1].is_hardware)
        grouped = not target.inherit
        pid = target.kernel_tid  # 0: calling thread; -1 with a cpu: system-wide
        fds: list[int] = []
        ids: dict[int, str] = {}
        opened: list[str] = []
        try:
            for name, spec in wanted:
                leader = not grouped or not fds
                attr = make_attr(spec, leader=leader, inherit=target.inherit,
                                 include_kernel=include_kernel, group=grouped)
                group_fd = fds[0] if grouped and fds else -1
                try:
                    fd = perf_event_open(attr, pid, target.cpu, group_fd)
                except OSError as exc:
                    err = translate_errno(exc.errno or 0, name, target, paranoid,
                                          include_kernel=include_kernel or spec.kernel_side)
                    if strict or not isinstance(err, EventNotSupported | CounterAccessDenied):
                        raise err from exc
                    unsupported[name] = err.reason
                    continue
                fds.append(fd)
                ids[_event_id(fd)] = name
                opened.append(name)
            if grouped and fds:
                fcntl.ioctl(fds[0], PERF_EVENT_IOC_RESET, PERF_IOC_FLAG_GROUP)
                fcntl.ioctl(fds[0], PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)
            else:
                for fd in fds:
                    fcntl.ioctl(fd, PERF_EVENT_IOC_RESET, 0)
                    fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
        except BaseException:
            _close_all(fds)
            raise
        order = tuple(n for n in names if n in opened)
        return PerfGroup(order, target, fds, ids, grouped, unsupported)

    # Internals --------------------------------------------------------------------------

    @staticmethod
    def _check_names(events: Sequence[str]) -> tuple[str, ...]:
        for name in events:
            if name not in NAMES and name not in PERF_EXTRA_NAMES:
                raise UnknownCounter(name)
        if len(set(events)) != len(events):
            raise CounterdError(f"counter listed twice in {list(events)}",
                                "list each counter once")
        return tuple(events)

    @staticmethod
    def _probe(spec: EventSpec, target: Target, include_kernel: bool) -> None:
        attr = make_attr(spec, leader=True, inherit=False, include_kernel=include_kernel,
                         group=False)
        os.close(perf_event_open(attr, target.kernel_tid, target.cpu))


__all__ = [
    "EventSpec", "GroupSample", "PerfBackend", "PerfEventAttr", "PerfGroup",
    "PERF_EXTRA_NAMES", "amd_raw_config", "event_table", "hw_cache_config", "intel_raw_config",
    "parse_cpuinfo", "parse_group_read", "parse_single_read", "scale", "translate_errno",
]
