"""``counterd run``: the service's lifecycle (DESIGN.md section 6).

Threads, and what each owns:

* the **loop** (the caller's thread): the marker socket and every client connection
  (:mod:`counterd.daemon.server`, :mod:`counterd.daemon.session`, :mod:`counterd.wire.protocol`),
  SO_PEERCRED checks (:mod:`counterd.daemon.auth`), counting on a client's behalf
  (:mod:`counterd.daemon.behalf`), signals;
* the **writer** (:mod:`counterd.daemon.writer`): the store (:mod:`counterd.daemon.store`). It
  takes whatever the loop queued, commits it in one transaction (group commit), and only then
  hands the sequence numbers back to the loop, which acknowledges them to the clients:
  acknowledged means durable;
* the **sampler**: watched processes and marker clients, per-thread counters summed per job
  (:mod:`counterd.daemon.sampling`), every ``sampling.interval_s``;
* the **metrics server** (prometheus-client's HTTP server) over :mod:`counterd.daemon.exporter`
  (its families :mod:`counterd.daemon.collector`, its state
  :mod:`counterd.daemon.metrics_state`).

:class:`Daemon` starts and stops them, applies the configuration and coordinates the parts.

SIGTERM/SIGINT: stop accepting, read what clients already sent, commit and acknowledge all of
it, close the store (WAL checkpoint), remove the socket. SIGHUP: re-read the config file and
apply what can change without a restart (watch rules, sampling, label limits, retention,
allowed group, profile, log level); the rest is logged as needing a restart.

The library never prints; everything goes to the ``counterd`` logger (the journal under
systemd).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from counterd import prediction
from counterd.daemon import config as config_mod
from counterd.daemon.auth import Authority, peer_credentials
from counterd.daemon.behalf import Counting, resolve_backend
from counterd.daemon.collector import registry
from counterd.daemon.config import Config, Limits
from counterd.daemon.metrics_state import MetricsState, Workload
from counterd.daemon.query import Queries, QueryWorker
from counterd.daemon.sampling import sample_forever
from counterd.daemon.server import Server
from counterd.daemon.shared import Clients, Shared
from counterd.daemon.store import Store
from counterd.daemon.writer import Writer
from counterd.data.errors import BadInput, CounterdError

log = logging.getLogger("counterd.daemon")


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about readiness/stopping; a no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(message.encode(), address)
    except OSError as exc:
        log.debug("sd_notify failed: %s", exc)


RESERVED_FDS = 128  # the store, the listener, /metrics, counting on behalf, the log


def fit_open_files(limits: Limits) -> Limits:
    """``limits`` with ``max_clients`` fitting the open-file limit: the soft limit is raised
    towards the hard one (systemd's default hard limit is 524288) to hold two descriptors per
    client (its connection and its black box) plus :data:`RESERVED_FDS`; if it cannot be,
    ``max_clients`` is lowered, with a warning."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * limits.max_clients + RESERVED_FDS
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    if soft != resource.RLIM_INFINITY and soft < want:
        fit = max(1, (soft - RESERVED_FDS) // 2)
        log.warning("open-file limit %d fits %d clients, not socket.max_clients = %d: "
                    "serving %d (raise LimitNOFILE)", soft, fit, limits.max_clients, fit)
        return dataclasses.replace(limits, max_clients=fit)
    return limits


class Daemon:
    """One counterd instance. ``start()`` binds and starts the threads, ``serve()`` runs the
    loop until ``request_stop()``; tests drive it in a thread, ``run()`` in the foreground."""

    def __init__(self, config: Config, *, config_path: Path | None = None,
                 predict: prediction.PredictFn | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.state = MetricsState(max_jobs=config.max_jobs, max_uids=config.max_uids,
                                  max_superstep_names=config.max_superstep_names,
                                  export_pids=config.export_pids,
                                  grace_s=config.metrics_grace_s)
        self._injected_predict = predict
        self._stop = threading.Event()
        self._reload = False
        self._store: Store | None = None
        self._auth = Authority()
        self._clients = Clients()
        self._writer = Writer(self.state, wake=self._wake, stopping=self._stop)
        self._shared = Shared(self.state, self._auth, self._writer, self._clients)
        self._server = Server(self._shared)
        self._threads: list[threading.Thread] = []
        self._http: list[Any] = []  # one /metrics server per metrics.listen address
        self._exposition: Any = None
        self._metrics_scheme = "http"
        self.metrics_port: int | None = None  # the first address's (tests: port 0)
        self.metrics_ports: list[int] = []
        self._sampler_stop = threading.Event()
        self._shipper: Any = None  # counterd.central.shipper.Shipper with [central] dsn set
        self.ship_stats: Any = None

    # -- start / stop --------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.config
        self._apply(cfg)  # first: a config refused here (an unusable profile) leaves no store
        if cfg.central_dsn:  # psycopg missing: BadInput before anything is opened
            from counterd.central import psycopg_module

            psycopg_module()
        self._store = Store(cfg.store_path, synchronous=cfg.store_synchronous)
        self._store.set_shipping(bool(cfg.central_dsn))
        if cfg.central_dsn:
            from counterd.central.shipper import Shipper, ShipSettings, ShipStats

            self.ship_stats = ShipStats(changed=self._metrics_changed)
            self._shipper = Shipper(cfg.store_path, ShipSettings(
                cfg.central_dsn, cfg.central_role, cfg.central_batch_size,
                cfg.central_max_backlog, cfg.central_timeout_s,
                retry_max_s=cfg.central_retry_max_s), self.ship_stats)
        self._shared.queries = Queries(cfg.store_path)
        self._shared.query_worker = QueryWorker(self._shared.queries, self._wake)
        self._server.listen(cfg.socket_path, cfg.socket_mode)
        if cfg.metrics_listen:  # before any thread: a port in use leaves no socket file
            try:
                self._start_metrics(cfg.metrics_listen)
            except BaseException:
                self._server.stop_listening()
                self._store.close()
                raise
        self._threads.append(self._writer.start(self._store))
        self._shared.query_worker.start()
        sampler = threading.Thread(
            target=sample_forever, name="counterd-sampler", daemon=True,
            args=(self._sampler_stop, self._sampling_settings, self._clients.snapshot,
                  self.state, self._writer.put_samples))
        sampler.start()
        self._threads.append(sampler)
        if self._shipper is not None:  # its own thread: never waited for by the loop
            self._shipper.start()
        log.info("counterd listening on %s (config: %s), store %s (%s), metrics %s",
                 cfg.socket_path, cfg.source, cfg.store_path, cfg.store_synchronous,
                 self._metrics_urls() or "off")
        sd_notify("READY=1\nSTATUS=serving")

    def _metrics_changed(self) -> None:
        """What /metrics shows changed outside the metrics state (the central shipper's
        figures): the exposition cache re-renders."""
        with self.state.lock:
            self.state.version += 1

    def _sampling_settings(self) -> tuple[Config, Counting]:
        return self.config, self._shared.counting

    def _start_metrics(self, listen: str) -> None:
        """One /metrics server per address of ``listen``, all under one
        :class:`ScrapeAccess` (allow-list, connection bound, TLS, basic auth)."""
        from counterd.daemon.exporter import ExpositionCache, serve
        from counterd.daemon.scrape_access import ScrapeAccess

        addresses = config_mod.metrics_addresses(listen)
        access = ScrapeAccess.from_config(
            self.config, lambda reason: self.state.count("metrics_refused", reason))
        reg = registry(self.state)
        if self.ship_stats is not None:
            from counterd.central.shipper import ShipperCollector

            reg.register(ShipperCollector(self.ship_stats))  # type: ignore[arg-type]
        self._exposition = ExpositionCache(reg, self.state,
                                           min_interval_s=self.config.metrics_refresh_s)
        self._metrics_scheme = "https" if access.tls is not None else "http"
        for host, port in addresses:
            try:
                self._http.append(serve(self._exposition, host, port, access))
            except OSError as exc:
                self._stop_metrics()
                raise BadInput(f"cannot serve /metrics on {host}:{port}: {exc.strerror}",
                               "choose a free metrics.listen address "
                               "(COUNTERD_METRICS_LISTEN)") from exc
        self.metrics_ports = [int(s.server_port) for s in self._http]
        self.metrics_port = self.metrics_ports[0]

    def _metrics_urls(self) -> str:
        return ", ".join(
            f"{self._metrics_scheme}://{f'[{h}]' if ':' in h else h}:{s.server_port}/metrics"
            for s in self._http for h in (s.server_address[0],))

    def _stop_metrics(self) -> None:
        for server in self._http:
            server.shutdown()
            server.server_close()
        self._http = []
        if self._exposition is not None:
            self._exposition.close()

    def request_stop(self) -> None:
        """Signal-safe: ask the loop to shut down."""
        self._stop.set()
        self._wake()

    def request_reload(self) -> None:
        self._reload = True
        self._wake()

    def _wake(self) -> None:
        self._server.wake()

    def serve(self) -> None:
        """The loop; returns after a clean shutdown."""
        next_housekeeping = time.monotonic() + 1.0
        try:
            while not self._stop.is_set():
                self._server.poll(1.0)
                if self._reload:
                    self._reload = False
                    self.reload()
                now = time.monotonic()
                if now >= next_housekeeping:
                    next_housekeeping = now + 1.0
                    self._server.housekeeping(now)
                    # finished runs' series leave /metrics after metrics.grace_s
                    self.state.expire(self._clients.snapshot().values())
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        sd_notify("STOPPING=1")
        log.info("shutting down: reading what clients sent, committing, acknowledging")
        self._server.stop_listening()
        self._server.drain()  # what clients already sent is committed
        self._sampler_stop.set()
        self._writer.stop()
        for t in self._threads:
            t.join(timeout=60)
        if self._shipper is not None:  # what is still queued ships after the next start;
            self._shipper.stop(timeout=0.5)  # a batch cut short is shipped again then
        self._server.close_sessions()
        self._stop_metrics()
        self._server.close()
        if self._shared.query_worker is not None:
            self._shared.query_worker.stop()  # closes the queries' store
        self._shared.queries.close()
        log.info("stopped; %d records stored in this run", self.state.records_stored)

    # -- configuration -------------------------------------------------------------------------
    def _apply(self, cfg: Config, predictor: tuple[prediction.PredictFn | None, str] | None = None
               ) -> None:
        """Make ``cfg`` the running configuration. The predictor is resolved first, so a
        profile that cannot be used (BadInput) changes nothing; ``predictor`` keeps one already
        loaded (re-applying the running config after a failed reload)."""
        fn, why = predictor if predictor is not None else self._predictor(cfg)
        st = self.state
        with st.lock:
            st.max_jobs = cfg.max_jobs
            st.max_uids = cfg.max_uids
            st.max_names = cfg.max_superstep_names
            st.grace_s = cfg.metrics_grace_s
            st.export_pids = cfg.export_pids
        logging.getLogger("counterd").setLevel(cfg.log_level.upper())
        self._auth.allowed_gid = config_mod.allowed_gid(cfg.allowed_group) \
            if cfg.allowed_group else None
        st.set_predictor(fn, why)
        log.info("predictions: %s", why)
        backend, reason, cap = resolve_backend(cfg.sample_backend)
        self._shared.counting = Counting(
            backend, reason, tuple(e for e, why in (cap or {}).items() if why is None),
            cfg.sample_events)
        if cap is not None:
            st.set_available("sampled", {e: cap.get(e, "not known to perf")
                                         for e in (cfg.sample_events or cap)})
        self._shared.limits = fit_open_files(cfg.limits)
        self._writer.set_retention(cfg.retention_ns, cfg.retention_days)
        self.config = cfg

    def _predictor(self, cfg: Config) -> tuple[prediction.PredictFn | None, str]:
        """The prediction function of ``cfg.profile``. A profile that is configured but cannot
        be used is BadInput (exit 2 at start; on SIGHUP the running config stays): predictions
        must not switch off with an INFO line."""
        if self._injected_predict is not None:
            return self._injected_predict, "injected"
        fn, why = prediction.load(cfg.profile)
        if fn is None and cfg.profile is not None:
            raise BadInput(f"config predictor.profile: {why}",
                           "give a profile written by predict calibrate (predict profile FILE "
                           "checks one) or a built-in name, or remove predictor.profile")
        return fn, why

    def reload(self) -> None:
        if self.config_path is None:
            log.info("SIGHUP: no config file; nothing to reload")
            return
        sd_notify("RELOADING=1")
        try:
            new = config_mod.load(self.config_path)
        except CounterdError as exc:
            log.error("SIGHUP: keeping the running config: %s", exc)
            sd_notify("READY=1")
            return
        old = self.config
        restart = [k for k in ("socket_path", "socket_mode", "metrics_listen", "metrics_allow",
                               "metrics_max_connections", "metrics_timeout_s", "tls_cert_file",
                               "tls_key_file", "tls_client_ca_file", "basic_auth_file",
                               "store_path", "store_synchronous", "max_frame_bytes",
                               "central_dsn", "central_role", "central_batch_size",
                               "central_max_backlog", "central_timeout_s",
                               "central_retry_max_s")
                   if getattr(old, k) != getattr(new, k)]
        if restart:
            log.warning("SIGHUP: %s changed; these take effect at the next restart",
                        ", ".join(restart))
            new = dataclasses.replace(new, **{k: getattr(old, k) for k in restart})
        try:
            self._apply(new)
        except CounterdError as exc:
            log.error("SIGHUP: keeping the running config: %s", exc)
            self._apply(old, (self.state.predict, self.state.predict_reason))
        else:
            log.info("SIGHUP: configuration reloaded from %s", self.config_path)
        sd_notify("READY=1")

    # -- introspection (tests, bench) ----------------------------------------------------------
    def client_pids(self) -> Mapping[int, Workload]:
        return self._clients.snapshot()


def run(config_path: Path | None = None, *, env: Mapping[str, str] | None = None) -> int:
    """``counterd run``: load the config, serve in the foreground until SIGTERM/SIGINT."""
    cfg = config_mod.load(config_path, env)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s",
                            level=cfg.log_level.upper())
    daemon = Daemon(cfg, config_path=config_path)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT,
                                                       signal.SIGHUP)}
    # Before start(), which says READY=1: a SIGTERM at once after it (systemd stopping a unit
    # it has just seen ready) stops the daemon cleanly instead of killing it with its socket
    # file left behind; one during start() makes serve() shut down at once.
    signal.signal(signal.SIGTERM, lambda *_: daemon.request_stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.request_stop())
    signal.signal(signal.SIGHUP, lambda *_: daemon.request_reload())
    try:
        daemon.start()
        daemon.serve()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


__all__ = ["Daemon", "peer_credentials", "run", "sd_notify"]
