"""``predict --pilot``: its parser, the ``--budget`` probe runs, and the rendering of a
forecast (:mod:`predictor.pilot.forecast`) and its check."""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from counterd.data.units import NS_PER_S, counter_text, seconds
from counterd.util.cliutil import Parser
from predictor.errors import BadInput
from predictor.pilot import campaign
from predictor.pilot.check import Comparison
from predictor.pilot.choice import DRIFT_PER_EFOLD
from predictor.pilot.forecast import forecast
from predictor.pilot.mixed import SHARED_CPU_ADVICE
from predictor.pilot.regime import load_regime


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="predict --pilot", description=textwrap.fill(
        "Run a command at small input sizes (timed runs with markers only, and one counted run "
        "per size), fit a growth model in n for every superstep's work time (the slowest "
        "processor's own time) and counters, and forecast each superstep at the target size: "
        "F on the extrapolated counters (with a profile) beside the work time scaled by the "
        "counted instructions, a fixed cost plus the counted work fitted on the pilots, and the "
        "work time extrapolated directly (Amato et al., 'Predicting performance on SMPs', "
        "section 5.4), the one printed chosen by how well each predicts the larger pilots from "
        "the smaller ones, its interval from the pilots' timing spread and how far the target "
        "lies past them (an error model measured on programs outside this project); and its "
        "span "
        "(last end minus first begin): the work plus the pilot runs' extra over it (start "
        "skew, waiting), which is not scaled with n.", 92),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pilot", required=True, metavar="CMD",
                   help="the command, with {n} where it takes its input size")
    p.add_argument("--sizes", required=True, help="pilot sizes, comma-separated, increasing")
    p.add_argument("--target", required=True, type=float, help="the size to forecast")
    p.add_argument("--profile", default=None, help="machine profile (file or built-in name)")
    p.add_argument("--backend", default="callgrind",
                   help="counting source of the counted runs (default callgrind; perf or papi "
                   "where the host has a PMU)")
    p.add_argument("--repeat", type=int, default=5, help="timed runs per size (default 5)")
    p.add_argument("--level", type=float, default=0.9, help="interval level (default 0.9)")
    p.add_argument("--check", action="store_true",
                   help="also run the target size and compare, work with work and span with "
                   "span (E = max(T,P)/min(T,P))")
    p.add_argument("--cpu-features", default="native", choices=campaign.TIMING_FEATURES,
                   help="how the timed runs (pilots and checking runs) run: native, as the "
                   "program runs without counterd (default); as-counted: with the CPU "
                   "features valgrind lacks (AVX-512) hidden from run-time code dispatch "
                   "(numpy, OpenBLAS, glibc), so that they run the code Callgrind counts "
                   "(counterd record --cpu-features)")
    p.add_argument("--keep", type=Path, default=None,
                   help="keep the runs' records in this directory (default: a temporary one)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="choose the pilot sizes so that the campaign (timed, counted and, "
                   "with --check, checking runs) takes about this long: --sizes scaled, "
                   "after one timed run at its smallest and largest size to measure the "
                   "program's time")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _budget(a: argparse.Namespace, sizes: list[float], work: Path,
            progress: Callable[[str], None]) -> tuple[list[float], dict[str, Any]]:
    """``--budget``: one timed run at the smallest and the largest of ``sizes``, then the
    sizes within the budget (:func:`predictor.pilot.campaign.budget_sizes`)."""
    import time

    probes = []
    for n in (sizes[0], sizes[-1]):
        progress(f"--budget: timing one run at n = {n:g}")
        t0 = time.monotonic()
        campaign.record_timed(a.pilot, n, work / f"probe-{n:g}.jsonl", what="timing run",
                           cpu_features=a.cpu_features)
        probes.append((n, time.monotonic() - t0))
    width = len(os.sched_getaffinity(0)) if a.backend in campaign.SIDE_BY_SIDE else 1
    chosen, cost = campaign.budget_sizes(sizes, a.budget, probes, repeat=a.repeat,
                                      backend=a.backend, target=a.target, check=a.check,
                                      width=min(width, len(sizes)))
    progress(f"--budget {a.budget:g} s: pilot sizes {', '.join(f'{x:g}' for x in chosen)} "
             f"(about {cost:.0f} s in all)")
    return list(chosen), {"budget_s": a.budget, "estimated_s": cost, "given_sizes": sizes,
                          "probes": [{"n": n, "seconds": t} for n, t in probes]}


def run(a: argparse.Namespace) -> tuple[Any, str]:
    import tempfile

    from counterd.data.host import page_reporting
    from predictor.costs.profile import current_host, fingerprint_differences, load_profile

    try:
        sizes = [float(x) for x in a.sizes.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--sizes {a.sizes!r} is not a list of numbers",
                       "write e.g. --sizes 1e5,2e5,3e5") from None
    if len(set(sizes)) < 3 or any(b <= x for x, b in zip(sizes, sizes[1:], strict=False)):
        raise BadInput(f"--sizes {a.sizes}: give three or more increasing sizes",
                       "write e.g. --sizes 1e5,2e5,3e5")
    if not 0 < a.level < 1:
        raise BadInput(f"--level {a.level} is not a fraction", "give e.g. --level 0.9")
    if a.budget is not None and not (math.isfinite(a.budget) and a.budget > 0):
        raise BadInput(f"--budget {a.budget:g} is not a time > 0",
                       "give the campaign's time in seconds, e.g. --budget 120")
    campaign.command_for(a.pilot, sizes[0])  # the {n} check before anything runs
    prof = load_profile(a.profile) if a.profile else None
    if prof is not None:
        # The pilots run here: F with another host's costs would price this host's counters
        # at someone else's prices.
        diffs = fingerprint_differences(prof.host, current_host())
        if diffs:
            raise BadInput(f"profile {prof.name} is not for this host ({diffs[0]})",
                           "calibrate this host (microbench run, predict calibrate) or leave "
                           "--profile out for forecasts without F")

    def progress(m: str) -> None:
        print(f"predict: {m}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="counterd-pilot-") as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        budget = None
        if a.budget is not None:
            sizes, budget = _budget(a, sizes, work, progress)
        runs = campaign.run_campaign(a.pilot, sizes, repeat=a.repeat, backend=a.backend,
                                  workdir=work, cpu_features=a.cpu_features, progress=progress,
                                  check=a.target if a.check else None, target=a.target)
        fc = forecast(runs, a.target, prof, level=a.level,
                      regime=load_regime(work, runs, a.target))
        for w in fc.advice.warnings if fc.advice else ():
            progress(f"warning: {w}")
        measured = campaign.load_checks(work, a.repeat) if a.check else {}
    per, whole = fc.compare(measured)
    freed = page_reporting()
    data = {**fc.to_json(), "cpu_features": a.cpu_features, "budget": budget,
            "page_reporting": freed.to_json()}
    pct = round(100 * a.level)
    check_head = f" {'measured':>9} {'E':>5} in" if a.check else ""
    lines = [f"forecast at n = {a.target:g} from pilots at {', '.join(f'{x:g}' for x in sizes)}"
             f" ({a.repeat} timed runs and 1 counted run ({a.backend}) each); profile "
             f"{prof.name if prof else 'none'}; {pct}% intervals",
             f"{'superstep':<26} {'time':<4} {'forecast':>9} {str(pct) + '% interval':>21} "
             f"{'from':>6} {'F':>9} {'dom':>3} {'scaled':>9} {'time-only':>9}" + check_head]

    def checked(c: Comparison | None) -> str:
        if not a.check:
            return ""
        if c is None:
            return f" {'-':>9} {'-':>5} -"
        e = f"{c.e:>5.2f}" if c.e is not None else f"{'-':>5}"
        return f" {seconds(c.measured_s):>9} {e} {'yes' if c.inside else 'no'}"

    for s, j in zip(fc.steps, data["supersteps"], strict=True):
        cmp = per.get((s.index, s.name))
        if a.check:
            j["check"] = ({k: v.to_json() for k, v in cmp.items()} if cmp is not None
                          else None)
            j["measured"] = measured[(s.index, s.name)].to_json() if cmp is not None else None
        lo, hi = s.interval_s
        slo, shi = s.span_interval_s
        lines.append(
            f"{(str(s.index) + ' ' + s.name)[:26]:<26} {'work':<4} {seconds(s.predicted_s):>9} "
            f"{seconds(lo) + ' .. ' + seconds(hi):>21} {s.basis:>6} "
            f"{seconds(s.f_s) if s.f_s is not None else '-':>9} "
            f"{j['dominating'] or '-':>3} "
            f"{seconds(s.scaled.value) if s.scaled is not None else '-':>9} "
            f"{seconds(s.time_only.value):>9}" + checked(cmp["work"] if cmp else None))
        lines.append(
            f"{'':<26} {'span':<4} {seconds(s.span_s):>9} "
            f"{seconds(slo) + ' .. ' + seconds(shi):>21} {'+extra':>6} {'':>9} {'':>3} "
            f"{'':>9} {'':>9}" + checked(cmp["span"] if cmp else None))
        if s.why:
            lines.append(f"{'':<26} no F: {s.why}")
        detail = []
        if s.choice is not None:
            past = math.log(fc.target / fc.sizes[-1]) if fc.target > fc.sizes[-1] else 0.0
            miss = s.choice.holdouts[s.basis].miss
            hinge = (f", and its counts' fit with the largest pilot "
                     f"{math.exp(s.choice.hinge):.3g}x the fit without it"
                     if s.choice.hinge > 0 else "")
            detail.append(f"from {s.basis}: {s.choice.why}; {pct}% interval "
                          f"{_width_text(s.width)} wide (from the timing spread, "
                          f"{s.choice.spread * 100:.1f} % a run, {past:.2f} e-folds of n "
                          f"past the largest pilot, the held-out miss, "
                          f"{(math.exp(miss) - 1) * 100:.1f} %{hinge}"
                          + (", and reaching over the forecast from the runs whose processes "
                             "did not share a CPU (a note says more)" if s.reached else "")
                          + ")")
        if s.fit is not None:
            detail.append(f"fit: {seconds(s.fit.value)}, of which fixed cost "
                          f"{seconds(s.fit.fixed_s)}: {s.fit.how}")
        if s.extra is not None:
            detail.append(f"extra (span less work) {seconds(s.extra.value)}, "
                          f"{seconds(s.extra.lower)} .. {seconds(s.extra.upper)}: "
                          f"{s.extra.how}")
        counted = "; ".join(f"{k} {counter_text(k, v.value)}" for k, v in s.counters.items())
        if s.bsp_ns:
            counted += "; BSP bounds: " + ", ".join(f"{k} {seconds(v / NS_PER_S)}"
                                                   for k, v in s.bsp_ns.items())
        if counted:
            detail.append(counted)
        for d in detail:  # the extra; the counters and BSP bounds
            lines += textwrap.wrap(d, 100, initial_indent=" " * 4, subsequent_indent=" " * 6)
    total, lo, hi = fc.total()
    stotal, slo, shi = fc.span_total()
    f_total = sum(s.f_s for s in fc.steps if s.f_s is not None)
    w_total = sum(s.scaled.value for s in fc.steps if s.scaled is not None)
    lines.append(f"{'total':<26} {'work':<4} {seconds(total):>9} "
                 f"{seconds(lo) + ' .. ' + seconds(hi):>21}"
                 f" {'':>6} {seconds(f_total) if f_total else '-':>9} {'':>3} "
                 f"{seconds(w_total) if w_total else '-':>9} "
                 f"{seconds(data['total']['time_only_s']):>9}"
                 + checked(whole["work"] if per else None))
    lines.append(f"{'':<26} {'span':<4} {seconds(stotal):>9} "
                 f"{seconds(slo) + ' .. ' + seconds(shi):>21} {'+extra':>6}"
                 + (f" {'':>9} {'':>3} {'':>9} {'':>9}" + checked(whole["span"] if per else None)
                    if a.check else ""))
    lines.append(f"total work interval {_width_text(hi / lo if lo > 0 else None)} wide "
                 "(upper / lower)")
    if a.check and per:
        data["total"]["check"] = {k: v.to_json() for k, v in whole.items()}
        lines.append(f"measured in all: work {seconds(whole['work'].measured_s)}, E "
                     f"{_e_text(whole['work'].e)}; span {seconds(whole['span'].measured_s)}, "
                     f"E {_e_text(whole['span'].e)}")
    lines += textwrap.wrap(
        "work: the slowest processor's own time in the superstep (its end minus its begin), "
        "which F and the counters predict; span: the last processor's end minus the first "
        "one's begin, the work plus an extra (start skew, waiting) forecast on its own as the "
        "pilot runs' median, not scaled with n (unless they show it growing; then a note says "
        "so), its interval the work's plus the extra's. Indented: the extra, the counters "
        "extrapolated to the target (summed over processors) and, with a profile, the BSP "
        "bounds on them. F: the profile's cost function on the extrapolated counters; scaled: "
        "the largest pilot's work time per instruction times the instructions extrapolated; "
        "time-only: the work time extrapolated directly; fit: a fixed cost plus the counted "
        "work (instructions, misses, page faults) fitted on the pilot runs. The work forecast "
        "printed ('from') is the one that predicted the larger pilots best from the smaller "
        "ones; its interval is an error model measured on programs outside this project: "
        f"a standard deviation of about {DRIFT_PER_EFOLD:.0%} per e-fold of n past the largest "
        "pilot, more "
        "where the forecast missed the larger pilots or they were short, plus the runs' timing "
        "spread, and reaching over both fits of a count whose growth hinges on the largest "
        "pilot (a note names it)."
        + (" measured: the median over the checking runs at the target, taken in the rounds "
           "of the timed pilot runs (the forecast reads only the pilots'); E = max(T, P) / "
           "min(T, P), work against work and span against span." if a.check else ""), 100)
    for n in fc.notes:
        lines += textwrap.wrap(f"note: {n}", 100, subsequent_indent="  ")
    shared = [f"{index}:{name} in {m.shared_cpu_runs} of {m.runs}"
              for (index, name), m in sorted(measured.items()) if m.shared_cpu_runs]
    if shared:
        lines += textwrap.wrap(
            "note: two processes took turns on one CPU in checking runs: superstep "
            + ", ".join(shared) + ("" if SHARED_CPU_ADVICE in fc.notes
                                   else f"; {SHARED_CPU_ADVICE}"), 100, subsequent_indent="  ")
    lines += [f"warning: {w}" for w in (fc.advice.warnings if fc.advice else ())]
    if a.cpu_features == "as-counted":
        features = ("note: the timed runs (pilots and checking runs) hid from run-time code "
                    "dispatch (numpy, OpenBLAS, glibc) the CPU features valgrind lacks, so they "
                    "ran the code Callgrind counts (--cpu-features as-counted), which may be "
                    "slower or faster than the program as it runs without counterd; on a host "
                    "without AVX-512 nothing is hidden")
    else:
        features = ("note: the timed runs (pilots and checking runs) ran the program natively, "
                    "as it runs without counterd (--cpu-features native, the default)"
                    + ("; the counted runs hid from code dispatch the CPU features valgrind "
                       "lacks (AVX-512), so on a host that has them they counted another code "
                       "path: scaled and time-only forecast the native times all the same "
                       "(scaled takes from the counts only the ratio of instructions between "
                       "the largest pilot and the target); F prices those counts and is the "
                       "forecast only where it fits the pilots' native times; --cpu-features "
                       "as-counted times the counted code"
                       if a.backend == "callgrind" else ""))
    lines += textwrap.wrap(features, 100, subsequent_indent="  ", break_on_hyphens=False)
    if freed.noisy:
        lines += textwrap.wrap(
            "note: this host's hypervisor takes back the memory the guest frees (free page "
            f"reporting: {freed.why}; counterd probe): memory that lay free for a few seconds "
            "faults in the hypervisor too when a program first touches it (on a KVM guest, 64 "
            "MiB took 11 ms to fill when freed under a second before and 115-150 ms after 2 s "
            "or more: docs/record.md), so supersteps that allocate differ between runs, pilots "
            "and checking runs by how long their memory lay free, which no forecast can know",
            100, subsequent_indent="  ", break_on_hyphens=False)
    return data, "\n".join(lines)


def _width_text(w: float | None) -> str:
    return "unbounded" if w is None or not math.isfinite(w) else f"{w:.2f}x"


def _e_text(e: float | None) -> str:
    return "-" if e is None else f"{e:.2f}"
