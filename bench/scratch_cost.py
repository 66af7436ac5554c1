"""What one marker connection costs the daemon, counted rather than timed: a scratch-only
connection (the markers' calibration, ``Recorder.calibrate``) against a real run's.

    flock /tmp/bench.lock .venv/bin/python bench/scratch_cost.py [--daemon-src DIR ...]
        [--connections 2000] [--traced 200] [--pairs 64]

For each ``--daemon-src`` tree (default: this one; give it twice, e.g. this tree and a worktree
of an older commit, to compare: the client side is always this tree's) a fresh ``counterd run``
is started on temp paths, then ``--connections`` connections one after another, each as the
markers' socket sink makes it: HELLO (the markers' own, :func:`counterd.markers.sinks.link.
hello_payload`), one CONTEXT (``scratch``, or a real run's), ``--pairs`` OPEN/CLOSE pairs and a
SYNC, waits for the ACK of the SYNC, closes. Printed per connection, for each kind:

* the CPU time of the daemon's loop thread (its main thread: /proc/PID/task/PID/stat utime +
  stime) and of the whole daemon (the writer, sampler and metrics threads too), over
  ``--connections`` connections (clock ticks: the resolution per connection is one tick over
  that count). The host is shared: these vary with its load (the load average is printed);
* under ``strace -f`` (``--traced`` connections, a second daemon: strace slows it) the system
  calls of the loop thread and of the other threads, the loop's opens and readlinks of
  ``/proc`` files, and the store's writes and syncs (``pwrite64``, ``fdatasync``/``fsync``):
  deterministic counts, independent of the load (``--traced 0`` skips it; needs ptrace).

Exits 0 (a measurement); 2 with one line for bad options.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import Daemon  # noqa: E402
from _host import host_line  # noqa: E402

from counterd.markers.sinks.link import hello_payload  # noqa: E402
from counterd.wire import protocol  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
F = protocol.FrameType
HOST = socket.gethostname()
KINDS = ("scratch", "real")
_LINE = re.compile(r"^(\d+)\s+(\w+)\(")


@dataclass
class Cost:
    """Per connection: CPU seconds (loop thread, whole daemon), and the strace counts."""

    loop_cpu_s: float = 0.0  # the median over rounds
    all_cpu_s: float = 0.0
    loop_cpu_min_s: float = 0.0  # the least of the rounds
    loop_calls: float = -1.0  # -1: not traced
    other_calls: float = -1.0
    loop_proc: float = -1.0
    store_writes: float = -1.0
    store_syncs: float = -1.0


def _thread_cpu(pid: int, tid: int | None = None) -> float:
    where = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    fields = Path(where).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _recv_until(sock: socket.socket, dec: protocol.Decoder, want: F, seq: int) -> None:
    """Read replies until a ``want`` frame with ``s`` >= ``seq`` (WELCOME: any)."""
    while True:
        for ftype, payload in dec.frames():
            if ftype is F.ERROR:
                raise RuntimeError(f"the daemon refused a frame: {payload}")
            if ftype is want and (want is F.WELCOME or payload.get("s", 0) >= seq):
                return
        data = sock.recv(1 << 16)
        if not data:
            raise RuntimeError("the daemon closed the connection")
        dec.feed(data)


def one_connection(path: Path, kind: str, pairs: int, run_id: str) -> None:
    """One connection of ``kind`` (scratch: its one context scratch; real: a run's records)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(str(path))
        s.sendall(protocol.encode(F.HELLO, hello_payload("scratch-cost", kind == "scratch")))
        dec = protocol.Decoder(versions=protocol.ACCEPTED_VERSIONS)
        _recv_until(s, dec, F.WELCOME, 0)
        out = [protocol.encode(F.CONTEXT, {
            "s": 1, "c": 1, "run_id": run_id, "pid": os.getpid(), "host": HOST,
            "backend": "none", "counters": [], "scratch": kind == "scratch"})]
        seq = 1
        t = time.monotonic_ns()
        for i in range(pairs):
            out.append(protocol.encode_open(seq + 1, 1, i, t, 0, 0, "calibration"))
            out.append(protocol.encode_close(seq + 2, 1, i, t, t + 10, 0))
            seq += 2
        seq += 1
        out.append(protocol.encode(F.SYNC, {"s": seq}))
        s.sendall(b"".join(out))
        _recv_until(s, dec, F.ACK, seq)


def cpu_costs(srcs: list[Path], kinds: list[str], n: int, pairs: int, rounds: int
              ) -> dict[tuple[Path, str], list[tuple[float, float]]]:
    """(src, kind) -> per round, (loop thread, whole daemon) CPU seconds per connection: one
    daemon per tree, all running at once, served in turn (``n`` / ``rounds`` connections of a
    kind to each daemon per round, the daemons' order rotated each round), so that the host's
    load, which moves while this runs, weighs on every daemon alike."""
    per = max(1, n // rounds)
    out: dict[tuple[Path, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="scratch-cost-") as tmp:
        daemons: list[Daemon] = []
        try:
            for i, src in enumerate(srcs):
                (Path(tmp) / str(i)).mkdir()
                daemons.append(Daemon(Path(tmp) / str(i), interval=3600.0,
                                      metrics_extra="grace_s = 86400\n", src=src))
            run_id = f"cost-{uuid.uuid4().hex[:8]}"
            for d in daemons:
                for kind in kinds:  # warm: imports and first-use paths out of the figure
                    for _ in range(20):
                        one_connection(d.socket, kind, pairs, f"{run_id}-{kind}")
            for r in range(rounds):
                order = list(range(len(daemons)))
                order = order[r % len(order):] + order[:r % len(order)]
                for kind in kinds:
                    for i in order:
                        d, pid = daemons[i], daemons[i].proc.pid
                        loop0, all0 = _thread_cpu(pid, pid), _thread_cpu(pid)
                        for k in range(per):
                            one_connection(d.socket, kind, pairs, f"{run_id}-{r}-{k}")
                        time.sleep(0.2)  # the writer's last commit
                        out.setdefault((srcs[i], kind), []).append(
                            ((_thread_cpu(pid, pid) - loop0) / per,
                             (_thread_cpu(pid) - all0) / per))
        finally:
            for d in daemons:
                d.stop()
    return out


def traced_cost(src: Path, kind: str, n: int, pairs: int
                ) -> tuple[tuple[float, ...], dict[str, float]]:
    """(loop syscalls, other threads' syscalls, loop /proc opens+readlinks, store pwrite64,
    store syncs) per connection, counted by ``strace -f`` over ``n`` connections, and the
    loop's per connection by system call (those of /proc files apart)."""
    with tempfile.TemporaryDirectory(prefix="scratch-cost-") as tmp:
        d = Daemon(Path(tmp), interval=3600.0, metrics_extra="grace_s = 86400\n", src=src)
        out = Path(tmp) / "strace.txt"
        tracer = None
        try:
            run_id = f"cost-{uuid.uuid4().hex[:8]}"
            for _ in range(20):
                one_connection(d.socket, kind, pairs, run_id)
            time.sleep(0.5)
            pid = d.proc.pid
            tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", str(out), "-p", str(pid)],
                                      stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while (not out.exists() or not out.stat().st_size) and time.monotonic() < deadline:
                one_connection(d.socket, kind, 0, run_id)  # until strace is attached: a
                time.sleep(0.05)  # syscall of the loop's shows in its file
            mark = out.read_text().count("\n")
            for k in range(n):
                one_connection(d.socket, kind, pairs, f"{run_id}-{k}")
            time.sleep(1.0)  # the writer's last commit
            tracer.send_signal(signal.SIGINT)
            tracer.wait(30)
            tracer = None
            lines = out.read_text().splitlines()[mark:]
        finally:
            if tracer is not None:
                tracer.kill()
                tracer.wait()
            d.stop()
    calls: collections.Counter[tuple[bool, str]] = collections.Counter()
    proc = 0
    for line in lines:
        m = _LINE.match(line)
        if m is None or "resumed>" in line:
            continue  # a call another thread's interrupted: counted once, where it began
        loop = int(m.group(1)) == pid
        calls[loop, m.group(2)] += 1
        if loop and m.group(2) in ("openat", "readlink", "readlinkat") and '"/proc/' in line:
            proc += 1
            calls[loop, m.group(2) + " /proc"] += 1
            calls[loop, m.group(2)] -= 1
    loop_n = sum(v for (lp, _), v in calls.items() if lp)
    other_n = sum(v for (lp, _), v in calls.items() if not lp)
    writes = sum(v for (lp, name), v in calls.items() if not lp and name == "pwrite64")
    syncs = sum(v for (lp, name), v in calls.items() if not lp
                and name in ("fdatasync", "fsync"))
    detail = {name: v / n for (lp, name), v in sorted(calls.items()) if lp and v}
    return (loop_n / n, other_n / n, proc / n, writes / n, syncs / n), detail


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon-src", type=Path, action="append", metavar="DIR",
                    help="source tree of the daemon to measure (repeatable; default: this one)")
    ap.add_argument("--connections", type=int, default=2000,
                    help="connections per daemon and kind for the CPU times, in --rounds")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--traced", type=int, default=200,
                    help="connections counted under strace -f (0: skip)")
    ap.add_argument("--pairs", type=int, default=64,
                    help="OPEN/CLOSE pairs per connection (the markers' calibration: 64)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--detail", action="store_true",
                    help="also print the loop thread's system calls per connection by name")
    args = ap.parse_args()
    srcs = [p.resolve() for p in (args.daemon_src or [ROOT])]
    kinds = [k for k in args.kinds.split(",") if k]
    bad = [str(p) for p in srcs if not (p / "counterd" / "daemon" / "service.py").is_file()]
    if bad:
        print(f"scratch_cost.py: --daemon-src {bad[0]} holds no counterd daemon: give a "
              "source tree (a checkout or worktree of this repository)", file=sys.stderr)
        return 2
    if any(k not in KINDS for k in kinds) or not kinds:
        print(f"scratch_cost.py: --kinds {args.kinds!r}: give some of {', '.join(KINDS)}",
              file=sys.stderr)
        return 2
    if not 1 <= args.rounds <= args.connections or args.traced < 0 or args.pairs < 0:
        print("scratch_cost.py: give --connections >= --rounds >= 1, --traced >= 0 and "
              "--pairs >= 0", file=sys.stderr)
        return 2
    if args.traced and shutil.which("strace") is None:
        print("scratch_cost.py: strace is not installed: install it or pass --traced 0",
              file=sys.stderr)
        return 2
    print(host_line())
    print(f"{args.connections} connections per daemon and kind in {args.rounds} rounds (cpu), "
          f"{args.traced} (strace), {args.pairs} OPEN/CLOSE pairs each; load average before: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    cpu = cpu_costs(srcs, kinds, args.connections, args.pairs, args.rounds)
    print("cpu us per connection: loop thread median (least) over the rounds, whole daemon "
          "median; the rest: counts per connection under strace -f")
    print(f"{'daemon':<28} {'kind':<8} {'loop cpu us':>16} {'all cpu us':>10} "
          f"{'loop calls':>10} {'other calls':>11} {'loop /proc':>10} {'pwrite64':>8} "
          f"{'syncs':>6}")
    for src in srcs:
        name = str(src) if src != ROOT else f"{src} (this tree)"
        for kind in kinds:
            rows = cpu[src, kind]
            c = Cost(statistics.median(x for x, _ in rows),
                     statistics.median(y for _, y in rows), min(x for x, _ in rows))
            detail: dict[str, float] = {}
            if args.traced:
                counts, detail = traced_cost(src, kind, args.traced, args.pairs)
                (c.loop_calls, c.other_calls, c.loop_proc, c.store_writes,
                 c.store_syncs) = counts
            traced = (f"{c.loop_calls:>10.2f} {c.other_calls:>11.2f} {c.loop_proc:>10.2f} "
                      f"{c.store_writes:>8.2f} {c.store_syncs:>6.2f}" if args.traced
                      else "(not traced)")
            print(f"{name[-28:]:<28} {kind:<8} "
                  f"{f'{c.loop_cpu_s * 1e6:.0f} ({c.loop_cpu_min_s * 1e6:.0f})':>16} "
                  f"{c.all_cpu_s * 1e6:>10.1f} {traced}", flush=True)
            if args.detail and detail:
                print("    loop per connection: " + ", ".join(
                    f"{name} {v:.2f}" for name, v in detail.items()), flush=True)
    print("load average after: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
