"""The machine as data (:class:`Machine`): what counterd counts on and simulates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from counterd.machine.geometry import (
    DEFAULT_TLB_ENTRIES,
    DEFAULT_TLB_WAYS,
    TLB_NOTE,
    CacheLevel,
    Geometry,
)
from counterd.machine.memory import BankMap, MemoryLayout

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
            tlb, note = (DEFAULT_TLB_ENTRIES, DEFAULT_TLB_WAYS), [TLB_NOTE]
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
