"""The SQL warehouse against real databases: DuckDB in tmp_path and the real PostgreSQL.

What every sink does is in tests/sinks/test_contract.py; here is what is the warehouse's
own, over both dialects (exact types, keys, probes, locks of killed processes, migration),
then PostgreSQL only: column types, a connection killed in the middle of a write, and
binary COPY of awkward values.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors import schema
from pipelines.core.runner import ChunkOutcome, FlowRun, RunSummary, write_all
from sinks.base import ChunkScope, CountMismatch, FlowLocked, SinkError, SinkUnavailable
from sinks.sql import mysql as sql_mysql
from sinks.sql import warehouse as warehouse_module
from sinks.sql.dialects import dialect_of
from sinks.sql.locks import SessionLock, advisory_lock
from sinks.sql.mysql import NamedLock
from sinks.sql.pg_copy import encode_binary_copy
from sinks.sql.warehouse import SqlWarehouse
from tests.pg_server import Sessions, waiting_session
from tests.sinks.sql.sql_frames import ATTRS, alarms, history, hours, rows, scope, sort_key

REPO = Path(__file__).resolve().parents[3]
HIST = schema.KIND_TAG_HISTORY
TS_SQL = "TIMESTAMP WITH TIME ZONE"
ALARM = schema.KIND_ALARM_HISTORY
HOSTILE_TAGS = [
    "..",
    "/",
    "a/b/../../c",
    "'; drop table x; --",
    'say "hi"',
    "x" * 1000,
    "ünïcödé 漢字 🙂",
    "comma, dot. semicolon;",
    " leading and trailing ",
    "tab\there\nnewline",
    "back\\slash",
    "%s %(x)s :members ?",
    "",
]


@pytest.fixture(
    params=[
        "duckdb",
        "duckdb-schema",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None]:
    """(url, schema) of an empty warehouse of each dialect."""
    if request.param.startswith("duckdb"):
        schema_name = "historian" if request.param == "duckdb-schema" else None
        return f"duckdb:///{tmp_path}/wh/warehouse.duckdb", schema_name
    if request.param == "mariadb":
        return request.getfixturevalue("mariadb_url"), request.getfixturevalue("mariadb_schema")
    return request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema")


@pytest.fixture
def sink(where: tuple[str, str | None]) -> Iterator[SqlWarehouse]:
    warehouse = SqlWarehouse(where[0], schema=where[1])
    warehouse.open()
    yield warehouse
    warehouse.close()


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain values, NaN spelled out so that it compares equal to itself."""
    out = pa.Table.from_pandas(frame, preserve_index=False).to_pylist()
    for row in out:
        for key, value in row.items():
            if isinstance(value, float) and math.isnan(value):
                row[key] = "NaN"
    return out


def assert_same(actual: pd.DataFrame, expected: pd.DataFrame, kind: str) -> None:
    assert list(actual.dtypes.astype(str)) == list(schema.empty_frame(kind).dtypes.astype(str))
    assert records(actual) == records(sort_key(expected, kind))


def tables_of(sink: SqlWarehouse) -> set[str]:
    with sink.engine.connect() as conn:
        return {
            str(r[0])
            for r in conn.execute(
                sa.text("SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                {"s": sink.layout.catalog_schema},
            )
        }


# -- over both dialects -------------------------------------------------------------------


def test_written_rows_read_back_with_exact_values_and_types(sink: SqlWarehouse) -> None:
    window = hours(0, 1)
    frame = rows(
        HIST,
        [
            {"node": "n", "tag": "a", "ts": window.start, "seq": 0, "value": 1.5, "quality": 192},
            {"node": "n", "tag": "a", "ts": window.start, "seq": 1, "value": math.nan},
            {
                "node": "n",
                "tag": "a",
                "ts": datetime(2024, 3, 1, 0, 0, 0, 7000, UTC),
                "seq": 0,
                "value": math.inf,
                "value_bool": True,
                "value_str": "",
                "extra": -(2**62),
            },
            {
                "node": "n",
                "tag": "b",
                "ts": datetime(2024, 3, 1, 0, 59, 59, 999000, UTC),
                "seq": 0,
                "value_bool": False,
                "value_str": 'line\nbreak, "quoted"',
                "quality": -1,
            },
        ],
    )
    assert sink.write(scope(["a", "b"], window, node="n"), frame, 4) == 4
    back = sink.read("hist", HIST)
    expected = frame.copy()
    if sink.dialect == "mysql":  # DOUBLE holds no NaN or infinity: stored as NULL
        expected["value"] = pd.array([1.5, None, None, None], dtype=frame["value"].dtype)
    assert_same(back, expected, HIST)
    assert str(back["ts"].dtype) == "timestamp[ms, tz=UTC][pyarrow]"
    assert back["ts"].iloc[2] == pd.Timestamp("2024-03-01T00:00:00.007Z")
    assert back["value_str"].isna().tolist() == [True, True, False, False]  # '' is not NULL


def dictionary_tags(frame: pd.DataFrame, pieces: int = 2) -> pd.DataFrame:
    """The frame with its tag column dictionary-encoded, in pieces of different dictionaries."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    step = max(1, -(-table.num_rows // pieces))
    tags = table.column("tag").combine_chunks()
    encoded = pa.chunked_array(
        [tags.slice(at, step).dictionary_encode() for at in range(0, len(tags), step)]
    )
    table = table.set_column(table.schema.get_field_index("tag"), "tag", encoded)
    return table.to_pandas(types_mapper=pd.ArrowDtype)


def test_dictionary_encoded_tags_are_written_like_plain_ones(sink: SqlWarehouse) -> None:
    window = hours(0, 2)
    tags = ["b", "a", "c"]
    plain = history(tags, window)
    encoded = dictionary_tags(plain)
    assert str(encoded["tag"].dtype).startswith("dictionary")
    assert sink.write(scope(tags, window), encoded, len(plain)) == len(plain)
    assert_same(sink.read("hist", HIST), plain, HIST)
    assert sink.write(scope(tags, window), plain, len(plain)) == len(plain)  # replaced, once
    assert_same(sink.read("hist", HIST), plain, HIST)
    outside = dictionary_tags(history(["d"], window), pieces=1)
    with pytest.raises(SinkError, match="outside its scope"):
        sink.write(scope(tags, window), outside, len(outside))


def test_rows_sharing_a_key_commit_nothing(sink: SqlWarehouse) -> None:
    window = hours(0, 1)
    frame = history(["a"], window)
    doubled = pd.concat([frame, frame.iloc[:1]], ignore_index=True)
    with pytest.raises(CountMismatch, match="nothing committed"):
        sink.write(scope(["a"], window), doubled, len(doubled))
    assert sink.read("hist", HIST).empty
    assert sink.chunk_log("f1") == []


def test_probe_finds_what_a_run_needs_without_creating_it(
    where: tuple[str, str | None], tmp_path: Path
) -> None:
    url, schema_name = where
    if url.startswith("duckdb"):
        url = f"duckdb:///{tmp_path}/not/yet/warehouse.duckdb"
    elif schema_name is not None:
        schema_name = schema_name + "_new"
    warehouse = SqlWarehouse(url, schema=schema_name)
    assert "does not exist yet" in warehouse.probe()
    assert not (tmp_path / "not").exists()
    if url.startswith("postgresql"):
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            found = conn.execute(
                sa.text("SELECT count(*) FROM pg_namespace WHERE nspname = :s"), {"s": schema_name}
            ).scalar()
        engine.dispose()
        assert found == 0


def test_probe_refuses_a_warehouse_file_where_a_directory_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    warehouse = SqlWarehouse(f"duckdb:///{tmp_path}/file/warehouse.duckdb")
    with pytest.raises(SinkError, match="is not a writable directory"):
        warehouse.probe()


def test_hostile_tag_paths_round_trip_and_create_no_other_table(
    sink: SqlWarehouse, tmp_path: Path
) -> None:
    files_before = sorted(p.name for p in tmp_path.rglob("*"))
    tables_before = tables_of(sink)
    window = hours(0, 1)
    frame = history(HOSTILE_TAGS, window, step_s=1800)
    sink.write(scope(HOSTILE_TAGS, window), frame, len(frame))
    sink.write(scope(HOSTILE_TAGS, window), frame, len(frame))
    back = sink.read("hist", HIST)
    assert_same(back, frame, HIST)
    assert set(back["tag"]) == set(HOSTILE_TAGS)
    assert set(sink.progress("f1").completed) == set(HOSTILE_TAGS)
    assert sink.reset("f1", "'; drop table x; --") == 1
    # PostgreSQL: the view users read and the narrow table behind it (sinks/sql/tables.py).
    made = {"hist", "historian_rows_hist"} if sink.dialect != "duckdb" else {"hist"}
    assert tables_of(sink) - tables_before == made
    assert sorted(p.name for p in tmp_path.rglob("*")) == files_before


CHILD = """
import sys, time
from sinks.sql.warehouse import SqlWarehouse
sink = SqlWarehouse(sys.argv[1], schema=sys.argv[2] or None)
if sink.dialect != "duckdb":  # a DuckDB file admits one process; its lock needs no open
    sink.open()
with sink.lock("f1"):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_lock_of_a_killed_process_is_free_again(sink: SqlWarehouse) -> None:
    url = sink.url.render_as_string(hide_password=False)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, sink.schema or ""],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(FlowLocked), sink.lock("f1"):
            pass
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
    deadline = time.monotonic() + 10
    while True:
        try:
            with sink.lock("f1"):
                return
        except FlowLocked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_missing_columns_are_added_and_wrong_types_refused(
    sink: SqlWarehouse, where: tuple[str, str | None]
) -> None:
    table = sink.layout.table("old")
    # MariaDB/MySQL: a key's text must have a length, and time is DATETIME(3).
    text, ts = ("VARCHAR(50)", "DATETIME(3)") if sink.dialect == "mysql" else ("TEXT", TS_SQL)
    with sink.engine.begin() as conn:
        conn.execute(
            sa.text(
                f"CREATE TABLE {table} (node {text} NOT NULL, tag {text} NOT NULL, "
                f"ts {ts} NOT NULL, seq SMALLINT NOT NULL, value DOUBLE PRECISION, "
                "PRIMARY KEY (node, tag, ts, seq))"
            )
        )
        conn.execute(
            sa.text(
                f"CREATE TABLE {sink.layout.table('bad')} (node TEXT, tag TEXT, ts TEXT, seq INTEGER)"
            )
        )
    window = hours(0, 1)
    frame = history(["a"], window)
    sink.write(scope(["a"], window, dataset="old"), frame, len(frame))
    assert_same(sink.read("old", HIST), frame, HIST)
    with pytest.raises(
        SinkError, match=f"table bad column ts is .*expected {re.escape(ts.lower())}"
    ):
        sink.write(scope(["a"], window, dataset="bad"), frame, len(frame))


def test_invalid_dataset_names_never_reach_sql(sink: SqlWarehouse) -> None:
    window = hours(0, 1)
    for name in ['x"; drop table y; --', "historian_chunks", "a" * 64]:
        with pytest.raises(SinkError, match="not usable as a table name"):
            sink.write(scope(["a"], window, dataset=name), schema.empty_frame(HIST), 0)


def test_describe_is_one_line_naming_the_database(sink: SqlWarehouse) -> None:
    assert "\n" not in sink.describe()
    assert sink.describe().startswith(("duckdb:///", "postgresql+psycopg://", "mysql+pymysql://"))


# -- connection failures and secrets (no server needed) -----------------------------------


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_unreachable_server_is_unavailable_in_one_line_without_password() -> None:
    url = f"postgresql+psycopg://etl:s3cr%40t-pw@127.0.0.1:{_closed_port()}/plant"
    sink = SqlWarehouse(url, name="wh", schema="hist", retry_s=0)
    assert (
        sink.describe()
        == f"postgresql+psycopg://etl:***@127.0.0.1:{sink.url.port}/plant (schema hist)"
    )
    assert "s3cr" not in repr(sink)
    with pytest.raises(SinkUnavailable) as caught:
        sink.open()
    message = str(caught.value)
    assert message.startswith("sink wh: connect: database unavailable:")
    assert "\n" not in message
    assert "s3cr" not in message
    assert caught.value.__cause__ is None


def test_a_refused_connection_is_tried_again_until_the_retry_budget_is_spent() -> None:
    url = f"postgresql+psycopg://etl:s3cr%40t-pw@127.0.0.1:{_closed_port()}/plant"
    sink = SqlWarehouse(url, name="wh", retry_s=0.6)
    with pytest.raises(SinkError) as caught:
        sink.open()
    assert not isinstance(caught.value, SinkUnavailable), "retried here: not again above"
    message = str(caught.value)
    assert message.startswith("sink wh: connect: database unavailable:")
    assert re.search(r"still after [2-9] attempts", message), message
    assert "s3cr" not in message


def test_unsupported_urls_are_refused() -> None:
    with pytest.raises(SinkError, match="not supported"):
        SqlWarehouse("sqlite:///x.db")
    with pytest.raises(SinkError, match="psycopg 3"):
        SqlWarehouse("postgresql+asyncpg://u@h/db")
    assert SqlWarehouse("postgresql://u@h/db").url.drivername == "postgresql+psycopg"


def test_a_duckdb_file_in_use_by_another_process_is_unavailable(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path}/w.duckdb"
    holder = SqlWarehouse(url)
    holder.open()
    try:
        probe = (
            "import sys\nfrom sinks.sql.warehouse import SqlWarehouse\n"
            "try:\n    SqlWarehouse(sys.argv[1]).open()\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc, sep='|')\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, url],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    finally:
        holder.close()
    kind, message = out.rstrip("\n").split("|", 1)
    assert kind == "SinkUnavailable"
    assert message.startswith("sink warehouse: connect: database unavailable:")
    assert "lock" in message
    assert "\n" not in message


def test_a_duckdb_parent_directory_is_created(tmp_path: Path) -> None:
    sink = SqlWarehouse(f"duckdb:///{tmp_path}/a/b/w.duckdb")
    sink.open()
    sink.close()
    assert (tmp_path / "a" / "b" / "w.duckdb").exists()


# -- PostgreSQL only ----------------------------------------------------------------------


@pytest.fixture
def pg_sink(pg_url: str, pg_schema: str) -> Iterator[SqlWarehouse]:
    warehouse = SqlWarehouse(pg_url, schema=pg_schema)
    warehouse.open()
    yield warehouse
    warehouse.close()


def columns_of(sink: SqlWarehouse) -> dict[tuple[str, str], tuple[str, str]]:
    """(table, column) -> (data type, nullable) of every column in the sink's schema, in
    each table's column order."""
    with sink.engine.connect() as conn:
        return {
            (t, c): (d, n)
            for t, c, d, n in conn.execute(
                sa.text(
                    "SELECT table_name, column_name, data_type, is_nullable "
                    "FROM information_schema.columns WHERE table_schema = :s "
                    "ORDER BY table_name, ordinal_position"
                ),
                {"s": sink.schema},
            )
        }


def primary_keys_of(sink: SqlWarehouse) -> dict[str, str]:
    """table -> its primary key's columns, comma-separated, in the sink's schema."""
    with sink.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT tc.table_name, string_agg(k.column_name, ',' ORDER BY k.ordinal_position) "
                "FROM information_schema.table_constraints tc JOIN information_schema.key_column_usage k "
                "USING (constraint_schema, constraint_name) WHERE tc.constraint_type = 'PRIMARY KEY' "
                "AND tc.table_schema = :s GROUP BY tc.table_name"
            ),
            {"s": sink.schema},
        ).fetchall()
    return {str(table): str(key) for table, key in rows}


@pytest.mark.postgres
def test_pg_tables_have_the_schema_types(pg_sink: SqlWarehouse) -> None:
    window = hours(0, 1)
    pg_sink.write(scope(["a"], window), history(["a"], window), 6)
    attrs = dict(ATTRS, kind=ALARM)
    pg_sink.write(
        scope(["*"], window, dataset="al", kind=ALARM, attrs=attrs), alarms(["p"], window), 4
    )
    found = columns_of(pg_sink)
    # Tag history: a view with the schema's columns over the narrow rows table.
    assert [c for (t, c) in found if t == "hist"] == [f.name for f in schema.TAG_HISTORY_SCHEMA]
    view_types = {c: found[("hist", c)][0] for c in ("node", "tag", "ts")}
    assert view_types == {"node": "text", "tag": "text", "ts": TS_SQL.lower()}
    rows_table = "historian_rows_hist"
    stored = [c for (t, c) in found if t == rows_table]  # widest first: no padding
    assert stored == [
        "ts", "value", "extra", "series_id", "seq", "quality", "value_bool", "value_str",
    ]  # fmt: skip
    expected = {
        (rows_table, "series_id"): ("integer", "NO"),
        (rows_table, "ts"): (TS_SQL.lower(), "NO"),
        (rows_table, "seq"): ("smallint", "NO"),
        (rows_table, "value"): ("double precision", "YES"),
        (rows_table, "value_bool"): ("boolean", "YES"),
        (rows_table, "value_str"): ("text", "YES"),
        (rows_table, "extra"): ("bigint", "YES"),
        ("al", "ack_ts"): (TS_SQL.lower(), "YES"),
        ("tag_metadata", "updated_at"): (TS_SQL.lower(), "NO"),
        ("historian_datasets", "attrs"): ("jsonb", "NO"),
        ("historian_chunks", "rows_committed"): ("bigint", "NO"),
    }
    assert {column: found[column] for column in expected} == expected
    assert primary_keys_of(pg_sink) == {
        "historian_rows_hist": "series_id,ts,seq",
        "historian_series": "series_id",
        "al": "node,path,ts,status",
        "tag_metadata": "node,tag",
        "historian_datasets": "dataset",
        "historian_chunks": "flow,chunk_id",
        "historian_progress": "flow,member,window_start",
        "historian_coverage": "dataset,node,tag,window_start,chunk_id",
    }


@pytest.mark.postgres
def test_pg_open_creates_a_missing_schema(pg_url: str, pg_schema: str) -> None:
    fresh = f"{pg_schema}_new"
    sink = SqlWarehouse(pg_url, schema=fresh)
    try:
        sink.open()
        assert "historian_progress" in tables_of(sink)
    finally:
        with sink.engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{fresh}" CASCADE'))
        sink.close()


@pytest.mark.postgres
def terminate_sessions_of(engine: sa.Engine, sink: SqlWarehouse) -> int:
    """`pg_terminate_backend` on every connection of `sink` (its schema names them), each
    waited for until it has ended and released its locks (PostgreSQL 14+): without the
    wait, a lock taken right after may still find the dying session holding it."""
    with engine.begin() as conn:
        return len(
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity "
                    "WHERE application_name = :app AND pid <> pg_backend_pid()"
                ),
                {"app": f"historian {sink.schema}"},
            ).fetchall()
        )


def test_a_flow_lock_released_by_the_database_is_taken_again_before_the_next_write(
    pg_sink: SqlWarehouse, pg_url: str
) -> None:
    other = SqlWarehouse(pg_url, schema=pg_sink.schema)
    other.open()
    admin = sa.create_engine(pg_url)
    frame = history(["a"], hours(0, 1))
    try:
        with pg_sink.lock("f1"):
            pg_sink.write(scope(["a"], hours(0, 1)), frame, len(frame))
            assert terminate_sessions_of(admin, pg_sink) >= 1, "the lock's session ended"
            pg_sink.write(scope(["a"], hours(1, 2)), history(["a"], hours(1, 2)), 6)
            with pytest.raises(FlowLocked), other.lock("f1"):
                pass  # held again, by the sink that lost it
            terminate_sessions_of(admin, pg_sink)
            # Another run takes the lock while it is free: this one may not write on.
            with (
                other.lock("f1"),
                pytest.raises(FlowLocked, match="since the database went away"),
            ):
                pg_sink.write(scope(["a"], hours(2, 3)), history(["a"], hours(2, 3)), 6)
        assert pg_sink.progress("f1").windows_of("a") == [hours(0, 2)]
    finally:
        other.close()
        admin.dispose()


def end_lock_session(admin: sa.Engine, lock: SessionLock) -> None:
    """End the session holding `lock` as a server restart would, and wait until the
    server has released the lock with it."""
    with admin.connect() as conn:
        if isinstance(lock, NamedLock):
            conn.execute(sa.text(f"KILL CONNECTION {int(lock.pid or 0)}"))
            deadline = time.monotonic() + 15
            while conn.execute(sa.text("SELECT IS_USED_LOCK(:k)"), {"k": lock.name}).scalar():
                assert time.monotonic() < deadline, "the killed session let go of its lock"
                time.sleep(0.02)
        else:
            conn.execute(sa.text("SELECT pg_terminate_backend(:p, 30000)"), {"p": lock.pid})
        conn.commit()


def assert_held(engine: sa.Engine, lock: SessionLock) -> None:
    """The database says the lock is held (by the session `lock` holds it in)."""
    with engine.connect() as conn:
        sql, params = lock.held_sql()
        assert conn.execute(sa.text(sql), params).scalar()


@pytest.mark.parametrize(
    "dialect",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
)
def test_writers_taking_a_lost_flow_lock_again_at_once_take_it_once(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    """After a restart every concurrent writer asks the lock to be taken again: the second
    must find it taken by the first, not drop the first's new session and then meet the
    lock still held by that dying session (FlowLocked, and the run fails)."""
    url = request.getfixturevalue("mariadb_url" if dialect == "mariadb" else "pg_url")
    engine, admin = sa.create_engine(url), sa.create_engine(url)
    take = sql_mysql.named_lock if dialect == "mariadb" else advisory_lock
    try:
        with take(engine, "f1", f"historian:race-{dialect}:f1", "here") as lock:
            for _ in range(5):
                end_lock_session(admin, lock)
                both = threading.Barrier(2)

                def ensure(held: SessionLock = lock, both: threading.Barrier = both) -> None:
                    both.wait()
                    held.ensure()

                with ThreadPoolExecutor(max_workers=2) as pool:
                    for future in [pool.submit(ensure) for _ in range(2)]:
                        future.result()
                assert_held(engine, lock)
    finally:
        engine.dispose()
        admin.dispose()


@pytest.mark.parametrize(
    "dialect",
    [
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
)
def test_a_released_flow_lock_is_free_before_its_session_has_ended(
    request: pytest.FixtureRequest, dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed session's backend exits after the client has moved on (CI once met the
    lock of a shard still held right after its block ended): an orderly release frees
    the lock on its session first. Here the dropped session is kept open to the end, as
    a slow backend exit would keep it."""
    url = request.getfixturevalue("mariadb_url" if dialect == "mariadb" else "pg_url")
    engine = sa.create_engine(url)
    take = sql_mysql.named_lock if dialect == "mariadb" else advisory_lock
    lingering: list[sa.Connection] = []
    monkeypatch.setattr("sinks.sql.locks.drop_session", lingering.append)
    key = f"historian:free-{uuid.uuid4().hex}:f1"
    try:
        with take(engine, "f1", key, "here"):
            pass
        assert len(lingering) == 1, "the lock's session was dropped (and lingers)"
        with take(engine, "f1", key, "here") as again:
            assert again.pid is not None
    finally:
        for conn in lingering:
            conn.close()
        engine.dispose()


@pytest.mark.postgres
def test_a_flow_lock_its_own_lost_session_still_holds_is_waited_for_not_another_runs(
    pg_url: str,
) -> None:
    """Dropped as a failover drops it, the lock's session tells the client at once but
    holds the lock until its backend has exited: taking the lock again meanwhile is
    `SinkUnavailable` (the sink's retries wait), never FlowLocked; then it is taken."""
    engine, admin = sa.create_engine(pg_url, pool_pre_ping=True), sa.create_engine(pg_url)
    sessions = Sessions(engine)
    try:
        with advisory_lock(engine, "f1", f"historian:lost-{uuid.uuid4().hex}:f1", "here") as lock:
            for _ in range(2):
                lost = lock.pid
                assert sessions.drop(pg_url) >= 1
                with pytest.raises(SinkUnavailable, match="lost session of this run") as caught:
                    lock.ensure()
                assert f"backend pid {lost}" in str(caught.value)
                wait_until_ended(admin, lost)
                lock.ensure()
                assert lock.pid != lost
                assert_held(engine, lock)
    finally:
        engine.dispose()
        admin.dispose()


def wait_until_ended(admin: sa.Engine, pid: int | None, timeout_s: float = 30) -> None:
    """Until backend `pid` has exited (gone from pg_stat_activity)."""
    deadline = time.monotonic() + timeout_s
    with admin.connect() as conn:
        while conn.execute(
            sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}
        ).scalar():
            conn.rollback()
            assert time.monotonic() < deadline, f"backend {pid} ended"
            time.sleep(0.02)


@pytest.mark.postgres
def test_a_session_ended_while_the_sink_connects_is_connected_again(
    pg_url: str, pg_schema: str
) -> None:
    """The sink's first session terminated while it creates the state tables (it waits on
    the DDL lock this test holds): opening is tried again, not stopped by that."""
    sink = SqlWarehouse(pg_url, schema=pg_schema)
    failed: list[BaseException] = []

    def open_sink() -> None:
        try:
            sink.open()
        except BaseException as exc:
            failed.append(exc)

    admin = sa.create_engine(pg_url)
    opener = threading.Thread(target=open_sink)
    try:
        with admin.connect() as holder:
            ddl = f"historian-ddl:{sink.layout.catalog_schema}"
            holder.execute(sa.text("SELECT pg_advisory_lock(hashtext(:k))"), {"k": ddl})
            opener.start()
            victim = waiting_session(holder, f"historian {pg_schema}")
            holder.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": victim})
            holder.execute(sa.text("SELECT pg_advisory_unlock(hashtext(:k))"), {"k": ddl})
            holder.commit()
            opener.join(timeout=60)
        assert not opener.is_alive(), "open came back"
        assert failed == []
        assert "historian_progress" in tables_of(sink)
    finally:
        sink.close()
        admin.dispose()


def write_with_its_connection_killed(
    sink: SqlWarehouse, pg_url: str, chunk: ChunkScope, frame: pd.DataFrame
) -> list[BaseException]:
    """Write the chunk while another session holds the chunk log, so the write gets as
    far as loading its rows and then waits; terminate the write's connection there.
    Returns what the write raised (nothing, when it was tried again and committed)."""
    outcome: list[BaseException] = []

    def write() -> None:
        try:
            sink.write(chunk, frame, len(frame))
        except BaseException as exc:
            outcome.append(exc)

    admin = sa.create_engine(pg_url)
    with admin.connect() as blocker:
        blocker.execute(
            sa.text(f"LOCK TABLE {sink.layout.table('historian_chunks')} IN ACCESS EXCLUSIVE MODE")
        )
        me = blocker.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        writer = threading.Thread(target=write)
        writer.start()
        victim = None
        deadline = time.monotonic() + 15
        while victim is None and time.monotonic() < deadline:
            victim = blocker.execute(
                sa.text("SELECT pid FROM pg_stat_activity WHERE :me = ANY(pg_blocking_pids(pid))"),
                {"me": me},
            ).scalar()
            time.sleep(0.05)
        assert victim is not None, "the write waits on the chunk log"
        with admin.connect() as killer:
            assert killer.execute(
                sa.text("SELECT pg_terminate_backend(:p)"), {"p": victim}
            ).scalar()
        blocker.rollback()
        writer.join(timeout=15)
    admin.dispose()
    assert not writer.is_alive(), "the write came back"
    return outcome


def test_pg_connection_killed_mid_write_commits_nothing_then_the_write_is_tried_again(
    pg_sink: SqlWarehouse, pg_url: str
) -> None:
    """A write's connection terminated while it waits: its transaction commits nothing,
    and with a retry budget the sink writes it again, once, on a new connection."""
    pg_sink.retry_s = 30.0
    window = hours(0, 1)
    frame = history(["a", "b"], window, step_s=60)
    pg_sink.write(scope(["a"], hours(5, 6)), history(["a"], hours(5, 6)), 6)  # tables exist
    assert write_with_its_connection_killed(pg_sink, pg_url, scope(["a", "b"], window), frame) == []
    assert len(pg_sink.read("hist", HIST)) == 6 + 120
    assert len(pg_sink.chunk_log("f1")) == 2
    assert pg_sink.progress("f1").windows_of("b") == [window]


def test_pg_connection_killed_mid_write_without_retries_fails_in_one_line_and_commits_nothing(
    pg_sink: SqlWarehouse, pg_url: str
) -> None:
    """Without a retry budget the cut write fails with one line, leaves no trace, and the
    next write of the chunk succeeds."""
    pg_sink.retry_s = 0.0
    window = hours(0, 1)
    frame = history(["a", "b"], window, step_s=60)
    chunk = scope(["a", "b"], window)
    pg_sink.write(scope(["a"], hours(5, 6)), history(["a"], hours(5, 6)), 6)  # tables exist
    outcome = write_with_its_connection_killed(pg_sink, pg_url, chunk, frame)
    assert len(outcome) == 1
    assert isinstance(outcome[0], SinkUnavailable), outcome[0]
    assert "\n" not in str(outcome[0])
    assert sorted(set(pg_sink.read("hist", HIST)["tag"])) == ["a"]
    assert len(pg_sink.read("hist", HIST)) == 6
    assert pg_sink.progress("f1").windows_of("b") == []
    assert len(pg_sink.chunk_log("f1")) == 1
    assert pg_sink.write(chunk, frame, len(frame)) == len(frame) == 120
    assert pg_sink.progress("f1").windows_of("b") == [window]


@pytest.mark.postgres
def test_pg_binary_copy_keeps_awkward_values_exactly(pg_sink: SqlWarehouse) -> None:
    ts = pa.array([0, -1, 1_709_251_200_123, 253_402_300_799_999, None], pa.int64()).cast(
        schema.TS_TYPE
    )
    table = pa.table(
        {
            "t": pa.array(["", None, "ü\u0001", "x" * 5000, "'\"\\,\n"]).slice(0),
            "d": pa.array(["k", "k", "j", None, "k"]).dictionary_encode(),
            "l": pa.array(["a", "bb", None, "", "e"], pa.large_string()),
            "ts": ts,
            "f": pa.array([math.nan, -0.0, math.inf, 1e-308, None]),
            "b": pa.array([True, False, None, True, False]),
            "i2": pa.array([-32768, 32767, 0, None, 1], pa.int16()),
            "i8": pa.array([-(2**63), 2**63 - 1, 0, 1, None], pa.int64()),
        }
    )
    sliced = pa.concat_tables([table.slice(1), table.slice(0, 1)])  # offsets and two chunks
    with pg_sink.engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TEMP TABLE awkward (t TEXT, d TEXT, l TEXT, ts TIMESTAMPTZ, f FLOAT8, "
            "b BOOL, i2 INT2, i8 INT8)"
        )
        from sinks.sql.load import copy_binary

        assert copy_binary(conn, "awkward", sliced) == 5
        got = conn.exec_driver_sql(
            "SELECT t, d, l, (extract(epoch FROM ts) * 1000)::bigint, f::text, b, i2, i8 "
            "FROM awkward"
        ).fetchall()
    expected = [
        (None, "k", "bb", -1, "-0", False, 32767, 2**63 - 1),
        ("ü\u0001", "j", None, 1_709_251_200_123, "Infinity", None, 0, 0),
        ("x" * 5000, None, "", 253_402_300_799_999, "1e-308", True, None, 1),
        ("'\"\\,\n", "k", "e", None, None, False, 1, None),
        ("", "k", "a", 0, "NaN", True, -32768, -(2**63)),
    ]
    assert got == expected


def test_binary_copy_of_no_rows_is_header_and_trailer() -> None:
    empty = schema.TAG_HISTORY_SCHEMA.empty_table()
    assert encode_binary_copy(empty) == b"PGCOPY\n\xff\r\n\x00" + bytes(8) + b"\xff\xff"


def test_binary_copy_row_layout() -> None:
    table = pa.table({"s": ["ab", None], "n": pa.array([1, 2], pa.int16())})
    data = encode_binary_copy(table)[19:-2]
    assert data == (
        b"\x00\x02"
        + b"\x00\x00\x00\x02ab"
        + b"\x00\x00\x00\x02\x00\x01"
        + b"\x00\x02"
        + b"\xff\xff\xff\xff"
        + b"\x00\x00\x00\x02\x00\x02"
    )


def test_state_tables_of_an_earlier_version_are_migrated(tmp_path: Path) -> None:
    """A warehouse made before `created_at`/`migrated_at` existed opens and takes writes."""
    import sqlalchemy as sa

    url = f"duckdb:///{tmp_path / 'old.duckdb'}"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE historian_schema_version (version INTEGER NOT NULL)"))
        conn.execute(sa.text("INSERT INTO historian_schema_version VALUES (1)"))
        conn.execute(
            sa.text(
                "CREATE TABLE historian_datasets (dataset TEXT PRIMARY KEY, kind TEXT NOT NULL, "
                "attrs TEXT NOT NULL)"
            )
        )
    engine.dispose()
    warehouse = SqlWarehouse(url)
    warehouse.open()
    try:
        window = hours(0, 1)
        rows = history(["a"], window)
        assert warehouse.write(scope(["a"], window), rows, len(rows)) == len(rows)
        with warehouse.engine.connect() as conn:
            columns = {
                row[0]
                for row in conn.execute(
                    sa.text(
                        "SELECT column_name FROM information_schema.columns "
                        "WHERE table_name = 'historian_datasets'"
                    )
                )
            }
        assert "created_at" in columns
    finally:
        warehouse.close()


@pytest.mark.postgres
def test_pg_narrow_history_keeps_node_tag_ts_seq_unique(pg_sink: SqlWarehouse) -> None:
    """The view's (node, tag, ts, seq) is unique: series <-> (node, tag) one to one, and the
    rows table's key; the same tag on two nodes stays two series, each node's replaced alone."""
    window = hours(0, 1)
    first = history(["a", "b"], window)
    other_node = history(["a"], window, node="node2")
    assert pg_sink.write(scope(["a", "b"], window), first, 12) == 12
    assert pg_sink.write(scope(["a"], window, flow="f2", node="node2"), other_node, 6) == 6
    assert pg_sink.write(scope(["a", "b"], window), first, 12) == 12  # node2's "a" stays
    both = pd.concat([first, other_node], ignore_index=True)
    assert_same(pg_sink.read("hist", HIST), both, HIST)
    series = pg_sink.layout.table("historian_series")
    rows_table = pg_sink.layout.table("historian_rows_hist")
    with pg_sink.engine.connect() as conn:
        pairs = conn.execute(sa.text(f"SELECT node, tag FROM {series} ORDER BY 1, 2")).fetchall()
        assert [tuple(p) for p in pairs] == [("node1", "a"), ("node1", "b"), ("node2", "a")]
        with pytest.raises(sa.exc.IntegrityError):
            conn.execute(sa.text(f"INSERT INTO {series} (node, tag) VALUES ('node1', 'a')"))
        conn.rollback()
        with pytest.raises(sa.exc.IntegrityError):
            conn.execute(
                sa.text(
                    f"INSERT INTO {rows_table} (series_id, ts, seq) "
                    f"SELECT series_id, ts, seq FROM {rows_table} LIMIT 1"
                )
            )
        conn.rollback()
        dupes = conn.execute(
            sa.text(
                f"SELECT count(*) FROM (SELECT 1 FROM {pg_sink.layout.table('hist')} "
                "GROUP BY node, tag, ts, seq HAVING count(*) > 1) d"
            )
        ).scalar()
    assert dupes == 0


@pytest.mark.postgres
def test_pg_concurrent_chunk_writes_commit_every_row_once_and_merge_progress(
    pg_sink: SqlWarehouse,
) -> None:
    """Chunks of one flow written at once (as the runner does for PostgreSQL): re-reads
    inside a stored window and new windows after it, all touching one progress window."""
    tags = ["a", "b"]
    whole = history(tags, hours(0, 4))
    pg_sink.write(scope(tags, hours(0, 4)), whole, len(whole))
    assert pg_sink.write_concurrency == 2
    windows = [hours(h, h + 1) for h in (5, 0, 3, 1, 4, 2, 6, 7)]  # out of plan order
    frames = [history(tags, w) for w in windows]
    with ThreadPoolExecutor(max_workers=4) as pool:
        done = list(
            pool.map(lambda w, f: pg_sink.write(scope(tags, w), f, len(f)), windows, frames)
        )
    assert done == [len(f) for f in frames]
    assert_same(pg_sink.read("hist", HIST), history(tags, hours(0, 8)), HIST)
    progress = pg_sink.progress("f1")
    assert progress.windows_of("a") == progress.windows_of("b") == [hours(0, 8)]


@pytest.mark.postgres
def test_pg_a_later_chunk_committed_first_leaves_a_gap_until_the_earlier_one(
    pg_sink: SqlWarehouse,
) -> None:
    tags = ["a"]
    later, earlier = hours(1, 2), hours(0, 1)
    pg_sink.write(scope(tags, later), history(tags, later), 6)
    assert pg_sink.progress("f1").windows_of("a") == [later]
    pg_sink.write(scope(tags, earlier), history(tags, earlier), 6)
    assert pg_sink.progress("f1").windows_of("a") == [hours(0, 2)]


@pytest.fixture(scope="module")
def pg_engine(pg_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(pg_url)
    yield engine
    engine.dispose()


@pytest.mark.postgres
@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(st.characters(exclude_characters="\x00", codec="utf-8"))))
def test_pg_list_parameters_reach_the_server_exactly(
    pg_engine: sa.Engine, texts: list[str]
) -> None:
    """Tag paths go to PostgreSQL as one array literal (`TextArray`), not psycopg's list
    dumping: quotes, backslashes, commas, braces, 'NULL' and any Unicode arrive as sent."""
    dialect = dialect_of(pg_engine.url, "pg")[0]
    with pg_engine.connect() as conn:
        sent = dialect.text("SELECT CAST(:m AS TEXT[])", "m")
        assert conn.execute(sent, {"m": texts}).scalar() == texts
        matched = dialect.text(
            f"SELECT count(*) FROM unnest(CAST(:all AS TEXT[])) AS t (x) WHERE "
            f"{dialect.in_list('x', 'm')}",
            "all",
            "m",
        )
        assert conn.execute(matched, {"all": texts, "m": texts[:1]}).scalar() == (
            texts.count(texts[0]) if texts else 0
        )


def test_duckdb_takes_one_chunk_write_at_a_time(tmp_path: Path) -> None:
    assert SqlWarehouse(f"duckdb:///{tmp_path}/w.duckdb").write_concurrency == 1


def test_two_sinks_on_one_duckdb_file_take_turns_instead_of_conflicting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live tail and its gap runs hold two sinks on one file in one process: a write
    while the other's transaction has deleted the same rows waits for it (DuckDB would
    abort it: 'Conflict on tuple deletion') and then replaces them."""
    url = f"duckdb:///{tmp_path}/w.duckdb"
    tags, window = ["a", "b"], hours(0, 1)
    asking = threading.Event()
    turns = 0

    class Announced:  # the real turn, which says when a second writer asks for it
        def __init__(self, turn: Any) -> None:
            self.turn = turn

        def __enter__(self) -> None:
            nonlocal turns
            turns += 1
            if turns > 1:
                asking.set()
            self.turn.__enter__()

        def __exit__(self, *exc: object) -> None:
            self.turn.__exit__(*exc)

    real = warehouse_module.writer_turn
    tail, gaps = SqlWarehouse(url, name="tail"), SqlWarehouse(url, name="gaps")
    with contextlib.ExitStack() as stack:
        for sink in (tail, gaps):
            sink.open()
            stack.callback(sink.close)
        tail.write(scope(tags, window), history(tags, window), 12)
        table = tail.layout.table("hist")
        monkeypatch.setattr(warehouse_module, "writer_turn", lambda db: Announced(real(db)))
        with ThreadPoolExecutor(1) as pool:
            with tail._begin("hold the rows") as conn:
                conn.execute(sa.text(f"DELETE FROM {table}"))
                written = pool.submit(gaps.write, scope(tags, window), history(tags, window), 12)
                assert asking.wait(30), "the second write never asked for its turn"
                assert not written.done()
            assert written.result(timeout=30) == 12
        assert_same(gaps.read("hist", HIST), history(tags, window), HIST)


@pytest.mark.postgres
def test_pg_tag_history_table_of_an_earlier_version_keeps_taking_writes(
    pg_sink: SqlWarehouse, pg_url: str, pg_schema: str
) -> None:
    """A version-1 warehouse: its plain (node, tag, ts, seq) table is written as before,
    new datasets get the narrow layout, and the version moves to 2 (older programs refuse)."""
    layout = pg_sink.layout
    legacy = layout.table("legacy")
    columns = ", ".join(
        layout.column_ddl(f, f.name in schema.TAG_HISTORY_KEY) for f in schema.TAG_HISTORY_SCHEMA
    )
    with pg_sink.engine.begin() as conn:
        conn.execute(
            sa.text(f"CREATE TABLE {legacy} ({columns}, PRIMARY KEY (node, tag, ts, seq))")
        )
        conn.execute(sa.text(f"DROP TABLE {layout.table('historian_series')}"))
        conn.execute(sa.text(f"UPDATE {layout.table('historian_schema_version')} SET version = 1"))
    pg_sink.close()
    warehouse = SqlWarehouse(pg_url, schema=pg_schema)
    warehouse.open()
    try:
        window = hours(0, 1)
        frame = history(["a", "'; drop table x; --"], window)
        for dataset in ("legacy", "legacy", "fresh"):
            target = scope(["a", "'; drop table x; --"], window, dataset=dataset)
            assert warehouse.write(target, frame, len(frame)) == len(frame)
        assert_same(warehouse.read("legacy", HIST), frame, HIST)
        assert_same(warehouse.read("fresh", HIST), frame, HIST)
        with warehouse.engine.connect() as conn:
            kinds = dict(
                conn.execute(
                    sa.text(
                        "SELECT table_name, table_type FROM information_schema.tables "
                        "WHERE table_schema = :s AND table_name IN ('legacy', 'fresh')"
                    ),
                    {"s": pg_schema},
                ).fetchall()
            )
            version = conn.execute(
                sa.text(f"SELECT max(version) FROM {layout.table('historian_schema_version')}")
            ).scalar()
        assert kinds == {"legacy": "BASE TABLE", "fresh": "VIEW"}
        assert version == 2
    finally:
        warehouse.close()


def _decoded_rows(stream: bytes, fields: int) -> list[bytes]:
    """The rows of a binary COPY stream as byte strings (any field layout)."""
    out, at = [], 19
    while stream[at : at + 2] != b"\xff\xff":
        start = at
        assert int.from_bytes(stream[at : at + 2], "big") == fields
        at += 2
        for _ in range(fields):
            length = int.from_bytes(stream[at : at + 4], "big", signed=True)
            at += 4 + max(length, 0)
        out.append(stream[start:at])
    assert at == len(stream) - 2
    return out


def test_binary_copy_by_shape_holds_the_same_rows_as_the_row_by_row_join() -> None:
    frame = history(HOSTILE_TAGS, hours(0, 2), step_s=300)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = pa.concat_tables([table.slice(7), table.slice(0, 7)])  # offsets and two chunks
    from sinks.sql.pg_copy import HEADER, TRAILER, encode_rows

    grouped = HEADER + encode_rows(table, max_shapes=1 << 30) + TRAILER  # one group per shape
    joined = HEADER + encode_rows(table, max_shapes=0) + TRAILER  # the fallback, forced
    fields = table.num_columns
    assert sorted(_decoded_rows(grouped, fields)) == sorted(_decoded_rows(joined, fields))
    assert len(_decoded_rows(grouped, fields)) == table.num_rows


# -- the runner's overlapped writes (what `write_concurrency` 2 makes `write_all` do) -------------


class _OverlappedRun(FlowRun):
    """A run whose chunks are given and whose writes are scripted (no node, no sink)."""

    def __init__(self, results: list[str], write: Any) -> None:
        self.summary = RunSummary("f", "d", HIST, "n")
        self._given = results
        self._script = write
        self.submitted: list[str] = []

    def results(self, fetch: Any = None) -> Iterator[Any]:
        for label in self._given:
            self.submitted.append(label)
            yield label

    def write(self, result: Any) -> ChunkOutcome:
        self._script(result)
        return ChunkOutcome(result, result, hours(0, 1), 1, 10, {"s": 10}, 1, 0, 0.0)


def test_overlapped_writes_count_every_chunk_that_committed_then_raise_the_failure() -> None:
    failed = threading.Event()
    both = threading.Barrier(2, timeout=30)

    def write(label: str) -> None:
        if label in ("c1", "c2"):
            both.wait()  # c1 and c2 are written at the same time
        if label == "c2":
            failed.set()
            raise SinkError("chunk c2 failed")
        if label == "c1":
            assert failed.wait(timeout=30)  # still writing when c2 fails

    run = _OverlappedRun(["c1", "c2", "c3", "c4"], write)
    seen: list[str] = []
    with pytest.raises(SinkError, match="c2 failed"):
        write_all(((run, r) for r in run.results()), 2, lambda o, _: seen.append(o.chunk_id))
    assert seen == ["c1"]  # the write under way when c2 failed committed, and counts
    assert run.summary.chunks_done == 1
    assert run.summary.rows == 10
    assert run.submitted == ["c1", "c2"]  # nothing more is taken after a failure


def test_overlapped_writes_keep_at_most_depth_chunks_in_flight() -> None:
    lock = threading.Lock()
    now = [0]
    peak = [0]
    release = threading.Semaphore(0)

    def write(label: str) -> None:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        if now[0] >= 2:
            release.release(2)
        release.acquire(timeout=5)
        with lock:
            now[0] -= 1

    run = _OverlappedRun([f"c{i}" for i in range(8)], write)
    write_all(((run, r) for r in run.results()), 2)
    assert run.summary.chunks_done == 8
    assert peak[0] == 2


HOLDER = """
import sys, time
from sinks.sql.warehouse import SqlWarehouse
sink = SqlWarehouse(sys.argv[1])
sink.open()
print("open", flush=True)
time.sleep(float(sys.argv[2]))
sink.close()
"""


@contextlib.contextmanager
def duckdb_held(url: str, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the DuckDB file at `url` open for `seconds` (killed after)."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, str(seconds)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "open"
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()


def test_a_duckdb_file_another_process_writes_is_waited_for_up_to_busy_wait(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"duckdb:///{tmp_path / 'w.duckdb'}"
    with duckdb_held(url, 3) as child:
        impatient = SqlWarehouse(url, name="wh")
        with pytest.raises(SinkError, match=r"^sink wh: connect: .*Could not set lock"):
            impatient.open()
        patient = SqlWarehouse(url, name="wh", busy_wait_s=60)
        with caplog.at_level("WARNING", logger="historian.sql"):
            patient.open()  # returns once the other process has closed the file
        assert child.wait(timeout=30) == 0
        window = hours(0, 1)
        frame = history(["a"], window)
        assert patient.write(scope(["a"], window), frame, len(frame)) == len(frame)
        patient.close()
    (warning,) = [r.getMessage() for r in caplog.records if "another process" in r.getMessage()]
    assert f"(pid {child.pid}); waiting up to 60 s" in warning


def test_busy_wait_runs_out_with_the_lock_error(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'w.duckdb'}"
    with duckdb_held(url, 60):
        started = time.monotonic()
        with pytest.raises(SinkError, match="Could not set lock"):
            SqlWarehouse(url, name="wh", busy_wait_s=1.5).open()
        assert 1.5 <= time.monotonic() - started < 30
