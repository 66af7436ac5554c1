"""One run id for every rank of a job on every node (issue 32 item 1): the launcher's and
batch system's variables in their order, and hydra's proxy among a rank's ancestors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from counterd.data.jobid import JOB_WIDE, SOURCES, hydra_control, job_run_id

ROOT = Path(__file__).resolve().parents[2]
RANK = {"PMI_RANK": "3"}


def jid(**env: str) -> tuple[str, str] | None:
    return job_run_id(env, hydra=False)


def test_each_source_in_turn() -> None:
    every = {**RANK, "COUNTERD_RUN_ID": "mine", "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0",
             "SLURM_CLUSTER_NAME": "hpc1", "PMIX_NAMESPACE": "prterun-h-99@1",
             "OMPI_MCA_ess_base_jobid": "5", "PBS_JOBID": "77.pbs", "LSB_JOBID": "88",
             "LSB_JOBINDEX": "2"}
    got = []
    for var in ("COUNTERD_RUN_ID", "SLURM_JOB_ID", "PMIX_NAMESPACE",
                "OMPI_MCA_ess_base_jobid", "PBS_JOBID", "LSB_JOBID"):
        got.append(jid(**every))
        del every[var]
    assert got[0] == ("mine", "given")
    assert got[1] == ("slurm-hpc1-1234.0", "slurm")
    assert got[2][1] == "pmix" and got[2][0].startswith("pmix-")  # type: ignore[index]
    assert got[3][1] == "ompi"  # type: ignore[index]
    assert got[4] == ("pbs-77.pbs", "pbs")
    assert got[5] == ("lsf-88[2]", "lsf")
    assert jid(**every) is None
    assert {s for _, s in got if s} <= JOB_WIDE and "node" not in JOB_WIDE


def test_the_same_job_gives_the_same_id_on_every_node() -> None:
    a = jid(PMIX_RANK="0", PMIX_NAMESPACE="prterun-h-99@1", HOSTNAME="n1")
    b = jid(PMIX_RANK="7", PMIX_NAMESPACE="prterun-h-99@1", HOSTNAME="n2")
    other = jid(PMIX_RANK="0", PMIX_NAMESPACE="prterun-h-100@1")
    assert a == b and a != other


def test_launcher_ids_count_only_in_an_mpi_rank() -> None:
    assert jid(SLURM_JOB_ID="1234") is None  # a plain program of a batch job
    assert jid(SLURM_JOB_ID="1234", SLURM_PROCID="0") == ("slurm-1234", "slurm")
    assert job_run_id({"SLURM_JOB_ID": "1234"}, rank_only=False, hydra=False) == \
        ("slurm-1234", "slurm")
    assert jid(COUNTERD_RUN_ID="x") == ("x", "given")  # always


@pytest.mark.parametrize("bad", ["", "  ", "a b", "x" * 129, "a\x1bb"])
def test_an_unusable_value_falls_through_to_the_next(bad: str) -> None:
    assert jid(**RANK, COUNTERD_RUN_ID=bad, PBS_JOBID="9") == ("pbs-9", "pbs")


def test_a_long_or_odd_batch_id_is_hashed() -> None:
    run_id, _ = jid(**RANK, PBS_JOBID="1" * 60)  # type: ignore[misc]
    assert run_id.startswith("pbs-") and len(run_id) == 16


def test_every_source_is_described() -> None:
    assert set(SOURCES) >= JOB_WIDE | {"node", "unknown"}


def test_hydras_proxy_is_found_among_the_ancestors() -> None:
    probe = "from counterd.data.jobid import hydra_control; print(hydra_control())"
    # a shell named hydra_pmi_proxy with the proxy's options, running python as its child
    proc = subprocess.run(["bash", "-c", 'exec -a hydra_pmi_proxy bash -c "$0; true" '
                           '--control-port vm:4242 --pgid 3',
                           f"{sys.executable} -c '{probe}'"],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.strip() == "vm:4242/3", proc.stderr
    assert hydra_control() is None  # pytest has no hydra proxy above it


@pytest.mark.parametrize("run_id,source", [
    ("slurm-1234.0", "slurm"), ("hydra-0123456789ab", "hydra"), ("pbs-9", "pbs"),
    ("0123456789ab", "node"), ("mpi-0123456789ab", "node"), ("my-run", "given"),
    ("20261127T013755-611099", "given")])
def test_a_run_ids_source_is_known_by_its_form(run_id: str, source: str) -> None:
    from counterd.data.jobid import source_of

    assert source_of(run_id) == source
