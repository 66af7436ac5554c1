"""What one counted process pays under Callgrind before its first superstep.

``counterd record --backend callgrind`` (and ``predict --pilot``, the microbench compute
patterns, the tests that use them) runs every process of a command under
``valgrind --tool=callgrind --cache-sim=yes ...`` (:func:`counterd.backends.callgrind.
valgrind_argv`), where a Python process's start-up and counterd's import and set-up run 50-100x
slower than natively. This runs, alternately:

* ``python -c pass``: the interpreter's own start-up and exit (site imports included);
* ``python -c "import counterd; with counterd.superstep('s'): pass"`` with the environment
  ``counterd record`` gives its command (``COUNTERD_BACKEND=callgrind``, a spool,
  ``COUNTERD_INIT=import``): start-up, counterd's import and set-up, one empty superstep, exit;
* the same after ``import numpy`` and ``from counterd.sim import StridedStream``, as
  ``examples/bsp_sum.py`` begins;

under the backend's own valgrind options and the host's cache geometry, and prints per program
the instructions Callgrind counted (deterministic: the figure to compare between trees), the
part of them before the first boundary call (start-up to the first superstep), and the CPU
seconds and wall seconds of the run (medians; those vary with the host's load).

    python bench/callgrind_startup.py [--rounds 3] [--against REV]

With ``--against REV`` the same programs also run with that revision of the repository
(exported, built and compiled: ``bench/record_overhead.py``), alternating with this tree's.
Run it under ``flock /tmp/bench.lock`` on a shared host.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _host import guarded, host_line  # noqa: E402
from record_overhead import export_revision  # noqa: E402

from counterd.backends.callgrind.dumps import dump_files, dumps_for_pid  # noqa: E402
from counterd.backends.callgrind.geometry import CallgrindGeometry  # noqa: E402
from counterd.backends.callgrind.valgrind import INSTALL_FIX, NAME, valgrind_argv, valgrind_path  # noqa: E402
from counterd.data.errors import BadInput  # noqa: E402

MARKED = "import counterd\nwith counterd.superstep('s'):\n    pass\n"
# As examples/bsp_sum.py begins: numpy, counterd, and the streams it feeds to the sim backend.
FEEDS = "import numpy\nfrom counterd.sim import StridedStream\n" + MARKED
PROGRAMS = (("python -c pass", "pass", False),
            ("import counterd + 1 superstep", MARKED, True),
            ("+ numpy, counterd.sim streams", FEEDS, True))


def _run(env: dict[str, str], code: str, marked: bool, geometry: CallgrindGeometry,
         tmp: Path) -> tuple[int, int, float, float]:
    """(instructions in all, before the first boundary call, CPU s, wall s) of one run."""
    out = Path(tempfile.mkdtemp(prefix="cg-", dir=tmp))
    spool = out / "spool"
    spool.mkdir()
    run_env = {k: v for k, v in env.items() if not k.startswith("COUNTERD_")}
    run_env.update(COUNTERD_SOCKET="off", COUNTERD_RUN_ID="bench")
    if marked:
        run_env.update(COUNTERD_BACKEND=NAME, COUNTERD_SPOOL=str(spool),
                       COUNTERD_INIT="import")
    argv = valgrind_argv([sys.executable, "-c", code], geometry, out)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(argv, env=run_env, check=True, cwd=tmp, stdout=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    pids = dump_files(out)
    if len(pids) != 1:
        raise BadInput(f"expected the dumps of one process in {out}, found {sorted(pids)}",
                       "see valgrind's log there")
    dumps = dumps_for_pid(out, next(iter(pids)))
    total = sum(d.totals.get("Ir", 0) for d in dumps)
    first = dumps[0].totals.get("Ir", 0) if marked and len(dumps) > 1 else total
    return total, first, cpu, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", metavar="REV", default=None,
                    help="also run with this revision of the repository, alternating")
    a = ap.parse_args()
    if a.rounds < 1:
        raise BadInput(f"--rounds {a.rounds}", "give 1 or more")
    if valgrind_path() is None:
        raise BadInput("valgrind is not on PATH", INSTALL_FIX)
    print(host_line())
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("PYTHONDONTWRITEBYTECODE is set: both trees' bytecode is compiled beforehand")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "counterd")],
                   check=True, stdout=subprocess.DEVNULL)
    geometry = CallgrindGeometry.from_machine()
    print(f"valgrind {' '.join(valgrind_argv(['CMD'], geometry, 'OUT')[1:])}")
    with tempfile.TemporaryDirectory(prefix="callgrind-startup-") as tmp_name:
        tmp = Path(tmp_name)
        trees = [("this tree", {**os.environ, "PYTHONPATH": str(ROOT)})]
        if a.against is not None:
            trees.insert(0, (f"at {a.against}", export_revision(a.against, tmp / "against")))
        runs: dict[tuple[str, str], list[tuple[int, int, float, float]]] = {}
        for _ in range(a.rounds):
            for label, code, marked in PROGRAMS:
                for tree, env in trees:
                    runs.setdefault((tree, label), []).append(
                        _run(env, code, marked, geometry, tmp))
    print(f"{'program':<32} {'tree':<16} {'Ir (M)':>8} {'to 1st superstep':>17} "
          f"{'CPU s':>7} {'wall s':>7}   (medians of {a.rounds})")
    for (tree, label), rs in runs.items():
        ir = statistics.median(r[0] for r in rs) / 1e6
        first = statistics.median(r[1] for r in rs) / 1e6
        cpu = statistics.median(r[2] for r in rs)
        wall = statistics.median(r[3] for r in rs)
        print(f"{label:<32} {tree:<16} {ir:8.1f} {first:15.1f} M {cpu:7.2f} {wall:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
