"""The central store's schema on PostgreSQL: tables, roles, row-level security, migrations.

Everything lives in the schema ``counterd`` of the database the DSN names. Versions are in
``counterd.schema_version``; :data:`MIGRATIONS` are applied in order, each in its own
transaction under an advisory lock (two nodes or admins migrating at once apply each once), by
a role that may create roles (the database owner or an administrator, ``counterd central
migrate DSN``); a database with a newer version than this counterd knows is refused.

Roles (cluster-wide, created by migration 1 when missing, all ``NOLOGIN`` groups):

* ``counterd_node`` - what a node's daemon logs in as (a login role made a member). It has no
  privilege on any table: it may only call the ingest functions ``counterd.ship_*``, which run
  as the schema's owner (``SECURITY DEFINER`` with a fixed ``search_path``) and do nothing but
  insert rows (and complete a record that was shipped incomplete, as the local store does).
  So a node's credentials can add records, never read, change or delete anyone's.
* ``counterd_reader`` - users. SELECT on the tables under row-level security: a row is
  visible when its ``uid`` is mapped to the reading role in ``counterd.readers`` (role name
  -> uid: a site's database roles need not be named after uids; one role may hold several
  uids, e.g. a user's accounts on two clusters).
* ``counterd_admin`` - sees every row (the policies let its members through); it is a member
  of ``counterd_reader``.

Rows are keyed as the local store keys them: records on (uid, run_id, host, pid, idx), runs on
(uid, run_id, node), clock domains and anchors per (uid, run_id, node): ``node`` is the
shipping daemon's host name (its clock domain's node).
"""

from __future__ import annotations

from typing import Any

from counterd.data.errors import BadInput, CounterdError

SCHEMA = "counterd"
NODE_ROLE = "counterd_node"
READER_ROLE = "counterd_reader"
ADMIN_ROLE = "counterd_admin"

_ROLES = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{NODE_ROLE}') THEN
        CREATE ROLE {NODE_ROLE} NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{READER_ROLE}') THEN
        CREATE ROLE {READER_ROLE} NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ADMIN_ROLE}') THEN
        CREATE ROLE {ADMIN_ROLE} NOLOGIN;
    END IF;
END
$$;
GRANT {READER_ROLE} TO {ADMIN_ROLE};
"""

# Migration 1: tables, the ingest functions, grants, policies.
_V1 = f"""
CREATE TABLE counterd.runs (
    uid           bigint NOT NULL,
    run_id        text NOT NULL,
    node          text NOT NULL,           -- the shipping daemon's host name
    host          text NOT NULL,           -- the first record's host (the local runs.host)
    job           text NOT NULL,
    first_seen_ns bigint NOT NULL,         -- the node's wall clock
    last_seen_ns  bigint NOT NULL,
    PRIMARY KEY (uid, run_id, node)
);
CREATE TABLE counterd.records (
    uid          bigint NOT NULL,
    run_id       text NOT NULL,
    host         text NOT NULL,
    pid          bigint NOT NULL,
    idx          bigint NOT NULL,
    node         text NOT NULL,
    name         text NOT NULL,
    rank         bigint NOT NULL,
    begin_ns     bigint NOT NULL,           -- CLOCK_MONOTONIC of the client
    end_ns       bigint,                    -- NULL: incomplete
    body         text NOT NULL,             -- SuperstepRecord.to_json(), as stored locally
    committed_ns bigint NOT NULL,           -- local commit (the node's wall clock)
    shipped_ns   bigint NOT NULL,           -- central insert (the database's wall clock)
    PRIMARY KEY (uid, run_id, host, pid, idx)
);
CREATE INDEX records_by_run ON counterd.records (uid, run_id, idx);
CREATE TABLE counterd.clock_domains (
    uid            bigint NOT NULL,
    run_id         text NOT NULL,
    node           text NOT NULL,
    boot_id        text NOT NULL,
    timens         text NOT NULL,
    mono_offset_ns bigint,
    sync_bound_ns  bigint,
    PRIMARY KEY (uid, run_id, node)
);
CREATE TABLE counterd.clock_anchors (
    uid     bigint NOT NULL,
    run_id  text NOT NULL,
    node    text NOT NULL,
    mono_ns bigint NOT NULL,                -- the daemon's CLOCK_MONOTONIC
    real_ns bigint NOT NULL,
    read_ns bigint NOT NULL,
    PRIMARY KEY (uid, run_id, node, mono_ns)
);
CREATE TABLE counterd.readers (
    role_name name NOT NULL,
    uid       bigint NOT NULL,
    PRIMARY KEY (role_name, uid)
);

CREATE FUNCTION counterd.now_ns() RETURNS bigint LANGUAGE sql VOLATILE
    SET search_path = pg_catalog AS
$$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::bigint $$;

CREATE FUNCTION counterd.ship_records(
        uids bigint[], run_ids text[], hosts text[], pids bigint[], idxs bigint[], nodes text[],
        names text[], ranks bigint[], begins bigint[], ends bigint[], bodies text[],
        committed bigint[]) RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
    -- returns nothing: a node learns nothing of what is stored, not even whether a key was
    INSERT INTO counterd.records AS r
        (uid, run_id, host, pid, idx, node, name, rank, begin_ns, end_ns, body,
         committed_ns, shipped_ns)
    SELECT u.*, counterd.now_ns()
    FROM unnest(uids, run_ids, hosts, pids, idxs, nodes, names, ranks, begins, ends,
                bodies, committed) AS u
    ON CONFLICT (uid, run_id, host, pid, idx) DO UPDATE SET
        node = excluded.node, name = excluded.name, rank = excluded.rank,
        begin_ns = excluded.begin_ns, end_ns = excluded.end_ns, body = excluded.body,
        committed_ns = excluded.committed_ns, shipped_ns = excluded.shipped_ns
    WHERE r.end_ns IS NULL AND excluded.end_ns IS NOT NULL
$$;

CREATE FUNCTION counterd.ship_runs(
        uids bigint[], run_ids text[], nodes text[], hosts text[], jobs text[], firsts bigint[],
        lasts bigint[]) RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
    INSERT INTO counterd.runs AS r
    SELECT * FROM unnest(uids, run_ids, nodes, hosts, jobs, firsts, lasts)
    ON CONFLICT (uid, run_id, node) DO UPDATE SET
        last_seen_ns = greatest(r.last_seen_ns, excluded.last_seen_ns)
$$;

CREATE FUNCTION counterd.ship_clocks(
        d_uids bigint[], d_run_ids text[], d_nodes text[], d_boots text[], d_timens text[],
        d_offsets bigint[], d_bounds bigint[],
        a_uids bigint[], a_run_ids text[], a_nodes text[], a_mono bigint[], a_real bigint[],
        a_read bigint[]) RETURNS void
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS
$$
    INSERT INTO counterd.clock_domains AS d
    SELECT * FROM unnest(d_uids, d_run_ids, d_nodes, d_boots, d_timens, d_offsets, d_bounds)
    ON CONFLICT (uid, run_id, node) DO UPDATE SET sync_bound_ns = excluded.sync_bound_ns;
    INSERT INTO counterd.clock_anchors
    SELECT * FROM unnest(a_uids, a_run_ids, a_nodes, a_mono, a_real, a_read)
    ON CONFLICT DO NOTHING;
$$;

REVOKE ALL ON ALL TABLES IN SCHEMA counterd FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA counterd FROM PUBLIC;
GRANT USAGE ON SCHEMA counterd TO {NODE_ROLE}, {READER_ROLE};
GRANT EXECUTE ON FUNCTION counterd.ship_records, counterd.ship_runs, counterd.ship_clocks,
    counterd.now_ns TO {NODE_ROLE};
GRANT SELECT ON counterd.runs, counterd.records, counterd.clock_domains,
    counterd.clock_anchors, counterd.readers, counterd.schema_version TO {READER_ROLE};

ALTER TABLE counterd.readers ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_mapping ON counterd.readers FOR SELECT TO {READER_ROLE}
    USING (role_name = current_user OR pg_has_role(current_user, '{ADMIN_ROLE}', 'MEMBER'));
"""

_OWN_ROWS = (f"USING (pg_has_role(current_user, '{ADMIN_ROLE}', 'MEMBER') OR uid IN "
             "(SELECT m.uid FROM counterd.readers m WHERE m.role_name = current_user))")
_V1 += "".join(
    f"ALTER TABLE counterd.{t} ENABLE ROW LEVEL SECURITY;\n"
    f"CREATE POLICY own_runs ON counterd.{t} FOR SELECT TO {READER_ROLE} {_OWN_ROWS};\n"
    for t in ("runs", "records", "clock_domains", "clock_anchors"))

# Schema history (each applied once, in order, in its own transaction):
#   1 - runs, records, clock domains and anchors, the reader mapping; the ingest functions;
#       the node, reader and administrator roles; row-level security.
MIGRATIONS: tuple[str, ...] = (_V1,)
SCHEMA_VERSION = len(MIGRATIONS)
_LOCK = 0x636F756E74657264  # pg_advisory_xact_lock key: "counterd"


class CentralError(CounterdError):
    """The central database cannot be reached, migrated or read."""


def schema_version(conn: Any) -> int:
    """The central schema's version (0: none yet)."""
    row = conn.execute("SELECT to_regclass('counterd.schema_version')").fetchone()
    if row is None or row[0] is None:
        return 0
    got = conn.execute("SELECT max(version) FROM counterd.schema_version").fetchone()
    return int(got[0] or 0) if got else 0


def migrate(conn: Any, target: int = SCHEMA_VERSION) -> int:
    """Apply the missing migrations up to ``target`` on the psycopg connection ``conn`` (not in
    autocommit mode); returns the version reached."""
    for _ in range(target):
        with conn.transaction():
            conn.execute(f"SELECT pg_advisory_xact_lock({_LOCK})")
            current = schema_version(conn)
            if current > SCHEMA_VERSION:
                raise CentralError(f"the central database has schema version {current}, "
                                   f"newer than this counterd's {SCHEMA_VERSION}",
                                   "upgrade counterd")
            if current >= target:
                return current
            if current == 0:
                conn.execute("CREATE SCHEMA IF NOT EXISTS counterd")
                conn.execute("CREATE TABLE counterd.schema_version (version integer PRIMARY "
                             "KEY, applied timestamptz NOT NULL DEFAULT now())")
                conn.execute(_ROLES)
            conn.execute(MIGRATIONS[current])
            conn.execute("INSERT INTO counterd.schema_version (version) VALUES (%s)",
                         (current + 1,))
    with conn.transaction():
        return schema_version(conn)


def add_reader(conn: Any, role: str, uid: int) -> None:
    """Let database role ``role`` read uid ``uid``'s runs: map it and make it a reader (run by
    an administrator; the role must exist)."""
    from psycopg import sql

    if not role or len(role) > 63:
        raise BadInput(f"role {role!r:.80} is not a PostgreSQL role name",
                       "give an existing role's name (1 to 63 characters)")
    if not 0 <= uid < 2**32:
        raise BadInput(f"uid {uid} is not a uid", "give a number in [0, 2^32)")
    with conn.transaction():
        conn.execute("INSERT INTO counterd.readers VALUES (%s, %s) ON CONFLICT DO NOTHING",
                     (role, uid))
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(READER_ROLE),
                                                      sql.Identifier(role)))


def add_node(conn: Any, role: str) -> None:
    """Let login role ``role`` ship records (make it a member of ``counterd_node``)."""
    from psycopg import sql

    with conn.transaction():
        conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(NODE_ROLE),
                                                      sql.Identifier(role)))


__all__ = ["ADMIN_ROLE", "MIGRATIONS", "NODE_ROLE", "READER_ROLE", "SCHEMA_VERSION",
           "CentralError", "add_node", "add_reader", "migrate", "schema_version"]
