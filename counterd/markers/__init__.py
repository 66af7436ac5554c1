"""What runs inside the user's program: the superstep markers and where their records go.

The public API (re-exported by :mod:`counterd`): ``superstep``, ``begin``, ``end``,
``set_rank``, ``configure``, ``records``. Importing this package has no side effects.
"""

from counterd.markers.recorder import begin, configure, end, records, set_rank, superstep

__all__ = ["begin", "configure", "end", "records", "set_rank", "superstep"]
