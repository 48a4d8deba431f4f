"""MariaDB/MySQL specifics: the LOAD DATA encoding, URLs, errors, values it cannot hold.

What every warehouse does is in test_contract.py and test_sql_sink.py (both run against
the real MariaDB); here is only what is MariaDB's own.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from connectors import schema
from connectors.timewindow import Window
from sinks.base import SinkError, SinkUnavailable
from sinks.sql.mysql import tsv_bytes
from sinks.sql.warehouse import SqlWarehouse
from tests.sinks.sql.sql_frames import rows, scope

ALARM = schema.KIND_ALARM_HISTORY


def test_load_data_text_escapes_separators_and_tells_null_from_empty() -> None:
    table = pa.table(
        {
            "text": pa.array(["tab\there", "new\nline\r", "back\\slash", None, "", "\\N"]),
            "number": pa.array([1.5, float("nan"), float("inf"), None, -0.0, 2.0]),
            "flag": pa.array([True, False, None, True, False, None]),
            "ts": pa.array([0, 1, -1, 1_709_251_200_123, None, 7], pa.timestamp("ms", tz="UTC")),
        }
    )
    lines = bytes(tsv_bytes(table)).decode().split("\n")
    assert lines == [
        "tab\\there\t1.5\t1\t0",
        "new\\nline\\r\t\\N\t0\t1",  # NaN and infinity: no DOUBLE holds them
        "back\\\\slash\t\\N\t\\N\t-1",
        "\\N\t\\N\t1\t1709251200123",
        "\t-0\t0\t\\N",  # '' is not NULL
        "\\\\N\t2\t\\N\t7",  # the text \N is not NULL either
        "",
    ]


def test_an_empty_table_is_no_bytes() -> None:
    assert bytes(tsv_bytes(pa.table({"a": pa.array([], pa.string())}))) == b""


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("mysql://root@127.0.0.1/test", "PyMySQL"),
        ("mysql+mysqldb://root@127.0.0.1/test", "PyMySQL"),
        ("mariadb+pymysql://root@127.0.0.1", "names no database"),
        ("oracle://scott@db/x", "oracle is not supported"),
    ],
)
def test_urls_it_cannot_use_are_refused_in_one_line(url: str, problem: str) -> None:
    with pytest.raises(SinkError, match=problem) as caught:
        SqlWarehouse(url)
    assert "\n" not in str(caught.value)


def test_an_unreachable_server_is_unavailable_in_one_line_without_the_password() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    sink = SqlWarehouse(
        f"mysql+pymysql://etl:s3cr%40t@127.0.0.1:{port}/plant", name="wh", retry_s=0
    )
    with pytest.raises(SinkUnavailable) as caught:
        sink.open()
    message = str(caught.value)
    assert message.startswith("sink wh: connect: database unavailable")
    assert "s3cr@t" not in message
    assert "\n" not in message


@pytest.fixture
def maria(mariadb_url: str, mariadb_schema: str) -> Iterator[SqlWarehouse]:
    sink = SqlWarehouse(mariadb_url, schema=mariadb_schema)
    sink.open()
    yield sink
    sink.close()


@pytest.mark.mariadb
def test_a_value_the_column_cannot_hold_fails_the_write_and_commits_nothing(
    maria: SqlWarehouse,
) -> None:
    # A table made by hand before (kept, missing columns added): its text is too narrow.
    with maria.engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE {maria.layout.table('alarms')} (node VARCHAR(20) NOT NULL, "
            "path VARCHAR(50) NOT NULL, ts DATETIME(3) NOT NULL, status SMALLINT NOT NULL, "
            "description VARCHAR(3), PRIMARY KEY (node, path, ts, status))"
        )
    window = Window(datetime(2024, 3, 1, tzinfo=UTC), datetime(2024, 3, 2, tzinfo=UTC))
    frame = rows(
        ALARM,
        [{"node": "n", "path": "/a", "ts": window.start, "status": 1, "description": "long"}],
    )
    attrs = {"kind": ALARM}
    alarm_scope = scope(["/"], window, dataset="alarms", kind=ALARM, attrs=attrs, node="n")
    with pytest.raises(SinkError, match=r"1 of 1 rows loaded .*: Data truncated"):
        maria.write(alarm_scope, frame, 1)
    assert maria.read("alarms", ALARM).empty
    assert maria.progress("f1").completed == {}


@pytest.mark.mariadb
def test_the_session_is_utc_whatever_the_server_zone(maria: SqlWarehouse) -> None:
    with maria.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT @@session.time_zone").scalar() == "+00:00"
        modes = str(conn.exec_driver_sql("SELECT @@session.sql_mode").scalar())
    assert "ANSI_QUOTES" in modes.split(",")
