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
  Threads of one process share its dumps: a dump closed by one thread's call holds every
  thread's costs since the previous call (use one process per processor under callgrind).
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
"""

from __future__ import annotations

import functools
import math
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.backends.base import Capability, CounterGroup, CounterValue, Target
from counterd.errors import BackendUnavailable, BadInput, CounterdError
from counterd.events import NAMES, Source
from counterd.machine import current as current_machine
from counterd.machine.description import Machine

if TYPE_CHECKING:
    from counterd.records import SuperstepRecord

NAME = "callgrind"
#: The symbol whose every call closes one dump (see the module docstring: call it from C).
BOUNDARY_SYMBOL = "counterd_superstep_boundary"
OUT_PREFIX = "callgrind.out."
INSTALL_FIX = "apt-get install valgrind (or your distribution's valgrind package)"
BEGIN, END = 0, 1

_TWO_LEVELS = "callgrind simulates two levels: L1 and the last level"
_UNSUPPORTED: dict[str, str] = {
    "l1d_writebacks": "callgrind simulates write-backs at the last level only "
                      "(its L1 is write-through)",
    "dtlb_misses": "callgrind does not simulate a TLB",
    "cycles": "callgrind counts no time; time is never taken from a run under valgrind",
    "task_clock_ns": "callgrind counts no time; time is never taken from a run under valgrind",
    "page_faults": "callgrind does not simulate virtual memory",
    "context_switches": "callgrind serialises all threads; it counts no scheduling",
}
# Canonical counter -> the Callgrind events summed for it (Callgrind manual 6.3.5 and 6.3.6).
_L1_EVENTS: dict[str, tuple[str, ...]] = {
    "instructions": ("Ir",),
    "loads": ("Dr",),
    "stores": ("Dw",),
    "l1d_misses": ("D1mr", "D1mw"),
    "branch_misses": ("Bcm", "Bim"),
}
_LL_MISS_EVENTS = ("DLmr", "DLmw")
_LL_WRITEBACK_EVENTS = ("ILdmr", "DLdmr", "DLdmw")


class CallgrindError(CounterdError):
    """Callgrind could not run the command, or its output cannot be read."""


# --------------------------------------------------------------------------------------------
# Geometry


@dataclass(frozen=True)
class CacheSpec:
    """One cache as valgrind's ``--I1/--D1/--LL=size,assoc,line`` takes it."""

    size_bytes: int
    ways: int
    line_bytes: int

    def __post_init__(self) -> None:
        if self.size_bytes <= 0 or self.ways <= 0 or self.line_bytes <= 0:
            raise ValueError(f"invalid cache {self}")

    @property
    def sets(self) -> float:
        return self.size_bytes / (self.ways * self.line_bytes)

    def option(self) -> str:
        return f"{self.size_bytes},{self.ways},{self.line_bytes}"

    def valid_for_valgrind(self) -> bool:
        sets = self.sets
        return (sets == int(sets) and _is_pow2(int(sets)) and _is_pow2(self.line_bytes)
                and self.line_bytes >= 16 and self.size_bytes < 2**31)


@dataclass(frozen=True)
class CacheAdjustment:
    """A host cache changed to one valgrind accepts, and why."""

    level: str  # "I1", "D1" or "LL"
    host: CacheSpec
    simulated: CacheSpec
    reason: str

    def describe(self) -> str:
        h, s = self.host, self.simulated
        return (f"{self.level}: host {h.size_bytes} B {h.ways}-way {h.line_bytes} B lines "
                f"-> simulated {s.size_bytes} B {s.ways}-way ({self.reason})")


@dataclass(frozen=True)
class CallgrindGeometry:
    """The three caches Callgrind simulates, with the host level the LL stands for."""

    i1: CacheSpec
    d1: CacheSpec
    ll: CacheSpec
    last_level: int  # 2 or 3: which canonical l<N>_* counters the LL feeds
    adjustments: tuple[CacheAdjustment, ...] = ()

    def __post_init__(self) -> None:
        if self.last_level not in (2, 3):
            raise ValueError(f"last level {self.last_level} is not 2 or 3")
        for spec in (self.i1, self.d1, self.ll):
            if not spec.valid_for_valgrind():
                raise ValueError(f"{spec} is not a geometry valgrind accepts; "
                                 "build it with valgrind_geometry()")

    @classmethod
    def from_machine(cls, machine: Machine | None = None) -> CallgrindGeometry:
        """The L1i, L1d and last level of ``machine`` (default: :func:`counterd.machine.
        current`), adjusted with :func:`valgrind_geometry`. Raises BadInput, naming where the
        machine came from, when it lacks them or valgrind cannot simulate them."""
        m = machine if machine is not None else current_machine()
        where = m.caches_source
        fix = ("pass the geometry explicitly: CallgrindGeometry(i1=..., d1=..., ll=..., "
               "last_level=...) built with valgrind_geometry(), or describe the machine in a "
               "file (--machine FILE or COUNTERD_MACHINE) with an L1 instruction cache")
        if not m.caches_known or m.l1i is None or len(m.levels) < 2:
            raise BadInput(f"{where} does not describe an L1i, an L1d and a last-level cache",
                           fix)
        level = m.levels[-1].level
        if level not in (2, 3):
            raise BadInput(f"the last-level cache in {where} is L{level}",
                           "pass the geometry explicitly with last_level=2 or 3")
        spec = [CacheSpec(lv.size_bytes, lv.ways, lv.line_bytes)
                for lv in (m.l1i, m.levels[0], m.levels[-1])]
        try:
            return valgrind_geometry(spec[0], spec[1], spec[2], last_level=level)
        except BadInput as exc:
            raise BadInput(f"{where}: {exc.what}", exc.fix) from None


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def adjust_cache(level: str, host: CacheSpec) -> tuple[CacheSpec, CacheAdjustment | None]:
    """A cache valgrind accepts, as close as possible to ``host`` (see the module docstring).

    Keeps the line size; rounds the set count to the nearest power of two (ties up); picks the
    associativity that brings the capacity closest to the host's (ties to more ways). Raises
    BadInput for a line size valgrind cannot simulate (not a power of two, or below 16 B).
    """
    if host.valid_for_valgrind():
        return host, None
    line = host.line_bytes
    if not _is_pow2(line) or line < 16:
        raise BadInput(f"{level} cache line of {line} B cannot be simulated by valgrind",
                       "valgrind needs a power-of-two line of at least 16 B; pass a geometry")
    sets_exact = host.size_bytes / (host.ways * line)
    lo = 1 << max(0, math.floor(math.log2(sets_exact)))
    sets = lo if sets_exact - lo < 2 * lo - sets_exact else 2 * lo
    ways_exact = host.size_bytes / (sets * line)
    ways = max(1, math.floor(ways_exact + 0.5))
    while sets * ways * line >= 2**31 and ways > 1:  # valgrind holds cache sizes in an int
        ways -= 1
    sim = CacheSpec(sets * ways * line, ways, line)
    change = 100 * (sim.size_bytes / host.size_bytes - 1)
    reason = (f"valgrind needs a power-of-two set count; {sets_exact:g} sets -> {sets}, "
              f"{host.ways} -> {ways} ways (capacity {change:+.1f} %)")
    return sim, CacheAdjustment(level, host, sim, reason)


def valgrind_geometry(i1: CacheSpec, d1: CacheSpec, ll: CacheSpec,
                      last_level: int) -> CallgrindGeometry:
    """Host caches -> a :class:`CallgrindGeometry`, every adjustment recorded."""
    specs = []
    adjustments = []
    for level, spec in (("I1", i1), ("D1", d1), ("LL", ll)):
        sim, adj = adjust_cache(level, spec)
        specs.append(sim)
        if adj is not None:
            adjustments.append(adj)
    return CallgrindGeometry(specs[0], specs[1], specs[2], last_level, tuple(adjustments))


# --------------------------------------------------------------------------------------------
# Running


def valgrind_argv(cmd: Sequence[str], geometry: CallgrindGeometry, outdir: str | Path,
                  valgrind: str = "valgrind") -> list[str]:
    """The full argv that runs ``cmd`` under Callgrind with one dump per boundary call.

    Valgrind's own messages go to ``<outdir>/valgrind.<pid>.log`` (core option ``--log-file``,
    manual section 2.7.2) so the command's stderr is its own. ``--dump-line=no`` keeps dumps
    small: only totals are used here, never source positions.
    """
    if not cmd:
        raise BadInput("no command given", "usage: counterd record --backend callgrind -- CMD")
    out = Path(outdir)
    return [
        valgrind, "--tool=callgrind",
        "--cache-sim=yes", "--simulate-wb=yes", "--branch-sim=yes",
        f"--I1={geometry.i1.option()}", f"--D1={geometry.d1.option()}",
        f"--LL={geometry.ll.option()}",
        f"--dump-before={BOUNDARY_SYMBOL}",
        "--trace-children=yes",
        "--dump-line=no",
        f"--callgrind-out-file={out / OUT_PREFIX}%p",
        f"--log-file={out / 'valgrind.'}%p.log",
        *cmd,
    ]


@dataclass(frozen=True)
class Dump:
    """One Callgrind dump (format: valgrind manual, chapter 3 "Callgrind Format Specification").

    ``totals`` maps each event of the ``events:`` line to its count over the dump. ``complete``
    is False when the file has no ``totals:``/``summary:`` line (written last: the process
    was killed while writing); the totals are then the sum of the cost lines present.
    """

    events: tuple[str, ...]
    totals: Mapping[str, int]
    pid: int | None = None
    part: int | None = None
    cmd: str = ""
    trigger: str = ""
    desc: tuple[str, ...] = ()
    complete: bool = True
    path: Path | None = None

    @property
    def final(self) -> bool:
        """The dump written at process exit (not at a boundary call)."""
        return self.trigger.startswith("Program termination")


_COST_LINE = re.compile(r"^[0-9+\-*]")


def parse_dump(text: str, path: Path | None = None) -> Dump:
    """Parse the header and totals of one dump. Raises CallgrindError without ``events:``.

    Totals come from ``totals:``, else ``summary:`` (format specification, section 3.1.7.1
    "Cost Summary Information"), else the sum of self-cost lines; the cost line after a
    ``calls=`` line is the inclusive cost of that call and is not summed (section 3.1.3
    "Associations").
    """
    events: tuple[str, ...] = ()
    positions = 1
    totals_line: list[int] | None = None
    summary_line: list[int] | None = None
    pid: int | None = None
    part: int | None = None
    cmd = ""
    trigger = ""
    desc: list[str] = []
    sums: list[int] = []
    skip_next = False
    for line in text.splitlines():
        if not line:
            continue
        if _COST_LINE.match(line):
            if skip_next:
                skip_next = False
                continue
            fields = line.split()[positions:]
            if len(fields) > len(sums):
                sums.extend([0] * (len(fields) - len(sums)))
            for i, value in enumerate(fields):
                sums[i] += int(value)
            continue
        key, sep, value = line.partition(":")
        if line.startswith("calls="):
            skip_next = True
        elif not sep or "=" in key:
            continue
        elif key == "events":
            events = tuple(value.split())
        elif key == "positions":
            positions = len(value.split()) or 1
        elif key == "totals":
            totals_line = [int(v) for v in value.split()]
        elif key == "summary":
            summary_line = [int(v) for v in value.split()]
        elif key == "pid":
            pid = int(value)
        elif key == "part":
            part = int(value)
        elif key == "cmd":
            cmd = value.strip()
        elif key == "desc":
            desc.append(value.strip())
            head, _, rest = value.strip().partition(":")
            if head == "Trigger":
                trigger = rest.strip()
    if not events:
        where = f" {path}" if path else ""
        raise CallgrindError(f"callgrind dump{where} has no 'events:' line",
                             "the file is not a callgrind dump, or it is truncated")
    complete = totals_line is not None or summary_line is not None
    values = totals_line if totals_line is not None else summary_line
    if values is None:
        values = sums
    totals = {ev: (values[i] if i < len(values) else 0) for i, ev in enumerate(events)}
    return Dump(events, totals, pid, part, cmd, trigger, tuple(desc), complete, path)


def dump_files(outdir: str | Path) -> dict[int, list[Path]]:
    """``pid -> files`` of every dump in ``outdir`` (named ``callgrind.out.<pid>[.<n>]``)."""
    out: dict[int, list[Path]] = {}
    pattern = re.compile(re.escape(OUT_PREFIX) + r"(\d+)(?:\.(\d+))?")
    for path in Path(outdir).iterdir():
        m = pattern.fullmatch(path.name)
        if m:
            out.setdefault(int(m.group(1)), []).append(path)
    return out


def dumps_for_pid(outdir: str | Path, pid: int) -> list[Dump]:
    """Every dump of process ``pid`` in ``outdir``, ordered by part (the final one last)."""
    paths = dump_files(outdir).get(pid, [])
    dumps = [parse_dump(p.read_text(encoding="utf-8", errors="replace"), p) for p in paths]
    return sorted(dumps, key=lambda d: (d.part if d.part is not None else 1 << 62))


# --------------------------------------------------------------------------------------------
# Callgrind events -> canonical counters


def to_canonical(event_totals: Mapping[str, int], last_level: int) -> dict[str, CounterValue]:
    """Canonical counters from Callgrind event totals (only those whose events are present).

    instructions <- Ir; loads <- Dr; stores <- Dw; l1d_misses <- D1mr + D1mw;
    l<last_level>_misses <- DLmr + DLmw; l<last_level>_writebacks <- ILdmr + DLdmr + DLdmw
    (every dirty line is data, whichever access evicted it: see the module docstring).
    """
    if last_level not in (2, 3):
        raise ValueError(f"last level {last_level} is not 2 or 3")
    table: dict[str, tuple[str, ...]] = dict(_L1_EVENTS)
    table[f"l{last_level}_misses"] = _LL_MISS_EVENTS
    table[f"l{last_level}_writebacks"] = _LL_WRITEBACK_EVENTS
    out: dict[str, CounterValue] = {}
    for name, evs in table.items():
        if all(e in event_totals for e in evs):
            raw = sum(int(event_totals[e]) for e in evs)
            out[name] = CounterValue(float(raw), Source.SIMULATED, 1.0, raw)
    return out


def counter_support(last_level: int | None) -> dict[str, str | None]:
    """Every canonical counter -> None (callgrind gives it) or the reason it does not."""
    out: dict[str, str | None] = {}
    for name in NAMES:
        if name in _L1_EVENTS:
            out[name] = None
        elif name in _UNSUPPORTED:
            out[name] = _UNSUPPORTED[name]
        elif name in ("l2_misses", "l3_misses", "l2_writebacks", "l3_writebacks"):
            level = int(name[1])
            if last_level is None:
                out[name] = ("callgrind has no geometry for this machine: it needs an L1i, an L1d "
                             "and a last level, from sysfs or a machine file")
            elif level == last_level:
                out[name] = None
            elif level < last_level:
                out[name] = _TWO_LEVELS
            else:
                out[name] = f"this host has no L{level} (its last level is L{last_level})"
        else:
            out[name] = "callgrind has no event for it"
    return out


def _sum_totals(dumps: Iterable[Dump]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dumps:
        for ev, v in d.totals.items():
            out[ev] = out.get(ev, 0) + v
    return out


@dataclass(frozen=True)
class SuperstepCounts:
    """The simulated counts of one superstep of one process.

    ``complete`` is False when the END call is missing (the process died inside the superstep)
    or a dump it needs is missing; ``problem`` says which, and the counts then cover only what
    was dumped after its begin.
    """

    pid: int
    index: int
    counters: Mapping[str, CounterValue]
    events: Mapping[str, int]
    parts: tuple[int, ...]
    complete: bool = True
    problem: str = ""


def supersteps_from_dumps(dumps: Sequence[Dump], calls: Sequence[tuple[int, int]],
                          last_level: int, pid: int | None = None) -> list[SuperstepCounts]:
    """Per-superstep counts for one process, from its dumps and its boundary calls in order.

    ``calls[j] = (index, kind)`` is the (j+1)-th call of ``counterd_superstep_boundary`` made
    by the process (kind 0 = begin, 1 = end; an end of an unknown superstep may carry index
    -1: it still closed a dump). The dump with ``part: k`` ends at call k, so a superstep whose
    begin is call b and end is call e (1-based) is the sum of parts b+1 .. e: exactly part e
    when no other boundary call lies between (nested supersteps are included in the outer one).
    """
    by_part = {d.part: d for d in dumps if d.part is not None}
    pid = pid if pid is not None else next((d.pid for d in dumps if d.pid is not None), -1)
    final_part = max((d.part for d in dumps if d.final and d.part is not None), default=None)
    begins: dict[int, int] = {}
    ends: dict[int, int] = {}
    for pos, (index, kind) in enumerate(calls, start=1):
        if index < 0:
            continue
        if kind == BEGIN:
            begins.setdefault(index, pos)
        elif kind == END and index in begins and begins[index] < pos:
            ends.setdefault(index, pos)
    boundary_dumps = [d for d in dumps if not d.final]
    out: list[SuperstepCounts] = []
    for index, b in sorted(begins.items(), key=lambda kv: kv[1]):
        e = ends.get(index)
        problem = ""
        if e is None:
            last = final_part if final_part is not None else max(by_part, default=b)
            wanted = range(b + 1, last + 1)
            problem = ("the superstep never ended (the process died or exited inside it); "
                       + ("counts run to process exit" if final_part is not None
                          else "the process was killed: counts run to its last dump"))
        else:
            wanted = range(b + 1, e + 1)
        parts = tuple(k for k in wanted if k in by_part)
        if not problem and len(parts) != len(wanted):
            if not boundary_dumps:
                problem = (f"no dump was cut at any boundary call: {BOUNDARY_SYMBOL} was not "
                           "seen by callgrind (called directly through ctypes/libffi? it must "
                           "be called from C, see counterd.backends.callgrind)")
            else:
                missing = sorted(set(wanted) - set(parts))
                problem = f"dumps {missing} of pid {pid} are missing"
        incomplete_dumps = [by_part[k].part for k in parts if not by_part[k].complete]
        if not problem and incomplete_dumps:
            problem = f"dumps {incomplete_dumps} of pid {pid} are truncated"
        events = _sum_totals(by_part[k] for k in parts)
        out.append(SuperstepCounts(pid, index, to_canonical(events, last_level), events, parts,
                                   not problem, problem))
    return out


@dataclass(frozen=True)
class CallgrindRun:
    """The outcome of :func:`run`: the command's exit code and every process's dumps."""

    exit_code: int
    outdir: Path
    argv: tuple[str, ...]
    geometry: CallgrindGeometry
    dumps: Mapping[int, tuple[Dump, ...]] = field(default_factory=dict)
    # pid -> why its dumps could not be read (still being written by a process that outlived
    # the command, or truncated)
    unreadable: Mapping[int, str] = field(default_factory=dict)
    # The first signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) this process received during the run
    # and passed on to valgrind's session (None: none): the run was stopped, its dumps are
    # the supersteps it finished.
    stopped_by: int | None = None

    @property
    def adjustments(self) -> tuple[CacheAdjustment, ...]:
        return self.geometry.adjustments

    def stderr_tail(self, lines: int = 1) -> str:
        """The last ``lines`` non-blank lines the command wrote to its standard error, when
        :func:`run` kept it (``show_stdout=False``); "" otherwise."""
        path = self.outdir / STDERR_FILE
        if not path.exists():
            return ""
        text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        return "\n".join(text[-lines:])

    def log(self, pid: int) -> str:
        """Valgrind's own messages for ``pid`` ("" when absent)."""
        path = self.outdir / f"valgrind.{pid}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def valgrind_path() -> str | None:
    return shutil.which("valgrind")


# Where run(show_stdout=False) keeps the command's standard error (in its outdir): a second
# run of a command repeats the first one's messages (a traceback printed twice, issue 34).
STDERR_FILE = "command.stderr"


# Signals that stop a run: valgrind runs in its own session (so that a timeout can kill its
# whole process tree), where the terminal's Ctrl-C and Ctrl-\ never reach it, and a kill of
# this process alone would leave it running. Each is passed on to the session while it runs.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class _PassOn:
    """Until :meth:`restore`: every signal of :data:`STOP_SIGNALS` this process receives is
    sent to the process group ``pgid`` (once :meth:`started` names it; one received before
    that is sent then), and the first is remembered (``received``). A no-op outside the main
    thread, where signals are not set."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.pgid: int | None = None
        self.old: list[tuple[int, Any]] = []
        try:
            for sig in STOP_SIGNALS:
                self.old.append((sig, signal.signal(sig, self._handle)))
        except ValueError:  # not the main thread
            pass

    def _send(self, sig: int) -> None:
        if self.pgid is None:
            return
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:  # it has ended: the wait returns
            pass

    def _handle(self, sig: int, frame: object) -> None:
        if self.received is None:
            self.received = sig
        self._send(sig)

    def started(self, pgid: int) -> None:
        self.pgid = pgid
        if self.received is not None:
            self._send(self.received)

    def restore(self) -> None:
        for sig, handler in self.old:
            signal.signal(sig, handler)
        self.old = []


def run(cmd: Sequence[str], geometry: CallgrindGeometry | None = None,
        outdir: str | Path | None = None, env: Mapping[str, str] | None = None,
        timeout: float | None = None, *, show_stdout: bool = True) -> CallgrindRun:
    """Run ``cmd`` under Callgrind and read every dump it leaves in ``outdir``
    (``show_stdout=False``: the command's standard output is discarded and its standard error
    kept in ``outdir``, :meth:`CallgrindRun.stderr_tail`; valgrind's own messages are in its
    logs either way, :meth:`CallgrindRun.log`).

    ``geometry`` defaults to the machine's (:meth:`CallgrindGeometry.from_machine`).
    ``outdir`` defaults to a new temporary directory, left in place for the caller (it holds
    the dumps and valgrind's logs).
    Raises BackendUnavailable without valgrind, BadInput for a command that does not exist,
    CallgrindError when the timeout expires (the process tree is killed).
    """
    exe = valgrind_path()
    if exe is None:
        raise BackendUnavailable(NAME, "valgrind is not on PATH", INSTALL_FIX)
    if not cmd:
        raise BadInput("no command given", "usage: counterd record --backend callgrind -- CMD")
    prog = cmd[0]
    found = shutil.which(prog, path=(env or os.environ).get("PATH")) if os.sep not in prog \
        else (prog if os.access(prog, os.X_OK) else None)
    if found is None:
        raise BadInput(f"command not found: {prog}", "check the spelling and PATH")
    geo = geometry if geometry is not None else CallgrindGeometry.from_machine()
    out = Path(outdir) if outdir is not None else Path(tempfile.mkdtemp(prefix="counterd-cg-"))
    out.mkdir(parents=True, exist_ok=True)
    stale = dump_files(out)
    if stale:
        raise BadInput(f"{out} already holds callgrind dumps (pids {sorted(stale)})",
                       "give run() an empty directory")
    argv = valgrind_argv(cmd, geo, out, valgrind=exe)
    # Ctrl-C, kill and a closed terminal stop the run as they stop a command run natively:
    # passed on to valgrind's session, which ends as its command does (a process it counts
    # dies of the signal, valgrind with it), leaving the dumps of the supersteps it finished.
    passing = _PassOn()
    try:
        try:
            with open(os.devnull if show_stdout else out / STDERR_FILE, "wb") as errors:
                proc = subprocess.Popen(argv, env=dict(env) if env is not None else None,
                                        start_new_session=True,
                                        stdout=None if show_stdout else subprocess.DEVNULL,
                                        stderr=None if show_stdout else errors)
        except OSError as exc:
            raise CallgrindError(f"cannot start valgrind: {exc.strerror}", INSTALL_FIX) from exc
        passing.started(proc.pid)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            raise CallgrindError(f"the command did not finish within {timeout} s under "
                                 "callgrind", "raise the timeout (callgrind runs 50-100x "
                                 "slower), or shrink the input") from None
        except BaseException:  # an exception from elsewhere: the session is not left running
            _kill_tree(proc)
            raise
    finally:
        passing.restore()
    dumps: dict[int, tuple[Dump, ...]] = {}
    unreadable: dict[int, str] = {}
    for pid in sorted(dump_files(out)):
        # A helper process the command exec'd (e.g. multiprocessing's resource tracker) may
        # outlive it and still be writing its dump: that pid is unreadable, not the run.
        try:
            dumps[pid] = tuple(dumps_for_pid(out, pid))
        except CallgrindError as exc:
            unreadable[pid] = str(exc)
    if not dumps and code != 0 and passing.received is None:
        log = "".join((out / name).read_text(errors="replace")
                      for name in sorted(os.listdir(out)) if name.startswith("valgrind."))
        raise CallgrindError(f"valgrind exited with {code} and wrote no dump",
                             "see its log: " + (log.strip().splitlines() or ["(empty)"])[-1])
    return CallgrindRun(code, out, tuple(argv), geo, dumps, unreadable, passing.received)


# --------------------------------------------------------------------------------------------
# The backend object (counterd probe, backends.resolve)


@functools.cache
def valgrind_version(exe: str) -> str | None:
    try:
        res = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    text = res.stdout.strip()
    return text if res.returncode == 0 and text else None


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


# --------------------------------------------------------------------------------------------
# counterd record --backend callgrind: the counted run


def boundary_calls_from_spool(
        path: Path) -> tuple[list[tuple[int, int]], dict[int, dict[str, Any]]]:
    """The boundary calls one process made, in order, from its marker spool file
    (format: :mod:`counterd.spool`), and its ``begin`` lines by index.

    The marker API writes a ``begin`` line just before its begin call and a ``record`` line
    just after its end call, so for a single-threaded process the line order is the call
    order. A record without ``end_ns`` (closed at exit) made no call; an ``unmatched_end``
    record made one, for no superstep (index -1). A begin line whose superstep raised gets
    ``"raised"``: the ``record`` line's ``exception`` text, or True where it has none (the flag
    ``exception`` alone, of an older recorder).
    """
    from counterd.spool import read_events

    calls: list[tuple[int, int]] = []
    begins: dict[int, dict[str, Any]] = {}
    for d in read_events(path):
        index = int(d.get("index", -1))
        if d.get("ev") == "begin":
            calls.append((index, BEGIN))
            begins[index] = d
        elif d.get("ev") == "record" and d.get("end_ns") is not None:
            unmatched = "unmatched_end" in d.get("flags", ())
            calls.append((-1 if unmatched else index, END))
            if not unmatched and "exception" in d.get("flags", ()) and index in begins:
                begins[index]["raised"] = _exception_of(d) or True
    return calls, begins


def _exception_of(line: dict[str, Any]) -> str | None:
    """A spool ``record`` line's exception text where it is one a record may hold."""
    from counterd.records import MAX_EXCEPTION_CHARS

    text = line.get("exception")
    if isinstance(text, str) and 0 < len(text) <= MAX_EXCEPTION_CHARS and text.isprintable():
        return text
    return None


@dataclass(frozen=True)
class CountedRun:
    """A command's counted run under Callgrind: per-superstep records (from the markers), the
    whole command's counters (every process, every dump), and what the run could not count."""

    supersteps: Mapping[tuple[int, int], SuperstepRecord]
    whole: Mapping[str, CounterValue]
    unsupported: Mapping[str, str]
    exit_code: int
    adjustments: tuple[CacheAdjustment, ...]
    # The signal that stopped the run (:attr:`CallgrindRun.stopped_by`), or None.
    stopped_by: int | None = None
    # The last line the command wrote to its standard error in this run ("" for none): the
    # timed run showed its messages, this run's are not repeated.
    stderr_tail: str = ""


# Valgrind runs a process's threads one at a time, so the spin-waiting worker threads of
# OpenBLAS and OpenMP pools spin for whole scheduler slices: a numpy program that called BLAS
# once took 383 s under Callgrind instead of 31 s with one BLAS thread, and every spin was
# counted as instructions. The counted run uses one thread per pool unless the environment
# says otherwise (the timed run is untouched).
SERIAL_POOLS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# Valgrind's virtual CPU has no AVX-512 (valgrind 3.19-3.24 decode none of it and clear its
# CPUID bits), so a program that picks its code by CPU feature at run time -- numpy's
# dispatch, OpenBLAS's DYNAMIC_ARCH, glibc's string functions -- counts one code path under
# Callgrind and runs another natively on an AVX-512 host. On the `vm` test host (AMD EPYC
# guest) the BSP column sort's supersteps took 16-20 ms natively and 3 ms with AVX-512 hidden;
# the counts describe the latter. Runs timed for counts from Callgrind therefore hide the same
# features from those dispatchers (``counterd record --cpu-features as-counted``, the default
# with --backend callgrind), unless the environment already sets the variable.
AS_COUNTED_ENV = {
    # numpy >= 2.4 names the groups X86_V4 / AVX512_*; older releases AVX512F, AVX512_SKX...
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512CD AVX512_KNL "
                                "AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL",
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD",
    "OPENBLAS_CORETYPE": "Haswell",  # the newest OpenBLAS kernel set without AVX-512
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}


def hidden_features(cpu_flags: Collection[str]) -> tuple[str, ...]:
    """The host's CPU features valgrind's virtual CPU lacks (``flags`` of /proc/cpuinfo)."""
    return tuple(sorted(f for f in cpu_flags if f.startswith("avx512")))


def as_counted_env(env: Mapping[str, str], cpu_flags: Collection[str]) -> dict[str, str]:
    """The variables that make the common run-time dispatchers choose, natively, the code they
    choose under valgrind (:data:`AS_COUNTED_ENV`); empty on a host whose CPU has nothing
    valgrind lacks. Variables ``env`` already sets are left to it."""
    if not hidden_features(cpu_flags):
        return {}
    return {k: v for k, v in AS_COUNTED_ENV.items() if k not in env}


def count_command(cmd: Sequence[str], *, run_id: str, env: Mapping[str, str],
                  geometry: CallgrindGeometry | None = None, timeout: float | None = None,
                  outdir: str | Path | None = None) -> CountedRun:
    """Run ``cmd`` under Callgrind with markers active and count it.

    ``env`` is the command's environment as for the timed run; its spool and backend are
    replaced here (``COUNTERD_SPOOL`` -> a private directory, ``COUNTERD_BACKEND`` ->
    callgrind) and thread pools of numeric libraries get one thread (:data:`SERIAL_POOLS`,
    unless ``env`` sets them). Superstep records carry simulated counters only (their times
    are meaningless: time is never taken under valgrind), ``backend="callgrind"``, and
    ``incomplete`` when the counts do not cover the whole superstep (the reason is in
    ``unsupported["*"]``). ``whole`` sums every readable dump of every process: the command as
    one superstep.
    """
    from counterd.env import ENV_BACKEND, ENV_SPOOL
    from counterd.records import SuperstepRecord
    from counterd.spool import files as spool_files

    geo = geometry if geometry is not None else CallgrindGeometry.from_machine()
    support = counter_support(geo.last_level)
    unsupported = {k: v for k, v in support.items() if v is not None}
    # The dumps are read here and then removed, unless the caller named where to keep them.
    with tempfile.TemporaryDirectory(prefix="counterd-cg-spool-") as spool_dir, \
            tempfile.TemporaryDirectory(prefix="counterd-cg-") as dumps_dir:
        spool = Path(spool_dir)
        run_env = {**SERIAL_POOLS, **env}  # the user's own setting wins
        run_env[ENV_SPOOL] = str(spool)
        run_env[ENV_BACKEND] = NAME
        # The timed run showed the command's output; this second run does not repeat it.
        result = run(cmd, geo, outdir if outdir is not None else dumps_dir, run_env, timeout,
                     show_stdout=False)
        out: dict[tuple[int, int], SuperstepRecord] = {}
        for path in spool_files(spool):
            try:
                pid = int(path.stem.split("-")[0])  # <pid>.frames, <pid>-<k>.frames
            except ValueError:
                continue
            calls, begins = boundary_calls_from_spool(path)
            if pid in result.unreadable and result.stopped_by is None:
                raise CallgrindError(result.unreadable[pid], "re-run the recording")
            dumps = result.dumps.get(pid, ())
            for sc in supersteps_from_dumps(dumps, calls, geo.last_level, pid):
                b = begins[sc.index]
                flags = {"unsupported_counters"} if unsupported else set()
                why = dict(unsupported)
                if not sc.complete:
                    flags.add("incomplete")
                    why["*"] = sc.problem
                raised = b.get("raised")
                if raised:
                    flags.add("exception")
                rec = SuperstepRecord(
                    run_id=run_id, index=sc.index, name=str(b.get("name", "")),
                    rank=int(b.get("rank", 0)), pid=pid, cpu=int(b.get("cpu", -1)),
                    begin_ns=int(b.get("begin_ns", 0)),
                    end_ns=None if not sc.complete else int(b.get("begin_ns", 0)),
                    counters=dict(sc.counters), params=b.get("params", {}),
                    flags=frozenset(flags), unsupported=why, backend=NAME,
                    host=str(b.get("host", "")),
                    exception=raised if isinstance(raised, str) else None)
                out[(rec.rank, rec.index)] = rec
        tail = result.stderr_tail()  # read before the directory goes
    whole_unsupported = dict(unsupported)
    if result.unreadable:
        whole_unsupported["*"] = "dumps of pids " + ", ".join(map(str, sorted(result.unreadable))) \
            + " were unreadable (a process outlived the command): not counted"
    whole = to_canonical(_sum_totals(d for dumps in result.dumps.values() for d in dumps),
                         geo.last_level)
    return CountedRun(out, whole, whole_unsupported, result.exit_code, geo.adjustments,
                      result.stopped_by, tail)


def count_supersteps(cmd: Sequence[str], *, run_id: str, env: Mapping[str, str],
                     geometry: CallgrindGeometry | None = None, timeout: float | None = None,
                     outdir: str | Path | None = None) -> dict[tuple[int, int], SuperstepRecord]:
    """``(rank, index) -> SuperstepRecord`` of :func:`count_command`."""
    return dict(count_command(cmd, run_id=run_id, env=env, geometry=geometry, timeout=timeout,
                              outdir=outdir).supersteps)
