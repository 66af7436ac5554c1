"""``counterd record``: run a command with markers active and collect its superstep records.

The command's processes append marker events to a spool directory (one file per pid, see
:mod:`counterd.markers`); when it exits the spool is collected into records. A command that
marks nothing is recorded as one superstep (flag ``whole_command``) with the counters of the
whole process tree, attached before its first instruction through an exec shim.

With the callgrind backend there are two runs of the same command: a timed run (real time,
software counters) and a counted run under valgrind (simulated memory counters). Time is
never taken from the run under valgrind (DESIGN.md section 4); records of the two runs are
matched on (rank, superstep index) and carry the flag ``counters_from_separate_run``.
"""

from __future__ import annotations

import os
import sys
import time

from counterd import launch
from counterd.data.env import ENV_BACKEND, ENV_EVENTS, ENV_INIT, ENV_RUN_ID, ENV_SAMPLE, ENV_SPOOL
from counterd.data.errors import BadInput

# The imports above are the ones on the way to the command's exec, and cost a few ms; the
# rest (the backends package, the record types, the spool reader: 20-40 ms on this kind of
# host, mostly dataclasses and typing) are imported where used, which for a recording with
# a saved perf plan (counterd.launch) is after the command has started.
# tests/counterd/test_launch.py and test_startup.py hold the recorder to it.
TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from counterd import backends
    from counterd.backends.base import Capability, CounterGroup
    from counterd.data.records import RecordResult, SuperstepRecord

# counterd.machine.files.ENV_MACHINE, named here so that a recording without a machine file need not
# import that module to find out (test_startup checks that the two agree).
ENV_MACHINE = "COUNTERD_MACHINE"

# Backends suggested for a counter, measured first, then the simulators (as counterd probe).
SUGGESTION_ORDER = ("perf", "papi", "callgrind", "sim")


# How often the recorder anchors its node's clocks while the command runs (counterd.data.clocks).
ANCHOR_PERIOD_S = 10.0

# The recorded command's start-up: the recorder's own work waits this long (or for the
# command's end) before it competes with the command for the CPUs (see _run_timed).
STARTUP_S = 0.25


def resolve_command(cmd: Sequence[str]) -> list[str]:
    if not cmd:
        raise BadInput("no command given", "usage: counterd record --out FILE -- CMD [ARGS...]")
    if launch.which(cmd[0]) is None:
        raise BadInput(f"command not found: {cmd[0]}", "check the spelling and PATH")
    return list(cmd)


def resolve_backend(name: str) -> backends.Resolution:
    """Which counter source a recording uses: :func:`counterd.backends.resolve` for purpose
    ``record`` (``auto``: perf when it has hardware memory counters here, else callgrind
    (simulated) when valgrind is installed, else perf with its software counters only, else
    none). Raises BadInput for an unknown name or one unavailable here."""
    from counterd import backends
    from counterd.data.errors import UnknownBackend

    try:
        res = backends.resolve(name, "record")
    except UnknownBackend as exc:
        raise BadInput(exc.what, exc.fix) from None
    if res.error:
        raise BadInput(res.reason, "choose another with --backend (see counterd probe)")
    return res


def counter_sources(chosen: str, caps: Mapping[str, Capability]) -> dict[str, str]:
    """Every counter a recording with backend ``chosen`` can give here -> the backend that
    gives it. With callgrind, the timed run adds perf's counters (software events where there
    is no PMU) to callgrind's simulated ones."""
    def given(name: str) -> dict[str, str]:
        cap = caps[name]
        return {c: name for c in cap.counters if cap.supports(c)}

    if chosen == "none":
        return {}
    if chosen == "callgrind":
        return {**given("perf"), **given("callgrind")}
    return given(chosen)


def check_events(events: Sequence[str], chosen: str, caps: Mapping[str, Capability],
                 requested: str = "") -> None:
    """BadInput, naming the counter and the backends that can give it on this host, for the
    first of ``events`` a recording with ``chosen`` cannot give."""
    from counterd import backends

    sources = counter_sources(chosen, caps)
    which = f"backend {chosen}" + (" (auto's pick here)" if requested == "auto" else "")
    for event in events:
        if event in sources:
            continue
        able = [n for n in SUGGESTION_ORDER if caps[n].supports(event)]
        if chosen == "none":
            why = "it counts nothing"
        else:
            cap = caps[chosen]
            why = backends.gist(cap.counters.get(event) or cap.reason)
        where = ("backends that give it on this host: " + ", ".join(able) if able else
                 "no backend gives it on this host")
        raise BadInput(f"counter {event} cannot be recorded with {which}, {why}; {where}",
                       (f"choose --backend {able[0]}" if able else "see counterd probe")
                       + f", or leave {event} out of --events")


def limit_to(records: Sequence[SuperstepRecord], events: Sequence[str]
             ) -> list[SuperstepRecord]:
    """``records`` with only the counters of ``events`` (and their unsupported reasons; a
    reason for the whole superstep, ``*``, is kept), the flags that follow recomputed."""
    from dataclasses import replace

    keep = set(events) | {"*"}
    out = []
    for rec in records:
        counters = {k: v for k, v in rec.counters.items() if k in keep}
        unsupported = {k: v for k, v in rec.unsupported.items() if k in keep}
        flags = set(rec.flags) - {"unsupported_counters", "multiplexed"}
        if unsupported:
            flags.add("unsupported_counters")
        if any(cv.ratio < 1.0 for cv in counters.values()):
            flags.add("multiplexed")
        out.append(replace(rec, counters=counters, unsupported=unsupported,
                           flags=frozenset(flags)))
    return out


def _check_writable(out: str) -> None:
    directory = os.path.dirname(out) or "."
    if not os.path.isdir(directory):
        raise BadInput(f"cannot write {out}: {directory} is not a directory",
                       "create the directory or choose another --out")
    if not os.access(directory, os.W_OK):
        raise BadInput(f"cannot write {out}: {directory} is not writable",
                       "choose a writable --out")


def machine_file() -> str | None:
    """The machine file in effect (``--machine`` through :func:`counterd.machine.using`, or
    ``COUNTERD_MACHINE``), or None. Raises BadInput for a bad one. Neither can be in effect
    while counterd.machine has not been imported and the variable is unset, and then the
    module (30 dataclasses, sysfs reads) is left unloaded."""
    if "counterd.machine" not in sys.modules and not os.environ.get(ENV_MACHINE):
        return None
    from counterd import machine

    return machine.current().file


def _env(run_id: str, spool: str, backend: str, events: Sequence[str]) -> dict[str, str]:
    env = dict(os.environ)
    file = machine_file()
    if file is not None:  # --machine: the command's simulating markers use it too
        env[ENV_MACHINE] = os.path.abspath(file)
    env[ENV_RUN_ID] = run_id
    env[ENV_SPOOL] = str(spool)
    env[ENV_BACKEND] = backend
    env[ENV_EVENTS] = ",".join(events)
    # Each process of the command sets up its markers when it imports counterd (before its
    # first barrier), not in its first superstep (where the set-up was the superstep's start
    # skew); a user's own setting wins.
    env.setdefault(ENV_INIT, "import")
    # The command imports counterd from the same installation as this recorder.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _papi_group(events: Sequence[str], pid: int) -> CounterGroup | None:
    """PAPI's counters on the waiting command (inherit), or None where PAPI cannot count."""
    from counterd import backends
    from counterd.backends.base import Target
    from counterd.data.errors import CounterdError

    try:
        be = backends.get("papi")
        cap = be.available()
        evs = tuple(events) or tuple(c for c, why in cap.counters.items() if why is None)
        return be.open(evs, Target(pid=pid, inherit=True), strict=False)  # type: ignore[call-arg]
    except CounterdError:
        return None


def _open_plan(plan: launch.PerfPlan, saved: bool, events: Sequence[str]
               ) -> tuple[launch.PerfPlan, list[int]]:
    """Open ``plan`` on this process, for the command to inherit: (the plan as it opened, its
    counters' fds). A counter the kernel refuses joins the plan's ``unsupported`` with the
    reason; a ``saved`` plan that no longer opens whole (made under other conditions: a
    seccomp filter, a container) is worked out again instead."""
    fds, failed = launch.open_plan(plan, 0)
    if not failed:
        return plan, fds
    from counterd.backends.base import Target
    from counterd.backends.perf import PerfBackend

    be = PerfBackend()
    if saved:
        for fd in fds:
            os.close(fd)
        return _open_plan(be.whole_command_plan(events), False, events)
    target = Target(inherit=True)
    opened = [(n, a) for n, a in zip(plan.events, plan.attrs, strict=True) if n not in failed]
    why = {name: be.open_error(err, name, target) for name, err in failed.items()}
    return launch.PerfPlan([n for n, _ in opened], [a for _, a in opened],
                           {**plan.unsupported, **why}), fds


def _read_anchor() -> tuple[int, int, int]:
    """CLOCK_MONOTONIC, CLOCK_REALTIME, CLOCK_MONOTONIC read in a row: a clock anchor's raw
    reads (counterd.data.clocks, not loaded on the way to the command's exec)."""
    return time.monotonic_ns(), time.time_ns(), time.monotonic_ns()


def _run_timed(cmd: list[str], run_id: str, backend: str, events: Sequence[str],
               host: str, extra_env: Mapping[str, str], perf: Capability | None = None,
               plan: launch.PerfPlan | None = None,
               skipped: Callable[[str], None] | None = None,
               anchors: list[tuple[int, int, int]] | None = None
               ) -> tuple[int, list[SuperstepRecord]]:
    """Run the command once for real; records from its markers, or one whole-command record.
    ``extra_env``: variables added to the command's environment; ``perf``: what a probe of
    perf already said (None: probe); ``plan``: the perf plan saved for this host (None: the
    perf backend works it out, and it is saved for the next recording); ``skipped`` hears
    what of the spool was not read; ``anchors`` gets clock anchor reads (:func:`_read_anchor`)
    from before the command's start, every ANCHOR_PERIOD_S while it runs, and after its end.
    Raises :class:`counterd.launch.Stopped` when the recorder is told to stop after the
    command (its spool removed)."""
    # Markers in the timed run count with perf (measured) or nothing; callgrind counts later.
    marker_backend = backend if backend in ("perf", "papi", "sim", "none") else "perf"
    saved = plan
    if marker_backend == "perf" and plan is None:
        from counterd.backends.perf import PerfBackend

        be = PerfBackend()
        perf = perf if perf is not None else be.available()
        if perf.available:
            plan = be.whole_command_plan(events, perf)
        else:
            marker_backend = "none"
    # What the plan counts is what the command's markers open: they need not probe again
    # (every process of the command would, before its first superstep).
    marker_events = tuple(events) or (plan.events if plan is not None else ())
    # SIGTERM, SIGHUP or SIGINT while the recorder works (not while the command runs: those
    # pass on to it, launch.outlive_signals) end it by an exception, its spool removed in the
    # finally below (their default ends the process at once, leaving the directory).
    unstop = launch.stop_on_signals()
    anchors = [] if anchors is None else anchors
    anchors.append(_read_anchor())
    spool = launch.make_spool_dir()
    fds: list[int] = []  # the plan's counters, open until read (closed in the finally)
    try:
        env = {**_env(run_id, spool, marker_backend, marker_events), **extra_env}
        papi = start = None
        if marker_backend == "papi":  # PAPI attaches to a process: the command waits for it
            pid, go_w = launch.fork_waiting(cmd, env)
            went = False
            try:
                papi = _papi_group(events, pid)
                start = papi.read() if papi is not None else None
                begin_ns = time.monotonic_ns()
                os.write(go_w, b"g")
                went = True
            finally:  # a failure before the go byte: the child reads EOF and exits 125, unrun
                os.close(go_w)
                if not went:
                    launch.wait(pid)
        else:
            if plan is not None:  # on the recorder, for the command to inherit (launch.spawn)
                plan, fds = _open_plan(plan, plan is saved, events)
            begin_ns = time.monotonic_ns()
            try:
                pid = launch.spawn(cmd, env)
            except OSError as exc:
                print(f"counterd record: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr)
                return 127, []
        # Loaded while the command runs, rather than on the way to its exec or after it
        # (fsutil: write_jsonl's). The perf backend is not: the plan's counters are read
        # without it (launch.read_plan), and its imports would take the CPUs from the command.
        # Not during the command's start-up either (its first STARTUP_S, or until it ends if
        # sooner): these imports take 40 ms of CPU, and a program starting its thread pools
        # then (numpy's OpenBLAS) is slowed by any other task running, even one at idle
        # priority (bench/record_overhead.py's 1 s numpy job: up to 1.022x perf stat with
        # them at once, 1.000-1.008x since; see the README's whole-run figures).
        # The spool's reader (its frame decoder: a third of these imports) is not loaded for
        # a command that ended within STARTUP_S leaving the spool empty: its record is the
        # whole-command one (bench/record_overhead.py's "no target" row).
        restore = launch.outlive_signals(pid)
        try:
            if not launch.wait_exit(pid, STARTUP_S) or launch.spool_written(spool):
                from counterd.wire import spool_reader as _  # noqa: F401
            from counterd.data.events import measured
            from counterd.data.records import SuperstepRecord
            from counterd.util import fsutil  # noqa: F401

            if plan is not None and plan is not saved and not events:
                launch.save_plan(plan)  # a plan of every counter: the next recording's
            while True:  # an anchor every ANCHOR_PERIOD_S while the command runs
                t0 = time.monotonic()
                if launch.wait_exit(pid, ANCHOR_PERIOD_S) \
                        or time.monotonic() - t0 < ANCHOR_PERIOD_S / 2:  # exited; or no pidfd
                    break
                anchors.append(_read_anchor())
            code = launch.wait(pid)
        finally:
            restore()
        end_ns = time.monotonic_ns()
        anchors.append(_read_anchor())
        # the command's counts: its own, and its children's that exited
        counted = launch.read_plan(fds) if plan is not None else None
        stop = papi.read() if papi is not None else None
        if papi is not None:
            papi.close()
        records = _collect_spool(spool, skipped)
    finally:
        try:
            for fd in fds:
                os.close(fd)
            launch.remove_spool_dir(spool)
            # Those a recorder killed by SIGKILL left (no other signal leaves one): after the
            # command, off its way to the exec and its run.
            launch.remove_stale_spool_dirs()
        finally:
            unstop()
    if not records and code != 127:
        # perf's counters start at the exec (enable_on_exec); PAPI's were read before it.
        if plan is not None and counted is not None:
            counters = {name: measured(*c) for name, c in zip(plan.events, counted,
                                                                strict=True)}
            unsupported = dict(plan.unsupported)
        else:
            counters = ({} if stop is None else stop.delta(start) if start is not None
                        else dict(stop.values))
            unsupported = dict(stop.unsupported) if stop is not None else {}
        flags = {"whole_command"} | ({"unsupported_counters"} if unsupported else set())
        if any(cv.ratio < 1.0 for cv in counters.values()):
            flags.add("multiplexed")
        records = [SuperstepRecord(
            run_id=run_id, index=0, name=" ".join(cmd)[:200], rank=0, pid=pid, cpu=-1,
            begin_ns=begin_ns, end_ns=end_ns, counters=counters, flags=frozenset(flags),
            unsupported=unsupported, backend=marker_backend, host=host)]
    return code, records


def _collect_spool(spool: str, skipped: Callable[[str], None] | None = None
                   ) -> list[SuperstepRecord]:
    """The records the command's markers left in the spool; none, without loading its
    reader, where they wrote nothing. What of it was not read (a file that is not a regular
    file of this user, one beyond its cap: counterd.wire.spool_reader.read_events) is told to
    ``skipped``, one line per file."""
    if not launch.spool_written(spool):
        return []
    from pathlib import Path

    from counterd.wire.spool_reader import collect

    return list(collect(Path(spool), None if skipped is None else lambda s: skipped(s.line()),
                        owner=os.geteuid()))


CPU_FEATURES = ("auto", "native", "as-counted")


def record(cmd: Sequence[str], *, out: str | os.PathLike[str] | None, backend: str = "auto",
           events: Sequence[str] = (), run_id: str | None = None,
           cpu_features: str = "auto", sample: str | None = None,
           prefetch: bool = False, count_from_start: bool = False,
           progress: Callable[[str], None] | None = None) -> RecordResult:
    """Run ``cmd`` with markers active; write its records to ``out`` (JSON lines, atomic).

    ``cpu_features``: ``as-counted`` hides from the command's run-time code dispatch the CPU
    features valgrind lacks (:func:`counterd.backends.callgrind.counting.as_counted_env`), so that a
    timed run executes the code a Callgrind run counts; ``native`` and ``auto`` hide nothing:
    the times are the program's as it runs without counterd (as ``predict --pilot`` times it).
    Records of a run that hid features carry the flag ``cpu_features_hidden``; records timed
    natively and counted under Callgrind on a CPU with features valgrind lacks carry
    ``counted_other_code``. ``progress`` hears when the command runs
    a second time (under callgrind). ``sample``: ``"<duration>:<k>"``, the command's markers
    read the counters of 1 in k supersteps shorter than the duration
    (:mod:`counterd.markers.sampling`); None: as ``COUNTERD_SAMPLE`` says, else off.
    ``prefetch`` (``--prefetch``, Callgrind only): valgrind's hardware prefetcher simulated
    on the last level (:attr:`counterd.backends.callgrind.geometry.CallgrindGeometry.prefetch`).
    Under Callgrind a command whose timed run marked supersteps is counted from each process's
    first superstep mark (:func:`counterd.backends.callgrind.valgrind.valgrind_argv`,
    ``from_first_superstep``), unless ``count_from_start`` (``--count-from-start``) or the
    native library cannot start the counting; a command without markers, from its start.

    Returns the command's exit code with the records. Bad input raises BadInput before the
    command runs; a failure to write ``out`` raises BadInput after it, leaving no partial file.
    """
    if cpu_features not in CPU_FEATURES:
        raise BadInput(f"--cpu-features {cpu_features!r}", "choose " + ", ".join(CPU_FEATURES))
    if count_from_start and backend != "callgrind":
        raise BadInput(f"--count-from-start with --backend {backend}: it says where Callgrind "
                       "starts counting", "give --backend callgrind, or drop --count-from-start")
    if prefetch and backend != "callgrind":
        raise BadInput(f"--prefetch with --backend {backend}: the prefetcher is Callgrind's "
                       "cache simulation", "give --backend callgrind, or drop --prefetch")
    if sample is not None:
        from counterd.markers.sampling import Sampling

        Sampling.parse(sample, "--sample")  # BadInput before the command runs
    argv = resolve_command(cmd)
    if events:
        from counterd.data.events import check_names

        check_names(tuple(events))
    if out is not None:
        _check_writable(os.fspath(out))
    if os.environ.get("COUNTERD_SPOOL_MAX_BYTES"):  # spool_reader.ENV_MAX_FILE_BYTES, checked now
        from counterd.wire import spool_reader

        spool_reader.max_file_bytes()  # BadInput before the command runs
    # Every counter perf has, perf asked for by name or picked by auto on its capability
    # alone: the plan saved by an earlier recording says what perf counts here, and the
    # backends need not be loaded before the exec.
    plan = launch.load_plan() if backend in ("perf", "auto") and not events else None
    if plan is not None and backend == "auto" and not plan.auto:
        plan = None
    caps: dict[str, Capability] = {}
    if plan is not None:
        chosen = "perf"
    else:
        res = resolve_backend(backend)
        chosen, caps = res.backend or "none", dict(res.capabilities)
    machine_file()  # a bad machine file fails here, before the command runs
    geometry = None
    if chosen == "callgrind":
        from counterd import machine
        from counterd.backends.callgrind.geometry import CallgrindGeometry

        geometry = CallgrindGeometry.from_machine(machine.current())
        if prefetch:
            from dataclasses import replace

            geometry = replace(geometry, prefetch=True)
    if events:
        from counterd import backends

        caps = {**{n: backends.capability(n) for n in backends.NAMES if n not in caps}, **caps}
        check_events(events, chosen, caps, backend)
    # The run id: --run-id; else one the job shares (COUNTERD_RUN_ID given or exported by an
    # outer recorder; the launcher's or batch system's where this recorder is an MPI rank:
    # counterd.data.jobid); else the recorder's own, exported to the command (every rank mpiexec
    # starts on any node inherits it). os.urandom rather than uuid4().hex[:6]: the same six
    # random hex digits, without importing uuid on the way to the command's exec.
    from counterd.data.jobid import job_run_id

    job = None if run_id else job_run_id()
    source = "given" if run_id else job[1] if job is not None else "recorder"
    run_id = run_id or (job[0] if job is not None else
                        time.strftime("%Y%m%dT%H%M%S") + "-" + os.urandom(3).hex())
    host = os.uname().nodename
    hide: dict[str, str] = {}
    lacked: tuple[str, ...] = ()  # the CPU's features the timed run has and valgrind lacks
    if cpu_features == "as-counted" or chosen == "callgrind":
        from counterd.backends.callgrind.counting import as_counted_env, hidden_features
        from counterd.data.host import cpu_flags

        if cpu_features == "as-counted":
            hide = as_counted_env(os.environ, cpu_flags())
        else:
            lacked = hidden_features(cpu_flags())
    sampling = {} if sample is None else {ENV_SAMPLE: sample}
    skipped: list[str] = []

    def skip(line: str) -> None:
        skipped.append(line)
        if progress is not None:
            progress(line)

    reads: list[tuple[int, int, int]] = []
    code, records = _run_timed(argv, run_id, chosen, events, host, {**hide, **sampling},
                               caps.get("perf"), plan, skip, reads)
    from dataclasses import replace
    from pathlib import Path

    from counterd.data.records import RecordResult, write_jsonl

    if hide:
        records = [replace(r, flags=r.flags | {"cpu_features_hidden"}) for r in records]
    stopped_by = _stopping_signal(code) if chosen == "callgrind" else None
    if stopped_by is not None:
        # Ctrl-C or kill stopped the command: it is not run again, 20-100x slower.
        if progress is not None:
            progress(f"not counting under callgrind: the command was stopped by "
                     f"{_signal_name(stopped_by)}")
        records = _uncounted(records, f"not counted: the command was stopped by "
                                      f"{_signal_name(stopped_by)} before its run under callgrind")
    elif chosen == "callgrind":
        if progress is not None:
            progress("counting under callgrind: the command runs a second time, 20-100x "
                     "slower, its output not shown again"
                     + (f"; valgrind's CPU lacks {', '.join(lacked)}, which the timed run "
                        "had: where the program dispatches on them the counts are of other "
                        "code (--cpu-features as-counted times the code counted)"
                        if lacked else ""))
        from counterd import _native
        from counterd.backends.callgrind import counting

        whole_command = len(records) == 1 and "whole_command" in records[0].flags
        counted = counting.count_command(argv, run_id=run_id, geometry=geometry, env={
            **_env(run_id, ".", "callgrind", events), **hide},
            from_first_superstep=not (count_from_start or whole_command)
            and _native.marks_start_counting())
        if whole_command:
            records = counting.merge_whole(records[0], counted)
        else:
            records = counting.merge_counted(records, counted.supersteps)
        if lacked:
            records = [replace(r, flags=r.flags | {"counted_other_code"})
                       if "counters_from_separate_run" in r.flags else r for r in records]
        stopped_by = counted.stopped_by
        if stopped_by is None and counted.exit_code != code and progress is not None:
            # Its messages are not repeated (the timed run showed them), unless it ended
            # otherwise: then its counts may be of other work.
            progress(f"the run under callgrind exited {counted.exit_code}, the timed run "
                     f"{code}: its counts may be of other work"
                     + (f"; its last error line: {counted.stderr_tail}"
                        if counted.stderr_tail else ""))
        if stopped_by is not None:
            why = f"counting under callgrind was stopped by {_signal_name(stopped_by)}"
            records = _uncounted(records, why + " before this superstep's end")
            if len(records) == 1 and "whole_command" in records[0].flags:
                rec = records[0]
                records = [replace(rec, flags=rec.flags | {"incomplete"},
                                   unsupported={**rec.unsupported,
                                                "*": why + ": the counts cover part of the "
                                                           "command"})]
    if events:
        records = limit_to(records, events)
    records.sort(key=lambda r: (r.index, r.rank, r.pid))
    from counterd.data.clocks import Anchor, local_domain

    domain = local_domain(run_id, [Anchor((m1 + m2) // 2, r, m2 - m1 + 1)
                                   for m1, r, m2 in reads], source, host)
    if out is not None:
        write_jsonl(records, Path(out), header=[domain.to_json()])
    return RecordResult(code, tuple(records), chosen, Path(out) if out else None, stopped_by,
                        tuple(skipped), domain)


# What a command stopped by a signal exits with: killed by it (-N), or, for a shell script
# whose command was, 128 + N. The signals the recorder outlives (launch.outlive_signals).
def _stopping_signal(code: int) -> int | None:
    import signal

    stops = {int(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    sig = -code if code < 0 else code - 128
    return sig if sig in stops else None


def _signal_name(sig: int) -> str:
    import signal

    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _uncounted(records: Sequence[SuperstepRecord], why: str) -> list[SuperstepRecord]:
    """``records`` with ``counters_missing`` and ``why`` (``unsupported["*"]``) on those the
    counted run gave no counters; the others as they are."""
    from dataclasses import replace

    out = []
    for rec in records:
        if "counters_missing" in rec.flags or "counters_from_separate_run" not in rec.flags:
            rec = replace(rec, flags=rec.flags | {"counters_missing"},
                          unsupported={**rec.unsupported, "*": rec.unsupported.get("*", why)})
        out.append(rec)
    return out
