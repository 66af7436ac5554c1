"""One MPI run across hosts whose monotonic clocks differ by 1,000 s, reported whole from each
node's records file (issue 32 items 1, 2, 4: the file convention).

    sudo .venv/bin/python bench/cluster_records.py [--hosts 3] [--ranks 2] [--steps 200]

Hosts are network namespaces (bench/netns_cluster.py's Cluster.clock_host), each with its own
hostname and a time namespace whose CLOCK_MONOTONIC runs 1,000 s ahead of the previous host's.
MPICH's mpiexec (hydra) starts ``--ranks`` ranks per host through a launcher that enters the
host's namespaces instead of ssh; each rank runs under its own ``counterd record --out``
(so each file is one rank's, with its node's clock domain), marking ``--steps`` supersteps
between MPI barriers (rank r sleeps (1 + r mod 3) ms). The bench prints: the run ids the
files hold (one, from hydra), the report across nodes and its time, and per superstep the
reported span against the span on one clock (the records' monotonic times less their host's
namespace offset, known exactly: that is what a run on one clock would have measured), the
stated bound, and what a naive merge (max end - min begin of raw monotonic times) gives.
tests/contrib/test_cluster_records.py runs the same job at small scale.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from netns_cluster import NET, Cluster, why_not_timens  # noqa: E402

MPIEXEC = Path(sys.executable).parent / "mpiexec"
OFFSET_S = 1000  # host i's CLOCK_MONOTONIC runs (i - 1) x this ahead

PROGRAM = """
import sys, time
import counterd
from mpi4py import MPI

comm = MPI.COMM_WORLD
counterd.init()
for i in range(int(sys.argv[1])):
    comm.Barrier()
    with counterd.superstep("work"):
        time.sleep((1 + comm.rank % 3) / 1000)
comm.Barrier()
"""


def why_not() -> str | None:
    """Why the job cannot run here (None: it can)."""
    reason = why_not_timens()
    if reason is not None:
        return reason
    if not MPIEXEC.exists():
        return "no mpiexec beside this python (the [mpi] extra's MPICH wheel provides it)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py not installed (the [test] extra)"
    return None


def offsets(hosts: int) -> dict[str, int]:
    """Host address -> its CLOCK_MONOTONIC offset in ns."""
    return {f"{NET}.{i}": (i - 1) * OFFSET_S * 10**9 for i in range(1, hosts + 1)}


def run_job(c: Cluster, hosts: int, ranks: int, steps: int, out: Path) -> list[Path]:
    """The job across ``hosts`` clock hosts of ``c`` (made here), ``ranks`` per host; the
    records files (one per rank) in ``out``."""
    for i in range(1, hosts + 1):
        c.clock_host(i, (i - 1) * OFFSET_S)
    out.mkdir(exist_ok=True)
    prog = out / "program.py"
    prog.write_text(PROGRAM)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("COUNTERD_")},
           "PYTHONPATH": str(ROOT), "COUNTERD_SOCKET": "off"}
    rank_cmd = (f'exec {sys.executable} -m counterd.commands.cli record --backend none '
                f'--out {out}/rank-$PMI_RANK.jsonl -- {sys.executable} {prog} {steps}')
    argv = [*c.enter(c.hosts[0]), str(MPIEXEC), "-launcher", "ssh", "-launcher-exec",
            str(c.launcher()), "-iface", "eth0", "-hosts", ",".join(c.hosts), "-ppn",
            str(ranks), "-n", str(hosts * ranks), "sh", "-c", rank_cmd]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"mpiexec exited {done.returncode}: {done.stderr[-2000:]}")
    return sorted(out.glob("rank-*.jsonl"))


def single_clock_spans(files: list[Path], offset_of: dict[str, int]
                       ) -> tuple[dict[int, int], dict[int, int]]:
    """Per superstep index: (the span on one clock: each record's times less its host's
    namespace offset; the naive span of the raw monotonic times)."""
    from counterd.data.records import read_jsonl

    host_off = {f"node{int(a.rsplit('.', 1)[1]):03d}": off for a, off in offset_of.items()}
    b1: dict[int, int] = {}
    e1: dict[int, int] = {}
    b0: dict[int, int] = {}
    e0: dict[int, int] = {}
    for f in files:
        for r in read_jsonl(f):
            assert r.end_ns is not None
            off = host_off[r.host]
            b1[r.index] = min(b1.get(r.index, r.begin_ns - off), r.begin_ns - off)
            e1[r.index] = max(e1.get(r.index, r.end_ns - off), r.end_ns - off)
            b0[r.index] = min(b0.get(r.index, r.begin_ns), r.begin_ns)
            e0[r.index] = max(e0.get(r.index, r.end_ns), r.end_ns)
    return {i: e1[i] - b1[i] for i in b1}, {i: e0[i] - b0[i] for i in b0}


def main() -> int:
    from _host import host_line

    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per host")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    reason = why_not()
    if reason:
        print(f"cluster_records: {reason}", file=sys.stderr)
        return 2
    from counterd.report import nodes

    print(host_line(), flush=True)  # before the namespaces' tools write to the same stdout
    with tempfile.TemporaryDirectory(prefix="counterd-clusterrec-") as tmp:
        Path(tmp).chmod(0o755)
        c = Cluster(Path(tmp))
        try:
            t0 = time.monotonic()
            files = run_job(c, args.hosts, args.ranks, args.steps, Path(tmp) / "out")
            job_s = time.monotonic() - t0
        finally:
            c.close()
        t0, c0 = time.perf_counter(), time.process_time()
        rep = nodes.build(files)
        text = nodes.render(rep, "text")
        report_s, report_cpu = time.perf_counter() - t0, time.process_time() - c0
        truth, naive = single_clock_spans(files, offsets(args.hosts))
    print(f"{args.hosts} hosts x {args.ranks} ranks x {args.steps} supersteps, CLOCK_MONOTONIC "
          f"offsets {', '.join(f'{o // 10**9} s' for o in offsets(args.hosts).values())}; "
          f"the job took {job_s:.1f} s")
    print(f"files {len(files)}, run ids {[r.run_id for r in rep.runs]} "
          f"(from {[r.source for r in rep.runs]})")
    run = rep.runs[0]
    diffs = [abs(s.span_ns - truth[s.index]) for s in run.steps if s.span_ns is not None]
    bounds = [s.span_err_ns for s in run.steps if s.span_err_ns is not None]
    within = sum(1 for s in run.steps if s.span_ns is not None and s.span_err_ns is not None
                 and abs(s.span_ns - truth[s.index]) <= s.span_err_ns)
    print(f"report across nodes (in this process, build and render): {report_s * 1e3:.0f} ms "
          f"wall, {report_cpu * 1e3:.0f} ms CPU ({run.records} records, "
          f"{len(text.splitlines())} lines)")
    print(f"spans within the stated bound of the single-clock span: {within} of "
          f"{len(run.steps)}; |reported - single clock| max {max(diffs)} ns; stated bound "
          f"median {sorted(bounds)[len(bounds) // 2]} ns, max {max(bounds)} ns")
    print(f"single-clock span median {sorted(truth.values())[len(truth) // 2] / 1e6:.2f} ms; "
          f"naive merge median {sorted(naive.values())[len(naive) // 2] / 1e9:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
