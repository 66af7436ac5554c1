"""Hostile scrapers against /metrics (counterd.daemon.scrape_access): a peer not on the
allow-list, garbage, floods of connections, silent connections, plain HTTP to a TLS port,
wrong credentials; over IPv4, IPv6 loopback and a dual-stack listener. Small and
deterministic: counts and replies are checked, never timings."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from counterd.daemon import config as config_mod
from counterd.daemon.collector import registry
from counterd.daemon.config import Config
from counterd.daemon.exporter import ExpositionCache, serve
from counterd.daemon.metrics_state import MetricsState
from counterd.daemon.scrape_access import ScrapeAccess, read_users, tls_context
from counterd.data.errors import BadInput

OPENSSL = shutil.which("openssl")


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


IPV6 = _has_ipv6_loopback()
needs_ipv6 = pytest.mark.skipif(not IPV6, reason="no IPv6 loopback (::1) on this host")


class Lab:
    """A /metrics server over a MetricsState, with the access rules given."""

    def __init__(self, host: str = "127.0.0.1", **rules: Any) -> None:
        self.state = MetricsState()
        self.cache = ExpositionCache(registry(self.state, process_metrics=False), self.state)
        nets = config_mod.allowed_networks(rules.pop("allow", config_mod.DEFAULT_ALLOW))
        self.access = ScrapeAccess(nets, refused=lambda r: self.state.count("metrics_refused",
                                                                            r), **rules)
        self.server = serve(self.cache, host, 0, self.access)
        self.host, self.port = host, self.server.server_port

    def refused(self, reason: str) -> int:
        return self.state.metrics_refused[reason]

    def url(self, scheme: str = "http") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.cache.close()


@pytest.fixture
def lab_factory() -> Iterator[Any]:
    labs: list[Lab] = []

    def make(host: str = "127.0.0.1", **rules: Any) -> Lab:
        labs.append(Lab(host, **rules))
        return labs[-1]

    yield make
    for lab in labs:
        lab.close()


def _connect_from(source: str, lab: Lab, to: str = "") -> socket.socket:
    """A TCP connection to the lab from the loopback address ``source`` (any 127/8 address
    is this host: a scraper "elsewhere" without a second machine)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.bind((source, 0))
    s.connect((to or lab.host, lab.port))
    return s


def _closed_without_reply(s: socket.socket) -> bool:
    try:
        return s.recv(1024) == b""
    except ConnectionResetError:
        return True
    finally:
        s.close()


def _wait(cond: Any, timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def _get(url: str, **kw: Any) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=kw.pop("headers", {})),
                                    timeout=5, **kw) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_a_scraper_not_on_the_list_is_closed_unanswered_and_counted(lab_factory: Any) -> None:
    lab = lab_factory(allow="127.0.0.1/32")
    s = _connect_from("127.0.0.3", lab)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert _closed_without_reply(s)
    assert _wait(lambda: lab.refused("not_allowed") == 1)
    status, body = _get(lab.url())  # from 127.0.0.1, on the list
    assert status == 200 and b"counterd_metrics_refused_total" in body
    assert b'counterd_metrics_refused_total{reason="not_allowed"} 1.0' in body


def test_garbage_from_an_allowed_peer_gets_400_and_the_server_keeps_serving(
        lab_factory: Any) -> None:
    lab = lab_factory()
    for junk in (b"\x00\xff\xfe garbage\r\n\r\n", b"GET " + b"A" * 70000 + b" HTTP/1.1\r\n\r\n",
                 b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"):
        with socket.create_connection((lab.host, lab.port), timeout=5) as s:
            s.sendall(junk)
            reply = b"".join(iter(lambda: s.recv(65536), b""))  # until the server closes
        # an error page (HTTP/0.9 style for a request line without a version), no metrics
        assert b"counterd_" not in reply
        assert any(f"Error code: {c}".encode() in reply for c in (400, 414, 501)), reply[:300]
    assert _get(lab.url())[0] == 200


def test_a_flood_from_a_refused_address_spawns_no_thread_and_is_counted(
        lab_factory: Any) -> None:
    lab = lab_factory(allow="127.0.0.1/32")
    before = threading.active_count()
    socks = [_connect_from("127.0.0.4", lab) for _ in range(150)]
    assert all(_closed_without_reply(s) for s in socks)
    assert _wait(lambda: lab.refused("not_allowed") == 150)
    assert threading.active_count() <= before + 1  # at most the one scrape below, later
    assert _get(lab.url())[0] == 200


def test_connections_beyond_max_connections_are_closed_and_silent_ones_time_out(
        lab_factory: Any) -> None:
    lab = lab_factory(max_connections=2, timeout_s=0.3)
    silent = [socket.create_connection((lab.host, lab.port), timeout=5) for _ in range(2)]
    assert _wait(lambda: lab.access.slots._value == 0)  # type: ignore[attr-defined]
    extra = socket.create_connection((lab.host, lab.port), timeout=5)
    assert _closed_without_reply(extra)
    assert lab.refused("busy") == 1
    for s in silent:  # closed by the daemon after timeout_s of silence, slots given back
        assert _closed_without_reply(s)
    assert _wait(lambda: lab.refused("timeout") == 2)
    assert _get(lab.url())[0] == 200


@needs_ipv6
def test_ipv6_loopback_is_served_and_filtered(lab_factory: Any) -> None:
    lab = lab_factory("::1")
    assert _get(lab.url())[0] == 200
    v4only = lab_factory("::1", allow="127.0.0.0/8")
    s = socket.create_connection(("::1", v4only.port), timeout=5)
    assert _closed_without_reply(s)
    assert _wait(lambda: v4only.refused("not_allowed") == 1)


@needs_ipv6
def test_a_dual_stack_listener_checks_ipv4_peers_as_ipv4(lab_factory: Any) -> None:
    lab = lab_factory("::", allow="127.0.0.1/32")  # ::ffff:127.0.0.1 is 127.0.0.1
    assert _get(f"http://127.0.0.1:{lab.port}/metrics")[0] == 200
    s = _connect_from("127.0.0.5", lab, to="127.0.0.1")
    assert _closed_without_reply(s)
    v6 = socket.create_connection(("::1", lab.port), timeout=5)
    assert _closed_without_reply(v6)
    assert _wait(lambda: lab.refused("not_allowed") == 2)


def _pbkdf2_line(user: str, password: str, salt: bytes = b"counterd-salt!") -> str:
    ab64 = lambda b: base64.b64encode(b).decode().rstrip("=").replace("+", ".")  # noqa: E731
    key = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 1000)
    return f"{user}:$pbkdf2-sha256$1000${ab64(salt)}${ab64(key)}"


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()
                                                         ).decode()}


def test_basic_auth_refuses_missing_and_wrong_credentials(lab_factory: Any,
                                                          tmp_path: Path) -> None:
    f = tmp_path / "users"
    f.write_text("# scrapers\n" + _pbkdf2_line("prometheus", "s3cret") + "\n")
    lab = lab_factory(users=read_users(f))
    assert _get(lab.url())[0] == 401
    assert _get(lab.url(), headers=_basic("prometheus", "wrong"))[0] == 401
    assert _get(lab.url(), headers=_basic("nobody", "s3cret"))[0] == 401
    assert _get(lab.url(), headers={"Authorization": "Basic !!!notbase64"})[0] == 401
    assert lab.refused("unauthorized") == 4
    status, body = _get(lab.url(), headers=_basic("prometheus", "s3cret"))
    assert status == 200 and b"counterd_clients" in body
    assert _get(lab.url(), headers=_basic("prometheus", "s3cret"))[0] == 200  # remembered


def test_bcrypt_hashes_as_node_exporter_takes_them(lab_factory: Any, tmp_path: Path) -> None:
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt
        hashed = crypt.crypt("s3cret", crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    except (ImportError, ValueError, AttributeError):
        pytest.skip("no crypt(3) with bcrypt here (Python >= 3.13 or libcrypt without it)")
    if not hashed or not hashed.startswith("$2"):
        pytest.skip("this libcrypt does not make bcrypt hashes")
    f = tmp_path / "users"
    f.write_text(f"prometheus:{hashed}\n")
    lab = lab_factory(users=read_users(f))
    assert _get(lab.url(), headers=_basic("prometheus", "wrong"))[0] == 401
    assert _get(lab.url(), headers=_basic("prometheus", "s3cret"))[0] == 200


@pytest.mark.parametrize("text", ["", "prometheus\n", "prometheus:plaintext\n",
                                  "p:$pbkdf2-sha256$10$x$y\n"])
def test_a_bad_basic_auth_file_is_one_clear_error(tmp_path: Path, text: str) -> None:
    f = tmp_path / "users"
    f.write_text(text)
    with pytest.raises(BadInput, match="basic_auth_file"):
        read_users(f)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if OPENSSL is None:
        pytest.skip("openssl not installed (to make a test certificate)")
    d = tmp_path_factory.mktemp("tls")
    crt, key = d / "crt.pem", d / "key.pem"
    subprocess.run([OPENSSL, "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True,
                   timeout=30)
    return crt, key


def test_tls_serves_https_and_counts_plain_http(lab_factory: Any,
                                               cert: tuple[Path, Path]) -> None:
    crt, key = cert
    lab = lab_factory(tls=tls_context(str(crt), str(key), ""), timeout_s=2.0)
    ctx = ssl.create_default_context(cafile=str(crt))
    status, body = _get(lab.url("https"), context=ctx)
    assert status == 200 and b"counterd_clients" in body
    with socket.create_connection((lab.host, lab.port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            assert b"counterd_clients" not in s.recv(4096)
    assert _wait(lambda: lab.refused("tls") == 1)


def test_mutual_tls_refuses_a_scraper_without_a_certificate(lab_factory: Any,
                                                            cert: tuple[Path, Path]) -> None:
    crt, key = cert
    lab = lab_factory(tls=tls_context(str(crt), str(key), str(crt)), timeout_s=2.0)
    ctx = ssl.create_default_context(cafile=str(crt))
    with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
        _get(lab.url("https"), context=ctx)
    ctx.load_cert_chain(str(crt), str(key))  # the same self-signed pair as the client's
    assert _get(lab.url("https"), context=ctx)[0] == 200
    assert _wait(lambda: lab.refused("tls") == 1)


@pytest.mark.parametrize("listen,expected", [
    ("127.0.0.1:9464", (("127.0.0.1", 9464),)),
    ("[::1]:9464", (("::1", 9464),)),
    ("10.0.0.5:9464, [::]:9465", (("10.0.0.5", 9464), ("::", 9465))),
    (":9464", (("127.0.0.1", 9464),)),
])
def test_listen_takes_several_addresses_and_ipv6(listen: str, expected: Any) -> None:
    assert config_mod.metrics_addresses(listen) == expected


@pytest.mark.parametrize("key,value,what", [
    ("listen", "::1:9464", "HOST:PORT"), ("listen", "host", "HOST:PORT"),
    ("listen", "a:1,a:1", "twice"), ("allow", "", "empty"), ("allow", "10.0.0.300", "allow"),
    ("tls_cert_file", "/x.pem", "tls_key_file"),
])
def test_bad_metrics_keys_are_one_clear_error(tmp_path: Path, key: str, value: str,
                                              what: str) -> None:
    f = tmp_path / "c.toml"
    f.write_text(f'[metrics]\n{key} = "{value}"\n')
    with pytest.raises(BadInput, match=what):
        config_mod.load(f, env={})


def test_config_lists_and_the_loopback_default(tmp_path: Path) -> None:
    assert config_mod.allowed_networks(Config().metrics_allow) == config_mod.allowed_networks(
        "127.0.0.0/8,::1/128")
    f = tmp_path / "c.toml"
    f.write_text('[metrics]\nlisten = ["10.0.0.5:9464", "[fd00::5]:9464"]\n'
                 'allow = ["10.0.0.1", "fd00::/64"]\n')
    cfg = config_mod.load(f, env={})
    assert cfg.metrics_listen == "10.0.0.5:9464,[fd00::5]:9464"
    assert cfg.metrics_allow == "10.0.0.1,fd00::/64"
    assert config_mod.load(f, env={"COUNTERD_METRICS_ALLOW": "10.0.0.2"}).metrics_allow == \
        "10.0.0.2"


def test_the_daemon_serves_every_listen_address_under_one_allow_list(tmp_path: Path) -> None:
    """counterd run with two addresses (IPv6 loopback where there is one): each served, the
    allow-list on both, the refusals in the same counter."""
    from counterd.daemon.service import Daemon

    listen = "127.0.0.1:0" + (",[::1]:0" if IPV6 else "")
    d = Daemon(Config(metrics_listen=listen, metrics_allow="127.0.0.1/32",
                      socket_path=tmp_path / "s.sock", store_path=tmp_path / "s.db",
                      sample_backend="none", store_synchronous="normal"))
    d.start()
    loop = threading.Thread(target=d.serve)
    loop.start()
    try:
        assert len(d.metrics_ports) == (2 if IPV6 else 1)
        assert _get(f"http://127.0.0.1:{d.metrics_ports[0]}/metrics")[0] == 200
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", d.metrics_ports[0]))
        assert _closed_without_reply(s)
        if IPV6:  # ::1 is not 127.0.0.1/32
            assert _closed_without_reply(socket.create_connection(("::1", d.metrics_ports[1])))
        want = 2 if IPV6 else 1
        assert _wait(lambda: d.state.metrics_refused["not_allowed"] == want)
    finally:
        d.request_stop()
        loop.join(30)
    assert not loop.is_alive()
