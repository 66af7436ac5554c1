"""Kernels: the stream a native kernel touches is the stream given to the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from counterd.data.errors import BadInput
from counterd.sim import KIND_CODES, AddressStream, StridedStream
from microbench.kernels import KernelCall, native_lib, prefault_call

WORDS = 4096


def _buffer(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 40, WORDS, dtype=np.uint64)


def _expanded(call: KernelCall) -> AddressStream:
    s = call.stream()
    assert s is not None
    return s.expand() if isinstance(s, StridedStream) else s


CASES = [(0, 100, 1, 1), (64, 37, 3, 2), (8, 20, 32, 3), (4096, 7, 256, 1)]


@pytest.mark.parametrize("offset,count,stride,reps", CASES)
def test_load_sum_equals_sum_over_simulated_addresses(offset: int, count: int, stride: int,
                                                      reps: int) -> None:
    buf = _buffer()
    call = KernelCall("load", offset, count, stride, reps)
    got = call.run(native_lib(), buf.ctypes.data)
    s = _expanded(call)
    assert (s.kinds == KIND_CODES["load"]).all() and len(s) == call.accesses
    want = int(buf[(s.addresses // 8).astype(np.int64)].sum(dtype=np.uint64))
    assert got == want


@pytest.mark.parametrize("offset,count,stride,reps", CASES)
def test_store_and_rmw_change_exactly_the_simulated_words(offset: int, count: int,
                                                          stride: int, reps: int) -> None:
    lib = native_lib()
    for kernel in ("store", "rmw"):
        before = _buffer(1)
        buf = before.copy()
        call = KernelCall(kernel, offset, count, stride, reps)  # type: ignore[arg-type]
        call.run(lib, buf.ctypes.data, value=1 << 50)
        s = _expanded(call)
        words = np.unique(s.addresses // 8).astype(np.int64)
        assert set(np.flatnonzero(buf != before)) == set(words.tolist())
        if kernel == "rmw":
            assert (s.kinds == KIND_CODES["rmw"]).all()
            assert (buf[words] - before[words] == reps).all()
            assert call.accesses == 2 * count * reps
        else:
            assert (s.kinds == KIND_CODES["store"]).all()


@pytest.mark.parametrize("every", [1, 2, 3, 4])
def test_mixed_loads_and_stores_where_the_stream_says(every: int) -> None:
    before = _buffer(2)
    buf = before.copy()
    call = KernelCall("mixed", 16, 50, 5, 1, store_every=every)
    got = call.run(native_lib(), buf.ctypes.data, value=1 << 50)
    s = _expanded(call)
    words = (s.addresses // 8).astype(np.int64)
    stores, loads = words[s.kinds == KIND_CODES["store"]], words[s.kinds == KIND_CODES["load"]]
    assert len(stores) == 50 // every and len(loads) == 50 - 50 // every
    assert set(np.flatnonzero(buf != before)) == set(stores.tolist())
    assert got == int(before[loads].sum(dtype=np.uint64))


def test_flush_changes_nothing_and_is_not_simulated() -> None:
    before = _buffer(3)
    buf = before.copy()
    call = KernelCall("flush", 0, 64, 8)
    assert call.run(native_lib(), buf.ctypes.data) == 0
    assert (buf == before).all() and call.stream() is None and call.accesses == 0


def test_prefault_touches_one_word_per_page() -> None:
    call = prefault_call(4096 + 200, 3 * 4096, 4096)
    s = _expanded(call)
    assert s.addresses.tolist() == [4096, 8192, 12288, 16384]


def test_bad_calls() -> None:
    with pytest.raises(BadInput):
        KernelCall("load", 0, 0, 1)
    with pytest.raises(BadInput):
        KernelCall("load", 0, 1, 0)
    with pytest.raises(BadInput):
        KernelCall("load", 3, 1, 1)
    with pytest.raises(BadInput):
        KernelCall("mixed", 0, 1, 1)
