"""Cache geometry: sizes and CPU lists as written, the cache levels (:class:`CacheLevel`, with
their set index), the simulator's view of a machine (:class:`Geometry`), and the geometries
counterd knows (:data:`FALLBACK_GEOMETRY`, :data:`SGI_POWER_CHALLENGE`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass

from counterd.data.errors import BadInput

# sysfs has no TLB geometry; these defaults are used unless the caller gives values.
DEFAULT_PAGE_BYTES = 4096
DEFAULT_TLB_ENTRIES = 64
DEFAULT_TLB_WAYS = 4
TLB_NOTE = (f"DTLB not in sysfs: default {DEFAULT_TLB_ENTRIES} entries "
             f"{DEFAULT_TLB_WAYS}-way, {DEFAULT_PAGE_BYTES // 1024} KiB pages")

MAX_LEVELS = 8  # CS_MAX_LEVELS in cachesim.c


# --------------------------------------------------------------------------------------------
# Geometry


def is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _fmt_size(n: int) -> str:
    for suffix, unit in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def parse_size(text: str) -> int:
    """``"48K"`` -> 49152. Suffixes K, M, G (binary, as sysfs and the seed use them); an
    optional trailing ``B`` or ``iB``."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise BadInput(f"cannot read size {text!r}", "write a byte count like 32768, 32K or 1M")
    return int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]


def format_cpulist(cpus: Iterable[int]) -> str:
    """(0, 1, 2, 3, 8) -> ``"0-3,8"`` (the sysfs cpu list syntax)."""
    runs: list[list[int]] = []
    for c in sorted(set(cpus)):
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# The largest CPU id a cpu list may name: Linux's NR_CPUS is at most 8192 today. A list beyond
# it is garbage, and expanding "0-4000000000" would take the memory of four billion ints.
MAX_CPU_ID = 65535


def parse_cpulist(cpulist: str) -> tuple[int, ...]:
    """sysfs cpu list ``"0-3,8"`` -> (0, 1, 2, 3, 8). ValueError for anything else, for a range
    running backwards and for a CPU id over :data:`MAX_CPU_ID`."""
    cpus: list[int] = []
    for part in cpulist.strip().split(","):
        if not part:
            continue
        lo_text, dash, hi_text = part.partition("-")
        lo, hi = int(lo_text), int(hi_text if dash else lo_text)
        if not 0 <= lo <= hi <= MAX_CPU_ID:
            raise ValueError(f"CPU range {part!r} is not within 0-{MAX_CPU_ID}")
        cpus.extend(range(lo, hi + 1))
    return tuple(cpus)


# How a cache level maps a line number to a set (CacheLevel.index, set_index()):
# * modulo: line % sets (what textbooks and pycachesim do; the default);
# * hashed: mix64(line) % sets: every set equally likely for any line, whatever the stride;
# * sliced: the last levels of Intel (and AMD) server parts: the sets are divided into slices
#   of `slice_sets` sets (the largest power of two dividing the sets, at most SLICE_SETS_MAX);
#   within a slice the set is the line's low bits, and the slice is a hash of the bits above
#   them: set = (mix64(line // slice_sets) % slices) * slice_sets + line % slice_sets.
#   Intel's slice hash is undocumented (reverse-engineered ones are XORs of address bits for
#   power-of-two slice counts, non-linear otherwise); any well-mixed hash spreads lines over
#   slices alike, so mix64 stands for it. A power-of-two stride then still aliases within a
#   slice (as on hardware) but reaches every slice.
# mix64 is the 64-bit finaliser of MurmurHash3 (fmix64), the same in cachesim.c.
SET_INDEXES = ("modulo", "hashed", "sliced")
SLICE_SETS_MAX = 2048  # Intel server L3 slices: 1024-4096 sets (1.25-5 MB, 12-20 ways)


def mix64(x: int) -> int:
    """MurmurHash3's fmix64 of a 64-bit value (cachesim.c's mix64)."""
    m = (1 << 64) - 1
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & m
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & m
    x ^= x >> 33
    return x


def hash_low(level: CacheLevel) -> int:
    """The index's split point: 0 for modulo, 1 for hashed (every bit hashed), the slice's
    sets for sliced (the low bits kept, the rest hashed)."""
    if level.index == "modulo":
        return 0
    if level.index == "hashed":
        return 1
    sets = level.sets
    return min(sets & -sets, SLICE_SETS_MAX)


def set_index(sets: int, low: int, line: int) -> int:
    """The set of ``line`` in a level of ``sets`` sets indexed with :func:`hash_low` ``low``
    (cachesim.c's set_of)."""
    if low == 0:
        return line % sets
    return (mix64(line // low) % (sets // low)) * low + line % low


@dataclass(frozen=True)
class CacheLevel:
    """One data (or unified) cache level. ``shared_cpus``: the CPUs sharing it (sysfs
    ``shared_cpu_list``), empty when unknown. ``index``: how a line picks its set
    (:data:`SET_INDEXES`; the simulator's :func:`set_index`)."""

    level: int
    size_bytes: int
    ways: int
    line_bytes: int
    shared_cpus: tuple[int, ...] = ()
    index: str = "modulo"

    def __post_init__(self) -> None:
        if self.index not in SET_INDEXES:
            raise BadInput(f"L{self.level}: unknown set index {self.index!r}",
                           "use " + ", ".join(SET_INDEXES))
        if self.level < 1 or self.size_bytes <= 0 or self.ways <= 0:
            raise BadInput(f"invalid cache level {self}", "level >= 1, size and ways > 0")
        if not is_pow2(self.line_bytes) or self.line_bytes < 2:
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
        if not is_pow2(self.page_bytes) or self.page_bytes < 2:
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
        notes = [] if "tlb_entries" in extra else [TLB_NOTE]
        return cls(tuple(levels), source=source or "; ".join([f"spec {spec!r}", *notes]),
                   **extra)

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


# Used by read() when sysfs is unreadable: a common x86 server core's L1d/L2/L3.
FALLBACK_GEOMETRY = Geometry.from_spec("L1=32K/8/64,L2=1M/16/64,L3=32M/16/64",
                                       source="fallback")

# Seed 004 section 2: SGI Power Challenge, R10000: 32 KB L1 data cache with 32 B lines, 1 MB
# L2 with 128 B lines, both 2-way (R10000 manual); 8 memory banks interleaved on 128 B (see
# SGI_BANKS). The seed gives no TLB or page size: the defaults are used.
SGI_POWER_CHALLENGE = Geometry.from_spec(
    "L1=32K/2/32,L2=1M/2/128",
    source=f"Amato et al., \"Predicting performance on SMPs\", section 2 (SGI Power "
           f"Challenge, MIPS R10000); {TLB_NOTE}")
