"""What runs inside the user's program: the superstep markers and where their records go.

From the top down (each module imports only the ones below it):

* :mod:`~counterd.markers.api`: the module-level API, re-exported by :mod:`counterd`;
* :mod:`~counterd.markers.recorder`: the per-process recorder and its open supersteps;
* :mod:`~counterd.markers.native`: the compiled hot path's lanes;
* :mod:`~counterd.markers.sinks`: where records go (memory, a spool file, the daemon's
  socket, the spill file), chosen once by ``make_sink``, all behind one ``Sink`` interface;
* :mod:`~counterd.markers.step`: an open superstep and how its record is built;
* :mod:`~counterd.markers.identity`, :mod:`~counterd.markers.sampling`: this process's id,
  CPU, run id and rank; the sampled supersteps' estimates.

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
