"""`Verifies` over every sink that has it: data deleted, truncated or dropped after its
chunks were committed is named (file or table, and window), and a repair forgets exactly
the damaged chunks, so writing them again (what the next run does) restores every row.

Damage is done the way a user or a disk does it: a data file removed, cut to 1,000 bytes,
rows deleted or a table dropped in the database, never through the sink.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

from connectors import schema
from connectors.timewindow import Window
from sinks.base import Compacts, Sink, UnreadableFile, Verifies
from sinks.lake.sink import ParquetLake
from sinks.sql.warehouse import SqlWarehouse
from sinks.tables.delta import DeltaLake
from sinks.tables.iceberg import IcebergLake
from tests.sinks.contract_sinks import SINKS, SinkUnderTest, sink_params
from tests.sinks.moto_s3 import fsspec_options, moto_bucket
from tests.sinks.sql.sql_frames import ATTRS, alarms, history, hours, scope, sort_key

HIST = schema.KIND_TAG_HISTORY
ALARM = schema.KIND_ALARM_HISTORY
TableSink = DeltaLake | IcebergLake
TAGS = ["/Plant A/Line 1/Temp", "a/b c.d,e", "ünïcödé 漢字 🙂"]
WINDOWS = [hours(0, 1), hours(1, 2), hours(2, 3)]
VERIFYING = ("lake", "duckdb", "postgres", "mariadb", "delta", "iceberg")
BUCKET = "verify"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    pytest.importorskip("boto3")
    with moto_bucket(BUCKET) as url:
        yield url


# Sinks whose rows are files of their own, which a user can cut short.
WITH_FILES = ("lake", "delta", "iceberg")


def _place(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
    if request.param == "lake_s3":
        url = f"s3://{BUCKET}/lake-{uuid.uuid4().hex[:8]}"
        options = fsspec_options(request.getfixturevalue("endpoint"))
        kwargs = {"url": url, "storage_options": options}
        return SinkUnderTest("sinks.lake.sink:ParquetLake", kwargs, lambda: True)
    factory, _ = SINKS[request.param]
    return factory(request, tmp_path)


LAKE_S3 = pytest.param("lake_s3", id="lake_s3")
place = pytest.fixture(params=[*sink_params(VERIFYING), LAKE_S3])(_place)
filed_place = pytest.fixture(params=[*sink_params(WITH_FILES), LAKE_S3])(_place)


def _opened(place: SinkUnderTest) -> Iterator[Sink]:
    made = place.make()
    made.open()
    yield made
    made.close()


@pytest.fixture
def sink(place: SinkUnderTest) -> Iterator[Sink]:
    yield from _opened(place)


@pytest.fixture
def filed_sink(filed_place: SinkUnderTest) -> Iterator[Sink]:
    yield from _opened(filed_place)


def fill(sink: Sink, windows: list[Window] = WINDOWS) -> pd.DataFrame:
    """Commit a chunk per window (all tags); the rows written."""
    frames = []
    for window in windows:
        frame = history(TAGS, window, step_s=60)
        assert sink.write(scope(TAGS, window), frame, len(frame)) == len(frame)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def chunk_of(window: Window) -> str:
    return scope(TAGS, window).chunk_id


def verifier(sink: Sink) -> Verifies:
    assert isinstance(sink, Verifies)
    return sink


def lake_file(sink: ParquetLake, window: Window) -> str:
    """The store path of the one data file the window's chunk wrote."""
    marker = sink.state.read_marker("f1", chunk_of(window))
    assert marker is not None
    [listed] = marker["files"]
    return sink.store.path(marker["dataset"], listed["path"])


def sql_exec(sink: SqlWarehouse, *statements: str) -> None:
    with sink.engine.begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))


def rows_table(sink: SqlWarehouse) -> str:
    """Where the dataset's rows are (the narrow rows table, or DuckDB's plain table)."""
    return sink.layout.table("hist" if sink.dialect == "duckdb" else "historian_rows_hist")


def table_file(sink: TableSink, window: Window) -> str:
    """The store path of the data file the window's chunk wrote."""
    [found] = [
        item.path
        for item in sink._table_files().data_files("hist")
        if item.ts_min_ms is not None and window.start_ms <= item.ts_min_ms < window.end_ms
    ]
    return found


def delete_in_table(sink: TableSink, window: Window) -> None:
    """Rows deleted by another writer of the table: a commit without a chunk record."""
    table = sink._table("hist")
    assert table is not None
    if isinstance(sink, DeltaLake):
        lo, hi = (f"{w.isoformat().replace('+00:00', 'Z')}" for w in (window.start, window.end))
        table.delete(f"ts >= '{lo}' AND ts < '{hi}'")
        return
    from sinks.tables.iceberg import time_filter

    table.delete(time_filter(window.start, window.end))


def delete_rows(sink: Sink, window: Window) -> str:
    """Lose the window's rows as a user would; what `verify` must name."""
    if isinstance(sink, TableSink):
        delete_in_table(sink, window)
        return "hist"
    if isinstance(sink, ParquetLake):
        path = lake_file(sink, window)
        assert sink.store.remove(path)
        return sink.store.display(path)
    assert isinstance(sink, SqlWarehouse)
    ts = "ts >= '2024-03-01 01:00:00+00' AND ts < '2024-03-01 02:00:00+00'"
    if sink.dialect == "mysql":
        ts = "ts >= '2024-03-01 01:00:00' AND ts < '2024-03-01 02:00:00'"
    assert window == WINDOWS[1]
    sql_exec(sink, f"DELETE FROM {rows_table(sink)} WHERE {ts}")
    return sink.layout.table("hist")


def drop_dataset(sink: Sink) -> str:
    """Lose the whole dataset (a table format: every data file, its log kept)."""
    if isinstance(sink, TableSink):
        for window in WINDOWS:
            assert sink.store.remove(table_file(sink, window))
        return "hist"
    if isinstance(sink, ParquetLake):
        sink.store.rmtree(sink.store.path("hist"))
        return sink.store.display(sink.store.path("hist"))
    assert isinstance(sink, SqlWarehouse)
    view = sink.layout.table("hist")
    if sink.dialect == "duckdb":
        sql_exec(sink, f"DROP TABLE {view}")
    else:
        sql_exec(sink, f"DROP VIEW {view}", f"DROP TABLE {rows_table(sink)}")
    return view


def completed(sink: Sink) -> dict[str, list[Window]]:
    return sink.progress("f1").completed


def rewrite(place: SinkUnderTest, windows: list[Window]) -> Sink:
    """What the next run does after a repair: a fresh sink writes the forgotten chunks."""
    again = place.make()
    again.open()
    for window in windows:
        if all(window in [w for w in completed(again).get(t, [])] for t in TAGS):
            continue
        frame = history(TAGS, window, step_s=60)
        again.write(scope(TAGS, window), frame, len(frame))
    return again


def assert_same_rows(sink: Sink, expected: pd.DataFrame) -> None:
    held = sort_key(sink.read("hist", HIST), HIST)  # type: ignore[attr-defined]
    pd.testing.assert_frame_equal(held, sort_key(expected, HIST), check_dtype=False)


def test_intact_sink_verifies_clean(sink: Sink) -> None:
    fill(sink)
    found = verifier(sink).verify("f1", "node1")
    assert (found.chunks, found.damages) == (3, [])
    part = verifier(sink).verify("f1", "node1", Window(WINDOWS[1].start, WINDOWS[2].end))
    assert (part.chunks, part.damages) == (2, [])


def test_rewrites_over_other_windows_and_compaction_keep_verify_clean(sink: Sink) -> None:
    """Later chunks that cut into earlier ones (one tag again over a window across three
    chunks, as `state reset --tag` or another window size does) and a compaction change
    the files earlier chunks recorded: what they record changes with them."""
    fill(sink)
    again = history(TAGS[:1], hours(0.5, 2.5), step_s=60)
    sink.write(scope(TAGS[:1], hours(0.5, 2.5)), again, len(again))
    if isinstance(sink, Compacts):
        sink.compact("hist")
    found = verifier(sink).verify("f1", "node1")
    assert (found.chunks, found.damages) == (4, [])


def test_alarm_chunks_and_other_nodes_rows_verify_clean(sink: Sink) -> None:
    """An alarm chunk's scope is its node's every path; another node's rows in the same
    dataset and windows are no part of a flow's count."""
    attrs = dict(ATTRS, kind=ALARM, mode=None)
    for window in WINDOWS:
        for node in ("node1", "node2"):
            events = alarms(["Plant/A", "Plant/B"], window, node=node)
            chunk = scope(["/"], window, dataset="alarms", kind=ALARM, attrs=attrs, node=node)
            flow = "f1" if node == "node1" else "f2"
            sink.write(replace(chunk, flow=flow), events, len(events))
    found = verifier(sink).verify("f1", "node1")
    assert (found.chunks, found.damages) == (3, [])


def test_deleted_rows_are_named_and_repair_refetches_exactly_their_chunk(
    place: SinkUnderTest, sink: Sink
) -> None:
    expected = fill(sink)
    where = delete_rows(sink, WINDOWS[1])

    [damage] = verifier(sink).verify("f1", "node1").damages
    assert (damage.where, damage.window, damage.chunks) == (
        where if isinstance(sink, ParquetLake) else f"table {where}",
        WINDOWS[1],
        (chunk_of(WINDOWS[1]),),
    )
    assert "missing" in damage.problem or "holds 0 rows, recorded 180" in damage.problem
    outside = verifier(sink).verify("f1", "node1", WINDOWS[2])
    assert outside.damages == []

    repaired = verifier(sink).verify("f1", "node1", repair=True)
    assert (repaired.forgotten, repaired.quarantined) == (1, [])
    for tag in TAGS:
        assert completed(sink)[tag] == [WINDOWS[0], WINDOWS[2]]
    sink.close()

    again = rewrite(place, WINDOWS)
    try:
        assert verifier(again).verify("f1", "node1").damages == []
        assert_same_rows(again, expected)
    finally:
        again.close()


def test_dropped_dataset_names_every_chunk_and_repair_refetches_them_all(
    place: SinkUnderTest, sink: Sink
) -> None:
    expected = fill(sink)
    drop_dataset(sink)
    damages = verifier(sink).verify("f1", "node1").damages
    assert sorted(d.window for d in damages) == WINDOWS
    assert {c for d in damages for c in d.chunks} == {chunk_of(w) for w in WINDOWS}

    assert verifier(sink).verify("f1", "node1", repair=True).forgotten == 3
    assert completed(sink) == {}
    sink.close()
    again = rewrite(place, WINDOWS)
    try:
        assert verifier(again).verify("f1", "node1").damages == []
        assert_same_rows(again, expected)
    finally:
        again.close()


def truncate(sink: ParquetLake | TableSink, path: str) -> bytes:
    data = sink.store.read_bytes(path)
    assert data is not None
    sink.store.write_bytes(path, data[:1000])
    return data[:1000]


def test_truncated_lake_file_is_named_everywhere_and_quarantined_by_repair(
    filed_place: SinkUnderTest, filed_sink: Sink
) -> None:
    place, sink = filed_place, filed_sink
    if isinstance(sink, TableSink):
        return truncated_table_file(place, sink)
    assert isinstance(sink, ParquetLake)
    expected = fill(sink)
    path = lake_file(sink, WINDOWS[1])
    cut = truncate(sink, path)
    shown = sink.store.display(path)

    [damage] = verifier(sink).verify("f1", "node1").damages
    assert (damage.where, damage.window, damage.unreadable) == (shown, WINDOWS[1], True)
    assert "magic bytes" in damage.problem

    with pytest.raises(UnreadableFile, match="historian verify FLOW --repair") as read:
        sink.read("hist", HIST)
    assert read.value.path == shown
    frame = history(TAGS, WINDOWS[1], step_s=60)
    with pytest.raises(UnreadableFile, match="historian verify f1 --repair") as wrote:
        sink.write(scope(TAGS, WINDOWS[1]), frame, len(frame))
    assert wrote.value.path == shown
    with pytest.raises(UnreadableFile):
        list(sink.coverage_reader("hist", HIST).partials(hours(0, 3), _Hourly()))

    repaired = verifier(sink).verify("f1", "node1", repair=True)
    [(moved, target)] = repaired.quarantined
    assert moved == shown
    assert "_quarantine" in target
    assert repaired.forgotten == 1
    sink.close()

    again = rewrite(place, WINDOWS)
    try:
        assert verifier(again).verify("f1", "node1").damages == []
        assert_same_rows(again, expected)
        assert isinstance(again, ParquetLake)
        kept = again.store.read_bytes(quarantined(again, target))
        assert kept == cut, "the unreadable file is kept, moved aside, not deleted"
    finally:
        again.close()


def quarantined(sink: ParquetLake | TableSink, shown: str) -> str:
    """A store path from its display form."""
    return sink.store.path(sink.store.relative(shown.split("://", 1)[-1]))


class _Hourly:
    start_ms = hours(0, 1).start_ms
    bucket_ms = 3_600_000


def truncated_table_file(place: SinkUnderTest, sink: TableSink) -> None:
    """A table's data file cut short: named by verify; a repair moves it aside, commits
    the table without it and forgets its chunk; writing that chunk again restores it."""
    expected = fill(sink)
    path = table_file(sink, WINDOWS[1])
    cut = truncate(sink, path)
    [damage] = verifier(sink).verify("f1", "node1").damages
    assert (damage.where, damage.window) == (sink.store.display(path), WINDOWS[1])
    assert "unreadable: " in damage.problem
    repaired = verifier(sink).verify("f1", "node1", repair=True)
    [(moved, target)] = repaired.quarantined
    assert (moved, repaired.forgotten) == (sink.store.display(path), 1)
    for tag in TAGS:
        assert completed(sink)[tag] == [WINDOWS[0], WINDOWS[2]]
    sink.close()
    again = rewrite(place, WINDOWS)
    try:
        assert verifier(again).verify("f1", "node1").damages == []
        assert_same_rows(again, expected)
        assert isinstance(again, TableSink)
        assert again.store.read_bytes(quarantined(again, target)) == cut
    finally:
        again.close()
