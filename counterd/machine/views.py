"""Views of the one machine record (:class:`counterd.machine.description.Machine`): the narrower
things a consumer needs, each built from the record (or, for a machine given by hand such as
the paper's, from the same typed parts: :class:`~counterd.machine.geometry.Geometry`,
:class:`~counterd.machine.memory.BankMap`, :class:`~counterd.machine.memory.MemoryLayout`).

- :class:`NodeView`: the node a run of microbench patterns uses: the CPUs its ranks are pinned
  to, in order, the cache geometry, the bank map (with where it came from), word and page size
  and the memory layout; :meth:`NodeView.of` builds it from the record, and
  :meth:`NodeView.to_json` is the one writer of the machine part of a microbench results file
  (``geometry``, ``bank_map``, ``word_bytes``, ``page_bytes``, ``memory``, ``rank_cpus``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from counterd.data.errors import BadInput
from counterd.machine.description import Machine
from counterd.machine.geometry import Geometry
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
        g = self.geometry
        return {
            "geometry": {
                "spec": g.spec(),
                "levels": [{"level": lv.level, "size_bytes": lv.size_bytes, "ways": lv.ways,
                            "line_bytes": lv.line_bytes, "shared_cpus": list(lv.shared_cpus)}
                           for lv in g.levels],
                "tlb_entries": g.tlb_entries, "tlb_ways": g.tlb_ways,
                "page_bytes": g.page_bytes, "source": g.source,
            },
            "bank_map": {"banks": self.bank_map.banks,
                         "interleave_bytes": self.bank_map.interleave_bytes,
                         "provenance": self.bank_provenance},
            "word_bytes": self.word_bytes,
            "page_bytes": self.page_bytes,
            **({"memory": self.memory.to_json(), "rank_cpus": list(self.cpus)}
               if self.memory is not None else {}),
        }
