"""The markers' compiled hot path (counterd/_native/hotpath_src/) against the Python path.

The two must give the same records and write byte-identical frames. Counter readings are made
known by a perf group whose leader is a pipe: each ``read(2)`` of it returns the bytes the test
wrote, in the kernel's PERF_FORMAT_GROUP layout, so the lane and the Python path read the same
values, multiplexed or not, of the layout opened or of another.
"""

from __future__ import annotations

import gc
import math
import os
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import counterd
from counterd import _native
from counterd.backends.base import Target
from counterd.backends.perf.group import PerfGroup
from counterd.data.env import ENV_NATIVE
from counterd.data.errors import BadInput
from counterd.data.records import SuperstepRecord
from counterd.markers import native
from counterd.markers.api import configure
from counterd.markers.recorder import Recorder
from counterd.markers.sampling import Sampling
from counterd.markers.sinks import MemorySink
from counterd.wire import binary_frames, protocol, spool, spool_reader

needs_native = pytest.mark.skipif(_native.hotpath() is None,
                                  reason="the compiled hot path is not built (no C compiler?)")

NAMES = ("task_clock_ns", "page_faults")
IDS = {101: "task_clock_ns", 202: "page_faults"}


@pytest.fixture(autouse=True)
def _pinned(one_cpu: int) -> Iterator[None]:
    """Every test here on one CPU: a migration between two markers would flag one path's
    record and not the other's."""
    yield
    configure(backend="none", socket="off")


class PipeCounters:
    """A PerfGroup over a pipe: ``push`` queues the next reading's bytes."""

    def __init__(self, unsupported: dict[str, str] | None = None) -> None:
        self.r, self.w = os.pipe()
        self.group = PerfGroup(NAMES, Target.this_thread(), [self.r], dict(IDS), True,
                               dict(unsupported or {}))
        self.t = 0

    def push(self, enabled: int, running: int, values: tuple[int, ...],
             ids: tuple[int, ...] = (101, 202)) -> None:
        fields = [len(values), enabled, running]
        for v, i in zip(values, ids, strict=True):
            fields += [v, i]
        os.write(self.w, struct.pack(f"={len(fields)}Q", *fields))

    def close(self) -> None:
        self.group.close()
        os.close(self.w)


def _with_counters(rec: Recorder, pc: PipeCounters, compiled: bool) -> None:
    """Give ``rec``'s thread the pipe's counters, through a lane or the Python path."""
    state = rec._state()
    state.group = pc.group
    state.read = pc.group.read_raw
    state.delta = pc.group.delta_raw
    state.lane = None
    native.invalidate()
    if compiled:
        if native.module() is None:
            pytest.skip("the compiled hot path is not built (no C compiler?)")
        rec._attach_lane(state)
        assert state.lane is not None


def _comparable(r: SuperstepRecord) -> tuple[Any, ...]:
    """Everything but the times and the CPU (each path takes its own)."""
    return (r.index, r.name, r.rank, r.pid, r.params, r.flags - {"migrated"}, r.unsupported,
            {k: (v.value, v.source, v.ratio, v.raw) for k, v in r.counters.items()},
            r.backend, r.end_ns is None, r.exception)


# Readings per marker (enabled, running, values[, ids]): plain, multiplexed, never on the
# PMU, and members in another order (the checked decoder's case).
SCRIPT = [
    ((1000, 1000, (5, 7)), (3000, 3000, (905, 17))),
    ((3000, 3000, (905, 17)), (5000, 4000, (1905, 27))),
    ((5000, 4000, (1905, 27)), (6000, 4000, (1905, 27))),
    ((6000, 4000, (1905, 27)), (8000, 6000, (28, 2905), (202, 101))),
]


def _play(rec: Recorder, pc: PipeCounters) -> list[Any]:
    """The script's supersteps plus nested, exception, dropped params and unmatched ends."""
    out: list[Any] = []
    for (a, b), params in zip(SCRIPT, [{}, {"n": 1000, "x": 0.25}, {"s": "a\"b\\c\n"},
                                       {"nan": math.nan, "ok": True}], strict=True):
        pc.push(*a)
        step = rec.begin(f"step{len(out)}", params)
        pc.push(*b)
        out.append(rec._end(step, None))
    pc.push(1, 1, (0, 0))
    outer = rec.begin("outer", {})
    pc.push(2, 2, (1, 1))
    inner = rec.begin("inner", {"k": "v"})
    pc.push(3, 3, (2, 2))
    try:
        with inner:
            raise ZeroDivisionError("no rows\nin\tpart 2")
    except ZeroDivisionError:
        pass
    pc.push(4, 4, (3, 3))
    out.append(rec._end(None, None))  # the innermost open: outer
    out.append(rec._end(None, "stray"))  # nothing open: an unmatched end
    out.append(rec._end(outer, None))  # ended twice: unmatched
    pc.push(5, 5, (4, 4))
    out.append(rec.begin("left open", {}))
    return out


def _records(compiled: bool, tmp: Path | None = None, steps: list[Any] | None = None
             ) -> list[SuperstepRecord]:
    pc = PipeCounters(unsupported={"l2_misses": "not on this host"})
    rec = Recorder(run_id="same", backend="none", socket="off", calibrate=False,
                   spool=tmp)
    if tmp is None:
        rec.sink = MemorySink()
    _with_counters(rec, pc, compiled)
    rec.set_rank(3)
    played = _play(rec, pc)
    if steps is not None:
        steps.extend(played)
    rec.close_open_steps()
    pc.close()
    if tmp is not None:
        rec.sink.close()  # type: ignore[union-attr]
        return sorted(spool_reader.collect(tmp), key=lambda r: r.index)
    assert isinstance(rec.sink, MemorySink)
    return sorted(rec.sink.records, key=lambda r: r.index)


@needs_native
def test_lane_records_equal_the_python_paths_in_memory() -> None:
    python, compiled = _records(False), _records(True)
    assert [_comparable(r) for r in compiled] == [_comparable(r) for r in python]
    by_name = {r.name: r for r in compiled}
    # Known answers: 900 and 10 over a plain span; 1000 and 10 at half... 3/4 running.
    assert by_name["step0"].counters["task_clock_ns"].raw == 900
    assert by_name["step0"].counters["task_clock_ns"].ratio == 1.0
    mux = by_name["step1"].counters["task_clock_ns"]
    assert (mux.raw, mux.ratio, mux.value) == (1000, 1000 / 2000, 1000 * 2000 / 1000)
    assert "multiplexed" in by_name["step1"].flags
    assert by_name["step2"].counters["page_faults"].ratio == 0.0  # never ran: not scaled
    assert by_name["step3"].counters["page_faults"].raw == 1  # other member order, decoded
    assert "dropped_params" in by_name["step3"].flags
    assert "param:nan" in by_name["step3"].unsupported
    assert {"exception", "nested"} <= by_name["inner"].flags
    assert by_name["inner"].exception == "ZeroDivisionError: no rows\\nin\\tpart 2"
    assert [r.exception is None for r in compiled].count(False) == 1
    assert "incomplete" in by_name["left open"].flags
    assert sum("unmatched_end" in r.flags for r in compiled) == 2
    assert all(r.rank == 3 for r in compiled)
    assert by_name["step0"].unsupported == {"l2_misses": "not on this host"}


@needs_native
def test_lane_records_equal_the_python_paths_through_the_spool(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "c").mkdir()
    python = _records(False, tmp_path / "p")
    steps: list[Any] = []
    compiled = _records(True, tmp_path / "c", steps)
    assert [_comparable(r) for r in compiled] == [_comparable(r) for r in python]
    assert len(compiled) == 9
    assert {r.name: r.exception for r in compiled if r.exception} == {
        "inner": "ZeroDivisionError: no rows\\nin\\tpart 2"}
    # The superstep that raised ends with a RECORD on both paths, which carries its exception
    # (a CLOSE has no room for it): the same frame but for the times each path took.
    frames = {}
    for side in ("p", "c"):
        (path,) = spool.files(tmp_path / side)
        frames[side] = [_timeless(body) for ftype, _frame, body in _raw_frames(path)
                        if ftype == protocol.FrameType.RECORD]
    assert frames["c"] == frames["p"]
    (raised,) = [body for body in frames["c"] if body["rec"].get("exception")]
    assert raised["rec"]["name"] == "inner" and "exception" in raised["rec"]["flags"]
    # The times the frames carry are the lane's own.
    times = {r.index: (r.begin_ns, r.end_ns) for r in compiled}
    for step in steps:
        if not isinstance(step, SuperstepRecord):
            assert times[step.index] == (step.begin_ns, step.end_ns)


def _timeless(body: bytes) -> dict[str, Any]:
    """A RECORD frame's payload without the times and the CPU each path took."""
    payload = protocol.strictjson.loads(body)
    for key in ("begin_ns", "end_ns", "duration_ns", "cpu"):
        payload["rec"].pop(key, None)
    return payload  # type: ignore[no-any-return]


def _raw_frames(path: Path) -> Iterator[tuple[int, bytes, bytes]]:
    """(type, whole frame, body) of every committed frame of a mapped spool file."""
    data = path.read_bytes()
    committed = struct.unpack_from("<Q", data, 8)[0]
    at, end = spool.HEAD_BYTES, spool.HEAD_BYTES + committed
    while at < end:
        length, _version, ftype = protocol.HEADER.unpack_from(data, at)
        frame = data[at:at + 4 + length]
        yield ftype, frame, frame[protocol.HEADER_BYTES:]
        at += 4 + length


_text = st.text(alphabet=st.characters(max_codepoint=127), max_size=12)
_value = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.booleans(), _text,
                   st.floats(allow_nan=False, allow_infinity=False))


@needs_native
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(_text, st.dictionaries(_text, _value, max_size=6)), min_size=1,
                max_size=8))
def test_frames_are_byte_identical_to_the_python_encoders(steps: list[Any]) -> None:
    """Every OPEN and CLOSE the lane writes is what protocol's encoders give for its fields
    (names and params with json's escapes, float repr, ints to 64 bits, bools)."""
    with tempfile.TemporaryDirectory() as tmp:
        pc = PipeCounters()
        rec = Recorder(run_id="bytes", backend="none", socket="off", calibrate=False,
                       spool=Path(tmp))
        _with_counters(rec, pc, True)
        t = 0
        for name, params in steps:
            pc.push(t, t, (t, 2 * t))
            step = rec.begin(name, params)
            t += 1000
            pc.push(t, t - 10, (t + 5, 2 * t + 1))
            rec._end(step, None)
        rec.sink.close()  # type: ignore[union-attr]
        pc.close()
        (path,) = spool.files(Path(tmp))
        names: dict[int, list[str]] = {}
        kinds = []
        for ftype, frame, body in _raw_frames(path):
            kinds.append(ftype)
            if ftype == protocol.FrameType.CONTEXT:
                ctx = protocol.Context.decode(protocol.strictjson.loads(body))
                names[ctx.c] = list(ctx.counters)
            elif ftype == protocol.FrameType.OPEN:
                assert binary_frames.Open.decode(body).encode() == frame
            elif ftype == protocol.FrameType.CLOSE:
                close = binary_frames.Close.decode(body, names[binary_frames.head(
                    protocol.FrameType.CLOSE, body).c])
                assert close.encode() == frame
                assert [k.raw for k in close.counters] == [1005, 2001]
                assert close.flags == {"multiplexed"}
        assert kinds.count(protocol.FrameType.OPEN) == len(steps)
        assert kinds.count(protocol.FrameType.CLOSE) == len(steps)
        got = [(r.name, r.params) for r in sorted(spool_reader.collect(Path(tmp)),
                                                  key=lambda r: r.index)]
        assert got == [(n, p) for n, p in steps]


@needs_native
def test_threads_each_have_a_lane_and_their_own_nesting_and_rank() -> None:
    rec = configure(backend="none", socket="off")
    rec.sink = MemorySink()
    errors: list[BaseException] = []

    def work(rank: int) -> None:
        try:
            with counterd.superstep("first"):
                counterd.set_rank(rank, thread=True)  # after the lane exists
            for _ in range(100):
                with counterd.superstep("outer"), counterd.superstep("inner"):
                    pass
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    records = rec.sink.records
    assert len(records) == 4 * 201
    assert len({r.index for r in records}) == len(records)  # one numbering for the process
    assert not rec.close_open_steps()  # none left open, in any lane
    for r in records:
        assert ("nested" in r.flags) == (r.name == "inner")
    assert {r.rank for r in records if r.name != "first"} == {1, 2, 3, 4}


@needs_native
def test_a_new_recorder_takes_every_superstep_after_it() -> None:
    a = configure(backend="none", socket="off")
    with counterd.superstep("to a"):
        pass
    b = configure(backend="none", socket="off")
    with counterd.superstep("to b"):
        pass
    t = threading.Thread(target=lambda: counterd.superstep("in a thread").__exit__(None, None,
                                                                                    None))
    t.start()
    t.join()
    del t
    gc.collect()  # the thread's lane goes: no thread may follow a pointer to it
    with counterd.superstep("to b again"):
        pass
    assert [r.name for r in a.sink.records] == ["to a"]  # type: ignore[union-attr]
    assert sorted(r.name for r in b.sink.records) == [  # type: ignore[union-attr]
        "in a thread", "to b", "to b again"]
    assert type(b._state().lane).__name__ == "Lane"


@needs_native
def test_the_python_path_is_kept_with_native_off(monkeypatch: pytest.MonkeyPatch) -> None:
    before = configure(backend="none", socket="off")
    with counterd.superstep("through a lane"):
        pass
    assert before._state().lane is not None
    monkeypatch.setenv(ENV_NATIVE, "0")
    rec = configure(backend="none", socket="off")  # the lane before it takes nothing more
    with counterd.superstep("s", n=1) as step:
        pass
    assert rec._state().lane is None and type(step).__name__ == "Step"
    assert [(r.name, r.params) for r in rec.sink.records] == [  # type: ignore[union-attr]
        ("s", {"n": 1})]


@needs_native
def test_a_marker_pair_costs_what_calibration_says_it_does() -> None:
    """Calibration goes through the lane, as the program's supersteps do."""
    rec = configure(backend="none", socket="off")
    with counterd.superstep("s"):
        pass
    (r,) = rec.sink.records  # type: ignore[union-attr]
    assert r.marker_ns is not None and 0 < r.marker_ns < 1_000_000


_FULL = """
import resource, signal, sys
from pathlib import Path
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
from counterd.wire import spool
spool.CHUNK = 16384
from counterd.markers.recorder import Recorder
rec = Recorder(run_id="full", backend="none", spool=Path(sys.argv[1]), socket="off",
               calibrate=False)
assert rec._state().lane is not None
for i in range(700):
    with rec.begin("s", {"i": i}):
        pass
"""


@needs_native
def test_a_spool_that_cannot_grow_goes_on_in_lines_and_loses_nothing(tmp_path: Path) -> None:
    """The compiled engine under a file-size limit: the mapping stops growing (EFBIG at
    posix_fallocate, never a SIGBUS), the rest goes to JSON lines, every superstep is there."""
    out = subprocess.run([sys.executable, "-c", _FULL, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "line by line" in out.stderr
    assert sorted(p.suffix for p in spool.files(tmp_path)) == [".frames", ".jsonl"]
    records = list(spool_reader.collect(tmp_path))
    assert sorted(r.params["i"] for r in records) == list(range(700))
    assert not any(r.flags for r in records)


# -- sampling (counterd.markers.sampling), on both paths -----------------------------------------

@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@pytest.mark.parametrize("sink", ["memory", "spool"])
def test_sampling_reads_one_in_k_short_supersteps_and_scales_the_rest_by_time(
        tmp_path: Path, compiled: bool, sink: str) -> None:
    pc = PipeCounters()
    rec = Recorder(run_id="sampled", backend="none", socket="off", calibrate=False,
                   spool=tmp_path if sink == "spool" else None, sample="10s:3")
    if sink == "memory":
        rec.sink = MemorySink()
    _with_counters(rec, pc, compiled)
    t = 0
    for i in range(8):
        measured = i % 3 == 0  # the first of a name is read, then 1 in 3
        if measured:
            pc.push(t, t, (t, t))
        step = rec.begin("short", {"i": i})
        if measured:
            t += 1000 * (i + 1)
            pc.push(t, t, (t + 7 * i, t + 1))
        rec._end(step, None)
    rec.close_open_steps()
    pc.close()
    if sink == "spool":
        rec.sink.close()  # type: ignore[union-attr]
        records = sorted(spool_reader.collect(tmp_path), key=lambda r: r.index)
    else:
        records = rec.sink.records  # type: ignore[union-attr]
    assert [("sampled" in r.flags) for r in records] == [i % 3 != 0 for i in range(8)]
    for r in records:
        i = r.params["i"]
        assert isinstance(i, int)
        if i % 3 == 0:
            assert {k: (v.source, v.raw) for k, v in r.counters.items()} == {
                "task_clock_ns": ("measured", 1000 * (i + 1) + 7 * i),
                "page_faults": ("measured", 1000 * (i + 1) + 1)}
            basis = r
        else:  # the last measured one's values, times the ratio of the two times
            scale = (r.end_ns - r.begin_ns) / (basis.end_ns - basis.begin_ns)  # type: ignore
            assert r.end_ns is not None
            assert {k: (v.source, v.raw, v.ratio, v.value) for k, v in r.counters.items()} == {
                k: ("sampled", None, 1.0, v.value * scale) for k, v in basis.counters.items()}


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_superstep_at_or_over_the_threshold_is_always_read(compiled: bool) -> None:
    pc = PipeCounters()
    rec = Recorder(run_id="long", backend="none", socket="off", calibrate=False,
                   sample="1ns:5")
    rec.sink = MemorySink()
    _with_counters(rec, pc, compiled)
    for i in range(4):
        pc.push(10 * i, 10 * i, (i, i))
        step = rec.begin("long", {})
        pc.push(10 * i + 5, 10 * i + 5, (i + 1, i + 2))
        rec._end(step, None)
    assert not any("sampled" in r.flags for r in rec.sink.records)
    assert [r.counters["page_faults"].raw for r in rec.sink.records] == [2, 2, 2, 2]


@pytest.mark.parametrize("text", ["50", "50us", "us:3", "50us:0", "-1ms:3", "50us:x",
                                  "nanus:2"])
def test_a_sampling_option_that_is_not_one_says_how_to_write_it(text: str) -> None:
    with pytest.raises(BadInput, match="<duration>:<k>"):
        Sampling.parse(text)


def test_sampling_off_and_k_one_read_every_superstep() -> None:
    assert Sampling.parse("off") is None and Sampling.parse("") is None
    assert Sampling.parse("50us:1") is None
    assert Sampling.parse("0.2ms:10") == Sampling(200_000, 10)


# -- what a review of the hot path found, kept found ----------------------------------------------

_FORK = """
import os, sys
from pathlib import Path
import counterd
from counterd.markers.api import configure
configure(backend="none", spool=Path(sys.argv[1]), socket="off")
for i in range(5):
    with counterd.superstep("before", i=i):
        pass
with counterd.superstep("open at fork"):
    pid = os.fork()
    if pid == 0:
        with counterd.superstep("child"):
            pass
        sys.exit(0)  # unwinds "open at fork" in the child, through its parent's lane
    os.waitpid(pid, 0)
for i in range(3):
    with counterd.superstep("after", i=i):
        pass
"""


@needs_native
def test_a_child_ending_its_parents_superstep_writes_nothing_into_the_parents_file(
        tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _FORK, str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    records = list(spool_reader.collect(tmp_path))
    parent = min(r.pid for r in records)
    mine = sorted((r.name, r.params.get("i")) for r in records if r.pid == parent)
    assert [n for n, _ in mine].count("before") == 5 and [n for n, _ in mine].count("after") == 3
    assert ("open at fork", None) in mine
    assert any(r.name == "child" and r.pid != parent for r in records)
    assert not any("incomplete" in r.flags for r in records if r.pid == parent)


@needs_native
def test_another_recorders_lane_never_takes_the_programs_supersteps() -> None:
    rec = configure(backend="none", socket="off")
    other = Recorder(run_id="other", backend="none", socket="off", calibrate=False)
    other.sink = MemorySink()
    other._end(other.begin("a", {}), None)
    with counterd.superstep("b"):
        pass
    with counterd.superstep(name="c", n=1):  # the name as a keyword, as the Python API takes
        pass
    assert [r.name for r in other.sink.records] == ["a"]
    assert [(r.name, r.params) for r in rec.sink.records] == [  # type: ignore[union-attr]
        ("b", {}), ("c", {"n": 1})]
    assert counterd.end(name="").name == "?"  # an end matching nothing, named as Python names it


@needs_native
def test_a_marker_whose_name_replaces_the_recorder_does_not_crash() -> None:
    """clean_marker runs Python (the name's __str__): the lane must outlive it."""
    configure(backend="none", socket="off")
    with counterd.superstep("first"):
        pass

    class Replacing:
        def __str__(self) -> str:
            configure(backend="none", socket="off")
            gc.collect()
            return "replaced"

    with counterd.superstep(Replacing()) as step:  # type: ignore[arg-type]
        pass
    assert step.name == "replaced"


@needs_native
def test_exited_threads_leave_no_counter_descriptors_open() -> None:
    rec = configure(backend="perf", events=["task_clock_ns"], socket="off")
    with counterd.superstep("main"):
        pass
    if rec._state().lane is None:
        pytest.skip("perf software events cannot be opened here")

    def work() -> None:
        with counterd.superstep("t"):
            pass

    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    # Once built, the records hold no counters open (the closed steps did, as on the Python
    # path, until then).
    assert len([r for r in rec.sink.records if r.name == "t"]) == 20  # type: ignore[union-attr]
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) - before < 5


@needs_native
def test_a_begin_too_large_for_a_frame_goes_to_a_line_and_the_rest_stays(tmp_path: Path) -> None:
    rec = configure(backend="none", spool=tmp_path, socket="off")
    big = {f"p{i}": "\x01" * 4000 for i in range(20)}  # 480 KB as JSON: over a frame's limit
    with counterd.superstep("before"):
        pass
    with counterd.superstep("big", **big):
        pass
    with counterd.superstep("after"):
        pass
    rec.sink.close()  # type: ignore[union-attr]
    assert sorted(r.name for r in spool_reader.collect(tmp_path)) == ["after", "before", "big"]


# -- what a second review found, kept found ------------------------------------------------------

@needs_native
def test_replaced_recorders_are_freed_with_their_counters() -> None:
    def alive() -> int:
        gc.collect()
        return sum(type(o) is Recorder for o in gc.get_objects())

    configure(backend="perf", events=["task_clock_ns"], socket="off")
    with counterd.superstep("warm"):
        pass
    before_fds, before = len(os.listdir("/proc/self/fd")), alive()
    for _ in range(6):
        configure(backend="perf", events=["task_clock_ns"], socket="off")
        with counterd.superstep("s"):
            pass
    assert alive() <= before
    assert len(os.listdir("/proc/self/fd")) - before_fds < 3


@needs_native
def test_an_old_recorder_used_directly_never_takes_superstep_again() -> None:
    old = configure(backend="none", socket="off")
    with counterd.superstep("a"):
        pass
    new = configure(backend="none", socket="off")
    with counterd.superstep("b"):
        pass
    old._end(old.begin("direct on old", {}), None)
    with counterd.superstep("c"):
        pass
    assert [r.name for r in old.sink.records] == ["a", "direct on old"]  # type: ignore
    assert [r.name for r in new.sink.records] == ["b", "c"]  # type: ignore[union-attr]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_sampling_decides_alike_when_a_read_has_another_layout(compiled: bool) -> None:
    pc = PipeCounters()
    rec = Recorder(run_id="layout", backend="none", socket="off", calibrate=False,
                   sample="10s:3")
    rec.sink = MemorySink()
    _with_counters(rec, pc, compiled)
    reads = [((0, 0, (0, 0), (202, 101)), (10, 10, (5, 5))),  # the first begin: other order
             ((20, 20, (10, 10)), (30, 30, (15, 15)))]
    for i in range(8):
        measured = i % 3 == 0
        if measured:
            pc.push(*reads[min(i // 3, 1)][0])
        step = rec.begin("s", {})
        if measured:
            pc.push(*reads[min(i // 3, 1)][1])
        rec._end(step, None)
    pc.close()
    assert [("sampled" in r.flags) for r in rec.sink.records] == [i % 3 != 0 for i in range(8)]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_a_step_ended_by_another_thread_is_read_on_its_own_thread(compiled: bool) -> None:
    pc = PipeCounters()
    rec = Recorder(run_id="cross", backend="none", socket="off", calibrate=False)
    rec.sink = MemorySink()
    _with_counters(rec, pc, compiled)
    pc.push(100, 100, (10, 10))
    step = rec.begin("crossing", {})
    pc.push(200, 200, (20, 30))  # its own thread's group is what the other thread reads
    t = threading.Thread(target=lambda: rec._end(step, None))
    t.start()
    t.join()
    pc.push(300, 300, (30, 40))
    after = rec.begin("after", {})
    pc.push(400, 400, (31, 41))
    rec._end(after, None)
    pc.close()
    crossing, later = rec.sink.records
    assert crossing.counters["page_faults"].raw == 20 and later.flags == frozenset()


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
def test_names_beyond_the_kept_ones_are_always_read(compiled: bool) -> None:
    from counterd.markers.sampling import MAX_NAMES

    rec = Recorder(run_id="names", backend="none", socket="off", calibrate=False,
                   sample="10s:2")
    rec.sink = MemorySink()
    pc = PipeCounters()
    _with_counters(rec, pc, compiled)
    for i in range(MAX_NAMES + 3):
        pc.push(i, i, (i, i))
        step = rec.begin(f"iter {i}" if i < MAX_NAMES else "late", {})
        pc.push(i + 1, i + 1, (i + 1, i + 1))
        rec._end(step, None)
    pc.close()
    assert not any("sampled" in r.flags for r in rec.sink.records)


def test_simulated_counters_are_not_sampled() -> None:
    from counterd.sim.streams import StridedStream

    rec = Recorder(run_id="sim", backend="sim", socket="off", calibrate=False, sample="10s:3")
    rec.sink = MemorySink()
    for _ in range(4):
        with rec.begin("s", {}) as step:
            step.feed(StridedStream(base=0, count=64, stride_bytes=8))
    assert not any("sampled" in r.flags for r in rec.sink.records)
    assert all(r.counters for r in rec.sink.records)


# -- the two paths against each other on random marker programs ----------------------------------

_OPS = st.lists(st.one_of(
    st.tuples(st.just("begin"), st.sampled_from(["a", "b", "\u00e9t\u00e9", "x" * 1030]),
              st.dictionaries(st.sampled_from(["n", "p", "s"]),
                              st.one_of(st.integers(-5, 5), st.floats(allow_nan=True),
                                        st.text(max_size=3), st.booleans()), max_size=2)),
    st.tuples(st.just("end"), st.integers(-1, 3), st.none()),
    st.tuples(st.just("raise"), st.none(), st.none())), max_size=25)


def _run_ops(rec: Recorder, ops: list[Any]) -> list[tuple[Any, ...]]:
    open_steps: list[Any] = []
    for op, arg, params in ops:
        if op == "begin":
            open_steps.append(rec.begin(arg, params))
        elif op == "end":
            step = None if arg < 0 or arg >= len(open_steps) else open_steps.pop(arg)
            rec._end(step, "stray" if step is None else None)
        elif open_steps:
            step = open_steps.pop()
            step.__exit__(ZeroDivisionError, ZeroDivisionError(), None)
    rec.close_open_steps()
    if isinstance(rec.sink, MemorySink):
        records = rec.sink.records
    else:
        rec.sink.close()  # type: ignore[union-attr]
        records = list(spool_reader.collect(rec.sink.directory))  # type: ignore[union-attr]
    return sorted((r.index, r.name, r.rank, r.params.get("n"), str(r.params),
                   sorted(r.flags - {"migrated"}), sorted(r.unsupported),
                   sorted((k, v.source.value) for k, v in r.counters.items()))
                  for r in records)


@needs_native
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_OPS, st.sampled_from(["memory", "spool"]), st.sampled_from(["off", "10s:2"]))
def test_random_marker_programs_give_the_same_records_on_both_paths(
        ops: list[Any], sink: str, sample: str) -> None:
    got = {}
    for compiled in (True, False):
        with tempfile.TemporaryDirectory() as tmp:
            if not compiled:
                os.environ[ENV_NATIVE] = "0"
            try:
                rec = Recorder(run_id="random", backend="perf",
                               events=["task_clock_ns", "page_faults"], socket="off",
                               calibrate=False, sample=sample,
                               spool=Path(tmp) if sink == "spool" else None)
                if sink == "memory":
                    rec.sink = MemorySink()
                state = rec._state()
                if state.group is None:
                    pytest.skip("perf software events cannot be opened here")
                assert (state.lane is not None) == compiled
                got[compiled] = _run_ops(rec, ops)
            finally:
                os.environ.pop(ENV_NATIVE, None)
    assert got[True] == got[False]


def _thread_program(seed: int) -> list[tuple[str, Any]]:
    import random

    rnd = random.Random(seed)
    ops: list[tuple[str, Any]] = []
    for _ in range(40):
        ops.append(rnd.choice([("begin", rnd.choice(["a", "b", "c"])), ("end", None),
                               ("end", None), ("raise", None)]))
    return ops


@needs_native
@pytest.mark.parametrize("sample", ["off", "10s:3"])
def test_threads_marking_at_once_give_the_same_records_on_both_paths(sample: str) -> None:
    """Four threads through the module-level API at once: per thread, the same records in the
    same order on both paths (the process's indices interleave differently)."""
    got = {}
    for compiled in (True, False):
        if not compiled:
            os.environ[ENV_NATIVE] = "0"
        try:
            rec = configure(backend="perf", events=["task_clock_ns"], socket="off",
                            sample=sample)
            rec.sink = MemorySink()
            errors: list[BaseException] = []

            def work(t: int, errors: list[BaseException] = errors) -> None:
                try:
                    counterd.set_rank(t, thread=True)
                    stack: list[Any] = []
                    for op, name in _thread_program(t):
                        if op == "begin":
                            stack.append(counterd.superstep(name, t=t))
                        elif op == "end":
                            counterd.end(stack.pop() if stack else None, name="stray")
                        elif stack:
                            stack.pop().__exit__(ValueError, ValueError(), None)
                except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                    errors.append(exc)

            threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert not errors
            rec.close_open_steps()
            records = sorted(rec.sink.records, key=lambda r: r.index)
            got[compiled] = {t: [(r.name, sorted(r.flags - {"migrated"}),
                                  sorted((k, v.source.value) for k, v in r.counters.items()))
                                 for r in records if r.rank == t] for t in range(4)}
        finally:
            os.environ.pop(ENV_NATIVE, None)
    if not any(got[True].values()):
        pytest.skip("no records")
    assert got[True] == got[False]
