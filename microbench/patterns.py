"""A microbench pattern (:class:`Pattern`: processors, stride, span, op, mode, the level meant
to serve it, its sweeps) and the node it runs on (:class:`counterd.machine.views.NodeView`, the
view of the machine record a run needs: CPUs in rank order, geometry, bank map, memory layout;
:func:`host_machine`, :func:`planned_machine`, :func:`paper_machine`), with what a pattern
does to the banks (:func:`bank_histogram`, :func:`bsp_quantities`). The patterns a machine
gets, Table 1 of seed 004 generalised and a validation suite, are :mod:`microbench.catalogue`'s.
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
from counterd.machine.memory import HOST_BANKS, SGI_BANKS, BankMap
from counterd.machine.views import COHERENT_MAX_PROCS, NodeView

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


# --------------------------------------------------------------------------------------------
# The nodes patterns run on (views of the machine record)


def paper_machine() -> NodeView:
    """The seed's SGI Power Challenge: 8 R10000s, 32K L1 / 1M L2, 8 banks x 128 B, 4 B words
    (a machine given by hand: no memory layout, so its results carry no ``memory``)."""
    return NodeView("SGI Power Challenge (Amato et al., section 2)", tuple(range(8)),
                    SGI_POWER_CHALLENGE, SGI_BANKS, PAPER_BANKS_PROVENANCE, word_bytes=4)


def host_machine(geometry: Geometry | None = None, bank_map: BankMap | None = None,
                 bank_provenance: str | None = None) -> NodeView:
    """This host: the CPUs this process may run on, in the order the machine's NUMA layout
    pins a program's ranks (:meth:`counterd.machine.memory.MemoryLayout.spread`: round-robin over
    the NUMA nodes, so a p-processor pattern has p / nodes processors on each); the geometry,
    bank map and page size of the machine description (:func:`counterd.machine.current`:
    sysfs, or a machine file), each overridable here (:meth:`NodeView.of`)."""
    described = current_machine()
    cpus = described.memory.spread(os.sched_getaffinity(0))
    return NodeView.of(described, cpus, geometry=geometry, bank_map=bank_map,
                       bank_provenance=bank_provenance)


def planned_machine(geometry: Geometry | None = None, bank_map: BankMap | None = None,
                    bank_provenance: str | None = None) -> NodeView:
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


__all__ = ["BspQuantities", "COHERENCE", "COHERENT_MAX_PROCS", "HOST_BANKS", "NodeView", "OPS",
           "PAPER_BANKS_PROVENANCE", "Pattern", "SUITES", "bank_histogram", "banks_touched",
           "bsp_quantities", "fmt_bkc", "host_machine", "max_word_sharing", "paper_machine",
           "planned_machine", "region_bytes"]
