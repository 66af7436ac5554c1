"""Records lost when the daemon is killed (kill -9) and restarted while clients run, and the
peak memory of a client whose daemon is down the whole time.

    .venv/bin/python bench/client_restart.py [--clients 4] [--steps 20000] [--work-us 200]
                                              [--kills 2] [--down-steps 100000]

Part (a): ``--clients`` processes each mark ``--steps`` supersteps (backend none, a busy loop of
``--work-us`` per superstep so that the kills land mid-run); the daemon is killed with SIGKILL
``--kills`` times, each time restarted 0.5 s later on the same socket and store. The figures
are counted in the store (its ``runs`` rows) after the clients exit: stored directly, spilled
by the clients (then imported with ``counterd import``), and lost = marked - stored.

Part (b): one client marks ``--down-steps`` supersteps with its socket pointing at a daemon
that is not running; the figure is its peak RSS (``ru_maxrss`` from wait4) beside the same
program keeping its records in memory (``COUNTERD_SOCKET=off``), and the records in its spill
file.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import Daemon  # noqa: E402
from _host import host_line  # noqa: E402

from counterd.commands.importing import import_files, read_spill  # noqa: E402
from counterd.daemon.store import open_readonly  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLIENT = textwrap.dedent("""
    import sys, time, counterd
    steps, work_ns = int(sys.argv[1]), int(sys.argv[2])
    for i in range(steps):
        with counterd.superstep("s", i=i):
            t = time.perf_counter_ns() + work_ns
            while time.perf_counter_ns() < t:
                pass
""")


def client_env(tmp: Path, sock: Path | str, run_id: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    env.update(COUNTERD_SOCKET=str(sock), COUNTERD_RUN_ID=run_id, COUNTERD_BACKEND="none",
               COUNTERD_SPILL=str(tmp / "spill"), COUNTERD_FLUSH_TIMEOUT="60",
               PYTHONPATH=str(ROOT))
    return env


def stored_counts(store: Path) -> dict[str, tuple[int, int]]:
    """run id -> (records, incomplete records) in the store."""
    s = open_readonly(store)
    try:
        return {r.run_id: (r.records, r.incomplete) for r in s.runs()}
    finally:
        s.close()


def restarts(args: argparse.Namespace, tmp: Path) -> None:
    d = Daemon(tmp, synchronous="normal")
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, str(args.steps),
                               str(args.work_us * 1000)], env=client_env(tmp, d.socket, f"r{k}"),
                              stderr=subprocess.PIPE, text=True)
             for k in range(args.clients)]
    expected_s = args.steps * args.work_us / 1e6 * max(1, args.clients / (os.cpu_count() or 1))
    t0 = time.monotonic()
    for n in range(args.kills):
        time.sleep(max(0.0, t0 + expected_s * (n + 1) / (args.kills + 2) - time.monotonic()))
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(10)
        running = sum(p.poll() is None for p in procs)
        print(f"kill -9 #{n + 1} at {time.monotonic() - t0:.1f} s ({running} clients running)")
        time.sleep(0.5)
        d = Daemon(tmp, synchronous="normal")  # same socket and store
    errs = [p.communicate(timeout=600)[1] for p in procs]
    elapsed = time.monotonic() - t0
    direct = stored_counts(d.store)
    spilled = {f: sum(1 for _ in read_spill(f)) for f in (tmp / "spill").glob("*.jsonl")} \
        if (tmp / "spill").is_dir() else {}
    imported = import_files([tmp / "spill"], socket=d.socket) if spilled else None
    after = stored_counts(d.store)
    d.stop()
    print(f"{'client':<8} {'marked':>8} {'stored':>8} {'incomplete':>10} {'exit':>5}")
    for k, p in enumerate(procs):
        got, inc = direct.get(f"r{k}", (0, 0))
        print(f"{'r' + str(k):<8} {args.steps:>8} {got:>8} {inc:>10} {p.returncode:>5}")
    marked = args.clients * args.steps
    got = sum(after.get(f"r{k}", (0, 0))[0] for k in range(args.clients))
    incomplete = sum(after.get(f"r{k}", (0, 0))[1] for k in range(args.clients))
    print(f"(a) {args.clients} clients x {args.steps} supersteps, {args.kills} kill -9 + restart, "
          f"{elapsed:.1f} s: {sum(direct.get(f'r{k}', (0, 0))[0] for k in range(args.clients))}"
          f" stored directly, {sum(spilled.values())} spilled in {len(spilled)} files"
          + (f" ({imported.records} imported)" if imported else "")
          + f"; {got} of {marked} stored, {incomplete} incomplete, {marked - got} lost")
    for e in errs:
        if e.strip():
            print("client stderr: " + e.strip().replace("\n", " | ")[:300])


def peak_rss_kib(cmd: list[str], env: dict[str, str]) -> tuple[int, int]:
    """(exit status, peak RSS in KiB) of one child, from wait4."""
    p = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, usage.ru_maxrss


def daemon_down(args: argparse.Namespace, tmp: Path) -> None:
    cmd = [sys.executable, "-c", CLIENT, str(args.down_steps), "0"]
    down = tmp / "down"
    down.mkdir()
    rc, rss = peak_rss_kib(cmd, client_env(down, tmp / "no-daemon.sock", "down"))
    spilled = sum(sum(1 for _ in read_spill(f)) for f in (down / "spill").glob("*.jsonl"))
    rc_m, rss_m = peak_rss_kib(cmd, client_env(down, "off", "memory"))
    print(f"(b) {args.down_steps} supersteps, daemon down the whole time: peak RSS "
          f"{rss / 1024:.1f} MiB (exit {rc}), {spilled} records in the spill file; "
          f"records kept in memory instead (socket off): {rss_m / 1024:.1f} MiB (exit {rc_m})")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--work-us", type=int, default=200)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--down-steps", type=int, default=100000)
    args = ap.parse_args()
    print(host_line())
    with tempfile.TemporaryDirectory() as tmp:
        restarts(args, Path(tmp))
        daemon_down(args, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
