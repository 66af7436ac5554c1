"""Address streams: what the simulator runs, one processor's loads and stores in order.

:class:`StridedStream` is the loop nest of the microbenchmark kernels (kernels.c);
:class:`AddressStream` the general form, one address and access kind per access.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from counterd.data.errors import BadInput

Kind = Literal["load", "store", "rmw"]

# Codes of access kinds in AddressStream.kinds; cachesim.c has the same enum.
KIND_CODES: dict[str, int] = {"load": 0, "store": 1, "rmw": 2}
KIND_NAMES: tuple[Kind, ...] = ("load", "store", "rmw")

# The microbenchmark kernels (counterd/_native/kernels.c) index uint64_t words.
KERNEL_WORD_BYTES = 8
_KERNEL_KINDS: dict[str, Kind] = {"load_stride": "load", "store_stride": "store",
                                  "rmw_stride": "rmw"}

_U64 = 1 << 64


@dataclass(frozen=True)
class StridedStream:
    """``for r < reps: for i < count: access(base + i*stride_bytes)`` of ``kind``.

    The loop nest of the microbenchmark kernels (kernels.c), with the stride in bytes; see
    :meth:`from_kernel` for their word strides.
    """

    base: int
    count: int
    stride_bytes: int
    kind: Kind = "load"
    reps: int = 1
    elem_bytes: int = 8

    def __post_init__(self) -> None:
        if self.kind not in KIND_CODES:
            raise BadInput(f"unknown access kind {self.kind!r}", "use load, store or rmw")
        if min(self.base, self.count, self.stride_bytes, self.reps) < 0 or self.elem_bytes <= 0:
            raise BadInput(f"invalid stream {self}", "base, count, stride, reps must be >= 0")
        if self.count and self.base + (self.count - 1) * self.stride_bytes + self.elem_bytes > _U64:
            raise BadInput(f"stream {self} runs past the 64-bit address space",
                           "lower base, count or stride")

    @classmethod
    def from_kernel(cls, kernel: str, n: int, stride_words: int, reps: int,
                    base: int) -> StridedStream:
        """The stream ``counterd_<kernel>(base, n, stride_words, reps)`` executes, for kernel
        ``load_stride``, ``store_stride`` or ``rmw_stride`` (the ``counterd_`` prefix is
        optional). ``base`` is the array's address, e.g. ``array.ctypes.data``."""
        name = kernel.removeprefix("counterd_")
        if name not in _KERNEL_KINDS:
            raise BadInput(f"unknown kernel {kernel!r}", "choose from " + ", ".join(_KERNEL_KINDS))
        return cls(base, n, stride_words * KERNEL_WORD_BYTES, _KERNEL_KINDS[name], reps,
                   KERNEL_WORD_BYTES)

    def __len__(self) -> int:
        return self.count * self.reps

    def addresses(self) -> np.ndarray:
        """All addresses in order (reps times), uint64."""
        one = np.uint64(self.base) + np.arange(self.count, dtype=np.uint64) * np.uint64(
            self.stride_bytes)
        return np.tile(one, self.reps)

    def expand(self) -> AddressStream:
        return AddressStream(self.addresses(), np.full(len(self), KIND_CODES[self.kind], np.uint8))


@dataclass(frozen=True, eq=False)
class AddressStream:
    """The general form: ``addresses[i]`` (uint64) accessed as ``kinds[i]`` (0 load, 1 store,
    2 rmw; see KIND_CODES). Arrays are converted to contiguous uint64/uint8 on construction."""

    addresses: np.ndarray
    kinds: np.ndarray

    def __post_init__(self) -> None:
        a = np.ascontiguousarray(self.addresses, dtype=np.uint64)
        k = np.ascontiguousarray(self.kinds, dtype=np.uint8)
        if a.ndim != 1 or k.shape != a.shape:
            raise BadInput(f"addresses {a.shape} and kinds {k.shape} differ",
                           "give two 1-D arrays of equal length")
        if k.size and int(k.max()) > 2:
            raise BadInput("kinds must be 0 (load), 1 (store) or 2 (rmw)", "see KIND_CODES")
        object.__setattr__(self, "addresses", a)
        object.__setattr__(self, "kinds", k)

    @classmethod
    def of(cls, addresses: Iterable[int], kinds: Iterable[str | int] | str) -> AddressStream:
        """Build from addresses and kind names or codes (one kind name for all)."""
        a = np.fromiter(addresses, dtype=np.uint64)
        if isinstance(kinds, str):
            k = np.full(a.size, KIND_CODES[kinds], np.uint8)
        else:
            k = np.array([KIND_CODES[x] if isinstance(x, str) else x for x in kinds], np.uint8)
        return cls(a, k)

    def __len__(self) -> int:
        return int(self.addresses.size)


Stream = StridedStream | AddressStream
