"""counterd: per-superstep memory-hierarchy counters for bulk-synchronous programs.

Public API: ``superstep`` (the marker context manager), ``begin``/``end``, ``set_rank`` (an
SPMD program's processor id), ``init`` (set the markers up before the first barrier), ``feed``
(an address stream run between supersteps, for the ``sim`` backend),
``configure`` and ``records``; they live in :mod:`counterd.markers`. Counter sources live in
:mod:`counterd.backends`.

Importing ``counterd`` changes nothing in the process or its environment, and loads nothing
else: the recorder, the run id and the at-exit handler come with ``init()`` or the first
marker, the data modules with their first user (``counterd record`` reaches its command's exec
without them). The one exception is asked for: with ``COUNTERD_INIT=import`` (which
``counterd record`` sets for its command) importing counterd calls ``init()``, so that every
process of a recorded program, forked, spawned or started by an MPI launcher, is set up before
its first barrier.
"""

from __future__ import annotations

import sys

# typing.TYPE_CHECKING without importing typing (2-10 ms, on the way to a recorded command's
# exec); mypy treats the name alike.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

    from counterd.data.records import SuperstepRecord
    from counterd.markers import begin, configure, end, feed, init, set_rank, superstep

__all__ = ["begin", "configure", "end", "feed", "init", "records", "set_rank", "superstep"]


def records() -> list[SuperstepRecord]:
    """Records kept in memory by this process (empty when they go to a spool or the daemon)."""
    from counterd.markers.api import records as _records

    return _records()


_MARKER_NAMES = ("begin", "configure", "end", "feed", "init", "set_rank", "superstep")


def _bind_markers() -> None:
    """The marker API bound in this module's namespace: found directly from now on, with no
    call per marker. All of it at once, when any of it is first used (``counterd.init()``, or
    the set-up at import), so that a process's first ``counterd.superstep`` is not the one
    that pays this function and the import system's look-up (15-35 us, after its barrier)."""
    from counterd import markers

    g = globals()
    for name in _MARKER_NAMES:
        g[name] = getattr(markers, name)


def __getattr__(name: str) -> Any:  # PEP 562: the marker API is loaded on first use
    if name in _MARKER_NAMES:
        _bind_markers()
        return globals()[name]
    raise AttributeError(f"module 'counterd' has no attribute {name!r}")


def _init_at_import() -> None:
    """``COUNTERD_INIT=import``: the markers set up now (:func:`counterd.init`). A failure here
    never stops the program's import: its first superstep sets up again and its records say
    why (a marker never raises for its counters)."""
    from counterd.data.errors import CounterdError

    _bind_markers()
    try:
        init()
    except (CounterdError, OSError) as exc:
        print(f"counterd: could not set up the markers at import ({exc}); the first "
              "superstep of this process sets them up", file=sys.stderr)


if __import__("os").environ.get("COUNTERD_INIT") == "import":  # counterd.data.env.ENV_INIT
    _init_at_import()
