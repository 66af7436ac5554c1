"""A throwaway PostgreSQL cluster for the central store's tests: initdb into a temporary
directory, a unix socket there, no TCP, fsync off. PostgreSQL refuses to run as root: as root
the cluster belongs to ``nobody`` (setpriv). Skips with the reason where PostgreSQL (found
under /usr/lib/postgresql/*/bin, or on PATH) or psycopg is absent.

Roles made here: the bootstrap superuser ``postgres`` (trust authentication on the socket:
any role may log in as any role, which is what lets the tests act as each role; a site uses
peer or password authentication)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def pg_bin() -> Path | None:
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return Path(d)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


@dataclass(frozen=True)
class Cluster:
    bindir: Path
    datadir: Path
    sockdir: Path
    owner: str | None  # the system user it runs as (None: this one)
    listen: str = ""  # TCP addresses too (bench/central_ship.py --link-down); "": socket only

    def dsn(self, user: str = "postgres", dbname: str = "counterd", **extra: object) -> str:
        more = " ".join(f"{k}={v}" for k, v in extra.items())
        return f"host={self.sockdir} port=5432 user={user} dbname={dbname} {more}".strip()

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(argv)
        if self.owner is not None:
            pw = pwd.getpwnam(self.owner)
            cmd = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups",
                   *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=60)

    def start(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-w", "-t", "30",
                  "-l", str(self.sockdir / "log"), "start", "-o",
                  f"-c listen_addresses='{self.listen}' -c unix_socket_directories={self.sockdir} "
                  "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                  "-c max_connections=40")

    def running(self) -> bool:
        return self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "status",
                         check=False).returncode == 0

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-w", "-m", mode,
                  "stop", check=False)


def _owner() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("running as root and no user 'nobody' to run PostgreSQL as")
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv to run PostgreSQL as another user")
    return "nobody"


@contextlib.contextmanager
def cluster(listen: str = "", trust_net: str = "") -> Iterator[Cluster]:
    """A started cluster with database ``counterd`` (migrated by the caller); ``listen``: TCP
    addresses to listen on as well, ``trust_net``: a network (CIDR) whose TCP clients it
    trusts like the socket's."""
    pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install "
                                           "'counterd[central]')")
    bindir = pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (scripts/system-deps.sh installs it)")
    owner = _owner()
    top = Path(tempfile.mkdtemp(prefix="counterd-pg-"))
    os.chmod(top, 0o755)
    datadir, sockdir = top / "data", top / "sock"
    sockdir.mkdir()
    if owner is not None:
        pw = pwd.getpwnam(owner)
        os.chown(sockdir, pw.pw_uid, pw.pw_gid)
        datadir.mkdir(mode=0o700)
        os.chown(datadir, pw.pw_uid, pw.pw_gid)
    c = Cluster(bindir, datadir, sockdir, owner, listen)
    try:
        c._run(str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "--auth=trust",
               "-E", "UTF8", "--no-sync", "--locale=C")
        if trust_net:
            with (datadir / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {trust_net} trust\n")
        c.start()
        import psycopg

        with psycopg.connect(c.dsn(dbname="postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE counterd")
        yield c
    finally:
        c.stop("immediate")
        shutil.rmtree(top, ignore_errors=True)


NODE = "node1"  # a node's login role
READERS = {"u1001": 1001, "u1002": 1002}  # readers' roles and the uid each may read
ADMIN = "boss"


def migrated(c: Cluster) -> Cluster:
    """``c`` with the central schema, a node role, two readers and an administrator."""
    import psycopg

    from counterd.central import schema

    with psycopg.connect(c.dsn()) as conn:
        schema.migrate(conn)
        conn.autocommit = True
        for role in (NODE, ADMIN, *READERS):
            conn.execute(f'CREATE ROLE "{role}" LOGIN')
        schema.add_node(conn, NODE)
        for role, uid in READERS.items():
            schema.add_reader(conn, role, uid)
        conn.execute(f'GRANT {schema.ADMIN_ROLE} TO "{ADMIN}"')
    return c


def truncate(c: Cluster) -> None:
    """Empty the central tables between tests (the cluster is paid once per module)."""
    import psycopg

    with psycopg.connect(c.dsn(), autocommit=True) as conn:
        conn.execute("TRUNCATE counterd.records, counterd.runs, counterd.clock_domains, "
                     "counterd.clock_anchors")


def count(c: Cluster, where: str = "true") -> int:
    import psycopg

    with psycopg.connect(c.dsn(), autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM counterd.records WHERE {where}").fetchone()
        return int(row[0]) if row else 0
