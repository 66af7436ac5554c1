"""``counterd probe``: every canonical counter and every backend on this host, and why not.

JSON shape (issue 2): ``{"host": {...}, "backends": {name: {"available": bool, "reason": str}},
"counters": {canonical: {"available": bool, "backend": str|null, "reason": str|null}}}``.
A counter's backend is the first, in :data:`PREFERENCE` order, that can give it; measured
sources come before simulated ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from counterd import backends
from counterd.backends.base import Capability
from counterd.events import BY_NAME, NAMES
from counterd.host import HostInfo, host_info, no_pmu_reason

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

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host.to_json(),
            "backends": {n: {"available": c.available, "reason": c.reason}
                         for n, c in self.backends.items()},
            "counters": {n: {"available": s.available, "backend": s.backend, "reason": s.reason,
                             "source": s.source}
                         for n, s in self.counters.items()},
        }


def _capability(name: str) -> Capability:
    try:
        return backends.get(name).available()
    except Exception as exc:  # noqa: BLE001 - a probe reports, it never dies
        return Capability(name, False, f"internal error while probing: {exc!r}", {})


def probe() -> ProbeResult:
    caps = {name: _capability(name) for name in PREFERENCE}
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
    return ProbeResult(host_info(), caps, counters)


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
    lines += ["", "counters"]
    for name, st in result.counters.items():
        unit = BY_NAME[name].unit
        if st.available:
            lines.append(f"  {name:<17} {st.backend:<10} {st.source}  ({unit})")
        else:
            lines.append(f"  {name:<17} {'-':<10} unavailable: {st.reason}")
    return "\n".join(lines)
