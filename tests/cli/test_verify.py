"""`historian verify` end to end (issue 28): rows lost from a lake, DuckDB and PostgreSQL
after their chunks were committed are named, `verify --repair` plus a backfill brings back
exactly the simulator's rows, and a truncated lake file is named (with the command that
repairs it) by every command that meets it, never a bare "magic bytes not found"."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from sinks.sql.warehouse import SqlWarehouse
from tests.cli.test_cli import assert_clean_failure, historian, small_flow
from tests.fixtures import history_rows, truth_history_rows, write_config

END = (datetime.now(UTC) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
START = END - timedelta(hours=3)
LOST = Window(START + timedelta(hours=1), START + timedelta(hours=2))
TAGS_UNDER = "/Plant A/"


@pytest.fixture(scope="module")
def node() -> Iterator[Any]:
    with run_server(SimulatedNode(SimConfig(seed=28, tags=12)), http_port=0, https_port=0) as h:
        yield h


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[tuple[str, str]]:
    name = f"verify_{uuid.uuid4().hex[:8]}"
    yield pg_url, name
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
    engine.dispose()


def flow() -> dict[str, Any]:
    return small_flow(
        tags={"group": TAGS_UNDER, "recurrent": True}, window="1h", start=START.isoformat()
    )


def backfill(tmp_path: Path) -> None:
    done = historian(
        "backfill", "f", "--start", START.isoformat(), "--end", END.isoformat(), "--direct",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def truth(node: Any, tags: list[str]) -> list[tuple[Any, ...]]:
    return truth_history_rows(node.node, tags, [Window(START, END)], HistoryOptions(mode="raw"))


def lake_rows(tmp_path: Path) -> list[tuple[Any, ...]]:
    return history_rows(pd.read_parquet(tmp_path / "lake" / "f"))


def lake_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "lake" / "f").rglob("*.parquet"))


def file_of(tmp_path: Path, window: Window) -> Path:
    """The lake file holding the window's rows (after the run's compaction, every chunk's)."""
    for path in lake_files(tmp_path):
        found = pd.read_parquet(path, columns=["ts"])["ts"]
        if ((found >= window.start) & (found < window.end)).any():
            return path
    raise AssertionError(f"no file holds {window}")


def warehouse(url: str, schema: str | None = None) -> SqlWarehouse:
    made = SqlWarehouse(url, schema=schema)
    made.open()
    return made


def delete_window(made: SqlWarehouse, table: str, window: Window) -> int:
    with made.engine.begin() as conn:
        done = conn.execute(
            sa.text(f"DELETE FROM {made.layout.table(table)} WHERE ts >= :s AND ts < :e"),
            {"s": window.start, "e": window.end},
        )
        return int(done.rowcount or 0)


def sql_rows(made: SqlWarehouse) -> list[tuple[Any, ...]]:
    return history_rows(made.read("f", "tag_history"))


def test_verify_names_rows_lost_from_each_sink_and_repair_then_backfill_restores_them(
    tmp_path: Path, node: Any, pg_schema: tuple[str, str]
) -> None:
    write_config(tmp_path, node={"url": node.http_url}, flows={"f": flow()}, pg=pg_schema)
    backfill(tmp_path)
    tags = sorted({row[0] for row in lake_rows(tmp_path)})
    want = truth(node, tags)
    assert want
    assert lake_rows(tmp_path) == want
    clean = historian("verify", "f", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    assert "verified 9 chunks of f: every one holds its rows" in clean.stdout

    lost_file = file_of(tmp_path, LOST)
    lost_file.unlink()
    pg = warehouse(*pg_schema)
    duck = warehouse(f"duckdb:///{tmp_path / 'warehouse.duckdb'}")
    try:
        assert delete_window(pg, "historian_rows_f", LOST) > 0
        delete_window(duck, "f", LOST)  # DuckDB reports no row count
    finally:
        pg.close()
        duck.close()

    found = historian("verify", "f", cwd=tmp_path)
    assert_clean_failure(found, 1, "3 damages in 9 committed chunks of f", "verify f --repair")
    lines = found.stdout.splitlines()
    window = str(LOST)
    [line] = [line for line in lines if "f -> lake:" in line]
    # The file holds the chunks of its day (compacted after the run): LOST's and others.
    assert f"{lost_file} [" in line
    assert "): missing (recorded with" in line
    for sink in ("duck", "pg"):
        [line] = [line for line in lines if f"f -> {sink}:" in line]
        assert window in line
        assert "holds 0 rows, recorded" in line
        assert '"f"' in line

    fixed = historian("verify", "f", "--repair", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    assert re.search(r"forgot [123] chunks of f in lake", fixed.stdout), fixed.stdout
    backfill(tmp_path)
    assert lake_rows(tmp_path) == want
    for made in (warehouse(*pg_schema), warehouse(f"duckdb:///{tmp_path / 'warehouse.duckdb'}")):
        try:
            assert sql_rows(made) == want
        finally:
            made.close()
    assert historian("verify", "f", cwd=tmp_path).returncode == 0


def test_truncated_lake_file_is_named_by_every_command_until_verify_repairs_it(
    tmp_path: Path, node: Any
) -> None:
    write_config(tmp_path, node={"url": node.http_url}, flows={"f": flow()}, sinks=["lake"])
    backfill(tmp_path)
    want = lake_rows(tmp_path)
    cut = file_of(tmp_path, LOST)
    truncated = cut.read_bytes()[:1000]
    cut.write_bytes(truncated)
    # The file by its path in the lake: an error line cuts long values (a test's tmp_path).
    named = (f"data file {cut.relative_to(tmp_path / 'lake')} in ", "historian verify f --repair")

    again = historian(
        "run", "f", "--start", START.isoformat(), "--end", END.isoformat(), "--direct",
        cwd=tmp_path,
    )  # fmt: skip
    assert_clean_failure(again, 1, *named)
    report = historian("report", "f", "--out", str(tmp_path / "r.html"), cwd=tmp_path)
    assert_clean_failure(report, 1, *named)
    found = historian("verify", "f", "--start", LOST.start.isoformat(), cwd=tmp_path)
    assert_clean_failure(found, 1, "1 damages in 2 committed chunks of f")
    assert str(cut) in found.stdout
    assert "unreadable: Parquet magic bytes" in found.stdout

    fixed = historian("verify", "f", "--repair", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    moved = tmp_path / "lake" / "_quarantine" / "f" / cut.relative_to(tmp_path / "lake" / "f")
    assert f"moved {cut} to {moved}" in fixed.stdout.replace("\n", "")
    assert moved.read_bytes() == truncated, "kept, moved aside, never deleted"
    assert not cut.exists()

    backfill(tmp_path)
    assert lake_rows(tmp_path) == want
    assert historian("verify", "f", cwd=tmp_path).returncode == 0


def table_sink(tmp_path: Path, name: str) -> Any:
    from sinks.tables.delta import DeltaLake
    from sinks.tables.iceberg import IcebergLake

    if name == "delta":
        made: Any = DeltaLake(str(tmp_path / "delta"), name="delta")
    else:  # its default catalog: an SQLite file beside the warehouse, as the config's
        made = IcebergLake(str(tmp_path / "iceberg"), name="ice")
    made.open()
    return made


def test_verify_names_table_files_removed_and_repair_then_backfill_restores_them(
    tmp_path: Path, node: Any
) -> None:
    sinks = ["delta", "ice"]
    write_config(tmp_path, node={"url": node.http_url}, flows={"f": flow()}, sinks=sinks)
    backfill(tmp_path)
    removed = []
    for name in ("delta", "iceberg"):
        made = table_sink(tmp_path, name)
        try:
            tags = sorted({row[0] for row in history_rows(made.read("f", "tag_history"))})
            [lost] = [
                f.path
                for f in made._table_files().data_files("f")
                if f.ts_min_ms < LOST.end_ms and f.ts_max_ms >= LOST.start_ms
            ]
            assert made.store.remove(lost)
            removed.append(lost)
        finally:
            made.close()
    want = truth(node, tags)

    found = historian("verify", "f", cwd=tmp_path)
    assert_clean_failure(found, 1, "2 damages in 6 committed chunks of f")
    for sink, lost in zip(sinks, removed, strict=True):
        [line] = [line for line in found.stdout.splitlines() if f"f -> {sink}:" in line]
        assert lost in line
        assert "missing (logged with" in line

    fixed = historian("verify", "f", "--repair", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    backfill(tmp_path)
    for name in ("delta", "iceberg"):
        made = table_sink(tmp_path, name)
        try:
            assert history_rows(made.read("f", "tag_history")) == want
        finally:
            made.close()
    assert historian("verify", "f", cwd=tmp_path).returncode == 0


def test_verify_usage_errors_are_one_line_exit_2(tmp_path: Path) -> None:
    write_config(tmp_path, node={"url": "http://127.0.0.1:1"}, flows={"f": flow()}, sinks=["lake"])
    assert "verify" in historian("--help", cwd=tmp_path).stdout
    unknown = historian("verify", "nope", cwd=tmp_path)
    assert_clean_failure(unknown, 2, "no flow named 'nope'")
    backwards = historian("verify", "f", "--start", "-1h", "--end", "-2h", cwd=tmp_path)
    assert_clean_failure(backwards, 2, "--end must be after --start")
    bad = historian("verify", "f", "--start", "yesterday-ish", cwd=tmp_path)
    assert_clean_failure(bad, 2, "--start")
    empty = historian("verify", "f", cwd=tmp_path)
    assert empty.returncode == 0, empty.stderr
    assert "verified 0 chunks of f: nothing committed to check" in empty.stdout
