"""The SQL warehouse: PostgreSQL (COPY + one transaction per chunk) or embedded DuckDB.

Every chunk write is ONE transaction: bulk-load the frame into a temporary staging
table, delete the chunk's scope from the target, insert the staged rows, record the chunk
(rows fetched and committed) and merge its window into the progress of every member.
The state therefore lives with the data: a crash at any point leaves either the whole
chunk or nothing.

Tables (in `schema` when given): one per dataset, named after it, with the kind's typed
columns and primary key; `tag_metadata` (the tag dimension); `historian_datasets`,
`historian_chunks`, `historian_progress` and `historian_schema_version`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from connectors.schema import (
    KEYS,
    KIND_ALARM_HISTORY,
    KIND_TAG_HISTORY,
    KIND_TAG_METADATA,
    SCHEMAS,
    frame_from_table,
    table_from_frame,
)
from connectors.timewindow import Window
from sinks.base import (
    ChunkRecord,
    ChunkScope,
    CountMismatch,
    FlowLocked,
    Progress,
    SinkError,
    SinkUnavailable,
    merge_windows,
)

log = logging.getLogger("historian.sql")
SCHEMA_VERSION = 1
METADATA_TABLE = "tag_metadata"


def _sql_type(field: pa.Field) -> str:
    kind = field.type
    if pa.types.is_timestamp(kind):
        return "TIMESTAMP WITH TIME ZONE"
    if pa.types.is_float64(kind):
        return "DOUBLE PRECISION"
    if pa.types.is_boolean(kind):
        return "BOOLEAN"
    if pa.types.is_int16(kind):
        return "SMALLINT"
    if pa.types.is_int64(kind):
        return "BIGINT"
    return "TEXT"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, OperationalError | DBAPIError) and getattr(
        exc, "connection_invalidated", False
    ):
        return True
    text = str(exc).lower()
    return any(
        needle in text
        for needle in (
            "connection refused",
            "server closed the connection",
            "terminating connection",
            "connection is closed",
            "could not connect",
            "connection reset",
            "the database system is starting up",
            "the database system is shutting down",
            "consuming input failed",
            "connection already closed",
        )
    )


class SqlWarehouse:
    """A SQL warehouse sink (implements `sinks.base.Sink`)."""

    def __init__(
        self,
        url: str,
        *,
        name: str = "warehouse",
        schema: str | None = None,
        connect_args: Mapping[str, object] | None = None,
    ) -> None:
        self.name = name
        self.url = sa.engine.make_url(url)
        self.schema = schema
        self.dialect = self.url.get_backend_name()
        if self.dialect not in ("postgresql", "duckdb"):
            raise SinkError(f"sink {name}: {self.dialect} is not supported (postgresql or duckdb)")
        args = dict(connect_args or {})
        if self.dialect == "postgresql":
            args.setdefault("connect_timeout", 10)
            args.setdefault("application_name", "historian")
        self._connect_args = args
        self._engine: Engine | None = None

    # -- plumbing ---------------------------------------------------------------------

    def describe(self) -> str:
        where = self.url.render_as_string(hide_password=True)
        return f"{where}" + (f" (schema {self.schema})" if self.schema else "")

    def _table(self, name: str) -> str:
        return f"{_quote(self.schema)}.{_quote(name)}" if self.schema else _quote(name)

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise SinkError(f"sink {self.name}: not open")
        return self._engine

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except (SinkError, CountMismatch):
            raise
        except SQLAlchemyError as exc:
            reason = " ".join(str(getattr(exc, "orig", exc) or exc).split())[:300]
            if _is_transient(exc):
                raise SinkUnavailable(
                    f"sink {self.name}: {doing}: database unavailable: {reason}"
                ) from None
            raise SinkError(f"sink {self.name}: {doing}: {reason}") from None
        except OSError as exc:
            raise SinkUnavailable(f"sink {self.name}: {doing}: {exc.strerror or exc}") from None

    def open(self) -> None:
        if self._engine is not None:
            return
        if self.dialect == "duckdb":
            database = self.url.database or ""
            if database and database != ":memory:":
                Path(database).parent.mkdir(parents=True, exist_ok=True)
        with self._errors("connect"):
            self._engine = sa.create_engine(
                self.url, connect_args=self._connect_args, pool_pre_ping=True
            )
            with self._engine.begin() as conn:
                self._create_state_tables(conn)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def check_writable(self) -> None:
        with self._errors("write check"), self.engine.begin() as conn:
            conn.execute(
                sa.text(f"UPDATE {self._table('historian_schema_version')} SET version = version")
            )

    def _create_state_tables(self, conn: Connection) -> None:
        if self.schema:
            conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {_quote(self.schema)}"))
        ts = "TIMESTAMP WITH TIME ZONE"
        statements = [
            f"CREATE TABLE IF NOT EXISTS {self._table('historian_schema_version')} (version INTEGER NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self._table('historian_datasets')} ("
            "dataset TEXT PRIMARY KEY, kind TEXT NOT NULL, attrs TEXT NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self._table('historian_chunks')} ("
            f"flow TEXT NOT NULL, chunk_id TEXT NOT NULL, dataset TEXT NOT NULL, "
            f"window_start {ts} NOT NULL, window_end {ts} NOT NULL, members INTEGER NOT NULL, "
            f"rows_fetched BIGINT NOT NULL, rows_committed BIGINT NOT NULL, committed_at {ts} NOT NULL, "
            "PRIMARY KEY (flow, chunk_id))",
            f"CREATE TABLE IF NOT EXISTS {self._table('historian_progress')} ("
            f"flow TEXT NOT NULL, member TEXT NOT NULL, window_start {ts} NOT NULL, "
            f"window_end {ts} NOT NULL, PRIMARY KEY (flow, member, window_start))",
        ]
        for statement in statements:
            conn.execute(sa.text(statement))
        version = conn.execute(
            sa.text(f"SELECT version FROM {self._table('historian_schema_version')}")
        ).fetchall()
        if not version:
            conn.execute(
                sa.text(f"INSERT INTO {self._table('historian_schema_version')} VALUES (:v)"),
                {"v": SCHEMA_VERSION},
            )
        self._ensure_table(conn, METADATA_TABLE, KIND_TAG_METADATA)

    def _ensure_table(self, conn: Connection, table: str, kind: str) -> None:
        """Create the dataset table, or add columns it lacks; refuse incompatible types."""
        schema = SCHEMAS[kind]
        existing = self._columns(conn, table)
        if not existing:
            columns = ", ".join(
                f"{_quote(f.name)} {_sql_type(f)}{'' if f.nullable else ' NOT NULL'}"
                for f in schema
            )
            key = ", ".join(_quote(k) for k in KEYS[kind])
            conn.execute(
                sa.text(
                    f"CREATE TABLE IF NOT EXISTS {self._table(table)} ({columns}, PRIMARY KEY ({key}))"
                )
            )
            return
        for field in schema:
            have = existing.get(field.name)
            if have is None:
                conn.execute(
                    sa.text(
                        f"ALTER TABLE {self._table(table)} ADD COLUMN {_quote(field.name)} {_sql_type(field)}"
                    )
                )
            elif not _compatible(have, _sql_type(field)):
                raise SinkError(
                    f"sink {self.name}: table {table} column {field.name} is {have}, "
                    f"expected {_sql_type(field).lower()}"
                )

    def _columns(self, conn: Connection, table: str) -> dict[str, str]:
        schema = self.schema or ("public" if self.dialect == "postgresql" else "main")
        rows = conn.execute(
            sa.text(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = :schema AND table_name = :table"
            ),
            {"schema": schema, "table": table},
        ).fetchall()
        return {str(name): str(kind).lower() for name, kind in rows}

    # -- locks ------------------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self, flow: str) -> Iterator[None]:
        if self.dialect == "duckdb":
            from sinks.locks import flow_flock

            database = self.url.database or "memory"
            lock_path = f"{database}.locks/{_safe_name(flow)}.lock"
            with flow_flock(lock_path, flow):
                yield
            return
        key = f"historian:{self.schema or ''}:{flow}"
        with self._errors("lock"):
            conn = self.engine.connect()
        try:
            with self._errors("lock"):
                got = conn.execute(
                    sa.text("SELECT pg_try_advisory_lock(hashtext(:k))"), {"k": key}
                ).scalar()
                conn.commit()
            if not got:
                raise FlowLocked(
                    f"flow '{flow}' is already running (advisory lock held in {self.describe()})"
                )
            try:
                yield
            finally:
                with contextlib.suppress(SQLAlchemyError):
                    conn.execute(sa.text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": key})
                    conn.commit()
        finally:
            with contextlib.suppress(SQLAlchemyError):
                conn.close()

    # -- writes -----------------------------------------------------------------------

    def _check_attrs(self, conn: Connection, scope: ChunkScope) -> None:
        attrs = json.dumps(dict(scope.attrs), sort_keys=True, default=str)
        row = conn.execute(
            sa.text(
                f"SELECT kind, attrs FROM {self._table('historian_datasets')} WHERE dataset = :d"
            ),
            {"d": scope.dataset},
        ).fetchone()
        if row is None:
            conn.execute(
                sa.text(f"INSERT INTO {self._table('historian_datasets')} VALUES (:d, :k, :a)"),
                {"d": scope.dataset, "k": scope.kind, "a": attrs},
            )
            return
        stored = json.loads(row[1])
        wanted = json.loads(attrs)
        if row[0] != scope.kind or stored != wanted:
            differences = sorted(
                key for key in set(stored) | set(wanted) if stored.get(key) != wanted.get(key)
            ) or ["kind"]
            key = differences[0]
            raise SinkError(
                f"sink {self.name}: dataset {scope.dataset} holds {key}={stored.get(key, row[0])!r}, "
                f"the flow writes {key}={wanted.get(key, scope.kind)!r}: use another dataset name "
                "or reset it"
            )

    def write(self, scope: ChunkScope, frame: pd.DataFrame, rows_fetched: int) -> int:
        table = (
            table_from_frame(frame, scope.kind) if len(frame) else SCHEMAS[scope.kind].empty_table()
        )
        _check_scope(table, scope)
        with self._errors(f"write chunk {scope.chunk_id}"), self.engine.begin() as conn:
            self._ensure_table(conn, scope.dataset, scope.kind)
            self._check_attrs(conn, scope)
            self._delete_scope(conn, scope)
            committed = self._insert(conn, scope.dataset, table)
            if committed != rows_fetched:
                raise CountMismatch(
                    f"sink {self.name}: chunk {scope.chunk_id} committed {committed} rows, "
                    f"fetched {rows_fetched}"
                )
            self._record(conn, scope, rows_fetched, committed)
        return committed

    def _delete_scope(self, conn: Connection, scope: ChunkScope) -> None:
        params: dict[str, Any] = {"start": scope.window.start, "end": scope.window.end}
        where = "ts >= :start AND ts < :end"
        if scope.kind == KIND_TAG_HISTORY:
            if self.dialect == "postgresql":
                where += " AND tag = ANY(:members)"
                params["members"] = list(scope.members)
                conn.execute(
                    sa.text(f"DELETE FROM {self._table(scope.dataset)} WHERE {where}"), params
                )
                return
            statement = sa.text(
                f"DELETE FROM {self._table(scope.dataset)} WHERE {where} AND tag IN :members"
            ).bindparams(sa.bindparam("members", expanding=True))
            params["members"] = list(scope.members)
            conn.execute(statement, params)
            return
        conn.execute(sa.text(f"DELETE FROM {self._table(scope.dataset)} WHERE {where}"), params)

    def _insert(self, conn: Connection, target: str, table: pa.Table) -> int:
        if table.num_rows == 0:
            return 0
        columns = ", ".join(_quote(name) for name in table.column_names)
        if self.dialect == "duckdb":
            raw = conn.connection.dbapi_connection
            view = f"historian_stage_{os.getpid()}_{id(table)}"
            raw.register(view, table)  # type: ignore[union-attr]
            try:
                result = conn.exec_driver_sql(
                    f"INSERT INTO {self._table(target)} ({columns}) SELECT {columns} FROM {_quote(view)}"
                )
                count = result.rowcount
            finally:
                raw.unregister(view)  # type: ignore[union-attr]
            return int(count if count is not None and count >= 0 else table.num_rows)
        stage = "historian_stage"
        conn.exec_driver_sql(
            f"CREATE TEMP TABLE IF NOT EXISTS {stage} (LIKE {self._table(target)} INCLUDING DEFAULTS) "
            "ON COMMIT DROP"
        )
        buffer = io.BytesIO()
        pacsv.write_csv(
            table,
            buffer,
            pacsv.WriteOptions(include_header=False, quoting_style="all_valid"),
        )
        raw_conn: Any = conn.connection.dbapi_connection
        with (
            raw_conn.cursor() as cursor,
            cursor.copy(f"COPY {stage} ({columns}) FROM STDIN WITH (FORMAT csv)") as copy,
        ):
            data = buffer.getbuffer()
            step = 1 << 20
            for offset in range(0, len(data), step):
                copy.write(data[offset : offset + step])
        result = conn.exec_driver_sql(
            f"INSERT INTO {self._table(target)} ({columns}) SELECT {columns} FROM {stage}"
        )
        conn.exec_driver_sql(f"DROP TABLE {stage}")
        return int(result.rowcount)

    def _record(self, conn: Connection, scope: ChunkScope, fetched: int, committed: int) -> None:
        now = datetime.now(UTC)
        chunks = self._table("historian_chunks")
        conn.execute(
            sa.text(f"DELETE FROM {chunks} WHERE flow = :f AND chunk_id = :c"),
            {"f": scope.flow, "c": scope.chunk_id},
        )
        conn.execute(
            sa.text(f"INSERT INTO {chunks} VALUES (:f, :c, :d, :s, :e, :m, :rf, :rc, :t)"),
            {
                "f": scope.flow,
                "c": scope.chunk_id,
                "d": scope.dataset,
                "s": scope.window.start,
                "e": scope.window.end,
                "m": len(scope.members),
                "rf": fetched,
                "rc": committed,
                "t": now,
            },
        )
        self._merge_progress(conn, scope.flow, scope.members, scope.window)

    def _merge_progress(
        self, conn: Connection, flow: str, members: Sequence[str], window: Window
    ) -> None:
        progress = self._table("historian_progress")
        select = sa.text(
            f"SELECT member, window_start, window_end FROM {progress} WHERE flow = :f "
            "AND member IN :members AND window_end >= :s AND window_start <= :e"
        ).bindparams(sa.bindparam("members", expanding=True))
        touching: dict[str, list[Window]] = {member: [window] for member in members}
        for member, start, end in conn.execute(
            select, {"f": flow, "members": list(members), "s": window.start, "e": window.end}
        ):
            touching[member].append(Window(_aware(start), _aware(end)))
        delete = sa.text(
            f"DELETE FROM {progress} WHERE flow = :f AND member IN :members "
            "AND window_end >= :s AND window_start <= :e"
        ).bindparams(sa.bindparam("members", expanding=True))
        conn.execute(
            delete, {"f": flow, "members": list(members), "s": window.start, "e": window.end}
        )
        rows = [
            {"f": flow, "m": member, "s": merged.start, "e": merged.end}
            for member, windows in touching.items()
            for merged in merge_windows(windows)
        ]
        conn.execute(sa.text(f"INSERT INTO {progress} VALUES (:f, :m, :s, :e)"), rows)

    def write_metadata(self, frame: pd.DataFrame) -> int:
        if frame.empty:
            return 0
        table = table_from_frame(frame, KIND_TAG_METADATA)
        with self._errors("write tag metadata"), self.engine.begin() as conn:
            statement = sa.text(
                f"DELETE FROM {self._table(METADATA_TABLE)} WHERE node = :n AND tag IN :tags"
            ).bindparams(sa.bindparam("tags", expanding=True))
            for node in set(table.column("node").to_pylist()):
                tags = [
                    t
                    for n, t in zip(
                        table.column("node").to_pylist(),
                        table.column("tag").to_pylist(),
                        strict=True,
                    )
                    if n == node
                ]
                for start in range(0, len(tags), 5000):
                    conn.execute(statement, {"n": node, "tags": tags[start : start + 5000]})
            return self._insert(conn, METADATA_TABLE, table)

    # -- state ------------------------------------------------------------------------

    def progress(self, flow: str) -> Progress:
        with self._errors("read progress"), self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT member, window_start, window_end FROM {self._table('historian_progress')} "
                    "WHERE flow = :f ORDER BY member, window_start"
                ),
                {"f": flow},
            ).fetchall()
        completed: dict[str, list[Window]] = {}
        for member, start, end in rows:
            completed.setdefault(member, []).append(Window(_aware(start), _aware(end)))
        return Progress(flow, {m: merge_windows(w) for m, w in completed.items()})

    def chunk_log(self, flow: str, limit: int = 100) -> list[ChunkRecord]:
        with self._errors("read chunk log"), self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT chunk_id, window_start, window_end, members, rows_fetched, rows_committed, "
                    f"committed_at FROM {self._table('historian_chunks')} WHERE flow = :f "
                    "ORDER BY committed_at DESC LIMIT :n"
                ),
                {"f": flow, "n": limit},
            ).fetchall()
        return [
            ChunkRecord(
                flow, cid, Window(_aware(s), _aware(e)), int(m), int(rf), int(rc), _aware(t)
            )
            for cid, s, e, m, rf, rc, t in rows
        ]

    def flows(self) -> list[str]:
        with self._errors("read flows"), self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT DISTINCT flow FROM {self._table('historian_progress')} ORDER BY flow"
                )
            ).fetchall()
        return [str(row[0]) for row in rows]

    def reset(self, flow: str, member: str | None = None) -> int:
        with self._errors("reset"), self.engine.begin() as conn:
            params = {"f": flow, "m": member}
            condition = "flow = :f" + (" AND member = :m" if member is not None else "")
            removed = conn.execute(
                sa.text(f"DELETE FROM {self._table('historian_progress')} WHERE {condition}"),
                params,
            ).rowcount
            if member is None:
                removed += conn.execute(
                    sa.text(f"DELETE FROM {self._table('historian_chunks')} WHERE flow = :f"),
                    params,
                ).rowcount
        return int(removed)

    def read(self, dataset: str, kind: str) -> pd.DataFrame:
        schema = SCHEMAS[kind]
        with self._errors("read"), self.engine.connect() as conn:
            if not self._columns(conn, dataset):
                return frame_from_table(schema.empty_table())
            columns = ", ".join(_quote(name) for name in schema.names)
            order = ", ".join(_quote(k) for k in KEYS[kind])
            result = conn.execute(
                sa.text(f"SELECT {columns} FROM {self._table(dataset)} ORDER BY {order}")
            )
            rows = result.fetchall()
        arrays = []
        for index, field in enumerate(schema):
            values = [row[index] for row in rows]
            if pa.types.is_timestamp(field.type):
                values = [_aware(v) if v is not None else None for v in values]
            arrays.append(pa.array(values, type=field.type))
        return frame_from_table(pa.Table.from_arrays(arrays, schema=schema))


def _aware(moment: Any) -> datetime:
    value: datetime = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _compatible(have: str, want: str) -> bool:
    want = want.lower()
    aliases = {
        "timestamp with time zone": {"timestamp with time zone", "timestamptz"},
        "double precision": {"double precision", "double", "float8"},
        "boolean": {"boolean", "bool"},
        "smallint": {"smallint", "int2"},
        "bigint": {"bigint", "int8"},
        "text": {"text", "varchar", "character varying"},
    }
    return have in aliases.get(want, {want})


def _safe_name(flow: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in flow)[:100]


def _check_scope(table: pa.Table, scope: ChunkScope) -> None:
    """Rows outside the chunk's scope would escape its replace: refuse them."""
    if table.num_rows == 0:
        return
    import pyarrow.compute as pc

    ts = table.column("ts").cast(pa.int64())
    inside = pc.and_(pc.greater_equal(ts, scope.window.start_ms), pc.less(ts, scope.window.end_ms))
    if scope.kind == KIND_TAG_HISTORY:
        inside = pc.and_(
            inside, pc.is_in(table.column("tag"), value_set=pa.array(list(scope.members)))
        )
    if not pc.all(inside).as_py():
        raise SinkError(f"chunk {scope.chunk_id}: rows outside its scope (tags or window)")
    if scope.kind == KIND_ALARM_HISTORY:
        return
