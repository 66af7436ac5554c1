"""One run id for every rank of a job on every node (issue 32 item 1).

What a launcher or batch system gives every rank of one job alike, on every node, in this
order (the first found wins; the most specific launch before the batch job holding it):

1. ``COUNTERD_RUN_ID``: given by the user (``mpiexec -genv COUNTERD_RUN_ID=...``) or exported
   by ``counterd record -- mpiexec ...`` to the command it starts (launchers pass their
   environment on to every rank);
2. Slurm: ``SLURM_JOB_ID`` and ``SLURM_STEP_ID`` (one ``srun``, or one ``mpiexec`` whose
   proxies srun started), with ``SLURM_CLUSTER_NAME`` where set;
3. PMIx: ``PMIX_NAMESPACE`` (Open MPI 5 / PRRTE, Slurm's and any PMIx launcher's job);
4. Open MPI 4 (ORTE): ``OMPI_MCA_ess_base_jobid`` or ``OMPI_MCA_orte_ess_jobid``, with the
   job's head node URI (``OMPI_MCA_orte_hnp_uri``) where set;
5. MPICH's hydra: it exports no job-wide variable to the ranks (``PMI_RANK``, ``PMI_SIZE``,
   ``PMI_FD``, ``PMI_HOSTNAME``, ``MPI_LOCALRANKID`` differ per rank or per node), but every
   node's ``hydra_pmi_proxy`` is started with the same ``--control-port HOST:PORT`` (mpiexec's
   own) and ``--pgid``; the rank's ancestors are searched for that proxy. The pair names one
   mpiexec while it runs; a later mpiexec on the same host could be given the same port, so
   ``counterd record -- mpiexec`` (which exports a unique id) is the better way;
6. PBS: ``PBS_JOBID``; 7. LSF: ``LSB_JOBID`` (with ``LSB_JOBINDEX`` of an array element).
   Both name the batch job, not one launch within it: two mpiexecs of one batch job share it.

Launcher and batch ids are used only for MPI ranks (a launcher's rank variable is set:
:data:`counterd.data.env.MPI_RANK_VARS`); a plain program in a batch job keeps a per-process-tree
id. Where nothing shared exists, the id is node-local (:func:`counterd.markers.identity.
default_run_id`): ranks on other nodes get other ids, and ``counterd report`` says so.

Ids are readable where the source is short (``slurm-hpc1-1234.0``) and hashed otherwise
(``pmix-<12 hex>``); at most 128 printable characters. Pure, without heavy imports: the
recorder reads it on the way to its command's exec.
"""

from __future__ import annotations

import os

from counterd.data.env import ENV_RUN_ID, MPI_RANK_VARS

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    from collections.abc import Mapping

# Where a run id came from, as the report names it; "node" is the node-local fallback.
SOURCES = {
    "given": "COUNTERD_RUN_ID (given, or exported by counterd record)",
    "recorder": "counterd record's own id, exported to its command",
    "slurm": "Slurm's SLURM_JOB_ID.SLURM_STEP_ID",
    "pmix": "the PMIx namespace (PMIX_NAMESPACE)",
    "ompi": "Open MPI's job id (OMPI_MCA_ess_base_jobid)",
    "hydra": "MPICH hydra's mpiexec (its proxies' --control-port and --pgid)",
    "pbs": "PBS's PBS_JOBID",
    "lsf": "LSF's LSB_JOBID",
    "node": "node-local: no launcher or batch system variable shared by all ranks was found",
    "unknown": "not stated (records without their clock-domain line)",
}
JOB_WIDE = frozenset(SOURCES) - {"node", "unknown"}
MAX_RUN_ID_CHARS = 128
_MAX_ANCESTORS = 8  # a rank's ancestors searched for hydra's proxy (rank, shell, recorder...)


def _clean(value: str) -> str | None:
    value = value.strip()
    return value if value and len(value) <= MAX_RUN_ID_CHARS and value.isprintable() \
        and " " not in value else None


def _hashed(prefix: str, text: str) -> str:
    import hashlib  # here: it loads OpenSSL

    return f"{prefix}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


def _readable(prefix: str, text: str) -> str:
    """``prefix-text`` when ``text`` is short and safe, else hashed."""
    if len(text) <= 48 and all(c.isalnum() or c in "._-[]" for c in text):
        return f"{prefix}-{text}"
    return _hashed(prefix, text)


def hydra_control(pid: int | None = None) -> str | None:
    """``HOST:PORT/PGID`` of the hydra proxy among the ancestors of ``pid`` (this process),
    or None."""
    pid = os.getpid() if pid is None else pid
    for _ in range(_MAX_ANCESTORS):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{ppid}/cmdline", "rb") as f:
                argv = f.read(65536).split(b"\0")
        except (OSError, ValueError, IndexError):
            return None
        if argv and os.path.basename(argv[0]) == b"hydra_pmi_proxy":
            opts = dict(zip(argv[1::2], argv[2::2], strict=False))
            port, pgid = opts.get(b"--control-port"), opts.get(b"--pgid", b"0")
            if port is None:
                return None
            return f"{port.decode(errors='replace')}/{pgid.decode(errors='replace')}"
        if ppid <= 1:
            return None
        pid = ppid
    return None


def job_run_id(environ: Mapping[str, str] | None = None, *, rank_only: bool = True,
               hydra: bool = True) -> tuple[str, str] | None:
    """(run id, source) from what every rank of the job shares (the module's order), or None.

    ``rank_only``: the launcher and batch ids count only in an MPI rank (one of
    ``MPI_RANK_VARS`` set); ``COUNTERD_RUN_ID`` always. ``hydra``: look for hydra's proxy
    among this process's ancestors (tests turn it off)."""
    env = os.environ if environ is None else environ
    given = _clean(env.get(ENV_RUN_ID, ""))
    if given is not None:
        return given, "given"
    if rank_only and not any(var in env for var in MPI_RANK_VARS):
        return None
    job, step = _clean(env.get("SLURM_JOB_ID", "")), _clean(env.get("SLURM_STEP_ID", ""))
    if job is not None:
        cluster = _clean(env.get("SLURM_CLUSTER_NAME", ""))
        text = (f"{cluster}-" if cluster else "") + job + (f".{step}" if step else "")
        return _readable("slurm", text), "slurm"
    ns = _clean(env.get("PMIX_NAMESPACE", ""))
    if ns is not None:
        return _hashed("pmix", ns), "pmix"
    ompi = _clean(env.get("OMPI_MCA_ess_base_jobid", "") or env.get("OMPI_MCA_orte_ess_jobid", ""))
    if ompi is not None:
        return _hashed("ompi", ompi + "@" + env.get("OMPI_MCA_orte_hnp_uri", "")), "ompi"
    if hydra and ("PMI_RANK" in env or "HYDI_CONTROL_FD" in env):
        control = hydra_control()
        if control is not None:
            return _hashed("hydra", control), "hydra"
    pbs = _clean(env.get("PBS_JOBID", ""))
    if pbs is not None:
        return _readable("pbs", pbs), "pbs"
    lsf = _clean(env.get("LSB_JOBID", ""))
    if lsf is not None:
        index = env.get("LSB_JOBINDEX", "0").strip()
        return _readable("lsf", lsf + (f"[{index}]" if index not in ("", "0") else "")), "lsf"
    return None


_PREFIXES = ("slurm", "pmix", "ompi", "hydra", "pbs", "lsf")


def source_of(run_id: str) -> str:
    """Where a run id most likely came from, by its form, for runs whose source was not
    written down (the daemon's): a job-wide prefix of this module, the node-local forms of
    :func:`counterd.markers.identity.default_run_id` (12 hex digits, ``mpi-`` and 12), or
    "given" (a user's, or counterd record's)."""
    head, dash, tail = run_id.partition("-")
    if dash and head in _PREFIXES:
        return head
    hexdigits = set("0123456789abcdef")
    bare = tail if head == "mpi" and dash else run_id
    if len(bare) == 12 and set(bare) <= hexdigits:
        return "node"
    return "given"
