"""The machine a simulation runs on, as data: cache levels, DTLB and memory banks.

:class:`Geometry` (a processor's data-side hierarchy and DTLB, read from sysfs, parsed from
a spec or given) and :class:`BankMap` (the memory bank of an address), with the machines
counterd knows: the seed's SGI Power Challenge (:data:`SGI_POWER_CHALLENGE`,
:data:`SGI_BANKS`), this host's declared bank map (:data:`HOST_BANKS`) and the geometry used
when sysfs is unreadable (:data:`FALLBACK_GEOMETRY`). The simulator that runs address streams
on them is :mod:`counterd.sim`.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from counterd.errors import BadInput
from counterd.host import parse_size, read_caches

# sysfs has no TLB geometry; these defaults are used unless the caller gives values.
DEFAULT_PAGE_BYTES = 4096
DEFAULT_TLB_ENTRIES = 64
DEFAULT_TLB_WAYS = 4
_TLB_NOTE = (f"DTLB not in sysfs: default {DEFAULT_TLB_ENTRIES} entries "
             f"{DEFAULT_TLB_WAYS}-way, {DEFAULT_PAGE_BYTES // 1024} KiB pages")

MAX_LEVELS = 8  # CS_MAX_LEVELS in cachesim.c


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
# Banks


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
