"""Simulated counters for a whole command under Callgrind (DESIGN.md section 4, backend
``callgrind``): for pilot runs of arbitrary programs on hosts without a PMU.

The command runs under ``valgrind --tool=callgrind --cache-sim=yes --simulate-wb=yes`` with the
host's cache geometry given explicitly (``--I1``/``--D1``/``--LL``, from the machine
description, :mod:`counterd.machine`: sysfs or a machine file), and with
``--dump-before=counterd_superstep_boundary`` so that every superstep begin and end cuts one
dump (Callgrind manual, sections 6.2.1 "Multiple profiling dumps from one program run" and
6.3.1 "Dump creation options"). Every value produced here is ``Source.SIMULATED``; time is
never taken from a run under valgrind (it runs 50-100x slower): timed and counted runs are
separate runs of the same input.

Verified with valgrind 3.19 on this host (python 3.11, x86-64), and relied on below:

* **Dump files.** With ``--callgrind-out-file=DIR/callgrind.out.%p`` a process that makes N
  boundary calls leaves ``callgrind.out.<pid>.1`` ... ``callgrind.out.<pid>.N`` (the dump
  closed by the k-th call: header ``part: k``, ``desc: Trigger: --dump-before=<symbol>``)
  and, if it exits normally, the final dump ``callgrind.out.<pid>`` with no suffix
  (``part: N+1``, ``desc: Trigger: Program termination``). A process killed by a signal leaves
  no final dump. Dump k covers the costs from the (k-1)-th call (including the boundary
  function itself, three instructions) to the k-th; so with begin/end pairs the dump closed by
  a superstep's END call is that superstep, plus the return path from the begin call and the
  call path into the end call (through ctypes on this host: about 1,600 loads, 870 stores and
  5,300 instructions, measured with an empty superstep).
* **Processes.** A forked child (``os.fork``, ``multiprocessing`` with fork) is followed
  without any option, with its own pid in the file names and its part numbers restarting at 1;
  its first dump holds the parent's costs up to the fork as well as its own (section 6.2.5
  "Forking Programs": the child inherits the parent's costs; measured on 3.19: a parent that
  ran 573 M instructions, then forked a child that exited at once, left a child dump of
  566 M). Per-superstep counts are unaffected (each superstep's dump starts at a boundary
  call in that process); :attr:`CountedRun.whole`, the sum over every dump of every
  process, counts the parent's history before each fork once more per forked child (known,
  not yet corrected). Exec'd children (``subprocess``,
  ``multiprocessing`` with spawn, its resource tracker) need ``--trace-children=yes``; they
  keep the pid of the process that forked them and the pre-exec instance writes no file.
  A helper that outlives the command (the resource tracker ends when its last user does)
  writes its dump after it: a run waits up to ``run.SESSION_GRACE_S`` (3 s) for the processes
  left in the command's session before it reads the dumps; one still running after that has
  its dump, if any, reported unreadable, and never fails the run.
  Threads of one process share its dumps: a dump closed by one thread's call holds every
  thread's costs since the previous call (use one process per processor under callgrind).
* **Counting from the first superstep** (``from_first_superstep``, what ``counterd record``
  does where the timed run marked supersteps): ``--instr-atstart=no``, and the C wrapper's
  first call in each process issues ``CALLGRIND_START_INSTRUMENTATION``. A process that never
  marks is never counted; a child forked before its parent's first mark starts with nothing of
  the parent's history; the simulated caches start empty at the first superstep
  (:func:`~counterd.backends.callgrind.valgrind.valgrind_argv` says what that changes).
* **The boundary call must come from C.** A function called *directly* by ctypes never fires
  ``--dump-before``: libffi's ``ffi_call_unix64`` moves the stack pointer above its own frame
  before ``call *%r11``, and Callgrind's call tracking (``setup_bbcc`` in callgrind/bbcc.c,
  which unwinds its shadow stack when SP rises) then takes the call for a return: no call is
  pushed and the costs are charged to libffi. Calling ``counterd_superstep_boundary`` from a
  small exported C wrapper (a real ``call`` on the normal stack) cuts a dump at every call, as
  does the client request ``CALLGRIND_DUMP_STATS_AT`` (section 6.5). The marker API must
  therefore call a C wrapper, not the symbol itself; :func:`supersteps_from_dumps` says so when
  no dump was cut.
* **Write-back model.** Callgrind simulates a write-through, write-allocate D1 and a write-back
  LL (callgrind/sim.c, "L1 Write-through, LL Write-back"); every write also marks the LL line
  dirty, even on a D1 hit. ``ILdmr``/``DLdmr``/``DLdmw`` count LL misses by an instruction
  read, data read and data write that evicted a dirty LL line (section 6.3.6 "Cache simulation
  options", ``--simulate-wb``). Only data is ever written, so every dirty line is a data line,
  whichever access evicts it: last-level writebacks are ``ILdmr + DLdmr + DLdmw``. (Measured:
  after a store pass over an array larger than the LL, the next load pass wrote back 3,915 of
  the LL's 4,096 dirty lines, 480 of them through ``ILdmr`` as the interpreter's code came
  back in.) There are no L1 writebacks in this model.
* **Read-modify-write.** The Cachegrind manual (section 5.8.1 "Cache Simulation Specifics")
  says an instruction that modifies memory counts as one read. ``counterd_rmw_stride``
  compiles to a separate load and store (``volatile``): one ``Dr`` and one ``Dw`` per element.
* **Geometry.** Valgrind needs a power-of-two number of sets and a power-of-two line of at
  least 16 bytes (section 5.8.1). For a host cache whose set count is not a power of two
  (this host's L3: 300 MiB, 20-way, 64 B lines = 245,760 sets) :func:`adjust_cache` keeps the
  line size, rounds the set count to the nearest power of two and picks the associativity that
  brings the capacity closest to the host's: 304 MiB 19-way with 262,144 sets (+1.3 %; keeping
  20 ways would give 320 MiB, +6.7 %). Capacity decides whether a working set fits, which
  dominates miss counts; one way more or less changes conflict misses only. The adjustment is
  kept in :attr:`CallgrindGeometry.adjustments` (and so in every :class:`CallgrindRun`).
  Valgrind's own auto-detection would give 304 MiB 38-way with 131,072 sets instead.

:class:`CallgrindBackend` is the backend; it builds on one module per concept, each importing
only the ones listed before it:

- :mod:`~counterd.backends.callgrind.geometry`: the cache geometry valgrind is given and its
  adjustment (:func:`~counterd.backends.callgrind.geometry.adjust_cache`);
- :mod:`~counterd.backends.callgrind.valgrind`: valgrind itself (path, version, command line),
  the boundary symbol and :class:`~counterd.backends.callgrind.valgrind.CallgrindError`;
- :mod:`~counterd.backends.callgrind.dumps`: the dumps, their events as canonical counters and
  the supersteps they cut;
- :mod:`~counterd.backends.callgrind.run`: running a command under Callgrind;
- :mod:`~counterd.backends.callgrind.counting`: ``counterd record --backend callgrind``'s
  counted run.
"""

from __future__ import annotations

from collections.abc import Sequence

from counterd.backends.base import Capability, CounterGroup, Target
from counterd.backends.callgrind.dumps import counter_support
from counterd.backends.callgrind.geometry import CallgrindGeometry
from counterd.backends.callgrind.valgrind import INSTALL_FIX, NAME, valgrind_path, valgrind_version
from counterd.data.errors import BackendUnavailable, BadInput
from counterd.data.events import Source
from counterd.machine.description import Machine


class CallgrindBackend:
    """Simulated counters for whole commands under Callgrind (no open groups in-process)."""

    name = NAME
    source = Source.SIMULATED

    def __init__(self, machine: Machine | None = None) -> None:
        self.machine = machine  # None: counterd.machine.current() when asked

    def _last_level(self) -> int | None:
        try:
            return CallgrindGeometry.from_machine(self.machine).last_level
        except (BadInput, ValueError):
            return None

    def available(self) -> Capability:
        exe = valgrind_path()
        support = counter_support(self._last_level())
        if exe is None:
            return Capability(NAME, False, f"valgrind is not on PATH: {INSTALL_FIX}", support)
        version = valgrind_version(exe)
        if version is None:
            return Capability(NAME, False, f"{exe} --version failed: reinstall valgrind",
                              support)
        return Capability(NAME, True, f"{version} at {exe}; counts whole commands "
                          "(counterd record --backend callgrind -- CMD)", support)

    def open(self, events: Sequence[str], target: Target | None = None) -> CounterGroup:
        raise BackendUnavailable(
            NAME, "callgrind counts whole commands run under valgrind, not a counter group "
                  "opened inside a running process",
            "run the program with: counterd record --backend callgrind -- CMD")
