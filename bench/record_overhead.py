"""Whole-run recording overhead: ``counterd record`` against ``perf stat -e task-clock``.

Both wrap the same programs: a numpy job of about one second that marks ten supersteps (the
issue's target, <= 1.02), ``sleep`` for as long, which leaves the CPUs idle (what the
recorder costs when its own work after the command's exec takes no CPU from the command), and
``python -c "import numpy"``, a command of about 0.1 s that ends before the recorder's own
work has begun (it waits for the command's start-up: counterd.commands.recording.STARTUP_S),
for which there is no target.
Runs alternate (perf stat, counterd record, perf stat, ...) so a drift of the host falls on
both alike, and each is timed from outside (wall clock of the whole command, start to exit).
The figure is the median over pairs of each pair's ratio (the two runs of a pair are seconds
apart, so the host's drift, large in a VM, cancels), with the ratio of the medians beside it.
counterd record runs as a user's second recording on the host does: with the perf plan the
first one saved (counterd.launch), in a directory of the benchmark's own. Last, the time each
tool takes from its own start to its command's first instruction (a C program that prints the
monotonic clock as it starts), alternating too, on the host as it is then.

Each program is timed twice: on an idle host, and with a perf event held open elsewhere (a
``perf stat -- sleep`` in the background, as the counterd daemon's sampling or any other perf
session holds one). The difference is the kernel's: the first task event opened while none
is open enables perf's scheduler hooks and waits for an RCU grace period (account_event in
kernel/events/core.c: static_branch_enable, then synchronize_rcu), about 10 ms on this kind of
VM; the last one closed leaves them on for a second (perf_sched_work, HZ). Both perf stat and
counterd record pay it whenever they open first, which on an idle host depends on the phase of
the alternating runs against that second.

With ``--against REV`` (a revision of this repository: a commit, a tag, ``HEAD~1``) each round
also runs ``counterd record`` from that revision (exported to a temporary directory, its C
extensions built there, its own saved plan), after this tree's in even rounds and before it in
odd ones, and prints the median over rounds of the two recorders' difference: a before/after
comparison in one run.

    .venv/bin/python bench/record_overhead.py [--pairs 9] [--seconds 1.0] [--backend perf]
                                              [--hosts idle,held] [--against REV]
                                              [--pyperf FILE]

With ``--pyperf FILE`` every timed command's wall time is also written as pyperf JSON
(bench/_pyperf.py): ``record_overhead/HOST/PROGRAM/perf stat``, ``.../counterd record
BACKEND`` (and ``... at REV``), ``record_overhead/to first instruction/...``; ``python -m
pyperf compare_to OLD NEW`` compares two runs (the ratios are not written: they are not
timings).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._host import host_line  # noqa: E402
from bench._pyperf import PyperfOut, add_option  # noqa: E402

PROGRAM = """
import sys, time
import numpy as np
import counterd

budget = float(sys.argv[1])
rng = np.random.default_rng(0)
a = rng.random(1 << 20)
t_end = time.monotonic() + budget
step = 0
while step < 10:
    with counterd.superstep("work", i=step):
        stop = time.monotonic() + budget / 10
        while time.monotonic() < stop:
            a = np.sort(a[::-1])
    step += 1
"""


SHORT = "import numpy (a command of about 0.1 s: no target)"

STAMP = """
#include <stdio.h>
#include <time.h>
int main(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t); /* time.monotonic_ns's clock */
    printf("%lld\\n", (long long)t.tv_sec * 1000000000LL + t.tv_nsec);
    return 0;
}
"""


def start_latency(stat: list[str], rec: list[str], tmp: Path, pairs: int,
                  out: PyperfOut) -> None:
    """How long each tool takes from its own start to its command's first instruction: the
    command prints CLOCK_MONOTONIC as it starts (a C program: nothing runs before it)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("to the command's first instruction: not measured (no C compiler)")
        return
    stamp = tmp / "stamp"
    subprocess.run([cc, "-O2", "-x", "c", "-o", str(stamp), "-"], input=STAMP, text=True,
                   check=True)

    def latency(cmd: list[str]) -> float:
        t0 = time.monotonic_ns()
        out = subprocess.run([*cmd, str(stamp)], check=True, capture_output=True,
                             text=True).stdout
        return (int(out.split()[0]) - t0) / 1e6

    latency(stat), latency(rec)  # warm
    ts, tr = [], []
    for _ in range(pairs):
        ts.append(latency(stat))
        tr.append(latency(rec))
    print("to the command's first instruction (from each tool's own start), idle host:")
    for name, got in (("perf stat -e task-clock", ts), ("counterd record", tr)):
        q = statistics.quantiles(got)
        print(f"  {name:<30} median {statistics.median(got):6.2f} ms  (quartiles {q[0]:.2f}, "
              f"{q[2]:.2f})")
        out.add(f"record_overhead/to first instruction/{name}", [ms / 1e3 for ms in got])


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env=env)
    return time.monotonic() - t0


def cli_module(tree: Path) -> str:
    """The module of ``counterd``'s console entry in the checkout at ``tree``:
    counterd/commands/cli.py since the layered layout (issue 30), counterd/cli.py before it
    (``--against`` an older revision)."""
    return ("counterd.commands.cli" if (tree / "counterd" / "commands" / "cli.py").is_file()
            else "counterd.cli")


def console_script(tree: Path) -> str:
    """A ``counterd`` console script for the checkout at ``tree``, as pip writes one (the venv's
    own names the entry of the installed layout, which an older revision may not have)."""
    path = tree / "counterd-console"
    path.write_text(f"#!{sys.executable}\nimport sys\nfrom {cli_module(tree)} import console\n"
                    "if __name__ == '__main__':\n"
                    "    sys.argv[0] = sys.argv[0].removesuffix('.exe')\n"
                    "    sys.exit(console())\n")
    path.chmod(0o755)
    return str(path)


def export_revision(rev: str, dest: Path) -> dict[str, str]:
    """This repository at ``rev`` in ``dest``, its C extensions built in place and its bytecode
    compiled: the environment that makes the venv's ``counterd`` run that code (PYTHONPATH
    comes before the editable install) with a plan directory of its own."""
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest / "counterd")],
                   check=True, stdout=subprocess.DEVNULL)
    return {**os.environ, "PYTHONPATH": str(dest), "XDG_CACHE_HOME": str(dest / ".cache")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=9)
    ap.add_argument("--seconds", type=float, default=1.0, help="the program's own run time")
    ap.add_argument("--backend", default="perf", help="counterd record's backend")
    ap.add_argument("--hosts", default="idle,held",
                    help="idle: nothing else holds a perf event; held: a background perf stat "
                    "does (default: both)")
    ap.add_argument("--against", metavar="REV", default=None,
                    help="also run counterd record from this revision of the repository, "
                    "alternating, and print this tree's difference to it")
    add_option(ap)
    a = ap.parse_args()
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("perf is not installed: apt install linux-perf (or linux-tools)")
    py = sys.executable
    counterd_bin = str(Path(py).parent / "counterd")
    host = host_line()
    print(host)
    out = PyperfOut(a.pyperf, host)
    # The package's bytecode compiled once, as an installed package has it (pip compiles at
    # install; an editable install writes .pyc at first import unless PYTHONDONTWRITEBYTECODE
    # is set, as it is in some shells, which would charge every recording ~30 ms of compiling
    # counterd's own modules).
    subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "counterd")], check=True,
                   stdout=subprocess.DEVNULL)
    print(f"{a.pairs} alternating pairs per program, wall time of the whole command; "
          "counterd's bytecode compiled")
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp) / "job.py"
        prog.write_text(PROGRAM)
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # where the plan is kept
        os.environ.pop("XDG_RUNTIME_DIR", None)
        against = (export_revision(a.against, Path(tmp) / "against")
                   if a.against is not None else None)
        against_bin = console_script(Path(tmp) / "against") if against is not None else ""
        if against is not None:
            rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", a.against],
                                 check=True, capture_output=True, text=True).stdout.strip()
            print(f"against: counterd record at {a.against} ({rev}), after this tree's in even "
                  "rounds, before it in odd ones")
        programs = {f"numpy job, {a.seconds:.2f} s, 10 supersteps": [py, str(prog),
                                                                    str(a.seconds)],
                    f"sleep {a.seconds:.2f} (CPUs idle)": ["sleep", str(a.seconds)],
                    SHORT: [py, "-c", "import numpy"]}
        # The programs' names in the pyperf file (no commas or colons).
        short = dict(zip(programs, (f"numpy job {a.seconds:.2f} s", f"sleep {a.seconds:.2f} s",
                                    "import numpy"), strict=True))
        for host_of, (label, job) in [(h, p) for h in a.hosts.split(",")
                                      for p in programs.items()]:
            if host_of not in ("idle", "held"):
                raise SystemExit(f"--hosts: {host_of!r} is neither idle nor held")
            stat = [perf, "stat", "-e", "task-clock", "-x,", "-o", str(Path(tmp) / "stat.txt"),
                    "--", *job]
            rec = [counterd_bin, "record", "--backend", a.backend, "--out",
                   str(Path(tmp) / "rec.jsonl"), "--", *job]
            rec_b = [against_bin, *rec[1:]]
            holder = None
            if host_of == "held":  # one task event open on the host for the whole measurement
                holder = subprocess.Popen([perf, "stat", "-e", "task-clock", "-x,", "-o",
                                           os.devnull, "--", "sleep", "3600"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.5)
            try:
                timed(stat)  # warm the page cache for both; the first recording saves the plan
                timed(rec)
                ts, tr, tb = [], [], []
                if against is not None:
                    timed(rec_b, against)
                for i in range(a.pairs):
                    ts.append(timed(stat))
                    if against is not None and i % 2:  # the two recorders' order alternates
                        tb.append(timed(rec_b, against))
                    tr.append(timed(rec))
                    if against is not None and not i % 2:
                        tb.append(timed(rec_b, against))
            finally:
                if holder is not None:
                    holder.terminate()
                    holder.wait()
            ms, mr = statistics.median(ts), statistics.median(tr)
            ratio = statistics.median(r / s for s, r in zip(ts, tr, strict=True))
            extra = statistics.median(r - s for s, r in zip(ts, tr, strict=True))
            where = "idle host" if host_of == "idle" else "a perf event held open elsewhere"
            print(f"{label}, {where}:")
            print(f"  perf stat -e task-clock        median {ms:.3f} s  (min {min(ts):.3f}, "
                  f"max {max(ts):.3f})")
            print(f"  counterd record --backend {a.backend:<5} median {mr:.3f} s  (min "
                  f"{min(tr):.3f}, max {max(tr):.3f})")
            print(f"  ratio {ratio:.3f} (median of the pairs' ratios; {extra * 1e3:+.0f} ms; "
                  f"ratio of the medians {mr / ms:.3f}); "
                  + ("no target" if label == SHORT else
                     "target <= 1.02: " + ("met" if ratio <= 1.02 else "MISSED")))
            stem = f"record_overhead/{host_of}/{short[label]}"
            out.add(f"{stem}/perf stat", ts)
            out.add(f"{stem}/counterd record {a.backend}", tr, backend=a.backend)
            out.add(f"{stem}/counterd record {a.backend} at {a.against}", tb, backend=a.backend)
            if tb:
                diff = statistics.median(r - b for r, b in zip(tr, tb, strict=True))
                print(f"  counterd record at {a.against:<14} median {statistics.median(tb):.3f}"
                      f" s  (min {min(tb):.3f}, max {max(tb):.3f}); this tree {diff * 1e3:+.0f}"
                      " ms (median of the rounds' differences)")
        start_latency([perf, "stat", "-e", "task-clock", "-x,", "-o",
                       str(Path(tmp) / "stat.txt"), "--"],
                      [counterd_bin, "record", "--backend", a.backend, "--out",
                       str(Path(tmp) / "rec.jsonl"), "--"], Path(tmp), a.pairs, out)
    out.dump()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
