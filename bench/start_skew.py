"""Start skew of a first superstep against a second, under ``counterd record``.

The program (tests/counterd/skew_program.py): N processes, a barrier, an empty superstep, a
barrier, another empty superstep; ROUNDS rounds of fresh processes (fork, spawn), or one MPI
launch per round. A first superstep used to hold each process's marker set-up (counters
opened, the marker pair calibrated, the spool file made) as start skew; the skew test
(tests/counterd/test_start_skew.py) asks for the first within 3x the second + 0.5 ms.

    python bench/start_skew.py [--rounds 10] [--procs 2,4] [--how fork,spawn,mpi]
                               [--backend perf,sim] [--against REV] [--pyperf FILE]

With ``--against REV`` every configuration is also recorded by that revision's counterd
(alternating with this tree's, in one run), and the table shows both. With ``--pyperf FILE``
the skews are also written as pyperf JSON (bench/_pyperf.py), ``start_skew/BACKEND/HOW/Np/first``
and ``.../second`` (``... at REV`` for the revision's): ``python -m pyperf compare_to OLD NEW``
compares two runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _host import guarded, host_line  # noqa: E402
from _pyperf import PyperfOut, add_option  # noqa: E402
from record_overhead import cli_module, export_revision  # noqa: E402

from counterd.data.records import read_jsonl  # noqa: E402
from tests.counterd.skew_program import skews  # noqa: E402

PROGRAM = ROOT / "tests/counterd/skew_program.py"
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def _record(env: dict[str, str], backend: str, how: str, n: int, rounds: int,
            out: Path, cli: str) -> list[tuple[int, int]]:
    """(first, second) start skews, ns, of ``rounds`` rounds of ``how`` with ``n`` processes."""
    pairs: list[tuple[int, int]] = []
    launches = rounds if how == "mpi" else 1
    for k in range(launches):
        cmd = ([str(MPIEXEC), "-n", str(n), sys.executable, str(PROGRAM), "mpi"]
               if how == "mpi" else [sys.executable, str(PROGRAM), how, str(n), str(rounds)])
        path = out.with_suffix(f".{k}.jsonl")
        # Not run from the repository's root: `python -m` puts the working directory first on
        # the path, where this tree's counterd would shadow the revision under comparison.
        subprocess.run([sys.executable, "-m", cli, "record", "--backend", backend,
                        "--out", str(path), "--", *cmd], env=env, cwd=out.parent, check=True,
                       capture_output=True, timeout=600)
        pairs += list(skews(read_jsonl(path)).values())
    return pairs


def _row(label: str, pairs: list[tuple[int, int]]) -> str:
    first = [a / 1e6 for a, _ in pairs]
    second = [b / 1e6 for _, b in pairs]
    m1, m2 = statistics.median(first), statistics.median(second)
    ok = m1 <= 3 * m2 + 0.5
    return (f"  {label:<34} first median {m1:8.3f} ms (max {max(first):8.3f})   second median "
            f"{m2:7.3f} ms (max {max(second):7.3f})   3x+0.5 ms: {'holds' if ok else 'MISSED'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--procs", default="2,4")
    ap.add_argument("--how", default="fork,spawn,mpi")
    ap.add_argument("--backend", default="perf,sim")
    ap.add_argument("--against", metavar="REV", default=None,
                    help="also record with this revision of the repository, alternating")
    add_option(ap)
    a = ap.parse_args()
    host = host_line()
    print(host)
    out = PyperfOut(a.pyperf, host)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("PYTHONDONTWRITEBYTECODE is set: every module a process imports is compiled anew")
    # This tree's bytecode compiled as the revision's is (export_revision): with
    # PYTHONDONTWRITEBYTECODE a module edited since its last compile is compiled again in every
    # spawned worker, before its first barrier, and only on this tree's side.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "counterd")],
                   check=True, stdout=subprocess.DEVNULL)
    base = {k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")}
    base["COUNTERD_SOCKET"] = "off"
    hows = [h for h in a.how.split(",") if h != "mpi" or MPIEXEC.exists()]
    with tempfile.TemporaryDirectory(prefix="start-skew-") as tmp:
        trees = [("this tree", base, cli_module(ROOT))]
        if a.against is not None:
            env = export_revision(a.against, Path(tmp) / "against")
            env = {k: v for k, v in env.items() if not k.startswith("COUNTERD_")}
            env["COUNTERD_SOCKET"] = "off"
            trees.insert(0, (f"at {a.against}", env, cli_module(Path(tmp) / "against")))
        for backend in a.backend.split(","):
            for how in hows:
                for n in (int(x) for x in a.procs.split(",")):
                    print(f"{backend}, {how}, {n} processes, {a.rounds} rounds "
                          "(start skew of the first and of the second superstep):")
                    for label, env, cli in trees:
                        pairs = _record(env, backend, how, n, a.rounds,
                                        Path(tmp) / f"{backend}-{how}-{n}-{len(label)}", cli)
                        print(_row(label, pairs), flush=True)
                        at = "" if label == "this tree" else f" at {a.against}"
                        for k, which in ((0, "first"), (1, "second")):
                            out.add(f"start_skew/{backend}/{how}/{n}p/{which}{at}",
                                    [p[k] / 1e9 for p in pairs], backend=backend)
    out.dump()
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
