"""Native inner loops with exactly known access streams (DESIGN.md section 7).

A :class:`KernelCall` names one call of a C kernel in ``counterd/_native/kernels.c`` on an
offset into a buffer. :meth:`KernelCall.run` executes it; :meth:`KernelCall.stream` is the
address stream it executes, in the form ``counterd.sim`` simulates, with addresses
given as offsets into the buffer (the run's region is page-aligned, so offsets and real
addresses agree on everything below the page size: line, set within a page, 256 B bank unit).

Kernels (all on uint64_t words; loads feed a returned sum, so none can be optimised away):

* ``load``  -- ``counterd_load_stride``: sum += base[i*stride]
* ``store`` -- ``counterd_store_stride``: base[i*stride] = value + i
* ``rmw``   -- ``counterd_rmw_stride``: base[i*stride] += 1 (a load, then a store)
* ``mixed`` -- ``counterd_mixed_stride``: access i is a store when i % k == k - 1, else a load
* ``flush`` -- ``counterd_flush_stride``: clflush / dc civac of each accessed line (coherence
  set-up only; the simulator has no flush of single lines, see :meth:`KernelCall.stream`)

and :class:`CopyCall`, ``counterd_copy2d``: a two-dimensional copy, dst[r][c] = src[r][c] with
row pitches in words -- the row and column transfers of the memory-lines-touched benchmark and
the copy, pack and unpack of the memory logP one.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Literal

import numpy as np

from counterd import _native
from counterd.data.errors import BackendUnavailable, BadInput
from counterd.sim import KIND_CODES, AddressStream, StridedStream

KernelName = Literal["load", "store", "rmw", "mixed", "flush"]
KERNELS: tuple[str, ...] = ("load", "store", "rmw", "mixed", "flush")
WORD_BYTES = 8  # the kernels index uint64_t


def native_lib(symbol: str = "counterd_mixed_stride") -> ctypes.CDLL:
    """The native library with the microbench kernels (``symbol`` among them), or
    BackendUnavailable with the fix."""
    lib = _native.lib()
    if lib is None:
        raise BackendUnavailable("native kernels", _native.missing_reason(),
                                 "install gcc and run pip install -e .")
    if not hasattr(lib, symbol):
        raise BackendUnavailable("native kernels", "the native library predates the "
                                 "microbench kernels", "rebuild it: pip install -e .")
    return lib


@dataclass(frozen=True)
class KernelCall:
    """``kernel(buffer + offset_bytes, count, stride_words, reps[, store_every])``."""

    kernel: KernelName
    offset_bytes: int
    count: int
    stride_words: int
    reps: int = 1
    store_every: int = 0

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise BadInput(f"unknown kernel {self.kernel!r}", "use " + ", ".join(KERNELS))
        if self.count <= 0 or self.stride_words <= 0 or self.reps <= 0:
            raise BadInput(f"kernel call {self}", "count, stride and reps must be >= 1")
        if self.offset_bytes < 0 or self.offset_bytes % WORD_BYTES:
            raise BadInput(f"kernel offset {self.offset_bytes}", "offsets are whole 8 B words")
        if self.kernel == "mixed" and self.store_every < 1:
            raise BadInput("mixed kernel without store_every", "give store_every >= 1")

    @property
    def end_bytes(self) -> int:
        return self.offset_bytes + (self.count - 1) * self.stride_words * WORD_BYTES + WORD_BYTES

    @property
    def accesses(self) -> int:
        if self.kernel == "flush":
            return 0
        return self.count * self.reps * (2 if self.kernel == "rmw" else 1)

    def run(self, lib: ctypes.CDLL, buffer_address: int, value: int = 0) -> int:
        """Execute on the buffer at ``buffer_address``; return the kernel's checksum (the sum
        of loaded values; 0 for store, rmw and flush). The caller guarantees the buffer holds
        :attr:`end_bytes`."""
        addr = buffer_address + self.offset_bytes
        if self.kernel == "load":
            return int(lib.counterd_load_stride(addr, self.count, self.stride_words, self.reps))
        if self.kernel == "store":
            lib.counterd_store_stride(addr, self.count, self.stride_words, self.reps, value)
            return 0
        if self.kernel == "rmw":
            lib.counterd_rmw_stride(addr, self.count, self.stride_words, self.reps)
            return 0
        if self.kernel == "mixed":
            return int(lib.counterd_mixed_stride(addr, self.count, self.stride_words, self.reps,
                                                 self.store_every, value))
        for _ in range(self.reps):
            if lib.counterd_flush_stride(addr, self.count, self.stride_words) != 0:
                raise BackendUnavailable("native kernels", "no cache-line flush instruction "
                                         "is known on this architecture",
                                         "run without coherence variants")
        return 0

    def stream(self) -> StridedStream | AddressStream | None:
        """The stream this call executes, addresses as offsets (None for ``flush``: the
        simulator can only flush whole caches, so a line flush is not modelled)."""
        if self.kernel == "flush":
            return None
        if self.kernel in ("load", "store", "rmw"):
            return StridedStream.from_kernel(f"{self.kernel}_stride", self.count,
                                             self.stride_words, self.reps, self.offset_bytes)
        one = (np.uint64(self.offset_bytes)
               + np.arange(self.count, dtype=np.uint64) * np.uint64(self.stride_words
                                                                    * WORD_BYTES))
        kinds = np.full(self.count, KIND_CODES["load"], np.uint8)
        kinds[self.store_every - 1::self.store_every] = KIND_CODES["store"]
        return AddressStream(np.tile(one, self.reps), np.tile(kinds, self.reps))


@dataclass(frozen=True)
class CopyCall:
    """``counterd_copy2d``: ``rows`` x ``cols`` words from ``src`` (row pitch ``src_pitch``
    words) to ``dst`` (pitch ``dst_pitch``), ``reps`` times; offsets in bytes into the buffer."""

    dst_offset: int
    dst_pitch: int
    src_offset: int
    src_pitch: int
    rows: int
    cols: int
    reps: int = 1

    def __post_init__(self) -> None:
        if min(self.rows, self.cols, self.reps, self.dst_pitch, self.src_pitch) < 1:
            raise BadInput(f"copy call {self}", "rows, cols, reps and pitches must be >= 1")
        if self.cols > min(self.src_pitch, self.dst_pitch) and self.rows > 1:
            raise BadInput(f"copy call {self}", "a row of cols words must fit in each pitch")
        if min(self.dst_offset, self.src_offset) < 0 or (self.dst_offset | self.src_offset) % 8:
            raise BadInput(f"copy offsets {self.src_offset}, {self.dst_offset}",
                           "offsets are whole 8 B words, >= 0")

    @property
    def end_bytes(self) -> int:
        return max(off + ((self.rows - 1) * pitch + self.cols) * WORD_BYTES
                   for off, pitch in ((self.src_offset, self.src_pitch),
                                      (self.dst_offset, self.dst_pitch)))

    @property
    def accesses(self) -> int:
        return 2 * self.rows * self.cols * self.reps

    @property
    def words(self) -> int:
        """Words copied by one repetition."""
        return self.rows * self.cols

    def run(self, lib: ctypes.CDLL, buffer_address: int, value: int = 0) -> int:
        """Copy; return the last word copied. ``value`` is unused (the signature of
        :meth:`KernelCall.run`)."""
        return int(lib.counterd_copy2d(buffer_address + self.dst_offset, self.dst_pitch,
                                       buffer_address + self.src_offset, self.src_pitch,
                                       self.rows, self.cols, self.reps))

    def stream(self) -> AddressStream:
        """Load of each source word, then store of its destination word, row by row."""
        r = np.arange(self.rows, dtype=np.uint64)[:, None]
        c = np.arange(self.cols, dtype=np.uint64)[None, :]
        w = np.uint64(WORD_BYTES)
        src = np.uint64(self.src_offset) + (r * np.uint64(self.src_pitch) + c) * w
        dst = np.uint64(self.dst_offset) + (r * np.uint64(self.dst_pitch) + c) * w
        addr = np.stack([src.ravel(), dst.ravel()], axis=1).ravel()
        kinds = np.tile(np.array([KIND_CODES["load"], KIND_CODES["store"]], np.uint8),
                        self.words)
        return AddressStream(np.tile(addr, self.reps), np.tile(kinds, self.reps))


Call = KernelCall | CopyCall  # what a worker's plan runs


def prefault_call(offset_bytes: int, length_bytes: int, page_bytes: int) -> KernelCall:
    """A store to one word of every page of ``[offset, offset + length)``: run by the worker
    that will use the memory, so its pages are mapped (and, on NUMA, placed) before timing."""
    start = offset_bytes - offset_bytes % page_bytes
    pages = -(-(offset_bytes + length_bytes - start) // page_bytes)
    return KernelCall("store", start, max(1, pages), page_bytes // WORD_BYTES)


def buffer_address(buf: memoryview | bytearray) -> int:
    """Address of a writable buffer (a SharedMemory's ``buf``, a bytearray, an mmap)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


__all__ = ["KERNELS", "Call", "CopyCall", "KernelCall", "WORD_BYTES", "buffer_address",
           "native_lib", "prefault_call"]
