"""The HTML rendering of a report: a self-contained page with inline SVG plots (no scripts, no
network).
"""

from __future__ import annotations

from counterd.prediction import TERM_MEANING, TERMS
from counterd.records import INFO_FLAGS
from counterd.report.model import Report
from counterd.report.svg import (
    _FONT,
    TERM_COLOURS,
    _esc,
    plot_bottleneck,
    plot_imbalance,
    plot_measured_vs_predicted,
)
from counterd.report.text import _ms, _num, _s_ms

_CSS = """
body{margin:0;background:#f6f7f9;color:#222;FONT}
main{max-width:1120px;margin:0 auto;padding:24px 20px 40px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:0 0 8px}
.sub{color:#666;font-size:13px;margin-bottom:18px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin-bottom:18px}
.card{background:#fff;border:1px solid #e2e4e8;border-radius:8px;padding:10px 16px;min-width:130px}
.card b{display:block;font-size:20px} .card span{color:#666;font-size:12px}
section{background:#fff;border:1px solid #e2e4e8;border-radius:8px;padding:14px 16px;
margin-bottom:16px}
.note{color:#666;font-size:12px;margin:6px 0 0}
table{border-collapse:collapse;width:100%;font-size:12px}
th,td{padding:4px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}
th{background:#fafafa;position:sticky;top:0} td.l,th.l{text-align:left}
.dom{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:11px}
.flag{color:#b35c00}
""".replace("FONT", _FONT)


def render_html(rep: Report) -> str:
    rows = rep.rows
    times = [r.time_ns for r in rows if r.time_ns is not None]
    total = sum(times) / 1e9 if times else None
    summary = rep.error_summary()
    incomplete = sum(1 for r in rows if r.time_ns is None)
    doms = [r.dominating for r in rows if r.dominating]
    cards = [(f"{len(rows)}", "supersteps"),
             (f"{max((r.processors for r in rows), default=0)}", "processors"),
             ("-" if total is None else f"{total * 1e3:.2f} ms", "measured total"),
             ("-" if summary is None else f"{summary[0]:.2f} / {summary[1]:.2f}",
              "error ratio avg / max"),
             (max(set(doms), key=doms.count) if doms else "-", "most frequent bottleneck"),
             (f"{incomplete}", "incomplete supersteps")]
    pred_cols = ["F ms", "E", "dominating", "F1 ms", "F2 ms", "F3 ms"] if rep.predicted else []
    head = ["#", "superstep", "p", "time ms", *pred_cols, "time imb."] + [
        f"{c} max" for c in rep.counters] + ["flags"]
    trs = []
    for r in rows:
        p = r.prediction
        dom = (f'<span class="dom" style="background:{TERM_COLOURS[r.dominating]}">'
               f'{r.dominating} {TERM_MEANING[r.dominating]}</span>' if r.dominating else "-")
        flags = sorted(r.flags - INFO_FLAGS)
        pred_cells = [_s_ms(p.total_s if p else None),
                      "-" if r.error_ratio is None else f"{r.error_ratio:.2f}", dom,
                      *[_s_ms(p.terms_s[t] if p else None) for t in TERMS]]
        cells = [str(r.index), f'<td class="l">{_esc(r.name)}', str(r.processors),
                 _ms(r.time_ns), *(pred_cells if rep.predicted else []),
                 "-" if r.time_imbalance is None else f"{r.time_imbalance:.2f}",
                 *[(_num(r.counters[c].max) + (
                     f' <small>({r.counters[c].imbalance:.2f}x)</small>'
                     if r.counters[c].imbalance else "")) if c in r.counters else "-"
                   for c in rep.counters],
                 f'<td class="l flag">{_esc(", ".join(flags))}']
        trs.append("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>"
                                    for c in cells) + "</tr>")
    ths = "".join(f'<th class="{"l" if h in ("superstep", "flags") else ""}">{_esc(h)}</th>'
                  for h in head)
    sources = sorted({f"{k}: {c.source}" for r in rows for k, c in r.counters.items()})
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>counterd report: {_esc(", ".join(rep.runs))}</title>
<style>{_CSS}</style></head>
<body><main>
<h1>Superstep report</h1>
<div class="sub">{_esc(rep.source)} &middot; runs {_esc(", ".join(rep.runs))} &middot; hosts
{_esc(", ".join(rep.hosts) or "-")} &middot; backends {_esc(", ".join(rep.backends))}</div>
<div class="cards">{"".join(f"<div class=card><b>{_esc(v)}</b><span>{_esc(k)}</span></div>"
                            for v, k in cards)}</div>
<section><h2>{"Measured and predicted time" if rep.predicted else "Measured time"} per
superstep</h2>
{plot_measured_vs_predicted(rep)}
<p class="note">Measured time is the superstep's span over all processors (max end minus min
begin). {_esc("Predictions: " + rep.prediction_note)}.</p></section>
<section><h2>Per-processor imbalance</h2>
{plot_imbalance(rep)}
<p class="note">Red cells are processors slower than the superstep's mean; the others wait for
them at the barrier.</p></section>
<section><h2>Bottleneck per superstep</h2>
{plot_bottleneck(rep)}
<p class="note">F1: memory hierarchy (per-level misses and writebacks of the busiest processor);
F2: the bus shared by all processors; F3: the busiest memory bank (seed 004). The full-colour
bar is the term that sets F = max(F1, F2, F3).</p></section>
<section><h2>Supersteps</h2><div style="overflow-x:auto"><table><thead><tr>{ths}</tr></thead>
<tbody>{"".join(trs)}</tbody></table></div>
<p class="note">Counter columns: max over processors, with the imbalance max/mean in brackets.
Sources: {_esc("; ".join(sources) or "no counters")}.</p></section>
</main></body></html>
"""
