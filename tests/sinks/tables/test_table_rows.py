"""A chunk's rows checked once for both table formats (`sinks.tables.rows.chunk_rows`),
before Delta or Iceberg writes anything: a refusal here commits nothing in either."""

from __future__ import annotations

import pytest

from sinks.base import CountMismatch, SinkError
from sinks.tables.rows import chunk_rows
from tests.sinks.lake.lake_frames import concat, history_frame, scope, window

TAGS = ("/plant/a", "/plant/b", "/plant/c d")


def test_a_count_mismatch_rows_sharing_a_key_or_rows_outside_the_scope_are_refused() -> None:
    frame = history_frame(TAGS, window(0, 2))
    chunk = scope(TAGS, window(0, 2), "c2")
    with pytest.raises(CountMismatch, match="holds 36 rows, fetched 37: nothing committed"):
        chunk_rows(frame, chunk, len(frame) + 1, "delta 'd'")
    twice = concat([frame, frame.iloc[:1]])
    with pytest.raises(CountMismatch, match="rows share one key"):
        chunk_rows(twice, chunk, len(twice), "delta 'd'")
    with pytest.raises(SinkError, match=r"^iceberg 'i': .*outside its scope"):
        chunk_rows(frame, scope(TAGS[:1], window(0, 2), "c2"), len(frame), "iceberg 'i'")


def test_rows_come_back_sorted_by_the_key_and_plain() -> None:
    frame = history_frame(TAGS, window(0, 2))
    shuffled = frame.sample(frac=1.0, random_state=3)
    table = chunk_rows(shuffled, scope(TAGS, window(0, 2), "c1"), len(frame), "delta 'd'")
    keys = list(
        zip(*(table.column(k).to_pylist() for k in ("node", "tag", "ts", "seq")), strict=True)
    )
    assert keys == sorted(keys)
    assert not any(str(f.type).startswith("dictionary") for f in table.schema)
