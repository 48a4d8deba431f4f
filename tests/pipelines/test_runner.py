"""Run summaries count rows and bad-quality rows per tag (null quality counts as bad)."""

from __future__ import annotations

import pyarrow as pa

from connectors.schema import TAG_HISTORY_SCHEMA, frame_from_table
from pipelines.runner import _tag_counts


def test_rows_and_bad_quality_are_counted_per_tag() -> None:
    samples = [("/a", 192), ("/a", 0), ("/b", None), ("/b", 192), ("/c", 200)]
    rows = [
        {
            "node": "n",
            "tag": tag,
            "ts": i,
            "seq": 0,
            "value": 1.0,
            "value_bool": None,
            "value_str": None,
            "quality": quality,
            "extra": 0,
        }
        for i, (tag, quality) in enumerate(samples)
    ]
    frame = frame_from_table(pa.Table.from_pylist(rows, schema=TAG_HISTORY_SCHEMA))
    per_tag, bad = _tag_counts(frame, "tag_history")
    assert per_tag == {"/a": 2, "/b": 2, "/c": 1}
    assert bad == {"/a": 1, "/b": 1}


def test_dictionary_encoded_tags_are_counted_like_strings() -> None:
    samples = [("/b", 192), ("/a", 0), ("/b", None), ("/a", 192), ("/c", 200)]
    rows = [
        {
            "node": "n",
            "tag": tag,
            "ts": i,
            "seq": 0,
            "value": 1.0,
            "value_bool": None,
            "value_str": None,
            "quality": quality,
            "extra": 0,
        }
        for i, (tag, quality) in enumerate(samples)
    ]
    table = pa.Table.from_pylist(rows, schema=TAG_HISTORY_SCHEMA)
    # "/a" twice in the dictionary, "/zz" without rows: neither shows in the counts.
    tag = pa.DictionaryArray.from_arrays(
        pa.array([0, 1, 0, 3, 2], type=pa.int32()), pa.array(["/b", "/a", "/c", "/a", "/zz"])
    )
    encoded = table.set_column(1, pa.field("tag", tag.type, nullable=False), tag)
    assert _tag_counts(frame_from_table(encoded), "tag_history") == _tag_counts(
        frame_from_table(table), "tag_history"
    )
    per_tag, bad = _tag_counts(frame_from_table(encoded), "tag_history")
    assert per_tag == {"/a": 2, "/b": 2, "/c": 1}
    assert bad == {"/a": 1, "/b": 1}
