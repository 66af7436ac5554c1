"""counterd: per-superstep memory-hierarchy counters for bulk-synchronous programs.

Public API: ``superstep`` (the marker context manager) and ``set_rank`` (an SPMD program's
processor id); counter sources live in :mod:`counterd.backends`.
"""
