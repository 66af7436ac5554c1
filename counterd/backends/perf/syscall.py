"""The ``perf_event_open(2)`` syscall for the perf backend: ``struct perf_event_attr`` (ctypes)
and the ABI constants, the syscall, the ioctl and fd helpers around it, and errno translation.
Errors from the kernel become :mod:`counterd.data.errors` in one pure function,
:func:`translate_errno`. The syscall itself, its number and the plan and read layout the
launcher shares are :mod:`counterd.perf_abi`'s (the one entry point of the call; the launcher,
a command, imports them from there, and this package imports no command).

References: perf_event_open(2) man page; include/uapi/linux/perf_event.h;
kernel/events/core.c (perf_copy_attr).
"""

from __future__ import annotations

import ctypes
import errno as _errno
import fcntl
import os
import struct
from collections.abc import Callable
from pathlib import Path

from counterd.backends.base import Target
from counterd.data.errors import (
    BackendUnavailable,
    CounterAccessDenied,
    CounterdError,
    EventNotSupported,
    NoSuchTarget,
)
from counterd.perf_abi import PERF_EVENT_OPEN_NR, PERF_FLAG_FD_CLOEXEC
from counterd.perf_abi import perf_event_open as _perf_event_open

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

# ioctls: _IO('$', n) = 0x2400 | n; PERF_EVENT_IOC_ID is _IOR('$', 7, __u64).
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_RESET = 0x2403
PERF_EVENT_IOC_ID = 0x80082407
PERF_IOC_FLAG_GROUP = 1

# __NR_perf_event_open per machine (counterd.perf_abi: counterd.launch opens saved plans with
# it too).
SYSCALL_NUMBERS = PERF_EVENT_OPEN_NR

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
# Errno translation (pure): kernel errors as counterd.data.errors
# --------------------------------------------------------------------------------------------


def paranoid_level_needed(target: Target, include_kernel: bool) -> int:
    """The highest kernel.perf_event_paranoid at which an unprivileged user may count this
    (Documentation/admin-guide/perf-security.rst): 2 user space of own processes, 1 also the
    kernel, 0 also system-wide (per-CPU) events, -1 everything."""
    if target.pid == -1:
        return 0
    return 1 if include_kernel else 2


def read_seccomp(procfs_root: str | os.PathLike[str] = "/proc") -> int | None:
    """This process's seccomp mode (``Seccomp:`` of ``<procfs_root>/self/status``: 0 none,
    1 strict, 2 filter), None when the kernel does not say."""
    try:
        for line in Path(procfs_root, "self/status").read_text().splitlines():
            if line.startswith("Seccomp:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def translate_errno(err: int, event: str, target: Target, paranoid: int | None, *,
                    include_kernel: bool = False, attr_size: int = PERF_ATTR_SIZE_VER8,
                    encoding: str = "", seccomp: int | None = None) -> CounterdError:
    """The typed error for a failed ``perf_event_open`` of one event opened on its own (errno
    list: perf_event_open(2)); a group that does not fit is split before it comes to this.

    Pure, so every branch is testable with an injected errno. ``paranoid`` is the value of
    /proc/sys/kernel/perf_event_paranoid, or None when it could not be read; ``encoding``
    names the event's encoding in the message (EventSpec.describe()); ``seccomp`` is this
    process's seccomp mode (:func:`read_seccomp`).

    EPERM where the paranoid level permits the request is not the sysctl's doing: the kernel's
    own checks answer EACCES, so it is a seccomp filter or a container runtime refusing the
    call (Docker's default profile does; seen under systemd in a container, where advising to
    lower the level to the value it already had was no help).
    """
    what = f"{encoding}: " if encoding else ""
    who = target.describe()
    level = "unknown" if paranoid is None else str(paranoid)
    if err in (_errno.EACCES, _errno.EPERM):
        needed = paranoid_level_needed(target, include_kernel)
        if err == _errno.EPERM and paranoid is not None and paranoid <= needed:
            filtered = (f"this process runs under a seccomp filter (Seccomp: {seccomp} in "
                        "/proc/self/status)" if seccomp else
                        "a seccomp filter or the container runtime refuses the call")
            return CounterAccessDenied(
                event, who, f"perf_event_open returned EPERM although "
                f"kernel.perf_event_paranoid={paranoid} permits this: {filtered}",
                "allow perf_event_open in the seccomp profile or the container (docker: "
                "--security-opt seccomp=<profile allowing perf_event_open> or --cap-add "
                "PERFMON; systemd: SystemCallFilter=), or run counterd outside it")
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

def syscall_number(machine: str | None = None) -> int:
    """__NR_perf_event_open for ``machine`` (default: this host's ``uname -m``)."""
    machine = machine or os.uname().machine  # platform.machine()'s answer, without importing it
    if machine not in SYSCALL_NUMBERS:
        raise BackendUnavailable(BACKEND, f"perf_event_open's syscall number is not known for "
                                 f"{machine}", "use --backend sim or papi on this machine")
    return SYSCALL_NUMBERS[machine]


def perf_event_open(attr: PerfEventAttr, pid: int, cpu: int, group_fd: int = -1,
                    flags: int = PERF_FLAG_FD_CLOEXEC) -> int:
    """The raw syscall (:func:`counterd.perf_abi.perf_event_open`, the one entry point, on the
    structure's own memory); returns an fd or raises OSError with the kernel's errno, and
    BackendUnavailable where the machine's syscall number is not known."""
    syscall_number()
    return _perf_event_open(attr, pid, cpu, group_fd, flags)


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


Syscall = Callable[[PerfEventAttr, int, int, int, int], int]
