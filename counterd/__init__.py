"""counterd: per-superstep memory-hierarchy counters for bulk-synchronous programs.

Public API: ``superstep`` (the marker context manager), ``begin``/``end``, ``set_rank`` (an
SPMD program's processor id), ``configure`` and ``records``; they live in
:mod:`counterd.markers`. Counter sources live in :mod:`counterd.backends`.

Importing ``counterd`` changes nothing in the process or its environment, and loads only the
data modules (the recorder, the run id and the at-exit handler come with the first marker): the
predictor imports ``counterd.records`` and must not pull in the marker machinery with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# Imported first, on purpose: importing a submodule sets it as an attribute of the package, and
# the API function ``records`` defined below must be what ``counterd.records`` names.
from counterd import records as _record_types  # noqa: F401

if TYPE_CHECKING:
    from counterd.markers import begin, configure, end, set_rank, superstep

__all__ = ["begin", "configure", "end", "records", "set_rank", "superstep"]


def records() -> list[_record_types.SuperstepRecord]:
    """Records kept in memory by this process (empty when they go to a spool or the daemon)."""
    from counterd.markers.api import records as _records

    return _records()


def __getattr__(name: str) -> Any:  # PEP 562: the marker API is loaded on first use
    if name in ("begin", "configure", "end", "set_rank", "superstep"):
        from counterd import markers

        value = getattr(markers, name)
        globals()[name] = value  # found directly from now on: no call per marker
        return value
    raise AttributeError(f"module 'counterd' has no attribute {name!r}")
