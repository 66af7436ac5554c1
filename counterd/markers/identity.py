"""Who is marking: this process's id (kept across fork), its CPU, its run id and its rank.

Rank: ``set_rank()`` wins; else ``COUNTERD_RANK``; else an MPI launcher's rank variable
(Open MPI, MPICH/PMI, PMIx, MVAPICH, Slurm); else a multiprocessing worker's identity (1-based,
the parent being 0); else 0.

Importing this module changes nothing in the environment: the run id is derived where it is
needed (:func:`default_run_id`) and exported by the first recorder a process creates.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import Any

from counterd.data.env import ENV_RANK, MPI_RANK_VARS

# What every record of a process shares, as its sinks declare it (a daemon CONTEXT, a spool's):
# run id, pid, host, backend label, the calibrated cost of one marker pair in ns (or None).
Ctx = tuple[str, int, str, str, int | None]

# This process's id, kept current across fork: os.getpid() is a system call and the markers'
# hot path asked for it several times per superstep (issue 3: marker cost).
pid = os.getpid()


def _after_fork_in_child() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _getcpu_function() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):  # not glibc: CPU stays unknown (-1)
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = []
    return fn


_sched_getcpu = _getcpu_function()


def current_cpu() -> int:
    return int(_sched_getcpu()) if _sched_getcpu is not None else -1


def _start_time(of_pid: int) -> str:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22), "0" if
    unreadable: with the pid it names one process, even after the pid is reused."""
    try:
        return Path(f"/proc/{of_pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "0"


def default_run_id() -> str:
    """The run id of a program not started by ``counterd record``: one per process tree.

    The id is derived from the process that roots the tree, so every process of one program
    finds the same id without anybody exporting it first:

    * MPI ranks are started separately by the launcher, each with its own environment; ranks
      on one node share the launcher's proxy as parent, so their id derives from that parent;
    * a multiprocessing worker (fork or spawn) derives it from its parent process;
    * any other process derives it from itself.

    The id hashes the host, the root's pid and its start time. (The first recorder of a process
    also exports it in ``COUNTERD_RUN_ID``, so subprocesses started after it inherit it.)

    An MPI rank whose launcher or batch system gives every rank something alike takes the
    job-wide id of :func:`counterd.data.jobid.job_run_id` instead, the same on every node; the id
    derived here is node-local (:func:`run_id_source` says which).
    """
    import hashlib  # here: it loads OpenSSL (2-3 ms), and a recorded run is given its id

    from counterd.data.jobid import job_run_id

    host = os.uname().nodename  # gethostname(2), without loading socket
    if any(var in os.environ for var in MPI_RANK_VARS):
        job = job_run_id()
        if job is not None:
            return job[0]
        ppid = os.getppid()
        digest = hashlib.sha1(f"{host}:{ppid}:{_start_time(ppid)}".encode()).hexdigest()
        return "mpi-" + digest[:12]
    mp = _multiprocessing()
    parent = mp.parent_process() if mp is not None else None
    root = parent.pid if parent is not None and parent.pid is not None else os.getpid()
    return hashlib.sha1(f"{host}:{root}:{_start_time(root)}".encode()).hexdigest()[:12]


def run_id_source(run_id: str) -> str:
    """Where this process's ``run_id`` came from: a key of :data:`counterd.data.jobid.SOURCES`
    ("node" for the node-local id of :func:`default_run_id`)."""
    from counterd.data.jobid import job_run_id

    job = job_run_id()
    if job is not None and job[0] == run_id:
        return job[1]
    return "node" if run_id == default_run_id() else "given"


def env_rank() -> int | None:
    """The rank ``COUNTERD_RANK`` or an MPI launcher's variable gives, or None."""
    for var in (ENV_RANK, *MPI_RANK_VARS):
        value = os.environ.get(var)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def auto_rank() -> int:
    """The rank from the environment (see the module docstring), without ``set_rank``."""
    rank = env_rank()
    if rank is not None:
        return rank
    mp = _multiprocessing()
    identity = getattr(mp.current_process(), "_identity", ()) if mp is not None else ()
    return int(identity[0]) if identity else 0


def _multiprocessing() -> Any:
    """The multiprocessing module if this program has loaded it, else None, without loading
    it (5 ms, on the way to a program's first superstep): a worker of it always has (spawn's
    bootstrap imports it before the program's code; a forked worker inherits its parent's
    modules), so a program without it is no worker and its parent is nobody's pool."""
    return sys.modules.get("multiprocessing")
