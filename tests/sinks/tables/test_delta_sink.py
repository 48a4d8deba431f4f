"""The Delta Lake sink: a chunk's replace and its record in one commit, read back by others."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from deltalake import DeltaTable

from pipelines.config.destinations import make_sink
from pipelines.config.models import parse_config
from sinks.base import CountMismatch, FlowLocked, SinkError
from sinks.tables.delta import DeltaLake, scope_predicate, sql_literal
from tests.sinks.lake.lake_frames import (
    HOSTILE_TAGS,
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


def test_hostile_tag_paths_survive_the_predicate(sink: DeltaLake) -> None:
    tags = [*HOSTILE_TAGS, "back\\'slash'", "x' OR '1'='1"]
    frame = history_frame(tags, window(0, 2), step_s=1800)
    write(sink, tags, window(0, 2), "h1", frame=frame)
    # Replace one hostile tag's rows: the others, whose names look like SQL, stay.
    victim = ["x' OR '1'='1"]
    newer = history_frame(victim, window(0, 2), step_s=3600)
    write(sink, victim, window(0, 2), "h2", frame=newer)
    expected = concat([frame[frame["tag"] != victim[0]], newer])
    assert rows_of(sink.read("hist", "tag_history")) == rows_of(expected)
    assert sql_literal("it's") == "'it''s'"
    assert "tag IN ('x'' OR ''1''=''1')" in scope_predicate(scope(victim, window(0, 2), "h2"))


def test_a_count_mismatch_or_rows_outside_the_scope_commit_nothing(
    sink: DeltaLake, tmp_path: Path
) -> None:
    frame = history_frame(TAGS, window(0, 2))
    write(sink, TAGS, window(0, 2), "c1", frame=frame)
    version = DeltaTable(str(tmp_path / "delta" / "hist")).version()
    with pytest.raises(CountMismatch, match="holds 36 rows, fetched 37: nothing committed"):
        sink.write(scope(TAGS, window(0, 2), "c2"), frame, len(frame) + 1)
    twice = concat([frame, frame.iloc[:1]])
    with pytest.raises(CountMismatch, match="rows share one key"):
        sink.write(scope(TAGS, window(0, 2), "c2"), twice, len(twice))
    with pytest.raises(SinkError, match=r"outside its scope"):
        sink.write(scope(TAGS[:1], window(0, 2), "c2"), frame, len(frame))
    assert DeltaTable(str(tmp_path / "delta" / "hist")).version() == version
    assert [r.chunk_id for r in sink.chunk_log("f")] == ["c1"]


def test_progress_chunk_log_reset_and_forget_come_from_the_log(
    sink: DeltaLake, tmp_path: Path
) -> None:
    for n, start in enumerate(range(0, 12, 3)):
        write(sink, TAGS, window(start, start + 3), f"c{n}")
    write(sink, TAGS[:1], window(0, 3), "other", flow="g")
    assert sink.progress("f").windows_of(TAGS[0]) == [window(0, 12)]
    assert sink.flows() == ["f", "g"]
    log = sink.chunk_log("f")
    assert [r.chunk_id for r in log] == ["c3", "c2", "c1", "c0"]
    assert (log[0].members, log[0].rows_fetched, log[0].rows_committed) == (3, 54, 54)
    assert log[0].committed_at.tzinfo is not None
    # The cache is only a cache: another sink without it reads the same from the log.
    for cache in (tmp_path / "delta" / "_historian" / "progress").iterdir():
        cache.unlink()
    again = DeltaLake(str(tmp_path / "delta"))
    assert again.progress("f").windows_of(TAGS[2]) == [window(0, 12)]
    assert again.forget_after("f", window(0, 7).end) == 2
    assert sink.progress("f").windows_of(TAGS[0]) == [window(0, 6)]
    assert sink.reset("f", TAGS[0]) == 1
    assert sink.progress("f").windows_of(TAGS[0]) == []
    assert sink.progress("f").windows_of(TAGS[1]) == [window(0, 6)]
    write(sink, TAGS, window(6, 9), "c2")  # written again after the forget: counts
    assert sink.progress("f").windows_of(TAGS[1]) == [window(0, 9)]
    assert sink.progress("f").windows_of(TAGS[0]) == [window(6, 9)]
    assert sink.reset("f") == 3
    assert sink.progress("f").completed == {}
    assert sink.progress("g").windows_of(TAGS[0]) == [window(0, 3)]
    assert rows_of(sink.read("hist", "tag_history")), "data stays"


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


def test_probe_creates_nothing_and_the_flow_lock_is_exclusive(tmp_path: Path) -> None:
    root = tmp_path / "new" / "delta"
    fresh = DeltaLake(str(root))
    assert fresh.probe() == f"does not exist yet; {tmp_path} is writable"
    assert not (tmp_path / "new").exists()
    fresh.open()
    with fresh.lock("f"):
        with (
            pytest.raises(FlowLocked, match="flow 'f' is already running"),
            DeltaLake(str(root)).lock("f"),
        ):
            pass
        with fresh.lock("g"):
            pass


def test_other_readers_see_the_table(sink: DeltaLake, tmp_path: Path) -> None:
    frame = history_frame(TAGS, window(0, 3))
    write(sink, TAGS, window(0, 3), "c1", frame=frame)
    got = pl.read_delta(str(tmp_path / "delta" / "hist"))
    assert got.height == len(frame)
    assert str(got.schema["ts"]) == "Datetime(time_unit='us', time_zone='UTC')"
    assert sorted(got["tag"].unique().to_list()) == sorted(TAGS)


def test_a_killed_writer_leaves_each_chunk_whole_or_absent(tmp_path: Path) -> None:
    root = tmp_path / "delta"
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {REPO!r})
        from tests.sinks.lake.lake_frames import history_frame, scope, window
        from sinks.tables.delta import DeltaLake
        sink = DeltaLake({str(root)!r})
        sink.open()
        tags = [f"/t/{{i}}" for i in range(20)]
        n = 0
        while True:
            start = (n % 12) * 2
            frame = history_frame(tags, window(start, start + 2), step_s=60)
            sink.write(scope(tags, window(start, start + 2), f"c{{n % 12}}"), frame, len(frame))
            n += 1
            print(n, flush=True)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert child.stdout is not None
        while int(child.stdout.readline() or b"-1") < 14:
            assert child.poll() is None, "the writer died before the kill"
        time.sleep(0.037)  # somewhere inside the next write
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    sink = DeltaLake(str(root))
    got = sink.read("hist", "tag_history")
    tags = [f"/t/{i}" for i in range(20)]
    full = history_frame(tags, window(0, 24), step_s=60)
    covered = sink.progress("f").windows_of(tags[0])
    assert covered == [window(0, 24)], "every chunk was committed once before the kill"
    assert rows_of(got) == rows_of(full)
    assert len(sink.chunk_log("f")) == 12


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
