"""/metrics over HTTP(S): the exposition formats (:func:`negotiate`), the rendered exposition
kept fresh in the background (:class:`ExpositionCache`) and the server (:func:`serve`). What it
shows is :mod:`counterd.daemon.collector`'s families over
:mod:`counterd.daemon.metrics_state`; who may scrape, :mod:`counterd.daemon.scrape_access`.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import exposition
from prometheus_client.openmetrics import exposition as om
from prometheus_client.registry import Collector, CollectorRegistry

from counterd.daemon.metrics_state import MetricsState

if TYPE_CHECKING:
    from counterd.daemon.scrape_access import ScrapeAccess

log = logging.getLogger("counterd.daemon.exporter")


MAX_ACCEPT_CHARS = 8192  # a longer Accept header is not read: the text format


@dataclass(frozen=True)
class ExpositionFormat:
    """A rendering /metrics serves: its name, Content-Type and encoder (prometheus-client's)."""

    name: str
    content_type: str
    encode: Callable[[Collector], bytes]


TEXT = ExpositionFormat("text", exposition.CONTENT_TYPE_PLAIN_0_0_4, exposition.generate_latest)
OPENMETRICS = ExpositionFormat("openmetrics", om.CONTENT_TYPE_LATEST, om.generate_latest)


def negotiate(accept: str | None) -> ExpositionFormat:
    """The format for a scrape's ``Accept`` header, as prometheus-client's ``choose_encoder``
    decides: OpenMetrics where the scraper asks for it (Prometheus sends ``Accept:
    application/openmetrics-text;version=1.0.0,...``), else the text format 0.0.4. Bounded to
    these two renderings, each cached (:class:`ExpositionCache`): OpenMetrics is served as
    version 1.0.0 whatever version >= 1.0.0 was asked (its Content-Type says so; the version
    ``choose_encoder`` would echo is the client's text), and text/plain as 0.0.4 (the same
    exposition for our names, which need no escaping). An Accept header longer than
    :data:`MAX_ACCEPT_CHARS`, or one ``choose_encoder`` cannot read (a version such as ``1.x``
    makes it compare text with numbers: TypeError), gets the text format."""
    if not accept or len(accept) > MAX_ACCEPT_CHARS:
        return TEXT
    try:
        _, content_type = exposition.choose_encoder(accept)
    except Exception:  # prometheus-client's parsing of a hostile header: not the scrape's end
        return TEXT
    return OPENMETRICS if content_type.startswith("application/openmetrics-text") else TEXT


class _Collected(Collector):
    """The families of one collection, encoded in every format wanted (one collection, so
    every format shows the same state)."""

    def __init__(self, families: Sequence[Any]) -> None:
        self.families = families

    def collect(self) -> Iterator[Any]:
        return iter(self.families)


class ExpositionCache:
    """The rendered exposition, refreshed in the background, so a scrape costs a copy.

    Rendering 10,000 series through prometheus-client takes ~130 ms of Python on the
    development VM; doing it inside every scrape would put the scrape's p99 far above 50 ms.
    A scrape returns the latest rendering; a background thread re-renders when the state
    changed, at most every ``min_interval_s`` (``metrics.refresh_s``) and only while someone
    scrapes (none for ``idle_s``: no rendering at all). A scrape therefore sees data at most
    ``min_interval_s`` plus one rendering old; a rendering older than ``max_age_s`` (and the
    first) is redone inside the scrape. Each :class:`ExpositionFormat` scraped within
    ``idle_s`` is encoded from the same collection, plain and gzipped.
    """

    def __init__(self, reg: CollectorRegistry, state: MetricsState, *,
                 min_interval_s: float = 1.0, idle_s: float = 60.0, max_age_s: float = 30.0
                 ) -> None:
        self.registry = reg
        self.state = state
        self.min_interval_s = min_interval_s
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._render_lock = threading.Lock()
        self._bodies: dict[str, tuple[bytes, bytes]] = {}  # format name -> (plain, gzipped)
        self._scraped: dict[str, tuple[ExpositionFormat, float]] = {}  # name -> (format, when)
        self._version = -1
        self._rendered_at = 0.0
        self._last_scrape = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="counterd-exposition",
                                        daemon=True)
        self._thread.start()

    def _render(self) -> None:
        import gzip

        with self._render_lock:
            version = self.state.version
            now = time.monotonic()
            with self._lock:
                formats = [f for f, when in self._scraped.values() if now - when < self.idle_s]
            collected = _Collected(list(self.registry.collect()))
            bodies = {}
            for fmt in formats:
                body = fmt.encode(collected)
                bodies[fmt.name] = (body, gzip.compress(body, compresslevel=1))
            with self._lock:
                self._bodies, self._version = bodies, version
                self._rendered_at = time.monotonic()

    def body(self, gzip_ok: bool = False, fmt: ExpositionFormat = TEXT) -> bytes:
        now = self._last_scrape = time.monotonic()
        with self._lock:
            self._scraped[fmt.name] = (fmt, now)
            have = self._bodies.get(fmt.name)
        if have is None or now - self._rendered_at > self.max_age_s:
            self._render()
            with self._lock:
                have = self._bodies.get(fmt.name)
        assert have is not None
        return have[1] if gzip_ok else have[0]

    def _loop(self) -> None:
        while not self._stop.wait(min(0.25, self.min_interval_s / 4)):
            now = time.monotonic()
            if (self._bodies and self.state.version != self._version
                    and now - self._last_scrape < self.idle_s
                    and now - self._rendered_at >= self.min_interval_s):
                try:
                    self._render()
                except Exception:  # a broken collector must not kill the refresher
                    log.exception("rendering /metrics failed")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def serve(cache: ExpositionCache, host: str, port: int, access: ScrapeAccess | None = None
          ) -> Any:
    """An HTTP(S) server for ``/metrics`` (and ``/``) in a daemon thread; returns the server
    (``shutdown()``, ``server_close()``, ``server_port``). ``access`` (default: anyone who
    reaches the socket, plain HTTP) is enforced as :mod:`counterd.daemon.scrape_access` says:
    the allow-list and the connection bound in the accepting thread (a refused peer is closed
    before a byte is read, no thread spawned), TLS and basic auth in the connection's thread.
    """
    import ssl
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    guard = access

    class Handler(BaseHTTPRequestHandler):
        timeout = guard.timeout_s if guard is not None else None

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if guard is not None and not guard.authorized(self.headers.get("Authorization")):
                guard.refused("unauthorized")
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="counterd"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404, "only /metrics is served")
                return
            fmt = negotiate(self.headers.get("Accept"))
            gz = exposition.gzip_accepted(self.headers.get("Accept-Encoding", ""))
            try:
                data = cache.body(gzip_ok=gz, fmt=fmt)
            except Exception as exc:
                log.exception("scrape failed")
                self.send_error(500, str(exc))
                return
            self.send_response(200)
            self.send_header("Content-Type", fmt.content_type)
            self.send_header("Vary", "Accept, Accept-Encoding")
            if gz:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("metrics: " + format, *args)

        def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
            # http.server catches a request line's timeout itself and only says so here
            if guard is not None and format.startswith("Request timed out"):
                guard.refused("timeout")
            log.debug("metrics: " + format, *args)

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def verify_request(self, request: Any, client_address: Any) -> bool:
            """In the accepting thread: False closes the connection at once."""
            if guard is None:
                return True
            if not guard.allows(str(client_address[0])):
                guard.refused("not_allowed")
                return False
            if not guard.slots.acquire(blocking=False):
                guard.refused("busy")
                return False
            return True

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                if guard is not None:
                    guard.slots.release()

        def finish_request(self, request: Any, client_address: Any) -> None:
            if guard is None:
                super().finish_request(request, client_address)
                return
            request.settimeout(guard.timeout_s)
            if guard.tls is None:
                super().finish_request(request, client_address)
                return
            try:
                conn = guard.tls.wrap_socket(request, server_side=True)
            except TimeoutError:
                guard.refused("timeout")
                return
            except (ssl.SSLError, OSError):
                guard.refused("tls")
                return
            try:
                super().finish_request(conn, client_address)
            finally:
                conn.close()

        def handle_error(self, request: Any, client_address: Any) -> None:
            import sys

            exc = sys.exc_info()[1]
            if isinstance(exc, TimeoutError) and guard is not None:
                guard.refused("timeout")
            elif not isinstance(exc, (ConnectionError, ssl.SSLError)):
                log.exception("metrics: request from %s failed", client_address)

    server = Server((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="counterd-metrics", daemon=True).start()
    return server
