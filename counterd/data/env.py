"""Environment variables shared by the marker API, ``counterd record`` and the backends.

One home for the names, so that the program side (:mod:`counterd.markers`) and what starts or
counts programs (:mod:`counterd.commands.recording`, :mod:`counterd.backends.callgrind`) cannot
drift.
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
ENV_BATCH_JOB = "COUNTERD_BATCH_JOB"  # the batch job id, where no batch system's variable says it
# The batch systems' job ids, in the order looked at (Slurm, PBS/Torque/OpenPBS, LSF): the
# batch_job label on /metrics (counterd/daemon/metrics_state.py)
BATCH_JOB_VARS = (ENV_BATCH_JOB, "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID")
ENV_FLUSH_TIMEOUT = "COUNTERD_FLUSH_TIMEOUT"  # seconds to wait for acks at exit (default 10)
ENV_SPILL = "COUNTERD_SPILL"  # a directory for records the daemon did not take (0700)
ENV_SAMPLE = "COUNTERD_SAMPLE"  # "<duration>:<k>": read counters of 1 in k shorter supersteps
ENV_NATIVE = "COUNTERD_NATIVE"  # "0": markers and spool in Python even where compiled
# "import": importing counterd prepares the process's markers (counterd.init()), so that none of
# their set-up lands in the program's first superstep; `counterd record` sets it for its command.
ENV_INIT = "COUNTERD_INIT"
# COUNTERD_MACHINE (a machine file) is named in counterd.machine.files.ENV_MACHINE: the machine is a
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


def batch_job(environ: dict[str, str] | None = None) -> str | None:
    """The batch job this process runs in: the first of :data:`BATCH_JOB_VARS` set, an LSF
    array element as ``ID[INDEX]`` (as bjobs shows it); None outside a batch job. At most 64
    printable characters (the daemon drops a longer one)."""
    env = os.environ if environ is None else environ
    for var in BATCH_JOB_VARS:
        value = env.get(var, "").strip()
        if value:
            index = env.get("LSB_JOBINDEX", "0") if var == "LSB_JOBID" else "0"
            if index not in ("", "0"):
                value = f"{value}[{index}]"
            return value[:64] if value[:64].isprintable() else None
    return None
