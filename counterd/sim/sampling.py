"""Set sampling: simulate one cache level on a sample of its sets and scale what it counts.

A standard technique of trace-driven cache simulation (Kessler, Hill and Wood, "A comparison
of trace-sampling techniques for multi-megabyte caches", IEEE Transactions on Computers 43(6),
1994): the sets of a level are split into blocks of ``block`` consecutive sets, and only one
block in ``every`` is simulated. A request that reaches the level in a set outside the sample
is counted (``LevelCounts.skipped`` / ``wb_skipped``) and goes no further: it neither hits nor
misses, and sends nothing below. The sampled sets see exactly the requests they would see in
the full simulation (the levels above are simulated whole, and a level's state never depends
on the levels below it: non-inclusive caches), so what the level and the levels and memory
below it count is exact for the sample; :func:`estimate` scales it to all the sets by the
ratio of requests that arrived to requests simulated.

Why: a sweep over twice a last level of hundreds of megabytes (a sysfs L3 of 300 MB) makes
the simulator visit every set of a 300 MB cache, whose tags, stamps and dirty bits (78 MB)
miss the simulating host's own caches at every access; a sample of 1 set in 16 keeps them
there. What it gives up: counts of the sampled level and below are estimates (exact counts
for the levels above it, the TLB, loads and stores); a pattern whose accesses fall unevenly
on the blocks (a stride that is a multiple of the sample's period) is estimated from the
blocks it does reach, or as zero if it reaches none. Blocks of consecutive sets keep each
bank's share of the sampled lines (bank = address // interleave % banks): a block of 4096
64 B sets spans 256 KiB, a whole number of bank cycles for any power-of-two cycle up to that
(128 cycles of 8 x 256 B); of a 12 x 256 B cycle, 85.3 (banks' shares within 1.2%). A block
shorter than a bank cycle would leave banks out of the sample (tests/sim/test_sampling.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from counterd.data.errors import BadInput
from counterd.machine.geometry import Geometry
from counterd.sim.counts import BankCounts, LevelCounts, ProcessorCounts


@dataclass(frozen=True)
class SetSampling:
    """Simulate level ``level`` (its number: 3 for L3) on one block of ``block`` consecutive
    sets in every ``every``: set ``s`` is simulated when ``(s // block) % every == 0``."""

    level: int
    every: int
    block: int

    def __post_init__(self) -> None:
        if self.level < 1 or self.every < 1 or self.block < 1:
            raise BadInput(f"set sampling {self}", "level, every and block are >= 1")

    def simulates(self, set_index: int) -> bool:
        return (set_index // self.block) % self.every == 0

    def index(self, geometry: Geometry) -> int:
        """Position of the sampled level in ``geometry.levels``; BadInput if it has none."""
        for i, lv in enumerate(geometry.levels):
            if lv.level == self.level:
                return i
        raise BadInput(f"set sampling of L{self.level}: the geometry {geometry.spec()} has "
                       "no such level", "sample one of its levels")

    def sampled_sets(self, sets: int) -> int:
        """How many of ``sets`` sets are simulated."""
        full, rest = divmod(sets, self.block * self.every)
        return full * self.block + min(rest, self.block)

    def period_bytes(self, geometry: Geometry) -> int:
        """Address shifts that leave the sample's sets the same: the sample's period in bytes
        (a modulo-indexed level)."""
        lv = geometry.levels[self.index(geometry)]
        return self.block * self.every * lv.line_bytes

    def to_json(self, geometry: Geometry) -> dict[str, Any]:
        lv = geometry.levels[self.index(geometry)]
        sampled = self.sampled_sets(lv.sets)
        return {"level": self.level, "every": self.every, "block_sets": self.block,
                "sets": lv.sets, "sampled_sets": sampled,
                "fraction": round(sampled / lv.sets, 6),
                "method": "set sampling: counts of this level and below scaled from the "
                          "sampled sets by requests arrived / requests simulated"}


def _ratio(total: int, simulated: int) -> float:
    return total / simulated if simulated else 0.0


def _scaled(x: int, f: float) -> int:
    return int(round(x * f))


def estimate(counts: ProcessorCounts, sampling: SetSampling | None,
             geometry: Geometry) -> ProcessorCounts:
    """Counts of the whole level estimated from its sample (module doc): the level's hits and
    misses scaled by demand requests arrived over simulated, its writeback hits and misses
    likewise for writebacks, its own writebacks and everything below it (further levels,
    LM(b), WB(b)) by all requests arrived over all simulated. Give it the difference of two
    snapshots (what a superstep did), not a snapshot to be differenced after scaling.
    ``sampling`` None: ``counts`` unchanged."""
    if sampling is None:
        return counts
    i = sampling.index(geometry)
    lv = counts.levels[i]
    demand, wb = lv.hits + lv.misses, lv.wb_hits + lv.wb_misses
    f_demand = _ratio(demand + lv.skipped, demand)
    f_wb = _ratio(wb + lv.wb_skipped, wb)
    f_all = _ratio(demand + wb + lv.skipped + lv.wb_skipped, demand + wb)
    levels = list(counts.levels)
    levels[i] = LevelCounts(lv.level, _scaled(lv.hits, f_demand), _scaled(lv.misses, f_demand),
                            _scaled(lv.wb_hits, f_wb), _scaled(lv.wb_misses, f_wb),
                            _scaled(lv.writebacks, f_all))
    for j in range(i + 1, len(levels)):
        b = levels[j]
        levels[j] = LevelCounts(b.level, *(_scaled(getattr(b, f), f_all) for f in
                                           ("hits", "misses", "wb_hits", "wb_misses",
                                            "writebacks")))
    banks = BankCounts(tuple(_scaled(x, f_all) for x in counts.banks.lm),
                       tuple(_scaled(x, f_all) for x in counts.banks.wb))
    return dataclasses.replace(counts, levels=tuple(levels), banks=banks)


# The quick calibration samples the last level when it is larger than this: its simulated
# state (17 B a line: tag, LRU stamp, dirty byte) then outgrows the simulating host's caches.
SAMPLE_ABOVE_BYTES = 64 << 20
SAMPLE_EVERY = 16
SAMPLE_BLOCK_SETS = 4096


def for_large_last_level(geometry: Geometry) -> SetSampling | None:
    """The sampling the quick calibration uses: the last level, 1 block of
    :data:`SAMPLE_BLOCK_SETS` sets in :data:`SAMPLE_EVERY`, when the level is larger than
    :data:`SAMPLE_ABOVE_BYTES` and has at least two such periods of sets; else None."""
    if not geometry.levels:
        return None
    lv = geometry.levels[-1]
    if lv.size_bytes <= SAMPLE_ABOVE_BYTES or lv.sets < 2 * SAMPLE_EVERY * SAMPLE_BLOCK_SETS:
        return None
    return SetSampling(lv.level, SAMPLE_EVERY, SAMPLE_BLOCK_SETS)


def period_lcm(period: int, sampling: SetSampling | None, geometry: Geometry) -> int:
    """``period`` (shifts that leave a simulation's counts unchanged) made a multiple of the
    sample's period, so that such a shift also leaves the sample the same."""
    if sampling is None:
        return period
    return math.lcm(period, sampling.period_bytes(geometry))


__all__ = ["SAMPLE_ABOVE_BYTES", "SAMPLE_BLOCK_SETS", "SAMPLE_EVERY", "SetSampling", "estimate",
           "for_large_last_level", "period_lcm"]
