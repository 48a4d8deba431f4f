"""The SQL warehouse: PostgreSQL (binary COPY, one transaction per chunk) or embedded DuckDB.

Every chunk write is ONE transaction: delete the chunk's scope from the target, bulk-load
the frame (PostgreSQL: binary COPY; DuckDB: a registered Arrow view), record the chunk
(rows fetched and committed), merge its window into the progress of every member, and
check the count. The state therefore lives with the data: a crash or a dropped connection
at any point leaves either the whole chunk or nothing, and a re-run replaces instead of
adding.

PostgreSQL takes two chunk writes at once (`write_concurrency`, used by the runner): each
is still one transaction on its own connection, with a disjoint scope. What they share is
ordered: a dataset's facts are registered once, before its first chunk, and the progress
merges take turns under a per-flow transaction-scoped advisory lock, taken after the bulk
load. Why: a chunk's write is mostly the server inserting into the key's B-tree on one
backend; a second chunk keeps the other core busy (bench/bench_sql.py).

Tables (in `schema` when given, created if missing) are described in sinks/sql/tables.py;
loading in sinks/sql/load.py and sinks/sql/pg_copy.py; locks in sinks/sql/locks.py.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from connectors.schema import (
    KEYS,
    KIND_ALARM_HISTORY,
    KIND_TAG_HISTORY,
    KIND_TAG_METADATA,
    SCHEMAS,
    Rows,
    as_table,
    frame_from_table,
)
from connectors.timewindow import Window
from sinks.base import (
    ChunkRecord,
    ChunkScope,
    CountMismatch,
    Progress,
    SharedWindows,
    SinkError,
    SinkUnavailable,
    merge_windows,
)
from sinks.identity import differences, identity
from sinks.scope import check_scope
from sinks.sql import mysql as sql_mysql
from sinks.sql.coverage import SqlCoverage
from sinks.sql.dialects import dialect_of, quote
from sinks.sql.errors import (
    duckdb_holder,
    is_database_error,
    is_duplicate_key,
    is_transient,
    one_line,
)
from sinks.sql.load import (
    copy_binary,
    load_duckdb,
    scalar_list,
    select_arrow,
    upsert_postgres,
)
from sinks.sql.locks import (
    AdvisoryLock,
    advisory_key,
    advisory_lock,
    file_lock,
    lock_file_path,
    memory_lock,
)
from sinks.sql.pg_copy import dense_codes
from sinks.sql.tables import (
    CHUNKS_TABLE,
    DATASETS_TABLE,
    METADATA_TABLE,
    PROGRESS_TABLE,
    SERIES_TABLE,
    VERSION_TABLE,
    Layout,
    Storage,
    check_dataset_name,
)

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
        self._locks: dict[str, AdvisoryLock | sql_mysql.NamedLock] = {}
        # Masked in every message: the URL's password and libpq's PGPASSWORD.
        self._secrets = tuple(
            s for s in (parsed.password, os.environ.get("PGPASSWORD")) if isinstance(s, str) and s
        )
        self._engine: Engine | None = None
        self._ready: dict[str, Storage] = {}
        self._series: dict[tuple[str, str], int] = {}
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
        """Connect and create the state tables. A DuckDB file another process writes
        (DuckDB allows one writing process) is waited for, up to `busy_wait_s`, with one
        warning naming the holder; past that, or with no wait, the lock error as it is."""
        if self._engine is not None:
            return
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
                with engine.begin() as conn:
                    self._ddl_lock(conn)
                    self.layout.ensure_state(conn)
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
        (`historian check`): a DuckDB file is not opened (opening creates it, and takes
        the one writer's lock), only its directory or file checked; PostgreSQL is asked
        for the privileges a run needs, in a transaction that is rolled back."""
        database = self._database_file
        if self.dialect == "duckdb":
            path = Path(database) if database else None
            if path is None:
                return "in memory"
            existing = next((p for p in (path, *path.parents) if p.exists()), Path(path.anchor))
            if existing == path:
                if not os.access(path, os.R_OK | os.W_OK):
                    raise SinkError(f"sink {self.name}: {path} is not writable")
                return "exists, writable"
            if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
                raise SinkError(f"sink {self.name}: {existing} is not a writable directory")
            return f"does not exist yet; {existing} is writable"
        engine = sa.create_engine(self.url, connect_args=self._connect_args)
        if self.dialect == "mysql":
            try:
                with self._errors("check"):
                    return sql_mysql.probe(engine, self.layout.catalog_schema)
            except SinkError as exc:
                raise SinkError(f"sink {self.name}: {exc}") from None
            finally:
                engine.dispose()
        try:
            with self._errors("check"), engine.connect() as conn:
                schema = self.layout.catalog_schema
                exists = conn.execute(
                    sa.text("SELECT count(*) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
                ).scalar()
                if exists:
                    allowed = conn.execute(
                        sa.text("SELECT has_schema_privilege(:s, 'CREATE')"), {"s": schema}
                    ).scalar()
                    found = f"schema {schema} exists"
                else:
                    allowed = conn.execute(
                        sa.text("SELECT has_database_privilege(current_database(), 'CREATE')")
                    ).scalar()
                    found = f"schema {schema} does not exist yet"
                conn.rollback()
        finally:
            engine.dispose()
        if not allowed:
            raise SinkError(
                f"sink {self.name}: no CREATE privilege "
                + (f"on schema {schema}" if exists else "in the database (to create the schema)")
            )
        return f"{found}, writable"

    def check_writable(self) -> None:
        with self._errors("write check"), self.engine.connect() as conn:
            conn.execute(
                sa.text(f"UPDATE {self.layout.table(VERSION_TABLE)} SET version = version")
            )
            if self.dialect == "postgresql":
                target = self.layout.catalog_schema
                allowed = conn.execute(
                    sa.text("SELECT has_schema_privilege(:s, 'CREATE')"), {"s": target}
                ).scalar()
                if not allowed:
                    raise SinkError(
                        f"sink {self.name}: no CREATE privilege on schema {target} "
                        "(needed for new dataset tables)"
                    )
            conn.rollback()

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
            with contextlib.ExitStack() as stack:
                with self._errors("lock"):
                    held: AdvisoryLock | sql_mysql.NamedLock
                    if self.dialect == "mysql":
                        held = stack.enter_context(
                            sql_mysql.named_lock(self.engine, flow, key, where)
                        )
                    else:
                        held = stack.enter_context(advisory_lock(self.engine, flow, key, where))
                self._locks[flow] = held
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
        table = _typed_table(rows, scope.kind)
        check_scope(scope, table, f"sink {self.name}")
        return self._retrying(lambda: self._write(scope, table, rows_fetched), flow=scope.flow)

    def _write(self, scope: ChunkScope, table: pa.Table, rows_fetched: int) -> int:
        storage = self._ensure_dataset(scope.dataset, scope.kind)
        self._register(scope)
        table = self._narrow(table) if storage.narrow else _plain(table)
        with self._errors(f"write chunk {scope.chunk_id}"), self.engine.begin() as conn:
            self._check_lock(conn, scope.flow)
            self._check_attrs(conn, scope)
            self._delete_scope(conn, scope, storage)
            committed = self._load(conn, scope, table, storage)
            if committed != rows_fetched:
                raise CountMismatch(
                    f"sink {self.name}: chunk {scope.chunk_id} committed {committed} rows, "
                    f"fetched {rows_fetched}: nothing committed"
                )
            self._record_chunk(conn, scope, rows_fetched, committed)
            self._merge_progress(conn, scope)
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
            with self._errors(f"prepare table {dataset}"), self.engine.begin() as conn:
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
            with self._errors(f"register dataset {scope.dataset}"), self.engine.begin() as conn:
                self._check_attrs(conn, scope)
            self._registered.add(key)

    def _narrow(self, table: pa.Table) -> pa.Table:
        """Tag history rows with (node, tag) replaced by their series_id (text column last)."""
        rest = _plain(table.select([n for n in table.column_names if n not in ("node", "tag")]))
        fixed = [n for n in rest.column_names if not _is_text(rest.schema.field(n).type)]
        text = [n for n in rest.column_names if n not in fixed]
        columns = [rest.column(n) for n in fixed + text]
        names = ["series_id", *fixed, *text]
        if table.num_rows == 0:
            return pa.table([pa.array([], pa.int32()), *columns], names=names)
        nodes = pc.dictionary_encode(table.column("node").combine_chunks())
        tags = pc.dictionary_encode(table.column("tag").combine_chunks())
        node_codes = np.asarray(nodes.indices, dtype=np.int64)
        tag_codes = np.asarray(tags.indices, dtype=np.int64)
        pair_codes, count = dense_codes(node_codes * len(tags.dictionary) + tag_codes)
        firsts = np.full(count, -1, np.int64)
        firsts[pair_codes[::-1]] = np.arange(len(pair_codes) - 1, -1, -1)  # first row of each
        node_names = nodes.dictionary.to_pylist()
        tag_names = tags.dictionary.to_pylist()
        pairs = [
            (node_names[node_codes[row]], tag_names[tag_codes[row]]) for row in firsts.tolist()
        ]
        with self._prepare:
            self._learn_series([p for p in pairs if p not in self._series])
        ids = np.array([self._series[p] for p in pairs], dtype=np.int32)
        return pa.table([pa.array(ids[pair_codes]), *columns], names=names)

    def _learn_series(self, pairs: list[tuple[str, str]]) -> None:
        """Add (node, tag) pairs to the series table if new, and remember their ids."""
        if not pairs:
            return
        series = self.layout.table(SERIES_TABLE)
        if self.dialect == "mysql":
            self._learn_series_mysql(series, pairs)
            return
        given = (
            'SELECT n COLLATE "C" AS node, t COLLATE "C" AS tag '
            "FROM unnest(CAST(:n AS TEXT[]), CAST(:t AS TEXT[])) AS given (n, t)"
        )
        params = {"n": [p[0] for p in pairs], "t": [p[1] for p in pairs]}
        with self._errors("register tags"), self.engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {series} (node, tag) {given} ORDER BY 1, 2 "
                    "ON CONFLICT (node, tag) DO NOTHING"
                ),
                params,
            )
            found = conn.execute(
                sa.text(
                    f"SELECT s.series_id, s.node, s.tag FROM {series} s "
                    f"JOIN ({given}) g ON g.node = s.node AND g.tag = s.tag"
                ),
                params,
            ).fetchall()
        for series_id, node, tag in found:
            self._series[(str(node), str(tag))] = int(series_id)
        missing = [p for p in pairs if p not in self._series]
        if missing:
            raise SinkError(f"sink {self.name}: tags not registered: {missing[0]!r}")

    def _learn_series_mysql(self, series: str, pairs: list[tuple[str, str]]) -> None:
        """`_learn_series` without arrays: an executemany upsert, then the pairs' ids read
        back by tag (the series table is small; its key is a digest, sinks/sql/dialects.py)."""
        ordered = sorted(set(pairs))
        with self._errors("register tags"), self.engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {series} (node, tag) VALUES (:n, :t) "
                    + self.sql.upsert(("node", "tag"), ())
                ),
                [{"n": node, "t": tag} for node, tag in ordered],
            )
            wanted = set(ordered)
            found = conn.execute(
                self.sql.text(f"SELECT series_id, node, tag FROM {series} WHERE tag IN :t", "t"),
                {"t": sorted({tag for _, tag in ordered})},
            ).fetchall()
        for series_id, node, tag in found:
            if (str(node), str(tag)) in wanted:
                self._series[(str(node), str(tag))] = int(series_id)
        missing = [p for p in pairs if p not in self._series]
        if missing:
            raise SinkError(f"sink {self.name}: tags not registered: {missing[0]!r}")

    def _check_attrs(self, conn: Connection, scope: ChunkScope) -> None:
        """Register the dataset's facts on first write; refuse a write whose facts differ."""
        wanted = identity(scope.attrs)
        datasets = self.layout.table(DATASETS_TABLE)
        select = sa.text(
            f"SELECT kind, {self.sql.json_text('attrs')} FROM {datasets} WHERE dataset = :d"
        )
        found = conn.execute(select, {"d": scope.dataset}).one_or_none()
        if found is None:
            # Only the first registration inserts; chunks (see `_register`) merely read.
            conn.execute(
                sa.text(
                    f"INSERT INTO {datasets} (dataset, kind, attrs, created_at) "
                    f"VALUES (:d, :k, {self.sql.json_param('a')}, :t) "
                    + self.sql.upsert(("dataset",), ())
                ),
                {
                    "d": scope.dataset,
                    "k": scope.kind,
                    "a": json.dumps(wanted),
                    "t": datetime.now(UTC),
                },
            )
            # Another process may have registered it first (the insert then did nothing):
            # MariaDB's snapshot predates that row, a locking read sees it.
            latest = sa.text(
                select.text + (" LOCK IN SHARE MODE" if self.dialect == "mysql" else "")
            )
            found = conn.execute(latest, {"d": scope.dataset}).one()
        kind, raw = found
        problems = differences(kind, json.loads(raw), scope.kind, scope.attrs)
        if problems:
            raise SinkError(
                f"sink {self.name}: dataset {scope.dataset} was written with other settings "
                f"({'; '.join(problems)}): use another dataset name or reset it"
            )

    def _delete_scope(self, conn: Connection, scope: ChunkScope, storage: Storage) -> None:
        """Delete the scope's rows: its node's, of its members, in its window."""
        target = storage.target
        params: dict[str, Any] = {"s": scope.window.start, "e": scope.window.end, "n": scope.node}
        where = "ts >= :s AND ts < :e"
        if storage.narrow and self.dialect == "mysql":
            # The series' ids first: a subquery in a DELETE is run per row in MariaDB 10,
            # and the key of the rows leads with series_id (the window alone has no index).
            params["ids"] = scalar_list(
                conn,
                f"SELECT series_id FROM {self.layout.table(SERIES_TABLE)} "
                "WHERE node = :n AND tag IN :t",
                {"n": scope.node, "t": list(scope.members)},
                self.sql.text,
            )
            if not params["ids"]:
                return
            where += " AND series_id IN :ids"
        elif storage.narrow:
            # The node's series of the scope's tags (the key leads with series_id).
            params["members"] = list(scope.members)
            where += (
                " AND series_id = ANY(ARRAY(SELECT series_id FROM "
                f"{self.layout.table(SERIES_TABLE)} WHERE node = :n AND tag = ANY(:members)))"
            )
        else:
            # The key leads with node (tag history: then tag; alarms: then path).
            where += " AND node = :n"
            if scope.kind == KIND_TAG_HISTORY:
                params["members"] = list(scope.members)
                where += " AND " + self.sql.in_list("tag", "members")
        lists = ("ids",) if "ids" in params else ()
        if "members" in params and not storage.narrow:
            lists = ("members",)
        conn.execute(self.sql.text(f"DELETE FROM {target} WHERE {where}", *lists), params)

    def _load(self, conn: Connection, scope: ChunkScope, table: pa.Table, storage: Storage) -> int:
        target = storage.target
        key = KEYS[scope.kind]
        try:
            if self.dialect == "postgresql":
                return copy_binary(conn, target, table) if table.num_rows else 0
            if self.dialect == "mysql":
                return sql_mysql.load_data(conn, target, table)
            return load_duckdb(conn, target, table, key)
        except Exception as exc:
            if is_database_error(exc) and is_duplicate_key(exc):
                raise CountMismatch(
                    f"sink {self.name}: chunk {scope.chunk_id}: rows share one key "
                    f"({', '.join(key)}); fetched {table.num_rows}, nothing committed"
                ) from None
            raise

    def _record_chunk(
        self, conn: Connection, scope: ChunkScope, fetched: int, committed: int
    ) -> None:
        columns = (
            "flow, chunk_id, dataset, window_start, window_end, members, rows_fetched, "
            "rows_committed, committed_at"
        )
        upsert = self.sql.upsert(("flow", "chunk_id"), columns.split(", ")[2:])
        conn.execute(
            sa.text(
                f"INSERT INTO {self.layout.table(CHUNKS_TABLE)} ({columns}) "
                f"VALUES (:f, :c, :d, :s, :e, :m, :rf, :rc, :t) {upsert}"
            ),
            {
                "f": scope.flow,
                "c": scope.chunk_id,
                "d": scope.dataset,
                "s": scope.window.start,
                "e": scope.window.end,
                "m": len(scope.members),
                "rf": fetched,
                "rc": committed,
                "t": datetime.now(UTC),
            },
        )

    def _merge_progress(self, conn: Connection, scope: ChunkScope) -> None:
        """Set-based merge: read the touching windows of all members, replace them merged.

        Chunks of one flow may be written by concurrent transactions (see
        `write_concurrency`), and two of them can touch one stored window (a look-back
        re-reading inside it): each would replace it by its own merge and the second insert
        would collide. A transaction-scoped advisory lock per flow makes the merges take
        turns, each reading what the previous one committed (READ COMMITTED: a new snapshot
        per statement). It is taken after the bulk load, so only the short merge and the
        commit are serialised. The lock's key is the progress key, so shards of one key in
        other processes take turns too; MariaDB has no such lock inside a transaction, and
        reads the touching windows with a locking read instead.
        """
        progress = self.layout.table(PROGRESS_TABLE)
        if self.dialect == "postgresql":
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtext(:k))"),
                {"k": f"historian-progress:{self.layout.catalog_schema}:{scope.flow}"},
            )
        members = list(dict.fromkeys(scope.members))
        window = scope.window
        touching = (
            f"flow = :f AND {self.sql.in_list('member', 'm')} "
            "AND window_end >= :s AND window_start <= :e"
        )
        params = {"f": scope.flow, "m": members, "s": window.start, "e": window.end}
        windows: dict[str, list[Window]] = {member: [window] for member in members}
        for member, start, end in conn.execute(
            self.sql.text(
                f"SELECT member, window_start, window_end FROM {progress} WHERE {touching}"
                # MariaDB: a locking read, so that merges of one key in other processes
                # (shards) take turns and each reads what the previous one committed.
                + (" FOR UPDATE" if self.dialect == "mysql" else ""),
                "m",
            ),
            params,
        ):
            windows[member].append(Window(_aware(start), _aware(end)))
        conn.execute(self.sql.text(f"DELETE FROM {progress} WHERE {touching}", "m"), params)
        rows = [(m, w) for m, found in windows.items() for w in merge_windows(found)]
        if self.dialect == "mysql":  # no arrays to unnest: one executemany
            conn.execute(
                sa.text(
                    f"INSERT INTO {progress} (flow, member, window_start, window_end) "
                    "VALUES (:f, :m, :s, :e)"
                ),
                [{"f": scope.flow, "m": m, "s": w.start, "e": w.end} for m, w in rows],
            )
            return
        conn.execute(
            sa.text(
                f"INSERT INTO {progress} (flow, member, window_start, window_end) "
                "SELECT :f, unnest(CAST(:m AS TEXT[])), unnest(CAST(:s AS TIMESTAMPTZ[])), "
                "unnest(CAST(:e AS TIMESTAMPTZ[]))"
            ),
            {
                "f": scope.flow,
                "m": [m for m, _ in rows],
                "s": [w.start for _, w in rows],
                "e": [w.end for _, w in rows],
            },
        )

    def write_metadata(self, frame: pd.DataFrame) -> int:
        if frame.empty:
            return 0
        unique = frame.drop_duplicates(subset=list(KEYS[KIND_TAG_METADATA]), keep="last")
        table = _typed_table(unique, KIND_TAG_METADATA)
        target = self.layout.table(METADATA_TABLE)
        key = KEYS[KIND_TAG_METADATA]

        def upsert() -> int:
            with self._errors("write tag metadata"), self.engine.begin() as conn:
                if self.dialect == "postgresql":
                    return upsert_postgres(conn, target, table, key)
                if self.dialect == "mysql":
                    return sql_mysql.upsert(conn, target, table, key)
                return load_duckdb(conn, target, table, key)

        return self._retrying(upsert)

    # -- state ------------------------------------------------------------------------

    def progress(self, flow: str) -> Progress:
        return self._retrying(lambda: self._progress(flow))

    def _progress(self, flow: str) -> Progress:
        with self._errors("read progress"), self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT member, window_start, window_end FROM "
                    f"{self.layout.table(PROGRESS_TABLE)} WHERE flow = :f "
                    "ORDER BY member, window_start"
                ),
                {"f": flow},
            ).fetchall()
        completed: dict[str, list[Window]] = {}
        for member, start, end in rows:
            completed.setdefault(member, []).append(Window(_aware(start), _aware(end)))
        shared = SharedWindows()
        return Progress(flow, {m: shared.merged(w) for m, w in completed.items()})

    def chunk_log(self, flow: str, limit: int = 100) -> list[ChunkRecord]:
        return self._retrying(lambda: self._chunk_log(flow, limit))

    def _chunk_log(self, flow: str, limit: int) -> list[ChunkRecord]:
        with self._errors("read chunk log"), self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT chunk_id, window_start, window_end, members, rows_fetched, "
                    f"rows_committed, committed_at FROM {self.layout.table(CHUNKS_TABLE)} "
                    "WHERE flow = :f ORDER BY committed_at DESC, chunk_id LIMIT :n"
                ),
                {"f": flow, "n": max(0, int(limit))},
            ).fetchall()
        return [
            ChunkRecord(
                flow, str(cid), Window(_aware(s), _aware(e)), int(m), int(rf), int(rc), _aware(t)
            )
            for cid, s, e, m, rf, rc, t in rows
        ]

    def flows(self) -> list[str]:
        with self._errors("read flows"), self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT flow FROM {self.layout.table(PROGRESS_TABLE)} UNION "
                    f"SELECT flow FROM {self.layout.table(CHUNKS_TABLE)} ORDER BY flow"
                )
            ).fetchall()
        return [str(row[0]) for row in rows]

    def reset(self, flow: str, member: str | None = None) -> int:
        condition = "flow = :f" + (" AND member = :m" if member is not None else "")
        tables = [(PROGRESS_TABLE, condition)]
        if member is None:
            tables.append((CHUNKS_TABLE, "flow = :f"))
        removed = 0
        with self._errors("reset"), self.engine.begin() as conn:
            for table, where in tables:
                removed += self._delete(
                    conn,
                    f"DELETE FROM {self.layout.table(table)} WHERE {where}",
                    {"f": flow, "m": member},
                )
        return removed

    def _delete(self, conn: Connection, sql: str, params: dict[str, Any]) -> int:
        """Run a DELETE; how many rows it removed (RETURNING where the dialect has it:
        DuckDB reports no rowcount; MySQL has no DELETE ... RETURNING)."""
        if not self.sql.delete_returning:
            return int(conn.execute(sa.text(sql), params).rowcount)
        return len(conn.execute(sa.text(sql + " RETURNING 1"), params).fetchall())

    def forget_after(self, flow: str, moment: datetime) -> int:
        """Cut the flow's progress at `moment` and drop the chunk records of windows ending
        after it, in one transaction; returns the chunk records dropped."""
        progress = self.layout.table(PROGRESS_TABLE)
        params = {"f": flow, "t": moment.astimezone(UTC)}
        with self._errors("forget progress"), self.engine.begin() as conn:
            conn.execute(
                sa.text(f"DELETE FROM {progress} WHERE flow = :f AND window_start >= :t"), params
            )
            conn.execute(
                sa.text(
                    f"UPDATE {progress} SET window_end = :t "
                    "WHERE flow = :f AND window_start < :t AND window_end > :t"
                ),
                params,
            )
            return self._delete(
                conn,
                f"DELETE FROM {self.layout.table(CHUNKS_TABLE)} WHERE flow = :f AND window_end > :t",
                params,
            )

    def compact(self, dataset: str) -> int:
        """Nothing to merge: the database keeps its own storage (see `Sink.compact`)."""
        check_dataset_name(dataset)
        return 0

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


def _typed_table(rows: Rows, kind: str) -> pa.Table:
    """The rows as an Arrow table of the kind's exact schema, or a one-line SinkError."""
    if not len(rows):
        return SCHEMAS[kind].empty_table()
    try:
        table = as_table(rows)
        # Text columns may come dictionary-encoded (tag names, repeated on every row): they
        # stay so, as the narrow load wants codes anyway; plain text stays plain.
        target = pa.schema(
            [
                f.with_type(table.schema.field(f.name).type)
                if f.name in table.column_names
                and _is_text(f.type)
                and _is_text_dictionary(table.schema.field(f.name).type)
                else f
                for f in SCHEMAS[kind]
            ]
        )
        return table.select(target.names).cast(target)
    except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise SinkError(f"frame does not match the {kind} schema: {reason}") from None


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or _is_text_dictionary(kind)


def _is_text_dictionary(kind: pa.DataType) -> bool:
    if not pa.types.is_dictionary(kind):
        return False
    return bool(pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type))


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary-encoded columns decoded (what the wide tables and DuckDB are loaded from)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type):
            table = table.set_column(i, f.name, table.column(i).cast(f.type.value_type))
    return table


def _aware(moment: Any) -> datetime:
    """A driver's timestamp as an aware UTC datetime."""
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment)
    if not isinstance(moment, datetime):
        raise SinkError(f"unexpected timestamp value {type(moment).__name__}")
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
