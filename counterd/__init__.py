"""counterd: per-superstep memory-hierarchy counters for bulk-synchronous programs.

Public API: ``superstep`` (the marker context manager) and ``set_rank`` (an SPMD program's
processor id); counter sources live in :mod:`counterd.backends`.
"""

from counterd.markers import begin, configure, end, records, set_rank, superstep

__all__ = ["begin", "configure", "end", "records", "set_rank", "superstep"]
