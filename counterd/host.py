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

# PMU device names under /sys/bus/event_source/devices that mean "a core PMU is exposed".
CORE_PMU_NAMES = ("cpu", "cpu_core", "cpu_atom", "armv8_pmuv3", "armv8_pmuv3_0", "cpum_cf")


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

    @property
    def no_pmu_reason(self) -> str | None:
        if self.core_pmu is not None:
            return None
        return ("no hardware PMU is exposed to this kernel (/sys/bus/event_source/devices has no "
                "cpu PMU)" + ("; virtual machines often hide it" if self.hypervisor else ""))


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
    vendor = fields.get("vendor_id") or fields.get("CPU implementer", "unknown")
    model_name = fields.get("model name") or fields.get("Model") or platform.processor() or "?"
    devices_dir = sys_ / "bus/event_source/devices"
    try:
        devices = tuple(sorted(p.name for p in devices_dir.iterdir()))
    except OSError:
        devices = ()
    core = next((d for d in devices if d in CORE_PMU_NAMES or d.startswith("armv8_pmuv3")), None)
    siblings, cores = _int(fields.get("siblings")), _int(fields.get("cpu cores"))
    tpc = siblings // cores if siblings and cores else None
    online = _read(sys_ / "devices/system/cpu/online")
    return HostInfo(
        hostname=socket.gethostname(),
        kernel=platform.release(),
        machine=platform.machine(),
        cpu_model=model_name,
        vendor=vendor,
        family=_int(fields.get("cpu family")),
        model=_int(fields.get("model")),
        cpus_online=_count_cpus(online) if online else (os.cpu_count() or 1),
        threads_per_core=tpc,
        page_bytes=os.sysconf("SC_PAGE_SIZE"),
        perf_event_paranoid=_int(_read(proc / "sys/kernel/perf_event_paranoid")),
        pmu_devices=devices,
        core_pmu=core,
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
