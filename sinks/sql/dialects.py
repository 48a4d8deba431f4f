"""What the warehouse spells differently per database, in one place.

The warehouse (sinks/sql/warehouse.py) writes the same statements to every database; where a
database needs other words for the same thing (a list parameter, an upsert, JSON, epoch
milliseconds, column types and keys, how many rows a DELETE removed), it asks its
`Dialect`. Bulk loading and the flow lock differ more than words: the dialect names
them and sinks/sql/load.py, sinks/sql/mysql.py and sinks/sql/locks.py implement them.

Tested dialects: PostgreSQL (psycopg 3), DuckDB (embedded), MariaDB and MySQL (PyMySQL;
tested against MariaDB). Adding one (SQL Server, say) is a subclass here, its entry in
`DIALECTS`, a bulk load and a lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import URL

from sinks.base import SinkError


def quote(name: str) -> str:
    """A quoted SQL identifier (any text, quotes doubled). MySQL sessions run with
    ANSI_QUOTES, so one spelling serves every dialect."""
    return '"' + name.replace('"', '""') + '"'


class ArrayLiteral(str):
    """A PostgreSQL text[] literal, bound as text[] (`_ArrayLiteralDumper`)."""


try:  # psycopg is PostgreSQL's driver; the other dialects never bind an ArrayLiteral
    import psycopg
    from psycopg.adapt import Dumper

    class _ArrayLiteralDumper(Dumper):
        oid = psycopg.postgres.types["text"].array_oid

        def dump(self, obj: Any) -> bytes:
            return str(obj).encode()

    psycopg.adapters.register_dumper(ArrayLiteral, _ArrayLiteralDumper)
except ImportError:  # pragma: no cover - a DuckDB- or MariaDB-only install
    pass


class TextArray(sa.types.TypeDecorator[Any]):
    """A list of texts bound as one text[] parameter written as its literal (`{"a","b"}`,
    each element quoted, backslash and quote escaped: exact for any text). psycopg dumps
    a Python list element by element in Python (a chunk's 100 tag paths, seven lists a
    write: ~2 ms of a small chunk's CPU); the literal is built by `str.replace` and `join`
    in C. Bound with text[]'s type, the server reads it once: a text parameter cast in
    the statement would be parsed again for every row compared (40 s for 10,000 tags)."""

    impl = sa.types.NullType  # no cast in the statement: the dumper says text[]
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: sa.Dialect) -> str | None:
        if value is None:
            return None
        texts = list(value)
        quoted = (v.replace("\\", "\\\\").replace('"', '\\"') for v in texts)
        return ArrayLiteral('{"' + '","'.join(quoted) + '"}' if texts else "{}")


class Dialect:
    """PostgreSQL's spelling; the other dialects override what differs."""

    family = "postgresql"
    drivers: tuple[str, ...] = ("psycopg", "psycopg2")
    driver = "postgresql+psycopg"
    timestamp_type = "TIMESTAMP WITH TIME ZONE"
    json_type = "JSONB"
    # DELETE ... RETURNING counts removed rows (DuckDB reports no rowcount).
    delete_returning = True
    # Chunk writes the runner may run at once (each its own connection and transaction).
    default_writers = 2

    def url(self, parsed: URL, sink: str) -> URL:
        """The URL with the driver this sink speaks through, or a one-line SinkError."""
        if parsed.get_driver_name() not in self.drivers:
            raise SinkError(
                f"sink {sink}: PostgreSQL is reached through psycopg 3 (postgresql+psycopg://...)"
            )
        return parsed.set(drivername=self.driver)

    def connect_args(self, schema: str | None) -> dict[str, object]:
        return {
            "connect_timeout": 10,
            # Visible in pg_stat_activity: which warehouse schema a connection writes.
            "application_name": f"historian {schema}"[:63] if schema else "historian",
        }

    def default_schema(self, url: URL) -> str:
        """The schema information_schema reports for tables made without one."""
        return "public"

    def in_list(self, column: str, param: str) -> str:
        """`column` equals one of the values of list parameter `param` (text values)."""
        return f"{column} = ANY(:{param})"

    def text(self, sql: str, *lists: str) -> sa.TextClause:
        """A statement whose `lists` parameters are lists (see `in_list`)."""
        return sa.text(sql).bindparams(*(sa.bindparam(name, type_=TextArray()) for name in lists))

    def upsert(self, key: Sequence[str], updates: Sequence[str]) -> str:
        """The clause after an INSERT that updates `updates` of a row whose key exists."""
        keys = ", ".join(quote(k) for k in key)
        if not updates:
            return f"ON CONFLICT ({keys}) DO NOTHING"
        sets = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in updates)
        return f"ON CONFLICT ({keys}) DO UPDATE SET {sets}"

    def json_param(self, param: str) -> str:
        return f"CAST(:{param} AS {self.json_type})"

    def json_text(self, column: str) -> str:
        return f"CAST({column} AS TEXT)"

    def epoch_ms(self, column: str) -> str:
        """SQL for a timestamp column as BIGINT epoch milliseconds (exact, no time zone)."""
        return f"CAST(floor(extract(epoch FROM {quote(column)}) * 1000) AS BIGINT)"

    def text_type(self, key: bool) -> str:
        # Key text in PostgreSQL compares bytewise: exact for any tag path and much faster
        # to index than a linguistic collation.
        return 'TEXT COLLATE "C"' if key else "TEXT"

    def column_type(self, field: pa.Field) -> str:
        """The column type of an Arrow field (the only mapping between the type systems)."""
        kind = field.type
        if pa.types.is_dictionary(kind):  # dictionary-encoded text is stored as its values
            kind = kind.value_type
        if pa.types.is_timestamp(kind):
            return self.timestamp_type
        if pa.types.is_float64(kind):
            return "DOUBLE PRECISION"
        if pa.types.is_boolean(kind):
            return "BOOLEAN"
        if pa.types.is_int16(kind):
            return "SMALLINT"
        if pa.types.is_int32(kind):
            return "INTEGER"
        if pa.types.is_int64(kind):
            return "BIGINT"
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return "TEXT"
        raise SinkError(f"column {field.name}: no warehouse type for {kind}")

    def key_ddl(self, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> list[str]:
        """Table elements making `key` unique; `columns` are (name, type) of the table."""
        return [f"PRIMARY KEY ({', '.join(quote(k) for k in key)})"]

    def table_options(self) -> str:
        return ""


class DuckDB(Dialect):
    family = "duckdb"
    drivers = ("duckdb", "duckdb_engine")
    driver = "duckdb"
    json_type = "JSON"
    default_writers = 1  # one writer per database file

    def url(self, parsed: URL, sink: str) -> URL:
        return parsed

    def connect_args(self, schema: str | None) -> dict[str, object]:
        return {}

    def default_schema(self, url: URL) -> str:
        return "main"

    def epoch_ms(self, column: str) -> str:
        return f"epoch_ms({quote(column)})"

    def in_list(self, column: str, param: str) -> str:
        return f"{column} = ANY(:{param})"  # the list is bound as it is, in C

    def text(self, sql: str, *lists: str) -> sa.TextClause:
        return sa.text(sql)

    def text_type(self, key: bool) -> str:
        return "TEXT"


class MySQL(Dialect):
    """MariaDB and MySQL through PyMySQL.

    Sessions run in UTC (DATETIME(3) holds UTC, read back tz-aware) with ANSI_QUOTES
    (identifiers quoted like everywhere else). Text in a key is any length: InnoDB keys
    are at most 3072 bytes, so a key's text columns are made unique through a stored
    SHA-256 digest column (`_key_digest`) computed by the server from them, length-
    prefixed so that no two different tuples share an input.
    """

    family = "mysql"
    drivers = ("pymysql",)
    driver = "mysql+pymysql"
    timestamp_type = "DATETIME(3)"
    json_type = "LONGTEXT"
    delete_returning = False  # MySQL has no DELETE ... RETURNING; rowcount is exact here
    # Chunk writes take turns: the progress merge of two at once would need a transaction-
    # scoped lock, which MySQL's GET_LOCK (session-scoped) is not.
    default_writers = 1
    digest_column = "_key_digest"

    def url(self, parsed: URL, sink: str) -> URL:
        if parsed.get_driver_name() not in self.drivers:
            raise SinkError(
                f"sink {sink}: MariaDB/MySQL is reached through PyMySQL "
                "(mysql+pymysql://... or mariadb+pymysql://...)"
            )
        if not parsed.database:
            raise SinkError(f"sink {sink}: the URL names no database (mysql+pymysql://host/db)")
        backend = "mariadb" if parsed.get_backend_name() == "mariadb" else "mysql"
        return parsed.set(drivername=f"{backend}+pymysql")

    def connect_args(self, schema: str | None) -> dict[str, object]:
        return {
            "connect_timeout": 10,
            "charset": "utf8mb4",
            "local_infile": True,  # LOAD DATA LOCAL INFILE: the bulk load
            "init_command": (
                "SET time_zone = '+00:00', "
                "sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES,STRICT_ALL_TABLES')"
            ),
        }

    def default_schema(self, url: URL) -> str:
        return str(url.database)

    def in_list(self, column: str, param: str) -> str:
        return f"{column} IN :{param}"

    def text(self, sql: str, *lists: str) -> sa.TextClause:
        return sa.text(sql).bindparams(*(sa.bindparam(name, expanding=True) for name in lists))

    def upsert(self, key: Sequence[str], updates: Sequence[str]) -> str:
        if not updates:  # a no-op update: the existing row stays
            return f"ON DUPLICATE KEY UPDATE {quote(key[0])} = {quote(key[0])}"
        sets = ", ".join(f"{quote(c)} = VALUES({quote(c)})" for c in updates)
        return f"ON DUPLICATE KEY UPDATE {sets}"

    def json_param(self, param: str) -> str:
        return f":{param}"

    def json_text(self, column: str) -> str:
        return column

    def epoch_ms(self, column: str) -> str:
        return (
            f"CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {quote(column)}) "
            "DIV 1000 AS SIGNED)"
        )

    def text_type(self, key: bool) -> str:
        return "LONGTEXT"

    def column_type(self, field: pa.Field) -> str:
        kind = super().column_type(field)
        return "LONGTEXT" if kind == "TEXT" else kind

    def key_ddl(self, columns: Sequence[tuple[str, str]], key: Sequence[str]) -> list[str]:
        types = dict(columns)
        text = [k for k in key if types[k] == "LONGTEXT"]
        if not text:
            return super().key_ddl(columns, key)
        parts = [
            f"CHAR_LENGTH({quote(k)}), ':', {quote(k)}" if i < len(text) - 1 else quote(k)
            for i, k in enumerate(text)
        ]
        digest = quote(self.digest_column)
        rest = [quote(k) for k in key if k not in text]
        return [
            f"{digest} BINARY(32) AS (UNHEX(SHA2(CONCAT({', '.join(parts)}), 256))) STORED",
            f"UNIQUE KEY ({', '.join([digest, *rest])})",
        ]

    def table_options(self) -> str:
        return " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"


DIALECTS: dict[str, type[Dialect]] = {
    "postgresql": Dialect,
    "duckdb": DuckDB,
    "mysql": MySQL,
    "mariadb": MySQL,
}


def dialect_of(parsed: URL, sink: str) -> tuple[Dialect, URL]:
    """The dialect of a database URL and the URL with its driver, or a one-line SinkError."""
    backend = parsed.get_backend_name()
    found = DIALECTS.get(backend)
    if found is None:
        raise SinkError(
            f"sink {sink}: {backend} is not supported (postgresql, mysql/mariadb or duckdb)"
        )
    dialect = found()
    return dialect, dialect.url(parsed, sink)
