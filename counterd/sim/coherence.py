"""Simulated processors: :class:`CacheSim` (one), :class:`CoherentSim` and :func:`simulate`
(several).

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
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

import numpy as np

from counterd.data.errors import BadInput
from counterd.machine.geometry import Geometry
from counterd.machine.memory import SGI_BANKS, BankMap
from counterd.sim.counts import BankCounts, EngineName, ProcessorCounts, SimResult
from counterd.sim.engines import _CSeg, _NativeEngine, _PythonEngine, native_status
from counterd.sim.sampling import SetSampling
from counterd.sim.streams import KIND_CODES, AddressStream, Stream, StridedStream

DEFAULT_CHUNK = 8  # accesses per turn when coherent processors interleave (module doc)


class CacheSim:
    """One processor's simulated hierarchy. ``engine``: "auto" (native if built, else python),
    "native" (BadInput if unavailable) or "python". ``engine_name`` says which one runs.
    ``sampling``: simulate one level on a sample of its sets (:mod:`counterd.sim.sampling`;
    its counts are then those of the sample, for :func:`counterd.sim.sampling.estimate`)."""

    def __init__(self, geometry: Geometry, bankmap: BankMap = SGI_BANKS,
                 engine: Literal["auto", "native", "python"] = "auto", *,
                 sampling: SetSampling | None = None) -> None:
        if engine not in ("auto", "native", "python"):
            raise BadInput(f"unknown engine {engine!r}", "use auto, native or python")
        ok, why = native_status()
        if engine == "native" and not ok:
            raise BadInput(f"the native cache simulator is unavailable: {why}",
                           'use engine="python" or "auto"')
        use_native = ok and engine != "python"
        self.geometry = geometry
        self.bankmap = bankmap
        self.sampling = sampling
        if sampling is not None:
            sampling.index(geometry)  # BadInput for a level the geometry does not have
        self._engine: _NativeEngine | _PythonEngine = (
            _NativeEngine(geometry, bankmap, sampling=sampling) if use_native
            else _PythonEngine(geometry, bankmap, sampling=sampling))

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
    turns of ``chunk`` accesses. ``engine`` as for :class:`CacheSim`.

    ``snoop=False``: the shared levels are still one cache, but no processor snoops another's
    private levels (no invalidations, no transfers): exact, and cheaper by a factor growing
    with the processors, where they touch disjoint lines (exclusive patterns), whose only
    interaction is competition for the shared levels' sets. ``sampling``: as for
    :class:`CacheSim`."""

    def __init__(self, geometry: Geometry, processors: int, bankmap: BankMap = SGI_BANKS,
                 engine: Literal["auto", "native", "python"] = "auto", *,
                 chunk: int = DEFAULT_CHUNK, snoop: bool = True,
                 sampling: SetSampling | None = None) -> None:
        if processors < 1 or chunk < 1:
            raise BadInput(f"{processors} processors interleaved in turns of {chunk} accesses",
                           "give at least one processor and chunk >= 1")
        probe = CacheSim(geometry, bankmap, engine, sampling=sampling)  # validates, picks auto
        self.geometry, self.bankmap, self.chunk = geometry, bankmap, chunk
        self.engine_name: EngineName = probe.engine_name
        self._py: list[_PythonEngine] = []
        self._c: list[_NativeEngine] = []
        if self.engine_name == "python":
            first = _PythonEngine(geometry, bankmap, coherent=True, sampling=sampling)
            self._py = [first] + [_PythonEngine(geometry, bankmap, coherent=True,
                                                shared_from=first, sampling=sampling)
                                  for _ in range(processors - 1)]
            if snoop:
                for e in self._py:
                    e.peers = self._py
        else:
            c0 = _NativeEngine(geometry, bankmap, coherent=True, sampling=sampling)
            self._c = [c0] + [_NativeEngine(geometry, bankmap, coherent=True, shared_from=c0,
                                            sampling=sampling)
                              for _ in range(processors - 1)]
            self._procs = np.array([e.addr for e in self._c], np.uint64)
            if snoop:
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
