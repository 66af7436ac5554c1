"""The machine counterd counts and simulates on, as data: one home for it.

:class:`Machine` is the description every part uses: its cache levels (size, ways, line, the
CPUs sharing each), the L1 instruction cache where known, the DTLB where known, the page size,
the memory layout (NUMA nodes and their CPUs, memory channels, interleave; each read, declared
or assumed) with the bank map derived from it, and the host fingerprint (hostname, CPU model,
CPUs online, caches spec). :func:`current` is this process's: read from sysfs and procfs once
(:func:`read`, whose roots and file reader are parameters for tests) and cached, or loaded from
a machine file (:func:`load_file`) named by ``COUNTERD_MACHINE`` or by a CLI's ``--machine``
(:func:`using`). The sim backend, the callgrind backend, ``counterd probe``, ``microbench`` and
the predictor's host fingerprint all take their geometry from it; nothing else reads
``/sys/devices/system/cpu/*/cache`` or ``/sys/devices/system/node``.

:class:`Geometry` is the simulator's view of a machine (data-side levels, DTLB, page size; from
:attr:`Machine.geometry`, parsed from a spec or given) and :class:`BankMap` the memory bank of
an address. Also here: the machines counterd knows, the seed's SGI Power Challenge
(:data:`SGI_POWER_CHALLENGE`, :data:`SGI_BANKS`), the memory layout the bank map derives
from (:class:`MemoryLayout`, whose :meth:`~MemoryLayout.spread` is where a program's ranks are
pinned) and the geometry used when sysfs is unreadable (:data:`FALLBACK_GEOMETRY`). The
simulator that runs address streams on them is :mod:`counterd.sim`. This module is data
only: it imports no service.

Machine files
-------------

TOML, UTF-8. Every table and key but ``format`` and ``version`` is optional: what the file
does not give is read from this host (sysfs, procfs) as without a file. ``[[caches]]``, when
given, replaces every cache sysfs lists. Unknown keys, wrong types and impossible geometry are
errors that name the file, the field and the fix (exit 2 in every CLI)::

    format = "counterd-machine"
    version = 2                       # 1 is read too (without [memory])
    page_bytes = 4096                 # a power of two

    [host]                            # the fingerprint profiles are checked against
    hostname = "node17"
    cpu_model = "Intel(R) Xeon(R) Platinum 8480+"
    cpus_online = 8

    [[caches]]                        # one table per cache; caches[k] counts them from 1
    level = 1
    type = "data"                     # data, unified or instruction (level 1 only)
    size = "48K"                      # bytes: an integer, or a string with K, M or G
    ways = 12                         # at least 1 (fully associative: size / line_bytes)
    line_bytes = 64                   # a power of two, not below the previous level's line
    shared_cpus = [0]                 # the CPUs sharing it (sysfs shared_cpu_list)

    [tlb]                             # the DTLB (sysfs does not describe it)
    entries = 64
    ways = 4                          # entries a multiple of ways

    [memory]                          # version 2; what a bank is (MemoryLayout)
    numa_nodes = ["0-3", "4-7"]       # CPUs of node 0, 1, ... (sysfs cpulist, or [0, 1, ...]);
                                      # every CPU online on one node. Default: sysfs
                                      # devices/system/node, else one node, assumed
    channels_per_node = 8             # memory channels of each node (default 8, assumed)
    interleave_bytes = 256            # bytes on one channel before the next, a power of two
                                      # (default 256, assumed)
    provenance = "dmidecode -t memory"  # optional: how the values were found

    [bank_map]                        # banks as they are, instead of channels x nodes
    banks = 8                         # (not with memory.channels_per_node/interleave_bytes)
    interleave_bytes = 256
    provenance = "measured with ..."  # default: "declared in <file>"; "assumed..." marks it so

The bank map is ``banks = channels_per_node x NUMA nodes`` interleaved on
``interleave_bytes`` (:class:`MemoryLayout` says why), unless ``[bank_map]`` gives it; with
nothing declared it is 8 x 256 B on a one-node host, labelled assumed. A file that changes
``host.cpus_online`` without ``numa_nodes`` has one assumed node of CPUs 0 .. cpus_online - 1.

Data and unified levels are numbered 1, 2, ... without gaps (at most 8). Every level needs a
whole number of sets (``size = sets x ways x line_bytes``), which both simulators index by
address modulo sets: a set count that is not a power of two (e.g. a 20-way L3) is accepted;
valgrind needs powers of two and a line of at least 16 B, and the callgrind backend adjusts
the set count as it documents (:func:`counterd.backends.callgrind.adjust_cache`). Callgrind
also needs the L1 instruction cache.

Format history: 1 - first version (format, version, page_bytes, host, caches, tlb, bank_map);
2 - ``[memory]`` (numa_nodes, channels_per_node, interleave_bytes, provenance). Version 1
files are read as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from counterd.errors import BadInput

if TYPE_CHECKING:
    import numpy as np

#: The environment variable naming a machine file (as ``--machine FILE`` does).
ENV_MACHINE = "COUNTERD_MACHINE"
FILE_FORMAT = "counterd-machine"
FILE_VERSION = 2
SUPPORTED_FILE_VERSIONS = (1, 2)

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
           f"Challenge, MIPS R10000); {_TLB_NOTE}")


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
        import numpy as np  # here: counterd record imports this module and must start fast

        """Vectorised :meth:`bank` over uint64 addresses."""
        a = np.asarray(addresses, dtype=np.uint64)
        return (a // np.uint64(self.interleave_bytes)) % np.uint64(self.banks)


# Seed 004 section 2: "8-way interleaved ... main memory distributed across 8 banks"; the
# interleave unit is taken to be the 128 B L2 line, which reproduces Table 1 (tests).
SGI_BANKS = BankMap(8, 128)

# A node's memory channels are not in sysfs (nor, without a PMU that samples addresses, in
# any other discoverable place), so they are assumed unless a machine file declares them
# (MemoryLayout). 8 per node keeps the earlier host assumption of 8 banks on a one-node host;
# a socket of current servers has 6 to 12 (Ice Lake-SP and Sapphire Rapids 8, Genoa 12).
# 256 B is the default channel-interleave granularity of current Xeon SP platforms and keeps
# Table 1's 32-word bank unit with 8 B words (128 B / 4 B on the SGI).
ASSUMED_CHANNELS_PER_NODE = 8
ASSUMED_INTERLEAVE_BYTES = 256
#: The bank map of a one-node host whose channels and interleave are assumed.
HOST_BANKS = BankMap(ASSUMED_CHANNELS_PER_NODE, ASSUMED_INTERLEAVE_BYTES)


# --------------------------------------------------------------------------------------------
# Reading sysfs and procfs

#: How :func:`read` reads a file (tests inject a counting one). OSError when it cannot.
Reader = Callable[[Path], str]


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


@dataclass(frozen=True)
class SysfsCache:
    """One ``cpuN/cache/indexK`` entry of sysfs."""

    level: int
    kind: str  # "Data", "Instruction" or "Unified"
    size_bytes: int
    ways: int  # sysfs says 0 for fully associative: then size // line
    line_bytes: int
    shared_cpus: tuple[int, ...]


_SYSFS_FIX = ("mount sysfs, or describe the machine in a file (COUNTERD_MACHINE=FILE or "
              "--machine FILE, format in counterd/machine.py), or give the geometry "
              'explicitly, e.g. Geometry.from_spec("L1=48K/12/64,L2=2M/16/64") or '
              "SimBackend(geometry=...)")


def cache_dir(sysfs: str | Path = "/sys", cpu: int = 0) -> Path:
    return Path(sysfs) / "devices" / "system" / "cpu" / f"cpu{cpu}" / "cache"


def read_caches(sysfs: str | Path = "/sys", cpu: int = 0,
                reader: Reader = read_text) -> tuple[SysfsCache, ...]:
    """Every cache of ``cpu`` described under ``<sysfs>/devices/system/cpu/cpuN/cache``, in
    index order. Raises BadInput (naming the file) when an entry cannot be read."""
    base = cache_dir(sysfs, cpu)
    try:
        indexes = sorted(base.glob("index*"), key=lambda p: int(p.name[5:] or 0))
    except (OSError, ValueError) as exc:
        raise BadInput(f"cannot read cache geometry from {base}: {exc}", _SYSFS_FIX) from exc
    out = []
    for idx in indexes:
        try:
            size = parse_size(reader(idx / "size"))
            line = int(reader(idx / "coherency_line_size"))
            ways = int(reader(idx / "ways_of_associativity")) or size // line
            try:
                shared = parse_cpulist(reader(idx / "shared_cpu_list"))
            except FileNotFoundError:
                shared = ()
            out.append(SysfsCache(int(reader(idx / "level")), reader(idx / "type").strip(),
                                  size, ways, line, shared))
        except (OSError, ValueError, ZeroDivisionError, BadInput) as exc:
            raise BadInput(f"cannot read cache geometry from {idx}: {exc}", _SYSFS_FIX) from exc
    return tuple(out)


def read_levels(sysfs: str | Path = "/sys", cpu: int = 0, reader: Reader = read_text
                ) -> tuple[tuple[CacheLevel, ...], CacheLevel | None]:
    """``cpu``'s data and unified levels in order, and its L1 instruction cache (None when
    sysfs lists none), from sysfs. Raises BadInput, with the fix, when sysfs cannot be read,
    lists no data cache or lists a level twice."""
    where = cache_dir(sysfs, cpu)
    levels: dict[int, CacheLevel] = {}
    l1i = None
    for c in read_caches(sysfs, cpu, reader):
        lv = CacheLevel(c.level, c.size_bytes, c.ways, c.line_bytes, c.shared_cpus)
        if c.kind == "Instruction":
            if c.level == 1:
                l1i = lv
            continue
        if c.kind not in ("Data", "Unified"):
            continue
        if c.level in levels:
            raise BadInput(f"{where} lists two data caches at level {c.level}", _SYSFS_FIX)
        levels[c.level] = lv
    if not levels:
        raise BadInput(f"no data or unified caches found under {where}", _SYSFS_FIX)
    return tuple(levels[k] for k in sorted(levels)), l1i


def _cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model") and value.strip():
            return value.strip()
    return "?"


# --------------------------------------------------------------------------------------------
# Memory: NUMA nodes, channels, interleave, and the banks they make

#: Where a memory fact came from: read from sysfs, declared by a machine file, or assumed.
Provenance = Literal["read", "declared", "assumed"]
_STRENGTH: dict[str, int] = {"assumed": 0, "declared": 1, "read": 2}

_T = TypeVar("_T")


@dataclass(frozen=True)
class Sourced(Generic[_T]):
    """A value with its provenance and a note saying where exactly (a sysfs path, a file, or
    what was assumed and why)."""

    value: _T
    provenance: Provenance
    note: str

    def describe(self) -> str:
        """``"<provenance>: <note>"`` (the note alone when it starts with its provenance)."""
        return self.note if self.note.startswith(self.provenance) else \
            f"{self.provenance}: {self.note}"


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node and the CPUs on it (sysfs ``nodeN/cpulist``)."""

    node: int
    cpus: tuple[int, ...]


_CHANNELS_NOTE = ("memory channels are not in sysfs: declare memory.channels_per_node in a "
                  "machine file")
_INTERLEAVE_NOTE = (f"the interleave is not in sysfs; {ASSUMED_INTERLEAVE_BYTES} B is a common "
                    "channel-interleave granularity: declare memory.interleave_bytes in a "
                    "machine file")

@dataclass(frozen=True)
class MemoryLayout:
    """What a memory bank is on this machine (issue 35, item 3): the NUMA nodes with their
    CPUs, the memory channels of each node and the channel interleave, each with its
    provenance; the bank map the suite and the model use derives from them (:attr:`banks`).

    The paper's banks were the SGI's interleaved memory banks, all equally far from every
    processor. On a node of today the analogous resources are the memory channels: a page is
    allocated on the NUMA node of the processor that touches it first (Linux's default
    local policy; each microbench worker pre-faults its own pages), and within a node
    consecutive ``interleave_bytes`` go to consecutive channels. With processors placed as
    :meth:`spread` places them (the same number on every node), ``p`` processors find
    ``p / nodes`` of themselves on each node's channels, which is the contention of one map of
    ``channels_per_node x nodes`` banks interleaved on ``interleave_bytes``: hence
    ``banks = channels_per_node x len(nodes)``, bank stride = the interleave. A machine file's
    ``[bank_map]`` (``declared_banks``) is used as it is instead. Controller address hashing
    and remote accesses are not modelled.
    """

    nodes: Sourced[tuple[NumaNode, ...]]
    channels_per_node: Sourced[int]
    interleave_bytes: Sourced[int]
    declared_banks: Sourced[BankMap] | None = None
    remark: str = ""  # a machine file's memory.provenance: how its values were found

    def __post_init__(self) -> None:
        nodes = self.nodes.value
        fix = "give every NUMA node at least one CPU, each CPU on one node"
        if not nodes:
            raise BadInput("no NUMA nodes", fix)
        seen: set[int] = set()
        for n in nodes:
            if not n.cpus:
                raise BadInput(f"NUMA node {n.node} has no CPUs", fix)
            twice = seen.intersection(n.cpus)
            if twice:
                raise BadInput(f"CPU {min(twice)} is on two NUMA nodes", fix)
            seen.update(n.cpus)
        if len({n.node for n in nodes}) != len(nodes):
            raise BadInput("a NUMA node is listed twice", "list each node once")
        if self.channels_per_node.value < 1 or self.interleave_bytes.value < 1:
            raise BadInput(f"{self.channels_per_node.value} channels per node interleaved on "
                           f"{self.interleave_bytes.value} B", "both must be >= 1")

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for n in self.nodes.value for c in n.cpus))

    def node_of(self, cpu: int) -> int | None:
        return next((n.node for n in self.nodes.value if cpu in n.cpus), None)

    @property
    def banks(self) -> Sourced[BankMap]:
        """The bank map: ``channels_per_node x nodes`` banks interleaved on
        ``interleave_bytes`` (a machine file's ``[bank_map]`` instead, when it declares one);
        its provenance is the weakest of the three facts it derives from."""
        if self.declared_banks is not None:
            return self.declared_banks
        facts = (self.channels_per_node, self.nodes, self.interleave_bytes)
        weakest = min((f.provenance for f in facts), key=_STRENGTH.__getitem__)
        ch, n, il = (self.channels_per_node.value, len(self.nodes.value),
                     self.interleave_bytes.value)
        bm = BankMap(ch * n, il)
        return Sourced(bm, weakest,
                       f"{weakest}: {bm.banks} banks = {ch} memory channels per NUMA node "
                       f"({self.channels_per_node.provenance}) x {n} NUMA node"
                       f"{'s' if n > 1 else ''} ({self.nodes.provenance}), interleaved on "
                       f"{il} B ({self.interleave_bytes.provenance}); bank = address // {il} % "
                       f"{bm.banks} of the offset in the benchmark's page-aligned region; "
                       "controller address hashing is not modelled")

    def spread(self, cpus: Iterable[int]) -> tuple[int, ...]:
        """The order in which a program's ranks are pinned to ``cpus`` (the CPUs it may use):
        round-robin over the NUMA nodes, each node's CPUs in ascending order, so that rank k
        runs on node ``k mod nodes`` and p ranks have p / nodes processors on each node (to
        within one). This is likwid-pin's scatter over memory domains (``-c M:scatter``) and
        gives each node as many threads as OpenMP's ``proc_bind(spread)`` over cores does: the
        placement of a memory-bound program that wants every node's channels. CPUs on no
        listed node come last, in ascending order."""
        allowed = set(cpus)
        queues = [[c for c in sorted(n.cpus) if c in allowed] for n in self.nodes.value]
        queues = [q for q in queues if q]
        order: list[int] = []
        for k in range(max(map(len, queues), default=0)):
            order.extend(q[k] for q in queues if k < len(q))
        return (*order, *sorted(allowed.difference(order)))

    def to_json(self) -> dict[str, Any]:
        banks = self.banks

        def fact(f: Sourced[Any], value: Any) -> dict[str, Any]:
            return {"value": value, "provenance": f.provenance, "note": f.note}

        return {
            "numa_nodes": fact(self.nodes, [{"node": n.node, "cpus": list(n.cpus)}
                                            for n in self.nodes.value]),
            "channels_per_node": fact(self.channels_per_node, self.channels_per_node.value),
            "interleave_bytes": fact(self.interleave_bytes, self.interleave_bytes.value),
            "banks": fact(banks, {"banks": banks.value.banks,
                                  "interleave_bytes": banks.value.interleave_bytes}),
            "placement": "spread: round-robin over NUMA nodes (likwid-pin -c M:scatter)",
            "remark": self.remark,
        }


def assumed_layout(cpus: Sequence[int], why: str) -> MemoryLayout:
    """One NUMA node holding ``cpus``, the assumed channels and interleave."""
    return MemoryLayout(Sourced((NumaNode(0, tuple(sorted(cpus))),), "assumed",
                                f"one node of all {len(cpus)} CPUs: {why}"),
                        Sourced(ASSUMED_CHANNELS_PER_NODE, "assumed", _CHANNELS_NOTE),
                        Sourced(ASSUMED_INTERLEAVE_BYTES, "assumed", _INTERLEAVE_NOTE))


def node_dir(sysfs: str | Path = "/sys") -> Path:
    return Path(sysfs) / "devices" / "system" / "node"


def read_numa_nodes(sysfs: str | Path = "/sys", reader: Reader = read_text
                    ) -> tuple[NumaNode, ...]:
    """The NUMA nodes with CPUs under ``<sysfs>/devices/system/node`` (``nodeN/cpulist``), in
    node order; nodes without CPUs (memory-only nodes) are left out. Empty when sysfs has no
    node directory (a kernel without NUMA support). Raises BadInput naming the file when a
    cpulist cannot be read."""
    base = node_dir(sysfs)
    try:
        found = sorted((int(p.name[4:]), p) for p in base.glob("node*")
                       if p.name[4:].isdigit())
    except OSError as exc:
        raise BadInput(f"cannot list NUMA nodes in {base}: {exc}", _SYSFS_FIX) from exc
    out = []
    for number, path in found:
        try:
            cpus = parse_cpulist(reader(path / "cpulist"))
        except (OSError, ValueError) as exc:
            raise BadInput(f"cannot read the CPUs of NUMA node {number} from {path}/cpulist: "
                           f"{exc}", _SYSFS_FIX) from exc
        if cpus:
            out.append(NumaNode(number, cpus))
    return tuple(out)


def read_layout(sysfs: str | Path, online: Sequence[int], reader: Reader = read_text
                ) -> MemoryLayout:
    """The memory layout of this host: its NUMA nodes read from sysfs (one assumed node of
    the ``online`` CPUs when sysfs has none or cannot be read), the channels and interleave
    assumed. Never raises."""
    try:
        nodes = read_numa_nodes(sysfs, reader)
    except BadInput as exc:
        return assumed_layout(online, f"sysfs failed ({exc.what})")
    if not nodes:
        return assumed_layout(online, f"no NUMA node with CPUs in {node_dir(sysfs)}")
    try:
        return dataclasses.replace(assumed_layout(online, ""),
                                   nodes=Sourced(nodes, "read", f"sysfs {node_dir(sysfs)}"))
    except BadInput as exc:  # a CPU on two nodes: sysfs is inconsistent
        return assumed_layout(online, f"sysfs {node_dir(sysfs)} is inconsistent ({exc.what})")


# --------------------------------------------------------------------------------------------
# The machine


def fingerprint_size(n: int) -> str:
    """A size as the fingerprint writes it: ``48K``, ``2M`` (bytes when neither divides)."""
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


@dataclass(frozen=True)
class Machine:
    """One machine, as data: what counterd counts on and simulates.

    ``levels``: data and unified caches L1, L2, ... (the fallback's when ``caches_known`` is
    false); ``l1i``: the L1 instruction cache where known (callgrind simulates it);
    ``tlb_entries``/``tlb_ways``: the DTLB where known (None: the simulator's defaults are used,
    and :attr:`geometry` says so); ``bank_map`` with ``bank_provenance``; the host fingerprint
    (``hostname``, ``cpu_model``, ``cpus_online``, :attr:`caches_spec`). ``source`` says where
    each part came from; ``file`` is the machine file it was loaded from, if any.
    """

    levels: tuple[CacheLevel, ...]
    l1i: CacheLevel | None
    page_bytes: int
    tlb_entries: int | None
    tlb_ways: int | None
    memory: MemoryLayout
    hostname: str
    cpu_model: str
    cpus_online: int
    caches_known: bool = True
    caches_source: str = "given"
    source: str = "given"
    file: str | None = None

    def __post_init__(self) -> None:
        self.geometry  # noqa: B018 - validates levels, page and DTLB together

    @property
    def geometry(self) -> Geometry:
        """The simulator's view: data-side levels, DTLB (defaults where unknown), page size."""
        if self.tlb_entries is not None and self.tlb_ways is not None:
            tlb = (self.tlb_entries, self.tlb_ways)
            note = [f"DTLB from machine file {self.file}" if self.file else "DTLB given"]
        else:
            tlb, note = (DEFAULT_TLB_ENTRIES, DEFAULT_TLB_WAYS), [_TLB_NOTE]
        return Geometry(self.levels, self.page_bytes, tlb[0], tlb[1],
                        source="; ".join([self.caches_source, *note]))

    @property
    def caches_spec(self) -> str:
        """``L1=48K/12/64,L2=2M/16/64,...`` (size/ways/line of the data and unified levels):
        the fingerprint's cache field, as profiles store it; empty when the caches are
        unknown (sysfs unreadable and no machine file)."""
        if not self.caches_known:
            return ""
        return ",".join(f"L{lv.level}={fingerprint_size(lv.size_bytes)}/{lv.ways}/"
                        f"{lv.line_bytes}" for lv in self.levels)

    def fingerprint(self) -> dict[str, Any]:
        """What a machine profile records of the host it was fitted on."""
        return {"hostname": self.hostname, "cpu_model": self.cpu_model,
                "cpus_online": self.cpus_online, "page_bytes": self.page_bytes,
                "caches": self.caches_spec}

    @property
    def bank_map(self) -> BankMap:
        """The memory bank map the simulator, the suite and the model use
        (:attr:`MemoryLayout.banks`)."""
        return self.memory.banks.value

    @property
    def bank_provenance(self) -> str:
        """Where the bank map came from, starting with ``read:``, ``declared:`` or
        ``assumed:``."""
        return self.memory.banks.note

    @property
    def bank_map_assumed(self) -> bool:
        return self.memory.banks.provenance == "assumed"

    def to_json(self) -> dict[str, Any]:
        def level(lv: CacheLevel, kind: str) -> dict[str, Any]:
            return {"level": lv.level, "type": kind, "size_bytes": lv.size_bytes,
                    "ways": lv.ways, "line_bytes": lv.line_bytes, "sets": lv.sets,
                    "shared_cpus": list(lv.shared_cpus)}
        caches = [level(lv, "data" if lv.level == 1 else "unified") for lv in self.levels]
        if self.l1i is not None:
            caches.insert(1, level(self.l1i, "instruction"))
        return {
            "source": self.source, "file": self.file, "fingerprint": self.fingerprint(),
            "caches": caches, "caches_known": self.caches_known,
            "caches_source": self.caches_source, "page_bytes": self.page_bytes,
            "tlb": ({"entries": self.tlb_entries, "ways": self.tlb_ways}
                    if self.tlb_entries is not None else None),
            "bank_map": {"banks": self.bank_map.banks,
                         "interleave_bytes": self.bank_map.interleave_bytes,
                         "provenance": self.bank_provenance},
            "memory": self.memory.to_json(),
        }


def _hostname() -> str:
    return socket.gethostname()


def read(sysfs: str | Path = "/sys", procfs: str | Path = "/proc", *, cpu: int = 0,
         reader: Reader | None = None) -> Machine:
    """This host's machine, read from ``sysfs`` and ``procfs`` (uncached: :func:`current` is
    the cached one). Never raises: unreadable caches give :data:`FALLBACK_GEOMETRY`'s levels
    with ``caches_known`` false and the reason in the geometry's source. The NUMA nodes are
    read from ``<sysfs>/devices/system/node`` (one assumed node of every CPU online when there
    is none); memory channels and interleave are assumed (:func:`read_layout`)."""
    rd = reader if reader is not None else read_text
    try:
        levels, l1i = read_levels(sysfs, cpu, rd)
        known, caches_source = True, f"sysfs {cache_dir(sysfs, cpu)}"
    except BadInput as exc:
        levels, l1i, known = FALLBACK_GEOMETRY.levels, None, False
        caches_source = f"fallback {FALLBACK_GEOMETRY.spec()} because sysfs failed ({exc})"
    try:
        model = _cpu_model(rd(Path(procfs) / "cpuinfo"))
    except OSError:
        model = "?"
    if model == "?":
        model = platform.processor() or "?"
    try:
        online: tuple[int, ...] = parse_cpulist(rd(Path(sysfs) / "devices/system/cpu/online"))
    except (OSError, ValueError):
        online = ()
    online = online or tuple(range(os.cpu_count() or 1))
    return Machine(levels, l1i, os.sysconf("SC_PAGE_SIZE"), None, None,
                   read_layout(sysfs, online, rd), _hostname(), model, len(online),
                   known, caches_source, f"this host ({sysfs}, {procfs})")


# --------------------------------------------------------------------------------------------
# Machine files


class _FileError(Exception):
    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.what, self.fix = what, fix


_TOP_KEYS = ("format", "version", "page_bytes", "host", "caches", "tlb", "memory", "bank_map")
_TABLE_KEYS = {
    "host": ("hostname", "cpu_model", "cpus_online"),
    "caches": ("level", "type", "size", "ways", "line_bytes", "shared_cpus"),
    "tlb": ("entries", "ways"),
    "memory": ("numa_nodes", "channels_per_node", "interleave_bytes", "provenance"),
    "bank_map": ("banks", "interleave_bytes", "provenance"),
}
_TYPES = ("data", "unified", "instruction")


def _type_name(v: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a float", str: "a string",
            list: "an array", dict: "a table"}.get(type(v), type(v).__name__)


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            field = f"{where}.{key}" if where else key
            raise _FileError(f"unknown key {field}",
                             f"the keys{' of ' + where if where else ''} are "
                             + ", ".join(allowed) + " (format in counterd/machine.py)")


def _int(table: Mapping[str, Any], key: str, where: str, *, minimum: int = 1,
         pow2: bool = False, hint: str = "") -> int | None:
    if key not in table:
        return None
    v = table[key]
    field = f"{where}.{key}" if where else key
    if not isinstance(v, int) or isinstance(v, bool):
        suggestion = "<integer>"
        if isinstance(v, str):
            with contextlib.suppress(BadInput):
                suggestion = f"{parse_size(v)}, without quotes"
        raise _FileError(f"{field} = {v!r} is {_type_name(v)}, not an integer",
                         f"write {key} = {suggestion}{hint}")
    if pow2 and not _is_pow2(v):
        raise _FileError(f"{field} = {v} is not a power of two",
                         f"give {key} as a power of two{hint}")
    if v < minimum:
        raise _FileError(f"{field} = {v}", f"give {key} >= {minimum}{hint}")
    return v


def _str(table: Mapping[str, Any], key: str, where: str) -> str | None:
    if key not in table:
        return None
    v = table[key]
    if not isinstance(v, str):
        raise _FileError(f"{where}.{key} = {v!r} is {_type_name(v)}, not a string",
                         f'write {key} = "..."')
    return v


def _table(doc: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    if key not in doc:
        return None
    v = doc[key]
    if not isinstance(v, dict):
        raise _FileError(f"{key} is {_type_name(v)}, not a table", f"write it as [{key}]")
    _check_keys(v, _TABLE_KEYS[key], key)
    return v


def _cache(c: Any, k: int) -> tuple[str, CacheLevel]:
    where = f"caches[{k}]"
    if not isinstance(c, dict):
        raise _FileError(f"{where} is {_type_name(c)}, not a table",
                         "write each cache as a [[caches]] table")
    _check_keys(c, _TABLE_KEYS["caches"], where)
    for key in ("level", "size", "ways", "line_bytes"):
        if key not in c:
            raise _FileError(f"{where} has no {key}",
                             "give level, size, ways and line_bytes for every cache")
    level = _int(c, "level", where, hint=" (1 for L1)")
    kind = _str(c, "type", where) or ("data" if level == 1 else "unified")
    if kind.lower() not in _TYPES:
        raise _FileError(f"{where}.type = {kind!r}", "give type = data, unified or instruction")
    kind = kind.lower()
    size_v = c["size"]
    if isinstance(size_v, str):
        try:
            size: int | None = parse_size(size_v)
        except BadInput:
            raise _FileError(f"{where}.size = {size_v!r} is not a size",
                             'write a byte count like 49152, "48K" or "2M"') from None
    else:
        size = _int(c, "size", where, hint=' (bytes, or a string like "48K")')
    ways = _int(c, "ways", where, hint=" (the associativity; fully associative: size / line)")
    line = _int(c, "line_bytes", where, pow2=True, minimum=2,
                hint=" (bytes, e.g. 64; sysfs: coherency_line_size)")
    assert level is not None and size is not None and ways is not None and line is not None
    if size <= 0:
        raise _FileError(f"{where}.size = {size_v!r}", "give the size in bytes, > 0")
    if size % (ways * line):
        raise _FileError(f"{where}.size = {size} B is not ways x line_bytes x a whole number of "
                         f"sets ({ways} x {line} B x {size / (ways * line):g})",
                         "check size, ways and line_bytes (the simulators index a whole number "
                         "of sets)")
    if kind == "instruction" and level != 1:
        raise _FileError(f"{where}: an instruction cache at level {level}",
                         'only L1 has a separate instruction cache: write type = "unified"')
    shared: tuple[int, ...] = ()
    if "shared_cpus" in c:
        v = c["shared_cpus"]
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                              and x >= 0 for x in v):
            raise _FileError(f"{where}.shared_cpus = {v!r} is not a list of CPU numbers",
                             "write shared_cpus = [0, 1]")
        shared = tuple(v)
    try:
        return kind, CacheLevel(level, size, ways, line, shared)
    except BadInput as exc:
        raise _FileError(f"{where}: {exc.what}", exc.fix or "check the cache") from None


def _caches(v: Any) -> tuple[tuple[CacheLevel, ...], CacheLevel | None]:
    if not isinstance(v, list) or not v:
        raise _FileError(f"caches is {_type_name(v)}, not an array of tables",
                         "write each cache as a [[caches]] table, or leave caches out")
    data: dict[int, tuple[int, CacheLevel]] = {}
    l1i = None
    for k, c in enumerate(v, start=1):
        kind, lv = _cache(c, k)
        if kind == "instruction":
            if l1i is not None:
                raise _FileError(f"caches[{k}]: a second L1 instruction cache",
                                 "give one instruction cache")
            l1i = lv
        elif lv.level in data:
            raise _FileError(f"caches[{k}]: a second data or unified cache at level "
                             f"{lv.level} (caches[{data[lv.level][0]}] is one)",
                             "give one data or unified cache per level")
        else:
            data[lv.level] = (k, lv)
    numbers = sorted(data)
    if numbers != list(range(1, len(numbers) + 1)) or len(numbers) > MAX_LEVELS:
        raise _FileError(f"caches: data and unified levels {numbers}",
                         f"number them 1, 2, ... without gaps (at most {MAX_LEVELS})")
    for n in numbers[1:]:
        k, lv = data[n]
        prev = data[n - 1][1]
        if lv.line_bytes < prev.line_bytes:
            raise _FileError(f"caches[{k}].line_bytes = {lv.line_bytes} is smaller than L{n - 1}'s"
                             f" line ({prev.line_bytes} B)",
                             f"a line of L{n - 1} must fit in one line of L{n}: give L{n} a line "
                             f"of at least {prev.line_bytes} B")
    return tuple(data[n][1] for n in numbers), l1i


def _numa_nodes(v: Any) -> tuple[NumaNode, ...]:
    fix = 'write numa_nodes = ["0-31", "32-63"]: the CPUs of node 0, 1, ... as sysfs lists them'
    if not isinstance(v, list) or not v:
        raise _FileError(f"memory.numa_nodes = {v!r:.60} is not an array of CPU lists", fix)
    nodes: list[NumaNode] = []
    where: dict[int, int] = {}
    for k, item in enumerate(v):
        cpus: tuple[int, ...] | None = None
        if isinstance(item, str):
            with contextlib.suppress(ValueError):
                cpus = parse_cpulist(item)
        elif isinstance(item, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                            for x in item):
            cpus = tuple(item)
        if cpus is None or any(not 0 <= c <= MAX_CPU_ID for c in cpus):
            raise _FileError(f"memory.numa_nodes: node {k} = {item!r:.60} is not a CPU list", fix)
        if not cpus:
            raise _FileError(f"memory.numa_nodes: node {k} has no CPUs",
                             "list only the NUMA nodes with CPUs, each with its CPUs")
        for c in cpus:
            if c in where:
                raise _FileError(f"memory.numa_nodes: CPU {c} is on node {where[c]} and node {k}",
                                 "put every CPU on one node")
            where[c] = k
        nodes.append(NumaNode(k, tuple(sorted(cpus))))
    return tuple(nodes)


def _memory(doc: Mapping[str, Any], version: int, base: Machine, cpus_online: int | None,
            name: str) -> MemoryLayout:
    """The file's memory layout over ``base``'s: NUMA nodes, channels and interleave it
    declares (``[memory]``, version 2), or banks it declares as they are (``[bank_map]``).
    Without ``numa_nodes``, a file that changes the CPUs online gets one assumed node of them
    (the host's nodes describe other CPUs)."""
    layout = base.memory
    if cpus_online is not None and cpus_online != base.cpus_online:
        layout = dataclasses.replace(assumed_layout(
            range(cpus_online), f"{name} gives {cpus_online} CPUs online and no "
            "memory.numa_nodes"), declared_banks=layout.declared_banks)
    mem = _table(doc, "memory")
    if mem is not None:
        if version < 2:
            raise _FileError(f"[memory] in a version {version} file",
                             "write version = 2 (a version 1 file cannot declare memory)")
        note = f"declared in {name}"
        layout = dataclasses.replace(layout, remark=_str(mem, "provenance", "memory") or "")
        if "numa_nodes" in mem:
            nodes = _numa_nodes(mem["numa_nodes"])
            count = sum(len(n.cpus) for n in nodes)
            online = base.cpus_online if cpus_online is None else cpus_online
            if count != online:
                raise _FileError(f"memory.numa_nodes list {count} CPUs, and {online} are online "
                                 f"({'host.cpus_online' if cpus_online else 'this host'})",
                                 f"list every CPU online on one node, or give "
                                 f"[host] cpus_online = {count}")
            layout = dataclasses.replace(layout, nodes=Sourced(nodes, "declared", note))
        channels = _int(mem, "channels_per_node", "memory",
                        hint=" (memory channels of each NUMA node, e.g. 8)")
        if channels is not None:
            layout = dataclasses.replace(layout, channels_per_node=Sourced(channels, "declared",
                                                                           note))
        interleave = _int(mem, "interleave_bytes", "memory", pow2=True, minimum=8,
                          hint=" (bytes on one channel before the next, e.g. 256)")
        if interleave is not None:
            layout = dataclasses.replace(layout, interleave_bytes=Sourced(interleave,
                                                                          "declared", note))
    banks = _table(doc, "bank_map")
    if banks is not None:
        if mem is not None and ("channels_per_node" in mem or "interleave_bytes" in mem):
            raise _FileError("both [bank_map] and memory.channels_per_node or "
                             "memory.interleave_bytes give the banks",
                             "keep [memory] (banks = channels_per_node x NUMA nodes, "
                             "interleaved on interleave_bytes) or [bank_map], not both")
        n = _int(banks, "banks", "bank_map")
        il = _int(banks, "interleave_bytes", "bank_map", hint=" (bytes, e.g. 256)")
        if n is None or il is None:
            raise _FileError("bank_map needs banks and interleave_bytes",
                             "give both, e.g. banks = 8, interleave_bytes = 256")
        text = _str(banks, "provenance", "bank_map") or f"declared in {name}"
        layout = dataclasses.replace(layout, declared_banks=Sourced(
            BankMap(n, il), "assumed" if text.startswith("assumed") else "declared", text))
    return layout


def _decode(path: Path, raw: bytes) -> dict[str, Any]:
    from counterd import stricttoml
    from counterd.strictjson import Malformed

    try:
        return stricttoml.loads(raw)
    except Malformed as exc:
        raise _FileError(str(exc), "save it as UTF-8 text" if str(exc).startswith("not UTF-8")
                         else "fix the syntax (format in counterd/machine.py and the README, "
                         "section Machine files)") from None


def _apply(doc: Mapping[str, Any], base: Machine, name: str) -> Machine:
    _check_keys(doc, _TOP_KEYS, "")
    fmt = doc.get("format")
    if fmt != FILE_FORMAT:
        raise _FileError(f"format = {fmt!r}" if "format" in doc else "format is missing",
                         f'a machine file starts with format = "{FILE_FORMAT}" and '
                         f"version = {FILE_VERSION}")
    if "version" not in doc:
        raise _FileError("version is missing", f"add version = {FILE_VERSION}")
    version = doc["version"]
    if not isinstance(version, int) or isinstance(version, bool) \
            or version not in SUPPORTED_FILE_VERSIONS:
        raise _FileError(f"version = {version!r} is not supported",
                         "this counterd reads version "
                         + ", ".join(map(str, SUPPORTED_FILE_VERSIONS)))
    changes: dict[str, Any] = {}
    page = _int(doc, "page_bytes", "", pow2=True, hint=" (bytes, e.g. 4096)")
    if page is not None:
        changes["page_bytes"] = page
    host = _table(doc, "host")
    if host is not None:
        for key in ("hostname", "cpu_model"):
            s = _str(host, key, "host")
            if s is not None:
                changes[key] = s
        cpus = _int(host, "cpus_online", "host")
        if cpus is not None:
            changes["cpus_online"] = cpus
    if "caches" in doc:
        levels, l1i = _caches(doc["caches"])
        changes.update(levels=levels, l1i=l1i, caches_known=True,
                       caches_source=f"machine file {name}")
    tlb = _table(doc, "tlb")
    if tlb is not None:
        entries = _int(tlb, "entries", "tlb")
        ways = _int(tlb, "ways", "tlb")
        if entries is None or ways is None:
            raise _FileError("tlb needs entries and ways", "give both, e.g. entries = 64, "
                             "ways = 4")
        if entries % ways:
            raise _FileError(f"tlb.entries = {entries} is not a multiple of tlb.ways = {ways}",
                             "give entries = sets x ways")
        changes.update(tlb_entries=entries, tlb_ways=ways)
    changes["memory"] = _memory(doc, version, base, changes.get("cpus_online"), name)
    try:
        return dataclasses.replace(base, **changes, file=name,
                                   source=f"machine file {name}; the rest: {base.source}")
    except BadInput as exc:  # a combination the field checks above do not see
        raise _FileError(exc.what, exc.fix or "check the file against its format") from None


def load_file(path: str | Path, base: Machine | None = None) -> Machine:
    """The machine a file describes, over ``base`` (default: this host, :func:`host`) for
    what it does not give. Raises BadInput naming the file, the field and the fix."""
    path = Path(path)
    name = str(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read machine file {name}: {exc.strerror or exc}",
                       f"give an existing file with --machine or {ENV_MACHINE}") from None
    try:
        return _apply(_decode(path, raw), base if base is not None else host(), name)
    except _FileError as exc:
        raise BadInput(f"machine file {name}: {exc.what}", exc.fix) from None


# --------------------------------------------------------------------------------------------
# This process's machine

_lock = threading.RLock()
_host: Machine | None = None
_files: dict[str, Machine] = {}
_overrides: list[Machine] = []


def host() -> Machine:
    """This host as sysfs and procfs describe it, read once per process."""
    global _host
    with _lock:
        if _host is None:
            _host = read()
        return _host


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
    global _host
    with _lock:
        _host = None
        _files.clear()
