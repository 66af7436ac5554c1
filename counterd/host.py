"""What this host is: CPU, kernel, PMU exposure, perf_event_paranoid.

Roots are parameters (``procfs``, ``sysfs``) so tests can feed fixture trees, as psutil and
prometheus client_python do. Nothing here raises for a missing file: unknown is reported as
such.
"""

from __future__ import annotations

import os
import platform
import re
import socket
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Names the kernel gives the core (per-thread) PMU under /sys/bus/event_source/devices.
# x86: arch/x86/events/core.c registers "cpu" (hybrid: "cpu_core", "cpu_atom");
# arm64: drivers/perf/arm_pmuv3.c registers "armv8_pmuv3_<n>" / "armv8_<core>".
_CORE_PMU_NAMES = frozenset({"cpu", "cpu_core", "cpu_atom", "cpum_cf"})
_CORE_PMU_PREFIXES = ("armv8_", "armv7_", "arm_cortex", "riscv_pmu", "cpu_")


_PERF_TYPE_RAW = 4  # include/uapi/linux/perf_event.h


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    kernel: str
    machine: str
    cpu_model: str
    vendor: str
    family: int | None
    model: int | None
    cpus_online: int
    threads_per_core: int | None
    page_bytes: int
    perf_event_paranoid: int | None
    pmu_devices: tuple[str, ...]
    core_pmu: str | None
    hypervisor: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)



def read_paranoid(procfs_root: str | os.PathLike[str]) -> int | None:
    """kernel.perf_event_paranoid from ``<procfs_root>/sys/kernel/perf_event_paranoid``."""
    try:
        return int(Path(procfs_root, "sys/kernel/perf_event_paranoid").read_text().strip())
    except (OSError, ValueError):
        return None


def parse_cpuinfo(text: str) -> tuple[str, int, int]:
    """``(vendor_id, cpu family, model)`` of the first processor in /proc/cpuinfo text;
    ``("", 0, 0)`` fields where absent (e.g. arm64, which has no vendor_id)."""
    vendor, family, model = "", 0, 0
    for line in text.splitlines():
        if not line.strip():
            if vendor:
                break
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        try:
            if key == "vendor_id" and not vendor:
                vendor = value
            elif key == "cpu family":
                family = int(value)
            elif key == "model":
                model = int(value)
        except ValueError:
            continue
    return vendor, family, model


def pmu_devices(sysfs_root: str | os.PathLike[str]) -> list[str]:
    """Names under ``<sysfs_root>/bus/event_source/devices`` (empty if it is absent)."""
    try:
        return sorted(p.name for p in Path(sysfs_root, "bus/event_source/devices").iterdir())
    except OSError:
        return []


def core_pmu(sysfs_root: str | os.PathLike[str]) -> str | None:
    """The core (per-thread hardware) PMU's name, or None when the kernel exposes none."""
    devices = Path(sysfs_root, "bus/event_source/devices")
    for name in pmu_devices(sysfs_root):
        if name in _CORE_PMU_NAMES or name.startswith(_CORE_PMU_PREFIXES):
            return name
        # The first core PMU registers with type PERF_TYPE_RAW (kernel/events/core.c).
        try:
            if int((devices / name / "type").read_text().strip()) == _PERF_TYPE_RAW:
                return name
        except (OSError, ValueError):
            continue
    return None


def no_pmu_reason(sysfs_root: str | os.PathLike[str]) -> str:
    devices = Path(sysfs_root, "bus/event_source/devices")
    found = ", ".join(pmu_devices(sysfs_root)) or "nothing"
    return (f"no hardware PMU is exposed to this kernel ({devices} has no cpu PMU, only: "
            f"{found}); virtual machines often hide it (KVM/QEMU: -cpu host,pmu=on; cloud "
            "VMs: choose an instance type with a virtual PMU)")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The first processor block of /proc/cpuinfo as a dict."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _int(value: str | None) -> int | None:
    try:
        return int(value.strip(), 0) if value is not None else None
    except ValueError:
        return None


def host_info(procfs: str | Path = "/proc", sysfs: str | Path = "/sys") -> HostInfo:
    proc, sys_ = Path(procfs), Path(sysfs)
    fields = cpuinfo_fields(_read(proc / "cpuinfo") or "")
    vendor, family, model = parse_cpuinfo(_read(proc / "cpuinfo") or "")
    model_name = fields.get("model name") or fields.get("Model") or platform.processor() or "?"
    siblings, cores = _int(fields.get("siblings")), _int(fields.get("cpu cores"))
    tpc = siblings // cores if siblings and cores else None
    online = _read(sys_ / "devices/system/cpu/online")
    return HostInfo(
        hostname=socket.gethostname(),
        kernel=platform.release(),
        machine=platform.machine(),
        cpu_model=model_name,
        vendor=vendor or fields.get("CPU implementer", "unknown"),
        family=family or None,
        model=model or None,
        cpus_online=_count_cpus(online) if online else (os.cpu_count() or 1),
        threads_per_core=tpc,
        page_bytes=os.sysconf("SC_PAGE_SIZE"),
        perf_event_paranoid=read_paranoid(proc),
        pmu_devices=tuple(pmu_devices(sys_)),
        core_pmu=core_pmu(sys_),
        hypervisor="hypervisor" in fields.get("flags", "").split(),
    )


@dataclass(frozen=True)
class SysfsCache:
    """One ``cpuN/cache/indexK`` entry of sysfs."""

    level: int
    kind: str  # "Data", "Instruction" or "Unified"
    size_bytes: int
    ways: int  # sysfs says 0 for fully associative: then size // line
    line_bytes: int
    shared_cpus: tuple[int, ...]


def parse_size(text: str) -> int:
    """``"48K"`` -> 49152. Suffixes K, M, G (binary, as sysfs and the seed use them); an
    optional trailing ``B`` or ``iB``."""
    from counterd.errors import BadInput

    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise BadInput(f"cannot read size {text!r}", "write a byte count like 32768, 32K or 1M")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def read_caches(sysfs: str | Path = "/sys", cpu: int = 0) -> tuple[SysfsCache, ...]:
    """Every cache of ``cpu`` described under ``<sysfs>/devices/system/cpu/cpuN/cache``, in
    index order. Raises BadInput (naming the file) when an entry cannot be read."""
    from counterd.errors import BadInput

    base = Path(sysfs) / "devices" / "system" / "cpu" / f"cpu{cpu}" / "cache"
    fix = "mount sysfs, or give the cache geometry explicitly"
    try:
        indexes = sorted(base.glob("index*"), key=lambda p: int(p.name[5:] or 0))
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read cache geometry from {base}: {exc}", fix) from exc
    out = []
    for idx in indexes:
        try:
            size = parse_size((idx / "size").read_text())
            line = int((idx / "coherency_line_size").read_text())
            ways = int((idx / "ways_of_associativity").read_text()) or size // line
            shared_file = idx / "shared_cpu_list"
            shared = parse_cpulist(shared_file.read_text()) if shared_file.exists() else ()
            out.append(SysfsCache(int((idx / "level").read_text()),
                                  (idx / "type").read_text().strip(), size, ways, line, shared))
        except (OSError, ValueError, BadInput) as exc:
            raise BadInput(f"cannot read cache geometry from {idx}: {exc}", fix) from exc
    return tuple(out)


def _count_cpus(cpulist: str) -> int:
    """Number of CPUs in a sysfs cpu list such as ``0-3,6``."""
    return len(parse_cpulist(cpulist))


def parse_cpulist(cpulist: str) -> tuple[int, ...]:
    """sysfs cpu list ``"0-3,8"`` -> (0, 1, 2, 3, 8)."""
    cpus: list[int] = []
    for part in cpulist.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)
