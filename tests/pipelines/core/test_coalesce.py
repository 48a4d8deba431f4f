"""Small chunks of one window are written together: what joins, when it goes, what it holds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from connectors.schema import SCHEMAS, frame_from_table
from connectors.timewindow import Window
from pipelines.core.coalesce import coalesce, join, joined_id
from pipelines.core.engine import ChunkResult
from pipelines.planning import Chunk, chunk_id

T0 = datetime(2026, 11, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def window(index: int) -> Window:
    return Window(T0 + index * HOUR, T0 + (index + 1) * HOUR)


def result(
    tags: list[str], at: Window, rows_per_tag: int, *, as_table: bool = False
) -> ChunkResult:
    chunk = Chunk(
        unit_key="f",
        dataset="d",
        kind="tag_history",
        members=tuple(tags),
        window=at,
        chunk_id=chunk_id("f", "d", tags, at, "{}"),
        label=f"{tags[0]}",
    )
    names = [tag for tag in tags for _ in range(rows_per_tag)]
    start_ms = at.start_ms
    table = pa.table(
        {
            "node": pa.array(["n"] * len(names)).dictionary_encode(),
            "tag": pa.array(names).dictionary_encode(),
            "ts": pa.array(
                [start_ms + i % rows_per_tag * 1000 for i in range(len(names))],
                pa.timestamp("ms", tz="UTC"),
            ),
            "value": pa.array([float(i) for i in range(len(names))]),
        }
    )
    rows = table if as_table else frame_from_table(table)
    return ChunkResult(chunk, rows, len(names), requests=1, bytes_received=10)


def rows_of(joined: ChunkResult) -> list[tuple[str, float]]:
    table = pa.Table.from_pandas(joined.frame, preserve_index=False)
    return sorted(zip(table["tag"].to_pylist(), table["value"].to_pylist(), strict=True))


def test_small_chunks_of_a_window_become_one_write_of_all_their_rows() -> None:
    parts = [result([f"/t{b}{i}" for i in range(3)], window(0), 2) for b in range(4)]
    [joined] = coalesce(parts, Counter({window(0): 4}), small_rows=100)
    assert joined.rows_fetched == 24 == len(joined.frame)
    assert joined.chunk.members == tuple(m for part in parts for m in part.chunk.members)
    assert joined.chunk.window == window(0)
    assert joined.chunks == 4
    assert joined.parts == tuple(part.chunk for part in parts)
    assert (joined.requests, joined.bytes_received) == (4, 40)
    expected = sorted(
        (tag, value)
        for part in parts
        for tag, value in zip(
            part.frame["tag"].astype(str), part.frame["value"].astype(float), strict=True
        )
    )
    assert rows_of(joined) == expected
    # One Arrow chunk per column, the tag dictionary unified across the parts.
    tags = pa.Table.from_pandas(joined.frame, preserve_index=False)["tag"]
    assert tags.num_chunks == 1
    assert len(tags.chunk(0).dictionary) == 12


def test_the_joined_id_does_not_depend_on_arrival_order() -> None:
    parts = [result([f"/t{b}"], window(0), 1).chunk for b in range(5)]
    assert joined_id(parts) == joined_id(parts[::-1])
    assert joined_id(parts) != joined_id(parts[:4])


def test_large_chunks_pass_through_and_windows_never_mix() -> None:
    big = result(["/big"], window(0), 50)
    small = [result(["/a"], window(0), 1), result(["/b"], window(1), 1)]
    out = list(
        coalesce([small[0], big, small[1]], Counter({window(0): 2, window(1): 1}), small_rows=10)
    )
    assert out[0] is big
    assert [r.chunk.window for r in out[1:]] == [window(0), window(1)]
    assert all(r.chunks == 1 for r in out)


def test_a_window_is_written_as_soon_as_its_last_chunk_is_in() -> None:
    consumed: list[str] = []

    def stream() -> Iterator[ChunkResult]:
        for item in [
            result(["/a"], window(0), 1),
            result(["/b"], window(0), 1),
            result(["/c"], window(1), 1),
        ]:
            consumed.append(item.chunk.members[0])
            yield item

    joined = coalesce(stream(), Counter({window(0): 2, window(1): 1}), small_rows=10)
    first = next(joined)
    assert first.chunk.members == ("/a", "/b")
    assert consumed == ["/a", "/b"], "the next window's chunk was not waited for"


def test_a_joined_write_never_passes_max_rows() -> None:
    parts = [result([f"/t{i}"], window(0), 4) for i in range(5)]
    out = list(coalesce(parts, Counter({window(0): 5}), small_rows=10, max_rows=8))
    assert [r.rows_fetched for r in out] == [8, 8, 4]
    assert sum(r.chunks for r in out) == 5


def test_on_a_fetch_failure_what_was_fetched_is_still_written_then_the_error_goes_on() -> None:
    def stream() -> Iterator[ChunkResult]:
        yield result(["/a"], window(0), 1)
        yield result(["/b"], window(0), 1)
        raise RuntimeError("node down")

    out: list[ChunkResult] = []
    joined = coalesce(stream(), Counter({window(0): 3}), small_rows=10)
    out.append(next(joined))
    with pytest.raises(RuntimeError, match="node down"):
        next(joined)
    assert [r.chunk.members for r in out] == [("/a", "/b")]


def test_only_chunks_of_one_window_can_be_joined() -> None:
    with pytest.raises(ValueError, match="one window"):
        join([result(["/a"], window(0), 1), result(["/b"], window(1), 1)])


def test_empty_chunks_join_with_the_others() -> None:
    empty = result(["/quiet"], window(0), 1)
    empty.rows, empty.rows_fetched = empty.frame.iloc[0:0], 0
    [joined] = coalesce(
        [empty, result(["/a"], window(0), 2)], Counter({window(0): 2}), small_rows=10
    )
    assert joined.chunk.members == ("/quiet", "/a")
    assert joined.rows_fetched == 2 == len(joined.frame)


def full_result(tags: list[str], *, dictionary: bool) -> ChunkResult:
    """A result whose frame has every tag-history column, `tag` plain or dictionary-encoded."""
    empty = SCHEMAS["tag_history"].empty_table()
    start_ms = window(0).start_ms
    columns = {
        name: pa.nulls(len(tags), empty.schema.field(name).type) for name in empty.column_names
    }
    columns["node"] = pa.array(["n"] * len(tags))
    columns["tag"] = pa.array(tags).dictionary_encode() if dictionary else pa.array(tags)
    columns["ts"] = pa.array([start_ms] * len(tags), pa.timestamp("ms", tz="UTC"))
    columns["seq"] = pa.array([0] * len(tags), empty.schema.field("seq").type)
    base = result(tags, window(0), 1)
    base.rows = frame_from_table(pa.table(columns))
    return base


def test_frames_typed_apart_join_in_the_kinds_schema() -> None:
    joined = join(
        [full_result(["/a"], dictionary=False), full_result(["/b", "/c"], dictionary=True)]
    )
    assert sorted(joined.frame["tag"].astype(str)) == ["/a", "/b", "/c"]
    assert len(joined.frame) == joined.rows_fetched == 3


def test_fetched_tables_join_without_a_dataframe_per_chunk() -> None:
    """The engine's results carry Arrow tables: joined as tables, one DataFrame in all."""
    tables = [result([f"/t{b}"], window(0), 2, as_table=True) for b in range(3)]
    frames = [result([f"/t{b}"], window(0), 2) for b in range(3)]
    [joined] = coalesce(tables, Counter({window(0): 3}), small_rows=100)
    [expected] = coalesce(frames, Counter({window(0): 3}), small_rows=100)
    assert all(isinstance(part.rows, pa.Table) for part in tables)
    assert rows_of(joined) == rows_of(expected)
    assert len(rows_of(joined)) == 6
