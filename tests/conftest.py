"""Fixtures of the whole suite; and the machine it runs as.

The suite runs as if on the machine of a machine file when ``COUNTERD_MACHINE`` names one (the
variable every part of counterd honours, :mod:`counterd.machine`): e.g.
``COUNTERD_MACHINE=tests/machine_files/intel-2cpu-300m.toml make test``. A relative path is
made absolute here, for the processes tests start in other directories, and a bad file stops
the session before any test with the file's own message. Tests of how the host is *detected*
clear the variable themselves (tests/counterd/test_machine.py).

Tests whose answers depend on the geometry take ``described_machine``: they run once per
machine file of tests/machine_files (two 2-CPU guests with a 32 MB and a 300 MB L3, a 64-CPU
2-socket node), whatever the host and ``COUNTERD_MACHINE``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from counterd import machine
from counterd.data.errors import BadInput
from counterd.machine.description import Machine
from counterd.machine.files import ENV_MACHINE
from counterd.markers import api as superstep
from tests import _postgres, machine_files
from tests._postgres import Cluster, truncate


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(ENV_MACHINE)
    if not path:
        return
    os.environ[ENV_MACHINE] = path = os.path.abspath(path)
    machine.reset()
    try:
        machine.current()
    except BadInput as exc:
        raise pytest.UsageError(f"{ENV_MACHINE}: {exc}") from None


def pytest_report_header(config: pytest.Config) -> str:
    m = machine.current()
    where = f"machine file {m.file}" if m.file else "this host"
    return (f"machine: {where}: {m.cpu_model}, {m.cpus_online} CPUs, "
            f"{m.caches_spec or 'caches unknown'} (CPUs to run on: "
            f"{len(os.sched_getaffinity(0))})")


@pytest.fixture(params=machine_files.NAMES)
def described_machine(request: pytest.FixtureRequest,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[Machine]:
    """Each machine file of tests/machine_files in turn, as this process's machine and, through
    ``COUNTERD_MACHINE``, the machine of the processes the test starts."""
    name: str = request.param
    m = machine_files.load(name)
    monkeypatch.setenv(ENV_MACHINE, str(machine_files.path(name)))
    with machine.using(m):
        yield m


@pytest.fixture(scope="session")
def _package_bytecode() -> None:
    """The packages' bytecode, written once, as the Makefile's ``bytecode`` target writes it
    for ``make test``: where PYTHONDONTWRITEBYTECODE is set (this host, the CI hosts) and the
    suite is run by pytest directly, every Python started under valgrind compiled each
    counterd module it imports from source, at a hundred times the native cost (the counted
    run of tests/counterd/test_callgrind.py's signal test reached its second superstep after
    32 s instead of 17 s). Up to date, it costs a few ms."""
    import compileall
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for package in ("counterd", "predictor", "microbench"):
        compileall.compile_dir(root / package, quiet=1)


@pytest.fixture(autouse=True)
def _bytecode_under_valgrind(request: pytest.FixtureRequest) -> None:
    """Tests that run commands under valgrind (marked ``callgrind``) find the packages'
    bytecode written (:func:`_package_bytecode`)."""
    if request.node.get_closest_marker("callgrind") is not None:
        request.getfixturevalue("_package_bytecode")


@pytest.fixture
def one_cpu() -> Iterator[int]:
    """This process on one CPU of its affinity (restored after); yields that CPU. The
    scheduler may move a thread at any time, and a move between two markers rightly flags
    the record "migrated": a test asserting a record's exact flags pins first."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    yield min(before)
    os.sched_setaffinity(0, before)


@pytest.fixture(autouse=True)
def _fresh_recorder() -> Iterator[None]:
    """Each test starts without a process-wide marker recorder."""
    superstep._recorder = None
    yield
    superstep._recorder = None


@pytest.fixture(autouse=True, scope="session")
def _private_plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """counterd record keeps its perf plan (counterd.launch) under $XDG_RUNTIME_DIR or
    $XDG_CACHE_HOME: the tests' own directory, never the user's."""
    saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME")}
    os.environ.pop("XDG_RUNTIME_DIR", None)
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(autouse=True, scope="session")
def _outside_a_batch_job() -> Iterator[None]:
    """The suite runs as outside a batch job even under Slurm, PBS or LSF (CI in an
    allocation): their job ids would label every series (batch_job, counterd.data.env.batch_job)
    of the programs the tests start. A test that wants one sets it."""
    from counterd.data.env import BATCH_JOB_VARS

    saved = {k: os.environ.pop(k) for k in BATCH_JOB_VARS if k in os.environ}
    yield
    os.environ.update(saved)


# A throwaway PostgreSQL, started once per module that asks for it (the central store's tests
# and its hostile tests); `central` empties its tables for each test.

@pytest.fixture(scope="module")
def pg() -> Iterator[Cluster]:
    with _postgres.cluster() as c:
        yield _postgres.migrated(c)


@pytest.fixture
def central(pg: Cluster) -> Cluster:
    truncate(pg)
    return pg
