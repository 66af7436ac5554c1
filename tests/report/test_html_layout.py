"""The HTML report in a real browser: at 1400 px and at a laptop's 1280 px nothing is wider than
the window, nothing spills out of its box and no plot clips its text.

Headless Chromium loads each report with a probe script (added here; the report has none) that
compares every element's box with the viewport and writes the verdict into the page, which
``--dump-dom`` prints. Skips without Chromium (``scripts/system-deps.sh`` installs it). Set
``COUNTERD_SCREENSHOTS=DIR`` to also get a PNG of each page at each width.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from counterd import prediction, report
from counterd.data.events import NAMES, CounterValue, Source
from counterd.data.records import SuperstepRecord, read_jsonl
from counterd.prediction import Prediction

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = next((p for n in ("chromium", "chromium-browser", "google-chrome")
                 if (p := shutil.which(n))), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium to load the report in (scripts/system-deps.sh, as "
                             "root, installs the Debian package chromium)")

# Records why the layout is wrong, if it is: the page scrolls sideways, an element's box leaves
# the viewport (the window less its vertical scroll bar), an element's content is wider than its
# box (a scroll box or spilled text), or an SVG element leaves its plot (clipped).
PROBE = """<script>(() => {
  const W = document.documentElement.clientWidth, bad = [];
  const what = e => e.tagName.toLowerCase() + ' "' + (e.textContent || '').trim().slice(0, 50)
                    + '"';
  if (document.documentElement.scrollWidth > W)
    bad.push('the page scrolls sideways: ' + document.documentElement.scrollWidth + ' px');
  for (const e of document.body.querySelectorAll('*')) {
    const r = e.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (r.left < -0.5 || r.right > W + 0.5)
      bad.push('outside the window [' + r.left + ', ' + r.right + ']: ' + what(e));
    if (e instanceof SVGElement) {
      const s = e.ownerSVGElement && e.ownerSVGElement.getBoundingClientRect();
      if (s && (r.left < s.left - 0.5 || r.right > s.right + 0.5))
        bad.push('clipped by its plot [' + r.left + ', ' + r.right + ']: ' + what(e));
    } else if (e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1) {
      bad.push('wider than its box (' + e.scrollWidth + ' > ' + e.clientWidth + '): ' + what(e));
    }
  }
  const out = document.createElement('pre');
  out.id = 'layout';
  out.textContent = JSON.stringify({window: innerWidth, bad: bad});
  document.body.appendChild(out);
})();</script>"""


def _chromium(width: int, url: str, tmp: Path, *args: str, height: int = 800) -> str:
    out = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         f"--user-data-dir={tmp / 'profile'}", f"--window-size={width},{height}", *args, url],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def layout_problems(page: str, width: int, tmp: Path) -> list[str]:
    """What the probe found wrong with ``page`` in a ``width`` px wide window."""
    f = tmp / "probed.html"
    f.write_text(page.replace("</body>", PROBE + "</body>"))
    dom = _chromium(width, f.as_uri(), tmp, "--dump-dom")
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S)
    assert found, f"the probe did not run:\n{dom[-2000:]}"
    verdict = json.loads(html.unescape(found.group(1)))
    assert verdict["window"] == width
    return list(verdict["bad"])


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> list[SuperstepRecord]:
    """The demo's records (`make demo`: the shipped example under the sim backend)."""
    out = tmp_path_factory.mktemp("demo") / "example.jsonl"
    subprocess.run([str(Path(sys.executable).parent / "counterd"), "record", "--backend", "sim",
                    "--out", str(out), "--", sys.executable, "examples/bsp_sum.py"],
                   cwd=ROOT, check=True, capture_output=True, timeout=60)
    return list(read_jsonl(out))


def _crowded() -> list[SuperstepRecord]:
    """The widest a page gets: 40 supersteps with long names, flags, one incomplete, 4
    processors and every canonical counter at 10^12; every fifth superstep's rank 1 begins
    20 ms late and superstep 2's rank 3 half a second late (flag start_skew; a span cut at
    the top of the plot, its label turned along the narrow bar)."""
    out = []
    for index in range(40):
        for rank in range(4):
            begin = index * 10**8 + rank * 1000 + (20 * 10**6 if index % 5 == 3 and rank == 1
                                                   else 5 * 10**8 if (index, rank) == (2, 3)
                                                   else 0)
            out.append(SuperstepRecord(
                run_id="crowded-run-with-a-long-identifier", index=index,
                name=f"exchange the halo rows with all neighbouring processors, round {index}",
                rank=rank, pid=100 + rank, cpu=rank, begin_ns=begin,
                end_ns=None if index == 7 else begin + (index + 1) * 10**6 * (1 + rank % 2),
                counters={n: CounterValue(1e12 + index, Source.MEASURED) for n in NAMES},
                flags=frozenset({"incomplete"} if index == 7 else
                                {"multiplexed", "migrated", "nested"}),
                backend="perf", host="a-host-name-that-is-rather-long.example.org"))
    return out


def _crowded_predict(recs: Sequence[SuperstepRecord]) -> Prediction:
    index = recs[0].index
    if index % 9 == 0:
        raise prediction.NoPrediction("no model variant of the profile fits this superstep: "
                                      "re-calibrate with `predict calibrate`", "no_model_variant")
    terms = {"F1": 0.0, "F2": 0.0, "F3": 0.0} if index == 5 else {
        "F1": index * 1e-4, "F2": 2e-3, "F3": 1e-3}
    return Prediction(terms, max(terms.values()))


def _page(case: str, demo: list[SuperstepRecord]) -> str:
    if case == "crowded":
        return report.render(report.build(_crowded(), predict=_crowded_predict), "html")
    records = demo
    if case == "demo, no memory counters":  # the `--backend none` run: time only
        records = [replace(r, counters={}) for r in demo]
    fn, why = prediction.load(None if case == "demo, no profile" else "sgi-power-challenge",
                              warn=lambda _: None)
    if case != "demo, no profile":
        assert fn is not None, why
    return report.render(report.build(records, predict=fn, prediction_note=why), "html")


CASES = ["demo, predicted", "demo, no profile", "demo, no memory counters", "crowded"]


@pytest.mark.parametrize("width", [1400, 1280])
@pytest.mark.parametrize("case", CASES)
def test_report_fits_the_window(case: str, width: int, demo: list[SuperstepRecord],
                                tmp_path: Path) -> None:
    page = _page(case, demo)
    problems = layout_problems(page, width, tmp_path)
    assert not problems, "\n".join(problems)
    shots = os.environ.get("COUNTERD_SCREENSHOTS")
    if shots:
        f = Path(shots) / f"{re.sub(r'[^a-z]+', '-', case)}-{width}.png"
        (tmp_path / "page.html").write_text(page)
        _chromium(width, (tmp_path / "page.html").as_uri(), tmp_path, "--hide-scrollbars",
                  f"--screenshot={f.resolve()}", height=2600)
