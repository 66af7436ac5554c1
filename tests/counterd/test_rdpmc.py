"""Counters read in user space by the compiled hot path (rdpmc on the perf_event mmap page).

Without a PMU no page allows user-space reads, so the reader is checked on pages built here
against the algorithm include/uapi/linux/perf_event.h documents for struct
perf_event_mmap_page, computed independently in Python integers; the lane's choice between
the page and read(2) is checked on the real kernel's pages of software events (which never
allow rdpmc); the `pmu` test reads real hardware counters both ways where a PMU is exposed.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import counterd
from counterd import _native
from counterd.backends.perf import PerfBackend
from counterd.markers.api import configure

hot = _native.hotpath()
needs_native = pytest.mark.skipif(hot is None,
                                  reason="the compiled hot path is not built (no C compiler?)")

# struct perf_event_mmap_page's head: version, compat_version, lock, index, offset (s64),
# time_enabled, time_running, capabilities, pmc_width (u16), time_shift (u16), time_mult,
# time_offset, time_zero, size, __reserved_1, time_cycles, time_mask.
PAGE = struct.Struct("=IIIIqQQQHHIQQIIQQ")
assert PAGE.size == 96
BITS_VALID, USER_RDPMC, USER_TIME, USER_TIME_SHORT = 1 << 1, 1 << 2, 1 << 3, 1 << 5
ALLOWS = BITS_VALID | USER_RDPMC | USER_TIME
M64 = (1 << 64) - 1


def page(*, lock: int = 2, index: int = 3, offset: int = 0, enabled: int = 0, running: int = 0,
         caps: int = ALLOWS, width: int = 48, shift: int = 0, mult: int = 0, toff: int = 0,
         cycles: int = 0, mask: int = 0) -> bytearray:
    return bytearray(PAGE.pack(0, 0, lock, index, offset, enabled, running, caps, width, shift,
                               mult, toff, 0, PAGE.size, 0, cycles, mask))


def expected(pg: bytes, pmc: int, tsc: int) -> tuple[int, int, int] | None:
    """The header's algorithm in Python integers: the counter's value sign-extended from
    pmc_width bits and added to offset; the time since the page's update from the cycle
    counter, exactly floor(cyc * mult / 2**shift) + time_offset (mod 2**64)."""
    (_, _, _, index, offset, enabled, running, caps, width, shift, mult, toff, _, _, _, cycles,
     mask) = PAGE.unpack(bytes(pg))
    if caps & ALLOWS != ALLOWS or index == 0 or not 0 < width <= 64 or shift > 63:
        return None
    raw = (pmc + index - 1) & M64  # the stub's counter value: pmc + the counter's number
    value = raw & ((1 << width) - 1)
    if value >> (width - 1):
        value -= 1 << width
    cyc = tsc
    if caps & USER_TIME_SHORT:
        cyc = (cycles + ((cyc - cycles) & mask)) & M64
    delta = (toff + (cyc * mult >> shift)) & M64
    return (offset + value) & M64, (enabled + delta) & M64, (running + delta) & M64


@needs_native
def test_a_page_that_allows_it_gives_offset_plus_the_counter_and_the_times_now() -> None:
    # 48-bit counter at 2**48 - 5 (a wrapped value: -5), offset 1000: count 995.
    pg = page(index=2, offset=1000, enabled=7_000, running=5_000, shift=10, mult=3 << 10,
              toff=(-40) & M64)
    got = hot._userpage_read(pg, (1 << 48) - 5 - 1, 100)  # counter 1 reads pmc + 1
    assert got == (995, 7_000 + 300 - 40, 5_000 + 300 - 40)
    assert got == expected(pg, (1 << 48) - 5 - 1, 100)


@needs_native
@pytest.mark.parametrize("change", [dict(index=0), dict(caps=BITS_VALID | USER_TIME),
                                    dict(caps=BITS_VALID | USER_RDPMC),
                                    dict(caps=USER_RDPMC | USER_TIME), dict(width=0),
                                    dict(lock=3)],
                         ids=["not-on-a-counter", "no-rdpmc", "no-user-time",
                              "pre-3.12-capability-bits", "no-width", "update-in-progress"])
def test_a_page_that_does_not_allow_it_now_sends_the_read_to_the_kernel(change: Any) -> None:
    assert hot._userpage_read(page(mult=1, **change), 5, 5) is None


@needs_native
def test_an_update_during_the_read_is_seen_and_the_read_made_again() -> None:
    before = page(lock=4, index=1, offset=10, enabled=100, running=100, mult=1)
    after = page(lock=6, index=2, offset=500, enabled=900, running=800, mult=1)
    # The kernel's update lands between the page's fields and the counter's read: the values
    # must all come from the page as updated (counter 1, offset 500), none from the old one.
    got = hot._userpage_read(before, 1000, 7, bytes(after))
    assert got == (1000 + 1 + 500, 907, 807)
    assert got == expected(after, 1000, 7)


@needs_native
@settings(max_examples=300, deadline=None)
@given(index=st.integers(0, 40), offset=st.integers(-(1 << 63), (1 << 63) - 1),
       enabled=st.integers(0, M64), running=st.integers(0, M64),
       caps=st.sampled_from([ALLOWS, ALLOWS | USER_TIME_SHORT, BITS_VALID | USER_RDPMC]),
       width=st.sampled_from([0, 32, 40, 48, 64]), shift=st.integers(0, 63),
       mult=st.integers(0, (1 << 32) - 1), toff=st.integers(0, M64),
       cycles=st.integers(0, M64), mask=st.sampled_from([0, (1 << 56) - 1, M64]),
       pmc=st.integers(0, M64), tsc=st.integers(0, M64))
def test_every_page_reads_as_the_headers_algorithm_says(
        index: int, offset: int, enabled: int, running: int, caps: int, width: int, shift: int,
        mult: int, toff: int, cycles: int, mask: int, pmc: int, tsc: int) -> None:
    pg = page(index=index, offset=offset, enabled=enabled, running=running, caps=caps,
              width=width, shift=shift, mult=mult, toff=toff, cycles=cycles, mask=mask)
    assert hot._userpage_read(pg, pmc, tsc) == expected(pg, pmc, tsc)


@needs_native
def test_software_events_are_read_by_the_kernel_and_the_lane_says_why() -> None:
    """The kernel's own pages: software events never allow rdpmc, so every read of the lane
    is a read(2), and the lane says so."""
    events = ("task_clock_ns", "page_faults", "context_switches")
    try:
        PerfBackend().open(list(events)).close()
    except Exception as exc:  # noqa: BLE001 - any reason perf cannot count here
        pytest.skip(f"perf software events do not open here: {exc}")
    rec = configure(backend="perf", events=events, socket="off")
    try:
        for _ in range(5):
            with counterd.superstep("s"):
                pass
        lane = rec._state().lane
        assert lane is not None
        assert "cap_user_rdpmc clear" in lane.user_read_off
        assert (lane.user_reads, lane.kernel_reads) == (0, 10)
        assert all(r.counters["task_clock_ns"].value > 0 for r in rec.sink.records)
    finally:
        configure(backend="none", socket="off")


@needs_native
def test_counters_without_a_page_are_read_by_the_kernel() -> None:
    """fds that cannot be mapped (a pipe here): the lane keeps read(2) and says why."""
    r, w = os.pipe()
    try:
        lane = _lane(fds=(r,))
        assert lane.user_read_off.startswith("a counter's page could not be mapped (mmap: ")
    finally:
        os.close(r)
        os.close(w)


def _lane(fds: tuple[int, ...]) -> Any:
    from counterd.markers import native

    native.module()
    return hot.Lane(recorder=None, indices=hot.Counter(), rank=0, fd=fds[0], ids=(1,) * len(fds),
                    perm=tuple(range(len(fds))), delta=None, decode=None, unsupported={},
                    clean=None, on_closed=[].append, ctx=(), writer=None, sink_open=None,
                    sink_closed=None, c_open=0, c_close=0, close_tail=b"", close_flags=0,
                    fds=fds)


@pytest.mark.pmu
@needs_native
def test_hardware_counters_read_in_user_space_agree_with_the_kernels_reads() -> None:
    """Where the kernel allows rdpmc: the lane reads its group in user space, and a superstep
    of known work counts the same instructions as the Python path's read(2)."""
    events = ("instructions", "cycles")
    try:
        PerfBackend().open(list(events)).close()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"hardware events do not open here: {exc}")
    per_path = {}
    for native_on in ("1", "0"):
        os.environ["COUNTERD_NATIVE"] = native_on
        try:
            rec = configure(backend="perf", events=events, socket="off")
            for _ in range(20):
                with counterd.superstep("work"):
                    sum(range(100_000))
            lane = rec._state().lane
            if native_on == "1":
                if lane is None or lane.user_read_off is not None:
                    pytest.skip("this kernel reads these counters with read(2) only: "
                                f"{lane.user_read_off if lane else 'no lane'}")
                assert lane.user_reads > lane.kernel_reads
            values = sorted(r.counters["instructions"].value for r in rec.sink.records)
            per_path[native_on] = values[len(values) // 2]
        finally:
            os.environ.pop("COUNTERD_NATIVE", None)
            configure(backend="none", socket="off")
    assert per_path["1"] == pytest.approx(per_path["0"], rel=0.05)


def test_the_probe_says_how_the_markers_read_their_counters() -> None:
    from counterd.commands import probe

    text = probe.markers_path()
    if hot is None:
        assert text.startswith("in Python: ")
    else:
        assert text.startswith("compiled (counterd/_native/hotpath_src/); ")
        tail = text.split("; ", 1)[1]
        assert (tail.endswith("read in user space (rdpmc)") or " read by read(2): " in tail
                or tail.startswith("their counters")), tail


def test_a_thread_state_that_goes_unmaps_its_lanes_pages() -> None:
    """A lane's mapped pages keep its counters (and the PMU counters they hold) alive after
    the group's fds close: the state that owns the group unmaps them when it goes."""
    from counterd.markers.step import ThreadState as _ThreadState

    class Lane:
        unmapped = 0

        def unmap(self) -> None:
            Lane.unmapped += 1

        def open_steps(self) -> list[object]:
            return []

    state = _ThreadState(os.getpid())
    state.lane = Lane()
    del state
    assert Lane.unmapped == 1


@needs_native
def test_unmapping_a_lane_without_pages_changes_nothing() -> None:
    r, w = os.pipe()
    try:
        lane = _lane(fds=(r,))
        before = lane.user_read_off
        lane.unmap()
        lane.unmap()
        assert lane.user_read_off == before
    finally:
        os.close(r)
        os.close(w)
