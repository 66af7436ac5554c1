"""The daemon's configuration: a TOML file, ``COUNTERD_*`` environment overrides, defaults.

Precedence: environment > file > defaults. Every key, its environment variable and its
default (``counterd run`` with no file is a working, loopback-only daemon)::

    [metrics]
    listen = "127.0.0.1:9464"     # COUNTERD_METRICS_LISTEN; "" disables /metrics. Several:
                                  # a list (env: comma-separated); IPv6 as "[::1]:9464"; "[::]"
                                  # takes IPv4 too (dual stack)
    allow = ["127.0.0.0/8", "::1/128"]  # COUNTERD_METRICS_ALLOW (comma-separated): the scrapers'
                                  # addresses or networks; any other peer is closed at accept,
                                  # before a byte is read, and counted
                                  # (counterd_metrics_refused_total{reason="not_allowed"}).
                                  # Mirror it in systemd's IPAddressAllow= (systemd/*.example)
    max_connections = 16          # COUNTERD_METRICS_MAX_CONNECTIONS: scrapes served at once;
                                  # beyond: closed at once, counted (reason="busy")
    timeout_s = 10                # COUNTERD_METRICS_TIMEOUT: a scrape connection (TLS handshake,
                                  # request) silent this long is closed (reason="timeout")
    tls_cert_file = ""            # COUNTERD_METRICS_TLS_CERT: PEM certificate (chain): /metrics
    tls_key_file = ""             # COUNTERD_METRICS_TLS_KEY   is served over HTTPS (TLS >= 1.2)
    tls_client_ca_file = ""       # COUNTERD_METRICS_TLS_CLIENT_CA: scrapers must present a
                                  # certificate signed by these CAs (mutual TLS)
    basic_auth_file = ""          # COUNTERD_METRICS_BASIC_AUTH: "user:hash" lines (bcrypt as
                                  # node_exporter's web.config: htpasswd -nBC 10 USER; or
                                  # $pbkdf2-sha256$ITER$SALT$HASH); wrong or none: 401
    export_pids = false           # COUNTERD_EXPORT_PIDS: a pid label on sampled series
    max_jobs = 32                 # COUNTERD_MAX_JOBS: workload label values per uid, beyond ->
                                  # "_other" (each uid its own slots: metrics_state.py's docstring)
    max_uids = 16                 # COUNTERD_MAX_UIDS: uid label values, beyond -> "_other"
    max_superstep_names = 32      # COUNTERD_MAX_SUPERSTEP_NAMES: per job, beyond -> "_other"
    grace_s = 60                  # COUNTERD_METRICS_GRACE: a workload with no connected client
                                  # that nothing updated this long leaves /metrics and frees its
                                  # slot (60 s: four scrapes at 15 s); > sampling.interval_s
    refresh_s = 1.0               # COUNTERD_METRICS_REFRESH: /metrics is at most this (plus one
                                  # rendering) old; a scrape never waits for a rendering

    [socket]
    path = "<runtime dir>/counterd/counterd.sock"   # COUNTERD_SOCKET (clients read it too)
    mode = "0666"                 # COUNTERD_SOCKET_MODE; peers are checked with SO_PEERCRED
    max_frame_bytes = 262144      # COUNTERD_MAX_FRAME_BYTES
    max_clients = 4096            # COUNTERD_MAX_CLIENTS: connections in all (two descriptors
                                  # each, with its black box: the daemon raises its open-file
                                  # limit to fit, or lowers this with a warning)
    allowed_group = ""            # COUNTERD_ALLOWED_GROUP: members may read any process
    # Limits that keep one local user from starving the others (root is exempt from the
    # per-uid ones); a client beyond one gets an ERROR naming the key:
    max_clients_per_uid = 256     # COUNTERD_MAX_CLIENTS_PER_UID: connections of one uid
    idle_timeout_s = 600          # COUNTERD_IDLE_TIMEOUT: a connection with no superstep open
                                  # that sends nothing this long is closed (clients reconnect)
    max_bytes_per_client = 8388608  # COUNTERD_MAX_BYTES_PER_CLIENT: begun supersteps and
                                  # contexts one connection may have the daemon hold (wire bytes)
    max_bytes_per_uid = 67108864  # COUNTERD_MAX_BYTES_PER_UID: the same over a uid's connections
    max_contexts_per_client = 256 # COUNTERD_MAX_CONTEXTS: CONTEXTs declared on one connection
    max_open_per_client = 65536   # COUNTERD_MAX_OPEN: supersteps begun, not ended, per connection

    [store]
    path = "<state dir>/counterd/counterd.db"       # COUNTERD_STORE
    synchronous = "full"          # COUNTERD_STORE_SYNCHRONOUS: full (power-loss safe) | normal
    retention_days = 30           # COUNTERD_RETENTION_DAYS; 0 keeps everything
    # What one user may make the daemon keep (root is exempt); a record refused for either
    # is answered with an ERROR (code "quota") that the markers log, naming the key:
    max_bytes_per_uid = 1073741824  # COUNTERD_STORE_MAX_BYTES_PER_UID: bytes of records (their
                                  # JSON) one uid keeps in the store; 0: no quota
    reserve_bytes = 67108864      # COUNTERD_STORE_RESERVE_BYTES: free space kept for the users
                                  # who keep less than the average (at most a quarter of the
                                  # store's file system): below it, a uid keeping at least the
                                  # average of what the store's users keep is refused, so one
                                  # user filling the disk does not stop the others; 0: none

    [sampling]
    interval_s = 1.0              # COUNTERD_SAMPLE_INTERVAL
    backend = "auto"              # COUNTERD_SAMPLE_BACKEND: auto | perf | none
    events = []                   # COUNTERD_SAMPLE_EVENTS (comma-separated); [] = all supported

    [[watch]]                     # processes to sample besides those that send markers
    job = "web"                   # the workload label on /metrics (required)
    comm = "^nginx$"              # regex on /proc/<pid>/comm (optional)
    user = "www-data"             # owner name or uid (optional)
    cgroup = "/system.slice/nginx.service"   # cgroup v2 path prefix (optional)
    pids = [1234]                 # explicit pids (optional)

    [central]                     # the central store (docs/cluster.md); off without a dsn
    dsn = ""                      # COUNTERD_CENTRAL_DSN: libpq connection string of the PostgreSQL
                                  # database (host=... dbname=...; a password belongs in
                                  # ~/.pgpass or PGPASSFILE, not here)
    role = ""                     # COUNTERD_CENTRAL_ROLE: the node's login role (a member of
                                  # counterd_node); "": the dsn's user
    batch_size = 1000             # COUNTERD_CENTRAL_BATCH_SIZE: queue entries per transaction
    max_backlog = 1000000         # COUNTERD_CENTRAL_MAX_BACKLOG: entries queued locally at most;
                                  # past it the oldest are not shipped (their records stay in
                                  # the local store), counted in counterd_central_dropped_total
    timeout_s = 10                # COUNTERD_CENTRAL_TIMEOUT: connecting or one batch, at most
    retry_max_s = 60              # COUNTERD_CENTRAL_RETRY_MAX: the longest wait between tries

    [predictor]
    profile = ""                  # COUNTERD_PROFILE: machine profile (TOML) for predictions

    log_level = "info"            # COUNTERD_LOG_LEVEL

Runtime dir: ``/run`` for root, else ``$XDG_RUNTIME_DIR`` (or ``/tmp/counterd-<uid>``). State
dir: ``/var/lib`` for root, else ``$XDG_STATE_HOME`` (or ``~/.local/state``).
"""

from __future__ import annotations

import grp
import ipaddress
import os
import pwd
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from counterd.backends import POLICIES
from counterd.data.env import default_socket_path, default_store_path
from counterd.data.errors import BadInput


@dataclass(frozen=True)
class WatchRule:
    """Which processes to sample, and the job label they are aggregated under. A process
    matches when every given criterion matches; a rule with no criterion matches nothing."""

    job: str
    comm: str | None = None
    user: int | None = None
    cgroup: str | None = None
    pids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.job:
            raise ValueError("a watch rule needs a job label")

    @property
    def comm_re(self) -> re.Pattern[str] | None:
        return re.compile(self.comm) if self.comm else None


@dataclass(frozen=True)
class Limits:
    """What the marker socket allows each client and each user (the ``[socket]`` keys of the
    same names; see the module's docstring)."""

    max_clients: int = 4096
    max_clients_per_uid: int = 256
    max_frame_bytes: int = 256 * 1024
    idle_timeout_s: float = 600.0
    max_bytes_per_client: int = 8 * 1024 * 1024
    max_bytes_per_uid: int = 64 * 1024 * 1024
    max_contexts_per_client: int = 256
    max_open_per_client: int = 65536
    max_store_bytes_per_uid: int = 1 << 30
    store_reserve_bytes: int = 64 << 20


DEFAULT_ALLOW = "127.0.0.0/8,::1/128"


@dataclass(frozen=True)
class Config:
    metrics_listen: str = "127.0.0.1:9464"  # comma-separated HOST:PORT
    metrics_allow: str = DEFAULT_ALLOW  # comma-separated addresses or networks
    metrics_max_connections: int = 16
    metrics_timeout_s: float = 10.0
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    basic_auth_file: str = ""
    export_pids: bool = False
    max_jobs: int = 32
    max_uids: int = 16
    max_superstep_names: int = 32
    metrics_refresh_s: float = 1.0
    metrics_grace_s: float = 60.0
    socket_path: Path = field(default_factory=default_socket_path)
    socket_mode: int = 0o666
    max_frame_bytes: int = 256 * 1024
    max_clients: int = 4096
    allowed_group: str = ""
    max_clients_per_uid: int = 256
    idle_timeout_s: float = 600.0
    max_bytes_per_client: int = 8 * 1024 * 1024
    max_bytes_per_uid: int = 64 * 1024 * 1024
    max_contexts_per_client: int = 256
    max_open_per_client: int = 65536
    store_path: Path = field(default_factory=default_store_path)
    store_synchronous: str = "full"
    retention_days: float = 30.0
    store_max_bytes_per_uid: int = 1 << 30
    store_reserve_bytes: int = 64 << 20
    sample_interval_s: float = 1.0
    sample_backend: str = "auto"
    sample_events: tuple[str, ...] = ()
    watch: tuple[WatchRule, ...] = ()
    profile: Path | None = None
    central_dsn: str = ""
    central_role: str = ""
    central_batch_size: int = 1000
    central_max_backlog: int = 1_000_000
    central_timeout_s: float = 10.0
    central_retry_max_s: float = 60.0
    log_level: str = "info"
    source: str = "defaults"  # where it came from, for the log

    def __post_init__(self) -> None:
        _check(self.store_synchronous in ("full", "normal"), "store.synchronous",
               self.store_synchronous, "full or normal")
        _check(self.sample_interval_s >= 0.05, "sampling.interval_s", self.sample_interval_s,
               "a number of seconds >= 0.05")
        choices = ("auto", *POLICIES["sampling"].names)  # counterd.backends.resolve
        _check(self.sample_backend in choices, "sampling.backend",
               self.sample_backend, ", ".join(choices[:-1]) + " or " + choices[-1])
        _check(1024 <= self.max_frame_bytes <= 64 * 1024 * 1024, "socket.max_frame_bytes",
               self.max_frame_bytes, "between 1024 and 67108864")
        _check(self.max_clients >= 1, "socket.max_clients", self.max_clients, ">= 1")
        for key in ("max_clients_per_uid", "max_contexts_per_client", "max_open_per_client"):
            _check(getattr(self, key) >= 1, f"socket.{key}", getattr(self, key), ">= 1")
        _check(self.idle_timeout_s >= 1, "socket.idle_timeout_s", self.idle_timeout_s,
               "seconds >= 1")
        _check(self.max_bytes_per_client >= self.max_frame_bytes, "socket.max_bytes_per_client",
               self.max_bytes_per_client, "at least socket.max_frame_bytes")
        _check(self.max_bytes_per_uid >= self.max_bytes_per_client, "socket.max_bytes_per_uid",
               self.max_bytes_per_uid, "at least socket.max_bytes_per_client")
        for key in ("max_jobs", "max_uids", "max_superstep_names"):
            _check(getattr(self, key) >= 1, f"metrics.{key}", getattr(self, key), ">= 1")
        _check(0.05 <= self.metrics_refresh_s <= 3600, "metrics.refresh_s",
               self.metrics_refresh_s, "seconds between 0.05 and 3600")
        _check(self.sample_interval_s < self.metrics_grace_s <= 7 * 86400, "metrics.grace_s",
               self.metrics_grace_s, "seconds above sampling.interval_s (watched processes "
               "are seen once per interval), at most a week")
        _check(self.retention_days >= 0, "store.retention_days", self.retention_days, ">= 0")
        _check(self.store_max_bytes_per_uid >= 0, "store.max_bytes_per_uid",
               self.store_max_bytes_per_uid, "bytes >= 0 (0: no quota)")
        _check(self.store_reserve_bytes >= 0, "store.reserve_bytes", self.store_reserve_bytes,
               "bytes >= 0 (0: no reserve)")
        _check(self.log_level.upper() in ("DEBUG", "INFO", "WARNING", "ERROR"), "log_level",
               self.log_level, "debug, info, warning or error")
        if self.metrics_listen:
            metrics_addresses(self.metrics_listen)
        allowed_networks(self.metrics_allow)
        _check(1 <= self.metrics_max_connections <= 1024, "metrics.max_connections",
               self.metrics_max_connections, "between 1 and 1024")
        _check(0.1 <= self.metrics_timeout_s <= 600, "metrics.timeout_s",
               self.metrics_timeout_s, "seconds between 0.1 and 600")
        _check(bool(self.tls_cert_file) == bool(self.tls_key_file), "metrics.tls_cert_file",
               self.tls_cert_file, "both tls_cert_file and tls_key_file, or neither")
        _check(not self.tls_client_ca_file or bool(self.tls_cert_file),
               "metrics.tls_client_ca_file", self.tls_client_ca_file,
               "it with tls_cert_file and tls_key_file (client certificates need TLS)")
        if self.allowed_group:
            allowed_gid(self.allowed_group)
        _check(1 <= self.central_batch_size <= 100_000, "central.batch_size",
               self.central_batch_size, "between 1 and 100000")
        _check(self.central_max_backlog >= self.central_batch_size, "central.max_backlog",
               self.central_max_backlog, "at least central.batch_size")
        _check(1 <= self.central_timeout_s <= 600, "central.timeout_s", self.central_timeout_s,
               "seconds between 1 and 600")
        _check(1 <= self.central_retry_max_s <= 3600, "central.retry_max_s",
               self.central_retry_max_s, "seconds between 1 and 3600")
        _check(len(self.central_role) <= 63 and "\0" not in self.central_dsn + self.central_role,
               "central.role", self.central_role, "a PostgreSQL role name (at most 63 bytes)")

    @property
    def limits(self) -> Limits:
        return Limits(self.max_clients, self.max_clients_per_uid, self.max_frame_bytes,
                      self.idle_timeout_s, self.max_bytes_per_client, self.max_bytes_per_uid,
                      self.max_contexts_per_client, self.max_open_per_client,
                      self.store_max_bytes_per_uid, self.store_reserve_bytes)

    @property
    def retention_ns(self) -> int | None:
        return int(self.retention_days * 86400e9) if self.retention_days else None


def _check(ok: bool, key: str, value: object, expected: str) -> None:
    if not ok:
        raise BadInput(f"config {key} = {value!r} is invalid", f"use {expected}")


def metrics_address(listen: str) -> tuple[str, int]:
    """(host, port) of one ``HOST:PORT`` (``[V6]:PORT`` for IPv6; an empty host: loopback)."""
    host, sep, port = listen.strip().rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if (not sep or not port.isdigit() or not 0 <= int(port) <= 65535
            or (":" in bare and bare == host) or "[" in bare or "]" in bare):
        raise BadInput(f"metrics.listen {listen!r} is not HOST:PORT",
                       "use e.g. 127.0.0.1:9464 (loopback), [::1]:9464 (IPv6), a list of "
                       "them, or \"\" to disable /metrics")
    return bare or "127.0.0.1", int(port)


def metrics_addresses(listen: str) -> tuple[tuple[str, int], ...]:
    """Every (host, port) of ``metrics.listen``: comma-separated ``HOST:PORT``."""
    out = tuple(metrics_address(a) for a in listen.split(",") if a.strip())
    if len(set(out)) != len(out):
        raise BadInput(f"metrics.listen {listen!r} names an address twice", "list each once")
    return out


def allowed_networks(allow: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """The networks of ``metrics.allow`` (addresses are /32 or /128 networks)."""
    nets = []
    for item in (a.strip() for a in allow.split(",")):
        if not item:
            continue
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise BadInput(f"metrics.allow entry {item!r} is not an IP address or network",
                           "use e.g. 10.1.0.5, 10.1.0.0/24 or fd00::/64 (0.0.0.0/0 and ::/0 "
                           "allow any scraper)") from None
    if not nets:
        raise BadInput("metrics.allow is empty: no scraper could connect",
                       "list the Prometheus servers' addresses, or set metrics.listen = \"\" "
                       "to disable /metrics")
    return tuple(nets)


def _listing(v: object) -> str:
    """A TOML array of strings, or a comma-separated string, as a comma-separated string."""
    if isinstance(v, list):
        if not all(isinstance(x, str) and "," not in x for x in v):
            raise ValueError("expected strings without commas")
        return ",".join(v)
    if not isinstance(v, str):
        raise ValueError("expected a string or an array of strings")
    return v


def allowed_gid(group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise BadInput(f"socket.allowed_group {group!r} does not exist",
                       "create the group or name an existing one (or a gid)") from None


def _uid(user: object) -> int:
    if isinstance(user, int):
        return user
    if isinstance(user, str) and user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(str(user)).pw_uid
    except KeyError:
        raise BadInput(f"watch user {user!r} does not exist", "name an existing user or uid"
                       ) from None


# (section, key) -> (field, environment variable, parser)
def _bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    if str(v).lower() in ("1", "true", "yes", "on"):
        return True
    if str(v).lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{v!r} is not a boolean")


def _events(v: object) -> tuple[str, ...]:
    items = v.split(",") if isinstance(v, str) else list(v)  # type: ignore[call-overload]
    from counterd.data.events import check_names

    return check_names(tuple(str(e).strip() for e in items if str(e).strip()))


_KEYS: dict[tuple[str, str], tuple[str, str, Any]] = {
    ("metrics", "listen"): ("metrics_listen", "COUNTERD_METRICS_LISTEN", _listing),
    ("metrics", "allow"): ("metrics_allow", "COUNTERD_METRICS_ALLOW", _listing),
    ("metrics", "max_connections"): ("metrics_max_connections",
                                     "COUNTERD_METRICS_MAX_CONNECTIONS", int),
    ("metrics", "timeout_s"): ("metrics_timeout_s", "COUNTERD_METRICS_TIMEOUT", float),
    ("metrics", "tls_cert_file"): ("tls_cert_file", "COUNTERD_METRICS_TLS_CERT", str),
    ("metrics", "tls_key_file"): ("tls_key_file", "COUNTERD_METRICS_TLS_KEY", str),
    ("metrics", "tls_client_ca_file"): ("tls_client_ca_file", "COUNTERD_METRICS_TLS_CLIENT_CA",
                                        str),
    ("metrics", "basic_auth_file"): ("basic_auth_file", "COUNTERD_METRICS_BASIC_AUTH", str),
    ("metrics", "export_pids"): ("export_pids", "COUNTERD_EXPORT_PIDS", _bool),
    ("metrics", "max_jobs"): ("max_jobs", "COUNTERD_MAX_JOBS", int),
    ("metrics", "max_uids"): ("max_uids", "COUNTERD_MAX_UIDS", int),
    ("metrics", "max_superstep_names"): ("max_superstep_names",
                                         "COUNTERD_MAX_SUPERSTEP_NAMES", int),
    ("metrics", "refresh_s"): ("metrics_refresh_s", "COUNTERD_METRICS_REFRESH", float),
    ("metrics", "grace_s"): ("metrics_grace_s", "COUNTERD_METRICS_GRACE", float),
    ("socket", "path"): ("socket_path", "COUNTERD_SOCKET", Path),
    ("socket", "mode"): ("socket_mode", "COUNTERD_SOCKET_MODE", lambda v: int(str(v), 8)),
    ("socket", "max_frame_bytes"): ("max_frame_bytes", "COUNTERD_MAX_FRAME_BYTES", int),
    ("socket", "max_clients"): ("max_clients", "COUNTERD_MAX_CLIENTS", int),
    ("socket", "allowed_group"): ("allowed_group", "COUNTERD_ALLOWED_GROUP", str),
    ("socket", "max_clients_per_uid"): ("max_clients_per_uid", "COUNTERD_MAX_CLIENTS_PER_UID",
                                        int),
    ("socket", "idle_timeout_s"): ("idle_timeout_s", "COUNTERD_IDLE_TIMEOUT", float),
    ("socket", "max_bytes_per_client"): ("max_bytes_per_client",
                                         "COUNTERD_MAX_BYTES_PER_CLIENT", int),
    ("socket", "max_bytes_per_uid"): ("max_bytes_per_uid", "COUNTERD_MAX_BYTES_PER_UID", int),
    ("socket", "max_contexts_per_client"): ("max_contexts_per_client", "COUNTERD_MAX_CONTEXTS",
                                            int),
    ("socket", "max_open_per_client"): ("max_open_per_client", "COUNTERD_MAX_OPEN", int),
    ("store", "path"): ("store_path", "COUNTERD_STORE", Path),
    ("store", "synchronous"): ("store_synchronous", "COUNTERD_STORE_SYNCHRONOUS", str),
    ("store", "retention_days"): ("retention_days", "COUNTERD_RETENTION_DAYS", float),
    ("store", "max_bytes_per_uid"): ("store_max_bytes_per_uid",
                                     "COUNTERD_STORE_MAX_BYTES_PER_UID", int),
    ("store", "reserve_bytes"): ("store_reserve_bytes", "COUNTERD_STORE_RESERVE_BYTES", int),
    ("sampling", "interval_s"): ("sample_interval_s", "COUNTERD_SAMPLE_INTERVAL", float),
    ("sampling", "backend"): ("sample_backend", "COUNTERD_SAMPLE_BACKEND", str),
    ("sampling", "events"): ("sample_events", "COUNTERD_SAMPLE_EVENTS", _events),
    ("predictor", "profile"): ("profile", "COUNTERD_PROFILE",
                               lambda v: Path(v) if str(v) else None),
    ("central", "dsn"): ("central_dsn", "COUNTERD_CENTRAL_DSN", str),
    ("central", "role"): ("central_role", "COUNTERD_CENTRAL_ROLE", str),
    ("central", "batch_size"): ("central_batch_size", "COUNTERD_CENTRAL_BATCH_SIZE", int),
    ("central", "max_backlog"): ("central_max_backlog", "COUNTERD_CENTRAL_MAX_BACKLOG", int),
    ("central", "timeout_s"): ("central_timeout_s", "COUNTERD_CENTRAL_TIMEOUT", float),
    ("central", "retry_max_s"): ("central_retry_max_s", "COUNTERD_CENTRAL_RETRY_MAX", float),
    ("", "log_level"): ("log_level", "COUNTERD_LOG_LEVEL", str),
}


def _watch(items: object) -> tuple[WatchRule, ...]:
    if not isinstance(items, list):
        raise BadInput("config [[watch]] must be an array of tables", "write [[watch]] blocks")
    rules = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadInput(f"config watch #{i + 1} is not a table", "write [[watch]] blocks")
        unknown = set(item) - {"job", "comm", "user", "cgroup", "pids"}
        if unknown:
            raise BadInput(f"config watch #{i + 1}: unknown keys {sorted(unknown)}",
                           "use job, comm, user, cgroup, pids")
        try:
            rule = WatchRule(job=str(item.get("job", "")), comm=item.get("comm"),
                             user=_uid(item["user"]) if "user" in item else None,
                             cgroup=item.get("cgroup"),
                             pids=tuple(int(p) for p in item.get("pids", ())))
            rule.comm_re  # noqa: B018 - compile now: a bad regex is a config error
        except (ValueError, TypeError, re.error) as exc:
            raise BadInput(f"config watch #{i + 1}: {exc}", "fix the [[watch]] block") from None
        rules.append(rule)
    return tuple(rules)


def load(path: Path | None = None, env: Mapping[str, str] | None = None) -> Config:
    """The configuration from ``path`` (optional) and ``env`` (default ``os.environ``).
    Raises BadInput naming the key and the fix for an unreadable file, bad TOML, an unknown
    key or a bad value."""
    env = os.environ if env is None else env
    doc: dict[str, Any] = {}
    if path is not None:
        from counterd.util import stricttoml
        from counterd.util.strictjson import Malformed

        try:
            doc = stricttoml.loads(Path(path).read_bytes())
        except OSError as exc:
            raise BadInput(f"cannot read config {path}: {exc.strerror}", "check the path"
                           ) from None
        except Malformed as exc:  # not UTF-8, not TOML, nested too deep, nan or inf
            raise BadInput(f"config {path} is not valid TOML ({exc})",
                           "fix the syntax") from None
    try:
        return _config(doc, path, env)
    except BadInput as exc:  # a bad key or value: say which file holds it
        if path is None or str(path) in exc.what:
            raise
        raise BadInput(f"{path}: {exc.what}", exc.fix) from None


def _config(doc: Mapping[str, Any], path: Path | None, env: Mapping[str, str]) -> Config:
    """The Config of a parsed file ``doc`` (from ``path``) with ``env``'s overrides."""
    values: dict[tuple[str, str], Any] = {}
    watch: tuple[WatchRule, ...] | None = None
    sections = {s for s, _ in _KEYS if s} | {"watch"}
    for key, value in doc.items():
        if key == "watch":
            watch = _watch(value)
        elif key in sections and isinstance(value, dict):
            for sub, subval in value.items():
                if (key, sub) not in _KEYS:
                    raise BadInput(f"config {path}: unknown key {key}.{sub}",
                                   "see counterd/daemon/config.py for the keys")
                values[(key, sub)] = subval
        elif ("", key) in _KEYS:
            values[("", key)] = value
        else:
            raise BadInput(f"config {path}: unknown key {key}",
                           "see counterd/daemon/config.py for the keys")
    for spec, (_, var, _) in _KEYS.items():
        if var in env and not (var == "COUNTERD_SOCKET" and env[var] in ("", "off")):
            values[spec] = env[var]
    kwargs: dict[str, Any] = {"source": str(path) if path else "defaults"}
    if watch is not None:
        kwargs["watch"] = watch
    for spec, value in values.items():
        name, var, parse = _KEYS[spec]
        try:
            kwargs[name] = parse(value)
        except (ValueError, TypeError) as exc:
            raise BadInput(f"config {spec[0] + '.' if spec[0] else ''}{spec[1]} "
                           f"(or {var}) = {value!r} is invalid ({exc})",
                           "see counterd/daemon/config.py for the expected type") from None
    return Config(**kwargs)



def with_overrides(config: Config, **changes: Any) -> Config:
    return replace(config, **changes)
