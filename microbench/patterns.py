"""A microbench pattern (:class:`Pattern`: processors, stride, span, op, mode, the level meant
to serve it, its sweeps) and the machine it runs on (:class:`Machine`: geometry, bank map,
memory layout), with what a pattern does to the banks (:func:`bank_histogram`,
:func:`bsp_quantities`). The patterns a machine gets, Table 1 of seed 004 generalised and a
validation suite, are :mod:`microbench.catalogue`'s.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Literal

from counterd.data.errors import BadInput
from counterd.machine import current as current_machine
from counterd.machine.geometry import SGI_POWER_CHALLENGE, Geometry
from counterd.machine.memory import HOST_BANKS, SGI_BANKS, BankMap, MemoryLayout

Op = Literal["load", "store", "rmw", "mixed"]
Mode = Literal["exclusive", "concurrent"]
Level = Literal["L1", "L2", "L3", "mem"]
Coherence = Literal["clean", "shared", "dirty"]
SuiteName = Literal["table1", "validation", "all"]
PatternSuite = Literal["table1", "validation"]

SUITES: tuple[str, ...] = ("table1", "validation", "all")
OPS: tuple[Op, ...] = ("load", "store", "rmw", "mixed")
COHERENCE: tuple[Coherence, ...] = ("clean", "shared", "dirty")

# The host's bank map derives from its memory layout (counterd.machine.memory.MemoryLayout: NUMA
# nodes, channels, interleave; 8 x 256 B assumed where nothing is declared).
PAPER_BANKS_PROVENANCE = ("Amato et al., section 2: 8-way interleaved memory on 8 banks; "
                          "interleave of one 128 B L2 line, which reproduces Table 1")

# Most processors of a pattern whose processors share data (concurrent, coherence variants):
# simulating such a pattern on p processors costs about p^2 times one processor's accesses
# (every access snoops the others' private caches). On the 16-CPU node of issue 35 (a 300 MB
# L3, so 600 MB memory sweeps) the quick suite's shared-data patterns on 8 processors alone
# were estimated at over a minute of simulation, the full suite's at over 20: 4 keeps both
# suites within their targets on 16 to 128 CPUs. The paper's machine had 8 processors
# (catalogue(..., coherent_procs=8), microbench --coherent-procs 8: its Table 1 whole).
COHERENT_MAX_PROCS = 4


@dataclass(frozen=True)
class Machine:
    """What the catalogue needs to know about a node: usable CPUs, in the order a pattern's
    ranks are pinned to them (rank k on ``cpus[k]``), cache geometry, bank map (with where it
    came from), word and page size, and the memory layout the CPU order and banks come from
    (None for a machine given by hand, e.g. the paper's)."""

    name: str
    cpus: tuple[int, ...]
    geometry: Geometry
    bank_map: BankMap
    bank_provenance: str
    word_bytes: int = 8
    page_bytes: int = 4096
    memory: MemoryLayout | None = None

    def __post_init__(self) -> None:
        if not self.cpus:
            raise BadInput(f"machine {self.name} has no CPUs", "give at least one CPU id")
        if self.word_bytes <= 0 or self.page_bytes <= 0:
            raise BadInput(f"machine {self.name}: word {self.word_bytes} B, page "
                           f"{self.page_bytes} B", "word and page sizes must be > 0")
        if self.bank_map.interleave_bytes % self.word_bytes:
            raise BadInput(f"bank interleave {self.bank_map.interleave_bytes} B is not a whole "
                           f"number of {self.word_bytes} B words",
                           "choose an interleave that is a multiple of the word")

    @property
    def max_procs(self) -> int:
        return len(self.cpus)

    @property
    def bank_unit_words(self) -> int:
        """Words per bank interleave unit: the stride that moves to the next bank."""
        return self.bank_map.interleave_bytes // self.word_bytes

    def proc_counts(self) -> tuple[int, ...]:
        """1, 2, P/4, P/2 and P for P CPUs (rounded down, without repeats): seed 004 section
        3's 1, 2, 4, 8 on its 8 processors, and on a node of 16 to 128 CPUs five counts, so
        the suite's work grows with the processor counts' sum (about 1.8 P) and not with the
        number of powers of two below P."""
        p = self.max_procs
        return tuple(sorted({c for c in (1, 2, p // 4, p // 2, p) if 1 <= c <= p}))

    def coherent_counts(self, limit: int = COHERENT_MAX_PROCS) -> tuple[int, ...]:
        """The processor counts of the patterns whose processors share data (concurrent
        patterns, coherence variants): 2, 4, ... and the :meth:`proc_counts`, up to
        ``limit`` processors. Their counters are simulated as one coherent system, whose
        cost per access grows with the processors snooped (``counterd.sim.coherence``): a
        concurrent memory pattern costs about p^2 times one processor's accesses to simulate,
        which beyond a few processors outweighs everything else the suite does."""
        top = min(self.max_procs, limit)
        out = {c for c in self.proc_counts() if 2 <= c <= top}
        c = 2
        while c <= top:
            out.add(c)
            c *= 2
        return tuple(sorted(out))


def paper_machine() -> Machine:
    """The seed's SGI Power Challenge: 8 R10000s, 32K L1 / 1M L2, 8 banks x 128 B, 4 B words."""
    return Machine("SGI Power Challenge (Amato et al., section 2)", tuple(range(8)),
                   SGI_POWER_CHALLENGE, SGI_BANKS, PAPER_BANKS_PROVENANCE, word_bytes=4)


def host_machine(geometry: Geometry | None = None, bank_map: BankMap | None = None,
                 bank_provenance: str | None = None) -> Machine:
    """This host: the CPUs this process may run on, in the order the machine's NUMA layout
    pins a program's ranks (:meth:`counterd.machine.memory.MemoryLayout.spread`: round-robin over
    the NUMA nodes, so a p-processor pattern has p / nodes processors on each); the geometry,
    bank map and page size of the machine description (:func:`counterd.machine.current`:
    sysfs, or a machine file), each overridable here."""
    described = current_machine()
    cpus = described.memory.spread(os.sched_getaffinity(0))
    return Machine("host", cpus, geometry if geometry is not None else described.geometry,
                   bank_map if bank_map is not None else described.bank_map,
                   bank_provenance or (described.bank_provenance if bank_map is None
                                       else f"given: {bank_map.banks} banks x "
                                            f"{bank_map.interleave_bytes} B"),
                   word_bytes=8, page_bytes=described.page_bytes, memory=described.memory)


def planned_machine(geometry: Geometry | None = None, bank_map: BankMap | None = None,
                    bank_provenance: str | None = None) -> Machine:
    """The node a listing plans for: :func:`host_machine`, except that a machine file
    (``--machine``, ``COUNTERD_MACHINE``) naming more or fewer CPUs online than this process
    may use gives all of them (its NUMA nodes' CPUs, placed as :func:`host_machine` places
    them), so ``microbench list`` shows a 128-CPU node's patterns and run time from a 2-CPU
    host. A run uses the CPUs it can pin to."""
    here = host_machine(geometry, bank_map, bank_provenance)
    described = current_machine()
    if described.file is None or described.cpus_online == here.max_procs:
        return here
    return replace(here, name=f"{described.hostname} (machine file {described.file})",
                   cpus=described.memory.spread(described.memory.cpus))


# --------------------------------------------------------------------------------------------
# Patterns


def fmt_bkc(bkc: Fraction) -> str:
    """Seed 004 notation: 0, 1/8, 1/2, 1, 2 ..."""
    return str(bkc.numerator) if bkc.denominator == 1 else f"{bkc.numerator}/{bkc.denominator}"


@dataclass(frozen=True)
class Pattern:
    """One microbenchmark: everything needed to run it and to simulate it.

    Processor k (rank k, k < ``procs``) runs, in each superstep, ``sweeps`` sweeps of ``count``
    accesses ``base_k + i * stride_words * word_bytes`` (i < count), where ``base_k =
    bases_bytes[k]`` is an offset into the run's page-aligned shared region. ``op`` mixed: the
    i-th access of a sweep is a store when ``i % store_every == store_every - 1``. Coherence
    variants prepare, before every superstep, the data of rank k in the cache of rank
    ``(k+1) % procs`` (of a helper CPU when ``procs`` is 1): seed 004 section 5.1.
    """

    mnemonic: str
    suite: PatternSuite
    procs: int
    stride_words: int
    word_bytes: int
    op: Op
    mode: Mode
    level: Level
    bkc: Fraction
    bases_bytes: tuple[int, ...]
    count: int
    sweeps: int
    coherence: Coherence | None = None
    store_every: int = 0
    ws_factor: float | None = None
    ws_ref: str | None = None
    banks: tuple[frozenset[int], ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        fix = "strides, counts and sweeps are positive; one base per processor"
        if self.procs < 1 or len(self.bases_bytes) != self.procs:
            raise BadInput(f"{self.mnemonic}: {self.procs} processors, "
                           f"{len(self.bases_bytes)} bases", fix)
        if self.stride_words <= 0:
            raise BadInput(f"{self.mnemonic}: stride {self.stride_words} words",
                           "use a stride of at least 1 word")
        if self.count <= 0 or self.sweeps <= 0:
            raise BadInput(f"{self.mnemonic}: {self.count} accesses x {self.sweeps} sweeps",
                           "use a working set of at least one word")
        if self.op not in OPS:
            raise BadInput(f"{self.mnemonic}: unknown op {self.op!r}", "use " + ", ".join(OPS))
        if self.op == "mixed" and self.store_every < 1:
            raise BadInput(f"{self.mnemonic}: mixed needs store_every >= 1", fix)
        if self.coherence is not None and self.coherence not in COHERENCE:
            raise BadInput(f"{self.mnemonic}: coherence {self.coherence!r}",
                           "use clean, shared or dirty")
        if min(self.bases_bytes) < 0 or any(b % self.word_bytes for b in self.bases_bytes):
            raise BadInput(f"{self.mnemonic}: bases {self.bases_bytes}",
                           "bases are non-negative whole words")

    # Sizes ---------------------------------------------------------------------------------

    @property
    def stride_bytes(self) -> int:
        return self.stride_words * self.word_bytes

    @property
    def span_bytes(self) -> int:
        """Bytes from a processor's first to past its last word (its working set)."""
        return (self.count - 1) * self.stride_bytes + self.word_bytes

    @property
    def end_bytes(self) -> int:
        """Offset past the last word any processor touches: the region must be this large."""
        return max(self.bases_bytes) + self.span_bytes

    @property
    def accesses_per_element(self) -> int:
        return 2 if self.op == "rmw" else 1

    @property
    def accesses_per_proc(self) -> int:
        """Memory accesses (loads + stores) of one processor in one superstep."""
        return self.count * self.sweeps * self.accesses_per_element

    @property
    def helper(self) -> bool:
        """Whether a non-timed helper processor prepares the data (coherence with p=1)."""
        return self.coherence is not None and self.procs == 1

    @property
    def cpus_needed(self) -> int:
        return self.procs + int(self.helper)

    def to_json(self) -> dict[str, object]:
        return {
            "mnemonic": self.mnemonic, "suite": self.suite, "procs": self.procs,
            "stride_words": self.stride_words, "word_bytes": self.word_bytes,
            "bkc": float(self.bkc), "bkc_fraction": fmt_bkc(self.bkc), "op": self.op,
            "mode": self.mode, "level": self.level, "coherence": self.coherence,
            "store_every": self.store_every or None, "ws_factor": self.ws_factor,
            "ws_ref": self.ws_ref, "bases_bytes": list(self.bases_bytes),
            "count": self.count, "sweeps": self.sweeps, "span_bytes": self.span_bytes,
            "accesses_per_proc": self.accesses_per_proc,
            "banks_touched": [sorted(b) for b in self.banks],
        }


# --------------------------------------------------------------------------------------------
# Exact per-pattern quantities (BSP parameters, banks)


def bank_histogram(base: int, count: int, stride_bytes: int, bank_map: BankMap) -> list[int]:
    """Accesses per bank of ``base + i * stride_bytes`` for i < count, exactly.

    The bank sequence repeats every ``banks * interleave / gcd(stride, banks * interleave)``
    accesses, so one period is counted and scaled."""
    cycle = bank_map.banks * bank_map.interleave_bytes
    period = cycle // math.gcd(stride_bytes, cycle) if stride_bytes else 1
    hist = [0] * bank_map.banks
    full, rest = divmod(count, period)
    for i in range(min(count, period)):
        b = bank_map.bank(base + i * stride_bytes)
        hist[b] += full + (1 if i < rest else 0)
    return hist


def banks_touched(base: int, count: int, stride_bytes: int, bank_map: BankMap) -> frozenset[int]:
    return frozenset(b for b, n in enumerate(bank_histogram(base, count, stride_bytes, bank_map))
                     if n)


def max_word_sharing(bases: Sequence[int], count: int, stride_bytes: int) -> int:
    """The largest number of processors whose streams ``bases[k] + i * stride`` (i < count)
    contain one same address. Streams of equal stride meet only when their bases are congruent
    modulo the stride; then it is the deepest overlap of the index intervals."""
    groups: dict[int, list[int]] = {}
    for b in bases:
        groups.setdefault(b % stride_bytes, []).append(b // stride_bytes)
    best = 0
    for starts in groups.values():
        events = sorted([(s, 1) for s in starts] + [(s + count, -1) for s in starts])
        depth = 0
        for _, d in events:  # ends sort before starts at the same index (-1 < 1)
            depth += d
            best = max(best, depth)
    return best


@dataclass(frozen=True)
class BspQuantities:
    """Seed 004 section 4.1, per superstep: H (max accesses by one processor), K (max accesses
    to one word by all processors), M (all accesses), M_b (max accesses to one bank)."""

    H: int
    K: int
    M: int
    M_b: int

    def to_json(self) -> dict[str, int]:
        return {"H": self.H, "K": self.K, "M": self.M, "M_b": self.M_b}


def bsp_quantities(pattern: Pattern, bank_map: BankMap) -> BspQuantities:
    per_elem = pattern.accesses_per_element * pattern.sweeps
    h = pattern.accesses_per_proc
    per_bank = [0] * bank_map.banks
    for base in pattern.bases_bytes:
        for b, n in enumerate(bank_histogram(base, pattern.count, pattern.stride_bytes,
                                             bank_map)):
            per_bank[b] += n * per_elem
    k = max_word_sharing(pattern.bases_bytes, pattern.count, pattern.stride_bytes) * per_elem
    return BspQuantities(h, k, h * pattern.procs, max(per_bank))


def round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def region_bytes(patterns: Iterable[Pattern], page_bytes: int) -> int:
    """Size of the shared region every pattern fits in, rounded to pages."""
    return round_up(max((p.end_bytes for p in patterns), default=page_bytes), page_bytes)


def with_min_accesses(pattern: Pattern, min_accesses: int) -> Pattern:
    """The same pattern with its sweeps per superstep recomputed."""
    return replace(pattern, sweeps=max(1, -(-min_accesses // pattern.count)))


__all__ = ["BspQuantities", "COHERENCE", "COHERENT_MAX_PROCS", "HOST_BANKS", "Machine", "OPS",
           "PAPER_BANKS_PROVENANCE", "Pattern", "SUITES", "bank_histogram", "banks_touched",
           "bsp_quantities", "fmt_bkc", "host_machine", "max_word_sharing", "paper_machine",
           "planned_machine", "region_bytes"]
