"""The three bulk-synchronous sorts of Amato et al.'s sorting study, as SPMD programs.

N. M. Amato, J. Perdue, A. Pietracaprina, G. Pucci and M. Mathis, "Predicting Performance on
SMPs. A Case Study: The SGI Power Challenge" (section 5.2, Table 2) time radix sort, sample
sort and column sort superstep by superstep; E. A. Brewer, "High-Level Optimization via
Automated Statistical Modeling" selects between such sorts with fitted models (his radix sort
model is ``a*bins + b*iter*keys + c*logP``). This program runs the sorts the same way: p worker
processes (one per CPU, at most 4, pinned), keys in shared memory, ``ctx.Barrier(p)`` between
supersteps, each superstep inside a ``counterd.superstep`` marker. Supersteps (Table 2's):

  radix   per digit of ``bpd`` bits (ceil(width/bpd) digits, least significant first):
          count elements  each processor counts its keys per numeral (2**bpd bins)
          prefix sums     from the p x 2**bpd count matrix: where each (processor, numeral)
                          starts in the output
          add offsets     each key's destination index (stable within its numeral)
          move elements   scatter the keys into the other shared buffer
  sample  get sample      ``oversample`` random keys of each processor into a shared array
          count elements  p-1 splitters from the sorted sample; each key's bucket by binary
                          search; counts per bucket
          prefix sum      where each (processor, bucket) starts in the output
          fill buckets    move the keys into their buckets
          sort buckets    processor i sorts bucket i
  column  Leighton's columnsort on an r x s matrix, r = n/p rows, s = p columns (processor j
          holds column j); needs s | r and r >= 2(s-1)^2:
          init            copy the input into the matrix
          sort/transpose  sort the column; deal it out row by row (steps 1-2)
          sort/reverse transpose  sort; gather the columns back (steps 3-4)
          sort            sort the column (step 5)
          right shift/sort/left shift  sort the column shifted down by r/2 (steps 6-8)

The time of a superstep is the BSP one: each processor times its own work (perf_counter_ns,
not the barrier) and the superstep takes the slowest processor's time; the total is the sum.
Every run checks that the output is sorted and a permutation of the input.

    python examples/bsp_sort.py radix --keys 100000 --width 32 --bpd 8 [-p 2] [--json]
    python examples/bsp_sort.py --batch configs.jsonl [--out results.jsonl]
    counterd record --out run.jsonl -- python examples/bsp_sort.py sample --keys 100000

From Python (the repository root is not a package)::

    sys.path.insert(0, str(ROOT / "examples")); import bsp_sort
    bsp_sort.run("radix", keys=10**5, width=32, bpd=8, p=2)   # one result object
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import multiprocessing.connection
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from multiprocessing import shared_memory
from pathlib import Path
from typing import IO, Any, NamedTuple, NoReturn

import numpy as np
from numpy.random import default_rng  # loaded here, not in every forked worker

import counterd

ALGOS = ("radix", "sample", "column")
RADIX_STEPS = ("count elements", "prefix sums", "add offsets", "move elements")
SAMPLE_STEPS = ("get sample", "count elements", "prefix sum", "fill buckets", "sort buckets")
COLUMN_STEPS = ("init", "sort/transpose", "sort/reverse transpose", "sort",
                "right shift/sort/left shift")
DEFAULT_WIDTH = 32
DEFAULT_BPD = 8
DEFAULT_OVERSAMPLE = 32
MAX_P = 256
MAX_TOTAL_KEYS = 1 << 31  # n = p * keys; three uint32 arrays of n in shared memory
MAX_OVERSAMPLE = 1 << 20
# Runs per launch of the workers. With nothing recording, counterd keeps every superstep of a
# process in memory (about 1 KB each): 1000 repeats of radix sort with bpd 1 hold 128 MB per
# worker. More runs: more batch lines (each launch starts with fresh workers).
MAX_REPEAT = 1000
MAX_BATCH_BYTES = 16 << 20
MSG_BYTES = 1024
EXIT_ABORTED = 3  # a worker that stopped because another one failed


class BadArgument(ValueError):
    """A configuration this program refuses (the CLI: one line, exit 2)."""


class SortError(RuntimeError):
    """A run that did not produce a sorted permutation of its input, or whose workers failed
    (the CLI: one line, exit 1)."""

    config: Config | None = None


class Config(NamedTuple):
    algo: str
    keys: int  # keys per processor, n/p
    width: int
    bpd: int | None  # radix only
    oversample: int | None  # sample only
    p: int
    seed: int
    repeats: int

    @property
    def n(self) -> int:
        return self.p * self.keys

    def names(self) -> list[str]:
        return superstep_names(self.algo, width=self.width, bpd=self.bpd)


def default_p() -> int:
    """The CPUs this process may run on, at most 4."""
    return min(4, len(os.sched_getaffinity(0)))


def superstep_names(algo: str, *, width: int = DEFAULT_WIDTH, bpd: int | None = None
                    ) -> list[str]:
    """The supersteps of one run, in order (radix: four per digit)."""
    if algo == "radix":
        return list(RADIX_STEPS) * digits(width, bpd or DEFAULT_BPD)
    if algo == "sample":
        return list(SAMPLE_STEPS)
    if algo == "column":
        return list(COLUMN_STEPS)
    raise BadArgument(f"unknown algorithm {algo!r}: choose from {', '.join(ALGOS)}")


def digits(width: int, bpd: int) -> int:
    """Radix sort's iterations: ceil(width / bpd)."""
    return -(-width // bpd)


def _int(value: Any, what: str) -> int:
    """An integer argument; integral floats (1e6) are accepted, booleans are not."""
    if isinstance(value, bool):
        raise BadArgument(f"{what} must be an integer, not {json.dumps(value)}")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise BadArgument(f"{what} must be an integer, not {value!r}")
    return value


def _in(value: Any, what: str, lo: int, hi: int) -> int:
    v = _int(value, what)
    if not lo <= v <= hi:
        raise BadArgument(f"{what} must be {lo}..{hi}, not {v}")
    return v


def config(algo: str, *, keys: Any, width: Any = DEFAULT_WIDTH, bpd: Any = None,
           oversample: Any = None, p: Any = None, seed: Any = 0, repeats: Any = 1) -> Config:
    """A checked configuration; :class:`BadArgument` says what is wrong, in one line."""
    if algo not in ALGOS:
        raise BadArgument(f"unknown algorithm {algo!r}: choose from {', '.join(ALGOS)}")
    if keys is None:
        raise BadArgument("keys (per processor, n/p) is required")
    k = _in(keys, "keys (per processor)", 1, MAX_TOTAL_KEYS)
    w = _in(width, "width (bits per key)", 1, 32)
    if bpd is not None and algo != "radix":
        raise BadArgument(f"bpd (bits per digit) is for radix sort, not {algo} sort")
    if oversample is not None and algo != "sample":
        raise BadArgument(f"oversample is for sample sort, not {algo} sort")
    d = _in(DEFAULT_BPD if bpd is None else bpd, "bpd (bits per digit)", 1, 16) \
        if algo == "radix" else None
    s = _in(DEFAULT_OVERSAMPLE if oversample is None else oversample, "oversample", 1,
            MAX_OVERSAMPLE) if algo == "sample" else None
    procs = _in(default_p() if p is None else p, "p (processors)", 1, MAX_P)
    sd = _in(seed, "seed", 0, (1 << 63) - 1)
    r = _in(repeats, "repeat", 1, MAX_REPEAT)
    if k * procs > MAX_TOTAL_KEYS:
        raise BadArgument(f"n = keys * p = {k * procs} keys: at most {MAX_TOTAL_KEYS}")
    if algo == "column" and (k % procs or k < 2 * (procs - 1) ** 2):
        raise BadArgument(
            f"column sort needs keys per processor (rows r = n/p) to be a multiple of p and "
            f"at least 2(p-1)^2 = {2 * (procs - 1) ** 2} (Leighton: s | r, r >= 2(s-1)^2 for "
            f"s = p columns): keys {k}, p {procs}")
    return Config(algo, k, w, d, s, procs, sd, r)


# -- input, checking ---------------------------------------------------------------------------

def make_keys(seed: int, rank: int, count: int, width: int) -> np.ndarray:
    """Processor ``rank``'s keys: ``count`` uniform unsigned integers of ``width`` bits (uint32),
    the same for the same seed."""
    rng = default_rng([seed, rank])
    return rng.integers(0, 1 << width, size=count, dtype=np.uint32)


def verify(inp: np.ndarray, out: np.ndarray, *, sorted_inp: np.ndarray | None = None
           ) -> str | None:
    """None if ``out`` is sorted and a permutation of ``inp``, else what is wrong (one line).
    ``sorted_inp``: ``np.sort(inp)``, if already known."""
    if out.shape != inp.shape:
        return f"output has {out.size} keys, input {inp.size}"
    down = np.flatnonzero(out[1:] < out[:-1])
    if down.size:
        i = int(down[0])
        return (f"output not sorted: key {i} = {int(out[i])} > key {i + 1} = {int(out[i + 1])}"
                f" ({down.size} descents)")
    ref = np.sort(inp) if sorted_inp is None else sorted_inp
    differ = np.flatnonzero(out != ref)
    if differ.size:
        i = int(differ[0])
        return (f"output is not a permutation of the input: sorted position {i} holds "
                f"{int(out[i])}, the input sorted has {int(ref[i])} ({differ.size} positions "
                f"differ)")
    return None


# -- shared memory -----------------------------------------------------------------------------

class _Shared:
    """One shared-memory segment carved into named numpy arrays (page-aligned)."""

    PAGE = 4096

    def __init__(self, layout: Sequence[tuple[str, Any, int]]) -> None:
        offsets = []
        size = 0
        for name, dtype, count in layout:
            offsets.append((name, np.dtype(dtype), count, size))
            size += -(-max(1, count * np.dtype(dtype).itemsize) // self.PAGE) * self.PAGE
        try:
            self.shm = shared_memory.SharedMemory(create=True, size=size)
        except OSError as exc:
            raise SortError(f"cannot allocate {size} bytes of shared memory: "
                            f"{exc.strerror or exc}") from None
        self.arrays: dict[str, np.ndarray] = {
            name: np.ndarray((count,), dtype=dtype, buffer=self.shm.buf, offset=off)
            for name, dtype, count, off in offsets}

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    def close(self) -> None:
        self.arrays.clear()  # the views must go before the buffer can be closed
        self.shm.close()
        self.shm.unlink()


def _put_text(buf: np.ndarray, text: str) -> None:
    """One line of text into a shared byte array (cut to fit, NUL-terminated)."""
    data = " ".join(text.split()).encode(errors="replace")[:buf.size - 1]
    buf[:len(data)] = np.frombuffer(data, dtype=np.uint8)
    buf[len(data)] = 0


def _get_text(buf: np.ndarray) -> str:
    return bytes(buf).split(b"\0", 1)[0].decode(errors="replace")


def _layout(cfg: Config) -> list[tuple[str, Any, int]]:
    bins = 1 << cfg.bpd if cfg.algo == "radix" and cfg.bpd else cfg.p
    steps = len(cfg.names())
    return [("inp", np.uint32, cfg.n), ("a", np.uint32, cfg.n),
            ("b", np.uint32, cfg.n if cfg.algo != "sample" else 0),
            ("counts", np.int64, cfg.p * bins),
            ("samples", np.uint32, cfg.p * (cfg.oversample or 0)),
            ("times", np.int64, cfg.repeats * steps * cfg.p),
            ("status", np.int64, cfg.repeats), ("msg", np.uint8, MSG_BYTES),
            ("errors", np.uint8, cfg.p * MSG_BYTES)]


# -- supersteps --------------------------------------------------------------------------------

class _Clock:
    """One processor's supersteps of one repeat: each is marked, timed and ends at a barrier.

    ``with clock("count elements"):`` runs the body inside ``counterd.superstep`` with the
    run's params, stores the body's time (perf_counter_ns, the marker and barrier excluded)
    in ``times[index, rank]``, then waits at the barrier."""

    def __init__(self, cfg: Config, rank: int, barrier: Any, times: np.ndarray) -> None:
        self.rank = rank
        self.barrier = barrier
        self.times = times  # (supersteps, p) ns
        self.names = cfg.names()
        self.index = 0
        self.params: dict[str, Any] = {"algo": cfg.algo, "keys": cfg.keys, "width": cfg.width,
                                       "p": cfg.p}
        if cfg.bpd is not None:
            self.params["bpd"] = cfg.bpd
        if cfg.oversample is not None:
            self.params["oversample"] = cfg.oversample
        self._extra: dict[str, Any] = {}
        self._t0 = 0
        self._marker: Any = None

    def __call__(self, name: str, **extra: Any) -> _Clock:
        expected = self.names[self.index] if self.index < len(self.names) else None
        if name != expected:
            raise AssertionError(f"superstep {self.index} is {name!r}, expected {expected!r}")
        self._extra = extra
        return self

    def __enter__(self) -> None:
        self._marker = counterd.superstep(self.names[self.index], **self.params, **self._extra)
        self._marker.__enter__()
        self._t0 = time.perf_counter_ns()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        t1 = time.perf_counter_ns()
        self.times[self.index, self.rank] = t1 - self._t0
        self.index += 1
        marker, self._marker = self._marker, None
        marker.__exit__(exc_type, exc, tb)
        if exc_type is None:
            self.barrier.wait()


def _start_offsets(counts: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """From the p x bins count matrix: where each numeral (bucket) of processor ``rank`` starts
    in the output (numerals in order, processors in order within a numeral), and where each
    numeral starts overall."""
    totals = counts.sum(axis=0)
    base = np.cumsum(totals) - totals
    return base + counts[:rank].sum(axis=0), base


def _destinations(labels: np.ndarray, mine: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Each key's destination index: its numeral's start plus its rank among this processor's
    keys of that numeral (stable). ``mine``: this processor's count per numeral."""
    order = np.argsort(labels, kind="stable")  # numpy: a radix sort for 8- and 16-bit labels
    dest = np.empty(labels.size, dtype=np.intp)
    # In numeral order the destinations are consecutive runs: start[v], start[v] + 1, ...
    shift = np.repeat(start - (np.cumsum(mine) - mine), mine)
    dest[order] = np.arange(labels.size, dtype=np.intp) + shift
    return dest


def _radix(cfg: Config, rank: int, sh: _Shared, clock: _Clock) -> np.ndarray:
    assert cfg.bpd is not None
    r, p, bpd = cfg.keys, cfg.p, cfg.bpd
    bins = 1 << bpd
    mask = np.uint32(bins - 1)
    lo, hi = rank * r, (rank + 1) * r
    counts = sh["counts"].reshape(p, bins)
    label = np.uint8 if bpd <= 8 else np.uint16
    src, dst, spare = sh["inp"], sh["a"], sh["b"]
    for d in range(digits(cfg.width, bpd)):
        block = src[lo:hi]
        with clock("count elements", digit=d):
            numerals = ((block >> np.uint32(d * bpd)) & mask).astype(label)
            mine = np.bincount(numerals, minlength=bins)
            counts[rank] = mine
        with clock("prefix sums", digit=d):
            start, _ = _start_offsets(counts, rank)
        with clock("add offsets", digit=d):
            dest = _destinations(numerals, mine, start)
        with clock("move elements", digit=d):
            dst[dest] = block
        src, dst, spare = dst, spare, dst
    return src


def _sample(cfg: Config, rank: int, sh: _Shared, clock: _Clock) -> np.ndarray:
    assert cfg.oversample is not None
    r, p, s = cfg.keys, cfg.p, cfg.oversample
    lo, hi = rank * r, (rank + 1) * r
    block, out = sh["inp"][lo:hi], sh["a"]
    counts = sh["counts"].reshape(p, p)
    samples = sh["samples"]
    rng = default_rng([cfg.seed, rank, 1])
    label = np.uint8 if p <= 256 else np.uint16
    with clock("get sample"):
        samples[rank * s:(rank + 1) * s] = block[rng.integers(0, r, size=s)]
    with clock("count elements"):
        splitters = np.sort(samples)[s * np.arange(1, p)]
        buckets = np.searchsorted(splitters, block, side="right").astype(label)
        mine = np.bincount(buckets, minlength=p)
        counts[rank] = mine
    with clock("prefix sum"):
        start, base = _start_offsets(counts, rank)
    with clock("fill buckets"):
        out[_destinations(buckets, mine, start)] = block
    with clock("sort buckets"):
        total = int(counts[:, rank].sum())
        out[base[rank]:base[rank] + total].sort()
    return out


def _column(cfg: Config, rank: int, sh: _Shared, clock: _Clock) -> np.ndarray:
    r, s = cfg.keys, cfg.p  # r rows, s columns; column j is a[j*r:(j+1)*r]
    q, h = r // s, r // 2
    j = rank
    inp, a, b = sh["inp"], sh["a"], sh["b"]
    with clock("init"):
        a[j * r:(j + 1) * r] = inp[j * r:(j + 1) * r]
    with clock("sort/transpose"):
        # Column-major order laid down row-major: element t of column j goes to column t % s,
        # row j*q + t // s.
        col = np.sort(a[j * r:(j + 1) * r])
        b.reshape(s, r)[:, j * q:(j + 1) * q] = col.reshape(q, s).T
    with clock("sort/reverse transpose"):
        # The inverse: rows j'*q..(j'+1)*q of column j go to column j', every s-th place.
        col = np.sort(b[j * r:(j + 1) * r])
        a.reshape(s, q, s)[:, :, j] = col.reshape(s, q)
    with clock("sort"):
        a[j * r:(j + 1) * r].sort()
    with clock("right shift/sort/left shift"):
        # Shifted column j straddles columns j-1 and j. Shifted columns 0 and s (half columns
        # padded with -inf/+inf) are sorted already; in column-major storage the shift and its
        # inverse move nothing.
        if j > 0:
            a[j * r - h:j * r - h + r].sort()
    return a


KERNELS = {"radix": _radix, "sample": _sample, "column": _column}


# -- processes ---------------------------------------------------------------------------------

_markers_prepared = False


def _prepare_markers() -> None:
    """Load in this (the parent) process what each forked worker's first marker would load on
    its own: the recorder's modules, the backend's tables, the daemon's socket path, the run
    id's hash. Measured on a 2-CPU VM: the first marker of a worker took 55-80 ms without this,
    6 ms with it (what is left is counterd probing perf in each new process). Nothing here
    creates a recorder or changes the environment; a failure only loses the head start."""
    global _markers_prepared
    if _markers_prepared:
        return
    _markers_prepared = True
    try:
        from counterd import backends
        from counterd.daemon.config import default_socket_path
        from counterd.data.env import ENV_BACKEND
        from counterd.markers import api, identity  # noqa: F401 - imported for the workers

        name = os.environ.get(ENV_BACKEND) or "auto"
        backends.resolve("auto" if name == "default" else name, "markers")
        identity.default_run_id()
        default_socket_path()
    except Exception:  # noqa: BLE001 - only a head start; the workers' markers report errors
        pass


def _flush_markers() -> None:
    """multiprocessing's forked workers leave through os._exit, which skips the at-exit handler
    that closes open supersteps and flushes records to a counterd daemon."""
    try:
        from counterd.markers import api
    except ImportError:  # pragma: no cover - an older counterd
        return
    api._at_exit()


def _die_with_parent(parent: int) -> None:
    """Have the kernel end this worker when the parent dies (a killed parent would otherwise
    leave its workers waiting at a barrier for ever)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the orphan check below is all there is
        pass
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(EXIT_ABORTED)


def _worker(rank: int, cfg: Config, sh: _Shared, barrier: Any, parent: int) -> None:
    code = 0
    try:
        _die_with_parent(parent)
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
        counterd.set_rank(rank)
        r = cfg.keys
        lo, hi = rank * r, (rank + 1) * r
        sh["inp"][lo:hi] = make_keys(cfg.seed, rank, r, cfg.width)
        for name in ("a", "b"):  # first touch by the processor that uses the block
            if sh[name].size:
                sh[name][lo:hi] = 0
        barrier.wait()
        sorted_inp = np.sort(sh["inp"]) if rank == 0 else None  # the reference, once
        steps = len(cfg.names())
        times = sh["times"].reshape(cfg.repeats, steps, cfg.p)
        kernel = KERNELS[cfg.algo]
        for rep in range(cfg.repeats):
            barrier.wait()
            clock = _Clock(cfg, rank, barrier, times[rep])
            out = kernel(cfg, rank, sh, clock)
            if clock.index != steps:
                raise AssertionError(f"{clock.index} supersteps run, {steps} expected")
            if rank == 0:
                problem = verify(sh["inp"], out, sorted_inp=sorted_inp)
                sh["status"][rep] = 1 if problem is None else 2
                if problem is not None and not sh["msg"][0]:
                    _put_text(sh["msg"], problem)
            barrier.wait()  # the output is checked before the next repeat overwrites it
        _flush_markers()
    except threading.BrokenBarrierError:
        code = EXIT_ABORTED  # another processor failed; it says why
    except KeyboardInterrupt:
        barrier.abort()
        code = 130
    except BaseException as exc:
        barrier.abort()
        print(f"bsp_sort: processor {rank} failed:\n{traceback.format_exc()}", end="",
              file=sys.stderr)
        _put_text(sh["errors"][rank * MSG_BYTES:(rank + 1) * MSG_BYTES],
                  f"{type(exc).__name__}: {exc}")
        code = 1
    sys.exit(code)


def _launch(cfg: Config) -> list[np.ndarray]:
    """Run ``cfg.repeats`` sorts in one launch of p workers; per repeat the (supersteps, p)
    matrix of times in ns. :class:`SortError` if an output is wrong or a worker fails."""
    _prepare_markers()
    sh = _Shared(_layout(cfg))
    try:
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(cfg.p)
        procs = [ctx.Process(target=_worker, args=(rank, cfg, sh, barrier, os.getpid()),
                             daemon=True, name=f"bsp_sort-{rank}") for rank in range(cfg.p)]
        for proc in procs:
            proc.start()
        failures: list[str] = []
        alive = list(procs)
        try:
            while alive:
                mp.connection.wait([proc.sentinel for proc in alive])
                for proc in [proc for proc in alive if not proc.is_alive()]:
                    proc.join()
                    alive.remove(proc)
                    code = proc.exitcode
                    if code != 0:
                        barrier.abort()  # the others stop at their next barrier
                    if code not in (0, EXIT_ABORTED):
                        rank = procs.index(proc)
                        how = f"signal {-code}" if code is not None and code < 0 \
                            else f"exit code {code}"
                        why = _get_text(sh["errors"][rank * MSG_BYTES:(rank + 1) * MSG_BYTES])
                        failures.append(f"processor {rank} failed ({how})"
                                        + (f": {why}" if why else ""))
        finally:
            for proc in alive:  # interrupted: do not leave workers behind
                proc.terminate()
                proc.join()
        if failures:
            raise SortError(f"{cfg.algo} sort: " + "; ".join(failures))
        status = sh["status"].copy()
        if (status != 1).any():
            rep = int(np.flatnonzero(status != 1)[0])
            msg = _get_text(sh["msg"]) or "not checked"
            raise SortError(f"{cfg.algo} sort, repeat {rep}: {msg}")
        steps = len(cfg.names())
        times = sh["times"].reshape(cfg.repeats, steps, cfg.p).copy()
        return list(times)
    finally:
        sh.close()


def _result(cfg: Config, rep: int, times_ns: np.ndarray) -> dict[str, Any]:
    per = times_ns.max(axis=1)  # the slowest processor's time per superstep
    res: dict[str, Any] = {"algo": cfg.algo, "keys": cfg.keys, "width": cfg.width}
    if cfg.bpd is not None:
        res["bpd"] = cfg.bpd
    if cfg.oversample is not None:
        res["oversample"] = cfg.oversample
    res.update(p=cfg.p, seed=cfg.seed, repeat=rep,
               supersteps=[{"index": i, "name": name, "time_s": int(t) / 1e9}
                           for i, (name, t) in enumerate(zip(cfg.names(), per, strict=True))],
               total_s=int(per.sum()) / 1e9, sorted=True)
    return res


def run_config(cfg: Config) -> list[dict[str, Any]]:
    """All repeats of a checked configuration, in one launch of its p workers."""
    return [_result(cfg, rep, t) for rep, t in enumerate(_launch(cfg))]


def run_repeats(algo: str, *, keys: int, width: int = DEFAULT_WIDTH, bpd: int | None = None,
                oversample: int | None = None, p: int | None = None, seed: int = 0,
                repeats: int = 1) -> list[dict[str, Any]]:
    """``repeats`` runs of one sort on the same input (one launch of the p workers): one result
    object each (see :func:`run`), with ``repeat`` 0, 1, ..."""
    return run_config(config(algo, keys=keys, width=width, bpd=bpd, oversample=oversample,
                             p=p, seed=seed, repeats=repeats))


def run(algo: str, *, keys: int, width: int = DEFAULT_WIDTH, bpd: int | None = None,
        oversample: int | None = None, p: int | None = None, seed: int = 0,
        repeat: int = 0) -> dict[str, Any]:
    """One run of ``algo`` ("radix", "sample", "column") on ``keys`` keys per processor:
    ``{"algo", "keys", "width", "bpd" (radix), "oversample" (sample), "p", "seed", "repeat",
    "supersteps": [{"index", "name", "time_s"}], "total_s", "sorted": true}``. ``repeat`` is
    only the label of the result (the input depends on the seed alone). Raises
    :class:`BadArgument` for a configuration it refuses, :class:`SortError` if the output is
    not a sorted permutation of the input or a worker fails."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 0:
        raise BadArgument(f"repeat must be an integer >= 0, not {repeat!r}")
    res = run_repeats(algo, keys=keys, width=width, bpd=bpd, oversample=oversample, p=p,
                      seed=seed)[0]
    res["repeat"] = repeat
    return res


# -- command line ------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"bsp_sort: {message}\n")


def _number(text: str) -> int:
    """An integer on the command line; 1e6 is accepted."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not (math.isfinite(value) and value.is_integer()):
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    return int(value)


def _parser() -> _Parser:
    ap = _Parser(prog="bsp_sort.py", description="The BSP sorts of Amato et al. (radix, sample, "
                 "column sort) over p processes, timed per superstep.")
    ap.add_argument("algo", nargs="?", choices=ALGOS, help="the sort (or give --batch)")
    ap.add_argument("--keys", type=_number, help="keys per processor (n/p)")
    ap.add_argument("--width", type=_number,
                    help=f"bits per key, 1..32 (default {DEFAULT_WIDTH})")
    ap.add_argument("--bpd", type=_number,
                    help=f"radix: bits per digit, 1..16 (default {DEFAULT_BPD})")
    ap.add_argument("--oversample", type=_number,
                    help=f"sample: sample keys per processor (default {DEFAULT_OVERSAMPLE})")
    ap.add_argument("-p", type=_number, help="processes (default: CPUs available, at most 4)")
    ap.add_argument("--seed", type=_number, default=0, help="input seed (default 0)")
    ap.add_argument("--repeat", type=_number,
                    help="runs on the same input (default 1)")
    ap.add_argument("--json", action="store_true", help="one JSON object per run")
    ap.add_argument("--batch", metavar="FILE.jsonl",
                    help='one configuration per line: {"algo", "keys", "width", "bpd", '
                    '"oversample", "repeat", "p", "seed"} (algo and keys required)')
    ap.add_argument("--out", metavar="FILE", help="write the JSON lines to FILE, not stdout")
    return ap


BATCH_KEYS = ("algo", "keys", "width", "bpd", "oversample", "repeat", "p", "seed")


def read_batch(path: Path, *, p: int | None = None, seed: int = 0) -> list[Config]:
    """The configurations of a batch file, all checked before any runs; ``p`` and ``seed``
    apply to lines that do not give their own. :class:`BadArgument` names the file and line."""
    from counterd.util.strictjson import Malformed, loads

    try:
        size = path.stat().st_size
        if size > MAX_BATCH_BYTES:
            raise BadArgument(f"{path}: {size} bytes, more than {MAX_BATCH_BYTES}")
        data = path.read_bytes()
    except OSError as exc:
        raise BadArgument(f"cannot read {path}: {exc.strerror or exc}") from None
    configs = []
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            item = loads(line)
        except Malformed as exc:
            raise BadArgument(f"{where}: not JSON: {exc}") from None
        if not isinstance(item, dict):
            raise BadArgument(f"{where}: not a JSON object")
        unknown = sorted(set(item) - set(BATCH_KEYS))
        if unknown:
            raise BadArgument(f"{where}: unknown key {unknown[0]!r} (known: "
                              f"{', '.join(BATCH_KEYS)})")
        if "algo" not in item or "keys" not in item:
            raise BadArgument(f"{where}: needs \"algo\" and \"keys\"")
        try:
            configs.append(config(
                item["algo"] if isinstance(item["algo"], str) else repr(item["algo"]),
                keys=item["keys"], width=item.get("width", DEFAULT_WIDTH),
                bpd=item.get("bpd"), oversample=item.get("oversample"),
                p=item.get("p", p), seed=item.get("seed", seed),
                repeats=item.get("repeat", 1)))
        except BadArgument as exc:
            raise BadArgument(f"{where}: {exc}") from None
    if not configs:
        raise BadArgument(f"{path}: no configurations")
    return configs


def format_result(res: dict[str, Any]) -> str:
    """The text form of one result: one line per superstep and the total."""
    extra = (f", bpd {res['bpd']}" if "bpd" in res else "") + \
        (f", oversample {res['oversample']}" if "oversample" in res else "")
    lines = [f"{res['algo']} sort: {res['keys']} keys per processor, width {res['width']}"
             f"{extra}, p {res['p']}, seed {res['seed']}, repeat {res['repeat']}: sorted"]
    for step in res["supersteps"]:
        lines.append(f"  {step['index']:>3}  {step['name']:<28} {step['time_s'] * 1e3:>10.3f} ms")
    lines.append(f"       {'total':<28} {res['total_s'] * 1e3:>10.3f} ms")
    return "\n".join(lines)


def _results(configs: Sequence[Config]) -> Iterator[dict[str, Any] | SortError]:
    for cfg in configs:
        try:
            results = run_config(cfg)
        except SortError as exc:
            exc.config = cfg
            yield exc
        else:
            yield from results


def _failure(cfg: Config, exc: SortError) -> dict[str, Any]:
    """The JSON line of a configuration that failed: its parameters, sorted false, the error."""
    res: dict[str, Any] = {"algo": cfg.algo, "keys": cfg.keys, "width": cfg.width}
    if cfg.bpd is not None:
        res["bpd"] = cfg.bpd
    if cfg.oversample is not None:
        res["oversample"] = cfg.oversample
    res.update(p=cfg.p, seed=cfg.seed, sorted=False, error=str(exc))
    return res


def main(argv: Sequence[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        if args.batch is not None:
            given = [opt for opt, value in (("an algorithm", args.algo), ("--keys", args.keys),
                                            ("--width", args.width), ("--bpd", args.bpd),
                                            ("--oversample", args.oversample),
                                            ("--repeat", args.repeat)) if value is not None]
            if given:
                raise BadArgument(f"--batch takes its configurations from the file: {given[0]} "
                                  f"goes into its lines (-p and --seed apply to every line)")
            configs = read_batch(Path(args.batch), p=args.p, seed=args.seed)
        elif args.algo is None:
            raise BadArgument("give an algorithm (radix, sample, column) or --batch FILE")
        else:
            configs = [config(args.algo, keys=args.keys,
                              width=DEFAULT_WIDTH if args.width is None else args.width,
                              bpd=args.bpd, oversample=args.oversample, p=args.p,
                              seed=args.seed, repeats=1 if args.repeat is None else args.repeat)]
        out: IO[str] = sys.stdout
        if args.out is not None:
            try:
                out = open(args.out, "w", encoding="utf-8")  # closed below
            except OSError as exc:
                raise BadArgument(f"cannot write {args.out}: {exc.strerror or exc}") from None
    except BadArgument as exc:
        ap.exit(2, f"bsp_sort: {exc}\n")
    as_json = args.json or args.batch is not None or args.out is not None
    failed = 0
    try:
        for res in _results(configs):
            if isinstance(res, SortError):
                failed += 1
                print(f"bsp_sort: {res}", file=sys.stderr)
                if args.batch is None:
                    return 1
                if res.config is not None:
                    out.write(json.dumps(_failure(res.config, res)) + "\n")
                    out.flush()
                continue
            out.write(json.dumps(res, allow_nan=False) + "\n" if as_json
                      else format_result(res) + "\n")
            out.flush()
    except KeyboardInterrupt:
        print("bsp_sort: interrupted", file=sys.stderr)
        return 130
    finally:
        if out is not sys.stdout:
            out.close()
    if failed:
        print(f"bsp_sort: {failed} of {len(configs)} configurations failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
