"""Flow locks of the warehouse: one run per flow, released when the holder dies.

PostgreSQL: a session advisory lock taken with `pg_try_advisory_lock` on a connection of
its own, kept for the whole run. The server drops it when that session ends, including
when the client process is killed. DuckDB: `fcntl.flock` on a file beside the database;
the kernel drops it when the process dies. Both refuse at once, never wait.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from sinks.base import FlowLocked
from sinks.locks import flow_flock

_PLAIN_FLOW = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
# Locks of in-memory DuckDB databases: the database lives and dies with this process.
_MEMORY_LOCKS: set[str] = set()
_MEMORY_GUARD = threading.Lock()


def advisory_key(flow: str, schema: str | None) -> str:
    """The text hashed into the advisory lock id ('historian:' || [schema ':'] || flow).

    The schema is part of it because two warehouses in one database (different schemas)
    are different sinks: a run writing to one must not block a run writing to the other.
    """
    return f"historian:{schema}:{flow}" if schema else f"historian:{flow}"


@contextlib.contextmanager
def advisory_lock(engine: Engine, flow: str, key: str, where: str) -> Iterator[None]:
    """Hold `pg_try_advisory_lock(hashtext(key))` on a dedicated connection, or FlowLocked."""
    conn = engine.connect()
    try:
        got = conn.execute(sa.text("SELECT pg_try_advisory_lock(hashtext(:k))"), {"k": key})
        if not got.scalar():
            holder = _advisory_holder(conn, key)
            raise FlowLocked(f"flow '{flow}' is already running (lock held in {where}{holder})")
        conn.commit()
        yield
    finally:
        # Closing the session releases its advisory locks, whatever state it is in.
        with contextlib.suppress(SQLAlchemyError):
            conn.invalidate()
        conn.close()


def _advisory_holder(conn: sa.Connection, key: str) -> str:
    """' by backend pid N' when pg_locks says who holds the lock (best effort)."""
    try:
        pid = conn.execute(
            sa.text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) "
                "= hashtext(:k)::bigint LIMIT 1"
            ),
            {"k": key},
        ).scalar()
        conn.rollback()
    except SQLAlchemyError:
        return ""
    return f" by backend pid {pid}" if pid is not None else ""


def lock_file_path(database: str, flow: str) -> str:
    """`<db file>.<flow>.lock`; flows that are not plain names are hashed, never pathed."""
    name = (
        flow
        if _PLAIN_FLOW.match(flow)
        else "flow-" + hashlib.sha256(flow.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    )
    return f"{database}.{name}.lock"


def file_lock(path: str, flow: str) -> contextlib.AbstractContextManager[None]:
    """Hold an exclusive, non-blocking flock on `path`, or FlowLocked naming the holder.

    The same primitive as the lake's flow lock: the kernel frees it when the holder dies.
    """
    return flow_flock(path, flow)


@contextlib.contextmanager
def memory_lock(key: str, flow: str) -> Iterator[None]:
    """The flow lock of an in-memory database: process-local by nature."""
    with _MEMORY_GUARD:
        if key in _MEMORY_LOCKS:
            raise FlowLocked(f"flow '{flow}' is already running (in this process)")
        _MEMORY_LOCKS.add(key)
    try:
        yield
    finally:
        with _MEMORY_GUARD:
            _MEMORY_LOCKS.discard(key)
