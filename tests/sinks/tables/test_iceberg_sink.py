"""The Iceberg sink: a chunk's overwrite-by-filter and its record in one catalog commit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from pipelines.config.destinations import make_sink
from pipelines.config.models import ConfigError, parse_config
from sinks.base import FlowLocked, SinkError
from sinks.tables.iceberg import IcebergLake
from tests.fixtures import own_database
from tests.sinks.lake.lake_frames import (
    concat,
    history_frame,
    in_scope,
    rows_of,
    scope,
    window,
)
from tests.sinks.moto_s3 import moto_bucket

TAGS = ("/plant/a", "/plant/b", "/plant/c d")
REPO = str(Path(__file__).resolve().parents[3])


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[IcebergLake]:
    lake = IcebergLake(str(tmp_path / "ice"))
    lake.open()
    yield lake
    lake.close()


def write(sink: IcebergLake, tags: Any, win: Any, chunk: str, **kw: Any) -> int:
    frame = kw.pop("frame", None)
    if frame is None:
        frame = history_frame(tags, win)
    return sink.write(scope(tags, win, chunk, **kw), frame, len(frame))


def snapshots(sink: IcebergLake, dataset: str = "hist") -> int:
    table = sink.catalog.load_table(("historian", dataset))
    return len(table.snapshots())


def test_a_chunk_lands_partitioned_by_day_with_utc_timestamps(
    sink: IcebergLake, tmp_path: Path
) -> None:
    win = window(20, 28)
    frame = history_frame(TAGS, win, twins=True)
    assert write(sink, TAGS, win, "c1", frame=frame) == len(frame)
    got = sink.read("hist", "tag_history")
    assert str(got["ts"].dtype) == "timestamp[ms, tz=UTC][pyarrow]"
    assert rows_of(got) == rows_of(frame)
    table = sink.catalog.load_table(("historian", "hist"))
    assert [f.name for f in table.spec().fields] == ["ts_day"]
    days = sorted(str(p["partition"]["ts_day"]) for p in table.inspect.files().to_pylist())
    assert days == ["2024-03-01", "2024-03-02"]
    assert (tmp_path / "ice" / "catalog.db").is_file()


def test_compact_merges_a_days_small_files_and_keeps_progress(sink: IcebergLake) -> None:
    for n in range(6):
        write(sink, TAGS, window(n, n + 1), f"c{n}")
    table = sink.catalog.load_table(("historian", "hist"))
    assert len(table.inspect.files()) == 6
    expected = rows_of(sink.read("hist", "tag_history"))
    sink.compact("hist")
    table = sink.catalog.load_table(("historian", "hist"))
    assert len(table.inspect.files()) == 1
    assert rows_of(sink.read("hist", "tag_history")) == expected
    assert sink.progress("f").windows_of(TAGS[0]) == [window(0, 6)]
    assert sink.chunk_log("f", limit=1)[0].chunk_id == "c5"


def test_other_readers_see_the_table(sink: IcebergLake, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    frame = history_frame(TAGS, window(0, 3))
    write(sink, TAGS, window(0, 3), "c1", frame=frame)
    table = sink.catalog.load_table(("historian", "hist"))
    got = pl.scan_iceberg(table).collect()
    assert got.height == len(frame)
    assert str(got.schema["ts"]) == "Datetime(time_unit='us', time_zone='UTC')"


def test_type_iceberg_in_flows_yaml_makes_an_iceberg_sink(tmp_path: Path) -> None:
    config = parse_config(
        {
            "nodes": {"n": {"url": "http://127.0.0.1:1"}},
            "sinks": {"i": {"type": "iceberg", "url": "out/ice"}},
            "flows": {
                "f": {"node": "n", "tags": {"paths": ["/a"]}, "start": "-1d", "sinks": ["i"]}
            },
        }
    )
    made = make_sink("i", config.sinks["i"], tmp_path)
    assert isinstance(made, IcebergLake)
    assert made.catalog_url == f"sqlite:///{tmp_path / 'out' / 'ice' / 'catalog.db'}"
    with pytest.raises(SinkError, match="catalog is required for a warehouse on object storage"):
        IcebergLake("s3://bucket/wh")
    on_s3: dict[str, Any] = {
        "nodes": {"n": {"url": "http://127.0.0.1:1"}},
        "sinks": {"i": {"type": "iceberg", "url": "s3://bucket/wh"}},
        "flows": {"f": {"node": "n", "tags": {"paths": ["/a"]}, "start": "-1d", "sinks": ["i"]}},
    }
    with pytest.raises(ConfigError, match=r"^flows\.yaml: sinks\.i: catalog is required"):
        parse_config(on_s3)
    on_s3["sinks"]["i"]["type"] = "tables"
    with pytest.raises(ConfigError, match="type must be parquet, sql, delta or iceberg"):
        parse_config(on_s3)


# -- a PostgreSQL catalog and an S3 warehouse -----------------------------------------------


@pytest.fixture
def pg_catalog(pg_url: str) -> Iterator[str]:
    """A database of its own in the real PostgreSQL for the catalog, dropped after."""
    with own_database(pg_url, "iceberg_catalog") as url:
        yield url


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with moto_bucket("ice") as endpoint:
        yield {
            "s3.endpoint": endpoint,
            "s3.access-key-id": "x",
            "s3.secret-access-key": "x",
            "s3.region": "us-east-1",
        }


@pytest.mark.postgres
def test_s3_warehouse_with_a_postgres_catalog(s3: dict[str, str], pg_catalog: str) -> None:
    sink = IcebergLake("s3://ice/wh", catalog=pg_catalog, properties=s3)
    assert sink.probe() == "bucket s3://ice reachable; catalog reachable"
    sink.open()
    frame = history_frame(TAGS, window(20, 28))
    write(sink, TAGS, window(20, 28), "c1", frame=frame)
    newer = history_frame(TAGS[:1], window(22, 23), step_s=60)
    write(sink, TAGS[:1], window(22, 23), "c2", frame=newer)
    kept = frame.drop(in_scope(frame, TAGS[:1], window(22, 23)).index)
    other = IcebergLake("s3://ice/wh", catalog=pg_catalog, properties=s3)
    assert rows_of(other.read("hist", "tag_history")) == rows_of(concat([kept, newer]))
    assert other.progress("f").windows_of(TAGS[0]) == [window(20, 28)]
    assert [r.chunk_id for r in other.chunk_log("f")] == ["c2", "c1"]
    with (
        sink.lock("f"),
        pytest.raises(FlowLocked, match="lease held in s3://ice/wh"),
        other.lock("f"),
    ):
        pass
    other.close()
    sink.close()


def test_a_commit_another_writer_beat_keeps_both_writers_rows(
    sink: IcebergLake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer that takes no lock of ours (another tool, here pyiceberg itself)
    commits another node's rows after this write loaded the table: the catalog refuses
    this commit; pyiceberg rebases it on the new snapshot (its own retry; when it gives
    up, `sinks.tables.commit_retry` plans the write again), and both writers' rows are there once."""
    import pyarrow as pa

    from sinks.tables.iceberg import iceberg_schema

    write(sink, TAGS, window(0, 1), "c0")
    south = history_frame(TAGS, window(0, 1), node="south")
    planned = IcebergLake._delete_filter
    calls = []

    def beaten(target: Any, chunk_scope: Any) -> Any:
        calls.append(chunk_scope.chunk_id)
        if len(calls) == 1:  # after this write loaded the table, before it commits
            rows = pa.Table.from_pandas(south, preserve_index=False)
            other = IcebergLake(str(tmp_path / "ice"))._table("hist")
            other.append(rows.cast(iceberg_schema("tag_history")))
        return planned(target, chunk_scope)

    monkeypatch.setattr(IcebergLake, "_delete_filter", staticmethod(beaten))
    again = history_frame(TAGS, window(0, 1), step_s=300)
    assert write(sink, TAGS, window(0, 1), "c1", frame=again) == len(again)
    assert calls == ["c1"]
    assert rows_of(sink.read("hist", "tag_history")) == rows_of(concat([again, south]))
    assert snapshots(sink) == 4  # c0; the other writer's; c1's delete and its files


def test_two_writers_creating_the_namespace_at_once_both_open(tmp_path: Path) -> None:
    """pyiceberg's SQL catalog checks for the namespace, then inserts it: of two processes
    that both found it missing, the second hit the catalog's unique key (seen in the
    three-process S3 writers test)."""
    from pyiceberg.catalog.sql import SqlCatalog

    from sinks.tables.iceberg import create_namespace

    uri = f"sqlite:///{tmp_path / 'catalog.db'}"
    first = SqlCatalog("c", uri=uri, warehouse=f"file://{tmp_path}")
    second = SqlCatalog("c", uri=uri, warehouse=f"file://{tmp_path}")
    second.namespace_exists("historian")  # its tables are made before the race
    answers = [False]  # the second checked before the first inserted, then sees it
    original = second.namespace_exists

    def racing(namespace: str) -> bool:
        return answers.pop() if answers else original(namespace)

    second.namespace_exists = racing  # type: ignore[method-assign]
    create_namespace(first, "historian")
    create_namespace(second, "historian")
    assert first.namespace_exists("historian")


def test_two_writers_creating_the_catalog_tables_at_once_both_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening a new SQL catalog creates its tables after checking they are missing: the
    second of two processes that both checked fails on CREATE (seen in the three-process
    writers test). Here the first writer's tables appear between that check and the CREATE."""
    from pyiceberg.catalog.sql import SqlCatalog, SqlCatalogBaseTable

    url = str(tmp_path / "ice")
    creates: list[str] = []
    original = SqlCatalog.create_tables

    def losing_the_race(catalog: SqlCatalog) -> None:
        creates.append("create")
        original(catalog)  # the other writer's tables, made after our check
        SqlCatalogBaseTable.metadata.create_all(catalog.engine, checkfirst=False)

    monkeypatch.setattr(SqlCatalog, "create_tables", losing_the_race)
    lake = IcebergLake(url)
    lake.open()
    try:
        hour = window(0, 1)
        assert write(lake, ["a"], hour, "c1") == len(history_frame(["a"], hour))
    finally:
        lake.close()
    assert creates == ["create"]  # lost once; opened again, the catalog found its tables
