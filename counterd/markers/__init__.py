"""What runs inside the user's program: the superstep markers and where their records go.

* :mod:`~counterd.markers.identity`: this process's id, CPU, run id and rank;
* :mod:`~counterd.markers.sinks`: records kept in memory or appended to a spool file;
* :mod:`~counterd.markers.client`: the daemon client (records sent over counterd's socket);
* :mod:`~counterd.markers.recorder`: the per-process recorder and its open supersteps;
* :mod:`~counterd.markers.api`: the module-level API, re-exported by :mod:`counterd`.

Importing this package has no side effects.
"""

from counterd.markers.api import (
    begin,
    configure,
    end,
    feed,
    init,
    records,
    set_rank,
    superstep,
)

__all__ = ["begin", "configure", "end", "feed", "init", "records", "set_rank", "superstep"]
