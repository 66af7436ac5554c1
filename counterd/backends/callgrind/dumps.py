"""What Callgrind writes: its dumps (:func:`parse_dump`), their events as canonical counters
(:func:`to_canonical`, :func:`counter_support`) and the supersteps they cut
(:func:`supersteps_from_dumps`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from counterd.backends.base import CounterValue
from counterd.backends.callgrind.valgrind import (
    BEGIN,
    BOUNDARY_SYMBOL,
    END,
    OUT_PREFIX,
    CallgrindError,
)
from counterd.data.events import NAMES, Source

_TWO_LEVELS = "callgrind simulates two levels: L1 and the last level"
_WITH_PREFETCH = ("valgrind simulates write-backs or the hardware prefetcher, not both "
                  "(--prefetch asks for the prefetcher)")
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


def counter_support(last_level: int | None, *, prefetch: bool = False
                    ) -> dict[str, str | None]:
    """Every canonical counter -> None (callgrind gives it) or the reason it does not
    (``prefetch``: with valgrind's hardware prefetcher simulated, which counts no write-backs;
    :attr:`~counterd.backends.callgrind.geometry.CallgrindGeometry.prefetch`)."""
    out: dict[str, str | None] = {}
    for name in NAMES:
        if name in _L1_EVENTS:
            out[name] = None
        elif name in _UNSUPPORTED:
            out[name] = _UNSUPPORTED[name]
        elif prefetch and name in ("l2_writebacks", "l3_writebacks"):
            out[name] = _WITH_PREFETCH
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


def sum_totals(dumps: Iterable[Dump]) -> dict[str, int]:
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
        events = sum_totals(by_part[k] for k in parts)
        out.append(SuperstepCounts(pid, index, to_canonical(events, last_level), events, parts,
                                   not problem, problem))
    return out
