"""The SQL warehouse sink: PostgreSQL (binary COPY), MariaDB/MySQL (LOAD DATA) or DuckDB.

Every chunk write is ONE transaction (sinks/sql/chunk.py, and the chunk's ledger rows:
sinks/sql/coverage.py `write_ledger`): the state lives with the data,
so a crash or a dropped connection at any point leaves either the whole chunk or nothing,
and a re-run replaces instead of adding. This class keeps what lives between calls (the
engine, the flow locks, the datasets prepared, the series ids learned) and the policy
around every call (database errors made one line; writes and reads tried again while the
database is away). The statements live beside it, one job to a module:

    chunk.py      one chunk's transaction: replace its scope, record it, merge progress
    state.py      the run state: chunk records and progress windows
    datasets.py   each dataset's kind and identity, fixed by its first write
    series.py     (node, tag) <-> series_id of the narrow tag-history layout
    rows.py       the rows as the Arrow tables the loads take
    probe.py      whether a run could write here (`historian check`)
    tables.py     the tables; load.py, pg_copy.py, mysql.py the loads; locks.py the flow
                  locks; dialects.py what each database spells its own way

PostgreSQL takes two chunk writes at once (`write_concurrency`, used by the runner): each
is still one transaction on its own connection, with a disjoint scope. What they share is
ordered: a dataset's facts are registered once, before its first chunk, and the progress
merges take turns under a per-flow transaction-scoped advisory lock, taken after the bulk
load. Why: a chunk's write is mostly the server inserting into the key's B-tree on one
backend; a second chunk keeps the other core busy (bench/bench_sql.py).

Tag history in PostgreSQL is loaded narrow: (node, tag) becomes the integer `series_id`
of `historian_series` (looked up once per open sink and pair, new pairs added in a short
transaction of their own, before the chunk's), and the rows are binary-COPied into
`historian_rows_<dataset>`, keyed by (series_id, ts, seq); users read the view named like
the dataset, which has the tag history columns and keeps (node, tag, ts, seq) unique
(the argument is in sinks/sql/tables.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import pandas as pd
import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from connectors.schema import (
    KEYS,
    KIND_ALARM_HISTORY,
    KIND_TAG_HISTORY,
    KIND_TAG_METADATA,
    SCHEMAS,
    Rows,
    frame_from_table,
    last_per_key,
)
from connectors.timewindow import Window
from sinks.base import (
    ChunkRecord,
    ChunkScope,
    Progress,
    SinkError,
    SinkUnavailable,
    Verified,
)
from sinks.identity import identity
from sinks.ledger import ledger_rows
from sinks.scope import check_scope
from sinks.sql import mysql as sql_mysql
from sinks.sql import state
from sinks.sql.chunk import replace_chunk
from sinks.sql.coverage import SqlCoverage, ensure_ledger, read_ledger, write_ledger
from sinks.sql.datasets import check_facts
from sinks.sql.dialects import dialect_of, quote
from sinks.sql.errors import duckdb_holder, is_database_error, is_transient, one_line
from sinks.sql.load import load_duckdb, select_arrow, upsert_postgres
from sinks.sql.locks import (
    SessionLock,
    advisory_key,
    advisory_lock,
    file_lock,
    lock_file_path,
    memory_lock,
    writer_turn,
)
from sinks.sql.probe import probe_file, probe_postgres
from sinks.sql.rows import narrow, plain, series_pairs, typed_table
from sinks.sql.series import SeriesIds
from sinks.sql.tables import (
    METADATA_TABLE,
    Layout,
    Storage,
    check_dataset_name,
)
from sinks.verify.sql import SqlVerifier

_JITTER = random.Random()  # not the global generator, which callers may be drawing from

log = logging.getLogger("historian.sql")
HISTORY_KINDS = (KIND_TAG_HISTORY, KIND_ALARM_HISTORY)
# A write or read that finds the database gone (restarting, connection terminated) is
# tried again after 0.25 s, 0.5 s, 1 s ... at most 5 s apart (each less a random part),
# for `retry_s` seconds in all: a restart takes seconds; a database still away after a
# minute is an outage to report, not to wait out.
RETRY_S = 60.0
RETRY_FIRST_DELAY_S = 0.25
RETRY_MAX_DELAY_S = 5.0
T = TypeVar("T")
P = ParamSpec("P")


class SqlWarehouse:
    """A SQL warehouse sink (implements `sinks.base.Sink`)."""

    def __init__(
        self,
        url: str,
        *,
        name: str = "warehouse",
        schema: str | None = None,
        connect_args: Mapping[str, object] | None = None,
        writers: int = 2,
        retry_s: float | None = None,
        busy_wait_s: float = 0.0,
    ) -> None:
        self.name = name
        try:
            parsed = sa.engine.make_url(url)
        except sa.exc.ArgumentError:
            raise SinkError(f"sink {name}: not a database URL") from None
        self.sql, parsed = dialect_of(parsed, name)
        self.dialect = self.sql.family  # "postgresql", "duckdb" or "mysql" (also MariaDB)
        self.url = parsed
        self.schema = schema
        self.layout = Layout(self.sql, schema, self.sql.default_schema(parsed))
        self._connect_args = {**self.sql.connect_args(schema), **dict(connect_args or {})}
        self.retry_s = max(0.0, float(RETRY_S if retry_s is None else retry_s))
        # How long `open` waits for another process to let go of a DuckDB file.
        self.busy_wait_s = max(0.0, float(busy_wait_s))
        # flow -> the lock this sink holds for it
        self._locks: dict[str, SessionLock] = {}
        # Masked in every message: the URL's password and libpq's PGPASSWORD.
        self._secrets = tuple(
            s for s in (parsed.password, os.environ.get("PGPASSWORD")) if isinstance(s, str) and s
        )
        self._engine: Engine | None = None
        self._ready: dict[str, Storage] = {}
        self._series = SeriesIds(self.layout, name)
        self._registered: set[tuple[str, str]] = set()
        # Chunk writes the runner may run at once (each its own connection and transaction):
        # while the server inserts one chunk into the key's B-tree, the next is encoded and
        # copied by a second backend. DuckDB has one writer; MySQL's writes take turns
        # (sinks/sql/dialects.py).
        self.write_concurrency = max(1, writers) if self.sql.default_writers > 1 else 1
        self._prepare = threading.Lock()  # dataset DDL and series registration, once each

    def __repr__(self) -> str:
        return f"SqlWarehouse({self.describe()!r}, name={self.name!r})"

    # -- plumbing ---------------------------------------------------------------------

    def describe(self) -> str:
        where = self.url.render_as_string(hide_password=True)
        return where + (f" (schema {self.schema})" if self.schema else "")

    def coverage_reader(self, dataset: str, kind: str) -> SqlCoverage:
        """The dataset aggregated by the database for a report (`sinks.sql.coverage`)."""
        return SqlCoverage(self.engine, self.layout, str(self.dialect), dataset, kind)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise SinkError(f"sink {self.name}: not open")
        return self._engine

    @property
    def _database_file(self) -> str | None:
        database = self.url.database if self.dialect == "duckdb" else None
        return database if database and database != ":memory:" else None

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """Database and socket errors -> one-line SinkUnavailable (transient) or SinkError."""
        try:
            yield
        except SinkError:
            raise
        except Exception as exc:
            if not (is_database_error(exc) or isinstance(exc, OSError)):
                raise
            reason = one_line(exc, self._secrets)
            log.debug("sink %s: %s failed: %s", self.name, doing, reason)
            if is_transient(exc):
                raise SinkUnavailable(
                    f"sink {self.name}: {doing}: database unavailable: {reason}"
                ) from None
            raise SinkError(f"sink {self.name}: {doing}: {reason}") from None

    @contextlib.contextmanager
    def _begin(self, doing: str) -> Iterator[Connection]:
        """One write transaction, its errors made one line; on a DuckDB file, in this
        process's turn (`writer_turn`)."""
        with self._errors(doing), writer_turn(self._database_file), self.engine.begin() as conn:
            yield conn

    def _retrying(self, action: Callable[[], T], *, flow: str | None = None) -> T:
        """Run `action` (one transaction, or idempotent ones in turn) again while the
        database is away (`SinkUnavailable`), with backoff, for up to `retry_s` seconds;
        then a `SinkError` naming the attempts.

        Safe because every write is one transaction that replaces its scope: a write cut
        by a lost connection committed whole or not at all, and running it again leaves
        the same rows either way. Before another attempt for a flow, its lock is taken
        again if the server ended the session that held it.
        """
        if self.dialect == "duckdb":
            return action()  # embedded: nothing to reconnect to
        began = time.monotonic()
        attempt = 0
        while True:
            try:
                if attempt and flow is not None and flow in self._locks:
                    with self._errors("take the flow lock again"):
                        self._locks[flow].ensure()
                return action()
            except SinkUnavailable as exc:
                attempt += 1
                waited = time.monotonic() - began
                if waited >= self.retry_s:
                    if attempt == 1:
                        raise
                    # Not SinkUnavailable any more: retried here already, so a Prefect task
                    # retry must not retry it again (one retry layer per purpose).
                    raise SinkError(
                        f"{exc} (still after {attempt} attempts in {waited:.0f} s)"
                    ) from None
                delay = min(RETRY_MAX_DELAY_S, RETRY_FIRST_DELAY_S * 2 ** (attempt - 1))
                delay = min(delay * _JITTER.uniform(0.5, 1.0), self.retry_s - waited)
                log.warning("%s; trying again in %.1f s (attempt %d)", exc, delay, attempt + 1)
                time.sleep(delay)

    def open(self) -> None:
        """Connect and create the state tables, tried again while the database is away
        (refused, or the session ended while connecting: `_retrying`)."""
        if self._engine is None:
            self._retrying(self._open_when_free)

    def _open_when_free(self) -> None:
        """Open; a DuckDB file another process writes (DuckDB allows one writing process)
        is waited for, up to `busy_wait_s`, with one warning naming the holder; past that,
        or with no wait, the lock error as it is."""
        deadline = time.monotonic() + self.busy_wait_s
        delay = RETRY_FIRST_DELAY_S
        warned = False
        while True:
            try:
                self._open()
                return
            except SinkError as exc:
                holder = duckdb_holder(exc)
                left = deadline - time.monotonic()
                if holder is None or left <= 0:
                    raise
                if not warned:
                    warned = True
                    log.warning(
                        "sink %s: %s is being written by another process (pid %s); "
                        "waiting up to %s s",
                        self.name,
                        self._database_file,
                        holder[1],
                        f"{self.busy_wait_s:g}",
                    )
                time.sleep(min(delay, left))
                delay = min(delay * 2, RETRY_MAX_DELAY_S)

    def _open(self) -> None:
        database = self._database_file
        with self._errors("connect"):
            if database:
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            engine = sa.create_engine(
                self.url,
                connect_args=self._connect_args,
                pool_pre_ping=self.dialect != "duckdb",
            )
            try:
                with writer_turn(database), engine.begin() as conn:
                    self._ddl_lock(conn)
                    self.layout.ensure_state(conn)
                    ensure_ledger(conn, self.layout)
            except BaseException:
                engine.dispose()
                raise
        self._engine = engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        self._ready.clear()
        self._series.clear()
        self._registered.clear()

    def probe(self) -> str:
        """Whether the warehouse can be written, found without creating anything
        (`historian check`, sinks/sql/probe.py)."""
        if self.dialect == "duckdb":
            return probe_file(self._database_file, self.name)
        engine = sa.create_engine(self.url, connect_args=self._connect_args)
        try:
            if self.dialect == "mysql":
                try:
                    with self._errors("check"):
                        return sql_mysql.probe(engine, self.layout.catalog_schema)
                except SinkError as exc:
                    raise SinkError(f"sink {self.name}: {exc}") from None
            with self._errors("check"), engine.connect() as conn:
                return probe_postgres(conn, self.layout.catalog_schema, self.name)
        finally:
            engine.dispose()

    def _ddl_lock(self, conn: Connection) -> None:
        """Serialise CREATE/ALTER of this warehouse's tables across processes (PostgreSQL)."""
        if self.dialect == "postgresql":
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtext(:k))"),
                {"k": f"historian-ddl:{self.layout.catalog_schema}"},
            )

    # -- locks ------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, flow: str) -> Iterator[None]:
        if self.dialect != "duckdb":
            # MariaDB's named locks are server-wide: the database is part of the key.
            schema = self.layout.catalog_schema if self.dialect == "mysql" else self.schema
            key, where = advisory_key(flow, schema), self.describe()
            take = sql_mysql.named_lock if self.dialect == "mysql" else advisory_lock

            def enter(stack: contextlib.ExitStack) -> SessionLock:
                with self._errors("lock"):
                    return stack.enter_context(take(self.engine, flow, key, where))

            with contextlib.ExitStack() as stack:
                # A session ended while the lock is taken is retried; FlowLocked is not.
                self._locks[flow] = self._retrying(lambda: enter(stack))
                try:
                    yield
                finally:
                    self._locks.pop(flow, None)
            return
        database = self._database_file
        guard = (
            file_lock(lock_file_path(database, flow), flow)
            if database
            else memory_lock(f"{id(self)}:{flow}", flow)
        )
        with guard:
            yield

    # -- writes -----------------------------------------------------------------------

    def write(self, scope: ChunkScope, rows: Rows, rows_fetched: int) -> int:
        """Replace the chunk's scope and record it, in one transaction; tried again while
        the database is away (`_retrying`)."""
        check_dataset_name(scope.dataset)
        if scope.kind not in HISTORY_KINDS:
            raise SinkError(f"chunk {scope.chunk_id}: cannot write kind {scope.kind!r}")
        table = typed_table(rows, scope.kind)
        check_scope(scope, table, f"sink {self.name}")
        ledger = ledger_rows(scope, table)
        return self._retrying(
            lambda: self._write(scope, table, rows_fetched, ledger), flow=scope.flow
        )

    def _write(
        self, scope: ChunkScope, table: pa.Table, rows_fetched: int, ledger: pa.Table
    ) -> int:
        storage = self._ensure_dataset(scope.dataset, scope.kind)
        self._register(scope)
        table = self._narrow(table) if storage.narrow else plain(table)
        with self._begin(f"write chunk {scope.chunk_id}") as conn:
            self._check_lock(conn, scope.flow)
            committed = replace_chunk(
                conn, self.layout, scope, table, storage, rows_fetched, self.name
            )
            write_ledger(conn, self.layout, scope, ledger)  # the same transaction
            return committed

    def _check_lock(self, conn: Connection, flow: str) -> None:
        """Inside a write: does this sink still hold the flow's lock? A server restart ends
        the session holding it; the write then waits for `_retrying` to take it again."""
        lock = self._locks.get(flow)
        if lock is None:
            return
        sql, params = lock.held_sql()
        if not conn.execute(sa.text(sql), params).scalar():
            raise SinkUnavailable(
                f"sink {self.name}: the lock of flow '{flow}' was released by the database"
            )

    def _ensure_dataset(self, dataset: str, kind: str) -> Storage:
        """Create or migrate a dataset's table once per open sink, in its own transaction."""
        with self._prepare:
            storage = self._ready.get(dataset)
            if storage is not None:
                return storage
            with self._begin(f"prepare table {dataset}") as conn:
                self._ddl_lock(conn)
                storage = self.layout.ensure_dataset(conn, dataset, kind)
            self._ready[dataset] = storage
            return storage

    def _register(self, scope: ChunkScope) -> None:
        """Register (or check) the dataset's facts once per open sink, in a short transaction
        of its own: registered inside a chunk's transaction, a second chunk written at the
        same time would wait on that uncommitted row for the whole first chunk. Every chunk
        still checks them inside its own transaction (a read, then)."""
        key = (scope.dataset, json.dumps(identity(scope.attrs), sort_keys=True))
        with self._prepare:
            if key in self._registered:
                return
            with self._begin(f"register dataset {scope.dataset}") as conn:
                check_facts(conn, self.layout, scope, self.name)
            self._registered.add(key)

    def _narrow(self, table: pa.Table) -> pa.Table:
        """Tag history rows with (node, tag) replaced by their series_id, new pairs added to
        the series table first, in a short transaction of their own."""
        pairs, rows_pair = series_pairs(table)
        with self._prepare:
            new = self._series.unknown(pairs)
            if new:
                with self._begin("register tags") as conn:
                    self._series.learn(conn, new)
            ids = self._series.ids(pairs)
        return narrow(table, ids[rows_pair])

    def write_metadata(self, rows: Rows) -> int:
        if not len(rows):
            return 0
        unique = last_per_key(rows, KEYS[KIND_TAG_METADATA])
        table = typed_table(unique, KIND_TAG_METADATA)
        target = self.layout.table(METADATA_TABLE)
        key = KEYS[KIND_TAG_METADATA]

        def upsert() -> int:
            with self._begin("write tag metadata") as conn:
                if self.dialect == "postgresql":
                    return upsert_postgres(conn, target, table, key)
                if self.dialect == "mysql":
                    return sql_mysql.upsert(conn, target, table, key)
                return load_duckdb(conn, target, table, key)

        return self._retrying(upsert)

    # -- state ------------------------------------------------------------------------

    def progress(self, flow: str) -> Progress:
        return self._retrying(lambda: self._read("read progress", state.read_progress, flow))

    def chunk_log(self, flow: str, limit: int = 100) -> list[ChunkRecord]:
        return self._retrying(
            lambda: self._read("read chunk log", state.read_chunk_log, flow, limit)
        )

    def flows(self) -> list[str]:
        return self._read("read flows", state.read_flows)

    def _read(
        self,
        doing: str,
        reader: Callable[Concatenate[Connection, Layout, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """One read of the state tables, on a connection of its own."""
        with self._errors(doing), self.engine.connect() as conn:
            return reader(conn, self.layout, *args, **kwargs)

    def reset(self, flow: str, member: str | None = None) -> int:
        with self._begin("reset") as conn:
            return state.reset(conn, self.layout, flow, member)

    def forget_after(self, flow: str, moment: datetime) -> int:
        """Cut the flow's progress at `moment` and drop the chunk records of windows ending
        after it, in one transaction; returns the chunk records dropped."""
        with self._begin("forget progress") as conn:
            return state.forget_after(conn, self.layout, flow, moment)

    def verify(
        self, flow: str, node: str, window: Window | None = None, *, repair: bool = False
    ) -> Verified:
        """Every committed chunk's rows against what the tables hold (`sinks.verify.sql`);
        repairing forgets the damaged windows in one transaction."""
        verifier = SqlVerifier(self.layout, str(self.dialect))
        with self._begin(f"verify flow {flow!r}") as conn:
            found = verifier.verify(conn, flow, node, window)
            if repair and found.damages:
                found.forgotten = verifier.forget(conn, flow, found.damages)
        return found

    def read_ledger(self, dataset: str) -> pa.Table:
        """The dataset's completeness ledger (`historian_coverage`, sinks/sql/coverage.py)."""
        check_dataset_name(dataset)
        with self._errors(f"read the ledger of {dataset}"), self.engine.connect() as conn:
            return read_ledger(conn, self.layout, dataset)

    def read(self, dataset: str, kind: str) -> pd.DataFrame:
        schema = SCHEMAS[kind]
        name = METADATA_TABLE if kind == KIND_TAG_METADATA else dataset
        if kind != KIND_TAG_METADATA:
            check_dataset_name(dataset)
        with self._errors(f"read {name}"), self.engine.connect() as conn:
            if not self.layout.columns(conn, name):
                return frame_from_table(schema.empty_table())
            columns = ", ".join(
                self.sql.epoch_ms(f.name) if pa.types.is_timestamp(f.type) else quote(f.name)
                for f in schema
            )
            order = ", ".join(quote(k) for k in KEYS[kind])
            sql = f"SELECT {columns} FROM {self.layout.table(name)} ORDER BY {order}"
            table = select_arrow(conn, self.dialect, sql, schema)
        return frame_from_table(table)
