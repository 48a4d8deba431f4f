"""The Parquet lake: exactly-once writes, overlap, crash recovery, locks, readers, S3."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from connectors import schema
from sinks.base import FlowLocked, Sink, SinkError, SinkUnavailable
from sinks.lake.sink import ParquetLake
from sinks.store.layout import is_data_file
from tests.sinks.contract_ledger import assert_ledger_holds
from tests.sinks.lake.lake_frames import (
    ATTRS,
    HOSTILE_TAGS,
    alarm_frame,
    concat,
    history_frame,
    in_scope,
    metadata_frame,
    rows_of,
    scope,
    window,
)
from tests.sinks.lake.stores import Crash, Crasher, HookedStore

TAGS = ("/plant/a", "/plant/b", "/plant/c", "/plant/d")
KEY = ["node", "tag", "ts", "seq"]


@pytest.fixture
def store(tmp_lake: Path) -> HookedStore:
    """The `lake` fixture's store: a test hooks its file operations here."""
    return HookedStore(str(tmp_lake))


@pytest.fixture
def lake(tmp_lake: Path, store: HookedStore) -> Iterator[ParquetLake]:
    sink = ParquetLake(str(tmp_lake), name="lake", store=store)
    sink.open()
    yield sink
    sink.close()


def write(sink: ParquetLake, members: Any, win: Any, chunk: str, **kw: Any) -> int:
    step = kw.pop("step_s", 600)
    frame = kw.pop("frame", None)
    if frame is None:
        frame = history_frame(members, win, step_s=step)
    return sink.write(scope(members, win, chunk, **kw), frame, len(frame))


def data_files(root: Path, dataset: str = "hist") -> list[str]:
    """Files of the dataset's directory, but emptied data files (0 rows, left for readers
    that listed them before, removed by a later compaction)."""
    return sorted(
        str(p.relative_to(root / dataset))
        for p in (root / dataset).rglob("*")
        if p.is_file() and not (is_data_file(p.name) and pq.read_metadata(p).num_rows == 0)
    )


def external_rows(root: Path, dataset: str = "hist") -> pa.Table:
    """What an outside reader (pyarrow.dataset on the directory) sees right now."""
    if not (root / dataset).exists():
        return schema.TAG_HISTORY_SCHEMA.empty_table()
    found = pads.dataset(str(root / dataset), format="parquet", partitioning="hive")
    return found.to_table(columns=schema.TAG_HISTORY_SCHEMA.names)


def keys_of_table(table: pa.Table) -> set[tuple[Any, ...]]:
    columns = [table.column(k).to_pylist() for k in KEY]
    return {(n, t, int(ts.timestamp() * 1000), q) for n, t, ts, q in zip(*columns, strict=True)}


def keys_of_rows(rows: list[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """Keys (node, tag, ts ms, seq) of `rows_of` tuples."""
    return {row[:4] for row in rows}


def assert_at_most_once(table: pa.Table) -> None:
    keys = table.select(KEY).group_by(KEY).aggregate([([], "count_all")])
    assert keys.num_rows == table.num_rows, "a row is visible twice"


def test_is_a_sink_and_describes_itself_without_secrets(tmp_lake: Path) -> None:
    sink = ParquetLake(
        "s3://user:pa55word@bucket/prefix?token=abc", storage_options={"secret": "s3cr3t"}
    )
    assert isinstance(sink, Sink)
    for text in (sink.describe(), repr(sink)):
        assert "s3://bucket/prefix" in text
        assert "pa55word" not in text
        assert "s3cr3t" not in text
        assert "abc" not in text
    local = ParquetLake(str(tmp_lake), partition="month")
    assert local.describe() == f"parquet lake 'lake' at {tmp_lake} (partition=month)"
    with pytest.raises(SinkError, match="partition 'week'"):
        ParquetLake(str(tmp_lake), partition="week")


def test_write_lays_out_hive_partitions_and_reads_back_typed(
    lake: ParquetLake, tmp_lake: Path
) -> None:
    win = window(20, 28)  # crosses midnight: two date partitions
    frame = history_frame(TAGS, win, twins=True)
    assert lake.write(scope(TAGS, win, "c1"), frame, len(frame)) == len(frame)
    assert data_files(tmp_lake) == [
        "node-n1/date=2024-03-01/part-c1.parquet",
        "node-n1/date=2024-03-02/part-c1.parquet",
    ]
    got = lake.read("hist", "tag_history")
    assert list(got.columns) == schema.TAG_HISTORY_SCHEMA.names
    assert str(got["ts"].dtype) == "timestamp[ms, tz=UTC][pyarrow]"
    assert got.dtypes.to_dict() == schema.empty_frame("tag_history").dtypes.to_dict()
    assert rows_of(got) == rows_of(frame)
    ordered = got.sort_values(KEY, kind="stable").reset_index(drop=True)
    assert got.reset_index(drop=True).equals(ordered), "read() is sorted by the key"
    meta = pq.read_schema(tmp_lake / "hist/node-n1/date=2024-03-01/part-c1.parquet").metadata
    assert b'"mode":"raw"' in meta[b"historian"]
    assert lake.read("other", "tag_history").empty
    assert lake.read("other", "tag_history").dtypes.equals(got.dtypes)


def test_same_scope_twice_gives_the_same_rows_and_files(lake: ParquetLake, tmp_lake: Path) -> None:
    win = window(0, 6)
    write(lake, TAGS, win, "c1")
    first, files = rows_of(lake.read("hist", "tag_history")), data_files(tmp_lake)
    write(lake, TAGS, win, "c1")
    assert rows_of(lake.read("hist", "tag_history")) == first
    assert data_files(tmp_lake) == files
    # A late sample in the same scope: the re-write replaces, it does not append.
    late = history_frame(TAGS, win, step_s=300)
    lake.write(scope(TAGS, win, "c1"), late, len(late))
    assert rows_of(lake.read("hist", "tag_history")) == rows_of(late)


@pytest.mark.parametrize("partition", ["date", "month", "none"])
def test_overlap_with_another_window_size_leaves_every_row_once(
    tmp_lake: Path, partition: str
) -> None:
    sink = ParquetLake(str(tmp_lake), partition=partition)
    # First run: 6 h windows over two tag batches; second run: 4 h windows, other batches.
    for i, start in enumerate(range(0, 48, 6)):
        write(sink, TAGS[:2], window(start, start + 6), f"a{i}")
        write(sink, TAGS[2:], window(start, start + 6), f"b{i}")
    for i, start in enumerate(range(2, 46, 4)):
        write(sink, TAGS[1:], window(start, start + 4), f"c{i}")
    expected = history_frame(TAGS, window(0, 48))
    got = sink.read("hist", "tag_history")
    assert rows_of(got) == rows_of(expected)
    assert_at_most_once(external_rows(tmp_lake))
    progress = sink.progress("f")
    for tag in TAGS:
        assert progress.windows_of(tag) == [window(0, 48)]
    names = data_files(tmp_lake)
    expected_dirs = {
        "date": "node-n1/date=2024-03-0",
        "month": "node-n1/month=2024-03/",
        "none": "node-n1/part-",
    }
    assert all(name.startswith(expected_dirs[partition]) for name in names), names


def test_a_chunk_split_over_target_rows_replaces_its_pieces(tmp_lake: Path) -> None:
    sink = ParquetLake(str(tmp_lake), target_file_rows=50)
    win = window(0, 12)
    write(sink, TAGS, win, "big", step_s=600)  # 288 rows -> 6 pieces
    assert data_files(tmp_lake) == [
        f"node-n1/date=2024-03-01/part-big-{n}.parquet" for n in range(1, 7)
    ]
    write(sink, TAGS, win, "big", step_s=1200)  # 144 rows -> 3 pieces, old pieces emptied
    pieces = data_files(tmp_lake)
    assert len(pieces) == 3
    assert all(name.startswith("node-n1/date=2024-03-01/part-big-") for name in pieces), pieces
    assert rows_of(sink.read("hist", "tag_history")) == rows_of(
        history_frame(TAGS, win, step_s=1200)
    )
    assert rows_of(sink.read("hist", "tag_history")) == rows_of(
        history_frame(TAGS, win, step_s=1200)
    )


def _encoded(frame: pd.DataFrame, extra_names: tuple[str, ...] = ()) -> pd.DataFrame:
    """`frame` with `node` and `tag` dictionary-encoded as the engine hands them over: the
    dictionary in reverse order, with `extra_names` that no row uses."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    for name in ("node", "tag"):
        values = table.column(name).combine_chunks()
        names = sorted(set(values.to_pylist()), reverse=True) + list(extra_names)
        indices = pc.index_in(values, value_set=pa.array(names)).cast(pa.int32())
        encoded = pa.DictionaryArray.from_arrays(indices, pa.array(names))
        at = table.schema.get_field_index(name)
        table = table.set_column(at, pa.field(name, encoded.type, nullable=False), encoded)
    return schema.frame_from_table(table)


def test_dictionary_encoded_names_are_written_as_strings(lake: ParquetLake, tmp_lake: Path) -> None:
    win = window(0, 2)
    plain = history_frame(TAGS, win, twins=True)
    shuffled = plain.sample(frac=1.0, random_state=7).reset_index(drop=True)
    frame = _encoded(shuffled, extra_names=("/elsewhere",))
    assert lake.write(scope(TAGS, win, "c1"), frame, len(frame)) == len(frame)
    (path,) = (tmp_lake / "hist").rglob("*.parquet")
    written = pq.read_table(path)
    assert written.schema.field("tag").type == pa.string()
    assert written.schema.field("node").type == pa.string()
    assert pd.read_parquet(path)["tag"].tolist() == sorted(plain["tag"].tolist())
    got = lake.read("hist", "tag_history")
    assert got.dtypes.to_dict() == schema.empty_frame("tag_history").dtypes.to_dict()
    assert rows_of(got) == rows_of(plain)
    ordered = got.sort_values(KEY, kind="stable").reset_index(drop=True)
    assert got.reset_index(drop=True).equals(ordered), "files are sorted by the key"


def test_dictionary_encoded_tags_outside_the_scope_are_refused(lake: ParquetLake) -> None:
    frame = _encoded(history_frame(TAGS, window(0, 1)))
    with pytest.raises(SinkError, match=r"1 tag\(s\) not in the chunk, e.g. '/plant/d'"):
        lake.write(scope(TAGS[:3], window(0, 1), "c1"), frame, len(frame))


def test_bad_frames_and_names_are_sink_errors(lake: ParquetLake) -> None:
    frame = history_frame(TAGS, window(0, 1))
    with pytest.raises(SinkError, match="does not match the tag_history schema"):
        lake.write(scope(TAGS, window(0, 1), "c1"), frame.drop(columns=["seq"]), len(frame))
    for dataset in ("../x", "a/b", "_historian", "tag_metadata", "locks", ""):
        with pytest.raises(SinkError, match="dataset name"):
            lake.write(scope(TAGS, window(0, 1), "c1", dataset=dataset), frame, len(frame))
    with pytest.raises(SinkError, match="chunk id"):
        lake.write(scope(TAGS, window(0, 1), "../c"), frame, len(frame))
    with pytest.raises(SinkError, match="flow key"):
        lake.lock("")
    with lake.lock("a/../b"):  # any other key is a name, encoded (test_lake_keys.py)
        assert lake.store.exists(lake.store.path("_historian", "locks", "a%2F%2E%2E%2Fb.lock"))


def test_dataset_attrs_must_not_change(lake: ParquetLake, tmp_lake: Path) -> None:
    write(lake, TAGS, window(0, 1), "c1")
    other = {**ATTRS, "mode": "aggregated", "interval_ms": 60000}
    with pytest.raises(SinkError) as caught:
        write(lake, TAGS, window(1, 2), "c2", attrs=other)
    message = str(caught.value)
    assert "dataset 'hist'" in message
    assert "mode: stored 'raw', now 'aggregated'" in message
    assert "interval_ms" in message
    assert "use another dataset name or reset it" in message
    assert "\n" not in message
    monthly = ParquetLake(str(tmp_lake), partition="month")
    with pytest.raises(SinkError, match="partitioned by date, not month"):
        write(monthly, TAGS, window(1, 2), "c2")
    assert data_files(tmp_lake) == ["node-n1/date=2024-03-01/part-c1.parquet"]


def test_progress_reads_each_marker_once_with_ten_thousand_markers(
    lake: ParquetLake, tmp_lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import orjson

    from sinks.lake.state import LakeState, new_marker

    markers = tmp_lake / "_historian/_flows/f/markers"
    markers.mkdir(parents=True)
    for i in range(10_000):
        marker = new_marker(
            flow="f", dataset="hist", kind="tag_history", chunk_id=f"m{i}",
            window=window(i, i + 1), members=[f"/t{i % 7}"], files=[],
            rows_fetched=1, rows_committed=1,
        )  # fmt: skip
        (markers / f"m{i}.json").write_bytes(orjson.dumps(marker))
    reads: list[str] = []
    original = LakeState.read_marker

    def counting(self: LakeState, flow: str, chunk_id: str) -> dict[str, Any] | None:
        reads.append(chunk_id)
        return original(self, flow, chunk_id)

    monkeypatch.setattr(LakeState, "read_marker", counting)
    fresh = ParquetLake(str(tmp_lake))
    progress = fresh.progress("f")
    assert len(reads) == 10_000
    assert progress.windows_of("/t3")[:2] == [window(3, 4), window(10, 11)]
    reads.clear()
    again = ParquetLake(str(tmp_lake))
    assert again.progress("f") == progress
    assert len(again.chunk_log("f", limit=20_000)) == 10_000
    assert reads == [], "the snapshot answers; no marker read again"
    write(again, ["/t0"], window(10_000, 10_001), "new", frame=history_frame([], window(0, 1)))
    assert again.progress("f").windows_of("/t0")[-1] == window(10_000, 10_001)
    assert reads == [], "the run's own marker is folded from memory"
    os.remove(markers / "m3.json")  # a rolled-back chunk: the snapshot is rebuilt
    assert ParquetLake(str(tmp_lake)).progress("f").windows_of("/t3")[0] == window(10, 11)


def test_members_with_the_same_windows_share_them_and_a_later_chunk_changes_only_its_own(
    lake: ParquetLake, tmp_lake: Path
) -> None:
    a, b, c = TAGS[:3]
    write(lake, [a, b, c], window(0, 1), "c1")
    write(lake, [a, b], window(1, 2), "c2")
    progress = lake.progress("f")
    assert progress.windows_of(a) == progress.windows_of(b) == [window(0, 2)]
    assert progress.windows_of(a) is progress.windows_of(b), "one list for equal windows"
    assert progress.windows_of(c) == [window(0, 1)]
    write(lake, [a], window(2, 3), "c3")  # folded into the shared lists of the snapshot
    for reader in (lake, ParquetLake(str(tmp_lake))):
        after = reader.progress("f")
        assert after.windows_of(a) == [window(0, 3)]
        assert after.windows_of(b) == [window(0, 2)], "b's list was not appended to"
        assert after.windows_of(c) == [window(0, 1)]


def test_progress_reads_the_snapshot_again_only_after_another_process_saved_one(
    lake: ParquetLake, tmp_lake: Path, store: HookedStore
) -> None:
    reads: list[str] = []

    def counting(read_json: Any, path: str, **kw: Any) -> Any:
        if path.endswith("progress.json"):
            reads.append(path)
        return read_json(path, **kw)

    write(lake, TAGS, window(0, 1), "c1")
    assert lake.progress("f").windows_of(TAGS[0]) == [window(0, 1)]
    store.hook("read_json", counting)
    write(lake, TAGS, window(1, 2), "c2")
    assert lake.progress("f").windows_of(TAGS[0]) == [window(0, 2)]
    assert reads == [], "the snapshot this process saved is still the file's"
    other = ParquetLake(str(tmp_lake))
    write(other, TAGS[:1], window(2, 3), "c3")
    assert other.progress("f").windows_of(TAGS[0]) == [window(0, 3)]
    reads.clear()
    assert lake.progress("f").windows_of(TAGS[0]) == [window(0, 3)]
    assert len(reads) == 1, "another process saved the snapshot: read again"


def test_lock_is_exclusive_and_dies_with_a_killed_holder(lake: ParquetLake, tmp_lake: Path) -> None:
    with lake.lock("f"):
        with (
            pytest.raises(
                FlowLocked, match=r"flow 'f' is already running \(lock held in .*f\.lock"
            ),
            ParquetLake(str(tmp_lake)).lock("f"),
        ):
            pass
        with lake.lock("g"):  # other flows are independent
            pass
    with lake.lock("f"):  # released on exit
        pass
    code = textwrap.dedent(
        f"""
        import sys, time
        from sinks.lake.sink import ParquetLake
        lake = ParquetLake({str(tmp_lake)!r})
        with lake.lock("f"):
            print("locked", flush=True)
            time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=os.getcwd())
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == b"locked"
        with pytest.raises(FlowLocked, match=f"by pid {child.pid}"), lake.lock("f"):
            pass
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    with lake.lock("f"):
        pass


def test_hostile_tag_paths_are_data_only(tmp_path: Path) -> None:
    root = tmp_path / "lake"
    sink = ParquetLake(str(root))
    win = window(0, 2)
    frame = history_frame(HOSTILE_TAGS, win)
    assert sink.write(scope(HOSTILE_TAGS, win, "c1"), frame, len(frame)) == len(frame)
    sink.write_metadata(metadata_frame(HOSTILE_TAGS))
    overlap = history_frame(HOSTILE_TAGS[:5], window(1, 3))
    sink.write(scope(HOSTILE_TAGS[:5], window(1, 3), "c2"), overlap, len(overlap))
    expected = concat(
        [
            in_scope(frame, HOSTILE_TAGS[5:], win),
            in_scope(frame, HOSTILE_TAGS[:5], window(0, 1)),
            overlap,
        ]
    )
    got = sink.read("hist", "tag_history")
    assert rows_of(got) == rows_of(expected)
    assert set(got["tag"]) == set(HOSTILE_TAGS)
    assert set(sink.progress("f").completed) == set(HOSTILE_TAGS)
    assert rows_of(sink.read("tag_metadata", "tag_metadata")) == rows_of(
        metadata_frame(HOSTILE_TAGS)
    )
    outside = [p for p in tmp_path.rglob("*") if root not in p.parents and p != root]
    assert outside == []
    for path in root.rglob("*"):
        assert "plant" not in path.name
        assert "etc" not in path.name
        assert "drop" not in path.name


def test_readers_see_the_same_rows_and_types(lake: ParquetLake, tmp_lake: Path) -> None:
    import duckdb
    import polars as pl

    win = window(12, 36)
    frame = history_frame(TAGS, win, twins=True)
    lake.write(scope(TAGS, win, "c1"), frame, len(frame))
    expected = rows_of(frame)
    glob = f"{tmp_lake}/hist/**/*.parquet"

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    relation = con.sql(f"select * exclude (date) from read_parquet('{glob}', hive_partitioning=1)")
    types = dict(zip(relation.columns, map(str, relation.types), strict=True))
    assert types["ts"] == "TIMESTAMP WITH TIME ZONE"
    assert (types["value"], types["value_bool"], types["tag"], types["seq"]) == (
        "DOUBLE", "BOOLEAN", "VARCHAR", "SMALLINT",
    )  # fmt: skip
    table = relation.arrow()
    table = table.read_all() if hasattr(table, "read_all") else table
    as_ms = table.set_column(2, "ts", table["ts"].cast(pa.timestamp("ms", tz="UTC")))
    assert rows_of(schema.frame_from_table(as_ms)) == expected
    dates = con.sql(
        f"select distinct date from read_parquet('{glob}', hive_partitioning=1) order by 1"
    )
    assert [str(d[0]) for d in dates.fetchall()] == ["2024-03-01", "2024-03-02"]

    polars = pl.scan_parquet(glob, hive_partitioning=True).collect()
    assert polars.schema["ts"] == pl.Datetime("ms", "UTC")
    assert polars.schema["value"] == pl.Float64()
    assert polars.schema["value_bool"] == pl.Boolean()
    assert polars.schema["tag"] == pl.String()
    from_polars = polars.drop("date").to_arrow().cast(schema.TAG_HISTORY_SCHEMA)
    assert rows_of(schema.frame_from_table(from_polars)) == expected

    # pandas infers Hive columns as categories, which clash with the files' own `node`
    # column: it reads the files' columns (docs/output.md).
    panda = pd.read_parquet(tmp_lake / "hist")
    assert str(panda["ts"].dtype) == "datetime64[ms, UTC]"
    assert str(panda["value"].dtype) == "float64"
    assert len(panda) == len(frame)
    from_pandas = pa.Table.from_pandas(panda, preserve_index=False)
    from_pandas = from_pandas.select(schema.TAG_HISTORY_SCHEMA.names).cast(
        schema.TAG_HISTORY_SCHEMA
    )
    assert rows_of(schema.frame_from_table(from_pandas)) == expected


def test_write_metadata_upserts_by_node_and_tag(lake: ParquetLake, tmp_lake: Path) -> None:
    assert lake.write_metadata(metadata_frame(TAGS[:3], "old")) == 3
    assert lake.write_metadata(metadata_frame(TAGS[2:], "new")) == 2
    lake.write_metadata(metadata_frame(TAGS[:1], "other node", node="n2"))
    got = lake.read("tag_metadata", "tag_metadata")
    assert got.dtypes.to_dict() == schema.empty_frame("tag_metadata").dtypes.to_dict()
    descriptions = {
        (n, t): d.split(" ")[0]
        for n, t, d in zip(got["node"], got["tag"], got["description"], strict=True)
    }
    assert descriptions == {
        ("n1", TAGS[0]): "old", ("n1", TAGS[1]): "old", ("n1", TAGS[2]): "new",
        ("n1", TAGS[3]): "new", ("n2", TAGS[0]): "other",
    }  # fmt: skip
    assert sorted(p.name for p in (tmp_lake / "tag_metadata").iterdir()) == [
        "part-tag_metadata.parquet"
    ]


def test_compact_merges_small_files_and_keeps_rows_and_markers(tmp_lake: Path) -> None:
    import orjson

    sink = ParquetLake(str(tmp_lake), target_file_rows=1000)
    for i, start in enumerate(range(0, 48, 3)):
        for j, batch in enumerate((TAGS[:2], TAGS[2:])):
            write(sink, batch, window(start, start + 3), f"k{i}x{j}")
    before = rows_of(sink.read("hist", "tag_history"))
    progress = sink.progress("f")
    assert len(data_files(tmp_lake)) == 32
    merged = sink.compact("hist", min_rows=100)
    assert merged == 32
    files = data_files(tmp_lake)
    assert files == [
        "node-n1/date=2024-03-01/part-k7x1.parquet",
        "node-n1/date=2024-03-02/part-k9x1.parquet",
    ], "each day merged into its last file's name"
    assert rows_of(sink.read("hist", "tag_history")) == before
    assert sink.progress("f") == progress
    assert sink.compact("hist", min_rows=100) == 0, "nothing small left"
    for path in (tmp_lake / "_historian/_flows/f/markers").iterdir():
        marker = orjson.loads(path.read_bytes())
        assert marker["files"]
        assert all((tmp_lake / "hist" / f["path"]).exists() for f in marker["files"])
    # An overlapping write after compaction trims the merged file.
    write(sink, TAGS, window(10, 14), "late", step_s=300)
    expected = concat(
        [
            in_scope(history_frame(TAGS, window(0, 48)), TAGS, window(0, 10)),
            history_frame(TAGS, window(10, 14), step_s=300),
            in_scope(history_frame(TAGS, window(0, 48)), TAGS, window(14, 48)),
        ]
    )
    assert rows_of(sink.read("hist", "tag_history")) == rows_of(expected)


@pytest.mark.parametrize("kind", [schema.KIND_TAG_HISTORY, schema.KIND_ALARM_HISTORY])
def test_compacted_files_are_sorted_by_key_with_the_kinds_plain_types(
    tmp_lake: Path, kind: str
) -> None:
    sink = ParquetLake(str(tmp_lake), target_file_rows=100_000)
    chunks = []
    # Later windows and tags first, so that the files interleave in key order. An alarm
    # chunk's scope is every path of its window: one batch per window.
    batches = (TAGS[2:], TAGS[:2]) if kind == schema.KIND_TAG_HISTORY else (TAGS,)
    for i, start in enumerate(range(20, -1, -4)):
        for j, batch in enumerate(batches):
            win = window(start, start + 4)
            if kind == schema.KIND_TAG_HISTORY:
                frame = history_frame(batch, win, step_s=300, twins=True)
            else:
                frame = alarm_frame(batch, win, step_s=300)
            sink.write(scope(batch, win, f"c{i}x{j}", kind=kind), frame, len(frame))
            chunks.append(frame)
    assert sink.compact("hist", min_rows=1_000_000) == len(chunks)
    (merged,) = [tmp_lake / "hist" / name for name in data_files(tmp_lake)]
    table = pq.read_table(merged)
    target = schema.SCHEMAS[kind]
    assert table.schema.remove_metadata() == target.remove_metadata()
    keys = [(key, "ascending") for key in schema.KEYS[kind]]
    want = schema.table_from_frame(concat(chunks), kind).sort_by(keys)
    assert table.replace_schema_metadata(None).equals(want)
    assert pq.read_metadata(merged).num_row_groups == 1


def test_rows_land_sorted_by_key_whatever_order_they_come_in(
    lake: ParquetLake, tmp_lake: Path
) -> None:
    frame = history_frame(TAGS, window(0, 6), twins=True)
    shuffled = frame.sample(frac=1.0, random_state=7).reset_index(drop=True)
    write(lake, TAGS, window(0, 6), "k1", frame=shuffled)
    (path,) = [tmp_lake / "hist" / name for name in data_files(tmp_lake)]
    written = pq.read_table(path).replace_schema_metadata(None)
    ordered = schema.table_from_frame(frame, schema.KIND_TAG_HISTORY).sort_by(
        [(key, "ascending") for key in KEY]
    )
    assert written.equals(ordered)


def test_a_null_in_a_key_column_sorts_last_as_a_sort_puts_it(
    lake: ParquetLake, tmp_lake: Path
) -> None:
    one = alarm_frame(["/alarm"], window(0, 1), step_s=3600)
    unknown = one.copy()
    unknown["status"] = pd.array([None], dtype=one["status"].dtype)
    frame = concat([unknown, one])  # (node, path, ts) tie: status null first
    sink_scope = scope(["/alarm"], window(0, 1), "a1", kind=schema.KIND_ALARM_HISTORY)
    lake.write(sink_scope, frame, len(frame))
    (path,) = [tmp_lake / "hist" / name for name in data_files(tmp_lake)]
    assert pq.read_table(path).column("status").to_pylist() == [one["status"].iloc[0], None]


CRASH_OPS = ("replace", "remove", "write_json", "write_parquet", "write_parquet_parts")


def test_a_crash_at_any_step_shows_rows_at_most_once_and_recovers_exactly_once(
    tmp_path: Path,
) -> None:
    crasher = Crasher(CRASH_OPS)
    a_scope, b_scope = (TAGS[:2], window(18, 26)), (TAGS[1:3], window(22, 30))
    a_rows = history_frame(*a_scope)
    b_rows = history_frame(*b_scope, step_s=300)
    only_a = rows_of(a_rows)
    final = rows_of(
        concat(
            [
                in_scope(a_rows, [TAGS[0]], window(18, 26)),
                in_scope(a_rows, [TAGS[1]], window(18, 22)),
                b_rows,
            ]
        )
    )
    outcomes = set()
    for step in range(1, 40):
        root = tmp_path / f"crash{step}"
        sink = ParquetLake(str(root), target_file_rows=1000, store=crasher.store(str(root)))
        sink.write(scope(*a_scope, "A"), a_rows, len(a_rows))
        crasher.arm(step)
        try:
            sink.write(scope(*b_scope, "B"), b_rows, len(b_rows))
        except Crash:
            pass
        else:
            crasher.disarm()
            break
        finally:
            crasher.disarm()
        seen = external_rows(root)
        assert_at_most_once(seen)
        assert keys_of_rows(only_a) <= keys_of_table(seen), "a row of A went missing"
        visible = [p for p in (root / "hist").rglob("*") if p.is_file()]
        assert all(is_data_file(p.name) for p in visible), "no temp file among the data"
        recovered = ParquetLake(str(root), target_file_rows=1000)
        recovered.open()
        got = rows_of(recovered.read("hist", "tag_history"))
        committed = (root / "_historian/_flows/f/markers/B.json").exists()
        assert got == (final if committed else only_a), f"crash at step {step}"
        ledger = assert_ledger_holds(recovered, "hist", whole=not committed)
        assert sorted(zip(ledger["chunk_id"], ledger["tag"], strict=True)) == (
            [("A", TAGS[0]), ("B", TAGS[1]), ("B", TAGS[2])]
            if committed
            else [("A", TAGS[0]), ("A", TAGS[1])]
        ), f"the ledger after a crash at step {step}"
        outcomes.add(committed)
        assert not list((root / "_historian/hist/pending").glob("*"))
        assert not list((root / "_historian/hist/tmp").glob("*"))
        recovered.write(scope(*b_scope, "B"), b_rows, len(b_rows))
        assert rows_of(recovered.read("hist", "tag_history")) == final
    else:
        pytest.fail("the write never completed")
    assert outcomes == {False, True}, "crashes both before and after the commit point"
    assert step > 8


def test_a_lost_staged_file_rolls_back_and_forgets_the_touched_chunks(
    lake: ParquetLake, tmp_lake: Path, store: HookedStore
) -> None:
    a_rows = history_frame(TAGS[:2], window(0, 6))
    o_rows = history_frame(TAGS[2:], window(0, 6))
    b_rows = history_frame(TAGS[1:3], window(3, 9))
    lake.write(scope(TAGS[:2], window(0, 6), "A"), a_rows, len(a_rows))
    lake.write(scope(TAGS[2:], window(0, 6), "O"), o_rows, len(o_rows))
    write(lake, TAGS[3:], window(6, 9), "untouched")
    calls: list[str] = []

    def replace_once(replace: Any, source: str, target: str) -> None:
        if calls:
            raise Crash
        calls.append(target)
        replace(source, target)

    store.hook("replace", replace_once)
    with pytest.raises(Crash):
        lake.write(scope(TAGS[1:3], window(3, 9), "B"), b_rows, len(b_rows))
    store.unhook("replace")
    assert len(calls) == 1, "one earlier file rewritten, then killed"
    for temp in (tmp_lake / "_historian/hist/tmp").iterdir():
        temp.unlink()  # staged files lost: the intent cannot be finished
    recovered = ParquetLake(str(tmp_lake))
    recovered.open()
    assert_at_most_once(external_rows(tmp_lake))
    assert not (tmp_lake / "_historian/hist/pending/B.json").exists()
    assert [r.chunk_id for r in recovered.chunk_log("f")] == ["untouched"], "A, O, B forgotten"
    assert recovered.progress("f").windows_of(TAGS[0]) == []
    assert set(assert_ledger_holds(recovered, "hist", whole=False)["chunk_id"]) == {"untouched"}
    # The pipeline re-fetches what progress no longer has: then every row is there once.
    recovered.write(scope(TAGS[:2], window(0, 6), "A"), a_rows, len(a_rows))
    recovered.write(scope(TAGS[2:], window(0, 6), "O"), o_rows, len(o_rows))
    recovered.write(scope(TAGS[1:3], window(3, 9), "B"), b_rows, len(b_rows))
    expected = concat(
        [in_scope(a_rows, TAGS[:1], window(0, 6)), in_scope(a_rows, TAGS[1:2], window(0, 3)),
         in_scope(o_rows, TAGS[3:], window(0, 6)), in_scope(o_rows, TAGS[2:3], window(0, 3)),
         b_rows, history_frame(TAGS[3:], window(6, 9))]
    )  # fmt: skip
    assert rows_of(recovered.read("hist", "tag_history")) == rows_of(expected)
    assert_ledger_holds(recovered, "hist", whole=False)  # B's window took A's, O's rows


def test_a_crash_during_compaction_recovers(
    tmp_lake: Path,
) -> None:
    crasher = Crasher(CRASH_OPS)
    sink = ParquetLake(str(tmp_lake), target_file_rows=1000, store=crasher.store(str(tmp_lake)))
    for i in range(6):
        write(sink, TAGS, window(i * 2, i * 2 + 2), f"k{i}")
    before = rows_of(sink.read("hist", "tag_history"))
    crasher.arm(4)  # stage, intent, drop, drop: then killed
    with pytest.raises(Crash):
        sink.compact("hist", min_rows=1000)
    crasher.disarm()
    assert_at_most_once(external_rows(tmp_lake))
    recovered = ParquetLake(str(tmp_lake))
    recovered.open()
    assert rows_of(recovered.read("hist", "tag_history")) == before
    assert len(data_files(tmp_lake)) == 1, "merged whole, after recovery"


@pytest.mark.parametrize("failure", [errno.ENOSPC, errno.EROFS])
def test_disk_full_or_read_only_is_a_clear_error_with_nothing_half_written(
    lake: ParquetLake, tmp_lake: Path, store: HookedStore, failure: int
) -> None:
    write(lake, TAGS, window(0, 6), "c1")
    before, files = rows_of(lake.read("hist", "tag_history")), data_files(tmp_lake)

    def failing(write_parquet: Any, table: pa.Table, path: str, **options: Any) -> None:
        with open(path, "wb") as handle:
            handle.write(b"PAR1 half")
        raise OSError(failure, os.strerror(failure))

    store.hook("write_parquet", failing)
    with pytest.raises(SinkError) as caught:
        write(lake, TAGS, window(3, 9), "c2")
    assert str(caught.value) == (
        f"lake 'lake': write chunk c2 of dataset 'hist': {os.strerror(failure)}"
    )
    assert data_files(tmp_lake) == files
    assert list((tmp_lake / "_historian/hist/tmp").iterdir()) == []
    assert not (tmp_lake / "_historian/hist/pending/c2.json").exists()
    store.unhook("write_parquet")
    assert rows_of(lake.read("hist", "tag_history")) == before


def test_forget_after_drops_the_chunks_ending_after_it_and_keeps_data(lake: ParquetLake) -> None:
    for number, hours in enumerate(((0, 1), (1, 2), (2, 3))):
        win = window(*hours)
        frame = history_frame(TAGS, win)
        lake.write(scope(TAGS, win, f"c{number}"), frame, len(frame))
    before = len(lake.read("hist", schema.KIND_TAG_HISTORY))
    assert lake.forget_after("f", window(1.5, 2).start) == 2
    assert lake.progress("f").windows_of(TAGS[0]) == [window(0, 1)]
    assert [c.chunk_id for c in lake.chunk_log("f")] == ["c0"]
    assert len(lake.read("hist", schema.KIND_TAG_HISTORY)) == before
    frame = history_frame(TAGS, window(1, 3))
    lake.write(scope(TAGS, window(1, 3), "again"), frame, len(frame))
    assert lake.progress("f").windows_of(TAGS[0]) == [window(0, 3)]


def test_probe_creates_nothing_and_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    assert "does not exist yet" in ParquetLake(str(tmp_path / "new" / "lake")).probe()
    assert not (tmp_path / "new").exists()
    assert ParquetLake(str(tmp_path)).probe() == "exists, writable"
    (tmp_path / "file").write_text("x")
    with pytest.raises(SinkError, match="is not a directory"):
        ParquetLake(str(tmp_path / "file" / "lake")).probe()


def test_open_creates_the_root_and_only_the_lock_directory(tmp_path: Path) -> None:
    sink = ParquetLake(str(tmp_path / "new" / "lake"))
    sink.open()
    assert (tmp_path / "new/lake/_historian").is_dir()
    assert [p.name for p in (tmp_path / "new/lake/_historian").iterdir()] == ["locks"]


def test_a_killed_writer_leaves_rows_at_most_once_and_a_rerun_exactly_once(tmp_lake: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[3])!r})
        from tests.sinks.lake.lake_frames import history_frame, scope, window
        from sinks.lake.sink import ParquetLake
        lake = ParquetLake({str(tmp_lake)!r}, target_file_rows=1000)
        tags = {list(TAGS)!r}
        n = 0
        while True:
            for size, batch in ((3, tags[:3]), (2, tags[1:])):
                for start in range(0, 24, size):
                    frame = history_frame(batch, window(start, start + size), step_s=120)
                    lake.write(scope(batch, window(start, start + size), f"s{{size}}x{{start}}"), frame, len(frame))
                    n += 1
                    print(n, flush=True)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=os.getcwd())
    try:
        assert child.stdout is not None
        for _ in range(25):
            assert child.stdout.readline()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    assert_at_most_once(external_rows(tmp_lake))
    sink = ParquetLake(str(tmp_lake), target_file_rows=1000)
    sink.open()
    assert_at_most_once(external_rows(tmp_lake))
    for start in range(0, 24, 2):
        frame = history_frame(TAGS[1:], window(start, start + 2), step_s=120)
        sink.write(scope(TAGS[1:], window(start, start + 2), f"s2x{start}"), frame, len(frame))
    for start in range(0, 24, 3):
        frame = in_scope(
            history_frame(TAGS[:1], window(start, start + 3), step_s=120), TAGS[:1], window(0, 24)
        )
        sink.write(scope(TAGS[:1], window(start, start + 3), f"t{start}"), frame, len(frame))
    assert rows_of(sink.read("hist", "tag_history")) == rows_of(
        history_frame(TAGS, window(0, 24), step_s=120)
    )


# -- S3 (moto on loopback) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x",
        region_name="us-east-1",
    )  # fmt: skip
    client.create_bucket(Bucket="lake")
    yield {"client_kwargs": {"endpoint_url": endpoint}, "key": "x", "secret": "x"}
    server.stop()


def test_s3_write_overwrite_overlap_and_read_back(s3: dict[str, Any]) -> None:
    import s3fs

    sink = ParquetLake("s3://lake/one", storage_options=s3)
    sink.open()
    win = window(20, 28)
    frame = history_frame(TAGS, win, twins=True)
    assert sink.write(scope(TAGS, win, "c1"), frame, len(frame)) == len(frame)
    assert sink.write(scope(TAGS, win, "c1"), frame, len(frame)) == len(frame)
    got = sink.read("hist", "tag_history")
    assert str(got["ts"].dtype) == "timestamp[ms, tz=UTC][pyarrow]"
    assert rows_of(got) == rows_of(frame)
    overlap = history_frame(TAGS[:2], window(24, 30))
    sink.write(scope(TAGS[:2], window(24, 30), "c2"), overlap, len(overlap))
    expected = concat(
        [in_scope(frame, TAGS[2:], win), in_scope(frame, TAGS[:2], window(20, 24)), overlap]
    )
    assert rows_of(sink.read("hist", "tag_history")) == rows_of(expected)
    fs = s3fs.S3FileSystem(**s3)
    names = sorted(p.split("/one/", 1)[1] for p in fs.find("lake/one/hist"))
    assert names == [
        "hist/node-n1/date=2024-03-01/part-c1.parquet",
        "hist/node-n1/date=2024-03-02/part-c1.parquet",  # c2's rows joined the file they replace
    ]
    assert fs.find("lake/one/_historian/hist/tmp") == []
    other = ParquetLake("s3://lake/one", storage_options=s3)
    assert other.progress("f").windows_of(TAGS[0]) == [window(20, 30)]
    assert [r.chunk_id for r in other.chunk_log("f")] == ["c2", "c1"]


def test_s3_lease_lock_is_exclusive(s3: dict[str, Any]) -> None:
    first = ParquetLake("s3://lake/two", storage_options=s3)
    second = ParquetLake("s3://lake/two", storage_options=s3)
    with (
        first.lock("f"),
        pytest.raises(
            FlowLocked, match=r"lease held in s3://lake/two/_historian/locks/f\.lease\.json"
        ),
        second.lock("f"),
    ):
        pass
    with second.lock("f"):
        pass


def test_s3_missing_bucket_or_endpoint_is_a_one_line_error(s3: dict[str, Any]) -> None:
    sink = ParquetLake("s3://no-such-bucket/x", storage_options=s3)
    with pytest.raises(SinkError, match=r"s3://no-such-bucket does not exist$"):
        sink.open()
    options = {
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},
        "key": "AKIDSECRETKEY",
        "secret": "s3cr3t-value",
        "config_kwargs": {"retries": {"max_attempts": 1}},
    }
    unreachable = ParquetLake("s3://lake/x", storage_options=options)
    with pytest.raises(
        SinkUnavailable, match=r"^lake 'lake': open s3://lake/x: Could not connect"
    ) as caught:
        unreachable.open()
    message = str(caught.value)
    assert "\n" not in message
    assert "s3cr3t" not in message
    assert "AKIDSECRETKEY" not in message
