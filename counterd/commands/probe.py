"""``counterd probe``: every canonical counter and every backend on this host, and why not;
what ``auto`` picks for each purpose, and why; the machine description in use.

JSON shape (issue 2, extended): ``{"host": {...}, "machine": {...}, "backends": {name:
{"available": bool, "reason": str}}, "counters": {canonical: {"available": bool, "backend":
str|null, "reason": str|null, "source": str|null}}, "auto": {purpose: {"requested": "auto",
"backend": str|null, "reason": str, "error": bool, "tried": [{"step": str, "result":
str}]}}, "markers": str}``. A counter's backend is the first, in :data:`PREFERENCE` order,
that can give it; measured sources come before simulated ones. ``auto`` is
:func:`counterd.backends.resolve`'s answer for every purpose; ``machine`` is
:meth:`counterd.machine.description.Machine.to_json`; ``markers`` says whether the markers'
begin and end run compiled or in Python, and why; ``noise`` is pyperf's system checks (CPU scaling
governor, Turbo Boost, isolated CPUs, ASLR, ...) and free page reporting
(:mod:`counterd.commands.noise`), ``[{"check": str,
"status": "noise"|"ok"|"unknown", "state": str, "fix": str|null}]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from counterd import backends
from counterd.backends import Resolution
from counterd.backends.base import Capability
from counterd.commands.noise import NoiseCheck, noise_checks, render_lines
from counterd.data.events import BY_NAME, NAMES
from counterd.data.host import HostInfo, host_info, no_pmu_reason
from counterd.machine import current as current_machine
from counterd.machine.description import Machine
from counterd.machine.geometry import format_cpulist

PREFERENCE = ("perf", "papi", "callgrind", "sim")


@dataclass(frozen=True)
class CounterStatus:
    available: bool
    backend: str | None
    reason: str | None
    source: str | None = None  # measured / simulated


@dataclass(frozen=True)
class ProbeResult:
    host: HostInfo
    backends: Mapping[str, Capability]
    counters: Mapping[str, CounterStatus]
    auto: Mapping[str, Resolution] = field(default_factory=dict)
    machine: Machine | None = None
    # How the markers run: their compiled hot path, or Python and why.
    markers: str = ""
    # pyperf's system checks and free page reporting: what would add timing noise here.
    noise: tuple[NoiseCheck, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host.to_json(),
            "machine": self.machine.to_json() if self.machine is not None else None,
            "backends": {n: {"available": c.available, "reason": c.reason}
                         for n, c in self.backends.items()},
            "counters": {n: {"available": s.available, "backend": s.backend, "reason": s.reason,
                             "source": s.source}
                         for n, s in self.counters.items()},
            "auto": {p: r.to_json() for p, r in self.auto.items()},
            "markers": self.markers,
            "noise": [c.to_json() for c in self.noise],
        }


def probe() -> ProbeResult:
    described = current_machine()  # a bad machine file is BadInput here, not a probe result
    caps = {name: backends.capability(name) for name in PREFERENCE}
    counters: dict[str, CounterStatus] = {}
    for counter in NAMES:
        chosen = next((n for n in PREFERENCE if caps[n].supports(counter)), None)
        if chosen is not None:
            source = backends.get(chosen).source.value
            counters[counter] = CounterStatus(True, chosen, None, source)
            continue
        why = []
        for n in PREFERENCE:
            cap = caps[n]
            reason = cap.counters.get(counter) if cap.available else cap.reason
            why.append(f"{n}: {reason or 'not provided'}")
        counters[counter] = CounterStatus(False, None, "; ".join(why))
    auto: dict[str, Resolution] = {p: backends.resolve("auto", p, caps)
                                   for p in backends.PURPOSES}
    return ProbeResult(host_info(machine=described), caps, counters, auto, described,
                       markers_path(), tuple(noise_checks()))


def markers_path() -> str:
    """How the markers' begin and end run in a program on this host."""
    from counterd import _native

    if _native.hotpath() is not None:
        return "compiled (counterd/_native/hotpath_src/); " + _marker_reads()
    return "in Python: " + _native.hotpath_missing_reason()


def _marker_reads() -> str:
    """How the compiled markers read this host's counters: in user space (rdpmc) or by
    read(2), and why; found by marking one superstep with the markers' own choice of backend
    and events, in memory."""
    from counterd.data.errors import CounterdError
    from counterd.markers.recorder import Recorder

    try:
        rec = Recorder(socket="off")
        rec.end(rec.begin("probe", {}))
        state = rec._state()
    except CounterdError as exc:
        return f"their counters did not open here ({exc})"
    lane, group = state.lane, state.group
    try:
        if lane is None:
            return f"their counters ({rec.backend_name}) are read by the Python path"
        events = ", ".join(getattr(group, "events", ())) or "none"
        if lane.user_read_off is None:
            return f"counters ({events}) read in user space (rdpmc)"
        return f"counters ({events}) read by read(2): {lane.user_read_off}"
    finally:  # the probe's counters go now, not when the process ends
        if lane is not None:
            lane.unmap()
        if group is not None:
            group.close()


def memory_lines(m: Machine) -> list[str]:
    """What a memory bank is on ``m``: its NUMA nodes, channels, interleave and the banks they
    make, each with what was read, declared or assumed, and where ranks are pinned."""
    mem = m.memory
    nodes = mem.nodes.value
    banks = mem.banks
    rule = ("as declared ([bank_map])" if mem.declared_banks is not None else
            f"= {mem.channels_per_node.value} channels x {len(nodes)} node"
            f"{'s' if len(nodes) > 1 else ''}, interleaved on {mem.interleave_bytes.value} B")
    return [
        f"memory    NUMA nodes {len(nodes)}: "
        + "; ".join(f"node {n.node} CPUs {format_cpulist(n.cpus)}" for n in nodes)
        + f" ({mem.nodes.describe()})",
        f"          channels {mem.channels_per_node.value} per NUMA node "
        f"({mem.channels_per_node.describe()})",
        f"          interleave {mem.interleave_bytes.value} B "
        f"({mem.interleave_bytes.describe()})",
        f"          banks {banks.value.banks} x {banks.value.interleave_bytes} B {rule} "
        f"({banks.provenance})",
        "          placement: a p-processor pattern's ranks go round-robin over the NUMA nodes "
        "(likwid-pin -c M:scatter), e.g. CPUs " + ",".join(map(str, mem.spread(mem.cpus)[:8]))
        + (",..." if len(mem.cpus) > 8 else ""),
        *([f"          memory as declared: {mem.remark}"] if mem.remark else []),
    ]


def render_text(result: ProbeResult) -> str:
    h = result.host
    lines = [
        f"host      {h.hostname}  {h.cpu_model} ({h.vendor} family {h.family} model {h.model})",
        f"kernel    {h.kernel} {h.machine}, {h.cpus_online} CPUs online, "
        f"perf_event_paranoid={h.perf_event_paranoid}",
        f"PMU       {h.core_pmu or 'none: ' + no_pmu_reason('/sys')}",
        "",
        "backends",
    ]
    for name, cap in result.backends.items():
        lines.append(f"  {name:<10} {'yes' if cap.available else 'no ':<4} {cap.reason}")
    m = result.machine
    if m is not None:
        tlb = (f"DTLB {m.tlb_entries} entries {m.tlb_ways}-way" if m.tlb_entries is not None
               else "DTLB unknown")
        l1i = f", L1i {m.l1i.size_bytes // 1024}K/{m.l1i.ways}" if m.l1i is not None else ""
        lines[3:3] = [
            f"machine   {m.caches_spec or 'caches unknown: ' + m.caches_source}{l1i}; "
            f"page {m.page_bytes} B; {tlb}; from {m.source}",
            *memory_lines(m),
        ]
    lines += ["", f"hot path  the markers run {result.markers}"]
    if result.noise:
        lines += ["", *render_lines(list(result.noise))]
    lines += ["", "auto picks, per purpose"]
    for purpose, res in result.auto.items():
        lines.append(f"  {purpose:<10} {res.backend or '-':<10} {res.reason}")
    lines += ["", "counters"]
    for name, st in result.counters.items():
        unit = BY_NAME[name].unit
        if st.available:
            lines.append(f"  {name:<17} {st.backend:<10} {st.source}  ({unit})")
        else:
            lines.append(f"  {name:<17} {'-':<10} unavailable: {st.reason}")
    return "\n".join(lines)
