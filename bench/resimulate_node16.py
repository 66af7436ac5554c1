"""Re-simulate the counters of a microbench results file whose counters were simulated (the
16-CPU node's), with the simulator as it is now or with another model of the shared last
level, keeping every measured time; write the result beside, ready for ``predict calibrate``.

    .venv/bin/python bench/resimulate_node16.py [--results FILE] [--out FILE]
        [--exclusive split|shared] [--llc-index modulo|sliced|hashed] [--llc-share F]
        [--only exclusive|all] [--jobs N]

The patterns are deterministic (microbench/catalogue.py: bases, strides, counts, sweeps) and
the file records the geometry and the bank map, so the counts can be made again here;
``--exclusive split`` with the default index reproduces the file's own counts (the check
printed at the end). ``--exclusive shared``: the processors of an exclusive pattern meet in
one shared last level (microbench/counters.py). ``--llc-index``: how the last level picks a
set (counterd/machine/geometry.py ``CacheLevel.index``); ``--llc-share``: the fraction of the last
level's ways the guest really gets (a VM shares the socket's L3 with other guests).
Nothing is timed here; the figures printed are counts, the node's times are kept. Any results
file of the ``sim`` backend can be given (the 2-CPU check of predictor/NOTES.md re-simulates
this host's own quick suite). Then: ``bench/calibrate_manycore.py --results OUT`` (E on the
fitting and validation patterns) or ``predict calibrate --results OUT``. The 16-CPU file
takes 7-16 minutes on a 2-CPU host (every processor of an exclusive pattern simulated when
they share the last level).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._host import guarded, host_line  # noqa: E402
from counterd.machine.geometry import Geometry  # noqa: E402
from counterd.machine.memory import BankMap  # noqa: E402
from counterd.machine.views import GeometryTable  # noqa: E402
from counterd.sim import DEFAULT_CHUNK  # noqa: E402
from microbench import results  # noqa: E402
from microbench.counters import ExclusivePolicy, simulate_pattern, uses_coherence  # noqa: E402
from microbench.patterns import Pattern  # noqa: E402

NODE16 = Path("/work/shared/data/node16/microbench-all-quick.json")


def geometry_of(doc: Mapping[str, Any], index: str, share: float) -> Geometry:
    g = doc["geometry"]
    levels = list(GeometryTable(g).cache_levels())
    last = levels[-1]
    ways = max(1, round(last.ways * share))
    levels[-1] = dataclasses.replace(last, ways=ways, size_bytes=last.sets * ways
                                     * last.line_bytes, index=index)
    return Geometry(tuple(levels), page_bytes=g["page_bytes"], tlb_entries=g["tlb_entries"],
                    tlb_ways=g["tlb_ways"], source=g.get("source", "results file"))


def pattern_of(r: Mapping[str, Any]) -> Pattern:
    return Pattern(r["mnemonic"], r["suite"], r["procs"], r["stride_words"], r["word_bytes"],
                   r["op"], r["mode"], r["level"], Fraction(r["bkc_fraction"]),
                   tuple(r["bases_bytes"]), r["count"], r["sweeps"], r["coherence"],
                   r["store_every"] or 0, r["ws_factor"], r["ws_ref"])


def _job(args: tuple[dict[str, Any], Geometry, BankMap, int, int, ExclusivePolicy]
         ) -> tuple[str, list[dict[str, Any]], float]:
    r, geometry, bank_map, warmup, page_bytes, exclusive = args
    t0 = time.monotonic()
    sims = simulate_pattern(pattern_of(r), geometry, bank_map, warmup=warmup,
                            page_bytes=page_bytes, exclusive=exclusive)
    out = [{"counters": s.counters, "lm": list(s.lm), "wb": list(s.wb),
            "coherence_misses": s.coherence_misses, "invalidations": s.invalidations}
           for s in sims]
    return r["mnemonic"], out, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--results", type=Path, default=NODE16)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--exclusive", choices=("split", "shared"), default="shared")
    ap.add_argument("--llc-index", choices=("modulo", "sliced", "hashed"), default="modulo")
    ap.add_argument("--llc-share", type=float, default=1.0)
    ap.add_argument("--only", choices=("exclusive", "all"), default="all",
                    help="re-simulate only the exclusive patterns (the others keep the file's "
                         "counts) or all")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args()
    if not 0 < a.llc_share <= 1:
        print(f"--llc-share {a.llc_share}: give a fraction in (0, 1]", file=sys.stderr)
        return 2
    doc = results.load(a.results)
    if doc.get("backend") != "sim":
        print(f"{a.results}: counters were measured ({doc.get('backend')}), not simulated: "
              "nothing to re-simulate", file=sys.stderr)
        return 2
    print(host_line())
    geometry = geometry_of(doc, a.llc_index, a.llc_share)
    bank_map = BankMap(doc["bank_map"]["banks"], doc["bank_map"]["interleave_bytes"])
    warmup = int(doc["config"]["warmup"])
    todo = [r for r in doc["patterns"]
            if a.only == "all" or not uses_coherence(pattern_of(r))]
    print(f"re-simulating {len(todo)} of {len(doc['patterns'])} patterns: exclusive "
          f"processors {a.exclusive}, last level {geometry.levels[-1].spec()} index "
          f"{a.llc_index} (share {a.llc_share:g}), {a.jobs} jobs")
    t0 = time.monotonic()
    exclusive: ExclusivePolicy = "shared" if a.exclusive == "shared" else "split"
    jobs = [(r, geometry, bank_map, warmup, int(doc["page_bytes"]), exclusive) for r in todo]
    with ProcessPoolExecutor(max_workers=a.jobs) as ex:
        done = {name: (sims, s) for name, sims, s in ex.map(_job, jobs)}
    same = changed = 0
    for r in doc["patterns"]:
        if r["mnemonic"] not in done:
            continue
        sims, seconds = done[r["mnemonic"]]
        before = [p["counters_simulated"] for p in r["processors"]]
        if before == [s["counters"] for s in sims]:
            same += 1
        else:
            changed += 1
        lm_total = [0] * bank_map.banks
        wb_total = [0] * bank_map.banks
        for p, s in zip(r["processors"], sims, strict=True):
            p["counters_simulated"] = dict(s["counters"])
            for k, v in s["counters"].items():
                if p["counters"].get(k, {}).get("source") != "measured":
                    p["counters"][k] = {"value": v, "source": "simulated"}
            p["banks"] = {"lm": s["lm"], "wb": s["wb"]}
            lm_total = [x + y for x, y in zip(lm_total, s["lm"], strict=True)]
            wb_total = [x + y for x, y in zip(wb_total, s["wb"], strict=True)]
        r["banks"] = {"lm": lm_total, "wb": wb_total}
        sim = dict(r.get("sim") or {})
        sim.update({"seconds": round(seconds, 3), "resimulated": {
            "exclusive": a.exclusive, "llc_index": a.llc_index, "llc_share": a.llc_share}})
        if uses_coherence(pattern_of(r)):
            sim["coherence"] = {"chunk": DEFAULT_CHUNK,
                                "coherence_misses": [s["coherence_misses"] for s in sims],
                                "invalidations": [s["invalidations"] for s in sims]}
        r["sim"] = sim
    doc.setdefault("notes", []).append(
        f"counters re-simulated by bench/resimulate_node16.py (exclusive processors "
        f"{a.exclusive}, last-level index {a.llc_index}, share {a.llc_share:g}); times are "
        f"the original run's")
    results.write(a.out, doc)
    print(f"{changed} patterns' counts changed, {same} the same as the file's; "
          f"{time.monotonic() - t0:.0f} s; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(guarded(main))
