"""What this host is: CPU, kernel, PMU exposure, perf_event_paranoid, whether its hypervisor
takes back the memory it frees (data only).

The machine description (caches, page size, CPUs online, the fingerprint) is not read here:
:mod:`counterd.machine` is its one home, and :func:`host_info` takes those fields from it.

Roots are parameters (``procfs``, ``sysfs``) so tests can feed fixture trees, as psutil and
prometheus client_python do. Nothing here raises for a missing file: unknown is reported as
such (a bad machine file, through :mod:`counterd.machine`, is BadInput).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from counterd.machine.description import Machine

# Names the kernel gives the core (per-thread) PMU under /sys/bus/event_source/devices.
# x86: arch/x86/events/core.c registers "cpu" (hybrid: "cpu_core", "cpu_atom");
# arm64: drivers/perf/arm_pmuv3.c registers "armv8_pmuv3_<n>" / "armv8_<core>".
_CORE_PMU_NAMES = frozenset({"cpu", "cpu_core", "cpu_atom", "cpum_cf"})
_CORE_PMU_PREFIXES = ("armv8_", "armv7_", "arm_cortex", "riscv_pmu", "cpu_")


_PERF_TYPE_RAW = 4  # include/uapi/linux/perf_event.h

# The virtio specification's device id of the memory balloon, and the feature bit by which the
# driver reports free pages to the device (VIRTIO_BALLOON_F_REPORTING,
# include/uapi/linux/virtio_balloon.h). sysfs lists a device's negotiated features as a string
# of 0s and 1s, bit 0 first (drivers/virtio/virtio.c, features_show).
_VIRTIO_ID_BALLOON = 5
_VIRTIO_BALLOON_F_REPORTING = 5
# A reporting delay (min_free_ms) of a minute or more outlasts a pilot campaign's gaps between
# runs: memory freed by one run and taken by the next stays the guest's.
REPORT_DELAY_MS = 60_000


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



@dataclass(frozen=True)
class PageReporting:
    """Whether the guest kernel reports the memory it frees to its hypervisor (free page
    reporting, mm/page_reporting.c), which then drops it: the next first touch of such memory
    faults in the hypervisor as well as in the guest, so a program that allocates runs slower
    when the memory it gets was freed long enough ago to have been reported. ``state``: on,
    off (no virtio balloon negotiated it) or unknown (``why`` says what could not be read);
    ``order``: the smallest block reported, 2**order pages (page_reporting_order);
    ``min_free_ms``: how long a block stays free before it is reported, where the kernel has
    that parameter (some guest kernels do; upstream Linux reports after about 2 s)."""

    state: Literal["on", "off", "unknown"]
    why: str
    device: str | None = None
    order: int | None = None
    min_free_ms: int | None = None

    @property
    def noisy(self) -> bool:
        """On, and not delayed past :data:`REPORT_DELAY_MS`: runs a few seconds apart meet it."""
        return self.state == "on" and not (self.min_free_ms is not None
                                           and self.min_free_ms >= REPORT_DELAY_MS)

    def detail(self) -> str:
        """``why``, with the blocks reported and the delay where they are known."""
        return (self.why
                + (f", in blocks of 2^{self.order} pages and up" if self.order is not None else "")
                + (f", after {self.min_free_ms} ms free" if self.min_free_ms is not None else ""))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "noisy": self.noisy}


def page_reporting(sysfs_root: str | os.PathLike[str] = "/sys") -> PageReporting:
    """Free page reporting on this host, from the virtio balloon's negotiated features under
    ``<sysfs_root>/bus/virtio/devices`` (other hypervisors' balloons, e.g. Hyper-V's, are not
    recognised: off, said so)."""
    devices = Path(sysfs_root, "bus/virtio/devices")
    try:
        names = sorted(p.name for p in devices.iterdir())
    except OSError:
        names = []
    for name in names:
        dev = devices / name
        if _int(_read(dev / "device")) != _VIRTIO_ID_BALLOON:
            continue
        bits = (_read(dev / "features") or "").strip()
        if not bits or set(bits) - {"0", "1"}:
            return PageReporting("unknown", f"{dev / 'features'} is unreadable or not a string "
                                 "of 0s and 1s", name)
        if len(bits) <= _VIRTIO_BALLOON_F_REPORTING or bits[_VIRTIO_BALLOON_F_REPORTING] != "1":
            return PageReporting("off", f"the virtio balloon ({name}) did not negotiate free "
                                 "page reporting", name)
        params = Path(sysfs_root, "module/page_reporting/parameters")
        order = _int(_read(params / "page_reporting_order"))
        wait = _int(_read(params / "min_free_ms"))
        return PageReporting("on", f"the virtio balloon ({name}) reports freed memory to the "
                             "hypervisor", name,
                             order if order is not None and order < 64 else None,
                             wait if wait is not None and wait >= 0 else None)
    return PageReporting("off", "no virtio balloon device (other hypervisors' balloons are not "
                         "checked)")


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


def cpu_flags(procfs: str | Path = "/proc") -> frozenset[str]:
    """The CPU feature flags of /proc/cpuinfo's first processor (x86 ``flags``; empty where
    the kernel lists none)."""
    text = _read(Path(procfs) / "cpuinfo") or ""
    return frozenset(cpuinfo_fields(text).get("flags", "").split())


def _int(value: str | None) -> int | None:
    try:
        return int(value.strip(), 0) if value is not None else None
    except ValueError:
        return None


def host_info(procfs: str | Path = "/proc", sysfs: str | Path = "/sys", *,
              machine: Machine | None = None) -> HostInfo:
    """What this host is. Hostname, CPU model, CPUs online and page size are the machine
    description's (``machine``, default: :func:`counterd.machine.current` for the default
    roots, else :func:`counterd.machine.sysfs.read` of the given ones); the rest is read here."""
    # Imported here: the perf backend imports this module on counterd record's way to the
    # command's exec, and only host_info needs platform.
    import platform

    from counterd import machine as machine_mod
    from counterd.machine.sysfs import read

    if machine is None:
        machine = (machine_mod.current() if (str(procfs), str(sysfs)) == ("/proc", "/sys")
                   else read(sysfs, procfs))
    proc, sys_ = Path(procfs), Path(sysfs)
    text = _read(proc / "cpuinfo") or ""
    fields = cpuinfo_fields(text)
    vendor, family, model = parse_cpuinfo(text)
    siblings, cores = _int(fields.get("siblings")), _int(fields.get("cpu cores"))
    tpc = siblings // cores if siblings and cores else None
    return HostInfo(
        hostname=machine.hostname,
        kernel=platform.release(),
        machine=platform.machine(),
        cpu_model=machine.cpu_model,
        vendor=vendor or fields.get("CPU implementer", "unknown"),
        family=family or None,
        model=model or None,
        cpus_online=machine.cpus_online,
        threads_per_core=tpc,
        page_bytes=machine.page_bytes,
        perf_event_paranoid=read_paranoid(proc),
        pmu_devices=tuple(pmu_devices(sys_)),
        core_pmu=core_pmu(sys_),
        hypervisor="hypervisor" in fields.get("flags", "").split(),
    )
