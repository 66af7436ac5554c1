"""Memory: the bank of an address (:class:`BankMap`) and the layout it derives from (NUMA nodes,
channels, interleave, each read, declared or assumed: :class:`MemoryLayout`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from counterd.data.errors import BadInput

if TYPE_CHECKING:
    import numpy as np

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
