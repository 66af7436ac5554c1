"""``counterd record --backend callgrind``: the counted run of a command (:func:`count_command`)
and its supersteps' records (:func:`count_supersteps`), the boundary calls taken from the
markers' spool file; the environment a counted run gets (:data:`SERIAL_POOLS`,
:func:`as_counted_env`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterd.backends.base import CounterValue
from counterd.backends.callgrind.dumps import (
    counter_support,
    sum_totals,
    supersteps_from_dumps,
    to_canonical,
)
from counterd.backends.callgrind.geometry import CacheAdjustment, CallgrindGeometry
from counterd.backends.callgrind.run import run
from counterd.backends.callgrind.valgrind import BEGIN, END, NAME, CallgrindError

if TYPE_CHECKING:
    from counterd.data.records import SuperstepRecord


def boundary_calls_from_spool(
        path: Path) -> tuple[list[tuple[int, int]], dict[int, dict[str, Any]]]:
    """The boundary calls one process made, in order, from its marker spool file
    (format: :mod:`counterd.wire.spool`), and its ``begin`` lines by index.

    The marker API writes a ``begin`` line just before its begin call and a ``record`` line
    just after its end call, so for a single-threaded process the line order is the call
    order. A record without ``end_ns`` (closed at exit) made no call; an ``unmatched_end``
    record made one, for no superstep (index -1). A begin line whose superstep raised gets
    ``"raised"``: the ``record`` line's ``exception`` text, or True where it has none (the flag
    ``exception`` alone, of an older recorder).
    """
    from counterd.wire.spool_reader import read_events

    calls: list[tuple[int, int]] = []
    begins: dict[int, dict[str, Any]] = {}
    for d in read_events(path):
        index = int(d.get("index", -1))
        if d.get("ev") == "begin":
            calls.append((index, BEGIN))
            begins[index] = d
        elif d.get("ev") == "record" and d.get("end_ns") is not None:
            unmatched = "unmatched_end" in d.get("flags", ())
            calls.append((-1 if unmatched else index, END))
            if not unmatched and "exception" in d.get("flags", ()) and index in begins:
                begins[index]["raised"] = _exception_of(d) or True
    return calls, begins


def _exception_of(line: dict[str, Any]) -> str | None:
    """A spool ``record`` line's exception text where it is one a record may hold."""
    from counterd.data.records import MAX_EXCEPTION_CHARS

    text = line.get("exception")
    if isinstance(text, str) and 0 < len(text) <= MAX_EXCEPTION_CHARS and text.isprintable():
        return text
    return None


@dataclass(frozen=True)
class CountedRun:
    """A command's counted run under Callgrind: per-superstep records (from the markers), the
    whole command's counters (every process, every dump), and what the run could not count."""

    supersteps: Mapping[tuple[int, int], SuperstepRecord]
    whole: Mapping[str, CounterValue]
    unsupported: Mapping[str, str]
    exit_code: int
    adjustments: tuple[CacheAdjustment, ...]
    # The signal that stopped the run (:attr:`CallgrindRun.stopped_by`), or None.
    stopped_by: int | None = None
    # The last line the command wrote to its standard error in this run ("" for none): the
    # timed run showed its messages, this run's are not repeated.
    stderr_tail: str = ""


# Valgrind runs a process's threads one at a time, so the spin-waiting worker threads of
# OpenBLAS and OpenMP pools spin for whole scheduler slices: a numpy program that called BLAS
# once took 383 s under Callgrind instead of 31 s with one BLAS thread, and every spin was
# counted as instructions. The counted run uses one thread per pool unless the environment
# says otherwise (the timed run is untouched).
SERIAL_POOLS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# Valgrind's virtual CPU has no AVX-512 (valgrind 3.19-3.24 decode none of it and clear its
# CPUID bits), so a program that picks its code by CPU feature at run time -- numpy's
# dispatch, OpenBLAS's DYNAMIC_ARCH, glibc's string functions -- counts one code path under
# Callgrind and runs another natively on an AVX-512 host. On the `vm` test host (AMD EPYC
# guest) the BSP column sort's supersteps took 16-20 ms natively and 3 ms with AVX-512 hidden;
# the counts describe the latter. Runs timed for counts from Callgrind therefore hide the same
# features from those dispatchers (``counterd record --cpu-features as-counted``, the default
# with --backend callgrind), unless the environment already sets the variable.
AS_COUNTED_ENV = {
    # numpy >= 2.4 names the groups X86_V4 / AVX512_*; older releases AVX512F, AVX512_SKX...
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR AVX512F AVX512CD AVX512_KNL "
                                "AVX512_KNM AVX512_SKX AVX512_CLX AVX512_CNL",
    "GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD",
    "OPENBLAS_CORETYPE": "Haswell",  # the newest OpenBLAS kernel set without AVX-512
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}


def hidden_features(cpu_flags: Collection[str]) -> tuple[str, ...]:
    """The host's CPU features valgrind's virtual CPU lacks (``flags`` of /proc/cpuinfo)."""
    return tuple(sorted(f for f in cpu_flags if f.startswith("avx512")))


def as_counted_env(env: Mapping[str, str], cpu_flags: Collection[str]) -> dict[str, str]:
    """The variables that make the common run-time dispatchers choose, natively, the code they
    choose under valgrind (:data:`AS_COUNTED_ENV`); empty on a host whose CPU has nothing
    valgrind lacks. Variables ``env`` already sets are left to it."""
    if not hidden_features(cpu_flags):
        return {}
    return {k: v for k, v in AS_COUNTED_ENV.items() if k not in env}


def count_command(cmd: Sequence[str], *, run_id: str, env: Mapping[str, str],
                  geometry: CallgrindGeometry | None = None, timeout: float | None = None,
                  outdir: str | Path | None = None, from_first_superstep: bool = False
                  ) -> CountedRun:
    """Run ``cmd`` under Callgrind with markers active and count it (``from_first_superstep``:
    each process from its first superstep mark on, :func:`~counterd.backends.callgrind.
    valgrind.valgrind_argv`; ``whole`` then leaves out what came before).

    ``env`` is the command's environment as for the timed run; its spool and backend are
    replaced here (``COUNTERD_SPOOL`` -> a private directory, ``COUNTERD_BACKEND`` ->
    callgrind) and thread pools of numeric libraries get one thread (:data:`SERIAL_POOLS`,
    unless ``env`` sets them). Superstep records carry simulated counters only (their times
    are meaningless: time is never taken under valgrind), ``backend="callgrind"``, and
    ``incomplete`` when the counts do not cover the whole superstep (the reason is in
    ``unsupported["*"]``). ``whole`` sums every readable dump of every process: the command as
    one superstep.
    """
    from counterd.data.env import ENV_BACKEND, ENV_SPOOL
    from counterd.data.records import SuperstepRecord
    from counterd.wire.spool import files as spool_files

    geo = geometry if geometry is not None else CallgrindGeometry.from_machine()
    support = counter_support(geo.last_level, prefetch=geo.prefetch)
    unsupported = {k: v for k, v in support.items() if v is not None}
    # The dumps are read here and then removed, unless the caller named where to keep them. A
    # helper that outlived the command (run's grace) may still write into either directory
    # while it is removed: what it leaves is left, rather than failing a run already counted.
    with tempfile.TemporaryDirectory(prefix="counterd-cg-spool-",
                                     ignore_cleanup_errors=True) as spool_dir, \
            tempfile.TemporaryDirectory(prefix="counterd-cg-",
                                        ignore_cleanup_errors=True) as dumps_dir:
        spool = Path(spool_dir)
        run_env = {**SERIAL_POOLS, **env}  # the user's own setting wins
        run_env[ENV_SPOOL] = str(spool)
        run_env[ENV_BACKEND] = NAME
        # The timed run showed the command's output; this second run does not repeat it.
        result = run(cmd, geo, outdir if outdir is not None else dumps_dir, run_env, timeout,
                     show_stdout=False, from_first_superstep=from_first_superstep)
        out: dict[tuple[int, int], SuperstepRecord] = {}
        for path in spool_files(spool):
            try:
                pid = int(path.stem.split("-")[0])  # <pid>.frames, <pid>-<k>.frames
            except ValueError:
                continue
            calls, begins = boundary_calls_from_spool(path)
            if pid in result.unreadable and result.stopped_by is None:
                raise CallgrindError(result.unreadable[pid], "re-run the recording")
            dumps = result.dumps.get(pid, ())
            for sc in supersteps_from_dumps(dumps, calls, geo.last_level, pid):
                b = begins[sc.index]
                flags = {"unsupported_counters"} if unsupported else set()
                why = dict(unsupported)
                if not sc.complete:
                    flags.add("incomplete")
                    why["*"] = sc.problem
                raised = b.get("raised")
                if raised:
                    flags.add("exception")
                rec = SuperstepRecord(
                    run_id=run_id, index=sc.index, name=str(b.get("name", "")),
                    rank=int(b.get("rank", 0)), pid=pid, cpu=int(b.get("cpu", -1)),
                    begin_ns=int(b.get("begin_ns", 0)),
                    end_ns=None if not sc.complete else int(b.get("begin_ns", 0)),
                    counters=dict(sc.counters), params=b.get("params", {}),
                    flags=frozenset(flags), unsupported=why, backend=NAME,
                    host=str(b.get("host", "")),
                    exception=raised if isinstance(raised, str) else None)
                out[(rec.rank, rec.index)] = rec
        tail = result.stderr_tail()  # read before the directory goes
    whole_unsupported = dict(unsupported)
    if result.unreadable:
        whole_unsupported["*"] = "dumps of pids " + ", ".join(map(str, sorted(result.unreadable))) \
            + " were unreadable (a process outlived the command): not counted"
    whole = to_canonical(sum_totals(d for dumps in result.dumps.values() for d in dumps),
                         geo.last_level)
    return CountedRun(out, whole, whole_unsupported, result.exit_code, geo.adjustments,
                      result.stopped_by, tail)


def count_supersteps(cmd: Sequence[str], *, run_id: str, env: Mapping[str, str],
                     geometry: CallgrindGeometry | None = None, timeout: float | None = None,
                     outdir: str | Path | None = None) -> dict[tuple[int, int], SuperstepRecord]:
    """``(rank, index) -> SuperstepRecord`` of :func:`count_command`."""
    return dict(count_command(cmd, run_id=run_id, env=env, geometry=geometry, timeout=timeout,
                              outdir=outdir).supersteps)


def merge_counted(timed: list[SuperstepRecord], counted: Mapping[tuple[int, int], SuperstepRecord],
                  ) -> list[SuperstepRecord]:
    """``counterd record --backend callgrind``: each record of the timed run with the simulated
    counters of its twin in the counted run (same rank and index), flagged
    ``counters_from_separate_run``; ``counters_missing`` where the twin has none."""
    from dataclasses import replace

    out = []
    for rec in timed:
        twin = counted.get((rec.rank, rec.index))
        flags = set(rec.flags) | {"counters_from_separate_run"}
        if twin is None or not twin.counters:
            flags.add("counters_missing")
            out.append(replace(rec, flags=frozenset(flags)))
            continue
        counters = {**rec.counters, **twin.counters}  # simulated memory counters + measured time
        unsupported = {k: v for k, v in {**twin.unsupported, **rec.unsupported}.items()
                       if k not in counters}
        flags |= {f for f in twin.flags if f in ("incomplete", "unsupported_counters")}
        if "exception" in twin.flags and "exception" not in rec.flags:
            # Raised under callgrind alone (Ctrl-C stopping the counted run): the counts end
            # where it was raised, short of the superstep the timed run measured.
            flags.add("incomplete")
            raised = f" ({twin.exception})" if twin.exception else ""
            unsupported.setdefault("*", f"the counted run raised an exception{raised} inside "
                                        "this superstep (the timed run did not): its counts "
                                        "stop there")
        if not unsupported:
            flags.discard("unsupported_counters")
        out.append(replace(rec, counters=counters, unsupported=unsupported,
                           flags=frozenset(flags), backend=f"{rec.backend}+{twin.backend}"))
    return out


def merge_whole(timed: SuperstepRecord, counted: CountedRun) -> list[SuperstepRecord]:
    """A command without markers: the timed run's time and measured counters, plus the
    simulated counters of every process of the counted run."""
    from dataclasses import replace

    flags = set(timed.flags) | {"counters_from_separate_run"}
    if not counted.whole:
        flags.add("counters_missing")
    counters = {**timed.counters, **counted.whole}
    unsupported = {k: v for k, v in {**counted.unsupported, **timed.unsupported}.items()
                   if k not in counters}
    flags.discard("unsupported_counters")
    if unsupported:
        flags.add("unsupported_counters")
    return [replace(timed, counters=counters, unsupported=unsupported, flags=frozenset(flags),
                    backend=f"{timed.backend}+callgrind")]
