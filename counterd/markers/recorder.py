"""The superstep marker API used inside programs (DESIGN.md section 5).

    import counterd
    counterd.set_rank(rank)                 # SPMD processor id (optional, see below)
    with counterd.superstep("count elements", n=n) as step:
        ...                                 # the superstep's work
        step.feed(stream)                   # only meaningful for the sim backend

One :class:`~counterd.data.records.SuperstepRecord` is produced per processor (thread of a process
that marks supersteps) per superstep, with CLOCK_MONOTONIC begin/end, the CPU, counter deltas
with their sources, params and flags. Nothing is lost silently:

* an exception inside the body gives a record flagged ``exception``, its type and message
  (one line, at most 200 characters, no traceback) in the record's ``exception``;
* a superstep begun inside another gives a record flagged ``nested``;
* ``end()`` without ``begin()`` gives a record flagged ``unmatched_end``;
* a process that exits inside a superstep gets a record flagged ``incomplete`` (at exit), and
  one that is killed leaves its ``begin`` line in the spool, which the merge turns into an
  ``incomplete`` record (:func:`collect_spool`).

Configuration comes from ``configure()`` or, for programs started by ``counterd record``, from
the environment: ``COUNTERD_RUN_ID``, ``COUNTERD_SPOOL`` (a directory; each process writes
its markers to its file there, :mod:`counterd.wire.spool`), ``COUNTERD_BACKEND`` (perf, papi, sim,
callgrind, daemon, none) and ``COUNTERD_EVENTS`` (comma-separated canonical counters). Without
either, records are kept in memory (``counterd.records()``) and counted with perf where
available. ``COUNTERD_SAMPLE=<duration>:<k>`` reads the counters of only 1 in k supersteps
shorter than the duration (:mod:`counterd.markers.sampling`).

Where the compiled hot path is built (counterd/_native/hotpath_src/), a thread whose markers need
only a clock, one perf group read and a store to memory or the spool's mapping begins and ends
its supersteps in compiled code (:mod:`counterd.markers.native`); this module stays the one
definition of what its records hold, and serves every other case. ``COUNTERD_NATIVE=0`` keeps
every thread on the Python path.

Where records go (the sink), first match wins: ``configure(spool=...)`` or
``configure(socket=...)``; ``COUNTERD_SPOOL`` (set by ``counterd record``); ``COUNTERD_SOCKET``
(a path; ``off`` disables the daemon); the daemon's default socket
(:func:`counterd.data.env.default_socket_path`) if it exists; else memory
(:func:`counterd.markers.sinks.make_sink`). Through the daemon
(:class:`~counterd.markers.sinks.socket.SocketSink`) every record is kept by the process until
the daemon has acknowledged it as committed to its store, a daemon that does not answer (yet,
or any more) is retried for as long as the program runs, and what it has not acknowledged
beyond the high-water mark or at exit goes to a private spill file for ``counterd import``
(:mod:`counterd.markers.sinks.spill`); ``COUNTERD_JOB`` names the job (default: the
program's file name). A param that is not JSON (NaN, infinity, an object) is dropped and named
in the record's ``unsupported`` (``param:<key>``), never raised. Backend ``daemon`` (or perf being
unusable in-process, e.g. ``perf_event_paranoid`` forbidding self-monitoring) asks the daemon
to count each superstep's thread on the program's behalf.

Rank: ``set_rank()`` wins; else ``COUNTERD_RANK``; else an MPI launcher's rank variable
(Open MPI, MPICH/PMI, PMIx, MVAPICH, Slurm); else a multiprocessing worker's identity (1-based,
the parent being 0); else 0. Forked children (multiprocessing) start with fresh per-process state:
their counters are reopened for the child's own threads.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from counterd.backends import POLICIES
from counterd.backends.base import Target
from counterd.data.env import (
    ENV_BACKEND,
    ENV_EVENTS,
    ENV_RUN_ID,
    ENV_SAMPLE,
    MPI_RANK_VARS,
)
from counterd.data.errors import BadInput, CounterdError
from counterd.data.records import MAX_NAME_CHARS, Param, SuperstepRecord
from counterd.markers import identity, native, sampling
from counterd.markers.sinks import Sink, make_sink
from counterd.markers.sinks.base import as_record, begin_line
from counterd.markers.step import (
    NESTED,
    NO_FLAGS,
    Context,
    Step,
    ThreadState,
    clean_marker,
    materialise,
)

MARKER_BACKENDS = POLICIES["markers"].names  # what counterd.backends.resolve accepts


def _export_run_id() -> str:
    """This process's run id, exported (outside MPI) so that subprocesses started from now on
    share it. The first recorder of a process calls it: importing counterd changes nothing."""
    run_id = identity.default_run_id()
    if not any(var in os.environ for var in MPI_RANK_VARS):
        os.environ[ENV_RUN_ID] = run_id
    return run_id


class Recorder:
    """Per-process marker state. One exists per process (re-created after fork)."""

    def __init__(self, *, run_id: str | None = None, backend: str | None = None,
                 events: Sequence[str] | None = None, spool: Path | None = None,
                 socket: Path | str | None = None, calibrate: bool = True,
                 sample: sampling.Sampling | str | None = None) -> None:
        env = os.environ
        self.run_id = run_id or env.get(ENV_RUN_ID) or _export_run_id()
        name = backend or env.get(ENV_BACKEND) or "default"
        name = "default" if name == "auto" else name  # what backends.resolve calls auto
        if name not in MARKER_BACKENDS + ("default",):
            raise BadInput(f"unknown marker backend {name!r}",
                           "choose from " + ", ".join(MARKER_BACKENDS))
        self.backend_name = name
        ev = events if events is not None else [e for e in env.get(ENV_EVENTS, "").split(",") if e]
        self.events: tuple[str, ...] = tuple(ev)
        if sample is None or isinstance(sample, str):
            text = sample if sample is not None else env.get(ENV_SAMPLE, "")
            sample = sampling.Sampling.parse(text, "sample" if isinstance(sample, str)
                                             else ENV_SAMPLE)
        self.sample: sampling.Sampling | None = sample
        self.sink: Sink = make_sink(spool, socket)
        self.host = os.uname().nodename  # gethostname(2), without loading socket
        self.pid = identity.pid
        self._backend_error: str | None = None
        self._fix_context("none", None)
        self._calibrate = calibrate  # not yet calibrated (calibrate(): at the first superstep)
        self._calibration_lock = threading.Lock()
        self._marker_ns: int | None = None  # calibrated at this process's first superstep
        self._process_rank: int | None = None
        self._rank_given = False  # set_rank() named it: never found again from the environment
        self._rank_pending = False  # found again at the first begin (see defer_rank)
        self._rank_from: Any = None  # multiprocessing.process, where defer_rank left it
        self._local = threading.local()
        # next() on it is atomic under the GIL; the compiled lanes count on the same one.
        self._indices = native.indices()
        self._open: dict[int, Step] = {}  # id(step) -> step, for the at-exit sweep
        # The thread states with a lane, for set_rank (weakly: an exited thread's state, its
        # lane and its counters' descriptors go with it; its open steps are kept in _open).
        self._lanes: weakref.WeakSet[ThreadState] = weakref.WeakSet()
        self._backend: Any = None
        self.prepared = False  # prepare() has run: a forked child prepares its own at fork
        self._native: Any = None
        if name == "callgrind":
            from counterd import _native

            self._native = _native.lib()

    def _fix_context(self, label: str, marker_ns: int | None) -> None:
        """What every record of this recorder shares from now on (step.Context), and the
        tuple of it the sinks and lanes name it by."""
        uncounted = self._backend_error if self.backend_name not in ("none", "callgrind") \
            else None
        self.context = Context(self.run_id, self.pid, self.host, label, marker_ns, uncounted)
        self._ctx: identity.Ctx = self.context.key

    @property
    def _durable(self) -> bool:
        return self.sink.durable

    @property
    def _daemon_counts(self) -> bool:
        """Whether the daemon counts this process's supersteps on its behalf."""
        if not self.sink.daemon or self.sink.degraded is not None:
            return False
        if self.backend_name == "daemon":
            return True
        return (self.backend_name == "default" and self._resolve_backend() is None
                and self._backend_error is not None)

    # -- configuration of the processor id -------------------------------------------------
    def set_rank(self, rank: int, *, thread: bool = False) -> None:
        if rank < 0:
            raise BadInput(f"rank {rank} < 0", "ranks are 0, 1, ... p-1")
        if thread:
            st = self._state()
            st.rank = rank
            if st.lane is not None:
                st.lane.set_rank(rank)
        else:
            self._process_rank = rank
            self._rank_given = True
            for state in list(self._lanes):
                if state.rank is None and state.lane is not None:  # a thread's own rank wins
                    state.lane.set_rank(rank)

    def defer_rank(self) -> None:
        """The rank is found again once this process's identity is known. A multiprocessing
        worker gets its identity (its rank) only when its bootstrap runs: after the fork
        (where a prepared parent's child prepares) and after a spawned worker imports its main
        module (where ``COUNTERD_INIT=import`` prepares). Nothing to find where ``set_rank``
        named the rank or the environment gives it (it wins over the identity). Each lane reads
        the identity at its next begin, in compiled code (a few attribute reads); the Python
        path, and :meth:`rank`, find it at their next use. (A forked worker finds it before its
        target runs: :func:`counterd.markers.api._at_bootstrap`.)"""
        if self._rank_given or identity.env_rank() is not None:
            return
        self._rank_pending = True
        process = sys.modules.get("multiprocessing.process")
        if process is None:  # no worker of multiprocessing: each thread's next begin finds it
            native.invalidate()  # through the Python path, once
            return
        self._rank_from = process
        for state in list(self._lanes):
            if state.rank is None and state.lane is not None:  # a thread's own rank wins
                state.lane.defer_rank(process)

    def find_rank_again(self) -> None:
        """The process's rank found anew from its environment, unless ``set_rank`` named it.
        After :meth:`defer_rank` (whose environment gave none) it is the worker's identity,
        read as the lanes read it: a first begin on the Python path (the sim backend's) after
        the program's barrier does not read a dozen variables of the environment again."""
        self._rank_pending = False
        process, self._rank_from = self._rank_from, None
        if self._rank_given:
            return
        if process is not None:
            ident = getattr(process._current_process, "_identity", ())
            rank = int(ident[0]) if ident else 0
        else:
            rank = identity.auto_rank()
        self._process_rank = rank
        if self._lanes:
            for state in list(self._lanes):
                if state.rank is None and state.lane is not None:  # a thread's own rank wins
                    state.lane.set_rank(rank)

    def rank(self) -> int:
        rank = self._state().rank
        if rank is not None:
            return rank
        if self._rank_pending:
            self.find_rank_again()
        if self._process_rank is None:
            self._process_rank = identity.auto_rank()
        return self._process_rank

    # -- counters ----------------------------------------------------------------------------
    def _resolve_backend(self) -> Any:
        if self._backend is not None or self._backend_error is not None:
            return self._backend
        from counterd import backends

        name = self.backend_name
        try:
            if self.events and name in backends.POLICIES["markers"].names \
                    and name not in backends.POLICIES["markers"].outside:
                # A backend named with its events (as counterd record passes what its probe
                # found): opened as it is, not probed again (perf's probe opens every event,
                # 3-6 ms each in a VM); a failure to open says why per event.
                self._backend = backends.get(name)
                return self._backend
            # callgrind, daemon and none count from outside the process: no backend here.
            res = backends.resolve("auto" if name == "default" else name, "markers")
            if res.backend is None:
                self._backend_error = res.reason
            else:
                self._backend = res.get()
        except CounterdError as exc:
            self._backend_error = str(exc)
        return self._backend

    def _state(self) -> ThreadState:
        """This thread's state; created (and its counter group opened) on first use in this
        thread of this process — a forked child gets a fresh one."""
        st: ThreadState | None = getattr(self._local, "st", None)
        pid = identity.pid
        if st is not None and st.pid == pid:
            return st
        st = ThreadState(pid)
        self._local.st = st
        backend = self._resolve_backend()
        if backend is not None:
            self._open_group(st, backend)
            if st.group is None and st.unsupported and self.events:
                # Named with its events but none opened here: not counted by it, say why.
                self._backend_error = "; ".join(sorted(set(st.unsupported.values())))[:500]
                self._backend = None
        if self._calibrate:
            with self._calibration_lock:  # once per process, whichever thread begins first
                if self._calibrate:
                    self._marker_ns = self.calibrate(st)
                    self._calibrate = False
        # What every record of this process shares; the label is fixed once the backend is
        # resolved (the sinks' CONTEXT frames carry it).
        self._fix_context(self._label(), self._marker_ns)
        self._attach_lane(st)
        return st

    def prepare(self) -> None:
        """Set up now what this thread's first superstep would otherwise set up inside its
        own time: the counters (opened), the marker pair's cost (calibrated, once per
        process), the sink's file or connection and the context its frames name.
        A program calls it (``counterd.init()``) before its first barrier; each process's
        superstep then begins as soon as the barrier releases it, so the first superstep's
        start skew is the program's, not counterd's."""
        st = self._state()
        if st.read is not None:
            # The group's first read here, not in the first superstep: the sim backend builds
            # its counts (kept until something is fed), and a forked child, whose calibration
            # was its parent's, touches the group's pages (sim, fork: 480 against 30 us).
            st.read()
        sink = self.sink
        if st.daemon_counts is None and sink.durable:
            st.daemon_counts = self._daemon_counts
        if not st.daemon_counts:
            sink.prepare(self._ctx)  # a file mapped, a connection made, the context declared
        self.prepared = True

    def _attach_lane(self, st: ThreadState) -> None:
        st.lane = native.attach(self, st)
        if st.lane is not None:
            self._lanes.add(st)
            st.owner = weakref.ref(self)

    def _orphan(self, lane: Any) -> None:
        """A thread's state is gone (the thread exited): its open steps stay for the at-exit
        sweep, as the Python path's do."""
        for step in lane.open_steps():
            self._open[id(step)] = step

    def _open_group(self, st: ThreadState, backend: Any) -> None:
        # The events asked for (counterd record passes what it resolved) are opened as they
        # are; only without them is the backend probed for what it can count (perf: an open of
        # every event, ~20 ms, paid before the program's first superstep).
        events = self.events or tuple(c for c, why in backend.available().counters.items()
                                      if why is None)
        try:
            try:
                st.group = backend.open(events, Target.this_thread(), strict=False)
            except TypeError:  # a backend without the strict keyword
                st.group = backend.open(events, Target.this_thread())
        except CounterdError as exc:
            st.unsupported = {e: str(exc) for e in events}
        if st.group is not None:
            raw = getattr(st.group, "read_raw", None)
            st.read = raw if raw is not None else st.group.read
            if raw is not None:
                st.delta = st.group.delta_raw  # type: ignore[attr-defined]

    # -- markers -------------------------------------------------------------------------------
    def begin(self, name: str, params: Mapping[str, Param]) -> Step:
        st = self._state()
        if self._rank_pending:
            self.find_rank_again()
        if st.lane is not None:
            return st.lane.begin(  # type: ignore[no-any-return]
                name, params if params.__class__ is dict else dict(params or {}))
        index = next(self._indices)
        cpu = identity.current_cpu()
        rank = st.rank if st.rank is not None else self.rank()
        params = dict(params) if params else {}
        dropped = None
        if params or name.__class__ is not str or not name.isascii() \
                or len(name) > MAX_NAME_CHARS:
            name, params, dropped = clean_marker(name, params)
        sent = 0
        sink = self.sink
        if sink.durable:  # the begin is what survives a kill inside it
            if st.daemon_counts is None:
                st.daemon_counts = self._daemon_counts
            if not st.daemon_counts:
                sent = sink.open(self._ctx, index, name, rank, cpu, time.monotonic_ns(), params)
            else:  # the daemon counts this thread: it is told at the begin, and replies
                line = begin_line(self._ctx, index, name, rank, cpu, time.monotonic_ns(),
                                  params)
                line["tid"] = threading.get_native_id()
                sink.begin(line, count=self.events)
        state = basis = None
        # Sampling skips reads of measured counters; a simulator's (fed streams) is not sampled.
        if self.sample is not None and st.read is not None \
                and getattr(st.group, "feed", None) is None:
            state = st.sampling.get(name)
            if state is None and len(st.sampling) < sampling.MAX_NAMES:
                state = st.sampling[name] = sampling.NameState()
            if state is not None and state.skip():  # this one is estimated: no read
                basis, state = state.basis(), None
        start = st.read() if st.read is not None and basis is None else None
        step = Step(self, index, name, rank, cpu, time.monotonic_ns(), params, start,
                    NESTED if st.stack else NO_FLAGS)
        step.basis, step.sample_state, step.state = basis, state, st
        step.delta = st.delta
        step.sent = sent
        step.dropped = dropped
        st.stack.append(step)
        self._open[id(step)] = step
        if self._native is not None:
            self._native.counterd_superstep_mark(index, 0)
        return step

    def end(self, step: Step | None = None, name: str | None = None) -> SuperstepRecord:
        return as_record(self._end(step, name))

    def _end(self, step: Step | None, name: str | None) -> SuperstepRecord | Step:
        """End a superstep; the hot path keeps the closed step (its record is built lazily).
        A step begun through a lane ends through it (which hands it back to
        :meth:`_end_python` in a forked child)."""
        if step is not None and not isinstance(step, Step):
            return step.lane.end(step, name)  # type: ignore[attr-defined,no-any-return]
        if step is None:
            lane = self._state().lane
            if lane is not None:
                return lane.end(None, name)  # type: ignore[no-any-return]
        return self._end_python(step, name)

    def _end_python(self, step: Step | None, name: str | None) -> SuperstepRecord | Step:
        if self._native is not None:
            self._native.counterd_superstep_mark(step.index if step else -1, 1)
        end_ns = time.monotonic_ns()
        st = self._state()
        stack = st.stack
        if step is None:
            if not stack:
                return self._unmatched_end(name or "?", end_ns)
            step = stack[-1]
        if step.closed:
            return self._unmatched_end(step.name, end_ns)
        own = getattr(step, "state", None)
        if own is not None and own.pid == st.pid:
            # Its own thread's counters and stack, as a lane ends its steps (a step ended by
            # another thread would otherwise read that thread's counters against its own).
            st, stack = own, own.stack
        if step.streams and st.group is not None:
            feed = st.group.feed  # type: ignore[attr-defined]
            for stream in step.streams:  # simulated after end_ns: not part of the time
                feed(stream)
            step.streams.clear()
        step.stop = st.read() if st.read is not None and step.basis is None else None
        step.end_ns = end_ns
        if step.sample_state is not None and self.sample is not None \
                and step.start is not None and step.stop is not None:
            step.sample_state.measured(*step.delta(step.start, step.stop),
                                       end_ns - step.begin_ns, self.sample)
        step.end_cpu = identity.current_cpu()
        step.unsupported = st.unsupported
        if stack and stack[-1] is step:
            stack.pop()
        elif step in stack:
            stack.remove(step)
        step.closed = True
        self._open.pop(id(step), None)
        self.sink.closed(step)
        return step

    def _materialise(self, step: Any) -> SuperstepRecord:
        """A closed step's record (the compiled lane's steps build theirs here)."""
        return materialise(step, self.context)

    def _unmatched_end(self, name: str, end_ns: int) -> SuperstepRecord:
        name, _, dropped = clean_marker(name, {})
        flags = frozenset({"unmatched_end"} | ({"dropped_params"} if dropped else set()))
        rec = SuperstepRecord(
            run_id=self.run_id, index=next(self._indices), name=name, rank=self.rank(),
            pid=self.pid, cpu=identity.current_cpu(), begin_ns=end_ns, end_ns=end_ns,
            flags=flags, unsupported=dropped or {}, backend=self._label(), host=self.host,
            marker_ns=self._marker_ns)
        self.sink.record(rec)
        return rec

    def feed_between(self, stream: Any) -> None:
        """An address stream this thread executes outside its supersteps (a first touch, an
        initialisation): with a simulating backend it is simulated now, so that the simulated
        caches hold at the next superstep's begin what the real ones hold; no record counts
        it. Inside a superstep it is that superstep's, as ``step.feed``. Nothing for backends
        that count real hardware."""
        st = self._state()
        feed = getattr(st.group, "feed", None)
        if feed is None:
            return
        if st.stack:
            st.stack[-1].feed(stream)
        else:
            feed(stream)

    CALIBRATION_PAIRS = 64
    # The longest a calibration through the daemon waits for the daemon's WELCOME, and then
    # for its acknowledgements.
    SCRATCH_WAIT_S = 0.5

    def calibrate(self, st: ThreadState | None = None) -> int | None:
        """The cost of one begin + end marker pair in this process, in ns: the median of
        :data:`CALIBRATION_PAIRS` pairs (the first few dropped) through a scratch recorder with
        the same backend, counters (``st``'s group, read as the markers read it; else its own)
        and kind of sink (a spool in a temporary directory; memory; a second connection to
        the same daemon, its supersteps scratch: acknowledged, never kept), none of whose
        records are kept. None where it cannot be measured that way: a daemon that does not
        offer scratch supersteps (older than this client) or counts on the process's behalf
        (a marker then waits for the daemon's reply, which a scratch one cannot have), and
        under Callgrind (a marker there is a counter dump)."""
        sink = self.sink
        if self.backend_name in ("callgrind", "daemon") or not sink.takes_scratch \
                or self._daemon_counts:
            return None
        # The same kind of sink, keeping nothing: a spool in a temporary directory, memory, a
        # second connection to the same daemon (a daemon slow to answer costs the first
        # superstep SCRATCH_WAIT_S at most); None where the daemon went, or changed, meanwhile.
        scratch = sink.scratch_sink(self.SCRATCH_WAIT_S)
        if scratch is None:
            return None
        probe = None
        try:
            probe = Recorder(run_id=self.run_id, backend=self.backend_name,
                             events=self.events or None, socket="off", calibrate=False,
                             sample="off")  # every pair read: the cost of a measured one
            probe.sink = scratch
            if st is not None:  # the same counters, already open: none opened for this
                shared = ThreadState(st.pid)
                shared.group, shared.read, shared.delta = st.group, st.read, st.delta
                shared.unsupported = st.unsupported
                probe._local.st = shared
                probe._backend = self._backend
                probe._fix_context(self._label(), None)
                probe._attach_lane(shared)
            times = []
            clock = time.monotonic_ns
            lane = probe._state().lane
            if lane is not None:  # the compiled path, entered from a C call as superstep() is
                begin = lane.begin
                for _ in range(self.CALIBRATION_PAIRS):
                    t0 = clock()
                    with begin("calibration", None):
                        pass
                    times.append(clock() - t0)
            else:
                for _ in range(self.CALIBRATION_PAIRS):
                    t0 = clock()
                    probe._end(probe.begin("calibration", {}), None)
                    times.append(clock() - t0)
            # The median by hand (the upper middle one of an even count): statistics costs a
            # program 2-3 ms of imports before its first superstep.
            kept = sorted(times[8:])
            return int(kept[len(kept) // 2])
        except (CounterdError, OSError, ValueError):
            return None
        finally:
            scratch.discard(self.SCRATCH_WAIT_S)  # closed (a spool's directory removed)
            own = getattr(probe._local, "st", None) if probe is not None else None
            if own is not None and own.lane is not None:
                own.lane.unmap()  # its pages would keep the counters open after the close
            if own is not None and own.group is not None and (st is None
                                                              or own.group is not st.group):
                own.group.close()

    def _label(self) -> str:
        if self._backend is not None:
            return str(self._backend.name)
        if self.backend_name == "daemon" or (self.backend_name == "default"
                                             and self.sink.daemon
                                             and self._backend_error is not None):
            return "perf"  # the daemon counts with perf
        return "perf" if self.backend_name == "default" else self.backend_name

    def close_open_steps(self) -> list[SuperstepRecord]:
        """Record every superstep still open as ``incomplete`` (called at interpreter exit)."""
        out = []
        steps: list[Any] = list(self._open.values())
        for state in list(self._lanes):
            if state.lane is not None:
                steps.extend(s for s in state.lane.open_steps() if id(s) not in self._open)
        for step in steps:
            if not step.closed:
                step.closed = True
                rec = step.record()
                self.sink.record(rec)
                out.append(rec)
        self._open.clear()
        return out
