"""Uniform convolution two ways, as SPMD programs: Conv-Shift and Conv-Scan.

I. Hur and C. Lin, "Incorporating Cache Effects into a Model of Interprocessor Communication"
(section 7, Figures 18 and 19) compute out[i, j] = the sum of image[i-b+1..i, j-b+1..j] (values
outside the image count as 0) with repeated shifts (Conv-Shift: 2(b-1) shift-and-add
operations) or with two prefix sums and out = B - Z - Y + X (Conv-Scan), and ask which is faster
for each block size b and image size L. Here both run on a 1 x p mesh of worker processes (one
per CPU, pinned): an L x L float64 image in shared memory, row-major, processor r owning a block
of columns, ``ctx.Barrier(p)`` between supersteps, each superstep inside a
``counterd.superstep`` marker. Every cross-process transfer is one call of the native copy
kernel ``counterd_copy2d`` (the primitive the transfer benchmark times) from the neighbour's
block into the receiver's contiguous message buffer; local work is numpy. The supersteps and
every operation in them are listed, with their bytes, loads and stores and memory lines
touched, by :mod:`predictor.families.convolution` (the arrays' offsets come from there too).

The time of a superstep is the BSP one: each processor times its own work (perf_counter_ns,
not the barrier) and the superstep takes the slowest processor's time; the total is the sum.
The last run of each (program, L, b) is checked against a direct computation of the
convolution.

    python examples/convolution.py shift --size 1000 --block 4 [-p 2] [--repeat 5] [--json]

From Python (the repository root is not a package)::

    sys.path.insert(0, str(ROOT / "examples")); import convolution
    convolution.run("scan", size=400, block=3)          # one result object
    convolution.run_jobs([...], p=2)                     # programs and calibration, one launch
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import counterd  # noqa: E402
from microbench.kernels import buffer_address, native_lib  # noqa: E402
from predictor.families import convolution as cv  # noqa: E402

PROGRAMS = cv.PROGRAMS
MAX_SIZE = 8192
MAX_P = 64
MSG_BYTES = 1024
EXIT_ABORTED = 3
WARMUP = 1  # runs of each job before the timed ones (page faults, cold caches)


class BadArgument(ValueError):
    """A configuration this program refuses (the CLI: one line, exit 2)."""


class ConvolutionError(RuntimeError):
    """A wrong output or a failed worker (the CLI: one line, exit 1)."""


# -- jobs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProgramJob:
    """``repeats`` timed runs of a program (after :data:`WARMUP` untimed ones)."""

    name: str
    size: int
    block: int
    repeats: int = 1
    check: bool = True
    seed: int = 0


@dataclass(frozen=True)
class OpJob:
    """A calibration operation run by every processor at once on its own arrays. ``cold``:
    before each run every processor reads :data:`SCRUB_BYTES` of its own, so the operation's
    data comes from memory, as in the programs at the larger sizes, whose arrays (4 L^2 words)
    exceed the last-level cache; warm, the same data stays cached from run to run."""

    shape: cv.Shape
    repeats: int = 3
    cold: bool = True


SCRUB_BYTES = 32 << 20  # per processor; two of them together exceed a 32 MiB L3 twice
_scrub: np.ndarray | None = None


def _evict() -> None:
    global _scrub
    if _scrub is None:
        _scrub = np.ones(SCRUB_BYTES // 8)
    _scrub.sum()


@dataclass(frozen=True)
class TransferJob:
    """A calibration transfer: processor 0 writes a b_r x b_c matrix; the last processor copies
    its first d rows or d leftmost columns into a contiguous buffer (timed)."""

    kind: str
    b_r: int
    b_c: int
    d: int
    repeats: int = 3


Job = ProgramJob | OpJob | TransferJob


def default_p() -> int:
    """The CPUs this process may run on, at most 4."""
    return min(4, len(os.sched_getaffinity(0)))


def program_job(name: str, *, size: int, block: int, p: int, repeats: int = 1,
                check: bool = True, seed: int = 0) -> ProgramJob:
    """A checked program job; :class:`BadArgument` says what is wrong, in one line."""
    if name not in PROGRAMS:
        raise BadArgument(f"unknown program {name!r}: choose from {', '.join(PROGRAMS)}")
    for what, v, lo, hi in (("size (L)", size, 1, MAX_SIZE), ("block (b)", block, 1, size),
                            ("repeat", repeats, 1, 10_000), ("p (processors)", p, 1, MAX_P)):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise BadArgument(f"{what} must be an integer {lo}..{hi}, not {v!r}")
    if p > size:
        raise BadArgument(f"p = {p} processors for {size} columns: give p <= L")
    return ProgramJob(name, size, block, repeats, check, seed)


def _steps(job: Job, p: int) -> int:
    if isinstance(job, ProgramJob):
        return len(cv.program(job.name, job.size, job.block, p))
    return 1


def _calib_area(jobs: Sequence[Job]) -> int:
    """Words of each of the 2p calibration areas (page multiples)."""
    need = 1
    for j in jobs:
        if isinstance(j, OpJob):
            need = max(need, j.shape.dst_words, j.shape.src_words)
        elif isinstance(j, TransferJob):
            need = max(need, j.b_r * j.b_c)
    return -(-need // cv.PAGE_WORDS) * cv.PAGE_WORDS


def _segment_words(jobs: Sequence[Job], p: int) -> int:
    words = 2 * p * _calib_area(jobs)
    for j in jobs:
        if isinstance(j, ProgramJob):
            words = max(words, cv.layout(j.size, j.block, p).words)
    return words


# -- the worker's view of shared memory --------------------------------------------------------

class _Memory:
    def __init__(self, buf: Any, words: int) -> None:
        self.buf = buf
        self.flat = np.ndarray((words,), dtype=np.float64, buffer=buf)
        self.base = buffer_address(buf)
        self.lib = native_lib("counterd_copy2d")

    def view(self, at: int, rows: int, cols: int, pitch: int) -> np.ndarray:
        """rows x cols float64 at word ``at``, row pitch ``pitch`` words."""
        return np.ndarray((rows, cols), dtype=np.float64, buffer=self.buf, offset=8 * at,
                          strides=(8 * pitch, 8))

    def copy2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, rows: int,
               cols: int) -> None:
        """The transfer: ``counterd_copy2d`` on word offsets."""
        self.lib.counterd_copy2d(self.base + 8 * dst, dst_pitch, self.base + 8 * src,
                                 src_pitch, rows, cols, 1)


class _Clock:
    """One processor's supersteps of one run: each marked (optionally), timed and ended at a
    barrier. ``with clock("west 1"):`` stores the body's time in ``times[index, rank]``."""

    def __init__(self, rank: int, barrier: Any, times: np.ndarray, names: Sequence[str],
                 params: dict[str, Any] | None) -> None:
        self.rank, self.barrier, self.times, self.names = rank, barrier, times, names
        self.params = params
        self.index = 0
        self._t0 = 0
        self._marker: Any = None

    def __call__(self, name: str) -> _Clock:
        expected = self.names[self.index] if self.index < len(self.names) else None
        if name != expected:
            raise AssertionError(f"superstep {self.index} is {name!r}, expected {expected!r}")
        return self

    def __enter__(self) -> None:
        if self.params is not None:
            self._marker = counterd.superstep(self.names[self.index], **self.params)
            self._marker.__enter__()
        self._t0 = time.perf_counter_ns()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.times[self.index, self.rank] = time.perf_counter_ns() - self._t0
        self.index += 1
        marker, self._marker = self._marker, None
        if marker is not None:
            marker.__exit__(exc_type, exc, tb)
        if exc_type is None:
            self.barrier.wait()


# -- the programs ------------------------------------------------------------------------------

def _shift(mem: _Memory, lay: cv.Layout, rank: int, clock: _Clock) -> None:
    """Conv-Shift: see :func:`predictor.families.convolution.shift_program` for the supersteps."""
    L, b = lay.size, lay.block
    c0, w = lay.cols[rank]
    im, acc, t0, t1 = (mem.view(at, L, L, L) for at in (lay.im, lay.acc, lay.t0, lay.t1))
    msg_at = lay.msg[rank]
    msg = mem.flat[msg_at:msg_at + L]
    acc_l = acc[:, c0:c0 + w]
    with clock("init"):
        np.copyto(acc_l, im[:, c0:c0 + w])
    tprev, tprev_at = im, lay.im
    for k in range(1, b):
        tk = t1 if k % 2 else t0
        with clock(f"west {k}"):
            if rank > 0:  # the west neighbour's last column of T_{k-1}
                mem.copy2d(msg_at, 1, tprev_at + c0 - 1, L, L, 1)
        with clock(f"add west {k}"):
            if w > 1:
                np.copyto(tk[:, c0 + 1:c0 + w], tprev[:, c0:c0 + w - 1])
            tk[:, c0] = msg  # zeros on processor 0
            np.add(acc_l, tk[:, c0:c0 + w], out=acc_l)
        tprev, tprev_at = tk, (lay.t1 if k % 2 else lay.t0)
    h_l = t0[:, c0:c0 + w]
    if b > 1:
        with clock("copy"):
            np.copyto(h_l, acc_l)
    for k in range(1, b):
        with clock(f"add north {k}"):
            if k < L:
                np.add(acc_l[k:], h_l[:L - k], out=acc_l[k:])


def _scan(mem: _Memory, lay: cv.Layout, rank: int, clock: _Clock) -> None:
    """Conv-Scan: see :func:`predictor.families.convolution.scan_program` for the supersteps."""
    L, b = lay.size, lay.block
    c0, w = lay.cols[rank]
    im, acc, rp = (mem.view(at, L, L, L) for at in (lay.im, lay.acc, lay.t0))
    msg_at = lay.msg[rank]
    msg = mem.flat[msg_at:msg_at + lay.msg_words]
    rp_l, acc_l = rp[:, c0:c0 + w], acc[:, c0:c0 + w]
    pitch = lay.ext_pitch(rank)
    ext = mem.view(lay.ext[rank], L + b, pitch, pitch)
    with clock("row prefix"):
        np.cumsum(im[:, c0:c0 + w], axis=1, out=rp_l)
    with clock("row carry"):
        for j in range(rank):  # the last column of every processor to the west
            a, wj = lay.cols[j]
            mem.copy2d(msg_at + j * L, 1, lay.t0 + a + wj - 1, L, L, 1)
    with clock("column prefix"):
        for j in range(1, rank):
            np.add(msg[:L], msg[j * L:(j + 1) * L], out=msg[:L])
        if rank > 0:
            np.add(rp_l, msg[:L, None], out=rp_l)
        np.cumsum(rp_l, axis=0, out=ext[b:, b:])
    pieces = cv.west_pieces(lay, rank, b)
    with clock("west columns"):
        at = 0
        for j, a, d in pieces:
            pj = lay.ext_pitch(j)
            mem.copy2d(msg_at + at, d, lay.ext[j] + b * pj + b + a, pj, L, d)
            at += L * d
    with clock("box sums"):
        got = sum(d for _, _, d in pieces)
        ext[:b].fill(0.0)
        if got < b:
            ext[b:, :b - got].fill(0.0)
        at, col = 0, b - got
        for _, _, d in pieces:
            np.copyto(ext[b:, col:col + d], msg[at:at + L * d].reshape(L, d))
            at += L * d
            col += d
        np.subtract(ext[b:, b:], ext[:L, b:], out=acc_l)  # B - Z
        np.subtract(acc_l, ext[b:, :w], out=acc_l)  # - Y
        np.add(acc_l, ext[:L, :w], out=acc_l)  # + X


_RUN = {"shift": _shift, "scan": _scan}


def image(size: int, seed: int = 0) -> np.ndarray:
    """The input: integers 0..9 as float64 (every sum is exact)."""
    return np.random.default_rng([seed, size]).integers(0, 10, (size, size)).astype(np.float64)


def reference(img: np.ndarray, block: int) -> np.ndarray:
    """The convolution computed directly: the sum of the b x b shifted copies of the image."""
    n = img.shape[0]
    pad = np.zeros((n + block - 1, n + block - 1))
    pad[block - 1:, block - 1:] = img
    out = np.zeros_like(img)
    for di in range(block):
        for dj in range(block):
            out += pad[block - 1 - di:block - 1 - di + n, block - 1 - dj:block - 1 - dj + n]
    return out


# -- calibration operations --------------------------------------------------------------------

def _op(mem: _Memory, shape: cv.Shape, dst_at: int, src_at: int) -> Any:
    """The numpy call of one calibration shape (the same calls the programs make)."""
    dst = mem.view(dst_at + shape.offset, shape.rows, shape.cols, shape.dst_pitch)
    src_r = shape.src()
    src = mem.view(src_at + src_r.start, src_r.rows, src_r.cols, src_r.pitch)
    kind = shape.kind
    if kind == "copy":
        return lambda: np.copyto(dst, src)
    if kind == "fill":
        return lambda: dst.fill(0.0)
    if kind == "add":
        return lambda: np.add(dst, src, out=dst)
    if kind == "addcol":
        vec = src[:, 0]
        return lambda: np.add(dst, vec[:, None], out=dst)
    if kind == "cumsum_row":
        return lambda: np.cumsum(src, axis=1, out=dst)
    if kind == "cumsum_col":
        return lambda: np.cumsum(src, axis=0, out=dst)
    s, r, c = shape.shift, shape.rows, shape.cols

    def bzyx() -> None:
        np.subtract(src[s:, s:], src[:r, s:], out=dst)
        np.subtract(dst, src[s:, :c], out=dst)
        np.add(dst, src[:r, :c], out=dst)
    return bzyx


# -- processes ---------------------------------------------------------------------------------

def _put_text(buf: np.ndarray, text: str) -> None:
    data = " ".join(text.split()).encode(errors="replace")[:buf.size - 1]
    buf[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    buf[len(data)] = 0


def _get_text(buf: np.ndarray) -> str:
    return bytes(buf).split(b"\0", 1)[0].decode(errors="replace")


def _die_with_parent(parent: int) -> None:
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        os._exit(EXIT_ABORTED)


def _run_job(job: Job, mem: _Memory, rank: int, p: int, barrier: Any, times: np.ndarray,
             area: int, status: np.ndarray, msg: np.ndarray, markers: bool) -> None:
    if isinstance(job, ProgramJob):
        lay = cv.layout(job.size, job.block, p)
        names = [s.name for s in cv.program(job.name, job.size, job.block, p)]
        if rank == 0:
            mem.view(lay.im, job.size, job.size, job.size)[:] = image(job.size, job.seed)
        mem.flat[lay.msg[rank]:lay.msg[rank] + lay.msg_words] = 0.0
        barrier.wait()
        params = {"program": job.name, "size": job.size, "block": job.block, "p": p} \
            if markers else None
        for rep in range(-WARMUP, job.repeats):
            scratch = np.zeros((len(names), p), dtype=np.int64)
            clock = _Clock(rank, barrier, times[rep] if rep >= 0 else scratch, names,
                           params if rep >= 0 else None)
            _RUN[job.name](mem, lay, rank, clock)
            if clock.index != len(names):
                raise AssertionError(f"{clock.index} supersteps run, {len(names)} expected")
            if rank == 0 and job.check and rep == job.repeats - 1:
                got = mem.view(lay.acc, job.size, job.size, job.size)
                want = reference(mem.view(lay.im, job.size, job.size, job.size), job.block)
                bad = np.flatnonzero(got != want)
                if bad.size:
                    i, j = divmod(int(bad[0]), job.size)
                    _put_text(msg, f"{job.name}, L {job.size}, b {job.block}: out[{i}, {j}] = "
                              f"{got[i, j]:g}, the direct sum is {want[i, j]:g} "
                              f"({bad.size} elements differ)")
                    status[0] = 1
            barrier.wait()
    elif isinstance(job, OpJob):
        dst_at, src_at = 2 * rank * area, (2 * rank + 1) * area
        shape = job.shape
        mem.flat[dst_at:dst_at + area] = 1.0
        mem.flat[src_at:src_at + area] = 1.0
        call = _op(mem, shape, dst_at, src_at)
        barrier.wait()
        for rep in range(-WARMUP, job.repeats):
            if job.cold:
                _evict()
                barrier.wait()
            t0 = time.perf_counter_ns()
            call()
            t = time.perf_counter_ns() - t0
            if rep >= 0:
                times[rep, 0, rank] = t
            barrier.wait()
    else:
        owner, copier = 0, p - 1
        src_at, dst_at = 0, (2 * p - 1) * area
        matrix = mem.flat[src_at:src_at + job.b_r * job.b_c]
        for rep in range(-WARMUP, job.repeats):
            if rank == owner:  # fresh data in the owner's cache, as a program's last write
                matrix.fill(float(rep + 2))
            barrier.wait()
            if rank == copier:
                t0 = time.perf_counter_ns()
                if job.kind == "rows":
                    mem.copy2d(dst_at, job.b_c, src_at, job.b_c, job.d, job.b_c)
                else:
                    mem.copy2d(dst_at, job.d, src_at, job.b_c, job.b_r, job.d)
                t = time.perf_counter_ns() - t0
                if rep >= 0:
                    times[rep, 0, rank] = t
            barrier.wait()


def _worker(rank: int, p: int, jobs: Sequence[Job], offsets: Sequence[int], words: int,
            shm: shared_memory.SharedMemory, times_shm: shared_memory.SharedMemory,
            text: shared_memory.SharedMemory, barrier: Any, parent: int, markers: bool) -> None:
    code = 0
    errors = np.ndarray((p + 1, MSG_BYTES), dtype=np.uint8, buffer=text.buf)
    try:
        _die_with_parent(parent)
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
        if markers:
            counterd.set_rank(rank)
        mem = _Memory(shm.buf, words)
        mem.flat[rank * cv.PAGE_WORDS::p * cv.PAGE_WORDS] = 0.0  # first touch: every p-th page
        mem.flat[::cv.PAGE_WORDS].sum()  # every page mapped in this process
        all_times = np.ndarray((offsets[-1],), dtype=np.int64, buffer=times_shm.buf)
        area = _calib_area(jobs)
        status = np.zeros(1, dtype=np.int64)
        barrier.wait()
        for i, job in enumerate(jobs):
            reps = job.repeats
            times = all_times[offsets[i]:offsets[i + 1]].reshape(reps, _steps(job, p), p)
            _run_job(job, mem, rank, p, barrier, times, area, status, errors[p], markers)
            if status[0]:
                raise ConvolutionError(_get_text(errors[p]))
        del mem
        if markers:
            from counterd.markers import api

            api._at_exit()  # os._exit of forked workers skips it
    except threading.BrokenBarrierError:
        code = EXIT_ABORTED
    except KeyboardInterrupt:
        barrier.abort()
        code = 130
    except BaseException as exc:
        barrier.abort()
        if not isinstance(exc, ConvolutionError):
            print(f"convolution: processor {rank} failed:\n{traceback.format_exc()}", end="",
                  file=sys.stderr)
        _put_text(errors[rank], f"{type(exc).__name__}: {exc}")
        code = 1
    sys.exit(code)


def run_jobs(jobs: Sequence[Job], p: int | None = None, *, markers: bool = True
             ) -> list[np.ndarray]:
    """Run ``jobs`` in order in one launch of p pinned workers. Per job the times in ns:
    (repeats, supersteps, p) for a program, (repeats, 1, p) for a calibration operation or
    transfer (the transfer's time on the last processor, zero elsewhere).
    :class:`ConvolutionError` if an output is wrong or a worker fails."""
    p = default_p() if p is None else p
    if not jobs:
        return []
    offsets = [0]
    for job in jobs:
        offsets.append(offsets[-1] + job.repeats * _steps(job, p) * p)
    words = _segment_words(jobs, p)
    shm = shared_memory.SharedMemory(create=True, size=8 * words)
    times_shm = shared_memory.SharedMemory(create=True, size=8 * max(1, offsets[-1]))
    text = shared_memory.SharedMemory(create=True, size=(p + 1) * MSG_BYTES)
    try:
        np.ndarray(((p + 1) * MSG_BYTES,), dtype=np.uint8, buffer=text.buf)[:] = 0
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(p)
        procs = [ctx.Process(target=_worker, args=(r, p, jobs, offsets, words, shm, times_shm,
                                                   text, barrier, os.getpid(), markers),
                             daemon=True, name=f"convolution-{r}") for r in range(p)]
        for proc in procs:
            proc.start()
        failures: list[str] = []
        alive = list(procs)
        try:
            while alive:
                mp.connection.wait([proc.sentinel for proc in alive])
                for proc in [x for x in alive if not x.is_alive()]:
                    proc.join()
                    alive.remove(proc)
                    if proc.exitcode != 0:
                        barrier.abort()
                    if proc.exitcode not in (0, EXIT_ABORTED):
                        rank = procs.index(proc)
                        why = _get_text(np.ndarray((MSG_BYTES,), dtype=np.uint8,
                                                   buffer=text.buf, offset=rank * MSG_BYTES))
                        failures.append(f"processor {rank} failed (exit code {proc.exitcode})"
                                        + (f": {why}" if why else ""))
        finally:
            for proc in alive:
                proc.terminate()
                proc.join()
        if failures:
            raise ConvolutionError("; ".join(failures))
        flat = np.ndarray((offsets[-1],), dtype=np.int64, buffer=times_shm.buf).copy()
        return [flat[offsets[i]:offsets[i + 1]].reshape(job.repeats, _steps(job, p), p)
                for i, job in enumerate(jobs)]
    finally:
        for s in (shm, times_shm, text):
            s.close()
            s.unlink()


def result(job: ProgramJob, p: int, times_ns: np.ndarray) -> dict[str, Any]:
    """The result object of one program job: per superstep the median over repeats of the
    slowest processor's time, and the median total."""
    names = [s.name for s in cv.program(job.name, job.size, job.block, p)]
    per = times_ns.max(axis=2)  # (repeats, supersteps)
    return {"program": job.name, "size": job.size, "block": job.block, "p": p,
            "repeats": job.repeats, "checked": job.check,
            "supersteps": [{"index": i, "name": n, "time_s": float(np.median(per[:, i])) / 1e9}
                           for i, n in enumerate(names)],
            "total_s": float(np.median(per.sum(axis=1))) / 1e9,
            "totals_s": [float(t) / 1e9 for t in per.sum(axis=1)]}


def run(name: str, *, size: int, block: int, p: int | None = None, repeats: int = 1,
        seed: int = 0) -> dict[str, Any]:
    """``repeats`` checked runs of program ``name`` ("shift" or "scan") in one launch:
    ``{"program", "size", "block", "p", "repeats", "checked", "supersteps": [{"index", "name",
    "time_s"}], "total_s", "totals_s"}``. :class:`BadArgument` for a configuration it
    refuses, :class:`ConvolutionError` for a wrong output or a failed worker."""
    procs = default_p() if p is None else p
    job = program_job(name, size=size, block=block, p=procs, repeats=repeats, seed=seed)
    return result(job, procs, run_jobs([job], procs)[0])


# -- command line ------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"convolution: {message}\n")


def format_result(res: dict[str, Any]) -> str:
    lines = [f"conv-{res['program']}: L {res['size']}, b {res['block']}, p {res['p']}, "
             f"{res['repeats']} runs (median): correct"]
    for s in res["supersteps"]:
        lines.append(f"  {s['index']:>3}  {s['name']:<16} {s['time_s'] * 1e3:>10.3f} ms")
    lines.append(f"       {'total':<16} {res['total_s'] * 1e3:>10.3f} ms")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = _Parser(prog="convolution.py", description="Uniform convolution by shifts (Conv-Shift) "
                 "or by prefix sums (Conv-Scan) over a 1 x p mesh, timed per superstep.")
    ap.add_argument("program", choices=PROGRAMS)
    ap.add_argument("--size", type=int, required=True, help="L: the image is L x L float64")
    ap.add_argument("--block", type=int, required=True, help="b: the b x b box summed")
    ap.add_argument("-p", type=int, default=None, help="processors (default: CPUs, at most 4)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs (median reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON object")
    args = ap.parse_args(argv)
    try:
        res = run(args.program, size=args.size, block=args.block, p=args.p,
                  repeats=args.repeat, seed=args.seed)
    except BadArgument as exc:
        ap.exit(2, f"convolution: {exc}\n")
    except ConvolutionError as exc:
        print(f"convolution: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("convolution: interrupted", file=sys.stderr)
        return 130
    print(json.dumps(res, allow_nan=False) if args.json else format_result(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
