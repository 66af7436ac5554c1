"""The central store (issue 32 item 3): every node's committed records on one PostgreSQL
database, shipped by the daemon's shipper thread and read by each user through their own role.

* :mod:`counterd.central.schema` - the central schema, its migrations, roles and row-level
  security;
* :mod:`counterd.central.shipper` - the daemon's thread that ships what the local store
  committed (at-least-once, idempotent on the record's key, resumed after restarts);
* :mod:`counterd.central.reader` - ``counterd report/runs --central DSN``.

psycopg (3) is the client: ``pip install counterd[central]``. Importing this package loads
nothing else; a missing psycopg is :func:`psycopg_module`'s BadInput, said when used.
"""

from __future__ import annotations

from types import ModuleType

from counterd.data.errors import BadInput


def psycopg_module() -> ModuleType:
    """The psycopg module, or BadInput saying how to install it."""
    try:
        import psycopg
    except ImportError:
        raise BadInput("the central store needs psycopg 3, which is not installed",
                       "pip install 'counterd[central]' (or 'psycopg[binary]>=3.1')") from None
    return psycopg


__all__ = ["psycopg_module"]
