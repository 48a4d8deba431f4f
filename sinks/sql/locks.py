"""Flow locks of the warehouse: one run per flow, released when the holder dies.

PostgreSQL: a session advisory lock taken with `pg_try_advisory_lock` on a connection of
its own, kept for the whole run. The server drops it when that session ends, including
when the client process is killed; MariaDB/MySQL's `GET_LOCK` is held the same way
(sinks/sql/mysql.py), both as a `SessionLock`. DuckDB: `fcntl.flock` on a file beside the
database; the kernel drops it when the process dies. All refuse at once, never wait.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from sinks.base import FlowLocked, SinkError, SinkUnavailable
from sinks.store.locks import flow_flock

_PLAIN_FLOW = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
# Locks of in-memory DuckDB databases: the database lives and dies with this process.
_MEMORY_LOCKS: set[str] = set()
_MEMORY_GUARD = threading.Lock()
# Write transactions on one DuckDB file take turns within this process: DuckDB's optimistic
# concurrency aborts the second of two writers touching the same rows ("Conflict on tuple
# deletion"), and one process may hold two sinks on a file (a live tail and its gap runs).
_WRITERS: dict[str, threading.RLock] = {}
_Lock = TypeVar("_Lock", bound="SessionLock")


def advisory_key(flow: str, schema: str | None) -> str:
    """The text hashed into the advisory lock id ('historian:' || [schema ':'] || flow).

    The schema is part of it because two warehouses in one database (different schemas)
    are different sinks: a run writing to one must not block a run writing to the other.
    """
    return f"historian:{schema}:{flow}" if schema else f"historian:{flow}"


class SessionLock(ABC):
    """A flow lock held by a session of its own for a run; each database says how to take
    it (`acquire`) and how to ask, inside another transaction, whether it is still held
    (`held_sql`).

    The server releases a session's locks when the session ends, which is what frees the
    lock of a killed run; it is also what a server restart or a terminated backend does
    to a live one. `ensure()` notices that and takes the lock again, or raises FlowLocked
    when another run took it meanwhile, so a run that outlives a restart never writes
    beside another run of its flow. The sink's concurrent writers all call `ensure()`
    after a restart: they take turns, or the second would drop the session the first
    just took the lock on, then find the lock held by that dying session.

    A session the client has lost may still hold the lock while its backend exits (a
    failover or a dropped connection tells the client first; a terminated backend drops
    its temporary tables before its locks). The lock remembers the backends of its lost
    sessions: found holding it, one of them is `SinkUnavailable`, waited for by the
    caller's retries, not another run.
    """

    def __init__(self, engine: Engine, flow: str, where: str) -> None:
        self.engine = engine
        self.flow = flow
        self.where = where
        self.pid: int | None = None  # the backend (connection) holding the lock
        self._conn: sa.Connection | None = None
        self._turns = threading.Lock()
        self._lost: set[int] = set()  # backends of this lock's sessions, dropped holding it

    # How the database names the session holding a lock, in a refusal.
    holder_noun = "backend pid"

    @abstractmethod
    def try_take(self, conn: sa.Connection) -> tuple[int | None, int | None]:
        """Ask for the lock once on `conn`: (our session's pid, None) when taken, or
        (None, the holder's pid; None when it was released meanwhile) when refused."""

    def acquire(self, *, again: bool = False) -> None:
        """Take the lock on a new session, or FlowLocked at once (`again`: after losing it)."""
        conn = self.engine.connect()
        pid = None
        try:
            pid, holder = self.try_take(conn)
            if pid is None:
                raise self.refusal(holder, again=again)
            conn.commit()
        except BaseException:
            drop_session(conn)
            if pid is not None:
                self.dropped_holding(pid)
            raise
        self.took(conn, pid)

    @abstractmethod
    def held_sql(self) -> tuple[str, dict[str, object]]:
        """A query (true or false) for inside another transaction: does our session still
        hold the lock? False once the server has ended that session."""

    def ensure(self) -> None:
        """Take the lock again if the session that held it has ended."""
        with self._turns:
            if self._conn is not None:
                try:
                    sql, params = self.held_sql()
                    if self._conn.execute(sa.text(sql), params).scalar():
                        self._conn.commit()
                        return
                except SQLAlchemyError:
                    pass
                self.release()
            self.acquire(again=True)

    @abstractmethod
    def free_sql(self) -> tuple[str, dict[str, object]]:
        """A statement that releases the lock on our session before it is dropped: a
        closed session's backend ends after the client has moved on, and until then the
        lock would refuse the next run."""

    def release(self) -> None:
        if self._conn is not None:
            if self.pid is not None:
                with contextlib.suppress(SQLAlchemyError):
                    sql, params = self.free_sql()
                    self._conn.execute(sa.text(sql), params)
                    self._conn.commit()
            drop_session(self._conn)
        if self.pid is not None:
            self.dropped_holding(self.pid)
        self._conn, self.pid = None, None

    def dropped_holding(self, pid: int) -> None:
        """`pid`'s session, which held the lock, was dropped: ending, it may hold it a while."""
        self._lost.add(pid)

    def took(self, conn: sa.Connection, pid: int) -> None:
        """The lock is held by `pid`'s session from now on (the lost ones have ended)."""
        self._conn, self.pid = conn, pid
        self._lost.clear()

    def refusal(self, holder: int | None, *, again: bool) -> SinkError:
        """Why the lock was not taken: taking it again, a lost session of its own still
        ending (or the lock freed meanwhile) is transient; anything else is another run."""
        by = f" by {self.holder_noun} {holder}" if holder is not None else ""
        if again and holder is None:
            return SinkUnavailable(
                f"the lock of flow '{self.flow}' in {self.where} was released while being "
                "taken; taking it again"
            )
        if again and holder in self._lost:
            return SinkUnavailable(
                f"the lock of flow '{self.flow}' in {self.where} is still held by a lost "
                f"session of this run{by}; waiting for it to end"
            )
        lost = " since the database went away" if again else ""
        return FlowLocked(
            f"flow '{self.flow}' is already running (lock held in {self.where}{by}){lost}"
        )


class AdvisoryLock(SessionLock):
    """`pg_try_advisory_lock(hashtext(key))` (PostgreSQL)."""

    def __init__(self, engine: Engine, flow: str, key: str, where: str) -> None:
        super().__init__(engine, flow, where)
        self.key = key

    def try_take(self, conn: sa.Connection) -> tuple[int | None, int | None]:
        got, pid = conn.execute(
            sa.text("SELECT pg_try_advisory_lock(hashtext(:k)), pg_backend_pid()"),
            {"k": self.key},
        ).one()
        return (int(pid), None) if got else (None, _advisory_holder(conn, self.key))

    def held_sql(self) -> tuple[str, dict[str, object]]:
        return (
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid = :lock_pid AND objsubid = 1 AND ((classid::bigint << 32) | "
            "objid::bigint) = hashtext(:lock_key)::bigint)",
            {"lock_pid": self.pid, "lock_key": self.key},
        )

    def free_sql(self) -> tuple[str, dict[str, object]]:
        return "SELECT pg_advisory_unlock(hashtext(:k))", {"k": self.key}


def drop_session(conn: sa.Connection) -> None:
    """Close a lock's session, whatever state it is in (which releases its locks)."""
    with contextlib.suppress(SQLAlchemyError):
        conn.invalidate()
    with contextlib.suppress(SQLAlchemyError):
        conn.close()


@contextlib.contextmanager
def holding(lock: _Lock) -> Iterator[_Lock]:
    """Hold `lock` for the block (FlowLocked at once when another run holds it)."""
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()


def advisory_lock(
    engine: Engine, flow: str, key: str, where: str
) -> contextlib.AbstractContextManager[AdvisoryLock]:
    """Hold the flow's advisory lock for the block, or FlowLocked."""
    return holding(AdvisoryLock(engine, flow, key, where))


def _advisory_holder(conn: sa.Connection, key: str) -> int | None:
    """The backend holding the lock, as pg_locks says (None: released meanwhile)."""
    pid = conn.execute(
        sa.text(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) "
            "= hashtext(:k)::bigint LIMIT 1"
        ),
        {"k": key},
    ).scalar()
    conn.rollback()
    return None if pid is None else int(pid)


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


def writer_turn(database: str | None) -> contextlib.AbstractContextManager[object]:
    """The turn of this process's write transactions on DuckDB file `database` (none to
    take for a database that is not a file of this process's)."""
    if database is None:
        return contextlib.nullcontext()
    key = os.path.realpath(database)
    with _MEMORY_GUARD:
        return _WRITERS.setdefault(key, threading.RLock())


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
