"""A hostile local user and broken files against a live ``counterd run`` (issue "Reliability").

    .venv/bin/python bench/attacks.py [--only CATEGORY] [--quick] [--strict]

Starts ``counterd run --config FILE`` on temp paths (as bench/_daemon.py does), then runs every
attack of the issue, grouped in its categories: protocol and floods, authorisation,
durability, bad files, signals, marker misuse, recorder, fairness and quotas (floods by uid
65534 while a victim of uid 65533 connects afresh, sends RECORD and SYNC and times the ACK:
its worst acknowledgement must be <= 1 s, 2.5 s with --quick, and its records stored; the
daemon's RSS may grow 64 MB at most). After each attack it checks what the issue's
target names: the daemon process is alive, ``/metrics`` answers 200, and a canary (a fresh
:class:`counterd.markers.sinks.socket.SocketSink` sending 5 records) gets ``flush() == True`` and
its 5 records are in the store (read with SQLite in read-only mode). An attack FAILS when one
of these does not hold or when its own expectation does not (the frame was not refused with
an ERROR, RSS or the log grew beyond a bound, a record of a forbidden run was stored, a file
command printed a traceback or exited other than 0/2, ...). A daemon left dead or not serving
is killed and restarted on the same store, so one failure does not hide the next.

Prints one line per check (category, name, ok/FAILED/skipped, why), then the tally table
(category | tried | failed) and the host line. Exits 0 (it is a measurement); ``--strict``
exits 1 if anything failed. ``--quick`` scales the floods down and skips the slowloris (30 s).

Attacks that need a second user (run id squat, reading others' runs, counting on behalf of a
setuid program, idle connections from one user, a client's pid reused by a member of
``socket.allowed_group``, another user's workload labels) fork and ``setuid`` to uids 65534
and 65533; run as root for them (they are reported as skipped otherwise). Disk full needs
root too (a small tmpfs).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import resource
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _hostile_spool  # noqa: E402
from _daemon import free_port  # noqa: E402
from _host import host_line  # noqa: E402

import counterd  # noqa: E402
from counterd.data.records import SuperstepRecord  # noqa: E402
from counterd.markers.sinks.socket import SocketSink  # noqa: E402
from counterd.wire import protocol  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
HOST = socket.gethostname()
NOBODY = 65534  # the hostile user
OTHER = 65533  # a second unprivileged user (the victim of a squat)
CATEGORIES = ("protocol and floods", "authorisation", "durability", "bad files", "signals",
              "marker misuse", "recorder", "fairness and quotas")
REPLY_TIMEOUT_S = 5.0
F = protocol.FrameType


# -- the daemon under attack ----------------------------------------------------------------
class LiveDaemon:
    """``counterd run --config <dir>/counterd.toml`` with its socket in ``dir`` (0755, so other
    users reach it) and its store in ``dir/state/`` (created by the daemon: its mode is the
    daemon's doing). ``nofile`` lowers RLIMIT_NOFILE of the daemon."""

    def __init__(self, directory: Path, *, src: Path = ROOT, extra: str = "",
                 nofile: int | None = None, store_dir: Path | None = None,
                 socket_extra: str = "") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o755)
        self.dir = directory
        self.socket = directory / "counterd.sock"
        self.store = (store_dir or directory / "state") / "counterd.db"
        self.config = directory / "counterd.toml"
        self.log = directory / "daemon.log"
        self.port = free_port()
        self.nofile = nofile
        self.extra = extra
        self.socket_extra = socket_extra  # more keys of [socket] (e.g. allowed_group)
        self.src = src
        self.write_config()
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self, extra: str | None = None) -> None:
        self.config.write_text(
            f'log_level = "info"\n[metrics]\nlisten = "127.0.0.1:{self.port}"\nrefresh_s = 0.2\n'
            f'[socket]\npath = "{self.socket}"\n{self.socket_extra}'
            f'[store]\npath = "{self.store}"\n'
            f'[sampling]\ninterval_s = 1.0\n' + (self.extra if extra is None else extra))

    def start(self, timeout_s: float = 20.0) -> LiveDaemon:
        env = _env(self.src)
        limit = self.nofile

        def lower_nofile() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        self.proc = subprocess.Popen([PY, "-m", "counterd.commands.cli", "run", "--config",
                                      str(self.config)], env=env, cwd=self.src,
                                     stdout=subprocess.DEVNULL, stderr=self.log.open("ab"),
                                     preexec_fn=lower_nofile)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"counterd run exited {self.proc.returncode}: "
                                   + self.log_text()[-1500:])
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(self.socket))
                if self.metrics_ok():
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("counterd run did not become ready: " + self.log_text()[-1500:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def metrics_ok(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=3) as r:
                r.read()
                return bool(r.status == 200)
        except OSError:
            return False

    def rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_lines(self) -> int:
        with self.log.open("rb") as fh:
            return sum(1 for _ in fh)


def _env(src: Path) -> dict[str, str]:
    """The environment of the commands under attack: no COUNTERD_* of ours, the code of
    ``src`` (``python -m`` also imports from its working directory)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env["PYTHONPATH"] = str(src)
    return env


# -- the store, read as a reader would --------------------------------------------------------
def stored(store: Path, run_id: str) -> list[dict[str, Any]]:
    """The records of ``run_id`` (matched as a substring, so a uid-namespaced run id still
    counts) in the store, as their JSON bodies; [] if there is no store yet."""
    if not store.exists():
        return []
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)
    try:
        rows = conn.execute("SELECT body FROM records WHERE instr(run_id, ?) > 0",
                            (run_id,)).fetchall()
    finally:
        conn.close()
    return [json.loads(b) for (b,) in rows]


def new_run(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:12]}"


def make_record(run_id: str, index: int = 0, pid: int | None = None) -> SuperstepRecord:
    t = time.monotonic_ns()
    return SuperstepRecord(run_id=run_id, index=index, name="attack", rank=0,
                           pid=os.getpid() if pid is None else pid, cpu=0, begin_ns=t,
                           end_ns=t + 1000, host=HOST)


def canary(d: LiveDaemon, n: int = 5) -> str | None:
    """A fresh client's ``n`` records: None if flush() is True and all are in the store."""
    run_id = new_run("canary")
    try:
        sink = SocketSink(d.socket, job="canary", timeout_s=REPLY_TIMEOUT_S)
    except (OSError, ConnectionError) as exc:
        return f"canary cannot connect ({exc})"
    try:
        for i in range(n):
            sink.record(make_record(run_id, i))
        flushed = sink.flush(10.0)
        refused = [why for _, why in sink.refused]
    except Exception as exc:  # the canary measures: whatever breaks is the finding
        return f"canary raised {type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            sink.close(1.0)
    got = len(stored(d.store, run_id))
    if not flushed or got != n:
        return (f"canary: flush() {flushed}, {got} of {n} records stored"
                + (f", refused: {refused[0]}" if refused else ""))
    return None


def health(d: LiveDaemon) -> list[str]:
    """The target's three conditions, as failure reasons."""
    if not d.alive():
        code = d.proc.returncode if d.proc is not None else None
        tail = [ln for ln in d.log_text().splitlines() if ln.strip()][-1:]
        return [f"daemon died (exit {code}; {tail[0][:160] if tail else 'no log'})"]
    why = []
    if not d.metrics_ok():
        why.append("/metrics does not answer 200")
    c = canary(d)
    if c:
        why.append(c)
    return why


# -- raw protocol -----------------------------------------------------------------------------
def frame(ftype: int, body: bytes, version: int = protocol.PROTOCOL_VERSION) -> bytes:
    return protocol.HEADER.pack(len(body) + 2, version, ftype) + body


def jframe(ftype: int, text: str, version: int = protocol.PROTOCOL_VERSION) -> bytes:
    """A frame whose payload is ``text`` as written (lone-surrogate escapes, Infinity, ...)."""
    return frame(ftype, text.encode("utf-8", "surrogatepass"), version)


def record_text(run_id: str, raw: dict[str, str] | None = None, seq: int = 1) -> str:
    """A RECORD payload; ``raw`` replaces fields of the record with JSON text as written."""
    raw = raw or {}
    body = make_record(run_id).to_json()
    body["counters"] = {"task_clock": {"value": 1.0, "source": "measured", "ratio": 1.0,
                                       "raw": 1}}
    marks = {}
    for k in raw:
        marks[k] = f"@@{k}@@"
        body[k] = marks[k]
    out = json.dumps({"s": seq, "rec": body}, separators=(",", ":"))
    for k, text in raw.items():
        out = out.replace(json.dumps(marks[k]), text)
    return out


class Conn:
    """One raw client connection; ``replies()`` collects what the daemon answers."""

    def __init__(self, path: Path, hello: bool = True, job: str = "attack") -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(REPLY_TIMEOUT_S)
        self.sock.connect(str(path))
        self.decoder = protocol.Decoder(max_frame=1 << 24, versions=protocol.ACCEPTED_VERSIONS)
        self.frames: list[tuple[protocol.FrameType, Any]] = []
        self.closed = False
        if hello:
            self.send(protocol.encode(F.HELLO, {"pid": os.getpid(), "host": HOST, "job": job}))
            if self.wait(lambda: any(t is F.WELCOME for t, _ in self.frames)) is not True:
                raise ConnectionError("no WELCOME")

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def _read(self, timeout_s: float) -> None:
        self.sock.settimeout(max(timeout_s, 0.01))
        try:
            data = self.sock.recv(1 << 20)
        except TimeoutError:
            return
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return
        self.decoder.feed(data)
        with contextlib.suppress(protocol.ProtocolError):
            self.frames.extend(self.decoder.frames())

    def wait(self, done: Callable[[], bool], timeout_s: float = REPLY_TIMEOUT_S) -> bool | str:
        """True once ``done()``; "closed" if the daemon closed first; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if self.closed:
                return "closed"
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._read(min(left, 0.5))
        return True

    def errors(self) -> list[dict[str, Any]]:
        return [p for t, p in self.frames if t is F.ERROR]

    def acked(self) -> int:
        return max((int(p["s"]) for t, p in self.frames if t is F.ACK), default=0)

    def outcome(self, seq: int, sync: int | None = None) -> str:
        """What became of frame ``seq``: "error CODE", "ack", "closed" or "no answer" (a SYNC
        ``sync`` is sent to have the daemon acknowledge it otherwise)."""
        if sync is not None:
            self.send(jframe(F.SYNC, json.dumps({"s": sync})))
        target = seq if sync is None else sync

        def answered() -> bool:
            return any(p.get("s") in (seq, None) for p in self.errors()) \
                or self.acked() >= target

        got = self.wait(answered)
        for p in self.errors():
            if p.get("s") in (seq, None):
                return f"error {p.get('code')}"
        if self.acked() >= target:
            return "ack"
        return "closed" if got == "closed" else "no answer"

    def close(self) -> None:
        self.sock.close()


def expect(result: str, allowed: tuple[str, ...], what: str) -> str | None:
    """None if ``result`` starts with one of ``allowed``, else why the attack failed."""
    if result.startswith(allowed):
        return None
    return f"{what}: {result} (wanted {' or '.join(allowed)})"


# -- other users ------------------------------------------------------------------------------
class Child:
    """``fn(chan, *args, **kwargs)`` in a forked process, as ``uid`` if given; ``chan.send(obj)`` /
    ``chan.recv()`` talk JSON lines with the parent (``send``/``recv`` here)."""

    def __init__(self, fn: Callable[..., Any], *args: Any, uid: int | None = None,
                 **kwargs: Any) -> None:
        up_r, up_w = os.pipe()
        down_r, down_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child
            code = 0
            try:
                os.close(up_r)
                os.close(down_w)
                if uid is not None:
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                chan = _Chan(os.fdopen(down_r, "r"), os.fdopen(up_w, "w"))
                result = fn(chan, *args, **kwargs)
                chan.send({"result": result})
            except BaseException as exc:
                with contextlib.suppress(BaseException):
                    os.write(up_w, (json.dumps({"error": f"{type(exc).__name__}: {exc}",
                                                "tb": traceback.format_exc()[-800:]})
                                    + "\n").encode())
                code = 1
            finally:
                os._exit(code)
        os.close(up_w)
        os.close(down_r)
        self.chan = _Chan(os.fdopen(up_r, "r"), os.fdopen(down_w, "w"))

    def send(self, obj: Any) -> None:
        self.chan.send(obj)

    def recv(self, timeout_s: float = 60.0) -> Any:
        return self.chan.recv(timeout_s)

    def result(self, timeout_s: float = 120.0) -> Any:
        """The child's return value; raises RuntimeError with its exception."""
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self.recv(max(deadline - time.monotonic(), 0.1))
            if msg is None:
                self.kill()
                raise RuntimeError("the child did not finish in time")
            if "error" in msg:
                self.reap()
                raise RuntimeError(msg["error"])
            if "result" in msg:
                self.reap()
                return msg["result"]

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.reap()

    def reap(self) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


class _Chan:
    def __init__(self, r: Any, w: Any) -> None:
        self.r, self.w = r, w

    def send(self, obj: Any) -> None:
        self.w.write(json.dumps(obj) + "\n")
        self.w.flush()

    def recv(self, timeout_s: float = 60.0) -> Any:
        import select

        if not select.select([self.r], [], [], timeout_s)[0]:
            return None
        line = self.r.readline()
        return json.loads(line) if line else {"error": "the child exited"}


def as_root() -> bool:
    return os.geteuid() == 0


def _mount_tmpfs(lab: Lab, name: str, size: str) -> Path | Check:
    """A small tmpfs at ``lab.tmp/name`` (a full disk on demand), or the check that skips the
    attack and says why (not root, no tmpfs). Unmount it with :func:`_umount`."""
    if not as_root():
        return Check("", "not root: cannot mount a tmpfs", True)
    mnt = lab.tmp / name
    mnt.mkdir(exist_ok=True)
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                       check=True, capture_output=True)
    except (subprocess.CalledProcessError, OSError) as exc:
        return Check("", f"cannot mount a tmpfs ({exc})", True)
    return mnt


def _umount(mnt: Path) -> None:
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# -- marker programs (forked; each its own recorder, as a user's program) -----------------------
def marker_program(chan: _Chan, sock: str, run_id: str, *, steps: int = 0,
                   until: float = 0.0, backend: str = "none", pace_s: float = 0.0,
                   params: dict[str, Any] | None = None, wait_inside: bool = False,
                   bad_param: str = "") -> dict[str, Any]:
    """A user's program marking supersteps through the daemon. Returns what it saw: total
    supersteps, the slowest marker call, the exception a marker raised (if any), flush(),
    the acknowledgement times (CLOCK_MONOTONIC, comparable with the parent's), the records
    still unacknowledged before flush and the high-water mark."""
    from counterd.markers.api import recorder

    counterd.configure(backend=backend, socket=sock, run_id=run_id)
    sink = recorder().sink
    acks: list[tuple[int, float]] = []
    if hasattr(sink, "on_ack"):
        def on_ack(recs: list[SuperstepRecord]) -> None:
            now = time.monotonic()
            acks.extend((r.index, now) for r in recs)
        sink.on_ack = on_ack
    extra: dict[str, Any] = dict(params or {})
    if bad_param == "nan":
        extra["x"] = float("nan")
    elif bad_param == "inf":
        extra["x"] = float("inf")
    elif bad_param == "huge":
        extra["x"] = "p" * (400 * 1024)
    slowest, raised, i = 0.0, "", 0
    try:
        while (steps and i < steps) or (until and time.monotonic() < until):
            t0 = time.monotonic()
            with counterd.superstep("w", **extra):
                if wait_inside:
                    chan.send({"inside": True})
                    chan.recv(120)
            slowest = max(slowest, time.monotonic() - t0)
            i += 1
            if pace_s:
                time.sleep(pace_s)
    except Exception as exc:  # the finding: a marker raised into the program
        raised = f"{type(exc).__name__}: {exc}"
    unacked = len(getattr(sink, "unacked", ()))
    high_water = int(getattr(sink, "high_water", 0))
    flushed = bool(sink.flush(60.0)) if hasattr(sink, "flush") else False
    return {"total": i, "slowest_s": slowest, "raised": raised, "flushed": flushed,
            "acks": acks, "unacked": unacked, "high_water": high_water,
            "sink": type(sink).__name__, "degraded": getattr(sink, "degraded", None)}


def writers(d: LiveDaemon, n: int, seconds: float, tag: str) -> list[tuple[str, Child]]:
    until = time.monotonic() + seconds
    out = []
    for w in range(n):
        run_id = new_run(f"{tag}{w}")
        out.append((run_id, Child(marker_program, str(d.socket), run_id, until=until,
                                  pace_s=0.0005)))
    return out


def lost(d: LiveDaemon, runs: list[tuple[str, Child]], cut: float
         ) -> tuple[int, int, int, int, list[str]]:
    """(acknowledged before ``cut``, of them missing from the store, total marked, total
    missing from the store, what the writers raised)."""
    acked = missing_acked = total = missing = 0
    raised = []
    for run_id, child in runs:
        try:
            res = child.result(180)
        except RuntimeError as exc:
            raised.append(str(exc))
            continue
        if res["raised"]:
            raised.append(res["raised"])
        have = {int(r["index"]) for r in stored(d.store, run_id)}
        before = {i for i, t in res["acks"] if t < cut}
        acked += len(before)
        missing_acked += len(before - have)
        total += res["total"]
        missing += len(set(range(res["total"])) - have)
    return acked, missing_acked, total, missing, raised


# -- the lab -----------------------------------------------------------------------------------
@dataclass
class Check:
    name: str
    why: str | None  # None: ok
    skipped: bool = False


@dataclass
class Lab:
    tmp: Path
    quick: bool
    daemon: LiveDaemon
    src: Path = ROOT  # the tree whose daemon and file commands are attacked
    files: dict[str, Path] = field(default_factory=dict)

    def scale(self, full: int, quick: int) -> int:
        return quick if self.quick else full

    def special(self, name: str, **kw: Any) -> LiveDaemon:
        return LiveDaemon(self.tmp / name, src=self.src, **kw)


Attack = Callable[[Lab], list[Check]]
ATTACKS: list[tuple[str, str, Attack]] = []


def attack(category: str, name: str) -> Callable[[Attack], Attack]:
    assert category in CATEGORIES

    def register(fn: Attack) -> Attack:
        ATTACKS.append((category, name, fn))
        return fn
    return register


def one(name: str, *reasons: str | None) -> list[Check]:
    why = "; ".join(r for r in reasons if r)
    return [Check(name, why or None)]


# -- protocol and floods ------------------------------------------------------------------------
DEEP = "[" * 100_000


@attack("protocol and floods", "100k nested [ before HELLO")
def nested_before_hello(lab: Lab) -> list[Check]:
    c = Conn(lab.daemon.socket, hello=False)
    c.send(jframe(F.HELLO, DEEP))
    got = c.wait(lambda: bool(c.errors()))
    c.close()
    return one("", None if got is True else f"no ERROR frame ({got or 'no answer'})")


@attack("protocol and floods", "100k nested [ after HELLO")
def nested_after_hello(lab: Lab) -> list[Check]:
    c = Conn(lab.daemon.socket)
    c.send(jframe(F.RECORD, '{"s":1,"rec":' + DEEP))
    got = c.wait(lambda: bool(c.errors()))
    c.close()
    return one("", None if got is True else f"no ERROR frame ({got or 'no answer'})")


def _refused(lab: Lab, payload: str, ftype: int = F.RECORD,
             allowed: tuple[str, ...] = ("error",), job: str = "attack") -> str | None:
    c = Conn(lab.daemon.socket, job=job)
    c.send(jframe(ftype, payload))
    result = c.outcome(1, sync=2)
    c.close()
    return expect(result, allowed, "frame 1")


RECORD_ATTACKS = {
    'RECORD "counters": []': {"counters": "[]"},
    "RECORD begin_ns Infinity": {"begin_ns": "Infinity"},
    "RECORD begin_ns 1e400": {"begin_ns": "1e400"},
    "RECORD NaN counter": {"counters": '{"task_clock":{"value":NaN,"source":"measured"}}'},
    "RECORD index 10**30": {"index": str(10**30)},
}
# Refused, or stored (with the name made storable): either way answered and the writer alive.
RECORD_STORABLE = {
    'RECORD name "\\ud800" (JSON escape)': {"name": '"\\ud800"'},
    "RECORD name raw bytes ED A0 80": {"name": '"\udced\udca0\udc80"'},  # surrogateescape
}


def _record_attack(raw: dict[str, str], allowed: tuple[str, ...]) -> Attack:
    def run(lab: Lab) -> list[Check]:
        text = record_text(new_run("hostile"), raw)
        if "\udced" in text:  # the raw bytes ED A0 80, not valid UTF-8
            text_bytes = text.encode("utf-8", "surrogateescape")
            c = Conn(lab.daemon.socket)
            c.send(frame(F.RECORD, text_bytes))
            result = c.outcome(1, sync=2)
            c.close()
            return one("", expect(result, allowed, "frame 1"))
        return one("", _refused(lab, text, allowed=allowed))
    return run


for _name, _raw in RECORD_ATTACKS.items():
    attack("protocol and floods", _name)(_record_attack(_raw, ("error",)))
for _name, _raw in RECORD_STORABLE.items():
    attack("protocol and floods", _name)(_record_attack(_raw, ("error", "ack")))


@attack("protocol and floods", "READ pid 1e400")
def read_pid_1e400(lab: Lab) -> list[Check]:
    return one("", _refused(lab, '{"s":1,"pid":1e400,"count":[]}', F.READ))


def _begin_line(run_id: str, **raw: str) -> str:
    line = {"run_id": run_id, "index": 0, "name": "b", "rank": 0, "pid": os.getpid(), "cpu": 0,
            "begin_ns": time.monotonic_ns(), "params": {}, "backend": "none", "host": HOST}
    text = json.dumps({"s": 1, "line": line}, separators=(",", ":"))
    for k, v in raw.items():
        text = text.replace(f'"{k}":{json.dumps(line[k])}', f'"{k}":{v}')
    return text


@attack("protocol and floods", "BEGIN index 1e999")
def begin_index_1e999(lab: Lab) -> list[Check]:
    return one("", _refused(lab, _begin_line(new_run("hostile"), index="1e999"), F.BEGIN))


def _context(seq: int, c: int, run_id: str) -> bytes:
    return protocol.encode(F.CONTEXT, {"s": seq, "c": c, "run_id": run_id, "pid": os.getpid(),
                                       "host": HOST, "backend": "none", "counters": []})


@attack("protocol and floods", "OPEN/CLOSE index 2**64-1")
def open_close_huge_index(lab: Lab) -> list[Check]:
    c = Conn(lab.daemon.socket)
    top = 2**64 - 1
    t = time.monotonic_ns()
    c.send(_context(1, 1, new_run("hostile")))
    c.send(protocol.encode_open(2, 1, top, t, 0, 0, "huge"))
    c.send(protocol.encode_close(3, 1, top, t, t + 10, 0))
    result = c.outcome(3, sync=4)
    c.close()
    return one("", expect(result, ("error", "ack"), "CLOSE"))


@attack("protocol and floods", 'HELLO job "\\ud800x"')
def hello_job_surrogate(lab: Lab) -> list[Check]:
    c = Conn(lab.daemon.socket, hello=False)
    c.send(jframe(F.HELLO, '{"pid":1,"host":"h","job":"\\ud800x"}'))
    if c.wait(lambda: any(t is F.WELCOME for t, _ in c.frames)) is not True:
        refused = bool(c.errors())
        c.close()
        return one("", None if refused else "HELLO neither answered nor refused")
    c.send(jframe(F.RECORD, record_text(new_run("hostile"))))
    result = c.outcome(1, sync=2)
    c.close()
    return one("", expect(result, ("error", "ack"), "RECORD after the HELLO"))


@attack("protocol and floods", "random bytes (50 connections)")
def random_bytes(lab: Lab) -> list[Check]:
    rng = random.Random(4)
    conns = [Conn(lab.daemon.socket, hello=bool(i % 2)) for i in range(50)]
    for c in conns:
        c.send(rng.randbytes(4096))
    hung = sum(1 for c in conns if _hangs(c))
    for c in conns:
        c.close()
    return one("", f"{hung} of 50 connections neither refused nor closed" if hung else None)


def _hangs(c: Conn) -> bool:
    """Neither refused (ERROR) nor closed within 15 s (the HELLO timeout is 10 s)."""
    return c.wait(lambda: bool(c.errors()), 15.0) is False


@attack("protocol and floods", "truncated frame, then close")
def truncated(lab: Lab) -> list[Check]:
    c = Conn(lab.daemon.socket)
    full = jframe(F.RECORD, record_text(new_run("hostile")))
    c.send(full[: len(full) // 2])
    c.close()
    return one("")


@attack("protocol and floods", "oversized frame (length 2**31)")
def oversized(lab: Lab) -> list[Check]:
    c = Conn(lab.daemon.socket)
    c.send(struct.pack("!IBB", 2**31, 2, F.RECORD) + b"{" * 1024)
    got = c.wait(lambda: bool(c.errors()))
    code = c.errors()[0].get("code") if c.errors() else got
    c.close()
    return one("", None if got is True else f"not refused ({code})")


@attack("protocol and floods", "bad versions (99 first; 1 then 2)")
def bad_versions(lab: Lab) -> list[Check]:
    why = []
    c = Conn(lab.daemon.socket, hello=False)
    c.send(jframe(F.HELLO, '{"pid":1}', version=99))
    if c.wait(lambda: bool(c.errors())) is not True:
        why.append("version 99 not refused")
    c.close()
    c = Conn(lab.daemon.socket, hello=False)
    c.send(jframe(F.HELLO, '{"pid":1}', version=1))
    c.send(jframe(F.SYNC, '{"s":1}', version=2))
    if c.wait(lambda: bool(c.errors())) is not True:
        why.append("a version change inside a stream not refused")
    c.close()
    return one("", *why)


@attack("protocol and floods", "1030 idle connections after HELLO from one user")
def idle_connections(lab: Lab) -> list[Check]:
    n = 1030
    if not as_root():
        return [Check("", "not root: cannot open them as another uid; run as root", True)]
    child = Child(_hold_idle, str(lab.daemon.socket), n, uid=NOBODY)
    got = child.recv(120)
    held = int(got.get("held", 0)) if got else 0
    why = [None if held else f"the holder failed: {got}"]
    why.append(canary(lab.daemon))  # while they are held: another user must still get in
    child.send({"release": True})
    with contextlib.suppress(RuntimeError):
        child.result(60)
    refused = int(got.get("refused", 0)) if got else 0
    return one(f"uid {NOBODY}: {held} held, {refused} refused", *why)


def _hold_idle(chan: _Chan, sock: str, n: int) -> dict[str, Any]:
    """Open ``n`` connections, each welcomed (accepted and past HELLO) or refused, and hold
    the welcomed ones idle until the parent says so."""
    conns, refused = [], 0
    for _ in range(n):
        try:
            c = Conn(Path(sock), job="idle")
            conns.append(c)
        except (OSError, ConnectionError):
            refused += 1
    chan.send({"held": len(conns), "refused": refused})
    chan.recv(300)
    for c in conns:
        c.close()
    return {"held": len(conns)}


@attack("protocol and floods", "fd exhaustion (RLIMIT_NOFILE 64): EMFILE")
def fd_exhaustion(lab: Lab) -> list[Check]:
    d = lab.special("emfile", nofile=64).start()
    try:
        conns = []
        for _ in range(120):  # beyond the daemon's 64 descriptors; the backlog takes them
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(2)
            try:
                s.connect(str(d.socket))
                s.sendall(protocol.encode(F.HELLO, {"pid": os.getpid(), "job": "fd"}))
            except OSError:
                s.close()
                break
            conns.append(s)
        time.sleep(0.5)
        window = lab.scale(5, 3)
        cpu0, lines0, t0 = d.cpu_seconds(), d.log_lines(), time.monotonic()
        time.sleep(window)
        dt = time.monotonic() - t0
        cpu = (d.cpu_seconds() - cpu0) / dt * 100
        lines = (d.log_lines() - lines0) / dt
        metrics = d.metrics_ok()
        for s in conns:
            s.close()
        time.sleep(0.5)
        why = [f"{cpu:.0f}% CPU" if cpu > 20 else None,
               f"{lines:.0f} log lines/s" if lines > 100 else None,
               None if metrics else "/metrics unreachable at the fd limit", *health(d)]
        note = f"{len(conns)} connections, {cpu:.0f}% CPU, {lines:.1f} log lines/s"
        return one(note, *why)
    finally:
        d.stop()


@attack("protocol and floods", "500 open BEGINs with 200 KB params")
def big_begins(lab: Lab) -> list[Check]:
    d = lab.daemon
    before = d.rss_bytes()
    c = Conn(d.socket)
    run_id = new_run("big")
    pad = "x" * (200 * 1024)
    stop = threading.Event()
    reader = threading.Thread(target=_drain, args=(c, stop), daemon=True)
    reader.start()
    for i in range(500):
        text = _begin_line(run_id).replace('"params":{}', f'"params":{{"p":"{pad}"}}')
        text = text.replace('"s":1', f'"s":{i + 1}').replace('"index":0', f'"index":{i}')
        if not c.send(jframe(F.BEGIN, text)):
            break
    time.sleep(1.0)
    grown = (d.rss_bytes() - before) / 2**20
    stop.set()
    reader.join(5)
    c.close()
    return one(f"RSS +{grown:.0f} MB", f"RSS grew by {grown:.0f} MB (bound 50)"
               if grown > 50 else None)


def _drain(c: Conn, stop: threading.Event) -> None:
    while not stop.is_set() and not c.closed:
        c._read(0.2)


@attack("protocol and floods", "CONTEXT frames with distinct run ids, then disconnect")
def context_flood(lab: Lab) -> list[Check]:
    d = lab.daemon
    n = lab.scale(200_000, 50_000)
    before = d.rss_bytes()
    c = Conn(d.socket)
    stop = threading.Event()
    reader = threading.Thread(target=_drain, args=(c, stop), daemon=True)
    reader.start()
    prefix = uuid.uuid4().hex[:8]
    batch = []
    for i in range(n):
        batch.append(_context(i + 1, i % 0xFFFF + 1, f"ctx-{prefix}-{i}"))
        if len(batch) == 1000:
            if not c.send(b"".join(batch)):
                break
            batch = []
    c.send(b"".join(batch))
    c.outcome(n, sync=n + 1)
    stop.set()
    reader.join(5)
    c.close()
    time.sleep(2.0)
    grown = (d.rss_bytes() - before) / 2**20
    bound = 20 if n == 200_000 else 20 * n / 200_000
    return one(f"{n} contexts, RSS +{grown:.0f} MB after disconnect",
               f"RSS stays {grown:.0f} MB above the baseline (bound {bound:.0f})"
               if grown > bound else None)


@attack("protocol and floods", "slowloris (1 byte/s inside a frame)")
def slowloris(lab: Lab) -> list[Check]:
    if lab.quick:
        return [Check("", "--quick (takes 30 s)", True)]
    c = Conn(lab.daemon.socket)
    full = jframe(F.RECORD, record_text(new_run("slow")))
    t0 = time.monotonic()
    for b in full[:-1]:
        if not c.send(bytes([b])) or time.monotonic() - t0 > 60:
            break
        c._read(1.0)
        if c.closed:
            break
    took = time.monotonic() - t0
    c.close()
    return one(f"dropped after {took:.0f} s", None if took < 45 else "not dropped in 45 s")


@attack("protocol and floods", "connect-and-drop flood")
def connect_drop(lab: Lab) -> list[Check]:
    n = lab.scale(10_000, 2_000)
    for _ in range(n):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            with contextlib.suppress(OSError):
                s.connect(str(lab.daemon.socket))
    return one(f"{n} connections")


# -- authorisation ------------------------------------------------------------------------------
def _squat(chan: _Chan, sock: str, run_id: str) -> str:
    c = Conn(Path(sock), job="squatter")
    c.send(jframe(F.RECORD, record_text(run_id)))
    out = c.outcome(1, sync=2)
    c.close()
    return out


def _owner(chan: _Chan, sock: str, run_id: str) -> dict[str, Any]:
    sink = SocketSink(sock, job="owner", timeout_s=REPLY_TIMEOUT_S)
    for i in range(5):
        sink.record(make_record(run_id, i + 1))
    ok = sink.flush(10)
    refused = [why for _, why in sink.refused]
    sink.close(1)
    return {"flushed": ok, "refused": refused, "pid": os.getpid()}


@attack("authorisation", "run id squat by another user")
def run_id_squat(lab: Lab) -> list[Check]:
    if not as_root():
        return [Check("", "not root: needs two other uids", True)]
    run_id = new_run("squatted")
    squat = Child(_squat, str(lab.daemon.socket), run_id, uid=NOBODY).result(30)
    owner = Child(_owner, str(lab.daemon.socket), run_id, uid=OTHER).result(30)
    mine = [r for r in stored(lab.daemon.store, run_id) if r["pid"] == owner["pid"]]
    why = []
    if len(mine) != 5:
        why.append(f"{len(mine)} of the owner's 5 records stored"
                   + (f" ({owner['refused'][0]})" if owner["refused"] else ""))
    if owner["flushed"] and owner["refused"]:
        why.append("flush() returned True although records were refused")
    return one(f"squatter's RECORD: {squat}", *why)


def _behalf(chan: _Chan, sock: str, run_id: str, suid: str) -> dict[str, Any]:
    """Count this process on its behalf, fork a child that keeps the connection, exec a
    setuid-root program; the child then ends the superstep."""
    c = Conn(Path(sock), job="behalf")
    me = os.getpid()
    line = json.loads(_begin_line(run_id))["line"]
    line["tid"] = me
    c.send(protocol.encode(F.BEGIN, {"s": 1, "line": line, "count": []}))
    if c.wait(lambda: any(t is F.STARTED or t is F.ERROR for t, _ in c.frames)) is not True:
        return {"started": "no answer"}
    started = next(p for t, p in c.frames if t in (F.STARTED, F.ERROR))
    if started.get("unsupported") or "code" in started:
        return {"started": started}
    r, w = os.pipe()
    if os.fork() == 0:  # the child: ends the superstep once the parent is a setuid program
        os.close(w)
        os.read(r, 1)
        time.sleep(0.8)
        rec = make_record(run_id, 0, pid=me).to_json()
        rec["begin_ns"] = line["begin_ns"]
        rec["end_ns"] = time.monotonic_ns()
        c.send(protocol.encode(F.RECORD, {"s": 2, "rec": rec}))
        out = c.outcome(2, sync=3)
        chan.send({"result": {"started": started, "record": out}})
        os._exit(0)
    os.close(r)
    os.write(w, b"x")
    os.execv(suid, [suid, "2"])
    return {}  # not reached


@attack("authorisation", "counting on behalf: fork, parent execs a setuid program")
def behalf_setuid_exec(lab: Lab) -> list[Check]:
    if not as_root():
        return [Check("", "not root: needs a setuid-root program and another uid", True)]
    suid = lab.tmp / "suid-sleep"
    shutil.copy("/bin/sleep", suid)
    os.chown(suid, 0, 0)
    os.chmod(suid, 0o4755)
    run_id = new_run("behalf")
    res = Child(_behalf, str(lab.daemon.socket), run_id, str(suid), uid=NOBODY).result(60)
    if "record" not in res:
        return [Check("", f"the daemon cannot count here: {res.get('started')}", True)]
    recs = stored(lab.daemon.store, run_id)
    counted = [r for r in recs if r.get("counters")]
    flagged = [r for r in recs if r.get("flags") or r.get("unsupported")]
    why = None
    if counted:
        names = ", ".join(sorted(counted[0]["counters"]))
        why = f"a setuid-root program's counts went into the record ({names})"
    elif recs and not flagged:
        why = "the record is not flagged"
    return one(f"RECORD: {res['record']}", why)


def take_pid(pid: int, argv: list[str], **popen: Any) -> subprocess.Popen[bytes] | None:
    """Start ``argv`` as process ``pid`` (a pid just freed; root: ns_last_pid), or None after 50
    tries (other processes and threads take pids too)."""
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
            fh.write(str(pid - 1))
        p = subprocess.Popen(argv, **popen)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


def _reuse_client(chan: _Chan, sock: str, run_id: str) -> dict[str, Any]:
    """Connect, hand the connection to a child and exit, so this pid can go to a root process;
    the child then asks the daemon to count "its" process (the pid that connected)."""
    c = Conn(Path(sock), job="reuse")
    me = os.getpid()
    if os.fork() == 0:  # the child keeps the connection
        go = chan.recv(60)  # the pid now names a root process
        line = json.loads(_begin_line(run_id))["line"]
        line["pid"] = line["tid"] = me
        c.send(protocol.encode(F.BEGIN, {"s": 1, "line": line, "count": []}))
        c.wait(lambda: any(t is F.STARTED or t is F.ERROR for t, _ in c.frames))
        started = next((p for t, p in c.frames if t in (F.STARTED, F.ERROR)), None)
        time.sleep(0.5)  # the root process spins meanwhile
        rec = make_record(run_id, 0, pid=me).to_json()
        rec["begin_ns"] = line["begin_ns"]
        rec["end_ns"] = time.monotonic_ns()
        c.send(protocol.encode(F.RECORD, {"s": 2, "rec": rec}))
        chan.send({"result": {"go": go, "started": started, "record": c.outcome(2, sync=3)}})
        os._exit(0)
    return {"pid": me}


@attack("authorisation", "counting on behalf: the client's pid reused by a root process")
def behalf_pid_reuse(lab: Lab) -> list[Check]:
    if not as_root() or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        return [Check("", "needs root and a writable /proc/sys/kernel/ns_last_pid", True)]
    run_id = new_run("reuse")
    child = Child(_reuse_client, str(lab.daemon.socket), run_id, uid=NOBODY)
    msg = child.recv(30)
    if not msg or "result" not in msg:
        return [Check("", f"the client did not start: {msg}", True)]
    pid = msg["result"]["pid"]
    child.reap()  # its pid is free now; its child holds the connection
    spinner = take_pid(pid, [sys.executable, "-c", "while True: pass"])
    if spinner is None:
        child.send({"go": False})
        return [Check("", f"could not give pid {pid} to a root process", True)]
    try:
        child.send({"go": True})
        res = child.recv(60)
    finally:
        spinner.kill()
        spinner.wait()
    if not res or "result" not in res:
        return one("", f"the client's child did not report: {res}")
    recs = stored(lab.daemon.store, run_id)
    counted = [r for r in recs if r.get("counters")]
    started = res["result"]["started"] or {}
    why = None
    if counted:
        why = (f"root process {pid}'s counts went into uid {NOBODY}'s record "
               f"({', '.join(sorted(counted[0]['counters']))})")
    elif not (started.get("unsupported") or "code" in started):
        why = f"the BEGIN for a reused pid was answered STARTED without a refusal: {started}"
    return one(f"BEGIN: {started}", why)


@attack("authorisation", "READ of a root process by another user")
def read_root_process(lab: Lab) -> list[Check]:
    if not as_root():
        return [Check("", "not root", True)]

    def read(chan: _Chan, sock: str) -> str:
        c = Conn(Path(sock))
        c.send(protocol.encode(F.READ, {"s": 1, "pid": 1, "count": []}))
        out = c.outcome(1)
        c.close()
        return out
    out = Child(read, str(lab.daemon.socket), uid=NOBODY).result(30)
    return one("", expect(out, ("error forbidden", "error no_such"), "READ pid 1"))


@attack("authorisation", "store file mode")
def store_mode(lab: Lab) -> list[Check]:
    why = []
    for p in (lab.daemon.store.parent, lab.daemon.store,
              *lab.daemon.store.parent.glob("*.db-*")):
        mode = p.stat().st_mode & 0o777
        if mode & 0o004:
            why.append(f"{p.name or p} is {mode:o}: readable by others")
    return one("", *why)


def _cli(chan: _Chan, argv: list[str], sock: str, uid: int) -> dict[str, Any]:
    """``counterd ARGV`` as ``uid`` in this forked process. It runs once as root first, so that
    every module it needs is loaded before the switch: the other user may not be able to read
    this tree's Python (e.g. under /root)."""
    os.environ["COUNTERD_SOCKET"] = sock
    _run_cli(argv)
    for name in ("csv", "grp", "html", "pwd"):  # what the error paths may import
        __import__(name)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    return _run_cli(argv)


def _run_cli(argv: list[str]) -> dict[str, Any]:
    import io

    from counterd.commands.cli import main

    out, err = io.StringIO(), io.StringIO()
    sys.stdout, sys.stderr = out, err
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    return {"code": code, "out": out.getvalue(), "err": err.getvalue()}


@attack("authorisation", "counterd runs / report --store as another user")
def others_runs(lab: Lab) -> list[Check]:
    if not as_root():
        return [Check("", "not root", True)]
    d = lab.daemon
    canary(d)  # a run of root's is in the store
    checks = []
    for cmd in (["runs", "--json"], ["report"]):
        p = Child(_cli, [*cmd, "--store", str(d.store)], str(d.socket), NOBODY).result(60)
        why = []
        if "canary-" in p["out"]:
            why.append(f"root's runs are shown to uid {NOBODY}")
        if "Traceback" in p["err"] or p["code"] not in (0, 2):
            why.append(f"exit {p['code']}: {p['err'].strip().splitlines()[-1:]}")
        checks.append(Check(f"counterd {cmd[0]}", "; ".join(why) or None))
    return checks


# -- authorisation bound at connect; workload labels of one's own (issue 29 items 2 and 4) -----
ALLOWED_GID = 4242  # socket.allowed_group of the pid-reuse attack's daemon (a gid: no group file)


def _reuse_reader(chan: _Chan, sock: str) -> dict[str, Any]:
    """Connect, hand the connection to a child and exit, so this pid can go to a member of
    the allowed group; the child then asks for every user's runs and READs the member's
    process (the pid that connected)."""
    c = Conn(Path(sock), job="reuse")
    me = os.getpid()
    if os.fork() == 0:  # the child keeps the connection
        go = chan.recv(60)  # the pid now names a process of a group member
        c.send(protocol.encode(F.QUERY, {"s": 1, "what": "runs"}))
        c.wait(lambda: any(t is F.RESULT or t is F.ERROR for t, _ in c.frames))
        answer = next((p for t, p in c.frames if t in (F.RESULT, F.ERROR)), None)
        c.send(protocol.encode(F.READ, {"s": 2, "pid": me, "count": []}))
        read = c.outcome(2)
        chan.send({"result": {"go": go, "query": answer, "read": read}})
        os._exit(0)
    return {"pid": me}


def _victim_records(chan: _Chan, sock: str, run_id: str, job: str, end_ns: int = 2_000_000,
                    n: int = 1) -> dict[str, Any]:
    """``n`` records of ``run_id`` under ``job`` (each ``end_ns`` long), acknowledged."""
    sink = SocketSink(sock, job=job, timeout_s=REPLY_TIMEOUT_S)
    for i in range(n):
        rec = make_record(run_id, i)
        sink.record(dataclasses.replace(rec, end_ns=rec.begin_ns + end_ns))
    ok = sink.flush(10)
    sink.close(1)
    return {"flushed": ok}


@attack("authorisation", "pid reuse: a client's pid taken by a member of allowed_group")
def groups_pid_reuse(lab: Lab) -> list[Check]:
    """Issue 29 item 2: a client connects and exits, its child keeps the connection, and the
    pid goes to a process of a member of ``socket.allowed_group``. Membership read from
    /proc/<pid>/status at query time made the attacker privileged: QUERY runs answered every
    user's runs, READ of the member's process was allowed. Bound at connect, neither is."""
    if not as_root() or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        return [Check("", "needs root and a writable /proc/sys/kernel/ns_last_pid", True)]
    d = lab.special("peergroups", socket_extra=f'allowed_group = "{ALLOWED_GID}"\n').start()
    try:
        victim_run = new_run("victimrun")
        Child(_victim_records, str(d.socket), victim_run, "victimjob", uid=OTHER).result(30)
        if len(stored(d.store, victim_run)) != 1:
            return [Check("", "the victim's record was not stored", True)]
        child = Child(_reuse_reader, str(d.socket), uid=NOBODY)
        msg = child.recv(30)
        if not msg or "result" not in msg:
            return [Check("", f"the client did not start: {msg}", True)]
        pid = msg["result"]["pid"]
        child.reap()  # its pid is free now; its child holds the connection
        member = take_pid(pid, ["sleep", "60"], user=OTHER, group=OTHER,
                          extra_groups=[ALLOWED_GID])
        if member is None:
            child.send({"go": False})
            return [Check("", f"could not give pid {pid} to a group member's process", True)]
        try:
            child.send({"go": True})
            res = child.recv(60)
        finally:
            member.kill()
            member.wait()
        if not res or "result" not in res:
            return one("", f"the client's child did not report: {res}")
        answer = res["result"]["query"] or {}
        items = [json.loads(i) if isinstance(i, str) else i for i in answer.get("items", [])]
        theirs = [i for i in items if i.get("uid") != NOBODY or victim_run in i.get("run_id", "")]
        query_why = None
        if theirs:
            query_why = (f"QUERY runs from pid {pid} (now uid {OTHER}'s, in group "
                         f"{ALLOWED_GID}) read {len(theirs)} runs of other users, e.g. "
                         f"uid {theirs[0].get('uid')} {theirs[0].get('run_id')}")
        elif "items" not in answer:
            query_why = f"QUERY runs not answered with a RESULT: {answer}"
        read_why = expect(res["result"]["read"], ("error forbidden",),
                          f"READ of the member's process {pid}")
        return [Check(f"QUERY runs: {len(items)} runs", query_why),
                Check(f"READ: {res['result']['read']}", read_why)]
    finally:
        d.stop()


def metric_samples(d: LiveDaemon) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of ``/metrics`` (the text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(d.url, timeout=5) as r:
        text = r.read().decode()
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text)
            for s in f.samples]


def _series_of(samples: list[tuple[str, dict[str, str], float]], uid: int, job: str
               ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The series of ``uid``'s workload ``job`` (a daemon without a uid label: every series of
    that workload name, which is what the victim's dashboards read there)."""
    return {(n, tuple(sorted(labels.items()))): v for n, labels, v in samples
            if labels.get("workload") == job and labels.get("uid", str(uid)) == str(uid)}


def _settled(d: LiveDaemon, records: float, timeout_s: float = 10.0
             ) -> list[tuple[str, dict[str, str], float]]:
    """/metrics once it counts at least ``records`` stored records (the rendering caught up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = metric_samples(d)
        stored_n = sum(v for n, _, v in got if n == "counterd_records_stored_total")
        if stored_n >= records or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def _stored_total(d: LiveDaemon) -> float:
    return sum(v for n, _, v in metric_samples(d) if n == "counterd_records_stored_total")


@attack("authorisation", 'HELLO job="victimjob" and a record of 3600 s')
def label_gauge(lab: Lab) -> list[Check]:
    """Issue 29 item 4: an attacker's HELLO with the victim's job name and one record ending
    3.6e12 ns after it began set the victim's ``counterd_last_superstep_seconds`` from 0.002 to
    3600. Its series are its own: the victim's are untouched."""
    if not as_root():
        return [Check("", "not root: needs two other uids", True)]
    d = lab.daemon
    before = _stored_total(d)
    Child(_victim_records, str(d.socket), new_run("victim"), "victimjob", uid=OTHER).result(30)
    victim = _series_of(_settled(d, before + 1), OTHER, "victimjob")
    if not victim:
        return [Check("", "the victim's job has no series before the attack", True)]
    Child(_victim_records, str(d.socket), new_run("liar"), "victimjob",
          end_ns=3_600_000_000_000, uid=NOBODY).result(30)
    after = _series_of(_settled(d, before + 2), OTHER, "victimjob")
    changed = sorted(k for k in set(victim) | set(after) if victim.get(k) != after.get(k))
    why = None
    if changed:
        name, labels = changed[0]
        why = (f"{len(changed)} of the victim's series changed, e.g. {name}"
               f"{{{','.join(f'{k}={v!r}' for k, v in labels)}}} {victim.get(changed[0])} -> "
               f"{after.get(changed[0])}")
    return one(f"{len(victim)} series of the victim's", why)


def _many_jobs(chan: _Chan, sock: str, run_id: str, n: int) -> list[str]:
    """One record under each of ``n`` job names (a connection per name: HELLO names it)."""
    out = []
    for j in range(n):
        c = Conn(Path(sock), job=f"squat{j:02d}")
        c.send(jframe(F.RECORD, record_text(f"{run_id}-{j}")))
        out.append(c.outcome(1, sync=2))
        c.close()
    return out


@attack("authorisation", "40 job names from one user, then another's job")
def label_slots(lab: Lab) -> list[Check]:
    """Issue 29 item 4: 40 job names of uid 65534 took the 32 shared workload slots, and the
    victim's job was exported as ``_other`` until restart. Slots per uid: the victim's job
    keeps its name."""
    if not as_root():
        return [Check("", "not root: needs two other uids", True)]
    d = lab.daemon
    before = _stored_total(d)
    outs = Child(_many_jobs, str(d.socket), new_run("squat"), 40, uid=NOBODY).result(60)
    acked = sum(1 for o in outs if o == "ack")
    Child(_victim_records, str(d.socket), new_run("victim"), "victimjob2", uid=OTHER).result(30)
    got = _settled(d, before + acked + 1)
    mine = _series_of(got, OTHER, "victimjob2")
    last = [v for (n, _), v in mine.items() if n == "counterd_last_superstep_seconds"]
    why = None
    if not last:
        others = sorted({labels.get("workload", "") for n, labels, _ in got
                         if n == "counterd_last_superstep_seconds"
                         and labels.get("uid", str(OTHER)) == str(OTHER)})
        why = (f"the victim's job has no series of its own (workloads of uid {OTHER}: "
               f"{', '.join(others)[:160]})")
    elif abs(last[0] - 0.002) > 1e-9:
        why = f"the victim's last superstep reads {last[0]} s, not 0.002"
    return one(f"{acked} of 40 job names recorded, then the victim's", why)


OM_001 = "application/openmetrics-text;version=0.0.1"  # a version choose_encoder skips
HOSTILE_ACCEPT = {
    "garbage": "\x01\x7f;;;,,,=;=,q=;version==;",
    "openmetrics version 1.x (TypeError in choose_encoder)":
        "application/openmetrics-text; version=1.x",
    "openmetrics version x": "application/openmetrics-text;version=x;escaping=bogus",
    "openmetrics version 9.9.9 with trailing text":
        "application/openmetrics-text; version=9.9.9 evil; charset=utf-8",
    "190 media ranges (8 KB, read)": ",".join([OM_001] * 190),
    "1,000 media ranges (43 KB, not read)": ",".join([OM_001] * 1000),
    "60 KB of one token": "a" * 60_000,
    "over the header line limit (70 KB)": "a" * 70_000,
}
HOSTILE_ENCODING = {
    "garbage": "\x01;;,,q=x,gzip;q=;",
    "gzip;q=0 (refused, still gzipped: gzip_accepted reads no q)": "gzip;q=0",
    "60 KB": "x," * 30_000,
    "deflate, br": "deflate, br",
}


def _raw_get(port: int, headers: dict[str, str], timeout_s: float = REPLY_TIMEOUT_S
             ) -> tuple[int, dict[str, str], bytes]:
    """GET /metrics with ``headers`` as written (bytes urllib would refuse), read to the end."""
    req = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(req.encode("latin-1"))
        data = bytearray()
        while chunk := s.recv(1 << 16):
            data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    first = lines[0].split()
    if len(first) < 2 or not first[1].isdigit():
        raise ConnectionError(f"closed without an HTTP answer ({bytes(data[:40])!r})")
    status = int(first[1])
    hdrs = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    return status, hdrs, body


def _valid_body(status: int, hdrs: dict[str, str], body: bytes) -> str | None:
    """Why a /metrics answer is not a valid exposition in the Content-Type it names."""
    import gzip as gz

    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
    from prometheus_client.parser import text_string_to_metric_families as text

    if status != 200:
        return f"HTTP {status}"
    if hdrs.get("content-encoding") == "gzip":
        body = gz.decompress(body)
    ctype = hdrs.get("content-type", "")
    if not ctype.startswith(("text/plain", "application/openmetrics-text")):
        return f"Content-Type {ctype[:80]!r}"
    try:
        fams = list((om if ctype.startswith("application/openmetrics") else text)(
            body.decode()))
    except Exception as exc:
        return f"{ctype.split(';')[0]} does not parse: {exc}"
    return None if fams else "no metrics"


@attack("protocol and floods", "/metrics with hostile Accept and Accept-Encoding headers")
def metrics_negotiation(lab: Lab) -> list[Check]:
    """Content negotiation through prometheus-client (issue 34 item 4) on hostile headers: each
    answered within seconds with a valid exposition in the Content-Type it names (or 431 for a
    header line over http.server's limit), nothing of the header echoed, the server serving on."""
    d = lab.daemon
    checks = []
    cases = [("Accept", k, v) for k, v in HOSTILE_ACCEPT.items()] + \
        [("Accept-Encoding", k, v) for k, v in HOSTILE_ENCODING.items()] + \
        [("Accept", "obs-fold continuation (header injection)",
          "application/openmetrics-text; version=2.0.0\r\n X-Injected: 1")]
    for header, kind, value in cases:
        t0 = time.monotonic()
        try:
            status, hdrs, body = _raw_get(d.port, {header: value})
        except OSError as exc:
            checks.append(Check(f"{header}: {kind}", f"no answer ({exc})"))
            continue
        took = time.monotonic() - t0
        why = [] if status == 431 and len(value) > 65_000 else [_valid_body(status, hdrs, body)]
        if took > 2.0:
            why.append(f"answered in {took:.1f} s")
        if "x-injected" in hdrs or any("evil" in v for v in hdrs.values()):
            why.append("the header's text was echoed into the response headers")
        checks.append(Check(f"{header}: {kind}", "; ".join(w for w in why if w) or None))
    return checks


# -- durability ---------------------------------------------------------------------------------
@attack("durability", "kill -9 under 8 writers, restart with them running")
def kill9_restart(lab: Lab) -> list[Check]:
    d = lab.daemon
    runs = writers(d, 8, lab.scale(8, 5), "k9w")
    time.sleep(lab.scale(3, 2))
    cut = time.monotonic()
    d.kill9()
    d.start()
    acked, missing_acked, total, missing, raised = lost(d, runs, cut)
    return [Check("kill -9: acknowledged records lost",
                  f"{missing_acked} of {acked} acknowledged records missing"
                  if missing_acked or not acked else None),
            Check(f"restart: writers' records stored ({total - missing} of {total})",
                  f"{missing} of {total} records not stored" if missing else
                  (f"a writer raised: {raised[0]}" if raised else None))]


@attack("durability", "backend none: acknowledgements read, memory bounded")
def unacked_bounded(lab: Lab) -> list[Check]:
    n = lab.scale(100_000, 30_000)
    res = Child(marker_program, str(lab.daemon.socket), new_run("none"), steps=n).result(300)
    why = None
    if res["unacked"] > max(res["high_water"], 1):
        why = (f"{res['unacked']} of {n} records unacknowledged after the loop "
               f"(high water {res['high_water']})")
    return one(f"{res['unacked']} unacknowledged", why,
               f"raised {res['raised']}" if res["raised"] else None)


@attack("durability", "disk full (8 MB tmpfs)")
def disk_full(lab: Lab) -> list[Check]:
    mnt = _mount_tmpfs(lab, "full", "8m")
    if isinstance(mnt, Check):
        return [mnt]
    d = lab.special("diskfull", store_dir=mnt / "state")
    try:
        d.start()
        lines0 = len(d.log_text().splitlines())
        filler = mnt / "filler"
        # Unbuffered: a buffered file keeps the part of its last write that did not fit and
        # raises ENOSPC again when it closes, outside the suppress (whether it does depends on
        # how the free space divides by 64 KiB, i.e. on the store's size).
        with filler.open("wb", buffering=0) as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
        run_id = new_run("full")
        child = Child(marker_program, str(d.socket), run_id, steps=50, pace_s=0.01)
        time.sleep(4)
        # predict calibrate --out on the full disk must not leave a file behind
        out = mnt / "profile.toml"
        cal = subprocess.run([PY, "-m", "predictor.cli", "calibrate", "--results",
                              str(lab.files["results.json"]), "--out", str(out)],
                             capture_output=True, text=True, timeout=60, cwd=lab.src,
                             env=_env(lab.src))
        leftovers = [p.name for p in mnt.iterdir() if p.name not in ("filler", "state")]
        filler.unlink()
        res = child.result(120)
        log = "\n".join(d.log_text().splitlines()[lines0:])
        got = len(stored(d.store, run_id))
        checks = [
            Check(f"slowest marker call {res['slowest_s']:.1f} s",
                  f"a marker call blocked {res['slowest_s']:.1f} s" if res["slowest_s"] > 2
                  else (f"raised {res['raised']}" if res["raised"] else None)),
            Check("the log says disk full",
                  "the log says 'cannot rollback'" if "cannot rollback" in log else
                  (None if ("disk full" in log.lower() or "no space" in log.lower())
                   else "no 'disk full' in the log")),
            Check(f"records stored once space is back ({got} of {res['total']})",
                  None if got == res["total"] else f"{got} of {res['total']} stored"),
            Check("predict calibrate --out on a full disk",
                  "; ".join(filter(None, [
                      f"left {leftovers}" if leftovers else None,
                      "traceback" if "Traceback" in cal.stderr else None,
                      None if cal.returncode in (1, 2) else f"exit {cal.returncode}"])) or None),
            *[Check("daemon after disk full", w) for w in health(d)],
        ]
        return checks
    finally:
        d.stop()
        _umount(mnt)


# -- signals ------------------------------------------------------------------------------------
@attack("signals", "SIGTERM under load (acknowledged kept)")
def sigterm_load(lab: Lab) -> list[Check]:
    d = lab.daemon
    runs = writers(d, 8, lab.scale(6, 4), "termw")
    time.sleep(2)
    cut = time.monotonic()
    d.signal(signal.SIGTERM)
    code = d.proc.wait(60) if d.proc is not None else None
    d.start()
    acked, missing_acked, _, _, _ = lost(d, runs, cut)
    return one(f"{acked} acknowledged before SIGTERM",
               None if code == 0 else f"daemon exited {code}",
               f"{missing_acked} acknowledged records missing" if missing_acked else None)


@attack("signals", "200 SIGHUPs under load")
def sighup_storm(lab: Lab) -> list[Check]:
    d = lab.daemon
    runs = writers(d, 4, 4, "hupw")
    for _ in range(200):
        if not d.alive():
            break
        d.signal(signal.SIGHUP)
        time.sleep(0.01)
    _, _, total, missing, raised = lost(d, runs, 0)
    return one(f"{total} records", f"{missing} of {total} not stored" if missing else None,
               f"a writer raised {raised[0]}" if raised else None)


@attack("signals", "SIGHUP with a binary config file")
def sighup_binary_config(lab: Lab) -> list[Check]:
    d = lab.daemon
    good = d.config.read_bytes()
    lines0 = len(d.log_text().splitlines())
    d.config.write_bytes(random.Random(7).randbytes(4096))
    d.signal(signal.SIGHUP)
    time.sleep(1.5)
    d.config.write_bytes(good)
    log = d.log_text().splitlines()[lines0:]
    said = any(ln.startswith(("ERROR", "WARNING")) and "config" in ln for ln in log)
    return one("", None if d.alive() else "the daemon died",
               "Traceback in the log" if any("Traceback" in ln for ln in log) else None,
               None if said or not d.alive() else "no ERROR/WARNING about the config")


@attack("signals", "SIGHUP to a config naming an unreadable profile")
def sighup_bad_profile(lab: Lab) -> list[Check]:
    d = lab.daemon
    good = d.config.read_text()
    lines0 = len(d.log_text().splitlines())
    missing = lab.tmp / "no-such-profile.toml"
    d.write_config(d.extra + f'[predictor]\nprofile = "{missing}"\n')
    d.signal(signal.SIGHUP)
    time.sleep(1.5)
    d.config.write_text(good)
    d.signal(signal.SIGHUP)
    time.sleep(0.5)
    log = d.log_text().splitlines()[lines0:]
    loud = [ln for ln in log if ln.startswith(("ERROR", "WARNING")) and "profile" in ln]
    return one("", None if loud else "accepted silently (no WARNING/ERROR about the profile)")


# -- marker misuse ------------------------------------------------------------------------------
def _misuse(lab: Lab, bad_param: str) -> list[Check]:
    run_id = new_run(f"param-{bad_param}")
    res = Child(marker_program, str(lab.daemon.socket), run_id, steps=3,
                bad_param=bad_param).result(60)
    recs = stored(lab.daemon.store, run_id)
    return one(f"{len(recs)} of 3 records stored",
               f"raised into the program: {res['raised']}" if res["raised"] else None,
               None if len(recs) == 3 else f"{len(recs)} of 3 records stored",
               None if len(recs) != 3 or all(r["flags"] for r in recs)
               else "the records are not flagged")


for _param in ("nan", "inf", "huge"):
    attack("marker misuse", f"param {_param}")(
        lambda lab, p=_param: _misuse(lab, p))  # type: ignore[misc]


def _first_step_program(chan: _Chan, sock: str, run_id: str) -> dict[str, Any]:
    return marker_program(chan, sock, run_id, steps=1, backend="perf", wait_inside=True)


@attack("marker misuse", "first superstep open while the daemon restarts")
def first_step_restart(lab: Lab) -> list[Check]:
    d = lab.daemon
    run_id = new_run("first")
    child = Child(_first_step_program, str(d.socket), run_id)
    if child.recv(30) is None:
        child.kill()
        return one("", "the program did not start its superstep")
    d.stop()
    d.start()
    child.send({"go": True})
    res = child.result(60)
    got = len(stored(d.store, run_id))
    return one("", f"raised into the program: {res['raised']}" if res["raised"] else None,
               None if got == 1 else "the superstep's record was lost")


def _misuse_program(chan: _Chan, sock: str, run_id: str) -> dict[str, Any]:
    counterd.configure(backend="none", socket=sock, run_id=run_id)
    raised = []
    for call in (lambda: counterd.end(), lambda: _nested(), lambda: _raising()):
        try:
            call()
        except ZeroDivisionError:
            pass
        except Exception as exc:
            raised.append(f"{type(exc).__name__}: {exc}")
    from counterd.markers.api import recorder
    sink: Any = recorder().sink
    return {"raised": raised, "flushed": bool(sink.flush(10))}


def _nested() -> None:
    with counterd.superstep("outer"), counterd.superstep("inner"):
        pass


def _raising() -> None:
    with counterd.superstep("raises"):
        1 / 0  # noqa: B018 - the exception is the point


@attack("marker misuse", "unmatched end, nested, exception in the body")
def held_misuse(lab: Lab) -> list[Check]:
    run_id = new_run("misuse")
    res = Child(_misuse_program, str(lab.daemon.socket), run_id).result(60)
    flags = set().union(*(set(r["flags"]) for r in stored(lab.daemon.store, run_id)))
    want = {"unmatched_end", "nested", "exception"}
    return one("", f"raised {res['raised']}" if res["raised"] else None,
               f"flags missing: {sorted(want - flags)}" if want - flags else None)


# -- bad files ----------------------------------------------------------------------------------
def _valid_inputs(lab: Lab) -> None:
    """Valid files of every format, from the project's own writers."""
    from counterd.daemon.store import store_records
    from counterd.data.events import CounterValue, Source
    from predictor.synthetic import make_results, reference_model

    files = lab.files
    files["results.json"] = lab.tmp / "results.json"
    files["results.json"].write_text(json.dumps(
        make_results(reference_model(const=1500.0, dtlb=30.0), noise=0.01, seed=2)))
    files["profile.toml"] = lab.tmp / "profile.toml"
    _make(["-m", "predictor.cli", "calibrate", "--results", str(files["results.json"]),
           "--out", str(files["profile.toml"]), "--force"])
    files["resume.json"] = lab.tmp / "resume.json"
    _make(["-m", "microbench.cli", "run", "--quick", "--backend", "sim", "--procs", "1",
           "--strides", "1", "--suite", "table1", "--compute-backend", "none", "--out",
           str(files["resume.json"])])
    t = 10_000
    recs = [SuperstepRecord(run_id="files", index=i, name="s", rank=r, pid=100 + r, cpu=r,
                            begin_ns=t * i, end_ns=t * i + 5000,
                            counters={"loads": CounterValue(1000.0 + i, Source.MEASURED),
                                      "l1d_misses": CounterValue(100.0, Source.MEASURED)},
                            backend="perf", host=HOST) for i in range(4) for r in range(2)]
    files["records.jsonl"] = lab.tmp / "records.jsonl"
    files["records.jsonl"].write_text("".join(json.dumps(r.to_json()) + "\n" for r in recs))
    files["store.db"] = lab.tmp / "files-store.db"
    store_records(files["store.db"], recs)
    files["config.toml"] = lab.tmp / "files-config.toml"
    files["config.toml"].write_text(
        f'[metrics]\nlisten = "127.0.0.1:{free_port()}"\n[socket]\npath = '
        f'"{lab.tmp / "files.sock"}"\n[store]\npath = "{lab.tmp / "files-run.db"}"\n')


def _make(argv: list[str]) -> None:
    """Write a valid input with this tree's own command; RuntimeError with its stderr."""
    p = subprocess.run([PY, *argv], capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        raise RuntimeError(f"{' '.join(argv[1:3])} failed: {p.stderr.strip()[-300:]}")


MARK = 987654.25  # a counter value replaced by hostile JSON text


def _hostile_files(lab: Lab) -> dict[str, dict[str, Path]]:
    """format -> kind -> file. Kinds: binary, deep, list, 1e400, negative, nan, empty,
    truncated, huge line; each written in the format its readers expect."""
    out: dict[str, dict[str, Path]] = {}
    d = lab.tmp / "bad"
    d.mkdir(exist_ok=True)
    rng = random.Random(11)
    binary = rng.randbytes(64 * 1024)
    huge = b"x" * (16 * 1024 * 1024) + b"\n"

    def put(fmt: str, kind: str, data: bytes | str) -> None:
        p = d / f"{fmt}-{kind}"
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        out.setdefault(fmt, {})[kind] = p

    files = lab.files
    lines = files["records.jsonl"].read_text().splitlines()
    first = json.loads(lines[0])

    def rec_line(**change: Any) -> str:
        r = json.loads(json.dumps(first))
        r.update(change)
        return json.dumps(r)

    for fmt in ("records", "results", "resume", "profile", "config", "store"):
        put(fmt, "binary", binary)
        put(fmt, "empty", b"")
        put(fmt, "huge line", huge)
    put("records", "deep", DEEP + "\n")
    put("records", "list", "[1, 2]\n")
    put("records", "1e400", rec_line(begin_ns=MARK).replace(str(MARK), "1e400") + "\n")
    put("records", "negative", rec_line(counters={"loads": {"value": -5.0,
                                                             "source": "measured"}}) + "\n")
    put("records", "nan", rec_line(counters={"loads": {"value": MARK, "source": "measured"}}
                                   ).replace(str(MARK), "NaN") + "\n")
    put("records", "truncated", files["records.jsonl"].read_text()[:-40])
    for fmt, src in (("results", "results.json"), ("resume", "resume.json")):
        doc = json.loads(files[src].read_text())
        proc = doc["patterns"][0]["processors"][0]
        key = next(iter(proc["counters"]))
        proc["counters"][key]["value"] = MARK
        text = json.dumps(doc)
        put(fmt, "deep", DEEP)
        put(fmt, "list", "[1, 2]")
        put(fmt, "1e400", text.replace(str(MARK), "1e400"))
        put(fmt, "negative", text.replace(str(MARK), "-5"))
        put(fmt, "nan", text.replace(str(MARK), "NaN"))
        put(fmt, "truncated", files[src].read_text()[: files[src].stat().st_size // 2])
    prof = files["profile.toml"].read_text()
    first_value = next(ln for ln in prof.splitlines() if ln.startswith("acc = "))
    put("profile", "deep", "x = " + "[" * 100_000)
    put("profile", "list", "x = [1, 2]\n")
    put("profile", "1e400", prof.replace(first_value, "acc = 1e400", 1))
    put("profile", "negative", prof.replace(first_value, "acc = -5.0", 1))
    put("profile", "nan", prof.replace(first_value, "acc = nan", 1))
    put("profile", "truncated", prof[: len(prof) // 2])
    cfg = files["config.toml"].read_text()
    put("config", "deep", "log_level = " + "[" * 100_000)
    put("config", "list", "log_level = [1, 2]\n")
    put("config", "1e400", cfg + "[sampling]\ninterval_s = 1e400\n")
    put("config", "negative", cfg.replace("[socket]\n", "[socket]\nmax_clients = -5\n"))
    put("config", "nan", cfg + "[sampling]\ninterval_s = nan\n")
    put("config", "truncated", cfg[: len(cfg) // 2])
    for kind, body in (("deep", DEEP), ("list", "[1, 2]"),
                       ("1e400", json.dumps(first).replace(str(first["begin_ns"]), "1e400", 1)),
                       ("negative", json.dumps({**first, "counters": {
                           "loads": {"value": -5.0, "source": "measured"}}})),
                       ("nan", json.dumps({**first, "counters": {
                           "loads": {"value": MARK, "source": "measured"}}}
                       ).replace(str(MARK), "NaN"))):
        p = d / f"store-{kind}.db"
        shutil.copy(files["store.db"], p)
        conn = sqlite3.connect(p)
        conn.execute("UPDATE records SET body = ?", (body,))
        conn.commit()
        conn.close()
        out["store"][kind] = p
    db = files["store.db"].read_bytes()
    put("store", "truncated", db[: len(db) // 2])
    return out


# command name -> (format, argv with FILE, kinds whose file is acceptable input)
def _commands(lab: Lab) -> dict[str, tuple[str, list[str], frozenset[str]]]:
    f = lab.files
    c, p, m = ["-m", "counterd.commands.cli"], ["-m", "predictor.cli"], ["-m", "microbench.cli"]
    return {
        "counterd report --records": ("records", [*c, "report", "--records", "FILE"],
                                      frozenset({"empty"})),
        "predict --counters": ("records", [*p, "--profile", str(f["profile.toml"]),
                                           "--counters", "FILE"], frozenset()),
        "counterd report --store": ("store", [*c, "report", "--store", "FILE"], frozenset()),
        "counterd runs --store": ("store", [*c, "runs", "--store", "FILE"],
                                  frozenset({"deep", "list", "1e400", "negative", "nan"})),
        "predict calibrate": ("results", [*p, "calibrate", "--results", "FILE", "--out",
                                          str(lab.tmp / "bad" / "out.toml"), "--force"],
                              frozenset()),
        "predict validate": ("results", [*p, "validate", "--results", "FILE", "--profile",
                                         str(f["profile.toml"])], frozenset()),
        "microbench show": ("resume", [*m, "show", "FILE"], frozenset()),
        "microbench run --resume": ("resume", [*m, "run", "--quick", "--backend", "sim",
                                               "--procs", "1", "--strides", "1", "--suite",
                                               "table1", "--compute-backend", "none",
                                               "--resume", "--out", "FILE"],
                                    frozenset({"empty"})),
        "predict --profile": ("profile", [*p, "--profile", "FILE", "--counters",
                                          str(f["records.jsonl"])], frozenset()),
        "counterd report --profile": ("profile", [*c, "report", "--records",
                                                  str(f["records.jsonl"]), "--profile",
                                                  "FILE"], frozenset()),
        "counterd run --config": ("config", [*c, "run", "--config", "FILE"],
                                  frozenset({"empty"})),
    }


def _run_file_command(src: Path, argv: list[str], path: Path, copy_first: bool
                      ) -> tuple[int, str, float]:
    target = path
    if copy_first:  # commands that write their input (--resume) get a copy
        target = path.with_name(path.name + ".copy")
        shutil.copy(path, target)
    cmd = [PY, *[str(target) if a == "FILE" else a for a in argv]]
    if "run" in argv and "--config" in argv:
        return _run_daemon_command(src, cmd)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=_env(src), cwd=src)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        return -999, err, time.monotonic() - t0
    return proc.returncode, err, time.monotonic() - t0


def _run_daemon_command(src: Path, cmd: list[str]) -> tuple[int, str, float]:
    """``counterd run --config FILE``: its exit status if it refuses the file; 0 if it accepts
    it and stops cleanly on SIGTERM. Acceptance is the daemon's own word, its sd_notify
    READY=1 (a datagram socket of ours as NOTIFY_SOCKET), not a time: a daemon still checking
    a 16 MB config line after 3 s on a loaded host was taken for one that had accepted it, and
    its SIGTERM for a failure. What a file does not set (all of it, for the empty file) is the
    daemon's own for this run, not the host's: as root the defaults are /run/counterd and
    /var/lib/counterd, where a counterd installed on the host (or a newer one, whose store
    schema this one refuses) keeps its socket and store, and port 9464 may be taken."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="counterd-notify-") as tmp, \
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify, \
            tempfile.TemporaryFile("w+") as errf:
        notify.bind(os.path.join(tmp, "notify"))
        own = {"NOTIFY_SOCKET": os.path.join(tmp, "notify"),
               "COUNTERD_SOCKET": os.path.join(tmp, "counterd.sock"),
               "COUNTERD_STORE": os.path.join(tmp, "counterd.db"),
               "COUNTERD_METRICS_LISTEN": ""}  # off
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=errf, text=True,
                                env={**_env(src), **own}, cwd=src)
        notify.settimeout(0.05)
        ready = hung = False
        while proc.poll() is None and not ready and not hung:
            with contextlib.suppress(TimeoutError):
                ready = b"READY=1" in notify.recv(4096)
            hung = time.monotonic() - t0 > 120
        if proc.poll() is None:  # ready (a config it accepted: stop it), or hung
            proc.send_signal(signal.SIGTERM if ready else signal.SIGKILL)
            proc.wait(timeout=30)
        errf.seek(0)
        err = errf.read()
    code = -999 if hung else (0 if proc.returncode == 0 else -998) if ready else proc.returncode
    return code, err, time.monotonic() - t0


def _exception_line(err: str) -> str:
    """The ``SomeError: message`` line of the last traceback in ``err``."""
    tail = err[err.rindex("Traceback"):].splitlines()[1:]
    return next((ln for ln in tail if ln and not ln.startswith(" ")), "")


@attack("bad files", "file commands x hostile files")
def bad_files(lab: Lab) -> list[Check]:
    from concurrent.futures import ThreadPoolExecutor

    files = _hostile_files(lab)
    jobs = []
    for cname, (fmt, argv, acceptable) in _commands(lab).items():
        for kind, path in files[fmt].items():
            jobs.append((cname, kind, argv, path, acceptable))
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(
            lambda j: _run_file_command(lab.src, j[2], j[3], "--resume" in j[2]), jobs))
    checks = []
    for (cname, kind, _, _, acceptable), (code, err, _) in zip(jobs, results, strict=True):
        allowed = (0, 2) if kind in acceptable else (2,)
        why = []
        if "Traceback" in err:
            why.append(f"traceback ({_exception_line(err)[:100]})")
        elif code == -999:
            why.append("did not finish in 120 s")
        elif code == -998:
            why.append("accepted the file, then did not stop cleanly on SIGTERM")
        elif code not in allowed:
            why.append(f"exit {code}, wanted {' or '.join(map(str, allowed))}")
        elif code == 2 and err.strip().count("\n"):
            why.append(f"{err.strip().count(chr(10)) + 1} lines on stderr")
        checks.append(Check(f"{cname} < {kind}", "; ".join(why) or None))
    # a profile fitted on another host: predict warns; counterd report must too
    p = subprocess.run([PY, "-m", "counterd.commands.cli", "report", "--records",
                        str(lab.files["records.jsonl"]), "--profile",
                        str(lab.files["profile.toml"])], capture_output=True, text=True,
                       cwd=lab.src, env=_env(lab.src), timeout=120)
    checks.append(Check("counterd report --profile < another host's profile",
                        None if "another host" in p.stderr
                        else f"no warning (exit {p.returncode})"))
    return checks


# -- recorder: a recorded program's hostile spool ----------------------------------------------
# `counterd record` reads what its command's processes left in the spool directory. The issue's
# target: on each hostile spool the recorder finishes within 5 s of its command, with a peak RSS
# under 100 MB, says what it skipped, and leaves no spool directory.
RECORDER_LATE_S = 5.0
RECORDER_RSS_MB = 100.0
RECORDER_GUARD_S = 60.0  # a recorder still running then is killed (a blocked one would stay)
RECORDER_AS_BYTES = 3 << 30  # RLIMIT_AS of the recorder: a tree that reads it all fails early
HOSTILE_SPOOL = Path(__file__).resolve().parent / "_hostile_spool.py"
# Full sizes (the issue's): a 20 GB sparse 1.jsonl; 256 MiB of junk lines truncated under
# the reader; 256 MiB of junk for the recorder to read when a signal comes.
FULL_SPARSE_JSONL = 20 * 10**9
# kind -> what the recorder's stderr must say of it
RECORDER_SAYS = {
    "fifo": "a FIFO",
    "link to /dev/zero": "a symbolic link",
    "link to another user's file": "a symbolic link",
    "another user's file": "owned by uid 65534",
    "directory": "a directory",
    "socket": "a socket",
    "character device": "a character device",
    "block device": "a block device",
    "sparse frames": "its frames break",
    "sparse jsonl": "skipped",
    "truncated while read": "",  # what it says depends on when it reads: nothing required
}


@dataclass
class Recorded:
    """One ``counterd record`` of a hostile command, measured from outside."""

    code: int  # the recorder's exit status (-N: killed by signal N; -999: killed by the guard)
    stderr: str
    late_s: float  # from the command's end (its ENDFILE) to the recorder's exit
    rss_mb: float  # peak RSS of the recorder and its waited-for children (wait4's ru_maxrss)
    left: list[str]  # spool directories left in its TMPDIR
    out: Path


def record_hostile(src: Path, tmp: Path, kind: str, size: int = 0, target: str = "",
                   signal_at: Callable[[subprocess.Popen[bytes]], None] | None = None
                   ) -> Recorded:
    """``counterd record --backend none`` of :mod:`_hostile_spool` planting ``kind``, with
    TMPDIR a fresh directory (its spool directory's parent); ``signal_at`` runs once the
    recorder started (for the signal attacks)."""
    import resource

    work = tmp / ("rec-" + kind.replace(" ", "-").replace("/", "") + "-" + uuid.uuid4().hex[:6])
    work.mkdir(parents=True)
    endfile = work / "end"
    out = work / "r.jsonl"
    env = {**_env(src), "TMPDIR": str(work)}
    argv = [PY, "-m", "counterd.commands.cli", "record", "--backend", "none", "--out", str(out),
            "--",
            PY, str(HOSTILE_SPOOL), kind, str(size), target, str(endfile)]

    def guard() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (RECORDER_AS_BYTES, RECORDER_AS_BYTES))

    proc = subprocess.Popen(argv, env=env, cwd=src, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=guard)
    if signal_at is not None:
        signal_at(proc)
    err = b""
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    deadline = time.monotonic() + RECORDER_GUARD_S
    status = rusage = None
    while True:
        try:
            err += proc.stderr.read() or b""
        except (BlockingIOError, TypeError):
            pass
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            proc.kill()
            _, status, rusage = os.wait4(proc.pid, 0)
            status = None
            break
        time.sleep(0.005)
    ended = time.monotonic()
    proc.returncode = 0  # reaped here, not by Popen
    with contextlib.suppress(BlockingIOError, TypeError):
        err += proc.stderr.read() or b""
    proc.stderr.close()
    try:
        cmd_end = float(endfile.read_text())
    except (OSError, ValueError):
        cmd_end = ended
    code = -999 if status is None else os.waitstatus_to_exitcode(status)
    left = [p.name for p in work.iterdir() if p.name.startswith(("counterd-record-",
                                                                  "counterd-spool-"))]
    return Recorded(code, err.decode(errors="replace"), ended - cmd_end,
                    rusage.ru_maxrss / 1024 if rusage is not None else float("nan"), left, out)


def judge_recorded(r: Recorded, says: str, *, codes: tuple[int, ...] = (0,)) -> str | None:
    """Why the recording missed the target, or None."""
    why = []
    if r.code == -999:
        why.append(f"still running {RECORDER_GUARD_S:g} s later (killed)")
    elif r.code not in codes:
        said = _exception_line(r.stderr) if "Traceback" in r.stderr else ""
        why.append(f"exit {r.code}: {said or r.stderr.strip()[-200:] or 'nothing said'}")
    if r.late_s > RECORDER_LATE_S:
        why.append(f"ended {r.late_s:.1f} s after its command (> {RECORDER_LATE_S:g} s)")
    if r.rss_mb > RECORDER_RSS_MB:
        why.append(f"peak RSS {r.rss_mb:.0f} MB (> {RECORDER_RSS_MB:g} MB)")
    if "Traceback" in r.stderr:
        why.append("a traceback: " + _exception_line(r.stderr))
    if says and says not in r.stderr:
        why.append(f"did not say {says!r} on stderr")
    if r.left:
        why.append(f"left its spool directory ({', '.join(r.left)})")
    return "; ".join(why) or None


def _figures(r: Recorded) -> str:
    return f"+{r.late_s:.2f} s, {r.rss_mb:.0f} MB"


@attack("recorder", "hostile spools x record (s after cmd, peak RSS)")
def hostile_spools(lab: Lab) -> list[Check]:
    """Each kind of :mod:`_hostile_spool` at full size (``--quick``: the sparse .jsonl 2 GB,
    the truncated one 32 MiB): finished within 5 s of the command, peak RSS under 100 MB,
    the file said, no spool directory left, nothing of another user's file recorded."""
    checks = []
    root = as_root()
    other = lab.tmp / "other-user-file"
    if not other.exists():
        other.write_bytes(_hostile_spool.record_line())
        if root:
            os.chown(other, NOBODY, NOBODY)
    for kind, (_what, needs_root) in _hostile_spool.KINDS.items():
        if needs_root and not root:
            checks.append(Check(kind, "needs root (mknod, chown)", skipped=True))
            continue
        size = {"sparse jsonl": lab.scale(FULL_SPARSE_JSONL, 2 * 10**9),
                "truncated while read": lab.scale(256 << 20, 32 << 20)}.get(kind, 0)
        target = str(other) if root else "/etc/passwd"
        r = record_hostile(lab.src, lab.tmp, kind, size, target)
        why = judge_recorded(r, RECORDER_SAYS[kind])
        if why is None and _hostile_spool.STOLEN_RUN in _read_or_empty(r.out):
            why = "recorded a record of another user's file"
        checks.append(Check(f"{kind}: {_figures(r)}", why))
        shutil.rmtree(r.out.parent, ignore_errors=True)
    return checks


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@attack("recorder", "stopped while it reads the spool")
def recorder_signals(lab: Lab) -> list[Check]:
    """The command leaves 256 MiB of junk lines (seconds of reading) and has the recorder
    signalled (SIGTERM, SIGHUP, SIGINT) 0.4 s after its end: the recorder ends (stopped,
    exit 128+N, or done first, exit 0) within 5 s, and its spool directory is gone either
    way."""
    checks = []
    for name in ("SIGTERM", "SIGHUP", "SIGINT"):
        sig = int(getattr(signal, name))
        r = record_hostile(lab.src, lab.tmp, f"signal {name}", lab.scale(256 << 20, 64 << 20))
        how = "stopped" if r.code == 128 + sig else "finished first" if r.code == 0 else ""
        why = judge_recorded(r, "", codes=(0, 128 + sig))
        checks.append(Check(f"{name}: {how}, {_figures(r)}", why))
        shutil.rmtree(r.out.parent, ignore_errors=True)
    return checks


@attack("recorder", "spool directory of a recorder killed by SIGKILL")
def recorder_sigkill(lab: Lab) -> list[Check]:
    """A recorder killed with SIGKILL while its command runs leaves its spool directory (no
    handler runs); the next recording of the same user removes it once it is a minute old
    (aged here with utime) and no process holds its lock. A directory of a live recorder, of
    another name, and one not the user's are left."""
    work = lab.tmp / f"rec-sigkill-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    env = {**_env(lab.src), "TMPDIR": str(work)}
    sleeper = [PY, "-c", "import time; time.sleep(1.5)"]
    rec = subprocess.Popen([PY, "-m", "counterd.commands.cli", "record", "--backend", "none",
                            "--out",
                            str(work / "a.jsonl"), "--", *sleeper], env=env, cwd=lab.src,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not list(work.glob("counterd-record-*")):
        time.sleep(0.02)
    time.sleep(0.3)
    rec.kill()
    rec.wait()
    left = [p for p in work.glob("counterd-record-*")]
    if not left:
        return one("", "no spool directory appeared (or it was not left by SIGKILL)")
    time.sleep(1.6)  # its command ends
    old = time.time() - 600
    for p in left:
        os.utime(p, (old, old))
    alien = work / "counterd-spool-0123456789abcdef"  # an older recorder's name: not taken
    alien.mkdir(mode=0o700)
    os.utime(alien, (old, old))
    # Another live recorder's: it is locked by a process that lives on through the check.
    holder = subprocess.Popen([PY, "-c", "import sys, time\nfrom counterd import launch\n"
                               "print(launch.make_spool_dir(), flush=True)\ntime.sleep(30)"],
                              env=env, cwd=lab.src, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    live = Path(holder.stdout.readline().strip())
    os.utime(live, (old, old))
    p = subprocess.run([PY, "-m", "counterd.commands.cli", "record", "--backend", "none", "--out",
                        str(work / "b.jsonl"), "--", "true"], env=env, cwd=lab.src,
                       capture_output=True, text=True, timeout=120)
    holder.kill()
    holder.wait()
    why = []
    if p.returncode != 0:
        why.append(f"the next recording exited {p.returncode}: {p.stderr.strip()[-200:]}")
    if any(q.exists() for q in left):
        why.append("the next recording left the SIGKILLed recorder's spool directory")
    if not alien.exists():
        why.append("removed a directory of another name (an older recorder's)")
    if not live.exists():
        why.append("removed the spool directory of a live recorder")
    shutil.rmtree(work, ignore_errors=True)
    return one("", *why)


# -- fairness and quotas (the Reliability issue's items 1 and 3) --------------------------------
# Each flood comes from uid NOBODY while a victim of uid OTHER connects afresh, again and again,
# sends HELLO, one RECORD and a SYNC, and waits for the ACK: the issue's target is the victim's
# worst acknowledgement (connect to ACK) <= 1 s, and its records stored. --quick scales the
# floods down and allows 2.5 s (a test host is shared; the markers' flush gives up after 5 s).
VICTIM_TARGET_S = 1.0
VICTIM_QUICK_S = 2.5
VICTIM_WAIT_S = 30.0  # a victim waiting longer is counted as not acknowledged
FLOOD_RSS_MB = 64  # the daemon's RSS may grow by this much under a flood, at most


def _victim_once(sock: str, run_id: str, index: int) -> str:
    """One fresh connection: HELLO, RECORD ``index`` of ``run_id``, SYNC; "ack" or why not."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(VICTIM_WAIT_S)
    dec = protocol.Decoder(1 << 24, protocol.ACCEPTED_VERSIONS)
    try:
        s.connect(sock)
        s.sendall(protocol.encode(F.HELLO, {"pid": os.getpid(), "host": HOST, "job": "victim"})
                  + protocol.encode(F.RECORD, {"s": 1, "rec": make_record(run_id, index)
                                               .to_json()})
                  + protocol.encode(F.SYNC, {"s": 2}))
        while True:
            data = s.recv(65536)
            if not data:
                return "closed"
            dec.feed(data)
            for ftype, p in dec.frames():
                if ftype is F.ERROR:
                    return f"error {p.get('code')}: {str(p.get('message'))[:120]}"
                if ftype is F.ACK and int(p.get("s", 0)) >= 2:
                    return "ack"
    except TimeoutError:
        return f"no ACK in {VICTIM_WAIT_S:.0f} s"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        s.close()


def _victim(chan: _Chan, sock: str, run_id: str, seconds: float, pace_s: float = 0.1
            ) -> dict[str, Any]:
    """The victim's round trips for ``seconds`` (at least 3): their times and failures."""
    times: list[float] = []
    failures: list[str] = []
    deadline = time.monotonic() + seconds
    i = 0
    while i < 3 or time.monotonic() < deadline:
        t0 = time.monotonic()
        out = _victim_once(sock, run_id, i)
        times.append(time.monotonic() - t0)
        if out != "ack":
            failures.append(out)
        i += 1
        time.sleep(pace_s)
    times.sort()
    return {"n": i, "acked": i - len(failures), "worst": times[-1],
            "median": times[len(times) // 2], "failures": failures[:3]}


def _watch_victim(lab: Lab, d: LiveDaemon, seconds: float, run_id: str
                  ) -> tuple[dict[str, Any], float]:
    """Run the victim (uid OTHER) for ``seconds`` while sampling the daemon's RSS: its
    result and the RSS peak (bytes)."""
    victim = Child(_victim, str(d.socket), run_id, seconds, uid=OTHER)
    peak = 0
    deadline = time.monotonic() + seconds + VICTIM_WAIT_S * 3 + 60
    while True:
        with contextlib.suppress(OSError):
            peak = max(peak, d.rss_bytes())
        msg = victim.recv(0.2)
        if msg is None:
            if time.monotonic() > deadline:
                victim.kill()
                raise RuntimeError("the victim did not finish")
            continue
        victim.reap()
        if "error" in msg:
            raise RuntimeError(f"the victim failed: {msg['error']}")
        return msg["result"], peak


def _victim_check(lab: Lab, d: LiveDaemon, res: dict[str, Any], run_id: str) -> Check:
    bound = VICTIM_QUICK_S if lab.quick else VICTIM_TARGET_S
    got = len(stored(d.store, run_id))
    why = []
    if res["worst"] > bound:
        why.append(f"worst acknowledgement {res['worst']:.2f} s (target {bound:g} s)")
    if res["failures"]:
        why.append(f"{res['n'] - res['acked']} of {res['n']} not acknowledged "
                   f"({res['failures'][0]})")
    if got < res["acked"]:
        why.append(f"{got} of its {res['acked']} acknowledged records stored")
    return Check(f"victim worst ack {res['worst']:.2f} s, median {res['median'] * 1000:.0f} ms,"
                 f" {got} of {res['n']} stored", "; ".join(why) or None)


def _rss_check(before: int, peak: int) -> Check:
    grown = (peak - before) / 2**20
    return Check(f"daemon RSS {before / 2**20:.0f} -> peak {peak / 2**20:.0f} MB",
                 f"RSS grew {grown:.0f} MB (bound {FLOOD_RSS_MB})" if grown > FLOOD_RSS_MB
                 else None)


def _connect(sock: str, job: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock)
    s.sendall(protocol.encode(F.HELLO, {"pid": os.getpid(), "host": HOST, "job": job}))
    s.setblocking(False)
    return s


class _Stream:
    """One flooding connection: the frames it sends next (``chunk()`` makes more), the
    replies it reads and drops (counting ERROR codes)."""

    def __init__(self, sock: socket.socket, chunk: Callable[[], bytes]) -> None:
        self.sock = sock
        self.chunk = chunk
        self.out = b""
        self.decoder = protocol.Decoder(1 << 24, protocol.ACCEPTED_VERSIONS)
        self.closed = False

    def pump(self, errors: dict[str, int]) -> int:
        """Send what the socket takes now; read what came back. Returns bytes sent."""
        sent = 0
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while True:
                try:
                    data = self.sock.recv(1 << 20)
                except (BlockingIOError, InterruptedError):
                    raise
                except OSError:  # reset: the daemon dropped this connection
                    data = b""
                if not data:
                    self.closed = True
                    return 0
                self.decoder.feed(data)
                with contextlib.suppress(protocol.ProtocolError):
                    for ftype, p in self.decoder.frames():
                        if ftype is F.ERROR:
                            code = str(p.get("code"))
                            errors[code] = errors.get(code, 0) + 1
        try:
            while True:
                if not self.out:
                    self.out = self.chunk()
                n = self.sock.send(self.out)
                sent += n
                self.out = self.out[n:]
                if self.out:
                    return sent
        except (BlockingIOError, InterruptedError):
            return sent
        except OSError:
            self.closed = True
            return sent


def _flood(chan: _Chan, sock: str, kind: str, conns: int, seconds: float) -> dict[str, Any]:
    """``conns`` connections of this uid sending ``kind`` frames (sync, record, scratch, fat)
    as fast as the daemon takes them, until the parent says stop or ``seconds`` pass."""
    import select

    streams = []
    tag = uuid.uuid4().hex[:8]
    for k in range(conns):
        try:
            s = _connect(sock, f"flood-{kind}")
        except OSError:
            break
        streams.append(_Stream(s, _chunks(kind, f"{kind}-{tag}-{k}", s)))
    chan.send({"flooding": len(streams)})
    errors: dict[str, int] = {}
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        live = [st for st in streams if not st.closed]
        if not live:
            break
        r, w, _ = select.select([chan.r, *[st.sock for st in live]],
                                [st.sock for st in live], [], 0.1)
        if chan.r in r:
            break
        for st in live:
            if st.sock in w or st.sock in r:
                sent += st.pump(errors)
    closed = sum(1 for st in streams if st.closed)
    for st in streams:
        st.sock.close()
    return {"conns": len(streams), "sent": sent, "errors": errors, "closed": closed}


def _chunks(kind: str, run_id: str, s: socket.socket) -> Callable[[], bytes]:
    """The frame maker of one flooding connection (the first call may send a CONTEXT)."""
    seq = [1]

    def nxt() -> int:
        seq[0] += 1
        return seq[0]

    if kind == "sync":
        return lambda: b"".join(jframe(F.SYNC, f'{{"s":{nxt()}}}') for _ in range(2000))
    if kind in ("record", "fat"):
        body = make_record(run_id, 0).to_json()
        if kind == "fat":  # 250 params of 950 characters: ~240 KB a record
            body["params"] = {f"p{i}": chr(97 + i % 26) * 950 for i in range(250)}
        text = json.dumps({"s": 777777777, "rec": {**body, "index": 888888888}},
                          separators=(",", ":"))
        head, rest = text.split("777777777")
        mid, tail = rest.split("888888888")
        per = 1 if kind == "fat" else 100

        def records() -> bytes:
            out = []
            for _ in range(per):
                n = nxt()
                out.append(jframe(F.RECORD, f"{head}{n}{mid}{n}{tail}"))
            return b"".join(out)
        return records
    if kind == "scratch":
        ctx = protocol.encode(F.CONTEXT, {"s": nxt(), "c": 1, "run_id": run_id,
                                          "pid": os.getpid(), "host": HOST,
                                          "backend": "none", "counters": [], "scratch": True})
        first = [ctx]

        def pairs() -> bytes:
            out = first[:]
            first.clear()
            t = time.monotonic_ns()
            for _ in range(1000):
                n = nxt()
                out.append(protocol.encode_open(n, 1, n, t, 0, 0, "cal"))
                out.append(protocol.encode_close(nxt(), 1, n, t, t + 10, 0))
            return b"".join(out)
        return pairs
    raise ValueError(kind)


def _flood_attack(lab: Lab, kind: str, conns: int, d: LiveDaemon
                  ) -> tuple[list[Check], dict[str, Any]]:
    """Flood ``kind`` from ``conns`` connections of uid NOBODY while the victim measures: the
    victim's check, the RSS check, the daemon's health after, and what the flood saw (its
    ERROR codes). On a daemon of its own (``d``: started, killed by the caller), as what was
    sent before a connection closed is still handled after it (the daemon is busy a while)."""
    seconds = lab.scale(20, 2)
    before = d.rss_bytes()
    attacker = Child(_flood, str(d.socket), kind, conns, seconds + VICTIM_WAIT_S + 60,
                     uid=NOBODY)
    started = attacker.recv(60)
    if not started or "flooding" not in started:
        attacker.kill()
        return one("", f"the flood did not start: {started}"), {}
    time.sleep(min(2.0, seconds / 3))  # the flood under way
    victim_run = new_run(f"victim-{kind}")
    res, peak = _watch_victim(lab, d, seconds, victim_run)
    with contextlib.suppress(OSError):  # an attacker that failed says why in result()
        attacker.send({"stop": True})
    flood = attacker.result(120)
    note = (f"{flood['conns']} connections sent {flood['sent'] / 2**20:.0f} MiB"
            + (f", ERRORs {flood['errors']}" if flood["errors"] else ""))
    victim = _victim_check(lab, d, res, victim_run)
    victim.name = f"{victim.name}; {note}"
    return [victim, _rss_check(before, peak),
            *[Check(f"daemon after the {kind} flood", w) for w in health(d)]], flood


def _own_flood(lab: Lab, kind: str, conns: int,
               after: Callable[[LiveDaemon], list[Check]] | None = None) -> list[Check]:
    """The flood on a daemon of its own; ``after``: more checks of that daemon, after it."""
    if not as_root():
        return [Check("", f"not root: needs uids {NOBODY} and {OTHER}", True)]
    d = lab.special(f"flood-{kind}").start()
    try:
        checks = _flood_attack(lab, kind, conns, d)[0]
        return checks + (after(d) if after is not None else [])
    finally:
        d.kill9()


def _scratch_kept(d: LiveDaemon) -> list[Check]:
    """What the scratch flood's uid has in the store after it: nothing (records, clock domains,
    anchors; a daemon without the clock tables, older than them, has none of those)."""
    kept: dict[str, int] = {}
    conn = sqlite3.connect(f"file:{d.store}?mode=ro", uri=True, timeout=10)
    try:
        for table in ("records", "clock_domains", "clock_anchors"):
            try:
                kept[table] = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE uid = ?",
                                           (NOBODY,)).fetchone()[0]
            except sqlite3.OperationalError:  # no such table
                kept[table] = 0
    finally:
        conn.close()
    left = {k: v for k, v in kept.items() if v}
    return [Check(f"the scratch flood left nothing of uid {NOBODY} in the store (records, clock "
                  "domains, anchors)", f"it left {left}" if left else None)]


@attack("fairness and quotas", "SYNC flood (64 connections of one uid)")
def sync_flood(lab: Lab) -> list[Check]:
    return _own_flood(lab, "sync", 64)


@attack("fairness and quotas", "RECORD flood (64 connections of one uid)")
def record_flood(lab: Lab) -> list[Check]:
    return _own_flood(lab, "record", 64)


@attack("fairness and quotas", "scratch OPEN/CLOSE flood (250 connections of one uid)")
def scratch_flood(lab: Lab) -> list[Check]:
    return _own_flood(lab, "scratch", lab.scale(250, 64), _scratch_kept)


@attack("fairness and quotas", "fat RECORDs filling a 48 MB store file system")
def fat_records(lab: Lab) -> list[Check]:
    mnt = _mount_tmpfs(lab, "fat", "48m")
    if isinstance(mnt, Check):
        return [mnt]
    d = lab.special("fat", store_dir=mnt / "state")
    try:
        d.start()
        checks, flood = _flood_attack(lab, "fat", 4, d)
        log = d.log_text()
        quota = flood.get("errors", {}).get("quota", 0)
        checks.append(Check(f"uid {NOBODY} refused with ERROR quota ({quota} records)",
                            None if quota else "never refused: the file system filled"))
        checks.append(Check("no 'disk full' for the others",
                            "the daemon logged disk full" if "disk full" in log.lower()
                            else None))
        return checks
    finally:
        d.kill9()
        _umount(mnt)


def _box_ends(chan: _Chan, sock: str, conns: int, box_bytes: int) -> dict[str, Any]:
    """One memory file holding ``box_bytes`` of SYNC frames, handed as the black box of
    ``conns`` connections (each BUFFER names box 7, the head covers the bytes each sent),
    which then all close: the daemon reads each box at each end."""
    hello = protocol.encode(F.HELLO, {"pid": os.getpid(), "host": HOST, "job": "box"})
    buffer = protocol.encode(F.BUFFER, {"s": 1, "box": 7})
    frames, n, size = [], 2, 0
    while size < box_bytes:
        f = jframe(F.SYNC, f'{{"s":{n}}}')
        frames.append(f)
        size += len(f)
        n += 1
    data = b"".join(frames)
    from counterd.wire.spool import BOX_MAGIC, HEAD_BYTES

    fd = os.memfd_create("attack-box", os.MFD_CLOEXEC)
    os.write(fd, struct.pack("<8sQQQ", BOX_MAGIC, len(data), len(hello) + len(buffer), 7)
             .ljust(HEAD_BYTES, b"\0") + data)
    socks = []
    for _ in range(conns):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(sock)
            s.sendall(hello)
            s.sendmsg([buffer], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
        except OSError:
            s.close()
            break
        socks.append(s)
    time.sleep(0.5)  # every BUFFER taken
    for s in socks:
        s.close()
    os.close(fd)
    return {"conns": len(socks), "box": len(data)}


def _box_attack(lab: Lab, conns: int) -> list[Check]:
    if not as_root():
        return [Check("", f"not root: needs uids {NOBODY} and {OTHER}", True)]
    d = lab.special(f"box{conns}").start()  # left busy with the boxes: killed after
    try:
        before = d.rss_bytes()
        box = lab.scale(8 << 20, 1 << 20)
        ends = Child(_box_ends, str(d.socket), conns, box, uid=NOBODY).result(300)
        victim_run = new_run("victim-box")
        res, peak = _watch_victim(lab, d, lab.scale(20, 2), victim_run)
        victim = _victim_check(lab, d, res, victim_run)
        victim.name += f"; {ends['conns']} ends of a {ends['box'] / 2**20:.0f} MiB box"
        return [victim, _rss_check(before, peak), *[Check("daemon after the box ends", w)
                                                    for w in health(d)]]
    finally:
        d.kill9()


@attack("fairness and quotas", "an 8 MiB black box handed to 20 connections that close")
def box_20(lab: Lab) -> list[Check]:
    return _box_attack(lab, 20)


@attack("fairness and quotas", "an 8 MiB black box handed to 256 connections of one uid")
def box_256(lab: Lab) -> list[Check]:
    return _box_attack(lab, lab.scale(256, 64))


def _query_flood(chan: _Chan, sock: str, runs: int, queries: int, wait_s: float
                 ) -> dict[str, Any]:
    """``runs`` runs of this uid (one record each), then ``queries`` QUERY runs frames in one
    write, alternately with a cursor past the end and from the start (a full page each),
    reading the answers for ``wait_s`` at most (the daemon answers one at a time per
    connection; what is left when it closes is not answered)."""
    c = Conn(Path(sock), job="queries")
    tag = uuid.uuid4().hex[:8]
    seq = 0
    for start in range(0, runs, 500):
        batch = []
        for i in range(start, min(start + 500, runs)):
            seq += 1
            batch.append(protocol.encode(F.RECORD, {"s": seq, "rec": make_record(
                f"q-{tag}-{i}").to_json()}))
        c.send(b"".join(batch))
        c.wait(lambda s=seq: c.acked() >= s or bool(c.errors()), 300)
    chan.send({"runs": runs, "acked": c.acked() >= seq})
    chan.recv(60)
    past = [2**62, "~", 2**31]
    frames = []
    for q in range(queries):
        seq += 1
        payload: dict[str, Any] = {"s": seq, "what": "runs"}
        if q % 2 == 0:
            payload["after"] = past
        frames.append(protocol.encode(F.QUERY, payload))
    t0 = time.monotonic()
    c.send(b"".join(frames))
    got = c.wait(lambda: sum(1 for t, _ in c.frames if t in (F.RESULT, F.ERROR)) >= queries,
                 wait_s)
    answered = sum(1 for t, _ in c.frames if t in (F.RESULT, F.ERROR))
    c.close()
    return {"answered": answered, "took": time.monotonic() - t0, "all": got is True}


@attack("fairness and quotas", "2,000 pipelined QUERY runs after 20,000 own runs")
def query_flood(lab: Lab) -> list[Check]:
    if not as_root():
        return [Check("", f"not root: needs uids {NOBODY} and {OTHER}", True)]
    d = lab.daemon
    runs, queries = lab.scale(20_000, 1_000), lab.scale(2_000, 100)
    seconds = lab.scale(20, 2)
    attacker = Child(_query_flood, str(d.socket), runs, queries, seconds + 10, uid=NOBODY)
    made = attacker.recv(600)
    if not made or not made.get("acked"):
        attacker.kill()
        return one("", f"the attacker's runs were not stored: {made}")
    before = d.rss_bytes()
    attacker.send({"go": True})
    time.sleep(0.3)
    victim_run = new_run("victim-query")
    res, peak = _watch_victim(lab, d, seconds, victim_run)
    flood = attacker.result(900)
    victim = _victim_check(lab, d, res, victim_run)
    victim.name += (f"; {runs} runs, {flood['answered']} of {queries} QUERYs answered in "
                    f"{flood['took']:.1f} s")
    return [victim, _rss_check(before, peak)]


# -- the run -----------------------------------------------------------------------------------
def run(only: str | None, quick: bool, src: Path = ROOT) -> list[tuple[str, str, Check]]:
    results: list[tuple[str, str, Check]] = []
    with tempfile.TemporaryDirectory(prefix="counterd-attacks-") as tmp_name:
        tmp = Path(tmp_name)
        os.chmod(tmp, 0o755)
        lab = Lab(tmp, quick, LiveDaemon(tmp / "main", src=src).start(), src)
        try:
            _valid_inputs(lab)
            for category, name, fn in ATTACKS:
                if only and not category.startswith(only.lower()):
                    continue
                t0 = time.monotonic()
                try:
                    checks = fn(lab)
                except Exception as exc:  # the attack's own failure is reported, not hidden
                    checks = [Check("", f"attack aborted: {type(exc).__name__}: {exc}")]
                after = health(lab.daemon)
                took = time.monotonic() - t0
                for check in checks:
                    if not check.skipped and after:
                        check.why = "; ".join(filter(None, [check.why, *after]))
                    label = f"{name}: {check.name}" if check.name else name
                    results.append((category, label, check))
                    status = "skipped" if check.skipped else ("FAILED" if check.why else "ok")
                    print(f"{category:<20} {label:<78} {status:<7} "
                          f"{check.why or ''}"[:400] + f"  [{took:.1f} s]", flush=True)
                if after:  # measure the next attack on a daemon that serves
                    if lab.daemon.alive():
                        lab.daemon.kill9()
                    lab.daemon.start()
        finally:
            lab.daemon.stop()
    return results


def tally(results: list[tuple[str, str, Check]]) -> str:
    rows = ["category             | tried | failed | skipped",
            "---------------------|-------|--------|--------"]
    for cat in CATEGORIES:
        mine = [c for k, _, c in results if k == cat]
        if not mine:
            continue
        tried = [c for c in mine if not c.skipped]
        failed = sum(1 for c in tried if c.why)
        rows.append(f"{cat:<20} | {len(tried):>5} | {failed:>6} | {len(mine) - len(tried):>7}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", metavar="CATEGORY", default=None,
                    help="one category (a prefix is enough): " + ", ".join(CATEGORIES))
    ap.add_argument("--quick", action="store_true", help="smaller floods, no slowloris")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any attack failed")
    ap.add_argument("--daemon-src", type=Path, default=ROOT, metavar="DIR",
                    help="run the daemon and the file commands from this source tree (e.g. "
                    "`git archive` of an older commit, with counterd/_native's built library "
                    "copied in) to see the attacks catch what a fix removed; the marker "
                    "clients stay this tree's (default: this tree)")
    args = ap.parse_args()
    if args.only and not any(c.startswith(args.only.lower()) for c in CATEGORIES):
        print(f"attacks.py: --only {args.only!r} names no category ({', '.join(CATEGORIES)})",
              file=sys.stderr)
        return 2
    import logging

    logging.getLogger("counterd").addHandler(logging.NullHandler())  # the canary's warnings
    logging.getLogger("counterd").propagate = False
    t0 = time.monotonic()
    results = run(args.only, args.quick, args.daemon_src.resolve())
    print()
    print(tally(results))
    print(f"{len(results)} checks in {time.monotonic() - t0:.0f} s"
          + (" (--quick)" if args.quick else ""))
    print(host_line() + ("" if args.daemon_src.resolve() == ROOT
                         else f"; daemon and file commands from {args.daemon_src}"))
    failed = any(c.why and not c.skipped for _, _, c in results)
    return 1 if args.strict and failed else 0


if __name__ == "__main__":
    sys.exit(main())
