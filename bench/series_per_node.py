"""Series per node: the label design's cardinality, counted (issue 31 item 2).

    .venv/bin/python bench/series_per_node.py [--jobs 8] [--names 16] [--counters 15]

Feeds a MetricsState (the daemon's /metrics state) one record per (live job, superstep name),
each with ``--counters`` canonical counters from one source, every job in its own batch job,
and no machine profile (no prediction series);
counts the exposition's series idle, with the jobs live, and after the jobs end and
``metrics.grace_s`` passes. Prints the per-job figure and the documented bound of
counterd/daemon/metrics_state.py beside the counted figures; the alternative design (an info
metric ``counterd_run_info`` joined with group_left instead of a batch_job label) is the same
count plus one series per live run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _host import guarded, host_line  # noqa: E402

from counterd.backends.base import CounterValue  # noqa: E402
from counterd.daemon.collector import registry  # noqa: E402
from counterd.daemon.metrics_state import DURATION_BUCKETS_S, MetricsState, Workload  # noqa: E402
from counterd.data.events import BY_NAME, Source  # noqa: E402
from counterd.data.records import FLAGS, SuperstepRecord  # noqa: E402


def _series(state: MetricsState) -> int:
    return sum(len(f.samples) for f in registry(state, process_metrics=False).collect())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--names", type=int, default=16)
    ap.add_argument("--counters", type=int, default=len(BY_NAME))
    args = ap.parse_args()
    print(host_line())
    counters = list(BY_NAME)[:args.counters]
    st = MetricsState(max_jobs=32, max_superstep_names=32, grace_s=60)
    idle = _series(st)
    for j in range(args.jobs):
        w = Workload(1000 + j % 4, f"prog{j}", str(4000 + j))
        st.observe_records([(SuperstepRecord(
            run_id=f"run{j}", index=i, name=f"step{i}", rank=0, pid=1, cpu=0, begin_ns=0,
            end_ns=1000, counters={c: CounterValue(1.0, Source.MEASURED) for c in counters}),
            w) for i in range(args.names)], 0.001)
    live = _series(st)
    st.expire([], now=time.monotonic() + st.grace_s + 1)
    after = _series(st)
    per_name = len(DURATION_BUCKETS_S) + 3 + len(counters)  # buckets, +Inf, _sum, _count
    per_job_fixed = len(FLAGS) + len(counters) + 3  # flags, multiplex ratios, last span/work/skew
    per_job = args.names * per_name + per_job_fixed
    print(f"{args.jobs} live jobs x {args.names} superstep names x {len(counters)} counters: "
          f"{live} series (idle {idle}, {live - idle} of the jobs: {(live - idle) / args.jobs:.0f}"
          f" per job; formula {per_job} per job)")
    print(f"after the jobs end and metrics.grace_s passes: {after} series (idle {idle})")
    # + sampled totals and ratios, watched threads, prediction (total, 3 terms, 3 dominating)
    bound = (16 * 32) * (32 * per_name + per_job_fixed + 2 * len(counters) + 1 + 7)
    print(f"bound per node at the defaults (max_uids 16 x max_jobs 32 live workloads, 32 names,"
          f" {len(counters)} counters, sampled too, a prediction): {bound} series, reached only"
          f" with 512 workloads live at once")
    print(f"info-metric design instead of the batch_job label: {live + args.jobs} series "
          f"(+1 per live run), and two batch jobs of one (uid, workload) share one series set")
    return 0 if after == idle else 1


if __name__ == "__main__":
    sys.exit(guarded(main))
