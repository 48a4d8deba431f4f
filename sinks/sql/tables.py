"""Warehouse DDL: the dataset tables (typed from connectors/schema.py) and the state tables.

Creation and migration are idempotent and run on `open()` (state tables) or on a
dataset's first write (its table). Migration only ever adds nullable columns; a column
whose type cannot hold the schema's values is an error, never silently converted.
Identifiers are always quoted; nothing but validated dataset names and fixed names reach
SQL text.

Tag history in PostgreSQL and MariaDB/MySQL (schema version 2) is stored narrow, behind a
view:

* `historian_series (series_id, node, tag)`: one row per (node, tag), `series_id` the
  primary key and `(node, tag)` UNIQUE, so the two name each other one to one. The sink
  only ever adds rows to it (never renames or deletes one).
* `historian_rows_<dataset>` (series_id, ts, seq, value, ...; stored widest column
  first, see `by_alignment`), PRIMARY KEY `(series_id, ts, seq)`.
* the view `<dataset>`: the rows joined to their series, with exactly the columns (and
  order) of the tag history schema: `node, tag, ts, seq, value, ...`.

The uniqueness users rely on is unchanged: two rows of the view with one (node, tag, ts,
seq) would have one series_id (the bijection above) and so one (series_id, ts, seq),
which the primary key forbids. Why: the key's B-tree is what bounds a load, and its
tuples shrink from two texts and a timestamp to 24 bytes, so the server does less work
per row (bench/bench_sql.py). There is deliberately no foreign key from the
rows to the series: its per-row check costs more than the whole insert; the series
table is append-only instead. Warehouses made by an earlier version keep their tag
history tables (a plain table named like the dataset, keyed by `(node, tag, ts, seq)`)
and keep being written that way; only new datasets get the narrow layout. DuckDB keeps
the plain table (its loads are not bound by an index in the same way). In MariaDB/MySQL
the rows table is clustered by its primary key, so a chunk (sorted by series and time)
is appended in key order, and `(node, tag)` of the series table is unique through its
digest column (sinks/sql/dialects.py: MySQL).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from connectors.schema import (
    KEYS,
    KIND_ALARM_HISTORY,
    KIND_TAG_HISTORY,
    KIND_TAG_METADATA,
    SCHEMAS,
)
from sinks.base import SinkError
from sinks.sql.dialects import Dialect, quote

SCHEMA_VERSION = 2  # 2: historian_series + narrow tag history behind a view
VERSION_TABLE = "historian_schema_version"
DATASETS_TABLE = "historian_datasets"
CHUNKS_TABLE = "historian_chunks"
PROGRESS_TABLE = "historian_progress"
METADATA_TABLE = "tag_metadata"
SERIES_TABLE = "historian_series"
STATE_TABLES = (
    VERSION_TABLE,
    DATASETS_TABLE,
    CHUNKS_TABLE,
    PROGRESS_TABLE,
    METADATA_TABLE,
    SERIES_TABLE,
    "historian_coverage",  # the completeness ledger (sinks/sql/coverage.py)
)
ROWS_PREFIX = "historian_rows_"
SERIES_KEY = ("series_id", "ts", "seq")
DATASET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
TS = "TIMESTAMP WITH TIME ZONE"

# Types each schema type accepts in an existing column (information_schema spelling,
# lower case, PostgreSQL and DuckDB). Wider integers hold narrower values.
_ACCEPTED = {
    "timestamp with time zone": {"timestamp with time zone", "timestamptz"},
    "double precision": {"double precision", "double", "float8"},
    "boolean": {"boolean", "bool"},
    "smallint": {"smallint", "int2", "integer", "int4", "bigint", "int8"},
    "bigint": {"bigint", "int8"},
    "text": {"text", "varchar", "character varying"},
    # MariaDB/MySQL spellings (sinks/sql/dialects.py: MySQL).
    "datetime(3)": {"datetime"},
    "longtext": {"longtext", "mediumtext", "text", "varchar"},
    "integer": {"integer", "int", "bigint"},
}
_ACCEPTED["double precision"] |= {"double"}
_ACCEPTED["boolean"] |= {"tinyint"}
_ACCEPTED["smallint"] |= {"int", "mediumint"}


def check_dataset_name(name: str) -> None:
    """Dataset names become table names: refuse anything but the validated config form."""
    if not DATASET_NAME.match(name) or name in STATE_TABLES or name.startswith(ROWS_PREFIX):
        raise SinkError(
            f"dataset name {name[:80]!r} is not usable as a table name "
            "([A-Za-z_][A-Za-z0-9_]{0,62}, not a historian_* state table)"
        )


def rows_table_name(dataset: str) -> str:
    """The table behind a narrow tag-history dataset's view (at most 63 characters)."""
    name = ROWS_PREFIX + dataset
    if len(name) <= 63:
        return name
    digest = hashlib.sha1(dataset.encode()).hexdigest()[:8]
    return f"{ROWS_PREFIX}{dataset[:39]}_{digest}"


@dataclass(frozen=True)
class Storage:
    """Where a dataset's rows are loaded: the plain table, or the narrow rows table."""

    target: str  # quoted, schema-qualified
    narrow: bool  # keyed by series_id (the view layout) rather than by (node, tag, ...)


def sql_type(field: pa.Field) -> str:
    """The PostgreSQL column type of an Arrow field (see `Dialect.column_type`)."""
    return Dialect().column_type(field)


def by_alignment(fields: list[pa.Field]) -> list[pa.Field]:
    """Fields widest fixed-width first, text last: PostgreSQL pads each column to its type's
    alignment, so this order stores a narrow tag-history row in 24 data bytes instead of 34
    (the heap, and the WAL that carries it, smaller: BENCHMARKS.md). Columns are always named in COPY and
    in the view, never taken by position."""

    def width(field: pa.Field) -> int:
        kind = field.type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        return int(kind.bit_width) // 8 if pa.types.is_primitive(kind) else 0

    return sorted(fields, key=lambda f: -width(f))


def compatible(have: str, want: str) -> bool:
    """Can an existing column of type `have` hold values of the schema type `want`?"""
    want = want.lower()
    return have.lower() in _ACCEPTED.get(want, {want})


@dataclass(frozen=True)
class Layout:
    """Where the warehouse's tables live and how to spell them for one dialect."""

    sql: Dialect
    schema: str | None
    default_schema: str  # where tables go without `schema` (the URL's database in MySQL)

    @property
    def dialect(self) -> str:
        return self.sql.family

    @property
    def catalog_schema(self) -> str:
        """The schema name information_schema reports for our tables."""
        return self.schema or self.default_schema

    def table(self, name: str) -> str:
        return f"{quote(self.schema)}.{quote(name)}" if self.schema else quote(name)

    def _text(self, key: bool = False) -> str:
        return self.sql.text_type(key)

    @property
    def json_type(self) -> str:
        return self.sql.json_type

    def column_ddl(self, field: pa.Field, key: bool) -> str:
        kind = self.sql.column_type(field)
        if kind == "TEXT":
            kind = self._text(key)
        return f"{quote(field.name)} {kind}{'' if field.nullable else ' NOT NULL'}"

    def create_table(
        self, name: str, columns: list[tuple[str, str]], key: tuple[str, ...], extra: str = ""
    ) -> str:
        """CREATE TABLE IF NOT EXISTS with (name, type-and-constraints) columns and a key
        (the dialect makes it unique: a primary key, or a digest of long text)."""
        elements = [f"{quote(n)} {t}" for n, t in columns]
        typed = [(n, t.split(" NOT NULL")[0].split(" PRIMARY KEY")[0]) for n, t in columns]
        elements += (self.sql.key_ddl(typed, key) if key else []) + ([extra] if extra else [])
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table(name)} ({', '.join(elements)})"
            + self.sql.table_options()
        )

    def state_ddl(self) -> list[str]:
        """CREATE statements of the state tables, in order."""
        if self.dialect == "mysql":
            return self._portable_state_ddl()
        key_text = self._text(key=True)
        return [
            f"CREATE TABLE IF NOT EXISTS {self.table(VERSION_TABLE)} ("
            f"version INTEGER NOT NULL, migrated_at {TS} NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.table(DATASETS_TABLE)} ("
            f"dataset TEXT PRIMARY KEY, kind TEXT NOT NULL, attrs {self.json_type} NOT NULL, "
            f"created_at {TS} NOT NULL)",
            f"CREATE TABLE IF NOT EXISTS {self.table(CHUNKS_TABLE)} ("
            f"flow TEXT NOT NULL, chunk_id TEXT NOT NULL, dataset TEXT NOT NULL, "
            f"window_start {TS} NOT NULL, window_end {TS} NOT NULL, members INTEGER NOT NULL, "
            "rows_fetched BIGINT NOT NULL, rows_committed BIGINT NOT NULL, "
            f"committed_at {TS} NOT NULL, PRIMARY KEY (flow, chunk_id))",
            f"CREATE TABLE IF NOT EXISTS {self.table(PROGRESS_TABLE)} ("
            f"flow TEXT NOT NULL, member {key_text} NOT NULL, window_start {TS} NOT NULL, "
            f"window_end {TS} NOT NULL, PRIMARY KEY (flow, member, window_start))",
            *(
                [
                    f"CREATE TABLE IF NOT EXISTS {self.table(SERIES_TABLE)} ("
                    "series_id INTEGER GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, "
                    f"node {key_text} NOT NULL, tag {key_text} NOT NULL, UNIQUE (node, tag))"
                ]
                if self.dialect == "postgresql"
                else []
            ),
        ]

    def _portable_state_ddl(self) -> list[str]:
        """The state tables as `create_table` spells them for the dialect (MySQL): the same
        columns as above, keys made unique the dialect's way."""
        ts, text, json = self.sql.timestamp_type, self._text(key=True), self.json_type
        need = " NOT NULL"
        return [
            self.create_table(
                VERSION_TABLE, [("version", "INTEGER" + need), ("migrated_at", ts + need)], ()
            ),
            self.create_table(
                DATASETS_TABLE,
                [
                    ("dataset", text + need),
                    ("kind", text + need),
                    ("attrs", json + need),
                    ("created_at", ts + need),
                ],
                ("dataset",),
            ),
            self.create_table(
                CHUNKS_TABLE,
                [
                    ("flow", text + need),
                    ("chunk_id", text + need),
                    ("dataset", text + need),
                    ("window_start", ts + need),
                    ("window_end", ts + need),
                    ("members", "INTEGER" + need),
                    ("rows_fetched", "BIGINT" + need),
                    ("rows_committed", "BIGINT" + need),
                    ("committed_at", ts + need),
                ],
                ("flow", "chunk_id"),
            ),
            self.create_table(
                PROGRESS_TABLE,
                [
                    ("flow", text + need),
                    ("member", text + need),
                    ("window_start", ts + need),
                    ("window_end", ts + need),
                ],
                ("flow", "member", "window_start"),
            ),
            self.create_table(
                SERIES_TABLE,
                [
                    ("series_id", "INTEGER NOT NULL AUTO_INCREMENT PRIMARY KEY"),
                    ("node", text + need),
                    ("tag", text + need),
                ],
                ("node", "tag"),
            ),
        ]

    def columns(self, conn: Connection, table: str) -> dict[str, str]:
        """Existing columns of a table and their lower-case types; empty when it is absent."""
        rows = conn.execute(
            sa.text(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = :schema AND table_name = :table"
            ),
            {"schema": self.catalog_schema, "table": table},
        ).fetchall()
        return {str(name): str(kind).lower() for name, kind in rows}

    def relation(self, conn: Connection, name: str) -> str | None:
        """'BASE TABLE', 'VIEW' (information_schema spelling) or None when absent."""
        found = conn.execute(
            sa.text(
                "SELECT table_type FROM information_schema.tables "
                "WHERE table_schema = :schema AND table_name = :table"
            ),
            {"schema": self.catalog_schema, "table": name},
        ).scalar()
        return None if found is None else str(found).upper()

    def ensure_dataset(self, conn: Connection, dataset: str, kind: str) -> Storage:
        """Create or migrate a dataset's storage; where its rows are loaded."""
        narrow = kind == KIND_TAG_HISTORY and self.dialect in ("postgresql", "mysql")
        if narrow and self.relation(conn, dataset) != "BASE TABLE":
            self._ensure_narrow(conn, dataset)
            return Storage(self.table(rows_table_name(dataset)), narrow=True)
        self.ensure_table(conn, dataset, kind)
        return Storage(self.table(dataset), narrow=False)

    def _ensure_narrow(self, conn: Connection, dataset: str) -> None:
        """The rows table (created, or missing columns added) and the view over it."""
        schema = SCHEMAS[KIND_TAG_HISTORY]
        rows = rows_table_name(dataset)
        fields = [f for f in schema if f.name not in ("node", "tag")]
        existing = self.columns(conn, rows)
        changed = not existing
        if not existing:
            series = pa.field("series_id", pa.int32(), nullable=False)
            columns = [
                (f.name, self.column_ddl(f, f.name in SERIES_KEY).split(" ", 1)[1])
                for f in by_alignment([series, *fields])
            ]
            conn.execute(sa.text(self.create_table(rows, columns, SERIES_KEY)))
        else:
            changed = self._add_missing(conn, rows, fields, existing)
        if changed or self.relation(conn, dataset) is None:
            picked = ", ".join(
                f"s.{quote(f.name)}" if f.name in ("node", "tag") else f"r.{quote(f.name)}"
                for f in schema
            )
            conn.execute(
                sa.text(
                    f"CREATE OR REPLACE VIEW {self.table(dataset)} AS SELECT {picked} "
                    f"FROM {self.table(rows)} r JOIN {self.table(SERIES_TABLE)} s "
                    "ON s.series_id = r.series_id"
                )
            )

    def _add_missing(
        self, conn: Connection, table: str, fields: list[pa.Field], existing: dict[str, str]
    ) -> bool:
        """Add the columns a table lacks (nullable); refuse wrong types. True if any added."""
        added = False
        for field in fields:
            have = existing.get(field.name)
            want = self.sql.column_type(field)
            if have is None:
                conn.execute(
                    sa.text(
                        f"ALTER TABLE {self.table(table)} ADD COLUMN {quote(field.name)} {want}"
                    )
                )
                added = True
            elif not compatible(have, want):
                raise SinkError(
                    f"table {table} column {field.name} is {have}, expected {want.lower()}: "
                    "migrate or drop it, or use another dataset name"
                )
        return added

    def ensure_table(self, conn: Connection, table: str, kind: str) -> None:
        """Create a typed table for `kind`, or add the columns it lacks; refuse wrong types."""
        schema = SCHEMAS[kind]
        key = KEYS[kind]
        existing = self.columns(conn, table)
        if not existing:
            columns = [(f.name, self.column_ddl(f, f.name in key).split(" ", 1)[1]) for f in schema]
            # MySQL: a chunk's scope is deleted by time (the key is a digest, see
            # sinks/sql/dialects.py), so the time needs an index of its own.
            extra = 'KEY ("ts")' if self.dialect == "mysql" and "ts" in key else ""
            conn.execute(sa.text(self.create_table(table, columns, key, extra)))
            if kind == KIND_ALARM_HISTORY and self.dialect == "postgresql":
                # Alarm scopes are replaced by time alone: the key's leading node/path
                # columns cannot serve that delete.
                digest = hashlib.sha1(table.encode()).hexdigest()[:8]
                index = quote(f"{table[:40]}_ts_{digest}")
                conn.execute(
                    sa.text(f"CREATE INDEX IF NOT EXISTS {index} ON {self.table(table)} (ts)")
                )
            return
        missing_keys = [k for k in key if k not in existing]
        if missing_keys:
            raise SinkError(
                f"table {table} exists without key column(s) {', '.join(missing_keys)}: "
                "it was not made for this kind of data; use another dataset name"
            )
        self._add_missing(conn, table, list(schema), existing)

    def ensure_state(self, conn: Connection) -> None:
        """Schema, state tables, the tag dimension and the schema version row."""
        if self.schema:
            conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {quote(self.schema)}"))
        for statement in self.state_ddl():
            conn.execute(sa.text(statement))
        # State tables made by an earlier version lack later columns: add them (nullable).
        for table, column, kind in (
            (VERSION_TABLE, "migrated_at", TS),
            (DATASETS_TABLE, "created_at", TS),
        ):
            if column not in self.columns(conn, table):
                conn.execute(
                    sa.text(f"ALTER TABLE {self.table(table)} ADD COLUMN {quote(column)} {kind}")
                )
        self.ensure_table(conn, METADATA_TABLE, KIND_TAG_METADATA)
        versions = [
            int(row[0])
            for row in conn.execute(sa.text(f"SELECT version FROM {self.table(VERSION_TABLE)}"))
        ]
        if not versions:
            conn.execute(
                sa.text(
                    f"INSERT INTO {self.table(VERSION_TABLE)} (version, migrated_at) "
                    "VALUES (:v, CURRENT_TIMESTAMP)"
                ),
                {"v": SCHEMA_VERSION},
            )
        elif max(versions) > SCHEMA_VERSION:
            raise SinkError(
                f"warehouse schema version {max(versions)} is newer than this program's "
                f"({SCHEMA_VERSION}): upgrade historian-extract"
            )
        elif max(versions) < SCHEMA_VERSION:
            # Migrated above (the series table); an older program now refuses this
            # warehouse instead of writing into a dataset's view.
            conn.execute(
                sa.text(
                    f"UPDATE {self.table(VERSION_TABLE)} SET version = :v, "
                    "migrated_at = CURRENT_TIMESTAMP"
                ),
                {"v": SCHEMA_VERSION},
            )
