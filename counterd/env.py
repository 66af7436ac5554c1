"""Environment variables shared by the marker API, ``counterd record`` and the backends.

One home for the names, so that the program side (:mod:`counterd.markers`) and what starts or
counts programs (:mod:`counterd.recording`, :mod:`counterd.backends.callgrind`) cannot drift.
"""

from __future__ import annotations

ENV_RUN_ID = "COUNTERD_RUN_ID"
ENV_SPOOL = "COUNTERD_SPOOL"  # a directory: each process writes its markers to a file there
ENV_BACKEND = "COUNTERD_BACKEND"
ENV_EVENTS = "COUNTERD_EVENTS"  # comma-separated canonical counters
ENV_RANK = "COUNTERD_RANK"
ENV_SOCKET = "COUNTERD_SOCKET"  # the daemon's socket; "off" disables the daemon
ENV_JOB = "COUNTERD_JOB"
ENV_FLUSH_TIMEOUT = "COUNTERD_FLUSH_TIMEOUT"  # seconds to wait for acks at exit (default 10)
ENV_SPILL = "COUNTERD_SPILL"  # a directory for records the daemon did not take (0700)
ENV_SAMPLE = "COUNTERD_SAMPLE"  # "<duration>:<k>": read counters of 1 in k shorter supersteps
ENV_NATIVE = "COUNTERD_NATIVE"  # "0": markers and spool in Python even where hotpath.c is built
# COUNTERD_MACHINE (a machine file) is named in counterd.machine.ENV_MACHINE: the machine is a
# data module the predictor loads, and this module is not one of those.

# The rank variables MPI launchers set (Open MPI, MPICH/PMI, PMIx, MVAPICH, Slurm).
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
                 "SLURM_PROCID")
