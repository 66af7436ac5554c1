"""``predict`` command line: thin -- parse, call the library, render, return an exit code.

    predict calibrate --results FILE --out PROFILE [--name NAME] [--force] [--json]
    predict validate  --results FILE --profile PROFILE [--json]
    predict profile   PROFILE [--json]
    predict select    --spec SPEC --samples FILE [--samples FILE...] NAME=VALUE... [--json]
    predict --pilot 'CMD ... {n} ...' --sizes S1,S2,... --target N [--profile P] [--backend B]
            [--repeat R] [--check] [--cpu-features native|as-counted] [--json]
    predict --profile PROFILE --counters FILE [--model paper|improved] [--json]

Exit codes: 0 ok, 2 bad usage or bad input (one line on stderr: what, and the fix).
A profile fitted on another host is a warning on stderr (and in ``--json`` output).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from counterd.data.units import NS_PER_S, seconds, si_fields
from counterd.util.cliutil import Parser, closed_pipe, version
from predictor.errors import BadInput, HostMismatchWarning, PredictorError
from predictor.toolkit import modelers

SUBCOMMANDS = ("calibrate", "validate", "profile", "select", "mlt", "memlogp")


def _sub_parser() -> argparse.ArgumentParser:
    p = Parser(prog="predict", description="calibrate and apply the cost functions of Amato "
                "et al., \"Predicting performance on SMPs\"")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    c = sub.add_parser("calibrate", help="fit every cost function from microbench results")
    c.add_argument("--results", required=True, type=Path, help="microbench results JSON")
    c.add_argument("--out", required=True, type=Path, help="machine profile to write (TOML)")
    c.add_argument("--name", default=None, help="profile name (default: host-backend)")
    c.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5)")
    c.add_argument("--force", action="store_true", help="overwrite an existing --out")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    v = sub.add_parser("validate", help="accuracy table on the validation patterns")
    v.add_argument("--results", required=True, type=Path, help="microbench results JSON")
    v.add_argument("--profile", required=True, help="profile file or built-in name")
    v.add_argument("--floor", type=Path, default=None, metavar="RESULTS2",
                   help="a second run of the same suite: the noise floor between the two runs "
                   "(default: between halves of each pattern's repetitions, a lower bound)")
    v.add_argument("--json", action="store_true", help="machine-readable output")
    s = sub.add_parser("profile", help="print a machine profile")
    s.add_argument("profile", help="profile file or built-in name (sgi-power-challenge)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    from predictor.families import select

    fmt = (select.__doc__ or "").split("Specification format::")[-1].split("Samples are")[0]
    m = sub.add_parser(
        "select", help="pick the implementation with the least predicted time (Brewer)",
        description=textwrap.fill(
            "Fit one model per implementation from profiling samples and pick the "
            "implementation with the least predicted time at the given parameters, optimising "
            "each implementation's integer parameter (E. A. Brewer, 'High-level optimization "
            "via automated statistical modeling').", 92),
        epilog="specification (TOML), e.g.:\n" + fmt.rstrip() + "\n\nterms: products (*) of "
        "1, x, x^a, log(x), log(x)^b, 2^x, ceil(x/y), max(x-c,0), acc, stream:x\nsamples: JSON "
        "lines with the parameters, the implementation key and the time key",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("at", nargs="+", metavar="NAME=VALUE",
                   help="the caller's parameters, e.g. keys=100000 width=32")
    m.add_argument("--spec", required=True, type=Path, help="specification (TOML)")
    m.add_argument("--samples", required=True, type=Path, action="append",
                   help="profiling samples, JSON lines (repeatable)")
    m.add_argument("--modeler", default="brewer", choices=sorted(modelers.MODELERS),
                   help="term search: brewer (t-tests, 95%%; the default), cv "
                   "(cross-validation), single (one term, a baseline)")
    m.add_argument("--holdout", type=float, default=None, metavar="FRACTION",
                   help="hold this fraction of the samples apart to validate each model "
                   "(default: cross-validate)")
    m.add_argument("--json", action="store_true", help="machine-readable output")
    t = sub.add_parser("mlt", help="memory lines touched by a row or column transfer: exact, "
                       "and the closed-form bounds where they hold; with --results, the six "
                       "regression models of the paper's Table 1 fitted on measured transfers",
                       description="Memory lines touched (Hur and Lin, \"Incorporating "
                       "Cache Effects into a Model of Interprocessor Communication\"): count "
                       "the lines of one transfer (--rows or --cols with --shape, --line, --d) "
                       "or fit and judge the Table 1 models on the file `microbench transfer` "
                       "wrote (--results)")
    how = t.add_mutually_exclusive_group()
    how.add_argument("--rows", action="store_true", help="d rows of the array")
    how.add_argument("--cols", action="store_true", help="the d leftmost columns")
    how.add_argument("--results", metavar="FILE",
                     help="measured transfers (microbench transfer --out FILE): print the "
                     "paper's Table 2 (R^2 and MS_E of S1..M3 on the test set) for this host")
    t.add_argument("--shape", metavar="BRxBC",
                   help="the array: rows x columns, in elements, stored row-major")
    t.add_argument("--line", type=int, help="cache line length, in elements")
    t.add_argument("--d", type=int, help="rows or columns transferred")
    t.add_argument("--offset", type=int, default=0,
                   help="elements between the array's start and its line's (default 0)")
    t.add_argument("--train", type=int, default=100,
                   help="with --results: measurements per kind to fit on, the rest are the "
                   "test set (default 100, as the paper)")
    t.add_argument("--seed", type=int, default=0,
                   help="with --results: seed of the random training draw (default 0)")
    t.add_argument("--json", action="store_true", help="machine-readable output")
    ml = sub.add_parser("memlogp", help="memory logP: alpha, the fitted ell(s, d) curves, "
                        "predicted against measured, point-to-point and broadcast costs",
                        description="Fit the memory logP model (Cameron, Sun, Byna and Ge, "
                        "\"Predicting and Evaluating Memory Communication Performance\") on "
                        "the file `microbench memlogp` wrote: alpha, one ell(s, d) curve per "
                        "operation constrained by the cache sizes, the predicted-against-"
                        "measured table, and section 6.5's point-to-point and broadcast costs")
    ml.add_argument("--results", required=True, type=Path,
                    help="measurements to fit (microbench memlogp --out FILE)")
    ml.add_argument("--validate", type=Path, default=None, metavar="FILE",
                    help="a second, independent run to compare the predictions against "
                    "(default: the fitted points)")
    ml.add_argument("--modeler", default="brewer", choices=sorted(modelers.MODELERS),
                    help="term search: brewer (t-tests at 95%%, the default), fixed (every "
                    "term), cv, single")
    ml.add_argument("--size", type=int, default=8192, metavar="BYTES",
                    help="message size s of the cost estimates (default 8192)")
    ml.add_argument("--stride", type=int, default=256, metavar="BYTES",
                    help="distance d between the message's words (default 256; 8 is "
                    "contiguous)")
    ml.add_argument("--procs", type=int, default=8,
                    help="processors P of the broadcast (default 8, as Figure 8)")
    ml.add_argument("--latency", type=float, default=0.0, metavar="SECONDS",
                    help="network latency L (default 0: shared memory)")
    ml.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _forecast_parser() -> argparse.ArgumentParser:
    p = Parser(prog="predict", description="predicted superstep times from counters; "
                "forecasts from pilot runs: predict --pilot (predict --pilot --help); "
                "subcommands: " + ", ".join(SUBCOMMANDS) + " (predict SUBCOMMAND --help); "
                "--version")
    p.add_argument("--profile", required=True, help="profile file or built-in name")
    p.add_argument("--counters", required=True, type=Path,
                   help="counterd record JSONL, or CSV with superstep, rank, counters")
    p.add_argument("--model", default=None, help="paper or improved (default: the profile's)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _ns(v: float | None) -> str:
    """A time the forecast rows keep in nanoseconds, for humans."""
    return "-" if v is None else seconds(v / NS_PER_S)


def _calibrate(a: argparse.Namespace) -> tuple[Any, str]:
    from predictor.costs.calibrate import calibrate
    from predictor.costs.profile import COMPUTE_SUFFIX, save_profile
    from predictor.inputs import load_results

    prof = calibrate(load_results(a.results), name=a.name, folds=a.folds)
    path = save_profile(prof, a.out, overwrite=a.force)
    d = {"profile": str(path), "name": prof.name,
         "diagnostics": {k: m.get("diagnostics", {}) for k, m in prof.models.items()},
         "improved_terms": prof.models["improved"].get("terms", [])}
    lines = [f"predict: wrote {path} (profile {prof.name}, unit ns)"]
    for k, diag in d["diagnostics"].items():
        if diag:
            lines.append(f"  F ({k}) on the fitting patterns: avg error "
                         f"{diag['avg_error']:.3f}, max {diag['max_error']:.3f} "
                         f"({diag['worst']})")
    imp = prof.models["improved"]
    lines.append(f"  improved terms: {', '.join(imp['terms'])}; dropped under cross-validation:"
                 f" {', '.join(imp['dropped_terms']) or 'none'}")
    if prof.contention is not None:  # which bank contention F2 and F3 were fitted at
        d["contention"] = prof.contention.to_dict()
        lines.append(f"  bank contention ({prof.processors} processors, {prof.banks} banks): "
                     f"{prof.contention.why}")
    for k, m in prof.models.items():
        if k.endswith(COMPUTE_SUFFIX):
            acc = m["accuracy"]
            lines.append(f"  F ({k}): + {', '.join(m['terms'])} on the {acc['on']}: avg error "
                         f"{acc['avg_error']:.3f}, max {acc['max_error']:.3f}; dropped: "
                         f"{', '.join(m['dropped_terms']) or 'none'}")
    d["notes"] = list(prof.notes)
    lines.extend(f"  note: {n}" for n in prof.notes)
    return d, "\n".join(lines)


def render_validation(table: Any, title: str, floor: Any = None) -> str:
    """The accuracy table; with ``floor`` (a :class:`predictor.costs.floor.Floor`), the noise floor
    beside it: what a second measurement of the same patterns achieves."""
    w = max([14, *(len(r.function) for r in (*table.rows, *table.compute_rows))])
    lines = [title, f"{'function':<{w}} {'AVG ERR':>8} {'MAX ERR':>8} {'MRE':>7}  limiting "
             "patterns (E, F's dominating term)"]
    for r in table.rows:
        lim = ", ".join(f"{n} ({e:.2f}{', ' + d if d else ''})" for (n, e), d in
                        zip(r.limiting, r.dominating or (None,) * len(r.limiting), strict=True))
        lines.append(f"{r.function:<{w}} {r.avg_error:>8.2f} {r.max_error:>8.2f} "
                     f"{r.mre:>7.3f}  {lim}")
    if floor is not None:
        lim = ", ".join(f"{n} ({e:.2f})" for n, e in floor.worst(3))
        lines.append(f"{'noise floor':<{w}} {floor.average:>8.2f} {floor.maximum:>8.2f} "
                     f"{'-':>7}  {lim}")
        lines.append(f"(noise floor: E between {floor.how} of the same {len(floor.e)} "
                     f"patterns, {floor.summary} of the repetitions; no function can beat it)")
    if table.compute_rows:
        lines.append(f"compute variants on the {table.compute_patterns} compute patterns, "
                     "cross-validated (their held-apart test: the shipped programs, "
                     "bench/program_accuracy.py)")
        for r in table.compute_rows:
            lim = ", ".join(f"{n} ({e:.2f})" for n, e in r.limiting)
            lines.append(f"{r.function:<{w}} {r.avg_error:>8.2f} {r.max_error:>8.2f} "
                         f"{r.mre:>7.3f}  {lim}")
    return "\n".join(lines)


def floor_json(f: Any) -> dict[str, Any]:
    return {"how": f.how, "summary": f.summary, "patterns": len(f.e), "average": f.average,
            "maximum": f.maximum, "worst": [[n, e] for n, e in f.worst(3)]}


def _validate(a: argparse.Namespace) -> tuple[Any, str]:
    from predictor.costs import floor
    from predictor.costs.calibrate import validate
    from predictor.costs.profile import load_profile
    from predictor.inputs import load_results

    prof = load_profile(a.profile)
    results = load_results(a.results)
    table = validate(results, prof)
    nf = floor.for_validation(results, load_results(a.floor) if a.floor else None)
    title = (f"validation on {table.patterns} {table.on} ({a.results}), profile {prof.name}; "
             "E = max(T,P)/min(T,P)")
    if not table.on.startswith("validation"):
        title += ("\n(these results have no validation patterns, as the quick suite; `microbench "
                  "run --suite all` adds patterns held apart from the fit)")
    return ({**table.to_json(), "noise_floor": floor_json(nf) if nf else None},
            render_validation(table, title, nf))


def _mlt(a: argparse.Namespace) -> tuple[Any, str]:
    from predictor.families import mlt

    if a.results:
        return _mlt_models(a)
    missing = [f"--{k}" for k in ("shape", "line", "d") if getattr(a, k) is None]
    if not (a.rows or a.cols) or missing:
        raise BadInput("predict mlt needs --rows or --cols with --shape, --line and --d"
                       + (f" (missing {', '.join(missing)})" if missing else ""),
                       "e.g. predict mlt --cols --shape 4000x4000 --line 8 --d 1, or give "
                       "--results FILE to fit the regression models")
    br, x, bc = a.shape.lower().partition("x")
    if not (x and br.strip().isdigit() and bc.strip().isdigit()):
        raise BadInput(f"--shape {a.shape!r}", "give rows x columns, e.g. --shape 4000x4000")
    shape = (int(br), int(bc))
    count = (mlt.rows if a.rows else mlt.columns)(*shape, a.line, a.d, a.offset)
    what = "rows" if a.rows else "columns"
    data = {**count.to_json(), "transfer": what, "shape": list(shape), "line": a.line,
            "d": a.d, "offset": a.offset}
    bounds = (f"bounds {count.lower} .. {count.upper} (closed form)" if count.in_domain else
              "closed-form bounds do not hold here (d > columns - line + 1): exact only")
    return data, (f"{what}: {a.d} of a {shape[0]}x{shape[1]} array, lines of {a.line} "
                  f"elements, offset {a.offset}: exact {count.exact} lines; {bounds}")


def _mlt_models(a: argparse.Namespace) -> tuple[Any, str]:
    from predictor.families import mlt
    from predictor.inputs import read_json

    doc = read_json(a.results, "microbench transfer", "transfers")
    fits = {}
    for kind in mlt.TRANSFER_KINDS:
        got = mlt.transfers(doc, kind, a.results)
        if got.times.size:
            fits[kind] = (got, mlt.fit_table1(got.table, got.times, train=a.train, seed=a.seed,
                                              narrow=got.narrow))
    if not fits:
        raise BadInput(f"{a.results} has no transfers", "run microbench transfer first")
    data = {"results": a.results, "host": (doc.get("host") or {}).get("hostname"),
            "state": doc.get("state"),
            "kinds": {k: {"measured": int(g.times.size), "flagged": g.flagged,
                          "models": [f.to_json() for f in fs]} for k, (g, fs) in fits.items()}}
    return data, render_table2({k: fs for k, (_, fs) in fits.items()},
                               {k: g for k, (g, _) in fits.items()})


def render_table2(fits: Mapping[str, Sequence[Any]], got: Mapping[str, Any]) -> str:
    """The paper's Table 2 for this host: per model, R^2 (x 10^-3) and MS_E (us^2) on the test
    set, rows and columns side by side, and the ratio of S1's R^2 to M1's."""
    kinds = list(fits)
    narrow = {k for k in kinds if fits[k][0].narrow_r2 is not None}
    head = "model  " + "  ".join(
        f"{k + ': R^2 (1e-3)':>19} {'MS_E (us^2)':>12} {'MRE':>6}"
        + (f" {'R^2, d < line':>14}" if k in narrow else "") for k in kinds)
    lines = [head]
    names = [f.name for f in fits[kinds[0]]]
    for i, name in enumerate(names):
        cells = [f"{fits[k][i].r2 * 1e3:>19.2f} {fits[k][i].mse * 1e12:>12.4g} "
                 f"{fits[k][i].mre:>6.3f}"
                 + (f" {(fits[k][i].narrow_r2 or 0) * 1e3:>14.2f}" if k in narrow else "")
                 for k in kinds]
        lines.append(f"{name:<6} " + "  ".join(cells))
    for k in kinds:
        by = {f.name: f for f in fits[k]}
        g = got[k]
        tr = by[names[0]]
        lines.append(f"{k}: {g.times.size} measured ({g.flagged} flagged), {tr.n_train} "
                     f"training, {tr.n_test} test")
        if "S1" in by and "M1" in by and by["M1"].r2 > 0:
            s1, m1 = by["S1"], by["M1"]
            extra = (f"; on the {m1.n_narrow} test messages narrower than a line "
                     f"{s1.narrow_r2 / m1.narrow_r2:.2f}"
                     if s1.narrow_r2 is not None and m1.narrow_r2 else "")
            lines.append(f"{k}: S1's R^2 / M1's = {s1.r2 / m1.r2:.2f} (the paper: 2-6){extra}")
        if "M1" in by:
            lines.append(f"{k}: M1 = {by['M1'].model.formula()} (seconds; n bytes, mlt lines)")
    lines.append("R^2 = sum (y - y_hat)^2 / sum (y - mean y)^2 on the test set (smaller is "
                 "better; the paper calls < 0.01 acceptable); MS_E = sum (y - y_hat)^2 / "
                 "(n - p - 1); MRE: geometric mean of 1 + |y - y_hat| / y")
    return "\n".join(lines)


def _memlogp(a: argparse.Namespace) -> tuple[Any, str]:
    from predictor.families import memlogp as ml
    from predictor.families import memlogp_costs as mc

    m = ml.load_measurements(a.results)
    model = ml.fit(m, modeler=a.modeler)
    other = ml.load_measurements(a.validate) if a.validate else m
    cmp = ml.compare(model, other, str(a.validate) if a.validate else "the fitted points")
    costs = [mc.p2p_cost(model, a.size, a.stride, a.latency),
             mc.broadcast_cost(model, a.size, a.stride, a.procs, a.latency),
             mc.paper_broadcast_cost(model, a.size, a.stride, a.procs, a.latency)]
    p2p = mc.p2p_rows(model, other)
    ns = 1e9
    lines = [f"memory logP of {m.host.get('hostname', 'this host')} from {a.results} "
             f"({len(m.points)} points); costs per byte",
             f"alpha = {mc.seconds_per_byte(model.alpha_s_per_byte)} (contiguous copy, "
             "cache-resident)"]
    for op, curve in model.curves.items():
        lines.append(f"alpha + ell_{op}(s, d) = {curve.model.formula()}  [seconds per byte; "
                     f"terms decided by {curve.model.decided_by}; MRE "
                     f"{100 * (curve.model.mre - 1):.1f}% on {curve.model.n} points]")
    lines.append(f"predicted against measured on {cmp.on} (ns per byte; error = predicted / "
                 "measured - 1)")
    lines.append(f"{'op':<7} {'s':>9} {'d':>6} {'measured':>9} {'predicted':>9} "
                 f"{'ell meas':>9} {'ell pred':>9} {'error':>7}  flags")
    for r in cmp.rows:
        lines.append(f"{r.op:<7} {_bytes(r.s_bytes):>9} {r.d_bytes:>6} "
                     f"{r.measured_s_per_byte * ns:>9.4f} {r.predicted_s_per_byte * ns:>9.4f} "
                     f"{r.ell_measured_s_per_byte * ns:>9.4f} "
                     f"{r.ell_predicted_s_per_byte * ns:>9.4f} {100 * r.error:>+6.1f}%  "
                     + ",".join(r.flags))
    w, j = cmp.worst, cmp.to_json()
    lines.append(f"worst: {w.op} s={_bytes(w.s_bytes)} d={w.d_bytes} {100 * w.error:+.1f}%; "
                 f"range {100 * j['max_under']:+.1f}% .. {100 * j['max_over']:+.1f}% (the "
                 f"paper: -60% .. +80%); mean |error| {100 * j['mean_abs_error']:.1f}%; "
                 f"within +-25%: {'yes' if cmp.within(0.25) else 'no'}")
    if p2p:
        lines.append("point-to-point on two CPUs (sender packs, receiver unpacks), L = 0:")
        lines.append(f"{'s':>9} {'d':>6} {'measured':>10} {'predicted':>10} {'one CPU':>10} "
                     f"{'error':>7}")
        for q in p2p:
            lines.append(f"{_bytes(q.s_bytes):>9} {q.d_bytes:>6} {seconds(q.measured_s):>10} "
                         f"{seconds(q.predicted_s):>10} "
                         f"{seconds(q.local_s) if q.local_s == q.local_s else '-':>10} "
                         f"{100 * q.error:>+6.1f}%")
    lines.append(f"costs of a {_bytes(a.size)} message, stride {a.stride} B, P = {a.procs}, "
                 f"L = {seconds(a.latency)} (section 6.5; overhead = the alpha part, latency "
                 "= the ell part):")
    for c in costs:
        lines.append(f"  {c.what:<32} {seconds(c.total_s):>10} (overhead "
                     f"{seconds(c.overhead_s)}, latency {seconds(c.latency_s)}, network "
                     f"{seconds(c.network_s)})")
    lines.append("  the broadcast as printed in the paper, (P+1) alpha + 2 ell + L, counts one "
                 "gap too many (it gives 3 alpha + L for P = 2, not its own p2p cost)")
    data = {"results": str(a.results), "model": model.to_json(), "comparison": j,
            "p2p_measured": [q.to_json() for q in p2p],
            "costs": {"size_bytes": a.size, "stride_bytes": a.stride, "procs": a.procs,
                      "latency_s": a.latency, "estimates": [c.to_json() for c in costs]},
            "within_25_percent": cmp.within(0.25)}
    return data, "\n".join(lines)


def _bytes(n: int) -> str:
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def _profile(a: argparse.Namespace) -> tuple[Any, str]:
    from predictor.costs.profile import load_profile, profile_to_toml

    prof = load_profile(a.profile)
    return prof.to_dict(), profile_to_toml(prof).rstrip("\n")


def parse_assignments(items: Sequence[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            eq = ""
        if not eq or not name.strip() or not math.isfinite(out.get(name.strip(), math.nan)):
            raise BadInput(f"{item!r} is not NAME=NUMBER", "write e.g. keys=100000")
    return out


def _select(a: argparse.Namespace) -> tuple[Any, str]:
    from predictor.families import select

    params = parse_assignments(a.at)
    spec = select.load_spec(a.spec)
    if a.holdout is not None and not 0 < a.holdout < 1:
        raise BadInput(f"--holdout {a.holdout} is not a fraction", "give e.g. --holdout 0.25")
    models = select.fit_implementations(spec, select.load_samples(spec, a.samples),
                                        modeler=a.modeler, holdout=a.holdout)
    choice = select.choose(spec, models, params)
    at = ", ".join(f"{k} = {v:g}" for k, v in params.items())
    lines = [f"{spec.name} at {at}: predicted times (95% prediction intervals)",
             f"{'implementation':<16} {'predicted':>10}  {'interval':<22} parameters"]
    for c in choice.candidates:
        lines.append(f"{c.implementation:<16} {seconds(c.predicted):>10}  "
                     f"{seconds(c.lower) + ' .. ' + seconds(c.upper):<22} "
                     f"{c.optimised or '-'}")
    best = choice.best
    if len(choice.candidates) > 1:
        nxt = choice.candidates[1]
        lines.append(f"pick {best.implementation}: predicted {choice.margin:.2f}x faster than "
                     f"{nxt.implementation}, the next best"
                     + ("; their 95% intervals overlap, so within the models' error the two "
                        "may be equal" if best.upper >= nxt.lower else ""))
    else:
        lines.append(f"pick {best.implementation}: the only implementation")
    lines.append("models (seconds):")
    for name, m in models.items():
        v = m.validation
        lines.append(f"  {name} = {m.formula()}")
        lines.append(f"    MRE {100 * (m.mre - 1):.1f}% on {m.n} fitted configurations"
                     + (f", {100 * (v.mre - 1):.1f}% on {v.n} by {v.on}" if v else "")
                     + f"; terms decided by {m.decided_by}"
                     + (f"; dropped {', '.join(str(d.term) for d in m.dropped)}"
                        if m.dropped else ""))
    lines += [f"note: {n}" for n in choice.notes]
    data = {"specification": spec.name, "parameters": params,
            "pick": best.implementation, "margin": choice.margin,
            "candidates": [{"implementation": c.implementation, "predicted_s": c.predicted,
                            "interval_s": [c.lower, c.upper], "parameters": dict(c.params),
                            "optimised": c.optimised} for c in choice.candidates],
            "models": {k: m.to_dict() for k, m in models.items()},
            "notes": list(choice.notes)}
    return data, "\n".join(lines)


def _forecast(a: argparse.Namespace) -> tuple[Any, str]:
    """Rows rendered as they come (``iter_forecast``): without ``--json`` no row and no step
    is kept, so a large records file is forecast in the memory of its compact rows."""
    from predictor.costs.calibrate import assumptions_used, iter_forecast
    from predictor.costs.profile import check_host, load_profile
    from predictor.inputs import iter_counters

    prof = load_profile(a.profile)
    check_host(prof)
    cols = ["F1", "F2", "F3", "F", "QSM_min", "QSM_max", "EBSP_min", "EBSP_max",
            "DXBSP_min", "DXBSP_max"]
    how = (f"model {a.model}" if a.model
           else "model per superstep: the most complete variant whose counters it has")
    lines = [f"profile {prof.name}, {how}",
             f"{'superstep':<20} {'p':>3} " + " ".join(f"{c:>9}" for c in cols)
             + f" {'dom':>4} {'T':>9} {'E':>6}  model"]
    models: dict[str, Mapping[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    used: set[str] = set()
    first_error: PredictorError | None = None
    predicted = False
    for r, error in iter_forecast(prof, iter_counters(a.counters), variant=a.model):
        first_error = first_error or error
        used.update(r["assumed"])
        if a.json:
            rows.append(si_fields(r))  # seconds, as every machine-readable output
        if r["F_ns"] is None:
            if not a.json:
                lines.append(f"{r['superstep'][:20]:<20} {r['processors']:>3} no prediction: "
                             f"{r['why']}")
            continue
        predicted = True
        models[r["model"]] = r["accuracy"]
        if a.json:
            continue
        vals = " ".join(f"{_ns(r[c + '_ns']):>9}" for c in cols)
        e = "-" if r["error"] is None else f"{r['error']:.2f}"
        lines.append(f"{r['superstep'][:20]:<20} {r['processors']:>3} {vals} "
                     f"{r['dominant']:>4} {_ns(r['time_ns']):>9} {e:>6}  {r['model']}"
                     + (" *" if r["assumed"] else ""))
    if first_error is not None and not predicted:  # forecast()'s rule: none predicted
        raise first_error
    assumed = assumptions_used(used)
    for name, acc in models.items():
        if acc:
            lines.append(f"model {name}: E avg {acc['avg_error']:.2f} / max "
                         f"{acc['max_error']:.2f} on {acc.get('n', '?')} {acc.get('on', '')}")
    for k, why in assumed.items():
        lines.append(f"* assumed {k}: {why}")
    return {"profile": prof.name, "model": a.model, "supersteps": rows,
            "assumptions": assumed}, "\n".join(lines)


def _asks_pilot_help(args: Sequence[str]) -> bool:
    """``predict --pilot --help`` (as ``predict --help`` says): argparse would take --help
    for the command --pilot expects and fail (issue 34)."""
    at = args.index("--pilot") if "--pilot" in args else -1
    return at >= 0 and list(args[at + 1:at + 2]) in (["-h"], ["--help"])


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--version"]:
        print(version("predict"))
        return 0
    run: Callable[[argparse.Namespace], tuple[Any, str]]
    try:
        if args and args[0] in SUBCOMMANDS:
            a = _sub_parser().parse_args(args)
            run = {"calibrate": _calibrate, "validate": _validate,
                   "profile": _profile, "select": _select, "mlt": _mlt,
                   "memlogp": _memlogp}[a.command]
        elif args[:1] in (["-h"], ["--help"]) or not args:
            _forecast_parser().print_help(sys.stdout if args else sys.stderr)
            return 0 if args else 2
        elif any(x == "--pilot" or x.startswith("--pilot=") for x in args):
            from predictor.pilot import cli as pilot_cli

            if _asks_pilot_help(args):
                pilot_cli.parser().print_help(sys.stdout)
                return 0
            a = pilot_cli.parser().parse_args(args)
            run = pilot_cli.run
        else:
            a = _forecast_parser().parse_args(args)
            run = _forecast
    except SystemExit as exc:  # argparse: usage error (2) or --help (0), already printed
        return int(exc.code or 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", HostMismatchWarning)
        try:
            data, text = run(a)
        except PredictorError as exc:
            print(f"predict: {exc}", file=sys.stderr)
            return exc.exit_code
    msgs = [str(w.message) for w in caught if issubclass(w.category, HostMismatchWarning)]
    for m in msgs:
        print(f"predict: warning: {m}", file=sys.stderr)
    try:
        if a.json:
            if isinstance(data, dict) and msgs:
                data = {**data, "warnings": msgs}
            print(json.dumps(data, indent=2, default=str))
        else:
            print(text)
    except BrokenPipeError:
        return closed_pipe()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
