"""The perf_event ABI that the perf backend and ``counterd record``'s launcher share: the one
home of ``perf_event_open(2)`` (its syscall number per machine and the one Python entry point
that makes the call), the read layout of a counter opened alone, and the whole-command plan
(:class:`PerfPlan`) the backend works out and the launcher opens.

Why here, not in ``counterd.backends.perf``: the launcher (:mod:`counterd.launch`) runs while
the recorded command waits for its exec, and importing any module of ``counterd.backends`` runs
that package's ``__init__`` (dataclasses, typing, re: 20-40 ms;
tests/counterd/test_launch.py holds the launcher to the standard library's os-level modules).
This module imports only ``os`` and ``struct`` (ctypes only where the compiled extension is not
there), so both may import it: the launcher, a command, imports the backend's ABI from here,
and the backend never imports the launcher (an import-linter contract in pyproject.toml).

One entry point: :func:`perf_event_open`. It calls the compiled extension's
``perf_event_open`` where that is built (C, counterd/_native/hotpath_src/module.c: the same
syscall, without ctypes, which costs 3.5 ms to import on the way to the command's exec) and
the syscall through ctypes otherwise (or with ``COUNTERD_NATIVE=0``). The C function is not a
second entry point: counterd calls it from here only, and the compiled markers open no events
(a lane is given its group's fds).

References: perf_event_open(2); include/uapi/linux/perf_event.h.
"""

from __future__ import annotations

import errno
import os
import struct

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

# __NR_perf_event_open per `uname -m`: arch/x86/entry/syscalls/syscall_64.tbl (298) and
# include/uapi/asm-generic/unistd.h, used by arm64 (241).
PERF_EVENT_OPEN_NR: dict[str, int] = {"x86_64": 298, "aarch64": 241, "arm64": 241}
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_ATTR_SIZE_VER0 = 64  # the first struct perf_event_attr: the kernel's smallest size

_open_event: Callable[[Any, int, int, int, int], int] | None = None


def perf_event_open(attr: Any, pid: int, cpu: int = -1, group_fd: int = -1,
                    flags: int = PERF_FLAG_FD_CLOEXEC) -> int:
    """``perf_event_open(2)``: ``attr`` is the raw ``struct perf_event_attr`` (bytes, or a
    writable buffer such as the backend's ctypes structure, which the kernel may write its
    size into); the fd, or OSError with the kernel's errno."""
    return (_open_event or _opener())(attr, pid, cpu, group_fd, flags)


def _opener() -> Callable[[Any, int, int, int, int], int]:
    """The call, chosen once: through the compiled extension where it is built (its check of
    ``attr``: EINVAL where the size field at offset 4 is not the buffer's length), else
    through ctypes."""
    global _open_event
    if _open_event is not None:
        return _open_event
    from counterd import _native

    hot = _native.hotpath()
    if hot is not None:
        def open_event(attr: Any, pid: int, cpu: int, group_fd: int, flags: int) -> int:
            return int(hot.perf_event_open(attr, pid, cpu, group_fd, flags))
    else:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        number = PERF_EVENT_OPEN_NR.get(os.uname().machine)

        def open_event(attr: Any, pid: int, cpu: int, group_fd: int, flags: int) -> int:
            if number is None:
                raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
            buf = (ctypes.byref(attr) if isinstance(attr, ctypes.Structure)
                   else ctypes.create_string_buffer(bytes(attr), len(attr)))
            fd = libc.syscall(ctypes.c_long(number), buf, ctypes.c_int(pid), ctypes.c_int(cpu),
                              ctypes.c_int(group_fd), ctypes.c_ulong(flags))
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
            return int(fd)
    _open_event = open_event
    return open_event


def parse_single_read(buf: bytes) -> tuple[int, int, int, int]:
    """Decode a non-group read with TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING|ID:
    ``value, time_enabled, time_running, id``."""
    if len(buf) < 32:
        raise ValueError(f"event read of {len(buf)} bytes is shorter than 32")
    value, enabled, running, event_id = struct.unpack_from("=QQQQ", buf, 0)
    return value, enabled, running, event_id


class PerfPlan:
    """What perf counts over a whole command on this host: for each counter it can count,
    the raw ``struct perf_event_attr`` that counts it over a process tree from its exec
    (inherit, disabled until enable_on_exec, user space), in the order they are read; the
    reason for each it cannot count; and whether ``counterd record --backend auto`` picks perf
    here on that alone (``auto``: it does when perf has hardware memory counters). Made by the
    perf backend (:meth:`counterd.backends.perf.PerfBackend.whole_command_plan`), kept and
    opened by the launcher (:func:`counterd.launch.save_plan`,
    :func:`counterd.launch.open_plan`)."""

    __slots__ = ("attrs", "auto", "events", "unsupported")

    def __init__(self, events: Sequence[str], attrs: Sequence[bytes],
                 unsupported: Mapping[str, str], auto: bool = False) -> None:
        if len(events) != len(attrs):
            raise ValueError(f"{len(events)} events but {len(attrs)} attributes")
        self.events = tuple(events)
        self.attrs = tuple(bytes(a) for a in attrs)
        self.unsupported = dict(unsupported)
        self.auto = auto

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PerfPlan) and (
            (self.events, self.attrs, self.unsupported, self.auto)
            == (other.events, other.attrs, other.unsupported, other.auto))

    def __repr__(self) -> str:
        return (f"PerfPlan(events={self.events!r}, unsupported={sorted(self.unsupported)!r}, "
                f"auto={self.auto})")
