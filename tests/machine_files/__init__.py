"""Machine files of three hosts the suite must pass on (issue 35, item 5), and views of them.

* ``amd-2cpu-32m``: a 2-CPU AMD EPYC KVM guest, L3 32 MB (the first development VM);
* ``intel-2cpu-300m``: a 2-CPU Intel KVM guest (family 6 model 207) whose sysfs reports an L3
  of 300 MB, 20-way (the host on which ``make test`` failed);
* ``xeon-2s-64cpu``: a 2-socket node of 64 CPUs in two NUMA nodes, an L3 of 48 MB per socket,
  8 memory channels per socket (format version 2: ``[memory]``; 16 banks).

Tests whose answer depends on the geometry take the ``described_machine`` fixture
(tests/conftest.py), which runs them once per file with the file as this process's machine
(:func:`counterd.machine.using`, and ``COUNTERD_MACHINE`` for the processes they start). The
whole suite runs as if on one of them with ``COUNTERD_MACHINE=tests/machine_files/<name>.toml
make test`` (``make test-machines`` runs it under each).

A machine file describes a node; a test can only *run* processes on the CPUs this host gives
it. :func:`planning_machine` is the node as the catalogue and the plans see it (all its CPUs),
for tests that plan without running; :func:`running_machine` is the file's geometry on this
host's CPUs, for tests that run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from counterd import machine
from counterd.machine.description import Machine
from counterd.machine.files import load_file

if TYPE_CHECKING:  # microbench (and numpy) load when a test asks for its view
    from counterd.machine.views import NodeView

DIR = Path(__file__).resolve().parent
NAMES = ("amd-2cpu-32m", "intel-2cpu-300m", "xeon-2s-64cpu")


def path(name: str) -> Path:
    return DIR / f"{name}.toml"


def load(name: str) -> Machine:
    """The machine of file ``name`` (every key is given: nothing comes from this host)."""
    return load_file(path(name))


def planning_machine(m: Machine) -> NodeView:
    """The node of ``m`` as microbench plans for it: all its CPUs, in the order its NUMA
    layout pins ranks (:meth:`counterd.machine.memory.MemoryLayout.spread`)."""
    from counterd.machine.views import NodeView

    return NodeView.of(m, m.memory.spread(m.memory.cpus), name=m.hostname)


def running_machine(m: Machine) -> NodeView:
    """``m``'s geometry, bank map and page size on the CPUs this process may run on."""
    from microbench import patterns

    with machine.using(m):
        return patterns.host_machine()


__all__ = ["DIR", "NAMES", "load", "path", "planning_machine", "running_machine"]
