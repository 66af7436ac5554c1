"""Pattern catalogue (:func:`catalogue`): Table 1 of seed 004 generalised to a machine, plus a
validation suite, each pattern with the sweeps that give it enough accesses (:func:`sweeps_for`).

Seed 004 section 3: ``x`` processors (1, 2, 4, 8) issue loads or stores with a stride of 1 to
256 words to sub-arrays whose size and base address decide where the accesses are served (L1,
L2 or memory) and which of the 8 memory banks they reach; Bank Contention BKC = active
processors / distinct banks touched (0 when everything stays in cache). Each pattern runs as
Load or Store, Exclusive (own sub-arrays) or Concurrent (one shared sub-array): mnemonic
``px.sy.bz.LE``. Section 5.1 adds a validation suite (VS, 412 patterns on the paper's machine)
of variants with data clean, shared or dirty in another processor's cache.

Generalisation (DESIGN.md section 7), all of it a pure function of a
:class:`~counterd.machine.views.NodeView`:

* processors 1, 2, 4, ... up to the machine's CPUs;
* levels from the machine's geometry; per-processor working sets (bytes spanned by one sweep):
  half the capacity of the level that must serve them, twice the last level's for memory. A
  level that sysfs lists as shared is divided among the processors of an exclusive pattern
  (they compete for it); a concurrent pattern's processors share the same lines, so they get
  it whole;
* bank rows: the stride unit is one bank interleave in words (``u = interleave / word``: 32 on
  the paper's machine, 128 B / 4 B), strides ``u * i`` for ``i = 1, 2, 4, ..., banks`` reach
  ``banks / i`` banks each; processor k starts at bank ``(k mod c) * i / c`` and ``c`` (the
  number of distinct bank sets, a power of two up to ``min(p, i)``) sets BKC =
  ``p / (c * banks / i)``. This reproduces every row of Table 1 (tests/microbench);
* the word is the machine's (4 B on the paper's R10000, per seed section 2's "32 B (8 words)";
  8 B on the host, the uint64_t words of the native kernels).

Mnemonics are the paper's, with an op letter L (load), S (store), R (read-modify-write) or Mk
(mixed: every k-th access a store) and E/C; a suffix names the level when the paper's
convention (s1.b0 -> L1, other b0 -> L2, b>0 -> memory) does not, the coherence variant, and
``ws<f>x<level>`` for working sets between levels.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import cast

from counterd.data.errors import BadInput
from counterd.machine.views import NodeView
from microbench.patterns import (
    COHERENCE,
    COHERENT_MAX_PROCS,
    SUITES,
    Coherence,
    Level,
    Mode,
    Op,
    Pattern,
    PatternSuite,
    SuiteName,
    banks_touched,
    fmt_bkc,
    round_up,
)

_LOAD_STORE: tuple[Op, ...] = ("load", "store")
_OP_LETTER = {"load": "L", "store": "S", "rmw": "R", "mixed": "M"}
_MODE_LETTER = {"exclusive": "E", "concurrent": "C"}

# Mixed validation patterns: every k-th access of a sweep is a store.
MIXED_STORE_EVERY: tuple[int, ...] = (2, 4)
# Working sets between levels: fractions of a level's capacity (validation suite).
BETWEEN_FACTORS: tuple[float, ...] = (0.75, 1.25, 1.5)
LAST_LEVEL_FACTORS: tuple[float, ...] = (0.75, 1.5)
# Default minimum number of element accesses per processor in one superstep: cache-resident
# sweeps are repeated inside the kernel so a superstep lasts about a millisecond or more and
# barrier skew (tens of microseconds) stays a small part of it.
DEFAULT_MIN_ACCESSES = 1 << 21


def _fmt_factor(f: float) -> str:
    return f"{f:g}"


def sweeps_for(count: int, min_accesses: int, procs: int, level: Level, banks: int) -> int:
    """Sweeps per superstep: enough for ``min_accesses`` per processor (a superstep of a
    millisecond or more, barrier skew a small part of it). Memory patterns on more
    processors than banks queue for the banks (seed 004's bank contention), so each
    processor's superstep lasts ``procs / banks`` times longer: they need that many times
    fewer accesses (on 128 processors and 8 banks, 16 times fewer)."""
    need = min_accesses
    if level == "mem" and procs > banks:
        need = max(1, min_accesses * banks // procs)
    return max(1, -(-need // count))


def _level_names(machine: NodeView) -> list[Level]:
    return [cast(Level, f"L{lv.level}") for lv in machine.geometry.levels]


def _shared(machine: NodeView, level_index: int) -> bool:
    return len(machine.geometry.levels[level_index].shared_cpus) > 1


def _capacity(machine: NodeView, level_index: int, procs: int, mode: Mode) -> int:
    """Bytes of level ``level_index`` one processor can count on: a shared level is divided
    among the processors of an exclusive pattern (each has its own data in it)."""
    lv = machine.geometry.levels[level_index]
    if mode == "exclusive" and _shared(machine, level_index):
        return lv.size_bytes // min(procs, max(1, len(lv.shared_cpus)))
    return lv.size_bytes


def _memory_span(machine: NodeView, procs: int, mode: Mode) -> int:
    """Per-processor bytes spanned by a memory pattern: twice every level's capacity. A
    shared level divided among more exclusive processors than it has ways counts one way
    each: the simulator gives each processor at least one way
    (:meth:`counterd.machine.geometry.Geometry.split_shared`), and a span within it would be served
    there in the simulation while the node serves it from memory."""
    levels = machine.geometry.levels
    spans = []
    for i, lv in enumerate(levels):
        cap = _capacity(machine, i, procs, mode)
        if mode == "exclusive" and _shared(machine, i):
            cap = max(cap, lv.size_bytes // lv.ways)
        spans.append(2 * cap)
    return max(spans)


class _Builder:
    """Collects patterns of one catalogue, numbering bases and checking unique mnemonics."""

    def __init__(self, machine: NodeView, min_accesses: int) -> None:
        self.m = machine
        self.min_accesses = min_accesses
        self.out: list[Pattern] = []
        self.seen: set[str] = set()
        align = math.lcm(machine.page_bytes,
                         machine.bank_map.banks * machine.bank_map.interleave_bytes)
        self.align = align

    def count_for(self, span_bytes: int, stride_words: int) -> int:
        return max(1, span_bytes // (stride_words * self.m.word_bytes))

    def bases(self, procs: int, mode: Mode, span_bytes: int,
              first_banks: Sequence[int]) -> tuple[int, ...]:
        """Exclusive: one slot per processor, aligned to a page and a full bank cycle, one
        page of padding apart; concurrent: one slot. Then each processor's first bank."""
        slot = round_up(span_bytes + self.m.bank_map.interleave_bytes * self.m.bank_map.banks
                         + self.m.page_bytes, self.align)
        unit = self.m.bank_map.interleave_bytes
        return tuple((k * slot if mode == "exclusive" else 0) + first_banks[k] * unit
                     for k in range(procs))

    def add(self, *, suite: PatternSuite, procs: int, stride_words: int, op: Op, mode: Mode,
            level: Level, span_bytes: int, first_banks: Sequence[int] | None = None,
            coherence: Coherence | None = None, store_every: int = 0,
            ws_factor: float | None = None, ws_ref: str | None = None) -> None:
        m = self.m
        count = self.count_for(span_bytes, stride_words)
        bases = self.bases(procs, mode, span_bytes, first_banks or [0] * procs)
        sweeps = sweeps_for(count, self.min_accesses, procs, level, m.bank_map.banks)
        stride_bytes = stride_words * m.word_bytes
        banks = tuple(banks_touched(b, count, stride_bytes, m.bank_map) for b in bases)
        bkc = (Fraction(procs, len(frozenset().union(*banks))) if level == "mem"
               else Fraction(0))
        name = f"p{procs}.s{stride_words}.b{fmt_bkc(bkc)}."
        name += _OP_LETTER[op] + (str(store_every) if op == "mixed" else "")
        name += _MODE_LETTER[mode]
        if ws_factor is not None:
            name += f".ws{_fmt_factor(ws_factor)}x{ws_ref}"
        else:
            default = "mem" if bkc else ("L1" if stride_words == 1 else "L2")
            if level != default:
                name += f".{level}"
        if coherence:
            name += f".{coherence}"
        if name in self.seen:
            raise AssertionError(f"catalogue produced {name} twice")  # a bug, not bad input
        self.seen.add(name)
        self.out.append(Pattern(name, suite, procs, stride_words, m.word_bytes, op, mode, level,
                                bkc, bases, count, sweeps, coherence, store_every, ws_factor,
                                ws_ref, banks))


@dataclass(frozen=True)
class _Counts:
    """Processor counts of a catalogue: ``exclusive`` for patterns on their own data,
    ``coherent`` for patterns whose processors share it (concurrent, coherence variants)."""

    exclusive: tuple[int, ...]
    coherent: tuple[int, ...]

    @property
    def all(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.exclusive) | set(self.coherent)))

    def modes(self, procs: int) -> tuple[Mode, ...]:
        # One processor: exclusive and concurrent are the same experiment; keep E (seed 004
        # writes p1.s1.b0.LE, p1.s256.b1.SE).
        out: list[Mode] = []
        if procs in self.exclusive:
            out.append("exclusive")
        if procs in self.coherent and procs > 1:
            out.append("concurrent")
        return tuple(out)


def _bank_rows(machine: NodeView, procs: int) -> list[tuple[int, list[int]]]:
    """(stride in words, first bank of each processor) of the memory rows of Table 1.

    Strides of ``i`` bank units for i = 1, 2, 4, ... up to the banks, and the banks
    themselves when they are not a power of two (channels x NUMA nodes can be 12 or 24), so
    that the last row reaches one bank."""
    banks = machine.bank_map.banks
    unit = machine.bank_unit_words
    steps = [1 << e for e in range(banks.bit_length()) if 1 << e <= banks]
    if steps[-1] != banks:
        steps.append(banks)
    rows = []
    for i in steps:
        g = math.gcd(i, banks)  # a stride of i units from bank f reaches f + g * m (mod banks)
        c = 1
        options = []
        while c <= min(procs, i):
            options.append(c)
            c *= 2
        reached: set[int] = set()
        for c in reversed(options):  # lowest BKC first, as the table lists them
            first = [(k % c) * (i // c) for k in range(procs)]
            n = len({(f + g * m) % banks for f in set(first) for m in range(banks // g)})
            if n not in reached:  # banks that are not a power of two: the same BKC twice
                reached.add(n)
                rows.append((unit * i, first))
    return rows


def catalogue(machine: NodeView, suite: SuiteName = "all", *,
              procs: Iterable[int] | None = None, strides: Iterable[int] | None = None,
              min_accesses: int = DEFAULT_MIN_ACCESSES,
              coherent_procs: int = COHERENT_MAX_PROCS) -> tuple[Pattern, ...]:
    """Every pattern of ``suite`` for ``machine``, table1 first.

    Processor counts: :meth:`NodeView.proc_counts` for patterns on their own data,
    :meth:`NodeView.coherent_counts` (up to ``coherent_procs`` processors) for those whose
    processors share it. ``procs``: these counts instead (each must be <= the machine's
    CPUs), shared-data patterns at those of them up to ``coherent_procs``; ``strides``:
    restrict to these strides in words; ``min_accesses``: element accesses per processor per
    superstep below which a sweep is repeated inside the superstep.
    """
    if suite not in SUITES:
        raise BadInput(f"unknown suite {suite!r}", "choose table1, validation or all")
    if min_accesses <= 0:
        raise BadInput(f"{min_accesses} accesses per superstep", "give a positive number")
    if coherent_procs < 1:
        raise BadInput(f"{coherent_procs} processors for shared-data patterns",
                       "give 1 (none) or more")
    counts = _Counts(machine.proc_counts(), machine.coherent_counts(coherent_procs))
    if procs is not None:
        wanted = tuple(procs)
        for p in wanted:
            if p <= 0 or p > machine.max_procs:
                raise BadInput(f"{p} processors asked, {machine.max_procs} CPUs available on "
                               f"{machine.name}",
                               f"choose processor counts from 1 to {machine.max_procs}")
        chosen = tuple(sorted(set(wanted)))
        counts = _Counts(chosen, tuple(p for p in chosen if p <= coherent_procs))
    stride_filter = None
    if strides is not None:
        stride_filter = set(strides)
        if any(s <= 0 for s in stride_filter):
            raise BadInput(f"stride {min(stride_filter)} words", "strides are >= 1 word")
    b = _Builder(machine, min_accesses)
    if suite in ("table1", "all"):
        _table1(b, counts)
    if suite in ("validation", "all"):
        _validation(b, counts)
    out = tuple(b.out)
    if stride_filter is not None:
        out = tuple(p for p in out if p.stride_words in stride_filter)
    return out


def _cache_rows(machine: NodeView) -> list[tuple[int, Level, int]]:
    """(level index, level name, stride words) of the b0 rows: s1 in L1 (every word, so each
    line is reused), one L1 line apart below it (seed: "size(L2) words with stride 8")."""
    line_words = max(1, machine.geometry.levels[0].line_bytes // machine.word_bytes)
    rows: list[tuple[int, Level, int]] = [(0, "L1", 1)]
    for i, name in enumerate(_level_names(machine)[1:], start=1):
        rows.append((i, name, line_words))
    return rows


def _table1(b: _Builder, counts: _Counts) -> None:
    m = b.m
    for op in _LOAD_STORE:
        for p in counts.all:
            for mode in counts.modes(p):
                for i, level, stride in _cache_rows(m):
                    b.add(suite="table1", procs=p, stride_words=stride, op=op,
                          mode=mode, level=level, span_bytes=_capacity(m, i, p, mode) // 2)
                for stride, first in _bank_rows(m, p):
                    b.add(suite="table1", procs=p, stride_words=stride, op=op,
                          mode=mode, level="mem", span_bytes=_memory_span(m, p, mode),
                          first_banks=first)


def _validation(b: _Builder, counts: _Counts) -> None:
    """Seed 004 section 5.1's VS, generalised: the Table 1 shapes as read-modify-write and as
    mixed load/store sequences; coherence variants (clean, shared, dirty in another
    processor's cache) on cache-resident data; working sets between the levels."""
    m = b.m
    ops: list[tuple[Op, int]] = [("rmw", 0), *(("mixed", k) for k in MIXED_STORE_EVERY)]
    for op, every in ops:
        for p in counts.all:
            for mode in counts.modes(p):
                for i, level, stride in _cache_rows(m):
                    b.add(suite="validation", procs=p, stride_words=stride, op=op, mode=mode,
                          level=level, span_bytes=_capacity(m, i, p, mode) // 2,
                          store_every=every)
                for stride, first in _bank_rows(m, p):
                    b.add(suite="validation", procs=p, stride_words=stride, op=op, mode=mode,
                          level="mem", span_bytes=_memory_span(m, p, mode), first_banks=first,
                          store_every=every)
    # Coherence: another processor holds the data; needs a second CPU. Data that the other
    # processor's private levels can hold (L1, L2), exclusive sub-arrays. One processor (a
    # helper prepares its data) and the shared-data processor counts.
    coherent = tuple(p for p in counts.all if p == 1 and 1 in counts.exclusive
                     or p in counts.coherent)
    private = [(i, lv, s) for i, lv, s in _cache_rows(m) if i < 2]
    coherence_ops: list[tuple[Op, int]] = [("load", 0), ("store", 0), ("rmw", 0),
                                           ("mixed", MIXED_STORE_EVERY[0])]
    for coh in COHERENCE:
        for op, every in coherence_ops:
            for p in coherent:
                if p == 1 and m.max_procs < 2:
                    continue
                for i, level, stride in private:
                    b.add(suite="validation", procs=p, stride_words=stride, op=op,
                          mode="exclusive", level=level,
                          span_bytes=_capacity(m, i, p, "exclusive") // 2,
                          coherence=coh, store_every=every)
    # Between levels: f x the capacity of level k; f < 1 is still served by level k (near
    # capacity), f > 1 by the next level. s1 and one line apart; the last level one line apart
    # and only at LAST_LEVEL_FACTORS (its sweeps are the costliest to run and to simulate).
    names = _level_names(m)
    line_words = max(1, m.geometry.levels[0].line_bytes // m.word_bytes)
    for f in BETWEEN_FACTORS:
        for op in _LOAD_STORE:
            for p in counts.all:
                for mode in counts.modes(p):
                    for i, ref in enumerate(names):
                        last = i == len(names) - 1
                        if last and f not in LAST_LEVEL_FACTORS:
                            continue  # each one sweeps twice the last level: kept few
                        for stride in ((line_words,) if last else (1, line_words)):
                            span = int(f * _capacity(m, i, p, mode))
                            span = max(span, m.word_bytes)
                            served: Level = ref if f < 1 else ("mem" if last else names[i + 1])
                            b.add(suite="validation", procs=p, stride_words=stride, op=op,
                                  mode=mode, level=served, span_bytes=span, ws_factor=f,
                                  ws_ref=ref)


__all__ = ["BETWEEN_FACTORS", "DEFAULT_MIN_ACCESSES", "LAST_LEVEL_FACTORS", "MIXED_STORE_EVERY",
           "catalogue", "sweeps_for"]
