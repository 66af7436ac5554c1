"""Who may scrape ``/metrics``: the allow-list, TLS and basic auth of ``[metrics]``.

The daemon enforces these itself (systemd's ``IPAddressAllow=`` mirrors the allow-list as a
second fence: ``systemd/counterd.service.d/metrics-network.conf.example``):

* **allow-list** (``metrics.allow``, default loopback only): a peer whose address is in none of
  the networks is closed in the accepting thread, before a byte is read or a thread is spawned,
  and counted (``counterd_metrics_refused_total{reason="not_allowed"}``). An IPv4 peer of a
  dual-stack ``[::]`` listener (``::ffff:10.0.0.5``) is checked as its IPv4 address.
* **connections at once** (``metrics.max_connections``): beyond, closed at once (``busy``);
  a connection silent for ``metrics.timeout_s`` (TLS handshake or request) is closed
  (``timeout``). A flood therefore costs an accept and a close per connection, never a thread.
* **TLS** (``tls_cert_file``, ``tls_key_file``; ``tls_client_ca_file`` for mutual TLS): the
  handshake runs in the connection's thread, after the allow-list, TLS 1.2 at least, as
  prometheus-client's ``start_http_server(certfile=, keyfile=, client_cafile=)`` sets up its
  context (the daemon serves a cached exposition through its own server, so it builds the
  context the same way). A failed handshake is counted (``tls``).
* **basic auth** (``basic_auth_file``): lines ``user:hash``, the hash bcrypt as node_exporter's
  ``web.config.yml`` ``basic_auth_users`` take (``htpasswd -nBC 10 USER``), or
  ``$pbkdf2-sha256$ITERATIONS$SALT$HASH`` (base64, as passlib writes it; needs nothing but
  hashlib). A request without the right credentials gets 401 (``unauthorized``). A verified
  pair is remembered (its SHA-256) so that a scrape every 15 s costs no bcrypt.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import ssl
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from counterd.daemon import config as config_mod
from counterd.daemon.config import Config
from counterd.data.errors import BadInput

_Net = ipaddress.IPv4Network | ipaddress.IPv6Network


def _bcrypt(password: str, hashed: str) -> bool | None:
    """Whether ``password`` matches a bcrypt ``hashed``; None where the C library's crypt(3)
    cannot say (no ``crypt`` module: Python >= 3.13, or a libcrypt without bcrypt)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt  # noqa: PLC0415 - deprecated module, only for bcrypt hashes
    except ImportError:
        return None
    out = crypt.crypt(password, hashed)
    if not out or not out.startswith("$2"):
        return None
    return hmac.compare_digest(out, hashed)


def _pbkdf2(password: str, hashed: str) -> bool:
    _, _, iterations, salt, digest = hashed.split("$")
    pad = lambda s: s.replace(".", "+") + "=" * (-len(s) % 4)  # noqa: E731 - passlib's ab64
    key = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(pad(salt)),
                              int(iterations))
    return hmac.compare_digest(key, base64.b64decode(pad(digest)))


def read_users(path: Path) -> dict[str, str]:
    """``user -> hash`` of a basic-auth file; BadInput naming the line for anything else."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"cannot read metrics.basic_auth_file {path}: {exc}",
                       "give a readable file of user:hash lines") from None
    users: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        ok = sep and user and ":" not in hashed
        if ok and hashed.startswith("$pbkdf2-sha256$"):
            try:
                parts = hashed.split("$")
                ok = len(parts) == 5 and int(parts[2]) >= 1000
            except ValueError:
                ok = False
        elif ok:
            ok = hashed.startswith(("$2a$", "$2b$", "$2y$"))
            if ok and _bcrypt("", hashed) is None:
                raise BadInput(f"metrics.basic_auth_file {path} line {n}: bcrypt hashes "
                               "cannot be checked on this system (no crypt(3) with bcrypt)",
                               "use a $pbkdf2-sha256$ hash (see counterd/daemon/"
                               "scrape_access.py)")
        if not ok:
            raise BadInput(f"metrics.basic_auth_file {path} line {n} is not user:hash with "
                           "a bcrypt or $pbkdf2-sha256$ hash",
                           "write user:$(htpasswd -nBC 10 user | cut -d: -f2)")
        users[user] = hashed
    if not users:
        raise BadInput(f"metrics.basic_auth_file {path} names no user",
                       "add user:hash lines, or unset metrics.basic_auth_file")
    return users


def tls_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    """The server context: TLS >= 1.2; client certificates required when ``client_ca``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if client_ca:
            ctx.load_verify_locations(cafile=client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise BadInput(f"metrics TLS files {cert}, {key}{', ' + client_ca if client_ca else ''}"
                       f" cannot be used: {exc}",
                       "give a PEM certificate and its unencrypted key (and a PEM CA file)"
                       ) from None
    return ctx


@dataclass
class ScrapeAccess:
    """The rules one /metrics server enforces; ``refused(reason)`` counts a refusal."""

    networks: tuple[_Net, ...]
    max_connections: int = 16
    timeout_s: float = 10.0
    tls: ssl.SSLContext | None = None
    users: dict[str, str] = field(default_factory=dict)
    refused: Callable[[str], None] = lambda reason: None
    _verified: set[bytes] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    slots: threading.BoundedSemaphore = field(init=False)  # connections served at once

    def __post_init__(self) -> None:
        self.slots = threading.BoundedSemaphore(self.max_connections)

    @classmethod
    def from_config(cls, cfg: Config, refused: Callable[[str], None]) -> ScrapeAccess:
        return cls(config_mod.allowed_networks(cfg.metrics_allow), cfg.metrics_max_connections,
                   cfg.metrics_timeout_s,
                   tls_context(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
                   if cfg.tls_cert_file else None,
                   read_users(Path(cfg.basic_auth_file)) if cfg.basic_auth_file else {},
                   refused)

    def allows(self, host: str) -> bool:
        """Whether a peer at ``host`` (as accept() gave it) may scrape."""
        try:
            ip = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self.networks)

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries a known user and its password (always
        true without a basic-auth file)."""
        if not self.users:
            return True
        if not header or not header[:6].lower() == "basic " or len(header) > 4096:
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True
                                                   ).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if not sep or hashed is None:
            return False
        token = hashlib.sha256(f"{user}\0{password}\0{hashed}".encode()).digest()
        with self._lock:
            if token in self._verified:
                return True
        ok = (_pbkdf2(password, hashed) if hashed.startswith("$pbkdf2-sha256$")
              else bool(_bcrypt(password, hashed)))
        if ok:
            with self._lock:
                if len(self._verified) < 1024:
                    self._verified.add(token)
        return ok
