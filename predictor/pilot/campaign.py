"""Running a pilot campaign: the timed and counted runs of a command at the pilot sizes under
``counterd record``, with ``--check`` the checking runs at the target in the timed runs' rounds
(:func:`run_campaign`, read back by :func:`load_checks`), checking runs after a campaign
(:func:`measure_target`), and the campaign's time left and budget (:class:`Eta`,
:func:`budget_sizes`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from predictor.errors import BadInput
from predictor.inputs import Step
from predictor.pilot import regime
from predictor.pilot.check import Measured, measured
from predictor.pilot.regime import Regime
from predictor.pilot.runs import PilotRun, Timing, load_timings, split_name
from predictor.toolkit import fitting


def _counterd() -> list[str]:
    """The ``counterd`` command of this installation (beside this Python, else on PATH)."""
    import shutil
    import sys
    from pathlib import Path

    here = Path(sys.executable).parent / "counterd"
    if here.exists():
        return [str(here)]
    found = shutil.which("counterd")
    if found is None:
        raise BadInput("the counterd command is not installed", "install this package")
    return [found]


def _size_text(n: float) -> str:
    return str(int(n)) if float(n).is_integer() else repr(float(n))


def command_for(template: str, n: float) -> list[str]:
    """The command line of one run: ``{n}`` in ``template`` replaced by the size."""
    import shlex

    if "{n}" not in template:
        raise BadInput(f"the pilot command {template!r} has no {{n}}",
                       "write {n} where the command takes its input size")
    try:
        return shlex.split(template.replace("{n}", _size_text(n)))
    except ValueError as exc:
        raise BadInput(f"cannot split the pilot command {template!r}: {exc}",
                       "quote it as a shell would") from None


# ``predict --pilot --cpu-features``: how the timed runs (pilots and checking runs) run.
# native (the default): as the program runs without counterd, so the forecast and the check
# are of the program the user runs. as-counted: with the CPU features valgrind lacks (AVX-512)
# hidden from run-time code dispatch (``counterd record --cpu-features as-counted``), so the
# timed code is the code Callgrind counts. The counted runs are as-counted either way with
# Callgrind (valgrind has no AVX-512), and with any backend when as-counted is asked for.
TIMING_FEATURES = ("native", "as-counted")


def _timing_features(cpu_features: str) -> str:
    """``cpu_features`` checked: one of :data:`TIMING_FEATURES`, else a BadInput."""
    if cpu_features not in TIMING_FEATURES:
        raise BadInput(f"--cpu-features {cpu_features!r}",
                       "choose " + " or ".join(TIMING_FEATURES))
    return cpu_features


def counting_features(cpu_features: str) -> str:
    """``counterd record --cpu-features`` for the counted runs beside timed runs run with
    ``cpu_features``: as-counted when the timed runs hide features (whatever the backend),
    else record's own default (auto: the run under valgrind, which cannot run AVX-512, counts
    the code it dispatches to; only its counts are used)."""
    return "as-counted" if _timing_features(cpu_features) == "as-counted" else "auto"


def _record(template: str, n: float, backend: str, out: Any, *, what: str,
            cpu_features: str, extra: Sequence[str] = ()) -> None:
    """One run of the command at size ``n`` under ``counterd record``; BadInput naming the run
    if it fails."""
    import subprocess

    cmd = [*_counterd(), "record", "--backend", backend, "--cpu-features", cpu_features,
           *extra, "--out", str(out), "--", *command_for(template, n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BadInput(f"{what} (n = {_size_text(n)}) failed with exit code "
                       f"{proc.returncode}: {tail}", "run the command by hand at that size")


_NO_SUPERSTEPS = "mark the program's supersteps with counterd.superstep"


def record_run(template: str, n: float, backend: str, out: Any, *, what: str,
               cpu_features: str = "auto", extra: Sequence[str] = ()) -> list[Step]:
    """One run of the command at size ``n`` under ``counterd record --backend backend
    --cpu-features cpu_features`` (and ``extra`` options); its supersteps. A failed run or one
    without supersteps is a BadInput naming the run."""
    from predictor.inputs import load_counters

    _record(template, n, backend, out, what=what, cpu_features=cpu_features, extra=extra)
    steps = load_counters(out)
    if not steps:
        raise BadInput(f"{what} (n = {_size_text(n)}) recorded no supersteps", _NO_SUPERSTEPS)
    return steps


def record_timed(template: str, n: float, out: Any, *, what: str,
                 cpu_features: str = "auto") -> list[Timing]:
    """One timed run (``--backend none``) of the command at size ``n``; its supersteps' times
    (:func:`load_timings`). A failed run or one without supersteps is a BadInput naming it."""
    _record(template, n, "none", out, what=what, cpu_features=cpu_features)
    timings = load_timings(out)
    if not timings:
        raise BadInput(f"{what} (n = {_size_text(n)}) recorded no supersteps", _NO_SUPERSTEPS)
    return timings


def record_path(workdir: Any, kind: str, n: float, r: int | None = None) -> Any:
    """Where a campaign keeps one run's records: ``timed-N-R.jsonl`` or ``counted-N.jsonl``."""
    from pathlib import Path

    return Path(workdir) / (f"{kind}-{n:g}-{r}.jsonl" if r is not None else f"{kind}-{n:g}.jsonl")


def load_campaign(workdir: Any, sizes: Sequence[float], repeat: int) -> list[PilotRun]:
    """The pilot runs a campaign kept in ``workdir`` (``predict --pilot --keep DIR``)."""
    from predictor.inputs import load_counters

    return [pilot_run(n, load_counters(record_path(workdir, "counted", n)),
                      [load_timings(record_path(workdir, "timed", n, r)) for r in range(repeat)])
            for n in sizes]


def pilot_run(n: float, counted: Sequence[Step], timed: Sequence[Sequence[Timing]]
              ) -> PilotRun:
    """The pilot run at size ``n``: the counted run's steps, each with the median span and
    work of the timed runs (a counting source such as Callgrind slows the program down; times
    are always measured without it), and every timed run's span and work for the models and
    whether its processors shared a CPU."""
    what = f"n = {_size_text(n)}"
    keys = [split_name(s) for s in counted]
    by_key = []
    for t in timed:
        mine = {x.key: x for x in t}
        if sorted(mine) != sorted(keys) or len(mine) != len(t):
            raise BadInput(f"{what}: the timed and the counted runs have different supersteps",
                           "pilot runs must have the same supersteps every time")
        by_key.append(mine)
    spans = tuple(tuple(float(m[k].span_ns or 0) for m in by_key) for k in keys)
    work = tuple(tuple(float(m[k].work_ns or 0) for m in by_key) for k in keys)
    shared = tuple(tuple(m[k].shared_cpu for m in by_key) for k in keys)
    steps = tuple(Step(s.name, s.counters, s.ranks, s.bank_lm, s.bank_wb, s.k, s.m_b,
                       float(np.median(spans[i])),
                       {**s.meta, "work_ns": float(np.median(work[i]))})
                  for i, s in enumerate(counted))
    return PilotRun(float(n), steps, f"the run at {what}", spans, work, shared)


# Counting sources whose counts a run beside it cannot change: Callgrind simulates the
# caches of its own process, sim those of the streams a superstep feeds, none counts nothing.
# Their counted runs run side by side; perf's and PAPI's (a shared L3, one PMU) one at a time.
SIDE_BY_SIDE = frozenset({"callgrind", "sim", "none"})


# A counted run's time over a timed run's at the same size, until the campaign has measured
# its own: Callgrind runs a program 50-100 times slower than natively (the middle taken); the
# other counting sources count as the program runs.
COUNTED_SLOWDOWN = {"callgrind": 75.0}


class Eta:
    """The time left of a campaign: its timed, counted and checking runs. A timed run at size
    n takes a + b n seconds (non-negative least squares through the timed runs so far; in
    proportion to n after the first); a counted run that times the slowdown its backend's
    first counted run measured (:data:`COUNTED_SLOWDOWN` until then), ``width`` of them at
    once; a checking run, as a timed one at the target."""

    def __init__(self, backend: str = "none", width: int = 1) -> None:
        self.backend, self.width = backend, max(1, width)
        self.timed: list[tuple[float, float]] = []  # (n, seconds)
        self.counted: list[tuple[float, float]] = []

    def run_s(self, n: float) -> float | None:
        """A timed run's seconds at size ``n``; None before the first."""
        if not self.timed:
            return None
        ns = np.array([x for x, _ in self.timed])
        ts = np.array([t for _, t in self.timed])
        if np.ptp(ns) == 0:
            return float(np.mean(ts)) * n / float(ns[0])
        a, b = fitting.nnls(np.column_stack([np.ones(len(ns)), ns]), ts)
        return float(a + b * n)

    def slowdown(self) -> float:
        """A counted run's time over a timed run's: measured where one has ended."""
        got = [t / r for n, t in self.counted if (r := self.run_s(n))]
        return (float(np.mean(got)) if got
                else COUNTED_SLOWDOWN.get(self.backend, 1.0))

    def left(self, timed: Sequence[float] = (), counted: Sequence[float] = (),
             checking: Sequence[float] = ()) -> float | None:
        """Seconds left for the runs at these sizes; None before any timed run."""
        if not self.timed:
            return None
        run = self.run_s
        waves = sorted(counted, reverse=True)[::self.width]  # the longest of each wave
        return (sum(run(n) or 0.0 for n in [*timed, *checking])
                + self.slowdown() * sum(run(n) or 0.0 for n in waves))

    @staticmethod
    def text(left: float | None) -> str:
        return "" if left is None else f", about {left:.0f} s left"


def budget_sizes(sizes: Sequence[float], budget_s: float, probes: Sequence[tuple[float, float]],
                 *, repeat: int, backend: str, target: float, check: bool,
                 width: int = 1) -> tuple[tuple[float, ...], float]:
    """Pilot sizes within ``budget_s`` seconds, and the campaign's estimated time.

    ``probes``: (size, seconds) of timed runs already made (their time counts against the
    budget). A run at n takes a + b n (:class:`Eta`); the campaign is ``repeat`` timed runs and
    a counted run (its backend's slowdown, ``width`` at once) per size, with Callgrind the two
    L2 runs at the largest size, plus ``repeat`` checking runs at the target with ``check``.
    The sizes are the given ones times the largest factor that fits, at most the one that puts
    the largest pilot at half the target (larger pilots extrapolate less, and the pilots must
    stay below the target); rounded to two significant digits. BadInput where none fits."""
    if not (math.isfinite(budget_s) and budget_s > 0):
        raise BadInput(f"--budget {budget_s:g} is not a time > 0", "give seconds, e.g. "
                       "--budget 120")
    eta = Eta(backend, width)
    eta.timed = list(probes)
    spent = sum(t for _, t in probes)
    checking = [target] * repeat if check else []

    def cost(f: float) -> float:
        ns = [n * f for n in sizes]
        # with Callgrind, the two L2 runs at the largest size (:func:`cache_runs`)
        l2 = [ns[-1]] * 2 if backend == "callgrind" and target > ns[-1] else []
        return eta.left([n for n in ns for _ in range(repeat)], [*ns, *l2], checking) or 0.0

    room = budget_s - spent
    hi = target / 2 / sizes[-1]
    lo = hi * 1e-6
    if cost(lo) > room:
        raise BadInput(f"--budget {budget_s:g}: the campaign needs about {cost(lo) + spent:.0f} "
                       f"s at any pilot size ({spent:.0f} s spent measuring the program's time; "
                       f"{repeat} timed runs and a counted run per size"
                       + (f", {repeat} checking runs at the target" if check else "") + ")",
                       "give a larger --budget, or a smaller --repeat")
    if cost(hi) > room:
        for _ in range(60):  # bisection in log: cost grows with the factor
            mid = math.sqrt(lo * hi)
            lo, hi = (mid, hi) if cost(mid) <= room else (lo, mid)
        hi = lo
    out = tuple(float(f"{max(1.0, n * hi):.2g}") for n in sizes)
    if len(set(out)) < 3 or any(b <= a for a, b in zip(out, out[1:], strict=False)):
        raise BadInput(f"--budget {budget_s:g}: pilot sizes within it are too small to tell "
                       f"apart ({', '.join(f'{x:g}' for x in out)})",
                       "give a larger --budget or larger --sizes")
    return out, cost(hi) + spent


def timing_order(sizes: int, repeat: int) -> list[tuple[int, int]]:
    """The order of a campaign's timed runs, as (run, size index) pairs: ``repeat`` rounds, each
    over every size, ascending in even rounds and descending in odd ones.

    Not every run of one size back to back: the host's state drifts (another guest, the
    frequency, the page cache), and runs taken together share it, so the median of one size's
    runs moved as one run does and a whole size could come out fast or slow. On the outside
    suite's held-out programs (2026-11-27, sizes in turn) all four supersteps of
    ``bfs_python`` ran 25-45 % faster per instruction at the largest pilot than at the sizes
    below it and at the target, and every forecast scaled from it missed by 1.7-3.6x. In rounds,
    a drift lands on every size alike; alternating the direction leaves a steady trend through
    the rounds with the same mean at every size."""
    out = []
    for r in range(repeat):
        idx = range(sizes) if r % 2 == 0 else range(sizes - 1, -1, -1)
        out += [(r, i) for i in idx]
    return out


def check_path(workdir: Any, r: int) -> Any:
    """Where a campaign keeps its ``r``-th checking run at the target: ``check-R.jsonl``."""
    from pathlib import Path

    return Path(workdir) / f"check-{r}.jsonl"


def run_campaign(template: str, sizes: Sequence[float], *, repeat: int = 3,
                 backend: str = "callgrind", workdir: Any, cpu_features: str = "native",
                 progress: fitting.Progress = fitting.no_progress, parallel: int | None = None,
                 eta: Eta | None = None, check: float | None = None,
                 target: float | None = None) -> list[PilotRun]:
    """At every size: ``repeat`` timed runs (markers only, ``--backend none``, run with
    ``cpu_features``, :data:`TIMING_FEATURES`) and one counted run (``backend``,
    :func:`counting_features`); with ``check`` (``--check``), ``repeat`` checking runs at that
    size too (:func:`check_path`, read back by :func:`load_checks`). Records under ``workdir``.
    Progress says what runs and the time left (:class:`Eta`, kept in ``eta`` when given), of
    the counted runs too.

    The timed runs go first, one at a time (they are the times), in rounds over the sizes
    (:func:`timing_order`), the checking runs in the same rounds after the pilot sizes (last
    of a rising round, first of a falling one, whatever the target's size): the
    forecast reads only the pilots' runs, but the check compares it with runs taken in the same
    minutes, so a drift of the host's speed between the pilots and the check (another guest,
    the frequency; 20-40 % within seconds on a KVM guest, round against round) is not counted
    as the forecast's error. The counted runs follow, up to ``parallel`` at once (default: the
    CPUs this process may use) where ``backend`` is in :data:`SIDE_BY_SIDE`, else one at a
    time: under Callgrind each takes 20-100 times the program's time, and nothing of theirs is
    timed. With ``target`` and Callgrind counting, two more counted runs at the largest size
    follow: the L2 runs for that target (:func:`cache_runs`)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    if repeat < 1:
        raise BadInput(f"--repeat {repeat}", "give 1 or more")
    counting = counting_features(cpu_features)
    work = Path(workdir)
    width = 1
    if backend in SIDE_BY_SIDE:
        width = max(1, min(len(sizes), parallel or len(os.sched_getaffinity(0))))
    eta = eta if eta is not None else Eta(backend, width)
    eta.backend, eta.width = backend, width
    timed: list[list[list[Timing]]] = [[] for _ in sizes]
    every = [*sizes, *([check] if check is not None else [])]
    order = timing_order(len(every), repeat)
    for k, (r, i) in enumerate(order):
        n = every[i]
        checking = i == len(sizes)
        rest = [every[j] for _, j in order[k:]]
        kind = "checking run" if checking else "timed run"
        progress(f"n = {_size_text(n)}: {kind} {r + 1}/{repeat}"
                 + Eta.text(eta.left(rest, sizes)))
        t0 = time.monotonic()
        got = record_timed(template, n, check_path(work, r) if checking
                           else record_path(work, "timed", n, r),
                           what="checking run" if checking else f"timed pilot run {r + 1}",
                           cpu_features=cpu_features)
        if not checking:
            timed[i].append(got)
        eta.timed.append((float(n), time.monotonic() - t0))
    l2 = ([sizes[-1]] * 2 if target is not None and target > sizes[-1]
          and backend == "callgrind" else [])
    progress(f"counted runs ({backend}) at n = {', '.join(map(_size_text, sizes))}"
             + (f", {width} at a time" if width > 1 else "")
             + Eta.text(eta.left((), [*sizes, *l2])))
    lock = threading.Lock()
    pending = [*sizes, *l2]

    def counted(n: float) -> list[Step]:
        t0 = time.monotonic()
        steps = record_run(template, n, backend, record_path(work, "counted", n),
                           what=f"counted pilot run ({backend})", cpu_features=counting)
        with lock:
            eta.counted.append((float(n), time.monotonic() - t0))
            pending.remove(n)
            left = eta.left((), pending)
        progress(f"n = {_size_text(n)}: counted run ({backend}) done" + Eta.text(left))
        return steps

    with ThreadPoolExecutor(max_workers=width) as pool:
        counts = list(pool.map(counted, sizes))
    runs = [pilot_run(n, c, t) for n, c, t in zip(sizes, counts, timed, strict=True)]
    if l2 and target is not None:
        progress(f"n = {_size_text(sizes[-1])}: L2 runs ({backend}, --prefetch): the host's L2 "
                 "and one shrunk as the data grow to the target" + Eta.text(eta.left((), l2)))
        t0 = time.monotonic()
        cache_runs(template, runs, target, workdir=work, cpu_features=counting,
                   parallel=width)
        eta.counted.append((float(sizes[-1]), (time.monotonic() - t0) * min(width, 2) / 2))
    return runs


def cache_runs(template: str, runs: Sequence[PilotRun], target: float, *, workdir: Any,
               cpu_features: str = "auto", machine: Any = None, parallel: int = 2
               ) -> Regime | None:
    """The two L2 runs at the largest pilot size for ``target`` (the host's L2 and the
    target's stand-in: :mod:`predictor.pilot.regime`), under ``counterd record --backend
    callgrind --prefetch --machine FILE`` (the machine files written in ``workdir``), side by
    side, kept in ``workdir`` with their plan (:func:`~predictor.pilot.regime.plan_path`); a
    run already kept there (a regular file of this user) is not run again. Their
    :class:`~predictor.pilot.regime.Regime`, or None where the machine (default: this host's,
    or ``COUNTERD_MACHINE``'s) has no L2 below an L1 pair (nothing run)."""
    import json
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from counterd import machine as machines
    from counterd.util.fsutil import atomic_write_text

    m = machine if machine is not None else machines.current()
    p = regime.plan(runs, target, m)
    if p is None:
        return None
    todo = []
    for nbytes in dict.fromkeys((p.host_bytes, p.scaled_bytes)):
        out = regime.run_path(workdir, p.size, nbytes)
        if regime.ours(out):
            continue
        mfile = Path(workdir) / f"l2-{nbytes}.toml"
        atomic_write_text(mfile, regime.machine_text(m, nbytes))
        todo.append((nbytes, out, mfile))

    def one(job: tuple[int, Path, Path]) -> None:
        nbytes, out, mfile = job
        record_run(template, p.size, "callgrind", out, what=f"L2 run ({nbytes} B L2)",
                   cpu_features=cpu_features, extra=("--prefetch", "--machine", str(mfile)))

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        list(pool.map(one, todo))
    atomic_write_text(regime.plan_path(workdir, target), json.dumps(p.to_json()))
    return regime.load_regime(workdir, runs, target)


def load_checks(workdir: Any, repeat: int) -> dict[tuple[int, str], Measured]:
    """What the ``repeat`` checking runs a campaign kept in ``workdir`` measured
    (:func:`measured`)."""
    return measured([load_timings(check_path(workdir, r)) for r in range(repeat)])


def measure_target(template: str, target: float, *, repeat: int, workdir: Any,
                   cpu_features: str = "native", progress: fitting.Progress = fitting.no_progress,
                   eta: Eta | None = None) -> dict[tuple[int, str], Measured]:
    """``repeat`` checking runs at ``target`` on their own, after a campaign (``--check``'s
    go in the campaign's rounds, :func:`run_campaign`; these are for a second target, as the
    outside suite's at 16x): ``check-R.jsonl`` in ``workdir``, run with ``cpu_features`` as the
    timed pilots were; what they measured (:func:`measured`). A drift of the host between the
    campaign and these runs lands on their comparison. Progress gives the time left: from
    ``eta`` (the campaign's) before the first checking run has ended, then from the checking
    runs' own times."""
    import time

    _timing_features(cpu_features)
    timed: list[list[Timing]] = []
    took: list[float] = []
    for r in range(repeat):
        left = (float(np.mean(took)) * (repeat - r) if took
                else eta.left(checking=[target] * (repeat - r)) if eta is not None else None)
        progress(f"n = {_size_text(target)}: checking run {r + 1}/{repeat}" + Eta.text(left))
        t0 = time.monotonic()
        timed.append(record_timed(template, target, check_path(workdir, r),
                                  what="checking run", cpu_features=cpu_features))
        took.append(time.monotonic() - t0)
    return measured(timed)
