"""Counter sources, all behind :class:`~counterd.backends.base.Backend`, selected here only.

``get(name)`` returns a backend by name; ``select("auto")`` picks real hardware counters where
the host has them (perf, then papi), else simulation, and the caller reports which it used.
"""

from __future__ import annotations

import importlib

from counterd.backends.base import Backend, Capability, CounterGroup, CounterValue, Reading, Target
from counterd.errors import BackendUnavailable, UnknownBackend

NAMES: tuple[str, ...] = ("perf", "papi", "sim", "callgrind")

_MODULES = {
    "perf": ("counterd.backends.perf", "PerfBackend"),
    "papi": ("counterd.backends.papi", "PapiBackend"),
    "sim": ("counterd.backends.sim", "SimBackend"),
    "callgrind": ("counterd.backends.callgrind", "CallgrindBackend"),
}


def get(name: str) -> Backend:
    """The backend called ``name``. Raises UnknownBackend for a name not in NAMES."""
    if name not in _MODULES:
        raise UnknownBackend(name, NAMES + ("auto",))
    module, cls = _MODULES[name]
    return getattr(importlib.import_module(module), cls)()


def capabilities() -> dict[str, Capability]:
    """Every backend's capability on this host (never raises)."""
    return {name: get(name).available() for name in NAMES}


def select(name: str = "auto", counters: tuple[str, ...] = ("loads", "l1d_misses")) -> Backend:
    """Resolve ``name`` (or ``auto``) to an available backend.

    ``auto`` prefers measured hardware counters: perf if it can count ``counters`` on this host,
    then papi, else the simulator (whose values are labelled ``simulated``).
    """
    if name != "auto":
        backend = get(name)
        cap = backend.available()
        if not cap.available:
            raise BackendUnavailable(name, cap.reason, "choose another with --backend, or auto")
        return backend
    for candidate in ("perf", "papi"):
        backend = get(candidate)
        cap = backend.available()
        if all(cap.supports(c) for c in counters):
            return backend
    return get("sim")


__all__ = [
    "NAMES", "Backend", "Capability", "CounterGroup", "CounterValue", "Reading", "Target",
    "capabilities", "get", "select",
]
