"""The cache simulator: count what a known address stream does to a cache hierarchy.

Seed 004 needs per-bank counts LM(b) (L2 misses served by bank b) and WB(b) (writebacks to
bank b) for its F3 and DXBSP functions (seed 004 section 4.2); on real hardware they "must be
inferred ... from code inspection", which is what this package does.

* :mod:`counterd.sim.streams`: the address streams it runs;
* :mod:`counterd.sim.engines`: one processor's model, in Python (the specification) and C;
* :mod:`counterd.sim.coherence`: one processor, several independent ones, or a coherent
  system of several, and :func:`simulate`;
* :mod:`counterd.sim.counts`: what it counts.

The machine it simulates is described in :mod:`counterd.machine`; :class:`Geometry`,
:class:`CacheLevel` and :class:`BankMap`, which :func:`simulate` and the simulators take, are
re-exported here. The ``sim`` backend (counterd.backends.sim) adapts this package to the
Backend interface.
"""

from __future__ import annotations

# typing.TYPE_CHECKING without importing typing; mypy treats the name alike.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from counterd.machine.geometry import CacheLevel, Geometry
    from counterd.machine.memory import BankMap
    from counterd.sim.coherence import (
        DEFAULT_CHUNK,
        CacheSim,
        CoherentSim,
        PhaseStreams,
        simulate,
    )
    from counterd.sim.counts import (
        BankCounts,
        EngineName,
        LevelCounts,
        ProcessorCounts,
        SimResult,
        canonical_values,
    )
    from counterd.sim.engines import native_status
    from counterd.sim.sampling import SetSampling
    from counterd.sim.streams import KIND_CODES, AddressStream, Kind, Stream, StridedStream

# Each name is loaded from its module on first use (PEP 562): a program that only feeds its
# supersteps' address streams (``from counterd.sim import StridedStream``) loads the streams,
# not the simulators and the machine description, which cost every process of it about
# 65 M instructions more (counted under Callgrind, where they run 50-100x slower).
_MODULE_OF = {
    **dict.fromkeys(("CacheLevel", "Geometry"), "counterd.machine.geometry"),
    **dict.fromkeys(("BankMap",), "counterd.machine.memory"),
    **dict.fromkeys(("DEFAULT_CHUNK", "CacheSim", "CoherentSim", "PhaseStreams", "simulate"),
                    "counterd.sim.coherence"),
    **dict.fromkeys(("BankCounts", "EngineName", "LevelCounts", "ProcessorCounts", "SimResult",
                     "canonical_values"), "counterd.sim.counts"),
    **dict.fromkeys(("native_status",), "counterd.sim.engines"),
    **dict.fromkeys(("SetSampling",), "counterd.sim.sampling"),
    **dict.fromkeys(("KIND_CODES", "AddressStream", "Kind", "Stream", "StridedStream"),
                    "counterd.sim.streams"),
}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'counterd.sim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_CHUNK", "KIND_CODES", "AddressStream", "BankCounts", "BankMap", "CacheLevel",
    "CacheSim", "CoherentSim", "EngineName", "Geometry", "Kind", "LevelCounts", "PhaseStreams",
    "ProcessorCounts", "SetSampling", "SimResult", "Stream", "StridedStream", "canonical_values",
    "native_status", "simulate",
]
