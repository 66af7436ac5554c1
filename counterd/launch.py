"""The way from ``counterd record``'s command line to its command's first instruction.

Everything here runs while the command waits, so it is kept to the standard library's
os-level modules, :mod:`counterd.perf_abi` and the compiled extension (for perf_event_open(2);
ctypes is the fallback): no dataclasses, typing, pathlib or the backends package, which cost
20-40 ms to import on the way (perf stat starts its command 8.7-9.0 ms after its own start on
the VM this was measured on, bench/record_overhead.py; tests/counterd/test_launch.py holds the
recorder to these modules). What the recorder needs of heavier modules it loads while the
command runs (:mod:`counterd.commands.recording`).

- :func:`spawn`: the command's process, started with posix_spawn; counters opened on the
  recorder before it (inherit, enable_on_exec) count it from its first instruction.
  :func:`fork_waiting` is for counters that must be attached to the command's process (PAPI):
  forked, it waits for the go byte while they are.
- :class:`~counterd.perf_abi.PerfPlan` (of :mod:`counterd.perf_abi`, the perf ABI this module
  shares with the perf backend): the perf attributes that count a whole command (every process
  it creates, from its exec), kept per user and per boot by :func:`save_plan` so that the next
  recording opens them (:func:`open_plan`) without importing the perf backend to work them out
  again.
- :func:`which` and :func:`make_spool_dir`: ``shutil.which`` and ``tempfile.mkdtemp`` without
  their modules (shutil loads bz2 and lzma; tempfile loads random and shutil).
"""

from __future__ import annotations

# _signal: the C module under signal, loaded with the interpreter (signal wraps its
# constants in enums on import: 1-2 ms here).
import _signal
import errno
import os
import sys

from counterd.perf_abi import (
    PERF_ATTR_SIZE_VER0,
    PERF_EVENT_OPEN_NR,
    PerfPlan,
    parse_single_read,
    perf_event_open,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (see counterd/__init__)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

PLAN_FORMAT = "counterd-perf-plan"
PLAN_VERSION = 1
PLAN_FILE = "perf-plan"
_PERF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backends", "perf")


def which(exe: str) -> str | None:
    """The file ``execvp`` would run for ``exe`` (``shutil.which``'s answer for a command)."""
    if os.sep in exe:
        return exe if os.access(exe, os.X_OK) and not os.path.isdir(exe) else None
    for directory in os.get_exec_path():
        path = os.path.join(directory or ".", exe)
        if os.access(path, os.X_OK) and not os.path.isdir(path):
            return path
    return None


# The name of a recorder's spool directory (its versions before the lock below named them
# counterd-spool-*: those are never taken for stale, they are not known to be locked).
SPOOL_PREFIX = "counterd-record-"
# A spool directory is locked (flock on its descriptor) by the recorder that made it, for as
# long as it lives: the lock goes with the process, however it ends, SIGKILL included.
_locks: dict[str, int] = {}
# A spool directory no recorder holds, left by one killed with SIGKILL, is removed by the next
# recording of the same user once it is this old (the age covers the moment between a new
# directory's mkdir and its lock).
STALE_SPOOL_S = 60.0


def _spool_base() -> str:
    return os.environ.get("TMPDIR") or "/tmp"


def make_spool_dir(prefix: str = SPOOL_PREFIX) -> str:
    """A new private directory (mode 0700, a name nobody could have guessed) under $TMPDIR or
    /tmp, as ``tempfile.mkdtemp`` makes it (tempfile loads shutil and random, 3-4 ms on the
    way to the exec), locked by this process until :func:`remove_spool_dir` (so that
    :func:`remove_stale_spool_dirs` of another recording leaves it); the caller removes it."""
    base = _spool_base()
    for _ in range(100):
        path = os.path.join(base, prefix + os.urandom(8).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        path = os.path.abspath(path)
        _lock(path)
        return path
    raise FileExistsError(f"no free name for a spool directory in {base}")


def _lock(path: str) -> None:
    import fcntl  # a C module, well under a millisecond

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # a file system without flock: the directory only ages
        os.close(fd)
        return
    _locks[path] = fd


def spool_written(path: str) -> bool:
    """Whether anything was written into the spool directory (a marking process has made its
    file there); False where it cannot be read."""
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is not None
    except OSError:
        return False


_STOPS = (_signal.SIGTERM, _signal.SIGHUP, _signal.SIGINT)


def remove_spool_dir(path: str) -> None:
    """Remove a spool directory and what it holds (the markers write files only: a directory
    something else made there goes through shutil.rmtree, not loaded otherwise); what cannot
    be removed is left. SIGTERM, SIGHUP and SIGINT wait until it is done (a handler that
    ends the recorder, :func:`stop_on_signals`, would stop it half way)."""
    try:
        blocked = _signal.pthread_sigmask(_signal.SIG_BLOCK, _STOPS)
    except (AttributeError, OSError):
        blocked = None
    try:
        fd = _locks.pop(path, None)
        try:
            _remove_tree(path, fd)
        finally:
            if fd is not None:
                os.close(fd)
    finally:
        if blocked is not None:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, blocked)


def _remove_tree(path: str, held: int | None = None) -> None:
    """Empty and remove directory ``path``; ``held``: a descriptor of the directory this
    process made there. Never through a link: where ``path`` is no longer that directory (the
    recorded program, whose spool it was, moved it and put a link or another directory in its
    place), the directory is emptied through ``held`` and ``path`` left alone."""
    try:
        fd: int | None = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                 | os.O_CLOEXEC)
    except OSError:
        fd = None
    try:
        if fd is not None and held is not None:
            a, b = os.fstat(fd), os.fstat(held)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                os.close(fd)
                fd = None
        where = fd if fd is not None else held
        if where is None:
            return
        with os.scandir(where) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for name, is_dir in entries:
            try:
                if is_dir:
                    import shutil

                    shutil.rmtree(name, dir_fd=where, ignore_errors=True)
                else:
                    os.unlink(name, dir_fd=where)
            except OSError:
                pass
        if fd is not None:
            os.rmdir(path)
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


def remove_stale_spool_dirs(base: str | None = None, prefix: str = SPOOL_PREFIX,
                            min_age_s: float = STALE_SPOOL_S) -> list[str]:
    """Remove the spool directories in ``base`` ($TMPDIR or /tmp) that a recorder killed
    with SIGKILL left: named ``prefix``..., a directory (not a link), this user's, mode 0700,
    unchanged for ``min_age_s``, and locked by no process (a live recorder holds its lock).
    Returns those removed. Another user's directory is never touched (/tmp is sticky: only
    its owner or root can rename or replace it, so what lstat saw stays what is removed)."""
    import fcntl
    import stat
    import time

    base = base or _spool_base()
    removed: list[str] = []
    now = time.time()
    uid = os.geteuid()
    try:
        with os.scandir(base) as it:
            entries = [e for e in it if e.name.startswith(prefix)]
    except OSError:
        return removed
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if (not stat.S_ISDIR(st.st_mode) or st.st_uid != uid
                or stat.S_IMODE(st.st_mode) != 0o700 or now - st.st_mtime < min_age_s
                or entry.path in _locks):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if (os.fstat(fd).st_ino, os.fstat(fd).st_dev) != (st.st_ino, st.st_dev):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # held: its recorder lives (or flock is not there: left to age)
                continue
            _remove_tree(entry.path, fd)
            removed.append(entry.path)
        finally:
            os.close(fd)
    return removed


class Stopped(BaseException):
    """The recorder was told to stop (SIGTERM, SIGHUP, SIGINT) after its command ended: what
    it was doing is abandoned, its spool directory removed on the way out."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.sig = sig


def stop_on_signals() -> Callable[[], None]:
    """Until the returned function restores them: SIGTERM, SIGHUP and SIGINT raise
    :class:`Stopped` here, so that ``finally`` blocks (the spool directory's removal) run
    before the recorder ends (their default ends it at once, leaving the directory). A
    no-op outside the main thread, where signals are not set."""

    def stop(sig: int, frame: object) -> None:
        raise Stopped(sig)

    return _handle({sig: stop for sig in _STOPS})


def _handle(handlers: Mapping[int, Any]) -> Callable[[], None]:
    """Install ``handlers`` (signal -> handler, or SIG_IGN) and return the function that
    restores the ones they replaced; a no-op outside the main thread, where signals are not
    set."""
    try:
        old = [(sig, _signal.signal(sig, handler)) for sig, handler in handlers.items()]
    except ValueError:  # not the main thread
        return lambda: None

    def restore() -> None:
        for sig, handler in old:
            _signal.signal(sig, handler)
    return restore


def fork_waiting(cmd: Sequence[str], env: Mapping[str, str]) -> tuple[int, int]:
    """Fork a child that says it is ready, waits for the go byte, then execs ``cmd``: (its pid,
    the write end of the go pipe). The recorder attaches counters to the waiting child (with
    inherit, so every process the command creates is counted) before it writes the go byte,
    so the whole command is counted from its first instruction and nothing before it. A fork
    of the recorder, not a new interpreter: ~20 ms less before the command starts. A command
    that cannot be run exits 127 with the reason on stderr; closing the go pipe without the
    byte makes the child exit 125 without running anything."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: only os calls until exec, then nothing of the recorder is left
        try:
            # What Python set for itself is not the command's (subprocess resets these too):
            # a command writing to a closed pipe dies of SIGPIPE, as it would unrecorded.
            for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
                _signal.signal(sig, _signal.SIG_DFL)
            os.close(ready_r)
            os.close(go_w)
            os.write(ready_w, b"r")
            os.close(ready_w)
            if os.read(go_r, 1) != b"g":  # the recorder gave up: do not run the command
                os._exit(125)
            os.close(go_r)
            os.execvpe(cmd[0], list(cmd), dict(env))
        except OSError as exc:
            os.write(2, f"counterd record: cannot run {cmd[0]}: {exc.strerror}\n".encode())
        finally:
            os._exit(127)
    os.close(ready_w)
    os.close(go_r)
    with os.fdopen(ready_r, "rb") as ready:
        ready.read(1)  # the child is blocked on the go pipe: nothing of it is counted below
    return pid, go_w


def spawn(cmd: Sequence[str], env: Mapping[str, str]) -> int:
    """Start ``cmd`` (searched on PATH) with ``env``: its pid; OSError when it cannot be run.
    Counters this process opened on itself with inherit and enable_on_exec
    (:func:`open_plan` with pid 0) pass to the command when it is created and count from its
    exec on, every process it creates included; this process never execs, so its own copy
    counts nothing. posix_spawn (vfork and exec) rather than a fork of the recorder that waits
    for its counters (:func:`fork_waiting`): 1-2 ms less before the command starts."""
    sys.stdout.flush()
    sys.stderr.flush()
    # What Python set for itself is not the command's (subprocess resets these too): a
    # command writing to a closed pipe dies of SIGPIPE, as it would unrecorded.
    return os.posix_spawnp(cmd[0], list(cmd), dict(env),
                           setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ))


def wait(pid: int) -> int:
    """The child's exit code as subprocess gives it (negative: killed by that signal)."""
    _, status = os.waitpid(pid, 0)  # retried after a signal (PEP 475)
    return os.waitstatus_to_exitcode(status)


def outlive_signals(pid: int) -> Callable[[], None]:
    """Until the returned function restores them: ignore SIGINT and SIGQUIT here (Ctrl-C and
    Ctrl-\\ are the recorded command's, in the terminal's process group too) and pass SIGTERM
    and SIGHUP on to the command ``pid`` (``timeout``, ``kill`` or a closed terminal signal
    the recorder alone), so that the recorder outlives them and writes what the command's
    supersteps left, as perf stat does. A no-op outside the main thread, where signals are
    not set."""

    def pass_on(sig: int, frame: object) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:  # it has ended: the recorder's wait returns
            pass

    return _handle({_signal.SIGINT: _signal.SIG_IGN, _signal.SIGQUIT: _signal.SIG_IGN,
                    _signal.SIGTERM: pass_on, _signal.SIGHUP: pass_on})


def wait_exit(pid: int, timeout_s: float) -> bool:
    """Wait until child ``pid`` has exited (not reaping it: :func:`wait` does) or
    ``timeout_s`` has passed; whether it has exited. Where the kernel has no pidfd (before
    Linux 5.3) it returns False at once."""
    import select  # a C module: well under a millisecond

    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return False
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout_s)  # retried after a signal
        return bool(ready)
    finally:
        os.close(pidfd)


# --------------------------------------------------------------------------------------------
# The whole-command perf plan


def plan_dir() -> str | None:
    """Where this user's plan is kept: $XDG_RUNTIME_DIR/counterd (a tmpfs emptied at logout),
    else $XDG_CACHE_HOME/counterd, else ~/.cache/counterd; None without a home."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "counterd")
    cache = os.environ.get("XDG_CACHE_HOME")
    if cache and os.path.isabs(cache):
        return os.path.join(cache, "counterd")
    home = os.path.expanduser("~")
    return os.path.join(home, ".cache", "counterd") if os.path.isabs(home) else None


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def plan_key(procfs: str = "/proc") -> dict[str, str]:
    """What a saved plan holds for: this boot (a PMU appears or goes only with one), kernel,
    ``perf_event_paranoid``, user, and the perf backend's code and event tables as installed
    (names, sizes and modification times of counterd/backends/perf/*)."""
    files = []
    for root, _, names in os.walk(_PERF_DIR):
        for name in sorted(names):
            if name.endswith((".py", ".json")):
                st = os.stat(os.path.join(root, name))
                files.append(f"{os.path.relpath(os.path.join(root, name), _PERF_DIR)}:"
                             f"{st.st_size}:{st.st_mtime_ns}")
    return {"boot_id": _read(os.path.join(procfs, "sys/kernel/random/boot_id")),
            "kernel": os.uname().release,
            "paranoid": _read(os.path.join(procfs, "sys/kernel/perf_event_paranoid")),
            "uid": str(os.getuid()),
            "backend": ";".join(sorted(files))}


def _encode_plan(plan: PerfPlan, key: Mapping[str, str]) -> str:
    lines = [f"{PLAN_FORMAT} {PLAN_VERSION}"]
    lines += [f"key {name} {value}" for name, value in key.items()]
    lines += [f"event {name} {attr.hex()}"
              for name, attr in zip(plan.events, plan.attrs, strict=True)]
    lines += [f"unsupported {name} {why}" for name, why in plan.unsupported.items()]
    lines += ["auto record perf"] if plan.auto else []
    return "".join(line.replace("\n", " ") + "\n" for line in lines)


def _decode_plan(text: str, key: Mapping[str, str]) -> PerfPlan | None:
    """The plan in ``text`` if it was saved under ``key``, else None. The file is lines of
    ``<kind> <name> <value>`` after a ``counterd-perf-plan <version>`` line: read without the
    json module, whose decoder loads re (5 ms here, on the way to the exec)."""
    lines = text.splitlines()
    if not lines or lines[0] != f"{PLAN_FORMAT} {PLAN_VERSION}":
        return None
    saved: dict[str, str] = {}
    events: list[str] = []
    attrs: list[bytes] = []
    unsupported: dict[str, str] = {}
    auto = False
    for line in lines[1:]:
        kind, name, value = line.split(" ", 2)
        if kind == "key":
            saved[name] = value
        elif kind == "event":
            events.append(name)
            attrs.append(bytes.fromhex(value))
        elif kind == "unsupported":
            unsupported[name] = value
        elif kind == "auto" and (name, value) == ("record", "perf"):
            auto = True
        else:
            return None
    return PerfPlan(events, attrs, unsupported, auto) if saved == dict(key) else None


def load_plan(directory: str | None = None, key: Mapping[str, str] | None = None
              ) -> PerfPlan | None:
    """The plan saved for this host as it is now, or None: none saved, saved for another boot,
    kernel, setting or version of counterd, or a file that is not this user's own or not a
    plan (never an error: the recorder then works the plan out again)."""
    directory = directory or plan_dir()
    if directory is None:
        return None
    try:
        fd = os.open(os.path.join(directory, PLAN_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o022 or st.st_size > 1 << 20:
            return None
        text = os.read(fd, st.st_size + 1).decode("utf-8")
        return _decode_plan(text, key if key is not None else plan_key())
    except (OSError, ValueError):  # ValueError: not UTF-8, a short line, bad hex
        return None
    finally:
        os.close(fd)


def save_plan(plan: PerfPlan, directory: str | None = None,
              key: Mapping[str, str] | None = None) -> str | None:
    """Keep ``plan`` for the next recording (atomically, mode 0600); its path, or None when
    there is nowhere to keep it (a cache: failing to write it changes nothing else)."""
    directory = directory or plan_dir()
    if directory is None:
        return None
    text = _encode_plan(plan, key if key is not None else plan_key())
    path = os.path.join(directory, PLAN_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        return path
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None


def read_plan(fds: Sequence[int]) -> list[tuple[int, int, int]]:
    """``(value, time_enabled, time_running)`` of each counter :func:`open_plan` opened, in
    its order (a plan's attributes ask for TOTAL_TIME_ENABLED|TOTAL_TIME_RUNNING|ID)."""
    return [parse_single_read(os.read(fd, 32))[:3] for fd in fds]


def open_plan(plan: PerfPlan, pid: int) -> tuple[list[int], dict[str, int]]:
    """Open every attribute of ``plan`` on process ``pid`` (0: this one, whose children
    inherit them; any CPU): (the fds of those that opened, in plan order; errno of each that
    did not, by counter name)."""
    number = PERF_EVENT_OPEN_NR.get(os.uname().machine)
    fds: list[int] = []
    failed: dict[str, int] = {}
    for name, attr in zip(plan.events, plan.attrs, strict=True):
        if number is None:
            failed[name] = errno.ENOSYS
            continue
        # The kernel reads attr.size bytes (offset 4) from the buffer: never more than it has.
        if len(attr) < PERF_ATTR_SIZE_VER0 or int.from_bytes(attr[4:8], "little") != len(attr):
            failed[name] = errno.EINVAL
            continue
        try:
            fds.append(perf_event_open(attr, pid))
        except OSError as exc:
            failed[name] = exc.errno or errno.EIO
    return fds, failed
