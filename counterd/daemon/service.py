"""``counterd run``: the service loop (DESIGN.md section 6).

Threads, and what each owns:

* the **loop** (the caller's thread): the marker socket (:mod:`counterd.protocol`), every
  client connection, SO_PEERCRED checks, counting on a client's behalf, signals;
* the **writer**: the store (:mod:`counterd.daemon.store`). It takes whatever the loop queued, commits
  it in one transaction (group commit), and only then hands the sequence numbers back to the
  loop, which acknowledges them to the clients: acknowledged means durable;
* the **sampler**: watched processes and marker clients, per-thread counters summed per job
  (:mod:`counterd.daemon.sampling`), every ``sampling.interval_s``;
* the **metrics server** (prometheus-client's HTTP server) over :mod:`counterd.daemon.exporter`.

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
import json
import logging
import os
import queue
import selectors
import signal
import socket
import stat
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from counterd.daemon import config as config_mod
from counterd import prediction, protocol
from counterd.backends.base import CounterValue, Reading, Target
from counterd.daemon.config import Config
from counterd.errors import BadInput, CounterdError, NoSuchTarget
from counterd.events import Source
from counterd.daemon.exporter import MetricsState, registry
from counterd.protocol import Decoder, FrameType, ProtocolError
from counterd.records import SuperstepRecord
from counterd.daemon.sampling import Sampler, owner_uids
from counterd.daemon.store import RunInfo, Sample, Store, StoreError

log = logging.getLogger("counterd.daemon")

HELLO_TIMEOUT_S = 10.0  # a connection must say HELLO within this
PARTIAL_FRAME_TIMEOUT_S = 30.0  # a frame begun must be complete within this
MAX_OPEN_BEGINS = 65536  # per connection
MAX_OUTBUF = 1 << 20  # replies a client does not read; beyond, the client is dropped
WRITER_BATCH = 4096  # records per transaction at most
PRUNE_EVERY_S = 3600.0


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


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of a Unix socket's peer, from SO_PEERCRED (taken at connect)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


def _groups(pid: int) -> set[int]:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()


@dataclass
class _Conn:
    cid: int
    sock: socket.socket
    pid: int
    uid: int
    gid: int
    opened: float
    decoder: Decoder
    hello: bool = False
    job: str = "unknown"
    last_seq: int = 0
    # (run_id, index) -> a BEGIN's line, or an OPEN's fields (ctx, index, name, rank, cpu,
    # begin_ns, params) with ctx = (run_id, pid, host, backend, counter names)
    begins: dict[tuple[str, int], Any] = field(default_factory=dict)
    contexts: dict[int, tuple[str, int, str, str, tuple[str, ...]]] = field(
        default_factory=dict)
    info: RunInfo | None = None
    behalf_groups: dict[int, Any] = field(default_factory=dict)  # tid -> group
    behalf_start: dict[tuple[str, int], tuple[int, Reading]] = field(default_factory=dict)
    read_groups: dict[tuple[int, int], Any] = field(default_factory=dict)  # (pid, tid) -> group
    outbuf: bytearray = field(default_factory=bytearray)
    ack_wanted: int = 0
    ack_sent: int = 0
    partial_since: float | None = None
    writing: bool = False
    closed: bool = False

    def describe(self) -> str:
        return f"client pid {self.pid} uid {self.uid}"

    @property
    def version(self) -> int:
        """The protocol version this client speaks (that of its first frame)."""
        return self.decoder.version or protocol.PROTOCOL_VERSION


def _encode(conn: _Conn, ftype: FrameType, payload: Mapping[str, Any]) -> bytes:
    return protocol.encode(ftype, payload, conn.version)


_SOURCES = tuple(Source(v) for v in protocol.SOURCES)


@dataclass
class _Item:
    cid: int
    seq: int
    record: SuperstepRecord | None
    info: RunInfo | None


_STOP = object()


class Daemon:
    """One counterd instance. ``start()`` binds and starts the threads, ``serve()`` runs the
    loop until ``request_stop()``; tests drive it in a thread, ``run()`` in the foreground."""

    def __init__(self, config: Config, *, config_path: Path | None = None,
                 predict: prediction.PredictFn | None = None) -> None:
        self.config = config
        self.config_path = config_path
        self.state = MetricsState(max_jobs=config.max_jobs,
                                  max_superstep_names=config.max_superstep_names,
                                  export_pids=config.export_pids)
        self._injected_predict = predict
        self._sel = selectors.DefaultSelector()
        self._conns: dict[int, _Conn] = {}
        self._next_cid = 1
        self._writeq: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._acks: dict[int, int] = {}
        self._acks_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = threading.Event()
        self._reload = False
        self._listener: socket.socket | None = None
        self._store: Store | None = None
        self._owners: dict[str, int] = {}
        self._clients_lock = threading.Lock()
        self._client_pids: dict[int, str] = {}
        self._threads: list[threading.Thread] = []
        self._http: Any = None
        self._exposition: Any = None
        self.metrics_port: int | None = None
        self._allowed_gid: int | None = None
        self._behalf_backend: Any = None
        self._behalf_reason = ""
        self._default_events: tuple[str, ...] = ()
        self._sampler_stop = threading.Event()

    # -- start / stop --------------------------------------------------------------------------
    def start(self) -> None:
        cfg = self.config
        self._store = Store(cfg.store_path, synchronous=cfg.store_synchronous)
        self._owners = self._store.run_owners()
        self._apply(cfg)
        self._listener = self._bind(cfg.socket_path, cfg.socket_mode)
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        writer = threading.Thread(target=self._writer, name="counterd-writer", daemon=True)
        writer.start()
        self._threads.append(writer)
        sampler = threading.Thread(target=self._sampler, name="counterd-sampler", daemon=True)
        sampler.start()
        self._threads.append(sampler)
        if cfg.metrics_listen:
            self._start_metrics(cfg.metrics_listen)
        log.info("counterd listening on %s (config: %s), store %s (%s), metrics %s",
                 cfg.socket_path, cfg.source, cfg.store_path, cfg.store_synchronous,
                 f"http://{cfg.metrics_listen.rpartition(':')[0]}:{self.metrics_port}/metrics"
                 if self.metrics_port is not None else "off")
        sd_notify("READY=1\nSTATUS=serving")

    def _start_metrics(self, listen: str) -> None:
        from counterd.daemon.exporter import ExpositionCache, serve

        host, port = config_mod.metrics_address(listen)
        self._exposition = ExpositionCache(registry(self.state), self.state,
                                           min_interval_s=self.config.metrics_refresh_s)
        try:
            server = serve(self._exposition, host, port)
        except OSError as exc:
            raise BadInput(f"cannot serve /metrics on {listen}: {exc.strerror}",
                           "choose a free metrics.listen address (COUNTERD_METRICS_LISTEN)"
                           ) from exc
        self._http = server
        self.metrics_port = int(server.server_port)

    @staticmethod
    def _bind(path: Path, mode: int) -> socket.socket:
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"cannot create {path.parent}: {exc.strerror}",
                           "choose a writable socket.path (COUNTERD_SOCKET)") from exc
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise BadInput(f"{path} exists and is not a socket",
                               "remove it or choose another socket.path")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
                raise BadInput(f"another counterd is serving {path}",
                               "stop it first, or choose another socket.path")
            except OSError:
                path.unlink()  # stale: left by a daemon that was killed
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(str(path))
            os.chmod(path, mode)
            sock.listen(512)
        except OSError as exc:
            sock.close()
            raise BadInput(f"cannot listen on {path}: {exc.strerror}",
                           "choose a writable socket.path (COUNTERD_SOCKET)") from exc
        sock.setblocking(False)
        return sock

    def request_stop(self) -> None:
        """Signal-safe: ask the loop to shut down."""
        self._stop.set()
        self._wake()

    def request_reload(self) -> None:
        self._reload = True
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"w")

    def serve(self) -> None:
        """The loop; returns after a clean shutdown."""
        next_housekeeping = time.monotonic() + 1.0
        try:
            while not self._stop.is_set():
                for key, events in self._sel.select(timeout=1.0):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._on_wake()
                    else:
                        conn = key.data
                        if events & selectors.EVENT_READ and not conn.closed:
                            self._on_readable(conn)
                        if events & selectors.EVENT_WRITE and not conn.closed:
                            self._flush(conn)
                if self._reload:
                    self._reload = False
                    self.reload()
                now = time.monotonic()
                if now >= next_housekeeping:
                    next_housekeeping = now + 1.0
                    self._housekeeping(now)
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        sd_notify("STOPPING=1")
        log.info("shutting down: reading what clients sent, committing, acknowledging")
        if self._listener is not None:
            self._sel.unregister(self._listener)
            self._listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.config.socket_path)
        for conn in list(self._conns.values()):  # what clients already sent is committed
            self._on_readable(conn, drain_only=True)
        self._sampler_stop.set()
        self._writeq.put(_STOP)
        for t in self._threads:
            t.join(timeout=60)
        self._on_wake()
        for conn in list(self._conns.values()):
            with contextlib.suppress(OSError):
                conn.sock.setblocking(True)
                conn.sock.settimeout(1.0)
                if conn.outbuf:
                    conn.sock.sendall(conn.outbuf)
            self._close(conn, incomplete=False)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._exposition.close()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()
        log.info("stopped; %d records stored in this run", self.state.records_stored)

    # -- configuration -------------------------------------------------------------------------
    def _apply(self, cfg: Config) -> None:
        st = self.state
        with st.lock:
            st.max_jobs = cfg.max_jobs
            st.max_names = cfg.max_superstep_names
            st.export_pids = cfg.export_pids
        logging.getLogger("counterd").setLevel(cfg.log_level.upper())
        self._allowed_gid = config_mod.allowed_gid(cfg.allowed_group) if cfg.allowed_group \
            else None
        if self._injected_predict is not None:
            st.set_predictor(self._injected_predict, "injected")
        else:
            fn, reason = prediction.load(cfg.profile)
            st.set_predictor(fn, reason)
            log.info("predictions: %s", reason)
        backend, reason, cap = self._resolve_backend(cfg.sample_backend)
        self._behalf_backend, self._behalf_reason = backend, reason
        self._default_events = tuple(e for e, why in (cap or {}).items() if why is None)
        if cap is not None:
            st.set_available("sampled", {e: cap.get(e, "not known to perf")
                                         for e in (cfg.sample_events or cap)})
        self.config = cfg

    @staticmethod
    def _resolve_backend(name: str) -> tuple[Any, str, dict[str, str | None] | None]:
        if name == "none":
            return None, "sampling.backend = none", None
        from counterd import backends

        perf = backends.get("perf")
        cap = perf.available()
        if not cap.available:
            log.warning("counters unavailable to the daemon: %s", cap.reason)
            return None, cap.reason, dict(cap.counters)
        return perf, cap.reason, dict(cap.counters)

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
        restart = [k for k in ("socket_path", "socket_mode", "metrics_listen", "store_path",
                               "store_synchronous", "max_frame_bytes")
                   if getattr(old, k) != getattr(new, k)]
        if restart:
            log.warning("SIGHUP: %s changed; these take effect at the next restart",
                        ", ".join(restart))
            new = dataclasses.replace(new, **{k: getattr(old, k) for k in restart})
        try:
            self._apply(new)
        except CounterdError as exc:
            log.error("SIGHUP: keeping the running config: %s", exc)
            self._apply(old)
        else:
            log.info("SIGHUP: configuration reloaded from %s", self.config_path)
        sd_notify("READY=1")

    # -- connections ---------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(64):
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: keep serving the others
                log.error("accept failed: %s", exc)
                return
            if len(self._conns) >= self.config.max_clients:
                log.warning("refusing a client: %d connections (socket.max_clients)",
                            len(self._conns))
                self.state.count("protocol_errors", "too_many_clients")
                sock.close()
                continue
            try:
                pid, uid, gid = peer_credentials(sock)
            except OSError as exc:
                log.warning("SO_PEERCRED failed, dropping the client: %s", exc)
                sock.close()
                continue
            sock.setblocking(False)
            conn = _Conn(self._next_cid, sock, pid, uid, gid, time.monotonic(),
                         Decoder(self.config.max_frame_bytes, protocol.ACCEPTED_VERSIONS))
            self._next_cid += 1
            self._conns[conn.cid] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            self.state.set_clients(len(self._conns))

    def _on_readable(self, conn: _Conn, drain_only: bool = False) -> None:
        for _ in range(16 if not drain_only else 1 << 20):
            try:
                data = conn.sock.recv(262144)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.info("%s: receive failed (%s)", conn.describe(), exc)
                self._close(conn, incomplete=True)
                return
            if not data:
                if conn.decoder.pending:
                    self._violation(conn, "truncated",
                                    f"connection closed inside a frame ({conn.decoder.pending}"
                                    " bytes of it received)", reply=False)
                self._close(conn, incomplete=True)
                return
            conn.decoder.feed(data)
            try:
                for ftype, payload in conn.decoder.frames():
                    self._handle(conn, ftype, payload)
                    if conn.closed:
                        return
            except ProtocolError as exc:
                self._violation(conn, exc.code, exc.message)
                if conn.decoder.broken or not conn.hello:
                    self._close(conn, incomplete=True)
                    return
            conn.partial_since = (conn.partial_since or time.monotonic()) \
                if conn.decoder.pending else None
            if len(data) < 262144:
                break
        if not conn.closed:
            self._flush(conn)

    def _violation(self, conn: _Conn, code: str, message: str, seq: int | None = None,
                   reply: bool = True) -> None:
        log.warning("%s: %s: %s", conn.describe(), code, message)
        self.state.count("protocol_errors", code)
        if reply and not conn.closed:
            payload: dict[str, Any] = {"code": code, "message": message}
            if seq is not None:
                payload["s"] = seq
            self._send(conn, _encode(conn, FrameType.ERROR, payload))

    def _close(self, conn: _Conn, *, incomplete: bool) -> None:
        if conn.closed:
            return
        conn.closed = True
        if incomplete and conn.begins:
            info = RunInfo(conn.job, conn.uid)
            for line in conn.begins.values():
                try:
                    rec = _incomplete_record(line)
                except (KeyError, TypeError, ValueError) as exc:
                    log.warning("%s: unusable begin line %r: %s", conn.describe(), line, exc)
                    continue
                log.info("%s: died inside superstep %d (%s) of run %s: stored as incomplete",
                         conn.describe(), rec.index, rec.name, rec.run_id)
                self._writeq.put(_Item(0, 0, rec, info))
        conn.begins.clear()
        for group in [*conn.behalf_groups.values(), *conn.read_groups.values()]:
            with contextlib.suppress(Exception):
                group.close()
        if conn.outbuf:  # best effort: the ERROR that explains why we close
            with contextlib.suppress(OSError):
                conn.sock.send(conn.outbuf)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        conn.sock.close()
        self._conns.pop(conn.cid, None)
        with self._clients_lock:
            if not any(c.pid == conn.pid for c in self._conns.values()):
                self._client_pids.pop(conn.pid, None)
        self.state.set_clients(len(self._conns))

    def _send(self, conn: _Conn, frame: bytes) -> None:
        conn.outbuf += frame
        if len(conn.outbuf) > MAX_OUTBUF:
            log.warning("%s does not read its replies; dropping it", conn.describe())
            self.state.count("protocol_errors", "slow_reader")
            self._close(conn, incomplete=True)

    def _flush(self, conn: _Conn) -> None:
        if conn.ack_wanted > conn.ack_sent:  # acks are coalesced: only the latest matters
            conn.outbuf += _encode(conn, FrameType.ACK, {"s": conn.ack_wanted})
            conn.ack_sent = conn.ack_wanted
        if conn.outbuf:
            try:
                n = conn.sock.send(conn.outbuf)
                del conn.outbuf[:n]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._close(conn, incomplete=True)
                return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        if conn.writing != bool(conn.outbuf):
            conn.writing = bool(conn.outbuf)
            self._sel.modify(conn.sock, want, conn)

    def _on_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._acks_lock:
            acks, self._acks = self._acks, {}
        for cid, seq in acks.items():
            conn = self._conns.get(cid)
            if conn is not None and not conn.closed and seq > conn.ack_wanted:
                conn.ack_wanted = seq
                self._flush(conn)

    def _housekeeping(self, now: float) -> None:
        for conn in list(self._conns.values()):
            if not conn.hello and now - conn.opened > HELLO_TIMEOUT_S:
                self._violation(conn, "no_hello", f"no HELLO within {HELLO_TIMEOUT_S:.0f} s")
                self._close(conn, incomplete=False)
            elif conn.partial_since is not None and \
                    now - conn.partial_since > PARTIAL_FRAME_TIMEOUT_S:
                self._violation(conn, "stalled", "a frame stayed incomplete for "
                                f"{PARTIAL_FRAME_TIMEOUT_S:.0f} s")
                self._close(conn, incomplete=True)

    # -- frames --------------------------------------------------------------------------------
    def _privileged(self, conn: _Conn) -> bool:
        if conn.uid == 0:
            return True
        gid = self._allowed_gid
        return gid is not None and (conn.gid == gid or gid in _groups(conn.pid))

    def _handle(self, conn: _Conn, ftype: FrameType, p: Any) -> None:
        if ftype not in protocol.CLIENT_TYPES:
            raise ProtocolError("bad_type", f"{ftype.name} is not a client frame")
        if ftype is FrameType.HELLO:
            if conn.hello:
                raise ProtocolError("bad_order", "HELLO sent twice")
            conn.hello = True
            conn.job = str(p.get("job") or "unknown")[:128]
            with self._clients_lock:
                self._client_pids[conn.pid] = conn.job
            self._send(conn, _encode(conn, FrameType.WELCOME, {
                "version": conn.version, "max_frame": conn.decoder.max_frame,
                "uid": conn.uid, "pid": conn.pid}))
            return
        if not conn.hello:
            raise ProtocolError("no_hello", f"{ftype.name} before HELLO")
        if ftype is FrameType.OPEN or ftype is FrameType.CLOSE:
            head = protocol.OPEN_HEAD if ftype is FrameType.OPEN else protocol.CLOSE_HEAD
            if len(p) < head.size:
                raise ProtocolError("bad_frame", f"{ftype.name} of {len(p)} bytes is shorter "
                                    f"than its {head.size}-byte head")
            fields = head.unpack_from(p)
            seq = fields[0]
        else:
            seq = p.get("s")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= conn.last_seq:
            raise ProtocolError("bad_seq", f"sequence number {seq!r} does not follow "
                                f"{conn.last_seq}")
        conn.last_seq = seq
        if ftype is FrameType.OPEN:
            self._open(conn, seq, fields, p)
        elif ftype is FrameType.CLOSE:
            self._close_step(conn, seq, fields, p)
        elif ftype is FrameType.CONTEXT:
            self._context(conn, seq, p)
        elif ftype is FrameType.BEGIN:
            self._begin(conn, seq, p)
        elif ftype is FrameType.RECORD:
            self._record(conn, seq, p)
        elif ftype is FrameType.READ:
            self._read(conn, seq, p)
        elif ftype is FrameType.SYNC:
            self._writeq.put(_Item(conn.cid, seq, None, None))

    def _owns_run(self, conn: _Conn, run_id: str) -> bool:
        owner = self._owners.get(run_id)
        if owner is None:
            self._owners[run_id] = conn.uid
            return True
        return owner == conn.uid or self._privileged(conn)

    def _begin(self, conn: _Conn, seq: int, p: dict[str, Any]) -> None:
        line = p.get("line")
        try:
            if not isinstance(line, dict):
                raise TypeError("no begin line")
            key = (str(line["run_id"]), int(line["index"]))
            _incomplete_record(line)  # validates the fields an incomplete record needs
        except (KeyError, TypeError, ValueError) as exc:
            self._violation(conn, "bad_begin", f"malformed begin line ({exc})", seq)
            return
        if not self._owns_run(conn, key[0]):
            self._violation(conn, "forbidden", f"run {key[0]} belongs to another user", seq)
            return
        if self._too_many_open(conn, seq):
            return
        conn.begins[key] = line
        count = p.get("count")
        if count is None:
            return
        reply: dict[str, Any] = {"s": seq}
        try:
            tid = int(line.get("tid") or conn.pid)
            if not Path(f"/proc/{conn.pid}/task/{tid}").exists():
                raise CounterdError(f"tid {tid} is not a thread of pid {conn.pid}",
                                    "send the calling thread's id")
            group = conn.behalf_groups.get(tid)
            if group is None:
                if self._behalf_backend is None:
                    raise CounterdError(f"the daemon cannot count: {self._behalf_reason}")
                events = tuple(count) or self.config.sample_events or self._default_events
                group = self._behalf_backend.open(events, Target(pid=conn.pid, tid=tid),
                                                  strict=False)
                conn.behalf_groups[tid] = group
            conn.behalf_start[key] = (tid, group.read())
        except (CounterdError, OSError, TypeError, ValueError) as exc:
            reply["unsupported"] = str(exc)
        self._send(conn, _encode(conn, FrameType.STARTED, reply))

    def _context(self, conn: _Conn, seq: int, p: dict[str, Any]) -> None:
        try:
            c, run_id, pid = p["c"], p["run_id"], p["pid"]
            host, backend, names = p["host"], p["backend"], p.get("counters", [])
            if not (isinstance(c, int) and 0 < c <= 0xFFFF and isinstance(run_id, str)
                    and run_id and isinstance(pid, int) and isinstance(host, str)
                    and isinstance(backend, str) and isinstance(names, list)
                    and all(isinstance(n, str) for n in names)):
                raise TypeError("fields of the wrong type")
        except (KeyError, TypeError) as exc:
            self._violation(conn, "bad_context", f"malformed CONTEXT ({exc})", seq)
            return
        if not self._owns_run(conn, run_id):
            self._violation(conn, "forbidden", f"run {run_id} belongs to another user", seq)
            return
        conn.contexts[c] = (run_id, pid, host, backend, tuple(names))

    def _open(self, conn: _Conn, seq: int, fields: tuple[Any, ...], body: bytes) -> None:
        _, c, index, begin_ns, rank, cpu, name_bytes = fields
        ctx = conn.contexts.get(c)
        if ctx is None:
            self._violation(conn, "unknown_context", f"OPEN names context {c}, not declared "
                            "on this connection", seq)
            return
        start = protocol.OPEN_HEAD.size
        try:
            name = body[start:start + name_bytes].decode()
            tail = body[start + name_bytes:]
            params = json.loads(tail) if tail else {}
            if not isinstance(params, dict) or len(name.encode()) != name_bytes:
                raise ValueError("params are not a JSON object, or the name is cut short")
        except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError included
            self._violation(conn, "bad_begin", f"malformed OPEN ({exc})", seq)
            return
        if self._too_many_open(conn, seq):
            return
        conn.begins[(ctx[0], index)] = (ctx, index, name, rank, cpu, begin_ns, params)

    def _too_many_open(self, conn: _Conn, seq: int) -> bool:
        """Refuse a begin beyond MAX_OPEN_BEGINS open supersteps on one connection."""
        if len(conn.begins) < MAX_OPEN_BEGINS:
            return False
        self._violation(conn, "too_many_open", f"more than {MAX_OPEN_BEGINS} supersteps open "
                        "on one connection", seq)
        return True

    def _close_step(self, conn: _Conn, seq: int, fields: tuple[Any, ...], body: bytes
                    ) -> None:
        _, c, index, begin_ns, end_ns, bits, tail_bytes = fields
        ctx = conn.contexts.get(c)
        begun = conn.begins.get((ctx[0], index)) if ctx is not None else None
        if not isinstance(begun, tuple):
            self._violation(conn, "unknown_begin", f"CLOSE of superstep {index} (context {c})"
                            " without its OPEN on this connection: send a RECORD", seq)
            self.state.count("refused", "malformed")
            return
        assert ctx is not None
        names = ctx[4]
        size = protocol.COUNTER.size
        start = protocol.CLOSE_HEAD.size
        try:
            if len(body) != start + len(names) * size + tail_bytes:
                raise ValueError(f"{len(body)} bytes for {len(names)} counters and "
                                 f"{tail_bytes} bytes of unsupported counters")
            counters = {}
            for i, name in enumerate(names):
                src, value, ratio, raw = protocol.COUNTER.unpack_from(body, start + i * size)
                counters[name] = CounterValue(value, _SOURCES[src], ratio,
                                              None if raw == protocol.NO_RAW else raw)
            unsupported = json.loads(body[len(body) - tail_bytes:]) if tail_bytes else {}
            if not isinstance(unsupported, dict):
                raise ValueError("unsupported counters are not a JSON object")
            bctx = begun[0]
            rec = SuperstepRecord(
                run_id=bctx[0], index=index, name=begun[2], rank=begun[3], pid=bctx[1],
                cpu=begun[4], begin_ns=begin_ns, end_ns=end_ns, counters=counters,
                params=begun[6], flags=protocol.bit_flags(bits), unsupported=unsupported,
                backend=bctx[3], host=bctx[2])
        except (ValueError, IndexError, ProtocolError) as exc:
            self._violation(conn, "bad_record", f"malformed CLOSE ({exc})", seq)
            self.state.count("refused", "malformed")
            return
        del conn.begins[(ctx[0], index)]
        if conn.info is None:
            conn.info = RunInfo(conn.job, conn.uid)
        self._writeq.put(_Item(conn.cid, seq, rec, conn.info))

    def _record(self, conn: _Conn, seq: int, p: dict[str, Any]) -> None:
        body = p.get("rec")
        try:
            if not isinstance(body, dict):
                raise BadInput("no record in the frame")
            rec = SuperstepRecord.from_json(body)
        except BadInput as exc:
            self._violation(conn, "bad_record", str(exc), seq)
            self.state.count("refused", "malformed")
            return
        if not self._owns_run(conn, rec.run_id):
            self._violation(conn, "forbidden", f"run {rec.run_id} belongs to another user", seq)
            self.state.count("refused", "forbidden")
            return
        key = (rec.run_id, rec.index)
        conn.begins.pop(key, None)
        started = conn.behalf_start.pop(key, None)
        if started is not None:
            rec = self._add_behalf_counts(conn, rec, *started)
        self._writeq.put(_Item(conn.cid, seq, rec, RunInfo(conn.job, conn.uid)))

    def _add_behalf_counts(self, conn: _Conn, rec: SuperstepRecord, tid: int,
                           start: Reading) -> SuperstepRecord:
        group = conn.behalf_groups.get(tid)
        if group is None:
            return rec
        try:
            stop = group.read()
        except (CounterdError, OSError) as exc:
            log.info("%s: end reading failed: %s", conn.describe(), exc)
            return rec
        counters: dict[str, CounterValue] = dict(rec.counters)
        for name, cv in stop.delta(start).items():
            counters.setdefault(name, cv)
        unsupported = {k: v for k, v in rec.unsupported.items() if k != "*"}
        unsupported.update(stop.unsupported)
        flags = set(rec.flags) - {"unsupported_counters", "multiplexed"}
        if unsupported:
            flags.add("unsupported_counters")
        if any(cv.ratio < 1.0 for cv in counters.values()):
            flags.add("multiplexed")
        return dataclasses.replace(rec, counters=counters, unsupported=unsupported,
                                   flags=frozenset(flags))

    def _read(self, conn: _Conn, seq: int, p: dict[str, Any]) -> None:
        """READ: cumulative counters of a process the client may read, since its first READ."""
        try:
            pid = int(p["pid"])
            tid = int(p.get("tid") or pid)
            events = tuple(str(e) for e in p.get("count", ()))
        except (KeyError, TypeError, ValueError) as exc:
            self._violation(conn, "bad_read", f"malformed READ ({exc})", seq)
            return
        uids = owner_uids(pid)
        if uids is None or not Path(f"/proc/{pid}/task/{tid}").exists():
            self._violation(conn, "no_such_process", f"pid {pid} tid {tid} does not exist", seq)
            return
        if not self._privileged(conn) and any(u != conn.uid for u in uids):
            self._violation(conn, "forbidden",
                            f"uid {conn.uid} may not read counters of pid {pid} (owned by uid "
                            f"{uids[0]}): only root or members of socket.allowed_group may",
                            seq)
            return
        try:
            group = conn.read_groups.get((pid, tid))
            if group is None:
                if self._behalf_backend is None:
                    raise CounterdError(f"the daemon cannot count: {self._behalf_reason}")
                events = events or self.config.sample_events or self._default_events
                group = self._behalf_backend.open(events, Target(pid=pid, tid=tid),
                                                  strict=False)
                conn.read_groups[(pid, tid)] = group
            reading = group.read()
        except NoSuchTarget:
            self._violation(conn, "no_such_process", f"pid {pid} exited", seq)
            return
        except CounterdError as exc:
            self._violation(conn, "unavailable", str(exc), seq)
            return
        self._send(conn, _encode(conn, FrameType.READING, {
            "s": seq, "values": {k: [v.value, v.ratio] for k, v in reading.values.items()},
            "unsupported": dict(reading.unsupported)}))

    # -- writer thread -------------------------------------------------------------------------
    def _writer(self) -> None:
        assert self._store is not None
        store = self._store
        next_prune = 0.0
        stopping = False
        while not stopping:
            try:
                first = self._writeq.get(timeout=0.5)
            except queue.Empty:
                first = None
            batch: list[_Item] = []
            samples: list[Sample] = []
            item: Any = first
            while item is not None:
                if item is _STOP:
                    stopping = True
                elif isinstance(item, _Item):
                    batch.append(item)
                else:
                    samples.extend(item)
                if len(batch) >= WRITER_BATCH:
                    break
                try:
                    item = self._writeq.get_nowait()
                except queue.Empty:
                    item = None
            if batch or samples:
                self._commit(store, batch, samples)
            if time.monotonic() >= next_prune and self.config.retention_ns:
                next_prune = time.monotonic() + PRUNE_EVERY_S
                try:
                    n = store.prune(self.config.retention_ns)
                    if n:
                        log.info("retention: deleted %d rows older than %g days", n,
                                 self.config.retention_days)
                except Exception as exc:
                    log.error("retention failed: %s", exc)
        store.close()

    def _commit(self, store: Store, batch: list[_Item], samples: list[Sample]) -> None:
        records = [(it.record, it.info) for it in batch
                   if it.record is not None and it.info is not None]
        delay = 0.1
        while True:
            t0 = time.perf_counter()
            try:
                store.commit(records, samples)
                break
            except StoreError as exc:  # e.g. disk full: nothing is acknowledged; retry
                log.error("%s; retrying in %.1f s (clients are not acknowledged)", exc, delay)
                if self._stop.is_set() and delay > 5:
                    log.error("giving up on %d records at shutdown", len(records))
                    return
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
        elapsed = time.perf_counter() - t0
        self.state.observe_records([(it.record, it.info.job) for it in batch
                                    if it.record is not None and it.info is not None], elapsed)
        acks: dict[int, int] = {}
        for it in batch:
            if it.cid and it.seq > acks.get(it.cid, 0):
                acks[it.cid] = it.seq
        if acks:
            with self._acks_lock:
                for cid, seq in acks.items():
                    self._acks[cid] = max(seq, self._acks.get(cid, 0))
            self._wake()

    # -- sampler thread ------------------------------------------------------------------------
    def _sampler(self) -> None:
        sampler: Sampler | None = None
        key: tuple[Any, ...] | None = None
        while not self._sampler_stop.is_set():
            cfg = self.config
            started = time.monotonic()
            backend = self._behalf_backend
            if backend is not None:
                want = (cfg.sample_events or self._default_events, id(backend))
                if sampler is None or key != want:
                    if sampler is not None:
                        sampler.close()
                    key = want
                    sampler = Sampler(want[0], lambda ev, t, b=backend: b.open(
                        ev, t, strict=False), on_error=lambda r: self.state.count(
                            "sample_errors", r))
                try:
                    self._sample_once(sampler, cfg)
                except Exception:  # sampling must never take the daemon down
                    log.exception("sampling failed")
            self._sampler_stop.wait(max(0.0, cfg.sample_interval_s
                                        - (time.monotonic() - started)))
        if sampler is not None:
            sampler.close()

    def _sample_once(self, sampler: Sampler, cfg: Config) -> None:
        with self._clients_lock:
            clients = dict(self._client_pids)
        targets = sampler.discover(cfg.watch, clients)
        result = sampler.sample(targets)
        now = time.time_ns()
        rows: list[Sample] = []
        for job, (totals, ratios, threads) in result.items():
            self.state.observe_samples(job, totals, ratios, threads,
                                       sampler.by_pid(job) if cfg.export_pids else None)
            rows.extend(Sample(now, job, c, v, ratios.get(c, 1.0)) for c, v in totals.items())
        if sampler.unsupported:
            self.state.set_available("sampled", dict.fromkeys(sampler.events) | {
                k: v for k, v in sampler.unsupported.items()})
        if rows:
            self._writeq.put(rows)

    # -- introspection (tests, bench) ----------------------------------------------------------
    def client_pids(self) -> Mapping[int, str]:
        with self._clients_lock:
            return dict(self._client_pids)


def _incomplete_record(line: Any) -> SuperstepRecord:
    """The ``incomplete`` record of a begin never ended (a BEGIN's line or an OPEN's fields)."""
    if isinstance(line, tuple):
        ctx, index, name, rank, cpu, begin_ns, params = line
        return SuperstepRecord(
            run_id=ctx[0], index=index, name=name, rank=rank, pid=ctx[1], cpu=cpu,
            begin_ns=begin_ns, end_ns=None, params=params, flags=frozenset({"incomplete"}),
            backend=ctx[3], host=ctx[2])
    return SuperstepRecord(
        run_id=str(line["run_id"]), index=int(line["index"]), name=str(line["name"]),
        rank=int(line["rank"]), pid=int(line["pid"]), cpu=int(line["cpu"]),
        begin_ns=int(line["begin_ns"]), end_ns=None, params=dict(line.get("params") or {}),
        flags=frozenset({"incomplete"}), backend=str(line.get("backend", "none")),
        host=str(line.get("host", "")))


def run(config_path: Path | None = None, *, env: Mapping[str, str] | None = None) -> int:
    """``counterd run``: load the config, serve in the foreground until SIGTERM/SIGINT."""
    cfg = config_mod.load(config_path, env)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s",
                            level=cfg.log_level.upper())
    daemon = Daemon(cfg, config_path=config_path)
    daemon.start()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT,
                                                       signal.SIGHUP)}
    signal.signal(signal.SIGTERM, lambda *_: daemon.request_stop())
    signal.signal(signal.SIGINT, lambda *_: daemon.request_stop())
    signal.signal(signal.SIGHUP, lambda *_: daemon.request_reload())
    try:
        daemon.serve()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


__all__ = ["Daemon", "peer_credentials", "run", "sd_notify"]
