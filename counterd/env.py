"""Environment variables shared by the marker API, ``counterd record`` and the backends.

One home for the names, so that the program side (:mod:`counterd.markers`) and what starts or
counts programs (:mod:`counterd.recording`, :mod:`counterd.backends.callgrind`) cannot drift.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    from pathlib import Path

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
# "import": importing counterd prepares the process's markers (counterd.init()), so that none of
# their set-up lands in the program's first superstep; `counterd record` sets it for its command.
ENV_INIT = "COUNTERD_INIT"
# COUNTERD_MACHINE (a machine file) is named in counterd.machine.ENV_MACHINE: the machine is a
# data module the predictor loads, and this module is not one of those.

# The rank variables MPI launchers set (Open MPI, MPICH/PMI, PMIx, MVAPICH, Slurm).
MPI_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK",
                 "SLURM_PROCID")


# Where the daemon's socket and store are by default (root: system paths; else the user's
# XDG directories): here, not in counterd.daemon.config, as a marked program looks for the
# socket before its first superstep and the daemon's configuration module loads much more.
# pathlib is loaded by the functions: `counterd record` reads this module on the way to the
# command's exec, where pathlib (and re) are not (tests/counterd/test_launch.py).

def runtime_dir() -> Path:
    from pathlib import Path

    if os.geteuid() == 0:
        return Path("/run")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    return Path(xdg) if xdg else Path(f"/tmp/counterd-{os.geteuid()}")


def state_dir() -> Path:
    from pathlib import Path

    if os.geteuid() == 0:
        return Path("/var/lib")
    xdg = os.environ.get("XDG_STATE_HOME")
    return Path(xdg) if xdg else Path.home() / ".local" / "state"


def default_socket_path() -> Path:
    return runtime_dir() / "counterd" / "counterd.sock"


def default_store_path() -> Path:
    return state_dir() / "counterd" / "counterd.db"
