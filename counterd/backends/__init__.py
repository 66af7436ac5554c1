"""Counter sources, all behind :class:`~counterd.backends.base.Backend`, selected here only.

``get(name)`` returns a backend by name. ``resolve(name, purpose)`` is the one place that turns
a requested backend (a name, or ``auto``) into the backend a purpose uses, with the reason in
words; every caller (``counterd record``, the marker API, the daemon's sampler, ``microbench``)
and ``counterd probe`` use it. What ``auto`` means differs by purpose, on purpose, and is stated
once, in :data:`POLICIES`:

==========  ==========================================================  =======================
purpose     ``auto`` tries, in order (first that qualifies)             names it also accepts
==========  ==========================================================  =======================
markers     perf (any counter, software events included)                perf papi sim callgrind
                                                                        daemon none
record      perf with hardware memory counters (loads); callgrind;      perf papi sim callgrind
            perf (software events only); else no counters               none
sampling    perf                                                        perf none
microbench  perf with a hardware load counter; papi with one; sim       perf papi sim
==========  ==========================================================  =======================

The markers count inside the program, so only a backend that opens counter groups in-process
serves them (callgrind and the daemon count from outside: names that give the markers no
in-process backend). A recording wants memory-hierarchy counters above all: measured, else
simulated for the whole command under valgrind, else at least perf's software events. The
daemon samples other processes' threads, which only perf can attach to. A calibration needs
every counter of every pattern: measured load counters where the host has them, else all of
them simulated from the pattern's address stream.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from counterd.backends.base import Backend, Capability, CounterGroup, CounterValue, Reading, Target
from counterd.data.errors import BackendUnavailable, UnknownBackend
from counterd.data.events import NAMES as EVENT_NAMES

NAMES: tuple[str, ...] = ("perf", "papi", "sim", "callgrind")

_MODULES = {
    "perf": ("counterd.backends.perf", "PerfBackend"),
    "papi": ("counterd.backends.papi", "PapiBackend"),
    "sim": ("counterd.backends.sim", "SimBackend"),
    "callgrind": ("counterd.backends.callgrind", "CallgrindBackend"),
}

Purpose = Literal["markers", "record", "sampling", "microbench"]
PURPOSES: tuple[Purpose, ...] = ("markers", "record", "sampling", "microbench")


def get(name: str) -> Backend:
    """The backend called ``name``. Raises UnknownBackend for a name not in NAMES."""
    if name not in _MODULES:
        raise UnknownBackend(name, NAMES + ("auto",))
    module, cls = _MODULES[name]
    return getattr(importlib.import_module(module), cls)()


def capability(name: str) -> Capability:
    """``name``'s capability on this host; never raises (an error becomes the reason)."""
    try:
        return get(name).available()
    except Exception as exc:  # noqa: BLE001 - a capability reports, it never dies
        return Capability(name, False, f"internal error while probing: {exc!r}", {})


def capabilities() -> dict[str, Capability]:
    """Every backend's capability on this host (never raises)."""
    return {name: capability(name) for name in NAMES}


# --------------------------------------------------------------------------------------------
# The resolver


@dataclass(frozen=True)
class Candidate:
    """One step of ``auto``: ``backend`` qualifies when it is available and can give every
    counter in ``needs``."""

    backend: str
    needs: tuple[str, ...] = ()
    label: str = ""  # what this step gives, in words

    def describe(self) -> str:
        return f"{self.backend}, {self.label}" if self.label else self.backend


@dataclass(frozen=True)
class Policy:
    """What one purpose accepts by name and what ``auto`` tries for it."""

    names: tuple[str, ...]  # besides "auto"
    auto: tuple[Candidate, ...]
    why: str  # the rationale, in words
    otherwise: str  # what auto gives when no candidate qualifies
    # Names accepted that give no in-process backend, with what they mean.
    outside: Mapping[str, str] = field(default_factory=dict)


POLICIES: Mapping[Purpose, Policy] = {
    "markers": Policy(
        names=("perf", "papi", "sim", "callgrind", "daemon", "none"),
        auto=(Candidate("perf"),),
        why="the markers count inside the program with perf, software events included",
        otherwise="no counters in the process (the daemon may count on its behalf)",
        outside={"callgrind": "counters come from callgrind",
                 "daemon": "counters come from daemon", "none": "none"}),
    "record": Policy(
        names=("perf", "papi", "sim", "callgrind", "none"),
        auto=(Candidate("perf", ("loads",), "hardware memory counters"),
              Candidate("callgrind", (), "simulated memory counters"),
              Candidate("perf", (), "software events only")),
        why="memory-hierarchy counters first: measured, else simulated under valgrind, else "
            "perf's software events",
        otherwise="no counters (times only)",
        outside={"none": "no counters requested"}),
    "sampling": Policy(
        names=("perf", "none"),
        auto=(Candidate("perf"),),
        why="the daemon samples other processes' threads, which only perf can attach to",
        otherwise="no sampling",
        outside={"none": "sampling.backend = none"}),
    "microbench": Policy(
        names=("perf", "papi", "sim"),
        auto=(Candidate("perf", ("loads",), "a hardware load counter"),
              Candidate("papi", ("loads",), "a hardware load counter"),
              Candidate("sim", (), "every counter simulated")),
        why="measured load counters where the host has them, else every counter simulated "
            "from the pattern's address stream",
        otherwise="sim"),
}


@dataclass(frozen=True)
class Resolution:
    """Which backend a purpose uses for a requested name, and why.

    ``backend``: the chosen backend's name, or None (no in-process counters: ``reason`` says
    why). ``error``: the name asked for cannot be used here (unavailable): callers that must
    fail do so with ``reason``. ``tried``: each ``auto`` step and why it did or did not
    qualify. ``capabilities``: what each consulted backend reported.
    """

    purpose: Purpose
    requested: str
    backend: str | None
    reason: str
    error: bool = False
    tried: tuple[tuple[str, str], ...] = ()
    capabilities: Mapping[str, Capability] = field(default_factory=dict)

    @property
    def capability(self) -> Capability | None:
        return self.capabilities.get(self.backend) if self.backend else None

    def get(self) -> Backend:
        """The chosen backend object. Raises BackendUnavailable when there is none."""
        if self.backend is None:
            raise BackendUnavailable(self.requested, self.reason,
                                     "choose another with --backend (see counterd probe)")
        return get(self.backend)

    def unavailable(self, fix: str) -> BackendUnavailable:
        """The error for a backend asked for by name that cannot be used here."""
        cap = self.capabilities.get(self.requested)
        return BackendUnavailable(self.requested, cap.reason if cap else self.reason, fix)

    def to_json(self) -> dict[str, object]:
        return {"requested": self.requested, "backend": self.backend, "reason": self.reason,
                "error": self.error, "tried": [{"step": s, "result": r} for s, r in self.tried]}


def gist(reason: str | None) -> str:
    """The gist of a (often long) reason: up to its first ``;`` or parenthesis."""
    text = " ".join((reason or "not provided").split())
    return re.split(r"; | \(", text, maxsplit=1)[0]


def _qualifies(c: Candidate, cap: Capability) -> tuple[bool, str]:
    """(whether ``c`` qualifies, the verdict in words)."""
    if not cap.available:
        return False, f"unavailable: {gist(cap.reason)}"
    for counter in c.needs:
        if not cap.supports(counter):
            why = cap.counters.get(counter, "not known to it")
            return False, f"cannot count {counter}: {gist(why)}"
    return True, "available" + (f", counts {', '.join(c.needs)}" if c.needs else "")


def auto_picks_alone(purpose: Purpose, backend: str, cap: Capability) -> bool:
    """Whether ``auto`` for ``purpose`` picks ``backend``, whose capability is ``cap``, before
    any other backend is asked about: what ``auto`` gives then depends on ``cap`` alone (a
    recording's saved perf plan can stand for the resolution, counterd.launch)."""
    for c in POLICIES[purpose].auto:
        if c.backend != backend:
            return False
        if _qualifies(c, cap)[0]:
            return True
    return False


def resolve(name: str, purpose: Purpose,
            caps: Mapping[str, Capability] | None = None) -> Resolution:
    """The backend ``purpose`` uses when ``name`` (a backend name, or ``auto``) is asked for.

    ``caps``: capabilities already known (``counterd probe`` passes its own; tests pass
    invented hosts); others are asked for with :func:`capability`, once each. Raises
    UnknownBackend for a name the purpose does not accept; an unavailable backend asked for
    by name is a Resolution with ``error`` set, never an exception.
    """
    if purpose not in POLICIES:
        raise ValueError(f"unknown purpose {purpose!r}: choose from {', '.join(PURPOSES)}")
    policy = POLICIES[purpose]
    if name != "auto" and name not in policy.names:
        raise UnknownBackend(name, ("auto", *policy.names))
    known: dict[str, Capability] = dict(caps or {})

    def cap_of(backend: str) -> Capability:
        if backend not in known:
            known[backend] = capability(backend)
        return known[backend]

    if name in policy.outside:
        return Resolution(purpose, name, None, policy.outside[name], False, (), known)
    if name != "auto":
        cap = cap_of(name)
        if not cap.available:
            return Resolution(purpose, name, None, f"backend {name} is unavailable: "
                              f"{cap.reason}", True, (), known)
        return Resolution(purpose, name, name, f"{name} was asked for by name: {cap.reason}",
                          False, (), known)
    tried: list[tuple[str, str]] = []
    passed_over: list[str] = []
    for c in policy.auto:
        cap = cap_of(c.backend)
        ok, verdict = _qualifies(c, cap)
        if ok:
            given = sum(1 for counter in EVENT_NAMES if cap.supports(counter))
            verdict += f" ({given} of {len(EVENT_NAMES)} counters here)"
        tried.append((c.describe(), verdict))
        if ok:
            reason = f"{c.describe()}: {verdict}" + (
                "; not " + ", not ".join(passed_over) if passed_over else "")
            return Resolution(purpose, name, c.backend, reason, False, tuple(tried), known)
        passed_over.append(f"{c.backend} ({verdict})")
    reason = f"{policy.otherwise}; not " + ", not ".join(passed_over)
    return Resolution(purpose, name, None, reason, False, tuple(tried), known)


__all__ = [
    "NAMES", "POLICIES", "PURPOSES", "Backend", "Candidate", "Capability", "CounterGroup",
    "CounterValue", "Policy", "Purpose", "Reading", "Resolution", "Target", "capabilities",
    "capability", "get", "gist", "resolve",
]
