"""The module-level marker API: one recorder per process (re-created after fork).

``superstep``, ``begin``, ``end``, ``feed``, ``set_rank``, ``init``, ``configure`` and ``records``
are re-exported by :mod:`counterd`. Nothing happens at import: the recorder, its at-exit handler and
the exported run id come with ``init``, the first marker or ``configure``.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from counterd.data.env import ENV_FLUSH_TIMEOUT
from counterd.data.errors import CounterdError
from counterd.data.records import Param, SuperstepRecord
from counterd.markers import identity, native
from counterd.markers.recorder import Recorder
from counterd.markers.step import Step

_recorder: Recorder | None = None
_recorder_lock = threading.Lock()


def recorder() -> Recorder:
    global _recorder
    rec = _recorder
    if rec is None or rec.pid != identity.pid:
        with _recorder_lock:
            if _recorder is None or _recorder.pid != identity.pid:
                _recorder = Recorder() if _recorder is None else _fork_copy(_recorder)
                native.set_current(_recorder)
                _register_at_exit()
            rec = _recorder
    return rec


def init() -> None:
    """Set up this process's markers, and this thread's counters, now: call it before the
    program's first barrier (in each process, and in each thread that marks supersteps).

    Without it the first ``superstep()`` of each process opens its counters, calibrates the
    cost of a marker pair and opens its spool file or connection inside that superstep: the
    processes then begin it milliseconds apart, and that start skew is counterd's, not the
    program's. Under ``counterd record`` (``COUNTERD_INIT=import``) importing counterd calls
    it; a process forked from a prepared one is prepared at the fork, with its parent's
    calibration. Calling it again costs a dictionary lookup."""
    rec = recorder()
    rec.prepare()
    mp = sys.modules.get("multiprocessing")
    if mp is not None and getattr(mp.current_process(), "_inheriting", False):
        # A spawned worker importing its main module: its identity (its rank) comes with its
        # bootstrap, after this.
        _defer_rank(rec)


def _fork_copy(parent: Recorder) -> Recorder:
    """A child's recorder: same run, backend, events and sink target; fresh counters and
    supersteps (the parent's open supersteps are the parent's) and, through the daemon, its
    own connection (the parent's is never used by the child). The marker pair's cost is the
    parent's where the parent measured it: the same code, counters and kind of sink."""
    spool, sock = parent.sink.where()  # a daemon's even if disconnected just now
    calibrated = not parent._calibrate and parent._marker_ns is not None
    child = Recorder(run_id=parent.run_id, backend=parent.backend_name,
                     events=parent.events or None, spool=spool, socket=sock,
                     sample=parent.sample or "off", calibrate=not calibrated)
    if calibrated:
        child._marker_ns = parent._marker_ns
    child.sink = parent.sink.in_child(child.sink)  # memory: the child's copy of the parent's
    return child


def _after_fork_in_child() -> None:
    """A child forked from a process whose markers were prepared (:func:`init`) prepares its
    own here, before the code it forked for runs (a multiprocessing worker's barrier): its
    counters, file or connection. Nothing the parent's threads held is waited for (the lock is
    made anew); a failure leaves the set-up to the first superstep, which reports it."""
    global _recorder_lock
    _recorder_lock = threading.Lock()
    parent = _recorder
    if parent is None or not parent.prepared:
        return
    try:
        init()
    except (CounterdError, OSError):
        return
    if _recorder is not None:  # a multiprocessing worker's identity comes after the fork
        _defer_rank(_recorder)


def _defer_rank(rec: Recorder) -> None:
    """A multiprocessing worker's rank is found once its bootstrap has given it its identity
    (:meth:`Recorder.defer_rank`). A forked worker's bootstrap calls multiprocessing's
    after-fork hooks before its target runs: the rank is found there, before the program's
    first barrier. A spawned worker's calls none: its lanes read the identity at their first
    begin (a few attribute reads in compiled code)."""
    global _bootstrap_hooked
    rec.defer_rank()
    util = sys.modules.get("multiprocessing.util")
    if util is not None and not _bootstrap_hooked:
        # Registered once per process; a forked child inherits the registration with the flag.
        util.register_after_fork(_bootstrap_hook, _at_bootstrap)
        _bootstrap_hooked = True


class _Hook:
    """What multiprocessing's after-fork registry keeps the hook by (weakly: this lives on)."""


_bootstrap_hook = _Hook()
_bootstrap_hooked = False


def _at_bootstrap(_: object) -> None:
    """In a forked multiprocessing worker's bootstrap, its identity just set: its rank found
    now, so that its first ``superstep()`` runs no more marker code than its tenth (a first
    begin through the Python path to find the rank cost 35-65 us after the program's
    barrier, on a 2-CPU guest)."""
    rec = _recorder
    if rec is None or rec.pid != identity.pid or not rec._rank_pending:
        return
    rec.find_rank_again()


def configure(*, backend: str | None = None, events: Sequence[str] | None = None,
              spool: Path | None = None, run_id: str | None = None,
              socket: Path | str | None = None, sample: str | None = None) -> Recorder:
    """Replace this process's recorder (before the first superstep, typically).
    ``socket``: the daemon's socket path (``"off"``: do not use a daemon). ``sample``:
    ``"<duration>:<k>"`` reads the counters of 1 in k supersteps shorter than the duration
    (:mod:`counterd.markers.sampling`; default ``COUNTERD_SAMPLE``, else off)."""
    global _recorder
    with _recorder_lock:
        if _recorder is not None:
            _recorder.close_open_steps()
            _recorder.sink.release()
        prepared = _recorder is not None and _recorder.prepared
        rec = _recorder = Recorder(run_id=run_id, backend=backend, events=events, spool=spool,
                                   socket=socket, sample=sample)
        native.set_current(rec)
        _register_at_exit()
    if prepared:  # it replaces a prepared one (counterd.init(), or at import): so is it
        rec.prepare()
    return rec


def set_rank(rank: int, *, thread: bool = False) -> None:
    """Declare this process's (or, with ``thread=True``, this thread's) processor id."""
    recorder().set_rank(rank, thread=thread)


def feed(stream: Any) -> None:
    """Declare an address stream this thread executes between supersteps, such as the first
    touch of its data before the first barrier. With the ``sim`` backend it is simulated at
    once (so the simulated caches are as warm as the real ones when the next superstep
    begins) and counted in no superstep; inside a superstep it is that superstep's, like
    ``step.feed``. A no-op for backends that count real hardware."""
    recorder().feed_between(stream)


def _begin(name: str, params: dict[str, Param]) -> Step:
    return recorder().begin(name, params)


def begin(name: str, **params: Param) -> Step:
    return recorder().begin(name, params)


def end(step: Step | None = None, *, name: str | None = None) -> SuperstepRecord:
    return recorder().end(step, name)


def superstep(name: str, **params: Param) -> Step:
    """``with superstep(name, **params) as step:`` marks one superstep of this processor."""
    return recorder().begin(name, params)


# Which recorder is the process's, for native (below this module: it never imports it).
native.track(lambda: _recorder)

# The compiled form where it is built (counterd.markers.native): it begins through this
# thread's lane when it has one, and calls _begin (the Python path above) when it has not.
_compiled = native.module()
if _compiled is not None:
    _compiled.set_fallback(_begin)
    begin = superstep = _compiled.superstep  # noqa: F811


def records() -> list[SuperstepRecord]:
    """Records kept in memory by this process (empty when they go to a spool)."""
    return recorder().sink.kept()


_exited_pid = 0  # the process whose _at_exit has run (atexit and a finalizer both call it)


def _at_exit() -> None:
    global _exited_pid
    rec = _recorder
    if rec is not None and rec.pid == identity.pid and _exited_pid != identity.pid:
        _exited_pid = identity.pid
        rec.close_open_steps()
        try:
            timeout = float(os.environ.get(ENV_FLUSH_TIMEOUT, "10"))
        except ValueError:
            timeout = 10.0
        rec.sink.release(timeout)  # the daemon's: flushed, closed, the rest spilled


_at_exit_registered = False
_finalizer_pid = 0  # the process whose multiprocessing finalizer calls _at_exit


def _register_at_exit() -> None:
    """Close open supersteps and flush to the daemon at interpreter exit (once per process;
    called with the lock held when a recorder is created). A multiprocessing worker ends
    without the interpreter's exit handlers (a forked one by os._exit), after running
    multiprocessing's own finalizers: one of them does it there (a Finalize is called in the
    process that made it only), where the program uses multiprocessing (not imported for
    programs that do not: it costs milliseconds of start-up)."""
    global _at_exit_registered, _finalizer_pid
    if not _at_exit_registered:
        atexit.register(_at_exit)
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _at_exit_registered = True
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None and _finalizer_pid != os.getpid():
        mp_util.Finalize(None, _at_exit, exitpriority=10)  # before its children are joined
        _finalizer_pid = os.getpid()
