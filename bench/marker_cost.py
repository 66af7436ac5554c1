"""Cost of one superstep marker pair (begin + end): in-process, to the spool file that
``counterd record`` uses, and through the daemon's socket; each with the compiled hot path
(counterd/_native/hotpath_src/) and with the Python path (``COUNTERD_NATIVE=0``), side by side.

    .venv/bin/python bench/marker_cost.py [--pairs N] [--batches B]

Each batch times N empty ``with counterd.superstep(...)`` blocks; the figure is the median over
batches of batch time / N (min and max beside it). The two engines alternate batch by batch, so
that the host's drift falls on both alike. "through the daemon" includes sending the begin and
the record frames and reading acknowledgements as they arrive; the last column says how many
records the daemon had acknowledged (committed) when the batches ended plus a flush (a flush,
untimed, also follows every batch: a batch of N pairs, N below the client's high-water mark,
measures what the markers cost the program while the daemon keeps up; a program marking empty
supersteps without end is slowed to the daemon's ingest rate instead, see
bench/daemon_throughput.py). Through
the daemon, the compiled path writes the frames into the client's black box, sent in batches;
counting on the client's behalf has no compiled path (its rows are the Python path's). Where
the host opens hardware events, a row with cycles and instructions says how the compiled path
read them: in user space (rdpmc) where the kernel allows it, else read(2) and why. The
"sample 1ms:10" rows (``--sample 1ms:10``, every superstep here being shorter) read the
counters of 1 in 10 pairs and estimate the others' (flagged ``sampled``): their figure is the
mean cost of a pair over all of them. The floors beside them: two ``read(2)`` of the perf group
leader per pair, from Python and from C (bench/perf_read_floor.c, with nothing else in the
loop).

With ``--pyperf FILE`` each batch's time per pair is also written as pyperf JSON
(bench/_pyperf.py), one benchmark per row (``marker_cost/in-process/no counters/memory
sink/compiled``, ...; the floor from C is a summary, not written): ``python -m pyperf
compare_to OLD NEW`` compares two runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import Daemon  # noqa: E402
from _host import host_line  # noqa: E402
from _pyperf import PyperfOut, add_option  # noqa: E402

import counterd  # noqa: E402
from counterd import _native  # noqa: E402
from counterd.data.env import ENV_NATIVE  # noqa: E402
from counterd.markers.api import configure  # noqa: E402
from counterd.markers.sinks.socket import SocketSink  # noqa: E402

SOFTWARE = ("task_clock_ns", "page_faults", "context_switches")
HARDWARE = ("cycles", "instructions")


def _hardware_opens() -> str | None:
    """None where cycles and instructions open on this thread, else why not."""
    from counterd.backends.perf import PerfBackend

    try:
        PerfBackend().open(list(HARDWARE)).close()
    except Exception as exc:  # noqa: BLE001 - whatever keeps perf from counting them
        return str(exc).splitlines()[0]
    return None


def per_pair_us(pairs: int, batches: int) -> list[float]:
    out = []
    for _ in range(batches):
        t0 = time.monotonic_ns()
        for _ in range(pairs):
            with counterd.superstep("s"):
                pass
        out.append((time.monotonic_ns() - t0) / pairs / 1e3)
    return out


def _c_floor(tmp: Path, pairs: int, batches: int) -> tuple[float, float, float, str] | None:
    """bench/perf_read_floor.c compiled and run: (median, min, max) us per pair and its line on
    what one system call of each kind costs, or None without a C compiler (said on
    stderr)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        print("no C compiler: the floor from C is not measured", file=sys.stderr)
        return None
    exe = tmp / "perf_read_floor"
    subprocess.run([cc, "-O2", "-o", str(exe), str(Path(__file__).parent / "perf_read_floor.c")],
                   check=True)
    lines = subprocess.run([str(exe), str(pairs), str(batches)], check=True,
                           capture_output=True, text=True).stdout.splitlines()
    out = lines[0].split()
    return float(out[0]), float(out[1]), float(out[2]), lines[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=15)
    add_option(ap)
    args = ap.parse_args()
    host = host_line()
    print(host)
    out = PyperfOut(args.pyperf, host)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "spool").mkdir()
        d = Daemon(Path(tmp))
        try:
            print(f"{'configuration, engine':<72} {'median us/pair':>15} {'min':>8} {'max':>8}"
                  "  acked")
            configs: list[tuple[str, dict[str, Any]]] = [
                ("in-process, no counters, memory sink", dict(backend="none", socket="off")),
                ("in-process, perf software events, memory sink",
                 dict(backend="perf", events=SOFTWARE, socket="off")),
                ("in-process, perf software events, spool file (counterd record)",
                 dict(backend="perf", events=SOFTWARE, spool=Path(tmp) / "spool",
                      socket="off")),
                ("in-process, perf software events, memory sink, sample 1ms:10",
                 dict(backend="perf", events=SOFTWARE, socket="off", sample="1ms:10")),
                ("in-process, perf software events, spool file, sample 1ms:10",
                 dict(backend="perf", events=SOFTWARE, spool=Path(tmp) / "spool",
                      socket="off", sample="1ms:10")),
                ("daemon socket, no counters", dict(backend="none", socket=d.socket)),
                ("daemon socket, perf software events in-process",
                 dict(backend="perf", events=SOFTWARE, socket=d.socket)),
                ("daemon socket, daemon counts on the client's behalf",
                 dict(backend="daemon", events=SOFTWARE, socket=d.socket)),
            ]
            no_hardware = _hardware_opens()
            if no_hardware is None:
                configs.insert(2, ("in-process, perf hardware events (cycles, instructions), "
                                   "memory sink",
                                   dict(backend="perf", events=HARDWARE, socket="off")))
            else:
                print(f"hardware events not measured: {no_hardware}")
            engines = ["compiled", "python"] if _native.hotpath() is not None else ["python"]
            for label, kw in configs:
                runs = ["python"] if kw.get("backend") == "daemon" else engines
                samples: dict[str, list[float]] = {e: [] for e in runs}
                last: dict[str, Any] = {}
                for _ in range(args.batches):
                    for engine in runs:  # alternating, each with a recorder of its own
                        os.environ[ENV_NATIVE] = "0" if engine == "python" else "1"
                        last[engine] = configure(**kw)  # type: ignore[arg-type]
                        gc.collect()  # the other engine's garbage is not this one's time
                        per_pair_us(200, 1)  # warm-up
                        samples[engine] += per_pair_us(args.pairs, 1)
                        sink = last[engine].sink
                        if isinstance(sink, SocketSink):  # untimed: the daemon catches up
                            sink.flush(60)
                for engine, got in samples.items():
                    acked = ""
                    sink = last[engine].sink
                    if isinstance(sink, SocketSink):
                        ok = sink.flush(60)
                        acked = "all" if ok else f"{len(sink.unacked)} unacked"
                        if sink.degraded and sink.degraded != "closed":  # closed: replaced
                            acked += f" (degraded: {sink.degraded})"
                    print(f"{label + ', ' + engine:<72} {statistics.median(got):>15.2f} "
                          f"{min(got):>8.2f} {max(got):>8.2f}  {acked}", flush=True)
                    out.add(_bench_name(label, engine), [us / 1e6 for us in got],
                            loops=args.pairs, backend=str(kw.get("backend")))
                    lane = last[engine]._state().lane if engine == "compiled" else None
                    if lane is not None and kw.get("backend") == "perf":
                        how = ("in user space (rdpmc)" if lane.user_read_off is None
                               else f"by read(2): {lane.user_read_off}")
                        print(f"    counters read {how}; reads in user space "
                              f"{lane.user_reads}, by read(2) {lane.kernel_reads}")
            os.environ.pop(ENV_NATIVE, None)
            rec = configure(backend="perf", events=SOFTWARE, socket="off")
            with counterd.superstep("s"):
                pass
            group = rec._state().group
            single = getattr(group, "_single", None)
            if single is not None:
                fd, size = single.leader, single.size
                floor = []
                for _ in range(args.batches):
                    t0 = time.monotonic_ns()
                    for _ in range(args.pairs):
                        os.read(fd, size)
                        os.read(fd, size)
                    floor.append((time.monotonic_ns() - t0) / args.pairs / 1e3)
                print(f"{'floor: two perf group read(2) from Python per pair':<72} "
                      f"{statistics.median(floor):>15.2f} {min(floor):>8.2f} "
                      f"{max(floor):>8.2f}")
                out.add("marker_cost/floor/two perf group read(2) from Python",
                        [us / 1e6 for us in floor], loops=args.pairs, backend="perf")
            c_floor = _c_floor(Path(tmp), args.pairs, args.batches)
            if c_floor is not None:
                print(f"{'floor: two perf group read(2) from C per pair (perf_read_floor.c)':<72} "
                      + " ".join(f"{v:>{w}.2f}" for v, w in zip(c_floor[:3], (15, 8, 8),
                                                                strict=True)))
                print(f"    one call from C: {c_floor[3]}")
            configure(backend="none", socket="off")
        finally:
            d.stop()
    out.dump()
    return 0


def _bench_name(label: str, engine: str) -> str:
    """A row's pyperf name: its label's parts as a path, without commas or colons."""
    return "marker_cost/" + label.replace(", ", "/").replace("1ms:10", "1ms 1 in 10") + "/" + engine


if __name__ == "__main__":
    sys.exit(main())
