"""The ``sim`` backend: count what a known address stream does to a cache hierarchy.

DESIGN.md section 4 ("sim"): for programs whose address stream is known (every microbenchmark),
simulate the host's cache hierarchy, count per processor and per memory bank, and mark every
value ``simulated``. Seed 004 needs per-bank counts LM(b) (L2 misses served by bank b) and
WB(b) (writebacks to bank b) for its F3 and DXBSP functions (seed 004 section 4.2); on real
hardware they "must be inferred ... from code inspection", which is what this module does.

Model, per processor (the same in both engines; the Python engine is the specification):

* a hierarchy of write-back, write-allocate, LRU set-associative caches, non-inclusive: a miss
  at level k fetches the line from level k+1 (the last level fetches from memory, counted in
  LM of the line's bank); the new line is inserted most-recently-used; if the evicted (LRU)
  line is dirty it is written into level k+1 and counted as a writeback of level k (the last
  level's writebacks go to memory, counted in WB of the line's bank);
* a writeback arriving at level k+1 that hits marks the line dirty without changing the LRU
  order (a writeback is not a use of the data); one that misses is allocated like a store
  (the rest of the line is fetched from below, as it must be when lines grow between levels,
  e.g. 32 B L1 lines into 128 B L2 lines on the seed's SGI machine) and is counted in
  ``wb_misses``. Canonical ``lN_misses`` count both kinds of miss, as pycachesim does;
* an access touches the line that holds its first byte (the kernels' naturally aligned words
  never straddle lines); ``rmw`` is a load and then a store to the same address;
* a data TLB: LRU set-associative over page numbers, looked up by every load and store;
* cache state persists across streams (warm caches), as on hardware; ``flush()`` writes every
  dirty line back (counted) and leaves the lines valid and clean;
* addresses are full 64-bit values (pycachesim truncates them to 32 bits, its issue 15, which
  is why it is only the tests' cross-check, fed offsets below 4 GiB).

Several processors, independent (:func:`simulate`, ``coherence=False``): each has private
caches and no coherence is simulated, so concurrent-sharing effects "appear in time but not in
simulated counters" (DESIGN.md section 4). Levels that sysfs lists as shared between CPUs (the
host's L3) are, by default, given to every processor as a private full-size copy
(``shared="copy"``: what one processor sees when it runs alone); ``shared="split"`` gives each
its share of the ways instead.

Several processors, coherent (:class:`CoherentSim`, ``simulate(..., coherence=True)``):

* the leading levels whose sysfs ``shared_cpus`` name at most one CPU (or are unknown) are
  private to each processor; the first level shared between CPUs and every level below it are
  one cache shared by all the simulated processors (one set of lines, one LRU order), each
  processor counting its own requests to it (its ``lN_misses``, LM(b), WB(b));
* the processors' streams are interleaved round-robin, ``chunk`` accesses of processor 0, then
  of 1, ..., (an ``rmw`` is one access) until all are done; streams separated by a barrier are
  fed as separate phases (:meth:`CoherentSim.feed`). Real concurrent execution interleaves at
  the grain of a few accesses; the default :data:`DEFAULT_CHUNK` = 8 is one 64 B line of 8 B
  words at stride 1, i.e. a processor that owns a line keeps it for the accesses it makes to it
  in a row (store buffers and ownership hold times give that much on hardware), and strided
  sweeps with larger strides alternate at every line;
* an invalidation protocol (MSI over the private levels; a private copy is dirty = M, clean =
  S): before a load or store by processor i, every other processor's private levels are
  snooped for the line (each level in its own line size). A store invalidates every copy
  (``invalidations`` of the owner +1, once per store whatever the number of its levels held
  the line); a load makes dirty copies clean. Each dirty copy found counts a writeback of its
  level; for a load the data also goes to the first shared level (a writeback arriving there,
  or to memory when there is none), since M -> S updates memory; for a store it moves to i only.
  When a dirty copy was found, i's access misses in all its private levels (it has no copy:
  a dirty line has no other copies) and the fill is served by a cache-to-cache transfer: the
  shared levels and memory are not asked, and ``coherence_misses`` of i +1. Misses caused by
  invalidations are ordinary misses in ``lN_misses``, as on hardware;
* not modelled: exclusive (E) state and silent upgrades (a store hitting a clean shared copy
  is a hit that invalidates the others), MESIF/MOESI forwarding of clean lines (a miss on a
  line another processor holds clean is served from the shared level or memory), upgrade
  requests as misses, single-line flushes, timing of the interleaving (it is a fixed
  round-robin, not a race), and false sharing across different line sizes (each level
  invalidates its own line, exact when private line sizes are equal).
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from counterd import _native
from counterd.backends.base import THIS_THREAD, Capability, CounterValue, Reading, Target
from counterd.errors import BadInput
from counterd.events import NAMES, Source, check_names
from counterd.host import parse_size, read_caches

Kind = Literal["load", "store", "rmw"]
EngineName = Literal["native", "python"]

# Codes of access kinds in AddressStream.kinds; cachesim.c has the same enum.
KIND_CODES: dict[str, int] = {"load": 0, "store": 1, "rmw": 2}
KIND_NAMES: tuple[Kind, ...] = ("load", "store", "rmw")

# Per-level counters, in the order of cachesim.c's enum.
LEVEL_FIELDS = ("hits", "misses", "wb_hits", "wb_misses", "writebacks")
_HITS, _MISSES, _WB_HITS, _WB_MISSES, _WRITEBACKS = range(5)
_READ, _WRITE, _WB = range(3)

# The microbenchmark kernels (counterd/_native/kernels.c) index uint64_t words.
KERNEL_WORD_BYTES = 8
_KERNEL_KINDS: dict[str, Kind] = {"load_stride": "load", "store_stride": "store",
                                  "rmw_stride": "rmw"}

# sysfs has no TLB geometry; these defaults are used unless the caller gives values.
DEFAULT_PAGE_BYTES = 4096
DEFAULT_TLB_ENTRIES = 64
DEFAULT_TLB_WAYS = 4
_TLB_NOTE = (f"DTLB not in sysfs: default {DEFAULT_TLB_ENTRIES} entries "
             f"{DEFAULT_TLB_WAYS}-way, {DEFAULT_PAGE_BYTES // 1024} KiB pages")

MAX_LEVELS = 8  # CS_MAX_LEVELS in cachesim.c
DEFAULT_CHUNK = 8  # accesses per turn when coherent processors interleave (module doc)
_U64 = 1 << 64

UNSUPPORTED_REASON = "simulation counts memory accesses, not time or instructions"
_LEVEL_PREFIX = {1: "l1d", 2: "l2", 3: "l3"}
# Canonical counters simulation gives: per cache level (when the geometry has it) and these.
_LEVEL_COUNTERS = {f"{p}_{what}": lv for lv, p in _LEVEL_PREFIX.items()
                   for what in ("misses", "writebacks")}
_OTHER_MEMORY_COUNTERS = ("loads", "stores", "dtlb_misses")


# --------------------------------------------------------------------------------------------
# Geometry


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _fmt_size(n: int) -> str:
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


@dataclass(frozen=True)
class CacheLevel:
    """One data (or unified) cache level. ``shared_cpus``: the CPUs sharing it (sysfs
    ``shared_cpu_list``), empty when unknown."""

    level: int
    size_bytes: int
    ways: int
    line_bytes: int
    shared_cpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.level < 1 or self.size_bytes <= 0 or self.ways <= 0:
            raise BadInput(f"invalid cache level {self}", "level >= 1, size and ways > 0")
        if not _is_pow2(self.line_bytes) or self.line_bytes < 2:
            raise BadInput(f"L{self.level} line size {self.line_bytes} B is not a power of two",
                           "use the coherency_line_size sysfs reports (e.g. 64)")
        if self.size_bytes % (self.ways * self.line_bytes):
            raise BadInput(f"L{self.level}: {self.size_bytes} B is not ways x line x sets "
                           f"({self.ways} x {self.line_bytes} B x an integer)",
                           "check size, ways and line size")

    @property
    def sets(self) -> int:
        return self.size_bytes // (self.ways * self.line_bytes)

    def spec(self) -> str:
        return f"L{self.level}={_fmt_size(self.size_bytes)}/{self.ways}/{self.line_bytes}"


@dataclass(frozen=True)
class Geometry:
    """A processor's data-side hierarchy plus its DTLB. ``source`` says where it came from.

    Override single values with ``dataclasses.replace`` (e.g. ``replace(g, tlb_entries=1536)``)
    or build one from a spec with :meth:`from_spec`.
    """

    levels: tuple[CacheLevel, ...]
    page_bytes: int = DEFAULT_PAGE_BYTES
    tlb_entries: int = DEFAULT_TLB_ENTRIES
    tlb_ways: int = DEFAULT_TLB_WAYS
    source: str = "given"

    def __post_init__(self) -> None:
        fix = "give levels L1, L2, ... in order, line sizes not shrinking towards memory"
        if not self.levels or len(self.levels) > MAX_LEVELS:
            raise BadInput(f"a geometry needs 1 to {MAX_LEVELS} cache levels", fix)
        for i, lv in enumerate(self.levels):
            if lv.level != i + 1:
                raise BadInput(f"cache levels are numbered {[x.level for x in self.levels]}", fix)
            # A line of level k must fit in one line of level k+1: a fill or writeback from
            # level k is then exactly one request below (the SGI's 32 B L1 -> 128 B L2 is fine).
            if i and lv.line_bytes < self.levels[i - 1].line_bytes:
                raise BadInput(f"L{lv.level} line ({lv.line_bytes} B) is smaller than "
                               f"L{lv.level - 1}'s ({self.levels[i - 1].line_bytes} B)", fix)
        if not _is_pow2(self.page_bytes) or self.page_bytes < 2:
            raise BadInput(f"page size {self.page_bytes} B is not a power of two", "e.g. 4K")
        if self.tlb_entries <= 0 or self.tlb_ways <= 0 or self.tlb_entries % self.tlb_ways:
            raise BadInput(f"TLB of {self.tlb_entries} entries, {self.tlb_ways}-way",
                           "entries must be a positive multiple of ways")

    @property
    def private_levels(self) -> int:
        """How many leading levels are private to one CPU (sysfs ``shared_cpus`` of at most one
        CPU, or unknown); the rest are one cache shared by a coherent system's processors."""
        n = 0
        for lv in self.levels:
            if len(lv.shared_cpus) > 1:
                break
            n += 1
        return n

    @property
    def tlb_sets(self) -> int:
        return self.tlb_entries // self.tlb_ways

    def spec(self) -> str:
        """The :meth:`from_spec` string that rebuilds this geometry (without shared_cpus)."""
        parts = [lv.spec() for lv in self.levels]
        parts.append(f"tlb={self.tlb_entries}/{self.tlb_ways}")
        parts.append(f"page={_fmt_size(self.page_bytes)}")
        return ",".join(parts)

    @classmethod
    def from_spec(cls, spec: str, source: str | None = None) -> Geometry:
        """Parse ``"L1=32K/2/32,L2=1M/2/128[,tlb=64/4][,page=4K]"`` (size/ways/line bytes).

        Missing tlb/page take the documented defaults (64 entries 4-way, 4 KiB pages).
        """
        levels: list[CacheLevel] = []
        extra: dict[str, int] = {}
        fix = 'write e.g. "L1=32K/2/32,L2=1M/2/128,tlb=64/4,page=4K"'
        for item in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            fields = value.split("/")
            try:
                if re.fullmatch(r"l\d", key) and len(fields) == 3:
                    levels.append(CacheLevel(int(key[1:]), parse_size(fields[0]),
                                             int(fields[1]), parse_size(fields[2])))
                elif key == "tlb" and len(fields) == 2:
                    extra["tlb_entries"], extra["tlb_ways"] = int(fields[0]), int(fields[1])
                elif key == "page" and len(fields) == 1:
                    extra["page_bytes"] = parse_size(fields[0])
                else:
                    raise ValueError(item)
            except ValueError:
                raise BadInput(f"cannot read {item!r} in geometry spec {spec!r}", fix) from None
        levels.sort(key=lambda lv: lv.level)
        notes = [] if "tlb_entries" in extra else [_TLB_NOTE]
        return cls(tuple(levels), source=source or "; ".join([f"spec {spec!r}", *notes]),
                   **extra)

    @classmethod
    def from_sysfs(cls, sysfs_root: str | Path = "/sys", cpu: int = 0, *,
                   page_bytes: int = DEFAULT_PAGE_BYTES, tlb_entries: int = DEFAULT_TLB_ENTRIES,
                   tlb_ways: int = DEFAULT_TLB_WAYS) -> Geometry:
        """Read cpuN's Data and Unified caches from ``<root>/devices/system/cpu/cpuN/cache``.

        The DTLB is not described in sysfs: the defaults (or the given values) are used and
        ``source`` says so. Raises BadInput, with the fix, when sysfs cannot be read.
        """
        base = Path(sysfs_root) / "devices" / "system" / "cpu" / f"cpu{cpu}" / "cache"
        fix = ('mount sysfs, or give the geometry explicitly, e.g. '
               'Geometry.from_spec("L1=48K/12/64,L2=2M/16/64") or SimBackend(geometry=...)')
        try:
            caches = read_caches(sysfs_root, cpu)
        except BadInput as exc:
            raise BadInput(exc.what, fix) from exc
        levels: dict[int, CacheLevel] = {}
        for c in caches:
            if c.kind not in ("Data", "Unified"):
                continue
            if c.level in levels:
                raise BadInput(f"{base} lists two data caches at level {c.level}", fix)
            levels[c.level] = CacheLevel(c.level, c.size_bytes, c.ways, c.line_bytes,
                                         c.shared_cpus)
        if not levels:
            raise BadInput(f"no data or unified caches found under {base}", fix)
        return cls(tuple(levels[k] for k in sorted(levels)), page_bytes, tlb_entries, tlb_ways,
                   source=f"sysfs {base}; {_TLB_NOTE}")

    @classmethod
    def host(cls, sysfs_root: str | Path = "/sys", cpu: int = 0) -> Geometry:
        """This host's geometry from sysfs, or :data:`FALLBACK_GEOMETRY` (with the reason in
        ``source``) when sysfs cannot be read. Never raises."""
        try:
            return cls.from_sysfs(sysfs_root, cpu)
        except BadInput as exc:
            return dataclasses.replace(
                FALLBACK_GEOMETRY,
                source=f"fallback {FALLBACK_GEOMETRY.spec()} because sysfs failed ({exc})")

    def split_shared(self, processors: int) -> Geometry:
        """Give each of ``processors`` its share of every level sysfs lists as shared: the
        ways are divided among min(processors, sharers) (at least one way is kept)."""
        levels = []
        for lv in self.levels:
            k = min(processors, len(lv.shared_cpus))
            if k > 1:
                ways = max(1, lv.ways // k)
                lv = dataclasses.replace(lv, ways=ways, size_bytes=lv.sets * ways * lv.line_bytes)
            levels.append(lv)
        return dataclasses.replace(self, levels=tuple(levels),
                                   source=f"{self.source}; shared levels split {processors} ways")


# Used by Geometry.host() when sysfs is unreadable: a common x86 server core's L1d/L2/L3.
FALLBACK_GEOMETRY = Geometry.from_spec("L1=32K/8/64,L2=1M/16/64,L3=32M/16/64",
                                       source="fallback")

# Seed 004 section 2: SGI Power Challenge, R10000: 32 KB L1 data cache with 32 B lines, 1 MB
# L2 with 128 B lines, both 2-way (R10000 manual); 8 memory banks interleaved on 128 B (see
# SGI_BANKS). The seed gives no TLB or page size: the defaults are used.
SGI_POWER_CHALLENGE = Geometry.from_spec(
    "L1=32K/2/32,L2=1M/2/128",
    source=f"seed 004 section 2 (SGI Power Challenge, MIPS R10000); {_TLB_NOTE}")


# --------------------------------------------------------------------------------------------
# Banks and streams


@dataclass(frozen=True)
class BankMap:
    """Memory bank of an address: ``bank = (address // interleave_bytes) % banks`` (DESIGN.md
    section 3). A line is counted at the bank of its first byte."""

    banks: int = 8
    interleave_bytes: int = 128

    def __post_init__(self) -> None:
        if self.banks <= 0 or self.interleave_bytes <= 0:
            raise BadInput(f"invalid bank map {self}", "banks and interleave_bytes must be > 0")

    def bank(self, address: int) -> int:
        return (address // self.interleave_bytes) % self.banks

    def banks_of(self, addresses: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`bank` over uint64 addresses."""
        a = np.asarray(addresses, dtype=np.uint64)
        return (a // np.uint64(self.interleave_bytes)) % np.uint64(self.banks)


# Seed 004 section 2: "8-way interleaved ... main memory distributed across 8 banks"; the
# interleave unit is taken to be the 128 B L2 line, which reproduces Table 1 (tests).
SGI_BANKS = BankMap(8, 128)

# This host's memory banks are not discoverable without a PMU that samples addresses, so the
# host map is declared. 8 banks x 256 B keeps the paper's arithmetic with the host's 8 B words
# (one interleave unit = 32 words, as 128 B / 4 B on the SGI), and 256 B is the default
# channel-interleave granularity of current Xeon SP platforms; the address hashing real
# controllers apply is not modelled.
HOST_BANKS = BankMap(8, 256)
HOST_BANKS_PROVENANCE = ("assumed: 8 banks interleaved on 256 B (bank = address // 256 % 8 of "
                         "the offset in the benchmark's page-aligned region); the host's real "
                         "channel/bank interleave is not discoverable; 256 B is a common channel-"
                         "interleave granularity and keeps Table 1's 32-word bank unit with 8 B "
                         "words; controller address hashing is not modelled")


@dataclass(frozen=True)
class StridedStream:
    """``for r < reps: for i < count: access(base + i*stride_bytes)`` of ``kind``.

    The loop nest of the microbenchmark kernels (kernels.c), with the stride in bytes; see
    :meth:`from_kernel` for their word strides.
    """

    base: int
    count: int
    stride_bytes: int
    kind: Kind = "load"
    reps: int = 1
    elem_bytes: int = 8

    def __post_init__(self) -> None:
        if self.kind not in KIND_CODES:
            raise BadInput(f"unknown access kind {self.kind!r}", "use load, store or rmw")
        if min(self.base, self.count, self.stride_bytes, self.reps) < 0 or self.elem_bytes <= 0:
            raise BadInput(f"invalid stream {self}", "base, count, stride, reps must be >= 0")
        if self.count and self.base + (self.count - 1) * self.stride_bytes + self.elem_bytes > _U64:
            raise BadInput(f"stream {self} runs past the 64-bit address space",
                           "lower base, count or stride")

    @classmethod
    def from_kernel(cls, kernel: str, n: int, stride_words: int, reps: int,
                    base: int) -> StridedStream:
        """The stream ``counterd_<kernel>(base, n, stride_words, reps)`` executes, for kernel
        ``load_stride``, ``store_stride`` or ``rmw_stride`` (the ``counterd_`` prefix is
        optional). ``base`` is the array's address, e.g. ``array.ctypes.data``."""
        name = kernel.removeprefix("counterd_")
        if name not in _KERNEL_KINDS:
            raise BadInput(f"unknown kernel {kernel!r}", "choose from " + ", ".join(_KERNEL_KINDS))
        return cls(base, n, stride_words * KERNEL_WORD_BYTES, _KERNEL_KINDS[name], reps,
                   KERNEL_WORD_BYTES)

    def __len__(self) -> int:
        return self.count * self.reps

    def addresses(self) -> np.ndarray:
        """All addresses in order (reps times), uint64."""
        one = np.uint64(self.base) + np.arange(self.count, dtype=np.uint64) * np.uint64(
            self.stride_bytes)
        return np.tile(one, self.reps)

    def expand(self) -> AddressStream:
        return AddressStream(self.addresses(), np.full(len(self), KIND_CODES[self.kind], np.uint8))


@dataclass(frozen=True, eq=False)
class AddressStream:
    """The general form: ``addresses[i]`` (uint64) accessed as ``kinds[i]`` (0 load, 1 store,
    2 rmw; see KIND_CODES). Arrays are converted to contiguous uint64/uint8 on construction."""

    addresses: np.ndarray
    kinds: np.ndarray

    def __post_init__(self) -> None:
        a = np.ascontiguousarray(self.addresses, dtype=np.uint64)
        k = np.ascontiguousarray(self.kinds, dtype=np.uint8)
        if a.ndim != 1 or k.shape != a.shape:
            raise BadInput(f"addresses {a.shape} and kinds {k.shape} differ",
                           "give two 1-D arrays of equal length")
        if k.size and int(k.max()) > 2:
            raise BadInput("kinds must be 0 (load), 1 (store) or 2 (rmw)", "see KIND_CODES")
        object.__setattr__(self, "addresses", a)
        object.__setattr__(self, "kinds", k)

    @classmethod
    def of(cls, addresses: Iterable[int], kinds: Iterable[str | int] | str) -> AddressStream:
        """Build from addresses and kind names or codes (one kind name for all)."""
        a = np.fromiter(addresses, dtype=np.uint64)
        if isinstance(kinds, str):
            k = np.full(a.size, KIND_CODES[kinds], np.uint8)
        else:
            k = np.array([KIND_CODES[x] if isinstance(x, str) else x for x in kinds], np.uint8)
        return cls(a, k)

    def __len__(self) -> int:
        return int(self.addresses.size)


Stream = StridedStream | AddressStream


# --------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class LevelCounts:
    """Counts of one cache level. ``hits``/``misses``: demand requests (loads and stores at L1,
    fills from the level above below it); ``wb_hits``/``wb_misses``: writebacks arriving from
    the level above; ``writebacks``: dirty lines this level evicted (or flushed), in its lines."""

    level: int
    hits: int = 0
    misses: int = 0
    wb_hits: int = 0
    wb_misses: int = 0
    writebacks: int = 0

    @property
    def total_misses(self) -> int:
        """Lines allocated on a miss, demand or writeback: canonical ``lN_misses``."""
        return self.misses + self.wb_misses


@dataclass(frozen=True)
class BankCounts:
    """Seed 004's LM(b) (last-level misses served by bank b) and WB(b) (last-level writebacks
    to bank b), in last-level lines."""

    lm: tuple[int, ...]
    wb: tuple[int, ...]

    def touched(self) -> frozenset[int]:
        """Banks that served a miss or received a writeback."""
        return frozenset(b for b, (m, w) in enumerate(zip(self.lm, self.wb, strict=True))
                         if m or w)

    def __add__(self, other: BankCounts) -> BankCounts:
        return BankCounts(tuple(a + b for a, b in zip(self.lm, other.lm, strict=True)),
                          tuple(a + b for a, b in zip(self.wb, other.wb, strict=True)))


@dataclass(frozen=True)
class ProcessorCounts:
    """Cumulative simulated counts of one processor. ``coherence_misses`` (demand misses served
    by a cache-to-cache transfer of another processor's dirty copy) and ``invalidations``
    (times another processor's store removed a line from this one's private levels) are
    counted by coherent systems only (:class:`CoherentSim`); they are not canonical counters:
    the misses they explain are already in ``lN_misses``."""

    loads: int
    stores: int
    dtlb_misses: int
    levels: tuple[LevelCounts, ...]
    banks: BankCounts
    coherence_misses: int = 0
    invalidations: int = 0

    def canonical(self) -> dict[str, int]:
        """Canonical counter name -> value (levels beyond L3 have no canonical name)."""
        out = {"loads": self.loads, "stores": self.stores, "dtlb_misses": self.dtlb_misses}
        for lv in self.levels:
            prefix = _LEVEL_PREFIX.get(lv.level)
            if prefix:
                out[f"{prefix}_misses"] = lv.total_misses
                out[f"{prefix}_writebacks"] = lv.writebacks
        return out


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` returns: per-processor counts and the per-bank totals."""

    processors: tuple[ProcessorCounts, ...]
    banks: BankCounts
    engine: EngineName
    geometry: Geometry
    bankmap: BankMap


def canonical_values(counts: ProcessorCounts,
                     events: Sequence[str] | None = None
                     ) -> tuple[dict[str, CounterValue], dict[str, str]]:
    """Canonical counters as ``CounterValue(source=SIMULATED)``, and the reasons for the asked
    ones that simulation cannot give. ``events=None``: every counter it can give."""
    known = counts.canonical()
    values: dict[str, CounterValue] = {}
    unsupported: dict[str, str] = {}
    for name in check_names(tuple(events) if events is not None else tuple(known)):
        if name in known:
            v = known[name]
            values[name] = CounterValue(float(v), Source.SIMULATED, 1.0, v)
        elif name in _LEVEL_COUNTERS:
            unsupported[name] = f"the simulated geometry has no L{_LEVEL_COUNTERS[name]}"
        else:
            unsupported[name] = UNSUPPORTED_REASON
    return values, unsupported


# --------------------------------------------------------------------------------------------
# Engines


class _PythonEngine:
    """The executable specification: MRU-first lists per set, straight from the module doc."""

    name: EngineName = "python"

    def __init__(self, geometry: Geometry, bankmap: BankMap, *, coherent: bool = False,
                 shared_from: _PythonEngine | None = None) -> None:
        self.g = geometry
        self.bankmap = bankmap
        self.sets: list[dict[int, list[list[int]]]] = [{} for _ in geometry.levels]
        # Coherence (module doc): a system's processors share the sets of levels npriv.. and
        # list each other in peers; an independent processor is its own only peer.
        self.npriv = len(geometry.levels)
        self.peers: list[_PythonEngine] = [self]
        if coherent:
            self.npriv = geometry.private_levels
        if shared_from is not None:
            self.sets[self.npriv:] = shared_from.sets[self.npriv:]
        self.pending: int | None = None  # line a cache-to-cache transfer will fill
        self.coherence_misses = 0
        self.invalidations = 0
        self.counts = [[0] * len(LEVEL_FIELDS) for _ in geometry.levels]
        self.tlb: dict[int, list[int]] = {}
        self.tlb_misses = 0
        self.loads = 0
        self.stores = 0
        self.lm = [0] * bankmap.banks
        self.wb = [0] * bankmap.banks

    def _access(self, k: int, addr: int, op: int) -> None:
        if (k == self.npriv and op == _READ and self.pending is not None
                and addr // self.g.levels[k - 1].line_bytes == self.pending):
            self.coherence_misses += 1  # cache-to-cache transfer: shared levels not asked
            self.pending = None
            return
        if k == len(self.g.levels):  # memory
            bank = self.bankmap.bank(addr)
            if op == _WB:
                self.wb[bank] += 1
            else:
                self.lm[bank] += 1
            return
        level = self.g.levels[k]
        counts = self.counts[k]
        line = addr // level.line_bytes
        ways = self.sets[k].setdefault(line % level.sets, [])  # entries [line, dirty], MRU first
        for i, entry in enumerate(ways):
            if entry[0] == line:
                if op == _WB:
                    counts[_WB_HITS] += 1
                    entry[1] = 1  # a writeback is not a use: the LRU order stays
                else:
                    counts[_HITS] += 1
                    del ways[i]
                    ways.insert(0, entry)
                    if op == _WRITE:
                        entry[1] = 1
                return
        counts[_WB_MISSES if op == _WB else _MISSES] += 1
        self._access(k + 1, line * level.line_bytes, _READ)  # fetch (write-allocate too)
        ways.insert(0, [line, int(op != _READ)])
        if len(ways) > level.ways:
            victim_line, victim_dirty = ways.pop()
            if victim_dirty:
                counts[_WRITEBACKS] += 1
                self._access(k + 1, victim_line * level.line_bytes, _WB)

    def _tlb(self, addr: int) -> None:
        page = addr // self.g.page_bytes
        entries = self.tlb.setdefault(page % self.g.tlb_sets, [])  # MRU first
        if page in entries:
            entries.remove(page)
        else:
            self.tlb_misses += 1
            if len(entries) == self.g.tlb_ways:
                entries.pop()
        entries.insert(0, page)

    def _snoop(self, addr: int, store: bool) -> bool:
        """Other processors' private copies of addr's line: a store invalidates them, a load
        cleans dirty ones (module doc). Whether any copy was dirty (then: a transfer)."""
        found_dirty = False
        last = self.g.levels[self.npriv - 1].line_bytes
        for o in self.peers:
            if o is self:
                continue
            held = was_dirty = False
            for k in range(o.npriv):
                level = o.g.levels[k]
                line = addr // level.line_bytes
                ways = o.sets[k].get(line % level.sets, [])
                for i, entry in enumerate(ways):
                    if entry[0] == line:
                        held = True
                        if entry[1]:
                            o.counts[k][_WRITEBACKS] += 1
                            entry[1] = 0
                            was_dirty = True
                        if store:
                            del ways[i]
                        break
            if store and held:
                o.invalidations += 1
            if was_dirty:
                found_dirty = True
                if not store:  # M -> S: the data also goes to the shared level (or memory)
                    o._access(o.npriv, addr // last * last, _WB)
        return found_dirty

    def _demand(self, addr: int, op: int) -> None:
        self._tlb(addr)
        if len(self.peers) > 1 and self.npriv > 0 and self._snoop(addr, op == _WRITE):
            self.pending = addr // self.g.levels[self.npriv - 1].line_bytes
        self._access(0, addr, op)
        self.pending = None

    def _one(self, addr: int, kind: int) -> None:
        if kind != KIND_CODES["store"]:
            self.loads += 1
            self._demand(addr, _READ)
        if kind != KIND_CODES["load"]:
            self.stores += 1
            self._demand(addr, _WRITE)

    def feed(self, stream: Stream) -> None:
        if isinstance(stream, StridedStream):
            code = KIND_CODES[stream.kind]
            for _ in range(stream.reps):
                for i in range(stream.count):
                    self._one(stream.base + i * stream.stride_bytes, code)
        else:
            for addr, kind in zip(stream.addresses.tolist(), stream.kinds.tolist(), strict=True):
                self._one(addr, kind)

    def flush(self) -> None:
        for k, level in enumerate(self.g.levels):
            for s in sorted(self.sets[k]):
                for entry in reversed(self.sets[k][s]):  # least recently used first
                    if entry[1]:
                        entry[1] = 0
                        self.counts[k][_WRITEBACKS] += 1
                        self._access(k + 1, entry[0] * level.line_bytes, _WB)

    def result(self) -> ProcessorCounts:
        levels = tuple(LevelCounts(lv.level, *c) for lv, c in zip(self.g.levels, self.counts,
                                                                    strict=True))
        return ProcessorCounts(self.loads, self.stores, self.tlb_misses, levels,
                               BankCounts(tuple(self.lm), tuple(self.wb)),
                               self.coherence_misses, self.invalidations)


class _CLevel(ctypes.Structure):
    _fields_ = [("sets", ctypes.c_uint64), ("ways", ctypes.c_uint64),
                ("line_bytes", ctypes.c_uint64), ("tags", ctypes.c_void_p),
                ("stamps", ctypes.c_void_p), ("dirty", ctypes.c_void_p),
                ("counts", ctypes.c_void_p)]


class _CState(ctypes.Structure):
    """Mirror of cs_state in cachesim.c (size checked at load time)."""

    _fields_ = [("nlevels", ctypes.c_int64), ("level", _CLevel * MAX_LEVELS), ("tlb", _CLevel),
                ("banks", ctypes.c_uint64), ("interleave", ctypes.c_uint64),
                ("lm", ctypes.c_void_p), ("wb", ctypes.c_void_p), ("clock", ctypes.c_void_p),
                ("loads", ctypes.c_uint64), ("stores", ctypes.c_uint64),
                ("npriv", ctypes.c_int64), ("nprocs", ctypes.c_int64),
                ("procs", ctypes.c_void_p), ("pending", ctypes.c_uint64),
                ("has_pending", ctypes.c_int64), ("coherence_misses", ctypes.c_uint64),
                ("invalidations", ctypes.c_uint64)]


class _CSeg(ctypes.Structure):
    """Mirror of cs_seg in cachesim.c: one stream of a processor's part of a phase."""

    _fields_ = [("base", ctypes.c_uint64), ("count", ctypes.c_uint64),
                ("stride", ctypes.c_uint64), ("reps", ctypes.c_uint64),
                ("addrs", ctypes.c_void_p), ("kinds", ctypes.c_void_p),
                ("kind", ctypes.c_uint64)]


def native_status() -> tuple[bool, str]:
    """Whether the C engine can run here, and if not why (with the fix)."""
    lib = _native.lib()
    if lib is None:
        return False, _native.missing_reason()
    if not hasattr(lib, "counterd_cachesim_interleave"):
        return False, ("the native library predates cachesim.c (or its coherence): rebuild "
                       "it with pip install -e . (needs a C compiler)")
    size = lib.counterd_cachesim_state_size()
    if size != ctypes.sizeof(_CState):
        return False, (f"cachesim.c's state is {size} B but sim.py expects "
                       f"{ctypes.sizeof(_CState)} B: rebuild with pip install -e .")
    return True, "native library loaded"


class _NativeEngine:
    """cachesim.c over numpy-owned state, so caches stay warm between calls."""

    name: EngineName = "native"

    def __init__(self, geometry: Geometry, bankmap: BankMap, *, coherent: bool = False,
                 shared_from: _NativeEngine | None = None) -> None:
        self.g = geometry
        lib = _native.lib()
        if lib is None:  # CacheSim checks native_status() first
            raise RuntimeError(_native.missing_reason())
        self.lib: ctypes.CDLL = lib
        self._keep: list[np.ndarray] = []  # arrays the C state points into
        st = _CState()
        st.nlevels = len(geometry.levels)
        st.npriv, st.nprocs = len(geometry.levels), 1
        # A system's processors share the clock and the arrays of levels npriv.. (module doc).
        self.clock: np.ndarray = (np.zeros(1, np.uint64) if shared_from is None
                                  else shared_from.clock)
        st.clock = self.clock.ctypes.data
        if coherent:
            st.npriv = geometry.private_levels
        for i, lv in enumerate(geometry.levels):
            if shared_from is not None and i >= st.npriv:
                self._share_level(st.level[i], shared_from, i)
            else:
                self._fill_level(st.level[i], lv.sets, lv.ways, lv.line_bytes)
        self._fill_level(st.tlb, geometry.tlb_sets, geometry.tlb_ways, geometry.page_bytes)
        st.banks, st.interleave = bankmap.banks, bankmap.interleave_bytes
        self.lm = np.zeros(bankmap.banks, np.uint64)
        self.wb = np.zeros(bankmap.banks, np.uint64)
        st.lm, st.wb = self.lm.ctypes.data, self.wb.ctypes.data
        self.state = st
        self.addr = ctypes.addressof(st)

    def _fill_level(self, cl: _CLevel, sets: int, ways: int, line_bytes: int) -> None:
        tags = np.zeros(sets * ways, np.uint64)  # calloc'ed: untouched sets cost no memory
        stamps = np.zeros(sets * ways, np.uint64)
        dirty = np.zeros(sets * ways, np.uint8)
        counts = np.zeros(len(LEVEL_FIELDS), np.uint64)
        self._keep += [tags, stamps, dirty, counts]
        cl.sets, cl.ways, cl.line_bytes = sets, ways, line_bytes
        cl.tags, cl.stamps, cl.dirty = tags.ctypes.data, stamps.ctypes.data, dirty.ctypes.data
        cl.counts = counts.ctypes.data

    def _share_level(self, cl: _CLevel, other: _NativeEngine, i: int) -> None:
        tags, stamps, dirty = other._keep[4 * i: 4 * i + 3]
        counts = np.zeros(len(LEVEL_FIELDS), np.uint64)  # each processor counts its own
        self._keep += [tags, stamps, dirty, counts]
        src = other.state.level[i]
        cl.sets, cl.ways, cl.line_bytes = src.sets, src.ways, src.line_bytes
        cl.tags, cl.stamps, cl.dirty = src.tags, src.stamps, src.dirty
        cl.counts = counts.ctypes.data

    def feed(self, stream: Stream) -> None:
        if isinstance(stream, StridedStream):
            rc = self.lib.counterd_cachesim_strided(self.addr, stream.base, stream.count,
                                                    stream.stride_bytes,
                                                    KIND_CODES[stream.kind], stream.reps)
        else:
            rc = self.lib.counterd_cachesim_run(self.addr, stream.addresses.ctypes.data,
                                                stream.kinds.ctypes.data, len(stream))
        if rc != 0:  # kinds are validated on construction, so this is a bug, not bad input
            raise RuntimeError(f"cachesim.c rejected a stream (rc={rc})")

    def flush(self) -> None:
        self.lib.counterd_cachesim_flush(self.addr)

    def _counts(self, i: int) -> list[int]:
        return [int(x) for x in self._keep[4 * i + 3]]

    def result(self) -> ProcessorCounts:
        levels = tuple(LevelCounts(lv.level, *self._counts(i))
                       for i, lv in enumerate(self.g.levels))
        tlb = self._counts(len(self.g.levels))
        return ProcessorCounts(int(self.state.loads), int(self.state.stores), tlb[_MISSES],
                               levels, BankCounts(tuple(int(x) for x in self.lm),
                                                  tuple(int(x) for x in self.wb)),
                               int(self.state.coherence_misses),
                               int(self.state.invalidations))


class CacheSim:
    """One processor's simulated hierarchy. ``engine``: "auto" (native if built, else python),
    "native" (BadInput if unavailable) or "python". ``engine_name`` says which one runs."""

    def __init__(self, geometry: Geometry, bankmap: BankMap = SGI_BANKS,
                 engine: Literal["auto", "native", "python"] = "auto") -> None:
        if engine not in ("auto", "native", "python"):
            raise BadInput(f"unknown engine {engine!r}", "use auto, native or python")
        ok, why = native_status()
        if engine == "native" and not ok:
            raise BadInput(f"the native cache simulator is unavailable: {why}",
                           'use engine="python" or "auto"')
        use_native = ok and engine != "python"
        self.geometry = geometry
        self.bankmap = bankmap
        self._engine: _NativeEngine | _PythonEngine = (
            _NativeEngine(geometry, bankmap) if use_native else _PythonEngine(geometry, bankmap))

    @property
    def engine_name(self) -> EngineName:
        return self._engine.name

    def feed(self, stream: Stream | Iterable[Stream]) -> None:
        """Simulate a stream (or several, in order) on top of the current cache state."""
        for s in (stream,) if isinstance(stream, StridedStream | AddressStream) else stream:
            self._engine.feed(s)

    def flush(self) -> None:
        """Write back every dirty line (counted as writebacks); lines stay valid, now clean."""
        self._engine.flush()

    def counts(self) -> ProcessorCounts:
        return self._engine.result()


PhaseStreams = Sequence[Stream | Sequence[Stream] | None]


def _stream_list(streams: Stream | Sequence[Stream] | None) -> list[Stream]:
    if streams is None:
        return []
    if isinstance(streams, StridedStream | AddressStream):
        return [streams]
    return list(streams)


def _accesses(streams: Sequence[Stream]) -> Iterator[tuple[int, int]]:
    for s in streams:
        if isinstance(s, StridedStream):
            code = KIND_CODES[s.kind]
            for _ in range(s.reps):
                for i in range(s.count):
                    yield s.base + i * s.stride_bytes, code
        else:
            yield from zip(s.addresses.tolist(), s.kinds.tolist(), strict=True)


class CoherentSim:
    """``processors`` processors with private levels kept coherent by invalidation and shared
    levels that are one cache (module doc, "Several processors, coherent"). :meth:`feed` runs
    one phase (the streams between two barriers), interleaving the processors round-robin in
    turns of ``chunk`` accesses. ``engine`` as for :class:`CacheSim`."""

    def __init__(self, geometry: Geometry, processors: int, bankmap: BankMap = SGI_BANKS,
                 engine: Literal["auto", "native", "python"] = "auto", *,
                 chunk: int = DEFAULT_CHUNK) -> None:
        if processors < 1 or chunk < 1:
            raise BadInput(f"{processors} processors interleaved in turns of {chunk} accesses",
                           "give at least one processor and chunk >= 1")
        probe = CacheSim(geometry, bankmap, engine)  # validates engine, picks auto
        self.geometry, self.bankmap, self.chunk = geometry, bankmap, chunk
        self.engine_name: EngineName = probe.engine_name
        self._py: list[_PythonEngine] = []
        self._c: list[_NativeEngine] = []
        if self.engine_name == "python":
            first = _PythonEngine(geometry, bankmap, coherent=True)
            self._py = [first] + [_PythonEngine(geometry, bankmap, coherent=True,
                                                shared_from=first)
                                  for _ in range(processors - 1)]
            for e in self._py:
                e.peers = self._py
        else:
            c0 = _NativeEngine(geometry, bankmap, coherent=True)
            self._c = [c0] + [_NativeEngine(geometry, bankmap, coherent=True, shared_from=c0)
                              for _ in range(processors - 1)]
            self._procs = np.array([e.addr for e in self._c], np.uint64)
            for c in self._c:
                c.state.procs, c.state.nprocs = self._procs.ctypes.data, processors

    @property
    def processors(self) -> int:
        return len(self._py or self._c)

    def feed(self, streams_per_processor: PhaseStreams) -> None:
        """One phase: processor p runs ``streams_per_processor[p]`` (a stream, a sequence of
        them, or None), interleaved with the others; cache state persists across phases."""
        if len(streams_per_processor) != self.processors:
            raise BadInput(f"{len(streams_per_processor)} stream lists for "
                           f"{self.processors} processors", "give one (or None) per processor")
        per = [_stream_list(x) for x in streams_per_processor]
        if self._py:
            self._feed_python(per)
        else:
            self._feed_native(per)

    def _feed_python(self, per: list[list[Stream]]) -> None:
        its = [_accesses(streams) for streams in per]
        active = True
        while active:
            active = False
            for engine, it in zip(self._py, its, strict=True):
                n = 0
                for addr, kind in itertools.islice(it, self.chunk):
                    engine._one(addr, kind)
                    n += 1
                active = active or n == self.chunk

    def _feed_native(self, per: list[list[Stream]]) -> None:
        flat = [s for streams in per for s in streams]
        segs = (_CSeg * max(1, len(flat)))()
        for seg, s in zip(segs, flat, strict=False):
            if isinstance(s, StridedStream):
                seg.base, seg.count, seg.stride = s.base, s.count, s.stride_bytes
                seg.reps, seg.kind = s.reps, KIND_CODES[s.kind]
            else:
                seg.count, seg.addrs, seg.kinds = len(s), s.addresses.ctypes.data, \
                    s.kinds.ctypes.data
        start = np.cumsum([0] + [len(streams) for streams in per], dtype=np.uint64)
        cursor = np.zeros(3 * self.processors, np.uint64)
        rc = self._c[0].lib.counterd_cachesim_interleave(
            self._procs.ctypes.data, self.processors, ctypes.addressof(segs),
            start.ctypes.data, self.chunk, cursor.ctypes.data)
        if rc != 0:
            raise RuntimeError(f"cachesim.c rejected a stream (rc={rc})")

    def flush(self) -> None:
        """Processor 0, 1, ... writes back its dirty lines (the shared levels' are counted to
        the first processor that flushes them); lines stay valid, now clean."""
        for e in self._py or self._c:
            e.flush()

    def counts(self) -> tuple[ProcessorCounts, ...]:
        return tuple(e.result() for e in self._py or self._c)


def simulate(streams_per_processor: Sequence[Stream | Sequence[Stream]], geometry: Geometry,
             bankmap: BankMap = SGI_BANKS, *, engine: Literal["auto", "native", "python"] = "auto",
             shared: Literal["copy", "split"] = "copy", flush: bool = False,
             coherence: bool = False, chunk: int = DEFAULT_CHUNK) -> SimResult:
    """Simulate processor p running ``streams_per_processor[p]`` (one stream or a sequence) on
    cold caches; return per-processor counts and per-bank totals.

    ``coherence=False``: independent private caches; processors do not see each other's
    lines, so sharing shows up in measured time only, never in these counts (DESIGN.md
    section 4); ``shared``: how levels shared between CPUs (per sysfs) are modelled, see the
    module docstring. ``coherence=True``: one :class:`CoherentSim` phase, the streams
    interleaved in turns of ``chunk`` accesses, shared levels one cache (``shared`` is not
    used). ``flush``: write back every dirty line at the end (counted), as if the superstep's
    data had to reach memory.
    """
    if shared not in ("copy", "split"):
        raise BadInput(f"unknown shared-level policy {shared!r}", "use copy or split")
    if coherence:
        csim = CoherentSim(geometry, len(streams_per_processor), bankmap, engine, chunk=chunk)
        csim.feed(streams_per_processor)
        if flush:
            csim.flush()
        procs = csim.counts()
        total = BankCounts((0,) * bankmap.banks, (0,) * bankmap.banks)
        for r in procs:
            total = total + r.banks
        return SimResult(procs, total, csim.engine_name, geometry, bankmap)
    g = geometry.split_shared(len(streams_per_processor)) if shared == "split" else geometry
    results = []
    engine_name: EngineName = "python"
    for streams in streams_per_processor:
        sim = CacheSim(g, bankmap, engine)
        sim.feed(streams)
        if flush:
            sim.flush()
        results.append(sim.counts())
        engine_name = sim.engine_name
    total = BankCounts((0,) * bankmap.banks, (0,) * bankmap.banks)
    for r in results:
        total = total + r.banks
    return SimResult(tuple(results), total, engine_name, g, bankmap)


# --------------------------------------------------------------------------------------------
# Backend


@dataclass
class SimGroup:
    """An open sim counter group: the program declares with :meth:`feed` the stream it
    executes; :meth:`read` returns the cumulative simulated counters."""

    events: tuple[str, ...]
    target: Target
    sim: CacheSim
    _closed: bool = field(default=False, repr=False)

    def _check_open(self) -> None:
        if self._closed:
            raise BadInput("this sim counter group is closed", "open a new one with open()")

    def feed(self, stream: Stream | Iterable[Stream]) -> None:
        self._check_open()
        self.sim.feed(stream)

    def flush(self) -> None:
        self._check_open()
        self.sim.flush()

    def read(self) -> Reading:
        self._check_open()
        values, unsupported = canonical_values(self.sim.counts(), self.events)
        return Reading(values, 0, 0, unsupported)

    def bank_counts(self) -> BankCounts:
        return self.sim.counts().banks

    def counts(self) -> ProcessorCounts:
        """Everything counted, beyond the canonical counters (per-level hits, wb_misses)."""
        return self.sim.counts()

    def close(self) -> None:
        self._closed = True



class SimBackend:
    """Counter source that simulates declared address streams (DESIGN.md section 4, "sim").

    ``geometry`` defaults to this host's (sysfs, with a documented fallback); ``bankmap`` to
    the seed's 8 banks interleaved on 128 B, since a host's bank map is not discoverable.
    """

    name = "sim"
    source = Source.SIMULATED

    def __init__(self, geometry: Geometry | None = None, bankmap: BankMap = HOST_BANKS,
                 engine: Literal["auto", "native", "python"] = "auto") -> None:
        self.geometry = geometry if geometry is not None else Geometry.host()
        self.bankmap = bankmap
        self.engine = engine

    def engine_name(self) -> EngineName:
        ok, _ = native_status()
        return "native" if ok and self.engine != "python" else "python"

    def available(self) -> Capability:
        ok, why = native_status()
        engine = self.engine_name()
        note = "" if engine == "native" else f" ({why})" if not ok else ""
        reason = (f"simulates {self.geometry.spec()} with the {engine} engine{note}; "
                  f"geometry from {self.geometry.source}; banks: {self.bankmap.banks} x "
                  f"{self.bankmap.interleave_bytes} B"
                  + (" (assumed: not discoverable)" if self.bankmap == HOST_BANKS else ""))
        depth = {lv.level for lv in self.geometry.levels}
        counters: dict[str, str | None] = {}
        for name in NAMES:
            if name in _LEVEL_COUNTERS and _LEVEL_COUNTERS[name] not in depth:
                counters[name] = f"the simulated geometry has no L{_LEVEL_COUNTERS[name]}"
            elif name in _LEVEL_COUNTERS or name in _OTHER_MEMORY_COUNTERS:
                counters[name] = None
            else:  # cycles, instructions, task_clock_ns, page_faults, and any added later
                counters[name] = UNSUPPORTED_REASON
        return Capability(self.name, True, reason, counters)

    def open(self, events: Sequence[str], target: Target = THIS_THREAD) -> SimGroup:
        return SimGroup(check_names(tuple(events)), target,
                        CacheSim(self.geometry, self.bankmap, self.engine))


__all__ = [
    "AddressStream", "BankCounts", "BankMap", "CacheLevel", "CacheSim", "CoherentSim",
    "DEFAULT_CHUNK", "FALLBACK_GEOMETRY",
    "Geometry", "HOST_BANKS", "HOST_BANKS_PROVENANCE", "LevelCounts", "ProcessorCounts",
    "SGI_BANKS", "SGI_POWER_CHALLENGE",
    "SimBackend", "SimGroup", "SimResult", "StridedStream", "canonical_values", "native_status",
    "parse_size", "simulate",
]
