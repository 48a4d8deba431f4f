"""The lake's partition schemes: `auto` sizes a dataset's partitions to its chunks, once;
compaction merges only the files small enough to be worth a rewrite."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path

import duckdb
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from connectors.timewindow import Window
from sinks.base import ChunkScope, SinkError
from sinks.lake.sink import ParquetLake
from sinks.store.layout import auto_partition, is_data_file, partition_of_rows
from tests.sinks.lake.lake_frames import history_frame, rows_of, scope, window

TAGS = ("/plant/a", "/plant/b", "/plant/c", "/plant/d")
DAY = timedelta(days=1)


def files(root: Path, dataset: str = "hist") -> list[str]:
    """Files of the dataset's directory, but emptied data files (0 rows, left for readers
    that listed them before, removed by a later compaction)."""
    return sorted(
        str(p.relative_to(root / dataset))
        for p in (root / dataset).rglob("*")
        if p.is_file() and not (is_data_file(p.name) and pq.read_metadata(p).num_rows == 0)
    )


def recorded_scheme(root: Path, dataset: str = "hist") -> str:
    facts = orjson.loads((root / "_historian" / dataset / "dataset.json").read_bytes())
    return str(facts["partition"])


def chunk(win: Window, chunk_id: str, size: timedelta | None) -> ChunkScope:
    return dataclasses.replace(scope(TAGS, win, chunk_id), window_size=size)


def write(lake: ParquetLake, win: Window, chunk_id: str, size: timedelta | None) -> None:
    frame = history_frame(TAGS, win, step_s=3600)
    lake.write(chunk(win, chunk_id, size), frame, len(frame))


@pytest.mark.parametrize(
    ("size", "scheme"),
    [
        (timedelta(minutes=20), "date"),
        (DAY, "date"),
        (timedelta(days=2), "month"),
        (timedelta(days=7), "month"),
        (timedelta(days=31), "year"),
        (timedelta(weeks=13), "year"),
        (timedelta(days=366), "none"),
    ],
)
def test_auto_picks_the_finest_scheme_a_chunk_rarely_straddles(
    size: timedelta, scheme: str
) -> None:
    assert auto_partition(size) == scheme


def test_auto_writes_a_week_chunk_as_one_file_and_records_its_scheme(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    assert lake.describe().endswith("(partition=auto)")
    write(lake, window(0, 7 * 24), "w1", 7 * DAY)
    assert files(tmp_lake) == ["node-n1/month=2024-03/part-w1.parquet"]
    assert recorded_scheme(tmp_lake) == "month"


def test_auto_follows_the_flows_chunk_size_not_a_clipped_first_window(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    write(lake, window(20, 22), "clipped", 7 * DAY)  # a span's first window, 2 h of a week
    write(lake, window(22, 24 * 5), "next", 7 * DAY)
    assert recorded_scheme(tmp_lake) == "month"
    assert files(tmp_lake) == [
        "node-n1/month=2024-03/part-clipped.parquet",
        "node-n1/month=2024-03/part-next.parquet",
    ]
    # Without the flow's size, the chunk's own window decides.
    write(lake, window(0, 2), "alone", None)
    assert recorded_scheme(tmp_lake) == "month", "a dataset keeps its scheme"
    other = scope(TAGS, window(0, 2), "o1", dataset="other")
    frame = history_frame(TAGS, window(0, 2))
    lake.write(other, frame, len(frame))
    assert recorded_scheme(tmp_lake, "other") == "date"


def test_a_dataset_keeps_the_scheme_it_was_created_with(tmp_lake: Path) -> None:
    write(ParquetLake(str(tmp_lake), partition="date"), window(0, 48), "d1", DAY)
    auto = ParquetLake(str(tmp_lake))
    write(auto, window(48, 48 + 7 * 24), "w1", 7 * DAY)
    assert recorded_scheme(tmp_lake) == "date"
    assert all(name.startswith("node-n1/date=") for name in files(tmp_lake))
    assert len(files(tmp_lake)) == 2 + 7
    expected = rows_of(history_frame(TAGS, window(0, 48 + 7 * 24), step_s=3600))
    assert rows_of(auto.read("hist", "tag_history")) == expected
    with pytest.raises(SinkError, match=r"partitioned by date, not month.*partition: auto"):
        write(ParquetLake(str(tmp_lake), partition="month"), window(0, 2), "m1", DAY)


def test_readers_see_the_partition_column_the_scheme_names(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake))
    write(lake, window(0, 7 * 24), "w1", 7 * DAY)
    year = ParquetLake(str(tmp_lake), partition="year")
    win = window(0, 31 * 24)
    frame = history_frame(TAGS, win, step_s=3600)
    year.write(scope(TAGS, win, "y1", dataset="yearly"), frame, len(frame))
    assert files(tmp_lake, "yearly") == ["node-n1/year=2024/part-y1.parquet"]
    con = duckdb.connect()
    for dataset, column, value in (("hist", "month", "2024-03"), ("yearly", "year", "2024")):
        glob = f"{tmp_lake}/{dataset}/**/*.parquet"
        found = con.sql(
            f"select distinct {column}::varchar, count(*) over () from "
            f"read_parquet('{glob}', hive_partitioning=1)"
        ).fetchall()
        assert found[0][0] == value
    assert rows_of(year.read("yearly", "tag_history")) == rows_of(frame)


def test_compaction_merges_small_files_and_leaves_well_sized_ones(tmp_lake: Path) -> None:
    lake = ParquetLake(str(tmp_lake), partition="none", target_file_rows=2000)
    assert lake.small_file_rows() == 100
    for i in range(3):  # 4 tags x 48 hours: 192 rows, well-sized
        write(lake, window(i * 48, i * 48 + 48), f"big{i}", DAY)
    for i in range(4):  # 4 tags x 6 hours: 24 rows, small
        write(lake, window(200 + i * 6, 206 + i * 6), f"small{i}", DAY)
    big = {name: (tmp_lake / "hist" / name).stat().st_mtime_ns for name in files(tmp_lake)[:3]}
    assert all("big" in name for name in big)
    before = rows_of(lake.read("hist", "tag_history"))
    assert lake.compact("hist") == 4
    after = files(tmp_lake)
    assert after == [*big, "node-n1/part-small3.parquet"], "merged into the last small file's name"
    assert pq.read_metadata(tmp_lake / "hist/node-n1/part-small3.parquet").num_rows == 4 * 24
    assert {name: (tmp_lake / "hist" / name).stat().st_mtime_ns for name in big} == big
    assert rows_of(lake.read("hist", "tag_history")) == before
    assert lake.compact("hist") == 0, "one small file is left alone"


@pytest.mark.parametrize(
    ("days", "scheme", "labels"),
    [
        ((0, 6), "month", ["month=2024-03"]),
        ((0, 6), "date", ["date=2024-03-01", "date=2024-03-07"]),
        ((30, 31), "month", ["month=2024-03", "month=2024-04"]),
        ((0, 400), "year", ["year=2024", "year=2025"]),
        ((0, 400), "none", [""]),
    ],
)
def test_rows_go_to_the_partition_of_their_day(
    days: tuple[int, int], scheme: str, labels: list[str]
) -> None:
    first = window(0, 1).start_ms
    ts = pa.chunked_array([[first + day * 86_400_000 for day in days]], pa.int64())
    index, found = partition_of_rows(ts.cast(pa.timestamp("ms", tz="UTC")), scheme)
    assert found == labels
    assert [found[i] for i in index] == [labels[0], labels[-1]]
