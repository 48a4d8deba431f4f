"""Can a run write the warehouse? Found without creating anything (`historian check`).

A DuckDB file is not opened (opening creates it, and takes the one writer's lock): only
the file, or the nearest directory that exists, is checked. PostgreSQL is asked for the
privileges a run needs, in a transaction that is rolled back; MariaDB/MySQL is read from
its grants (sinks/sql/mysql.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sinks.base import SinkError


def probe_file(database: str | None, sink: str) -> str:
    """Whether a DuckDB file (None: in memory) could be opened for writing."""
    if database is None:
        return "in memory"
    path = Path(database)
    existing = next((p for p in (path, *path.parents) if p.exists()), Path(path.anchor))
    if existing == path:
        if not os.access(path, os.R_OK | os.W_OK):
            raise SinkError(f"sink {sink}: {path} is not writable")
        return "exists, writable"
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise SinkError(f"sink {sink}: {existing} is not a writable directory")
    return f"does not exist yet; {existing} is writable"


def probe_postgres(conn: Connection, schema: str, sink: str) -> str:
    """Whether this user may create tables in `schema`, or create the schema."""
    exists = conn.execute(
        sa.text("SELECT count(*) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
    ).scalar()
    if exists:
        allowed = conn.execute(
            sa.text("SELECT has_schema_privilege(:s, 'CREATE')"), {"s": schema}
        ).scalar()
    else:
        allowed = conn.execute(
            sa.text("SELECT has_database_privilege(current_database(), 'CREATE')")
        ).scalar()
    conn.rollback()
    if not allowed:
        where = f"on schema {schema}" if exists else "in the database (to create the schema)"
        raise SinkError(f"sink {sink}: no CREATE privilege {where}")
    return f"schema {schema} {'exists' if exists else 'does not exist yet'}, writable"
