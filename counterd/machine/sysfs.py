"""Reading this host from sysfs and procfs: its caches, NUMA nodes and CPUs (:func:`read`), read
once per process by :func:`host`. Nothing else in counterd reads
``/sys/devices/system/cpu/*/cache`` or ``/sys/devices/system/node``.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from counterd.data.errors import BadInput
from counterd.machine.description import Machine
from counterd.machine.geometry import FALLBACK_GEOMETRY, CacheLevel, parse_cpulist, parse_size
from counterd.machine.memory import MemoryLayout, NumaNode, Sourced, assumed_layout

# --------------------------------------------------------------------------------------------
# Reading sysfs and procfs

#: How :func:`read` reads a file (tests inject a counting one). OSError when it cannot.
Reader = Callable[[Path], str]


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


@dataclass(frozen=True)
class SysfsCache:
    """One ``cpuN/cache/indexK`` entry of sysfs."""

    level: int
    kind: str  # "Data", "Instruction" or "Unified"
    size_bytes: int
    ways: int  # sysfs says 0 for fully associative: then size // line
    line_bytes: int
    shared_cpus: tuple[int, ...]


_SYSFS_FIX = ("mount sysfs, or describe the machine in a file (COUNTERD_MACHINE=FILE or "
              "--machine FILE, format in counterd/machine/files.py), or give the geometry "
              'explicitly, e.g. Geometry.from_spec("L1=48K/12/64,L2=2M/16/64") or '
              "SimBackend(geometry=...)")


def cache_dir(sysfs: str | Path = "/sys", cpu: int = 0) -> Path:
    return Path(sysfs) / "devices" / "system" / "cpu" / f"cpu{cpu}" / "cache"


def read_caches(sysfs: str | Path = "/sys", cpu: int = 0,
                reader: Reader = read_text) -> tuple[SysfsCache, ...]:
    """Every cache of ``cpu`` described under ``<sysfs>/devices/system/cpu/cpuN/cache``, in
    index order. Raises BadInput (naming the file) when an entry cannot be read."""
    base = cache_dir(sysfs, cpu)
    try:
        indexes = sorted(base.glob("index*"), key=lambda p: int(p.name[5:] or 0))
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read cache geometry from {base}: {exc}", _SYSFS_FIX) from exc
    out = []
    for idx in indexes:
        try:
            size = parse_size(reader(idx / "size"))
            line = int(reader(idx / "coherency_line_size"))
            ways = int(reader(idx / "ways_of_associativity")) or size // line
            try:
                shared = parse_cpulist(reader(idx / "shared_cpu_list"))
            except FileNotFoundError:
                shared = ()
            out.append(SysfsCache(int(reader(idx / "level")), reader(idx / "type").strip(),
                                  size, ways, line, shared))
        except (OSError, ValueError, ZeroDivisionError, BadInput) as exc:
            raise BadInput(f"cannot read cache geometry from {idx}: {exc}", _SYSFS_FIX) from exc
    return tuple(out)


def read_levels(sysfs: str | Path = "/sys", cpu: int = 0, reader: Reader = read_text
                ) -> tuple[tuple[CacheLevel, ...], CacheLevel | None]:
    """``cpu``'s data and unified levels in order, and its L1 instruction cache (None when
    sysfs lists none), from sysfs. Raises BadInput, with the fix, when sysfs cannot be read,
    lists no data cache or lists a level twice."""
    where = cache_dir(sysfs, cpu)
    levels: dict[int, CacheLevel] = {}
    l1i = None
    for c in read_caches(sysfs, cpu, reader):
        lv = CacheLevel(c.level, c.size_bytes, c.ways, c.line_bytes, c.shared_cpus)
        if c.kind == "Instruction":
            if c.level == 1:
                l1i = lv
            continue
        if c.kind not in ("Data", "Unified"):
            continue
        if c.level in levels:
            raise BadInput(f"{where} lists two data caches at level {c.level}", _SYSFS_FIX)
        levels[c.level] = lv
    if not levels:
        raise BadInput(f"no data or unified caches found under {where}", _SYSFS_FIX)
    return tuple(levels[k] for k in sorted(levels)), l1i


def _cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model") and value.strip():
            return value.strip()
    return "?"


def node_dir(sysfs: str | Path = "/sys") -> Path:
    return Path(sysfs) / "devices" / "system" / "node"


def read_numa_nodes(sysfs: str | Path = "/sys", reader: Reader = read_text
                    ) -> tuple[NumaNode, ...]:
    """The NUMA nodes with CPUs under ``<sysfs>/devices/system/node`` (``nodeN/cpulist``), in
    node order; nodes without CPUs (memory-only nodes) are left out. Empty when sysfs has no
    node directory (a kernel without NUMA support). Raises BadInput naming the file when a
    cpulist cannot be read."""
    base = node_dir(sysfs)
    try:
        found = sorted((int(p.name[4:]), p) for p in base.glob("node*")
                       if p.name[4:].isdigit())
    except OSError as exc:
        raise BadInput(f"cannot list NUMA nodes in {base}: {exc}", _SYSFS_FIX) from exc
    out = []
    for number, path in found:
        try:
            cpus = parse_cpulist(reader(path / "cpulist"))
        except (OSError, ValueError) as exc:
            raise BadInput(f"cannot read the CPUs of NUMA node {number} from {path}/cpulist: "
                           f"{exc}", _SYSFS_FIX) from exc
        if cpus:
            out.append(NumaNode(number, cpus))
    return tuple(out)


def read_layout(sysfs: str | Path, online: Sequence[int], reader: Reader = read_text
                ) -> MemoryLayout:
    """The memory layout of this host: its NUMA nodes read from sysfs (one assumed node of
    the ``online`` CPUs when sysfs has none or cannot be read), the channels and interleave
    assumed. Never raises."""
    try:
        nodes = read_numa_nodes(sysfs, reader)
    except BadInput as exc:
        return assumed_layout(online, f"sysfs failed ({exc.what})")
    if not nodes:
        return assumed_layout(online, f"no NUMA node with CPUs in {node_dir(sysfs)}")
    try:
        return dataclasses.replace(assumed_layout(online, ""),
                                   nodes=Sourced(nodes, "read", f"sysfs {node_dir(sysfs)}"))
    except BadInput as exc:  # a CPU on two nodes: sysfs is inconsistent
        return assumed_layout(online, f"sysfs {node_dir(sysfs)} is inconsistent ({exc.what})")


def _hostname() -> str:
    return socket.gethostname()


def read(sysfs: str | Path = "/sys", procfs: str | Path = "/proc", *, cpu: int = 0,
         reader: Reader | None = None) -> Machine:
    """This host's machine, read from ``sysfs`` and ``procfs`` (uncached:
    :func:`counterd.machine.current` is the cached one). Never raises: unreadable caches give
    :data:`~counterd.machine.geometry.FALLBACK_GEOMETRY`'s levels with ``caches_known`` false
    and the reason in the geometry's source. The NUMA nodes are read from
    ``<sysfs>/devices/system/node`` (one assumed node of every CPU online when there is none);
    memory channels and interleave are assumed (:func:`read_layout`)."""
    rd = reader if reader is not None else read_text
    try:
        levels, l1i = read_levels(sysfs, cpu, rd)
        known, caches_source = True, f"sysfs {cache_dir(sysfs, cpu)}"
    except BadInput as exc:
        levels, l1i, known = FALLBACK_GEOMETRY.levels, None, False
        caches_source = f"fallback {FALLBACK_GEOMETRY.spec()} because sysfs failed ({exc})"
    try:
        model = _cpu_model(rd(Path(procfs) / "cpuinfo"))
    except OSError:
        model = "?"
    if model == "?":
        model = platform.processor() or "?"
    try:
        online: tuple[int, ...] = parse_cpulist(rd(Path(sysfs) / "devices/system/cpu/online"))
    except (OSError, ValueError):
        online = ()
    online = online or tuple(range(os.cpu_count() or 1))
    return Machine(levels, l1i, os.sysconf("SC_PAGE_SIZE"), None, None,
                   read_layout(sysfs, online, rd), _hostname(), model, len(online),
                   known, caches_source, f"this host ({sysfs}, {procfs})")


_host_lock = threading.Lock()
_host: Machine | None = None


def host() -> Machine:
    """This host as sysfs and procfs describe it, read once per process."""
    global _host
    with _host_lock:
        if _host is None:
            _host = read()
        return _host


def forget_host() -> None:
    """Read this host again at the next :func:`host` (:func:`counterd.machine.reset`)."""
    global _host
    with _host_lock:
        _host = None
