"""The Delta Lake sink: a chunk's replace and its record in one commit, read back by others."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from deltalake import DeltaTable

from pipelines.config.destinations import make_sink
from pipelines.config.models import parse_config
from sinks.base import FlowLocked, SinkError
from sinks.tables.delta import DeltaLake, scope_predicate, sql_literal
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
def sink(tmp_path: Path) -> DeltaLake:
    delta = DeltaLake(str(tmp_path / "delta"))
    delta.open()
    return delta


def write(sink: DeltaLake, tags: Any, win: Any, chunk: str, **kw: Any) -> int:
    frame = kw.pop("frame", None)
    if frame is None:
        frame = history_frame(tags, win)
    return sink.write(scope(tags, win, chunk, **kw), frame, len(frame))


def test_a_chunk_lands_partitioned_by_day_with_utc_timestamps(
    sink: DeltaLake, tmp_path: Path
) -> None:
    win = window(20, 28)  # crosses midnight
    frame = history_frame(TAGS, win, twins=True)
    assert write(sink, TAGS, win, "c1", frame=frame) == len(frame)
    got = sink.read("hist", "tag_history")
    assert str(got["ts"].dtype) == "timestamp[ms, tz=UTC][pyarrow]"
    assert rows_of(got) == rows_of(frame)
    table = DeltaTable(str(tmp_path / "delta" / "hist"))
    assert table.metadata().partition_columns == ["date"]
    days = sorted(p.name for p in (tmp_path / "delta" / "hist").iterdir() if "=" in p.name)
    assert days == ["date=2024-03-01", "date=2024-03-02"]


def test_the_tag_list_is_left_out_only_when_the_window_holds_no_other_tag(
    sink: DeltaLake, tmp_path: Path
) -> None:
    def last_predicate() -> str:
        commit = DeltaTable(str(tmp_path / "delta" / "hist")).history(1)[0]
        return str(commit["operationParameters"]["predicate"])

    frame = history_frame(TAGS, window(0, 2))
    write(sink, TAGS, window(0, 2), "c1", frame=frame)
    write(sink, TAGS, window(0, 2), "c1", frame=frame)  # only its own tags there
    assert "tag" not in last_predicate()
    newer = history_frame(TAGS[:1], window(0, 2), step_s=300)
    write(sink, TAGS[:1], window(0, 2), "c2", frame=newer)  # beside other tags' rows
    assert "tag = '/plant/a'" in last_predicate()
    expected = concat([frame[frame["tag"] != TAGS[0]], newer])
    assert rows_of(sink.read("hist", "tag_history")) == rows_of(expected)


def test_compact_merges_small_files_and_keeps_old_versions_readable(
    sink: DeltaLake, tmp_path: Path
) -> None:
    for n in range(6):
        write(sink, TAGS, window(n, n + 1), f"c{n}")
    path = str(tmp_path / "delta" / "hist")
    before = DeltaTable(path)
    files_before, version_before = len(before.file_uris()), before.version()
    expected = rows_of(sink.read("hist", "tag_history"))
    sink.compact("hist")
    after = DeltaTable(path)
    assert len(after.file_uris()) == 1 < files_before
    assert rows_of(sink.read("hist", "tag_history")) == expected
    # vacuum honours the 7-day retention: the version before compaction still reads.
    old = DeltaTable(path, version=version_before)
    assert old.to_pyarrow_table().num_rows == len(expected)
    assert sink.progress("f").windows_of(TAGS[0]) == [window(0, 6)]


def test_a_tag_path_enters_the_predicate_as_a_quoted_literal() -> None:
    victim = ["x' OR '1'='1"]
    assert sql_literal("it's") == "'it''s'"
    assert "tag IN ('x'' OR ''1''=''1')" in scope_predicate(scope(victim, window(0, 2), "h2"))
    with pytest.raises(SinkError, match="NUL character"):
        sql_literal("a\x00b")


def test_other_readers_see_the_table(sink: DeltaLake, tmp_path: Path) -> None:
    frame = history_frame(TAGS, window(0, 3))
    write(sink, TAGS, window(0, 3), "c1", frame=frame)
    got = pl.read_delta(str(tmp_path / "delta" / "hist"))
    assert got.height == len(frame)
    assert str(got.schema["ts"]) == "Datetime(time_unit='us', time_zone='UTC')"
    assert sorted(got["tag"].unique().to_list()) == sorted(TAGS)


# -- configuration -------------------------------------------------------------------------


def test_type_delta_in_flows_yaml_makes_a_delta_sink(tmp_path: Path) -> None:
    config = parse_config(
        {
            "nodes": {"n": {"url": "http://127.0.0.1:1"}},
            "sinks": {"d": {"type": "delta", "url": "out/delta"}},
            "flows": {
                "f": {"node": "n", "tags": {"paths": ["/a"]}, "start": "-1d", "sinks": ["d"]}
            },
        }
    )
    made = make_sink("d", config.sinks["d"], tmp_path)
    assert isinstance(made, DeltaLake)
    assert made.url == str(tmp_path / "out" / "delta")
    assert made.describe() == f"delta lake 'd' at {tmp_path / 'out' / 'delta'}"


# -- S3 (moto on loopback) -----------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with moto_bucket("delta") as endpoint:
        yield {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }


def test_s3_write_replace_progress_compact_and_lease(s3: dict[str, str]) -> None:
    sink = DeltaLake("s3://delta/one", storage_options=s3)
    assert sink.probe() == "bucket s3://delta reachable"
    sink.open()
    frame = history_frame(TAGS, window(20, 28))
    write(sink, TAGS, window(20, 28), "c1", frame=frame)
    newer = history_frame(TAGS[:1], window(22, 23), step_s=60)
    write(sink, TAGS[:1], window(22, 23), "c2", frame=newer)
    sink.compact("hist")
    kept = frame[~frame.index.isin(in_scope(frame, TAGS[:1], window(22, 23)).index)]
    other = DeltaLake("s3://delta/one", storage_options=s3)
    assert rows_of(other.read("hist", "tag_history")) == rows_of(concat([kept, newer]))
    assert other.progress("f").windows_of(TAGS[0]) == [window(20, 28)]
    assert [r.chunk_id for r in other.chunk_log("f")] == ["c2", "c1"]
    with (
        sink.lock("f"),
        pytest.raises(FlowLocked, match="lease held in s3://delta/one"),
        other.lock("f"),
    ):
        pass
    missing = DeltaLake("s3://nobucket/x", storage_options=s3)
    with pytest.raises(SinkError, match="s3://nobucket does not exist"):
        missing.probe()
    assert os.environ.get("AWS_ENDPOINT_URL") is None
