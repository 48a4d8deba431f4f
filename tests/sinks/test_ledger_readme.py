"""The docs' "which tags are incomplete last week" queries (docs/output.md), run exactly as printed, over
a real lake (DuckDB) and a real PostgreSQL the sinks wrote with the ledger beside the rows."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
import sqlalchemy as sa

from connectors.timewindow import Window
from sinks.base import Sink
from sinks.lake.sink import ParquetLake
from sinks.sql.warehouse import SqlWarehouse
from tests.sinks.sql.sql_frames import history, scope

PAGE = Path(__file__).resolve().parents[2] / "docs" / "output.md"


def readme_query(name: str) -> str:
    """The SQL block under `<!-- ledger-query: name -->` in docs/output.md, as printed."""
    found = re.search(
        rf"<!-- ledger-query: {name} -->\n```sql\n(.*?)```", PAGE.read_text(), re.DOTALL
    )
    assert found, f"docs/output.md has no ledger query {name!r}"
    return found.group(1).strip().rstrip(";")


def hour(days_ago: float) -> Window:
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start -= timedelta(days=days_ago)
    return Window(start, start + timedelta(hours=1))


def write_week(sink: Sink) -> None:
    """Two days ago: a, b complete, c left out by the node; ten days ago: d left out (not
    last week); yesterday: a complete again."""
    for members, window in (
        (["a", "b", "missing:c"], hour(2)),
        (["a", "missing:d"], hour(10)),
        (["a"], hour(1)),
    ):
        tags = [m for m in members if not m.startswith("missing:")]
        frame = history(tags, window)
        sink.write(scope(members, window, dataset="history"), frame, len(frame))


EXPECTED = [("node1", "c", 1, "missing")]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the page's query names the lake `lake/`
    return tmp_path


def test_the_readme_query_finds_incomplete_tags_in_a_lake(in_tmp: Path) -> None:
    lake = ParquetLake(str(in_tmp / "lake"))
    lake.open()
    write_week(lake)
    assert duckdb.sql(readme_query("lake")).fetchall() == EXPECTED


@pytest.mark.postgres
def test_the_readme_query_finds_incomplete_tags_in_postgresql(pg_url: str, pg_schema: str) -> None:
    warehouse = SqlWarehouse(pg_url, schema=pg_schema)
    warehouse.open()
    try:
        write_week(warehouse)
    finally:
        warehouse.close()
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text(f'SET search_path TO "{pg_schema}"'))
            assert [tuple(row) for row in conn.execute(sa.text(readme_query("postgres")))] == (
                EXPECTED
            )
    finally:
        engine.dispose()
