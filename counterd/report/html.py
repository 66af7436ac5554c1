"""The HTML rendering of a report: a self-contained page with inline SVG plots (no scripts, no
network), laid out to read without horizontal scrolling from 1280 px wide up.
"""

from __future__ import annotations

import re

from counterd.data import units
from counterd.data.events import BY_NAME
from counterd.prediction import TERM_MEANING, TERMS
from counterd.report.model import (
    REPORT_FLAGS,
    SKEW_FLOOR_NS,
    SKEW_SHARE,
    START_SKEW,
    Report,
    StepRow,
    flag_meaning,
    flags_legend,
)
from counterd.report.svg import (
    _FONT,
    SHORT,
    TERM_COLOURS,
    _esc,
    plot_bottleneck,
    plot_imbalance,
    plot_measured_vs_predicted,
)

_CSS = """
body{margin:0;background:#f6f7f9;color:#222;FONT}
main{max-width:1320px;margin:0 auto;padding:20px 20px 40px;box-sizing:border-box}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:0 0 8px}
.sub{color:#666;font-size:13px;margin-bottom:14px;overflow-wrap:anywhere}
.banner{background:#fff4d6;border:1px solid #e8c56a;border-radius:8px;padding:9px 14px;
margin-bottom:14px;font-size:14px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin-bottom:16px}
.card{background:#fff;border:1px solid #e2e4e8;border-radius:8px;padding:10px 16px;min-width:130px}
.card b{display:block;font-size:20px} .card span{color:#666;font-size:12px}
section{background:#fff;border:1px solid #e2e4e8;border-radius:8px;padding:14px 16px;
margin-bottom:16px}
.note{color:#666;font-size:12px;margin:6px 0 0;overflow-wrap:anywhere}
.why{font-size:14px;margin:4px 0 8px;overflow-wrap:anywhere} .why li{margin:4px 0}
code{background:#f0f1f3;border-radius:3px;padding:0 3px;font-size:92%;white-space:nowrap}
.scroll{overflow-x:auto}
table{border-collapse:collapse;font-size:12px;margin-top:4px}
th,td{padding:4px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap;
vertical-align:top;font-variant-numeric:tabular-nums}
th{background:#fafafa;vertical-align:bottom}
th small{display:block;color:#777;font-weight:normal;white-space:normal}
td small{display:block;color:#888}
.l{text-align:left} .name{white-space:normal;min-width:6em;max-width:16em;overflow-wrap:anywhere}
.flag{color:#b35c00;white-space:normal;min-width:8em}
.dom{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:11px}
.swatch{display:inline-block;width:12px;height:10px;border:1px solid #ccc;vertical-align:-1px}
""".replace("FONT", _FONT)

# Widths (px) of counter columns one table holds, so that it fits a 1280 px screen beside the
# superstep's number and name; more counters go into further tables.
_COUNTER_COLUMNS_PX = 860
_SIMULATORS = {"sim": "counterd's cache simulator, fed the address streams the program "
                      "declares with step.feed()",
               "callgrind": "valgrind's Callgrind, simulating the caches under the whole "
                            "program"}


def _seconds(v: float | None) -> str:
    """``1.23 ms`` (:func:`counterd.data.units.seconds`), ``-`` when unknown."""
    return "-" if v is None else units.seconds(v)


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _text(s: str) -> str:
    """Escaped prose, with the `commands` it quotes as code."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", _esc(s))


def _th(name: str, unit: str = "", cls: str = "", title: str = "") -> str:
    attrs = (f' class="{cls}"' if cls else "") + (f' title="{_esc(title)}"' if title else "")
    label = _esc(name).replace("_", "_<wbr>")
    return f"<th{attrs}>{label}{f'<small>{_esc(unit)}</small>' if unit else ''}</th>"


def _td(text: str, cls: str = "", title: str = "") -> str:
    attrs = (f' class="{cls}"' if cls else "") + (f' title="{_esc(title)}"' if title else "")
    return f"<td{attrs}>{text}</td>"


def _table(head: list[str], body: list[list[str]]) -> str:
    return (f'<div class="scroll"><table><thead><tr>{"".join(head)}</tr></thead><tbody>'
            + "".join(f"<tr>{''.join(cells)}</tr>" for cells in body) + "</tbody></table></div>")


def _step_cells(r: StepRow) -> list[str]:
    return [_td(str(r.index)), _td(_esc(r.name), "l name")]


def _steps_table(rep: Report, verbose: bool = False) -> str:
    head = [_th("#"), _th("superstep", cls="l"), _th("p", "processors"),
            _th("work", "s, slowest processor", title="the slowest processor's own time: "
                "what F predicts"),
            _th("span", "s, max end - min begin", title="the superstep's elapsed time over "
                "all processors: the work plus at most the start skew"),
            _th("start skew", "s", title="the last processor's begin minus the first one's")]
    if rep.predicted:
        head += [_th("F", "s, predicted"), _th("E", "F vs work"),
                 _th("dominating", cls="l"),
                 *[_th(t, f"s, {TERM_MEANING[t]}") for t in TERMS]]
    head += [_th("time imbalance", "max / mean")]
    if rep.marker_shares:
        head.append(_th("markers", "share of time", title="one begin + end pair, as its "
                        "process calibrated it, over the slowest processor's own time; over "
                        f"{rep.MARKER_WARN:.0%} in orange"))
    head.append(_th("flags", cls="l"))
    body = []
    for r in rep.rows:
        work = r.slowest_work_ns
        cells = [*_step_cells(r), _td(str(r.processors)),
                 _td(_seconds(None if work is None else work / 1e9)),
                 _td(_seconds(None if r.time_ns is None else r.time_ns / 1e9)),
                 _td(_seconds(r.skew_ns / 1e9), "flag" if r.skewed else "")]
        p = r.prediction
        if rep.predicted:
            dom = r.dominating
            badge = (f'<span class="dom" style="background:{TERM_COLOURS[dom]}">'
                     f'{dom} {TERM_MEANING[dom]}</span>' if dom else
                     "-" if p is None else "all terms 0")
            cells += [_td(_seconds(p.total_s if p else None), title=r.no_prediction),
                      _td(_ratio(r.error_ratio)), _td(badge, "l", r.no_prediction),
                      *[_td(_seconds(p.terms_s[t] if p else None)) for t in TERMS]]
        cells.append(_td(_ratio(r.time_imbalance)))
        if rep.marker_shares:
            share = r.marker_share
            cells.append(_td("-" if share is None else f"{share:.1%}",
                             "flag" if rep.markers_over(r) else ""))
        cells.append(_td(", ".join(
            f'<span title="{_esc(flag_meaning(f))}">{_esc(f)}</span>' + _raised(r, f)
            for f in r.shown_flags(verbose)), "l flag"))
        body.append(cells)
    return _table(head, body)


def _unit(counter: str) -> str:
    """The unit a counter's column shows: seconds for times, else what the counter counts."""
    unit = BY_NAME[counter].unit if counter in BY_NAME else "count"
    return "s" if unit == "ns" else unit


def _counter_value(counter: str, v: float) -> str:
    return units.counter_text(counter, v)


def _counter_tables(rep: Report) -> str:
    """Per counter, its max over processors in its unit with the imbalance max/mean below;
    the counters split over as many tables as it takes to fit the width."""
    cells: dict[str, list[str]] = {}
    widths: dict[str, float] = {}
    for c in rep.counters:
        stats = [r.counters.get(c) for r in rep.rows]
        texts = [_counter_value(c, s.max) for s in stats if s is not None]
        cells[c] = [_td("-") if s is None else _td(_counter_value(c, s.max) + (
            f"<small>{s.imbalance:.2f}x</small>" if s.imbalance else "")) for s in stats]
        widths[c] = 18 + 7.2 * max(map(len, [*c.split("_"), _unit(c), *texts]))
    groups: list[list[str]] = [[]]
    used = 0.0
    for c, w in widths.items():
        if groups[-1] and used + w > _COUNTER_COLUMNS_PX:
            groups.append([])
            used = 0.0
        groups[-1].append(c)
        used += w
    return "".join(_table(
        [_th("#"), _th("superstep", cls="l"),
         *[_th(c, _unit(c), title=BY_NAME[c].description if c in BY_NAME else "")
           for c in group]],
        [[*_step_cells(r), *[cells[c][i] for c in group]] for i, r in enumerate(rep.rows)])
        for group in groups)


def _missing(rep: Report) -> str:
    """Why supersteps have no prediction, in the report model's words."""
    missing = rep.missing_predictions()
    if not rep.predicted and not missing:
        return f'<p class="why">No prediction: {_text(rep.prediction_basis)}.</p>'
    names = {r.index: r.name for r in rep.rows}
    items = []
    for why, steps in missing.items():
        which = ("Every superstep" if len(steps) == len(rep.rows) else
                 f"Superstep {steps[0]} ({names[steps[0]]})" if len(steps) == 1 else
                 "Supersteps " + ", ".join(f"{i} ({names[i]})" if len(steps) <= 4 else str(i)
                                           for i in steps))
        items.append(f"<li>{_esc(which)}: {_text(why)}</li>")
    return f'<ul class="why">{"".join(items)}</ul>' if items else ""


def _raised(r: StepRow, flag: str) -> str:
    """After the flag exception, what was raised: short, the whole text as its title."""
    note = r.exception_note()
    if flag != "exception" or not note:
        return ""
    return (f' <span class="raised" title="{_esc(r.exception_note(short=False))}">'
            f'({_esc(note)})</span>')


def _banner(rep: Report) -> str:
    if not rep.simulated:
        return ""
    how = "; ".join(f"<b>{_esc(b)}</b> ({_esc(_SIMULATORS[b])})" if b in _SIMULATORS
                    else f"<b>{_esc(b)}</b>" for b in rep.backends)
    return (f'<div class="banner"><b>Simulated memory counters.</b> The cache counters of this '
            f'run come from a simulator, not from this machine\'s hardware: backend {how}. '
            f'Times are measured.</div>')


def _flags_legend(rep: Report, verbose: bool) -> str:
    """The flags the table shows, each in plain words, and those it leaves out."""
    legend, hidden = flags_legend(rep.rows, verbose)
    items = "".join(f"<dt><code>{_esc(f)}</code></dt><dd>{_esc(m)}</dd>" for f, m in legend)
    out = f'<dl class="note">{items}</dl>' if items else ""
    if hidden:
        out += (f'<p class="note">Not shown, as they say where the numbers come from '
                f'(<code>counterd report --verbose</code> shows and explains them; the JSON '
                f'always has them): {_esc(", ".join(hidden))}.</p>')
    return out


def _names_table(rep: Report) -> str:
    """Each superstep name over its occurrences, where names repeat ("" otherwise)."""
    if not rep.repeated:
        return ""
    body = [[_td(_esc(n.name), "l name"), _td(str(n.first_index), "num"),
             _td(str(n.processors), "num"), _td(str(n.occurrences), "num"),
             _td(_seconds(n.work_ns / 1e9), "num"), _td(_seconds(n.low_ns / 1e9), "num"),
             _td(_seconds(n.high_ns / 1e9), "num"), _td(_seconds(n.predicted_s), "num"),
             _td(f"{n.ratio:.2f}", "num"), _td(_ratio(n.error_ratio), "num")]
            for n in rep.by_name]
    table = _table([_th("superstep"), _th("first", cls="num"), _th("p", cls="num"),
                    _th("occurrences", "predicted, complete", "num"),
                    _th("work", "median", "num"), _th("least", cls="num"),
                    _th("most", cls="num"), _th("F", "median", "num"),
                    _th("work / F", "median", "num"), _th("E", cls="num")], body)
    return f"""<section><h2>Per superstep name</h2>
{table}
<p class="note">{_esc(rep.name_error_note()[:1].upper() + rep.name_error_note()[1:])}.</p>
</section>
"""


def render_html(rep: Report, *, verbose: bool = False) -> str:
    rows = rep.rows
    times = [r.time_ns for r in rows if r.time_ns is not None]
    summary, worst, rated = rep.error_summary(), rep.worst_error(), rep.error_summary(rated=True)
    bottlenecks = rep.bottlenecks()
    top = next(iter(bottlenecks), None)
    cards = [(f"{len(rows)}", "supersteps"),
             (f"{max((r.processors for r in rows), default=0)}", "processors"),
             (_seconds(sum(times) / 1e9 if times else None), "measured total (sum of spans)"),
             ("-" if summary is None else f"{summary[0]:.2f} / {summary[1]:.2f}",
              "error ratio E avg / max (F vs work)" + (
                  f"; max: {worst.index} {worst.name}" if worst is not None else "")),
             ("-" if top is None else f"{top} {TERM_MEANING[top]}",
              "most frequent bottleneck" + (
                  f" ({bottlenecks[top]} of {len(rows)} supersteps)" if top else "")),
             (f"{sum(1 for r in rows if r.time_ns is None)}", "incomplete supersteps")]
    if rated is not None and rated != summary:
        cards.insert(4, (f"{rated[0]:.2f} / {rated[1]:.2f}", "E avg / max without supersteps "
                         f"whose work is under {_seconds(rep.short_ns / 1e9)}"))
    name_summary = rep.name_error_summary() if rep.repeated else None
    if name_summary is not None:
        cards.insert(4, (f"{name_summary[0]:.2f} / {name_summary[1]:.2f}",
                         "E avg / max per superstep name (median work of its occurrences "
                         f"against median F); max: {name_summary[2].name}"))
    flag_notes = ""
    for flag in REPORT_FLAGS:  # start_skew, shared_cpu: a card and a note under the chart
        if note := rep.flag_note(flag):
            cards.append((f"{len(rep.flagged(flag))}", f"supersteps flagged {flag}"))
            flag_notes += (f'<p class="note"><b class="flag">{_esc(flag)}</b>: '
                           f"{_esc(note)}.</p>")
    missing = sum(1 for r in rows if r.no_prediction)
    sources: dict[str, set[str]] = {}
    for r in rows:
        for k, c in r.counters.items():
            sources.setdefault(c.source, set()).add(k)
    counters = "" if not rep.counters else f"""<section><h2>Counters per superstep</h2>
{_counter_tables(rep)}
<p class="note">The maximum over processors, in the counter's unit, with the imbalance max/mean
below. Sources: {_esc("; ".join(f"{s}: {', '.join(sorted(ks, key=rep.counters.index))}"
                                for s, ks in sorted(sources.items())))}.</p></section>"""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>counterd report: {_esc(", ".join(rep.runs))}</title>
<style>{_CSS}</style></head>
<body><main>
<h1>Superstep report</h1>
<div class="sub">{_esc(rep.source) + " &middot; " if rep.source else ""}runs
{_esc(", ".join(rep.runs))} &middot; hosts {_esc(", ".join(rep.hosts) or "-")} &middot; backends
{_esc(", ".join(rep.backends))}</div>
{_banner(rep)}
<div class="cards">{"".join(f"<div class=card><b>{_esc(v)}</b><span>{_esc(k)}</span></div>"
                            for v, k in cards)}</div>
<section><h2>{"Measured and predicted time" if rep.predicted else "Measured time"} per
superstep</h2>
{plot_measured_vs_predicted(rep)}
<p class="note">Each bar is a superstep's work: its slowest processor's own time (that
processor's end minus its begin), which is what F = max(F1, F2, F3) models and E compares
with. The pale part above it is the rest of the superstep's span (max end minus min begin over
all processors): time the processors that began first spent before the last one began, which
is waiting, not the superstep's cost.</p>
{flag_notes}
<p class="note">{_text(rep.prediction_basis[:1].upper() + rep.prediction_basis[1:])}.{
    f" No prediction for {missing} of {len(rows)} supersteps: the bottleneck panel says why."
    if missing else ""}{" " + _esc(rep.marker_note()[:1].upper() + rep.marker_note()[1:]) + "."
                        if rep.marker_note() else ""}</p>
</section>
<section><h2>Per-processor imbalance</h2>
{plot_imbalance(rep)}
<p class="note">Red cells are processors slower than the superstep's mean; the others wait for
them at the barrier.{
    f' <span class="swatch" style="background:{SHORT}"></span> Grey: supersteps whose work is '
    f"shorter than {_seconds(rep.short_ns / 1e9)} (under 5 % of the run's total work and a "
    f"fifth of the average superstep's), whose imbalance is noise; they do not take the "
    f"colour scale."
    if any(map(rep.is_short, rows)) else ""}</p></section>
<section><h2>Bottleneck per superstep</h2>
{_missing(rep)}
{plot_bottleneck(rep) if rep.predicted else ""}
<p class="note">F1: memory hierarchy (per-level misses and writebacks of the busiest processor);
F2: the bus shared by all processors; F3: the busiest memory bank (Amato et al., "Predicting
performance on SMPs"). The full-colour bar is the term that sets F = max(F1, F2, F3).</p>
</section>
{_names_table(rep)}<section><h2>Supersteps</h2>
{_steps_table(rep, verbose)}
{_flags_legend(rep, verbose)}
<p class="note">Work: the slowest processor's own time; span: max end minus min begin over the
processors (the work plus at most the start skew); start skew: the last processor's begin minus
the first one's, in orange where it is flagged <code>{START_SKEW}</code> (over
{SKEW_SHARE:.0%} of the work and over {SKEW_FLOOR_NS / 1e6:g} ms). E = max(work, F) /
min(work, F) (1 is exact): the error ratio of Amato et al., "Predicting Performance on SMPs",
with the slowest processor's time as the measured time, as F prices the memory accesses
processors perform, not their start skew. Time imbalance: the slowest processor's time over
the mean.</p></section>
{counters}
</main></body></html>
"""
