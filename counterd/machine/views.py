"""Views of the one machine record (:class:`counterd.machine.description.Machine`): the narrower
things a consumer needs, each built from the record (or, for a machine given by hand such as
the paper's, from the same typed parts: :class:`~counterd.machine.geometry.Geometry`,
:class:`~counterd.machine.memory.BankMap`, :class:`~counterd.machine.memory.MemoryLayout`).

- :class:`NodeView`: the node a run of microbench patterns uses: the CPUs its ranks are pinned
  to, in order, the cache geometry, the bank map (with where it came from), word and page size
  and the memory layout; :meth:`NodeView.of` builds it from the record, and
  :meth:`NodeView.to_json` is the one writer of the machine part of a microbench results file
  (``geometry``, ``bank_map``, ``word_bytes``, ``page_bytes``, ``memory``, ``rank_cpus``).
- :class:`GeometryTable` and :class:`BankTable`: those two sections as a results file or a
  machine profile holds them, read back typed (levels, cache spec, banks) while keeping the
  table as written, so that a profile writes back byte for byte what it read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from counterd.data.errors import BadInput
from counterd.machine.description import Machine, fingerprint_size
from counterd.machine.geometry import CacheLevel, Geometry
from counterd.machine.memory import BankMap, MemoryLayout

# Most processors of a pattern whose processors share data (concurrent, coherence variants):
# simulating such a pattern on p processors costs about p^2 times one processor's accesses
# (every access snoops the others' private caches). On the 16-CPU node of issue 35 (a 300 MB
# L3, so 600 MB memory sweeps) the quick suite's shared-data patterns on 8 processors alone
# were estimated at over a minute of simulation, the full suite's at over 20: 4 keeps both
# suites within their targets on 16 to 128 CPUs. The paper's machine had 8 processors
# (catalogue(..., coherent_procs=8), microbench --coherent-procs 8: its Table 1 whole).
COHERENT_MAX_PROCS = 4


@dataclass(frozen=True)
class NodeView:
    """What a run of patterns needs to know about a node: usable CPUs, in the order a
    pattern's ranks are pinned to them (rank k on ``cpus[k]``), cache geometry, bank map (with
    where it came from), word and page size, and the memory layout the CPU order and banks come
    from (None for a machine given by hand, e.g. the paper's). Built from the machine record
    by :meth:`of`."""

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

    @classmethod
    def of(cls, machine: Machine, cpus: tuple[int, ...], *, name: str = "host",
           geometry: Geometry | None = None, bank_map: BankMap | None = None,
           bank_provenance: str | None = None, word_bytes: int = 8) -> NodeView:
        """``machine`` as a run on ``cpus`` (in rank order) sees it: its geometry, bank map
        and page size, each of the first two overridable (a bank map given here without a
        provenance is described as given)."""
        return cls(name, cpus, geometry if geometry is not None else machine.geometry,
                   bank_map if bank_map is not None else machine.bank_map,
                   bank_provenance or (machine.bank_provenance if bank_map is None
                                       else f"given: {bank_map.banks} banks x "
                                            f"{bank_map.interleave_bytes} B"),
                   word_bytes=word_bytes, page_bytes=machine.page_bytes, memory=machine.memory)

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

    def to_json(self) -> dict[str, Any]:
        """The machine part of a microbench results file: ``geometry`` (spec, levels, DTLB,
        page, source), ``bank_map`` (banks, interleave, provenance), ``word_bytes``,
        ``page_bytes`` and, for a node with a memory layout, ``memory`` and ``rank_cpus``."""
        return {
            "geometry": GeometryTable.of(self.geometry).to_dict(),
            "bank_map": BankTable.of(self.bank_map, self.bank_provenance).to_dict(),
            "word_bytes": self.word_bytes,
            "page_bytes": self.page_bytes,
            **({"memory": self.memory.to_json(), "rank_cpus": list(self.cpus)}
               if self.memory is not None else {}),
        }


# --------------------------------------------------------------------------------------------
# The machine's sections of a results file and a profile


def caches_spec(levels: Iterable[Mapping[str, Any]]) -> str:
    """``L1=48K/12/64,L2=...``: size/ways/line of each level table (``level``, ``size_bytes``,
    ``ways``, ``line_bytes``), in level order: the fingerprint's cache field
    (:attr:`counterd.machine.description.Machine.caches_spec` of the same levels)."""
    return ",".join(f"L{int(lv['level'])}={fingerprint_size(int(lv['size_bytes']))}/"
                    f"{int(lv['ways'])}/{int(lv['line_bytes'])}"
                    for lv in sorted(levels, key=lambda x: x["level"]))


class _Table(Mapping[str, Any]):
    """A section as written (read-only; iterated in its order), with typed fields on top."""

    __slots__ = ("_table",)

    def __init__(self, table: Mapping[str, Any]) -> None:
        self._table = dict(table)

    def __getitem__(self, key: str) -> Any:
        return self._table[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._table!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._table,))

    def to_dict(self) -> dict[str, Any]:
        """The table as written (what a results file or a profile holds)."""
        return dict(self._table)


class GeometryTable(_Table):
    """The ``geometry`` section: ``spec``, ``levels`` (each ``level``, ``size_bytes``,
    ``ways``, ``line_bytes``, ``shared_cpus``), ``tlb_entries``, ``tlb_ways``, ``page_bytes``,
    ``source``; a profile of the paper's machine has only spec, levels and source. Written by
    :meth:`of`; the readers check the levels' fields before they wrap a table read back."""

    __slots__ = ()

    @classmethod
    def of(cls, g: Geometry) -> GeometryTable:
        return cls({
            "spec": g.spec(),
            "levels": [{"level": lv.level, "size_bytes": lv.size_bytes, "ways": lv.ways,
                        "line_bytes": lv.line_bytes, "shared_cpus": list(lv.shared_cpus)}
                       for lv in g.levels],
            "tlb_entries": g.tlb_entries, "tlb_ways": g.tlb_ways, "page_bytes": g.page_bytes,
            "source": g.source,
        })

    @classmethod
    def wrap(cls, table: Mapping[str, Any]) -> GeometryTable:
        return table if isinstance(table, cls) else cls(table)

    @property
    def level_tables(self) -> list[Mapping[str, Any]]:
        return list(self._table.get("levels", ()))

    @property
    def levels(self) -> tuple[int, ...]:
        """The cache levels, e.g. (1, 2, 3)."""
        return tuple(sorted(int(lv["level"]) for lv in self.level_tables))

    @property
    def caches_spec(self) -> str:
        """The fingerprint's cache field of these levels (:func:`caches_spec`)."""
        return caches_spec(self.level_tables)

    def cache_levels(self) -> tuple[CacheLevel, ...]:
        """The levels as :class:`~counterd.machine.geometry.CacheLevel`, in the table's order:
        KeyError, TypeError or ValueError where a field is missing or no number, BadInput
        where a level is not a cache."""
        return tuple(CacheLevel(int(lv["level"]), int(lv["size_bytes"]), int(lv["ways"]),
                                int(lv["line_bytes"]), tuple(lv.get("shared_cpus", ())))
                     for lv in self._table["levels"])


class BankTable(_Table):
    """The ``bank_map`` section: ``banks``, ``interleave_bytes``, ``provenance`` (where the
    map came from). Written by :meth:`of`."""

    __slots__ = ()

    @classmethod
    def of(cls, bank_map: BankMap, provenance: str) -> BankTable:
        return cls({"banks": bank_map.banks, "interleave_bytes": bank_map.interleave_bytes,
                    "provenance": provenance})

    @classmethod
    def wrap(cls, table: Mapping[str, Any]) -> BankTable:
        return table if isinstance(table, cls) else cls(table)

    @property
    def banks(self) -> int:
        """The number of banks (1 when the section gives none)."""
        return int(self._table.get("banks") or 1)

    @property
    def provenance(self) -> str:
        return str(self._table.get("provenance", ""))
