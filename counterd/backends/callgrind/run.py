"""Running a command under Callgrind (:func:`run`): in its own session, with the stop signals
passed on, every process's dumps read back (:class:`CallgrindRun`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterd.backends.callgrind.dumps import Dump, dump_files, dumps_for_pid
from counterd.backends.callgrind.geometry import CacheAdjustment, CallgrindGeometry
from counterd.backends.callgrind.valgrind import (
    INSTALL_FIX,
    NAME,
    CallgrindError,
    valgrind_argv,
    valgrind_path,
)
from counterd.data.errors import BackendUnavailable, BadInput


@dataclass(frozen=True)
class CallgrindRun:
    """The outcome of :func:`run`: the command's exit code and every process's dumps."""

    exit_code: int
    outdir: Path
    argv: tuple[str, ...]
    geometry: CallgrindGeometry
    dumps: Mapping[int, tuple[Dump, ...]] = field(default_factory=dict)
    # pid -> why its dumps could not be read (still being written by a process that outlived
    # the command, or truncated)
    unreadable: Mapping[int, str] = field(default_factory=dict)
    # The first signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) this process received during the run
    # and passed on to valgrind's session (None: none): the run was stopped, its dumps are
    # the supersteps it finished.
    stopped_by: int | None = None

    @property
    def adjustments(self) -> tuple[CacheAdjustment, ...]:
        return self.geometry.adjustments

    def stderr_tail(self, lines: int = 1) -> str:
        """The last ``lines`` non-blank lines the command wrote to its standard error, when
        :func:`run` kept it (``show_stdout=False``); "" otherwise."""
        path = self.outdir / STDERR_FILE
        if not path.exists():
            return ""
        text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
        return "\n".join(text[-lines:])

    def log(self, pid: int) -> str:
        """Valgrind's own messages for ``pid`` ("" when absent)."""
        path = self.outdir / f"valgrind.{pid}.log"
        return path.read_text(errors="replace") if path.exists() else ""


# How long a run waits, once its command has ended, for the processes the command left in its
# session (helpers that outlive it: multiprocessing's resource tracker ends when its last user
# does, a fraction of a second later under valgrind) to end and write their dumps.
SESSION_GRACE_S = 3.0


def wait_session(pgid: int, grace: float = SESSION_GRACE_S) -> bool:
    """Wait up to ``grace`` seconds until no process is left in process group ``pgid`` (the
    command's session: valgrind runs it with ``start_new_session``); True if none is. A helper
    still running after that is left alone: its dump, if any, is unreadable and said so."""
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # a member that changed its uid: not this run's to wait for
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# Where run(show_stdout=False) keeps the command's standard error (in its outdir): a second
# run of a command repeats the first one's messages (a traceback printed twice, issue 34).
STDERR_FILE = "command.stderr"


# Signals that stop a run: valgrind runs in its own session (so that a timeout can kill its
# whole process tree), where the terminal's Ctrl-C and Ctrl-\ never reach it, and a kill of
# this process alone would leave it running. Each is passed on to the session while it runs.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class _PassOn:
    """Until :meth:`restore`: every signal of :data:`STOP_SIGNALS` this process receives is
    sent to the process group ``pgid`` (once :meth:`started` names it; one received before
    that is sent then), and the first is remembered (``received``). A no-op outside the main
    thread, where signals are not set."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.pgid: int | None = None
        self.old: list[tuple[int, Any]] = []
        try:
            for sig in STOP_SIGNALS:
                self.old.append((sig, signal.signal(sig, self._handle)))
        except ValueError:  # not the main thread
            pass

    def _send(self, sig: int) -> None:
        if self.pgid is None:
            return
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:  # it has ended: the wait returns
            pass

    def _handle(self, sig: int, frame: object) -> None:
        if self.received is None:
            self.received = sig
        self._send(sig)

    def started(self, pgid: int) -> None:
        self.pgid = pgid
        if self.received is not None:
            self._send(self.received)

    def restore(self) -> None:
        for sig, handler in self.old:
            signal.signal(sig, handler)
        self.old = []


def run(cmd: Sequence[str], geometry: CallgrindGeometry | None = None,
        outdir: str | Path | None = None, env: Mapping[str, str] | None = None,
        timeout: float | None = None, *, show_stdout: bool = True,
        from_first_superstep: bool = False) -> CallgrindRun:
    """Run ``cmd`` under Callgrind and read every dump it leaves in ``outdir``
    (``show_stdout=False``: the command's standard output is discarded and its standard error
    kept in ``outdir``, :meth:`CallgrindRun.stderr_tail`; valgrind's own messages are in its
    logs either way, :meth:`CallgrindRun.log`). ``from_first_superstep``: each process counted
    from its first superstep mark on (:func:`~counterd.backends.callgrind.valgrind.
    valgrind_argv`).

    ``geometry`` defaults to the machine's (:meth:`CallgrindGeometry.from_machine`).
    ``outdir`` defaults to a new temporary directory, left in place for the caller (it holds
    the dumps and valgrind's logs).
    Raises BackendUnavailable without valgrind, BadInput for a command that does not exist,
    CallgrindError when the timeout expires (the process tree is killed).
    """
    exe = valgrind_path()
    if exe is None:
        raise BackendUnavailable(NAME, "valgrind is not on PATH", INSTALL_FIX)
    if not cmd:
        raise BadInput("no command given", "usage: counterd record --backend callgrind -- CMD")
    prog = cmd[0]
    found = shutil.which(prog, path=(env or os.environ).get("PATH")) if os.sep not in prog \
        else (prog if os.access(prog, os.X_OK) else None)
    if found is None:
        raise BadInput(f"command not found: {prog}", "check the spelling and PATH")
    geo = geometry if geometry is not None else CallgrindGeometry.from_machine()
    out = Path(outdir) if outdir is not None else Path(tempfile.mkdtemp(prefix="counterd-cg-"))
    out.mkdir(parents=True, exist_ok=True)
    stale = dump_files(out)
    if stale:
        raise BadInput(f"{out} already holds callgrind dumps (pids {sorted(stale)})",
                       "give run() an empty directory")
    argv = valgrind_argv(cmd, geo, out, valgrind=exe, from_first_superstep=from_first_superstep)
    # Ctrl-C, kill and a closed terminal stop the run as they stop a command run natively:
    # passed on to valgrind's session, which ends as its command does (a process it counts
    # dies of the signal, valgrind with it), leaving the dumps of the supersteps it finished.
    passing = _PassOn()
    try:
        try:
            with open(os.devnull if show_stdout else out / STDERR_FILE, "wb") as errors:
                proc = subprocess.Popen(argv, env=dict(env) if env is not None else None,
                                        start_new_session=True,
                                        stdout=None if show_stdout else subprocess.DEVNULL,
                                        stderr=None if show_stdout else errors)
        except OSError as exc:
            raise CallgrindError(f"cannot start valgrind: {exc.strerror}", INSTALL_FIX) from exc
        passing.started(proc.pid)
        try:
            code = proc.wait(timeout=timeout)
            wait_session(proc.pid)
        except subprocess.TimeoutExpired:
            _kill_tree(proc)
            raise CallgrindError(f"the command did not finish within {timeout} s under "
                                 "callgrind", "raise the timeout (callgrind runs 50-100x "
                                 "slower), or shrink the input") from None
        except BaseException:  # an exception from elsewhere: the session is not left running
            _kill_tree(proc)
            raise
    finally:
        passing.restore()
    dumps: dict[int, tuple[Dump, ...]] = {}
    unreadable: dict[int, str] = {}
    for pid in sorted(dump_files(out)):
        # A helper process the command exec'd (e.g. multiprocessing's resource tracker) may
        # outlive it past wait_session's grace and still be writing its dump: that pid is
        # unreadable, not the run.
        try:
            dumps[pid] = tuple(dumps_for_pid(out, pid))
        except CallgrindError as exc:
            unreadable[pid] = str(exc)
    if not dumps and code != 0 and passing.received is None:
        log = "".join((out / name).read_text(errors="replace")
                      for name in sorted(os.listdir(out)) if name.startswith("valgrind."))
        raise CallgrindError(f"valgrind exited with {code} and wrote no dump",
                             "see its log: " + (log.strip().splitlines() or ["(empty)"])[-1])
    return CallgrindRun(code, out, tuple(argv), geo, dumps, unreadable, passing.received)
