"""The machine counterd counts and simulates on, as data: one home for it.

:class:`~counterd.machine.description.Machine` is the description every part uses: its cache
levels (size, ways, line, the CPUs sharing each), the L1 instruction cache where known, the DTLB
where known, the page size, the memory layout (NUMA nodes and their CPUs, memory channels,
interleave; each read, declared or assumed) with the bank map derived from it, and the host
fingerprint (hostname, CPU model, CPUs online, caches spec). :func:`current` is this process's:
read from sysfs and procfs once (:func:`counterd.machine.sysfs.read`, whose roots and file
reader are parameters for tests) and cached, or loaded from a machine file
(:func:`counterd.machine.files.load_file`) named by ``COUNTERD_MACHINE`` or by a CLI's
``--machine`` (:func:`using`). The sim backend, the callgrind backend, ``counterd probe``,
``microbench`` and the predictor's host fingerprint all take their geometry from it; nothing
else reads ``/sys/devices/system/cpu/*/cache`` or ``/sys/devices/system/node``.

One module for each part:

- :mod:`counterd.machine.geometry`: sizes and CPU lists as written, the cache levels and their
  set index, :class:`~counterd.machine.geometry.Geometry` (the simulator's view of a machine:
  data-side levels, DTLB, page size), the seed's SGI Power Challenge and the geometry used
  when sysfs is unreadable;
- :mod:`counterd.machine.memory`: :class:`~counterd.machine.memory.BankMap` (the memory bank
  of an address) and the memory layout it derives from (whose
  :meth:`~counterd.machine.memory.MemoryLayout.spread` is where a program's ranks are pinned);
- :mod:`counterd.machine.description`: :class:`~counterd.machine.description.Machine`;
- :mod:`counterd.machine.sysfs`: this host read from sysfs and procfs, once per process;
- :mod:`counterd.machine.files`: machine files (TOML; their format is described there);
- :mod:`counterd.machine.views`: views of the record where a consumer needs a narrower thing:
  :class:`~counterd.machine.views.NodeView` (the node a run of microbench patterns uses, and
  the one writer of a results file's machine part), and the ``geometry`` / ``bank_map``
  sections of results files and machine profiles read back typed
  (:class:`~counterd.machine.views.GeometryTable`, :class:`~counterd.machine.views.BankTable`);
- this package: which machine this process uses (:func:`current`, :func:`using`,
  :func:`reset`).

The simulator that runs address streams on them is :mod:`counterd.sim`. The package is data
only: it imports no service.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from counterd.machine.description import Machine
from counterd.machine.files import ENV_MACHINE, load_file
from counterd.machine.sysfs import forget_host, host

# --------------------------------------------------------------------------------------------
# This process's machine

_lock = threading.RLock()
_files: dict[str, Machine] = {}
_overrides: list[Machine] = []


def current() -> Machine:
    """This process's machine: the one :func:`using` set, else the file ``COUNTERD_MACHINE``
    names, else :func:`host`. Cached; raises BadInput for a bad machine file."""
    with _lock:
        if _overrides:
            return _overrides[-1]
        path = os.environ.get(ENV_MACHINE)
        if not path:
            return host()
        m = _files.get(path)
        if m is None:
            m = _files[path] = load_file(path)
        return m


@contextlib.contextmanager
def using(machine: Machine | str | Path | None) -> Iterator[Machine]:
    """Make ``machine`` (or the machine file at that path) this process's :func:`current`
    inside the block (the CLIs' ``--machine``). ``None``: :func:`current` as it is."""
    m = current() if machine is None else (
        machine if isinstance(machine, Machine) else load_file(machine))
    with _lock:
        _overrides.append(m)
    try:
        yield m
    finally:
        with _lock:
            _overrides.remove(m)


def reset() -> None:
    """Forget the cached machines (tests; a process whose host changed under it)."""
    forget_host()
    with _lock:
        _files.clear()
