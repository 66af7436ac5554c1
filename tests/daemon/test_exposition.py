"""/metrics content negotiation through prometheus-client (choose_encoder, gzip_accepted):
OpenMetrics to a scraper that asks for it, gzip where accepted, and promtool accepts both."""

from __future__ import annotations

import gzip
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
from prometheus_client.parser import text_string_to_metric_families

from counterd.backends.base import CounterValue
from counterd.daemon.collector import registry
from counterd.daemon.exporter import OPENMETRICS, TEXT, ExpositionCache, negotiate, serve
from counterd.daemon.metrics_state import MetricsState, Workload
from counterd.data.events import Source
from counterd.data.records import SuperstepRecord

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
# What Prometheus 2.42 sends (scrape.go: scrapeAcceptHeader)
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                     "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    st = MetricsState()
    st.observe_records([(SuperstepRecord(
        run_id="r", index=i, name="s", rank=0, pid=1, cpu=0, begin_ns=0, end_ns=1000 * (i + 1),
        counters={"loads": CounterValue(5.0, Source.SIMULATED),
                  "task_clock_ns": CounterValue(2e3, Source.MEASURED, 0.5)},
        flags=frozenset({"migrated"}) if i else frozenset()), Workload(1000, "bsp"))
        for i in range(3)], 0.001)
    st.observe_samples(Workload(None, "web"), {"task_clock_ns": 1e9}, {"task_clock_ns": 1.0}, 2)
    cache = ExpositionCache(registry(st), st)
    server = serve(cache, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.server_port}/metrics"
    server.shutdown()
    server.server_close()
    cache.close()


def get(url: str, **headers: str) -> tuple[dict[str, str], bytes]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return dict(r.headers.items()), r.read()


def test_negotiate_follows_choose_encoder() -> None:
    assert negotiate(PROMETHEUS_ACCEPT) is OPENMETRICS
    assert negotiate("application/openmetrics-text") is OPENMETRICS  # no version: 1.0.0
    assert negotiate("application/openmetrics-text; version=7.1.0") is OPENMETRICS
    for accept in (None, "", "*/*", "text/plain", "text/plain;version=1.0.0;escaping=dots",
                   "application/openmetrics-text; version=0.0.1", "application/json"):
        assert negotiate(accept) is TEXT, accept


def test_openmetrics_to_prometheus_text_to_others(url: str) -> None:
    headers, body = get(url, Accept=PROMETHEUS_ACCEPT)
    assert headers["Content-Type"] == "application/openmetrics-text; version=1.0.0; " \
                                      "charset=utf-8"
    text = body.decode()
    assert text.endswith("# EOF\n")
    fams = {f.name: f for f in om_parse(text)}  # the strict OpenMetrics parser
    dur = fams["counterd_superstep_duration_seconds"]
    assert dur.type == "histogram"
    assert {s.labels["uid"] for s in dur.samples} == {"1000"}
    headers, body = get(url)
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# EOF" not in body.decode()
    assert {f.name for f in text_string_to_metric_families(body.decode())} >= {
        "counterd_superstep_duration_seconds", "counterd_watched_threads"}


def test_gzip_where_accepted_plain_elsewhere(url: str) -> None:
    _, plain = get(url, Accept=PROMETHEUS_ACCEPT)
    headers, packed = get(url, Accept=PROMETHEUS_ACCEPT, **{"Accept-Encoding": "br, GZIP;q=0.5"})
    assert headers["Content-Encoding"] == "gzip" and "Accept-Encoding" in headers["Vary"]
    assert gzip.decompress(packed) == plain
    headers, body = get(url, **{"Accept-Encoding": "deflate, identity"})
    assert "Content-Encoding" not in headers and body.startswith(b"# HELP")


@pytest.mark.skipif(not Path(PROMTOOL).exists(),
                    reason="promtool not installed (Debian package prometheus; `make test`, "
                           "which .ci/run runs, installs it through scripts/system-deps.sh as "
                           "root)")
def test_promtool_accepts_both_formats(url: str, tmp_path: Path) -> None:
    """The text format through ``promtool check metrics`` (its linter reads only that format);
    OpenMetrics through Prometheus's own OpenMetrics parser, ``promtool tsdb
    create-blocks-from openmetrics``, which also wants a timestamp on every sample: each
    sample line is stamped, nothing else changed (a document without ``# EOF``, or with a
    malformed line, fails there)."""
    _, text = get(url)
    out = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                         timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    _, body = get(url, Accept=PROMETHEUS_ACCEPT)
    stamp = str(int(time.time()) - 3600)
    lines = body.decode().split("\n")
    stamped = "\n".join(ln if not ln or ln.startswith("#") else f"{ln} {stamp}" for ln in lines)
    for name, doc in (("ok", stamped), ("no_eof", stamped.replace("# EOF\n", ""))):
        (tmp_path / name).write_text(doc)
        out = subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics",
                              str(tmp_path / name), str(tmp_path / f"{name}-blocks")],
                             capture_output=True, timeout=60)
        assert (out.returncode == 0) == (name == "ok"), (name, out.stdout + out.stderr)
