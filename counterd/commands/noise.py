"""What would add timing noise to measurements on this host: pyperf's system checks (CPU
scaling governor, Turbo Boost, isolated CPUs, ASLR, the perf event sample rate, the power
supply, ...) and one pyperf lacks, a hypervisor that takes back freed memory (free page
reporting, :func:`counterd.data.host.page_reporting`), for ``counterd probe``.

pyperf exposes its checks only as ``python -m pyperf system show`` and the internal module
``pyperf._system`` behind it. This calls that module's check classes in-process rather than
running the command and parsing its text: the command costs a Python start, pyperf's import
and a ``systemctl`` and a ``service`` process (0.4 s here) against pyperf's import and a few
file reads in-process; its text has no stable format, while the classes hand over each check's
messages separately (state, advice, warnings). The classes are internal, so every use of them
is guarded: a pyperf whose internals changed, or no pyperf, gives one check "cannot be made"
with the reason, never a failed probe. pyperf's IRQ affinity check is left out: it only
reports a state (never advice) and asks ``systemctl`` and ``service`` about irqbalance.

Nothing here needs root or writes anything; a sysfs or procfs file that is missing (VMs,
containers) or unreadable makes its check "unknown", said as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from counterd.data.host import REPORT_DELAY_MS, page_reporting

Status = Literal["noise", "ok", "unknown"]

# pyperf's checks (class names) that ``counterd probe`` leaves out, and why (module docstring).
SKIPPED = ("IRQAffinity",)

# Checks whose absence means they cannot be made here (rather than that they do not apply):
# pyperf's class name -> why it is not available, as a user should read it.
_UNAVAILABLE = {
    "CPUGovernor": ("CPU scaling governor", "no /sys/devices/system/cpu/cpu0/cpufreq (a VM or "
                    "container: the frequency is the hypervisor's or the host's to set)"),
    "ASLR": ("ASLR", "no /proc/sys/kernel/randomize_va_space"),
    "PerfEvent": ("Perf event", "no /proc/sys/kernel/perf_event_max_sample_rate"),
    "PowerSupply": ("Power supply", "no /sys/class/power_supply"),
}

TUNE = "as root: python -m pyperf system tune; system reset undoes it"


@dataclass(frozen=True)
class NoiseCheck:
    """One of pyperf's system checks on this host. ``status``: ``noise`` (the setting adds
    timing noise; ``fix`` says how to change it), ``ok``, or ``unknown`` (the check could not
    be made here; ``state`` says why)."""

    check: str
    status: Status
    state: str
    fix: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status, "state": self.state,
                "fix": self.fix}

    def line(self) -> str:
        if self.status == "unknown":
            return f"{self.check}: cannot check: {self.state}"
        if self.status == "ok":
            return f"{self.check}: {self.state}"
        return f"{self.check}: {self.state}; fix: {self.fix}"


def _strip(name: str, messages: list[str]) -> list[str]:
    prefix = f"{name}: "
    return [m[len(prefix):] if m.startswith(prefix) else m for m in messages]


PAGE_REPORTING_FIX = ("turn it off from outside the guest, in the VM's balloon device (QEMU: "
                      "-device virtio-balloon,free-page-reporting=off; libvirt: <memballoon "
                      "model='virtio' freePageReporting='off'>)")
# Some guest kernels (not upstream Linux) let root delay the reporting: memory freed and taken
# again within the delay is not the hypervisor's to fault in.
MIN_FREE = "/sys/module/page_reporting/parameters/min_free_ms"


def page_reporting_check(sysfs: str = "/sys") -> NoiseCheck:
    """The hypervisor's free page reporting as a :class:`NoiseCheck`: where it is on, a
    program's first touches of memory cost a fault in the hypervisor whenever the memory was
    freed long enough before to have been reported (seconds), so times of supersteps that
    allocate differ between runs by how long the memory lay free."""
    pr = page_reporting(sysfs)
    name = "Free page reporting"
    if pr.state == "unknown":
        return NoiseCheck(name, "unknown", pr.why)
    if pr.state == "off":
        return NoiseCheck(name, "ok", f"off ({pr.why})")
    if not pr.noisy:
        return NoiseCheck(name, "ok", f"on: {pr.detail()}; memory freed and taken again "
                          "within that is the guest's alone")
    fix = PAGE_REPORTING_FIX + (
        "; or, this kernel having the parameter, delay it past a benchmark's runs: as root, "
        f"echo {REPORT_DELAY_MS} > {MIN_FREE} (echo {pr.min_free_ms} restores it)"
        if pr.min_free_ms is not None else "; inside the guest nothing turns it off")
    return NoiseCheck(name, "noise", f"on: {pr.detail()}; memory a program touches "
                      "first after it lay free long enough to be reported faults in the "
                      "hypervisor too, so supersteps that allocate run slower or faster by how "
                      "long their memory lay free", fix)


def noise_checks(sysfs: str = "/sys") -> list[NoiseCheck]:
    """pyperf's system checks on this host, one :class:`NoiseCheck` each, and the
    hypervisor's free page reporting (``sysfs``: its root, for tests)."""
    return [*_pyperf_checks(), page_reporting_check(sysfs)]


def _pyperf_checks() -> list[NoiseCheck]:
    try:
        from pyperf import _system  # 60-90 ms: imported only when probing
    except ImportError as exc:
        return [NoiseCheck("pyperf", "unknown", f"pyperf is not importable ({exc})",
                           "pip install 'pyperf>=2.6'")]
    try:
        return _run(_system)
    except Exception as exc:  # noqa: BLE001 - pyperf's internals, not a stable API
        import pyperf

        return [NoiseCheck("pyperf", "unknown",
                           f"pyperf {pyperf.__version__}'s system checks changed "
                           f"({type(exc).__name__}: {exc})")]


def _run(_system: Any) -> list[NoiseCheck]:
    system = _system.System()  # instantiates the checks available here; prints nothing
    count = _system.get_logical_cpu_count()
    if not count:
        return [NoiseCheck("CPUs", "unknown", "the number of logical CPUs is unknown")]
    # As pyperf's System.init: the CPUs benchmarks run on are the isolated ones, else all.
    system.logical_cpu_count = count
    system.cpus = tuple(_system.get_isolated_cpus() or range(count))
    present = {type(op).__name__ for op in system.operations}
    out: list[NoiseCheck] = []
    for op in system.operations:
        if type(op).__name__ in SKIPPED:
            continue
        marks = [len(system.states), len(system.advices), len(system.warnings),
                 len(system.errors)]
        try:
            op.show()
        except Exception as exc:  # noqa: BLE001 - e.g. a sysfs file with unexpected text
            out.append(NoiseCheck(op.name, "unknown",
                                  f"pyperf's check failed ({type(exc).__name__}: {exc})"))
            continue
        states, advices, warnings, errors = (
            _strip(op.name, lst[mark:]) for lst, mark in
            zip((system.states, system.advices, system.warnings, system.errors), marks,
                strict=True))
        out.append(_judge(op, _system, states, advices, warnings + errors))
    if "TurboBoostIntelPstate" not in present and "TurboBoostMSR" not in present:
        out.append(NoiseCheck("Turbo Boost", "unknown",
                              "neither the intel_pstate driver nor an x86 CPU's MSR here"))
    for cls, (name, why) in _UNAVAILABLE.items():
        if cls not in present:
            out.append(NoiseCheck(name, "unknown", why))
    return out


def _judge(op: Any, _system: Any, states: list[str], advices: list[str],
           problems: list[str]) -> NoiseCheck:
    state = "; ".join(states)
    if advices or op.tuned_for_benchmarks is False:
        fix = "; ".join(advices) or "see python -m pyperf system show"
        if type(op).write is not _system.Operation.write:  # pyperf's tune changes it
            fix += f" ({TUNE})"
        return NoiseCheck(op.name, "noise", state or "not tuned for benchmarks", fix)
    if op.permission_error:
        return NoiseCheck(op.name, "unknown",
                          "permission denied (reading it needs root)"
                          + (f": {problems[0]}" if problems else ""))
    if problems and not states:
        return NoiseCheck(op.name, "unknown", "; ".join(problems))
    if not states:
        nothing = {"PowerSupply": "no mains adapter listed in /sys/class/power_supply"}
        return NoiseCheck(op.name, "unknown",
                          nothing.get(type(op).__name__, "pyperf's check read nothing"))
    return NoiseCheck(op.name, "ok", state)


def render_lines(checks: list[NoiseCheck]) -> list[str]:
    """The probe's "noise" section: a line per check that adds noise or cannot be made, and
    one line for those that are fine."""
    lines = ["noise     what would add timing noise here (pyperf's system checks, free page "
             "reporting)"]
    for c in checks:
        if c.status != "ok":
            lines.append(f"  {c.line()}")
    ok = [f"{c.check} ({c.state})" for c in checks if c.status == "ok"]
    if ok:
        lines.append("  fine: " + "; ".join(ok))
    return lines
