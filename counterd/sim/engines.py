"""The engines that simulate one processor: a pure-Python reference and cachesim.c.

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
* a line's set is ``counterd.machine.geometry.set_index`` of its level's ``index`` (modulo by
  default; hashed or sliced like a real last level);
* a data TLB: LRU set-associative over page numbers, looked up by every load and store;
* cache state persists across streams (warm caches), as on hardware; ``flush()`` writes every
  dirty line back (counted) and leaves the lines valid and clean;
* addresses are full 64-bit values (pycachesim truncates them to 32 bits, its issue 15, which
  is why it is only the tests' cross-check, fed offsets below 4 GiB).

Both engines also implement the coherence protocol of :mod:`counterd.sim.coherence`.
"""

from __future__ import annotations

import ctypes

import numpy as np

from counterd import _native
from counterd.machine.geometry import MAX_LEVELS, Geometry, hash_low, set_index
from counterd.machine.memory import BankMap
from counterd.sim.counts import (
    LEVEL_COUNT_FIELDS,
    BankCounts,
    EngineName,
    LevelCounts,
    ProcessorCounts,
)
from counterd.sim.sampling import SetSampling
from counterd.sim.streams import KIND_CODES, Stream, StridedStream

# Per-level counters, in the order of cachesim.c's enum.
LEVEL_FIELDS = LEVEL_COUNT_FIELDS
_HITS, _MISSES, _WB_HITS, _WB_MISSES, _WRITEBACKS, _SKIPPED, _WB_SKIPPED = range(7)
_READ, _WRITE, _WB = range(3)


class _PythonEngine:
    """The executable specification: MRU-first lists per set, straight from the module doc."""

    name: EngineName = "python"

    def __init__(self, geometry: Geometry, bankmap: BankMap, *, coherent: bool = False,
                 shared_from: _PythonEngine | None = None,
                 sampling: SetSampling | None = None) -> None:
        self.g = geometry
        self.bankmap = bankmap
        self.sets: list[dict[int, list[list[int]]]] = [{} for _ in geometry.levels]
        # set sampling (counterd.sim.sampling): the level it samples, or -1
        self.sampled = sampling.index(geometry) if sampling is not None else -1
        self.sampling = sampling
        self.low = [hash_low(lv) for lv in geometry.levels]  # set index (machine.set_index)
        # Coherence (coherence module doc): a system's processors share the sets of levels
        # npriv.. and list each other in peers; an independent processor is its own only peer.
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
        s = set_index(level.sets, self.low[k], line)
        if k == self.sampled and self.sampling is not None and not self.sampling.simulates(s):
            counts[_WB_SKIPPED if op == _WB else _SKIPPED] += 1  # outside the sample
            return
        ways = self.sets[k].setdefault(s, [])  # entries [line, dirty], MRU first
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
        cleans dirty ones (coherence module doc). Whether any copy was dirty (then: a
        transfer)."""
        found_dirty = False
        last = self.g.levels[self.npriv - 1].line_bytes
        for o in self.peers:
            if o is self:
                continue
            held = was_dirty = False
            for k in range(o.npriv):
                level = o.g.levels[k]
                line = addr // level.line_bytes
                ways = o.sets[k].get(set_index(level.sets, o.low[k], line), [])
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
                ("line_bytes", ctypes.c_uint64), ("hash_low", ctypes.c_uint64),
                ("sample_block", ctypes.c_uint64), ("sample_every", ctypes.c_uint64),
                ("tags", ctypes.c_void_p),
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
        return False, (f"cachesim.c's state is {size} B but counterd/sim/engines.py expects "
                       f"{ctypes.sizeof(_CState)} B: rebuild with pip install -e .")
    return True, "native library loaded"


class _NativeEngine:
    """cachesim.c over numpy-owned state, so caches stay warm between calls."""

    name: EngineName = "native"

    def __init__(self, geometry: Geometry, bankmap: BankMap, *, coherent: bool = False,
                 shared_from: _NativeEngine | None = None,
                 sampling: SetSampling | None = None) -> None:
        self.g = geometry
        lib = _native.lib()
        if lib is None:  # CacheSim checks native_status() first
            raise RuntimeError(_native.missing_reason())
        self.lib: ctypes.CDLL = lib
        self._keep: list[np.ndarray] = []  # arrays the C state points into
        st = _CState()
        st.nlevels = len(geometry.levels)
        st.npriv, st.nprocs = len(geometry.levels), 1
        # A system's processors share the clock and the arrays of levels npriv.. (coherence
        # module doc).
        self.clock: np.ndarray = (np.zeros(1, np.uint64) if shared_from is None
                                  else shared_from.clock)
        st.clock = self.clock.ctypes.data
        if coherent:
            st.npriv = geometry.private_levels
        for i, lv in enumerate(geometry.levels):
            if shared_from is not None and i >= st.npriv:
                self._share_level(st.level[i], shared_from, i)
            else:
                self._fill_level(st.level[i], lv.sets, lv.ways, lv.line_bytes, hash_low(lv))
        if sampling is not None:
            lv = st.level[sampling.index(geometry)]
            lv.sample_block, lv.sample_every = sampling.block, sampling.every
        self._fill_level(st.tlb, geometry.tlb_sets, geometry.tlb_ways, geometry.page_bytes)
        st.banks, st.interleave = bankmap.banks, bankmap.interleave_bytes
        self.lm = np.zeros(bankmap.banks, np.uint64)
        self.wb = np.zeros(bankmap.banks, np.uint64)
        st.lm, st.wb = self.lm.ctypes.data, self.wb.ctypes.data
        self.state = st
        self.addr = ctypes.addressof(st)

    def _fill_level(self, cl: _CLevel, sets: int, ways: int, line_bytes: int,
                    low: int = 0) -> None:
        tags = np.zeros(sets * ways, np.uint64)  # calloc'ed: untouched sets cost no memory
        stamps = np.zeros(sets * ways, np.uint64)
        dirty = np.zeros(sets * ways, np.uint8)
        counts = np.zeros(len(LEVEL_FIELDS), np.uint64)
        self._keep += [tags, stamps, dirty, counts]
        cl.sets, cl.ways, cl.line_bytes, cl.hash_low = sets, ways, line_bytes, low
        cl.tags, cl.stamps, cl.dirty = tags.ctypes.data, stamps.ctypes.data, dirty.ctypes.data
        cl.counts = counts.ctypes.data

    def _share_level(self, cl: _CLevel, other: _NativeEngine, i: int) -> None:
        tags, stamps, dirty = other._keep[4 * i: 4 * i + 3]
        counts = np.zeros(len(LEVEL_FIELDS), np.uint64)  # each processor counts its own
        self._keep += [tags, stamps, dirty, counts]
        src = other.state.level[i]
        cl.sets, cl.ways, cl.line_bytes, cl.hash_low = (src.sets, src.ways, src.line_bytes,
                                                         src.hash_low)
        cl.sample_block, cl.sample_every = src.sample_block, src.sample_every
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
