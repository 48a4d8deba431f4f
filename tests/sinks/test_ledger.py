"""The completeness ledger's rows (sinks/ledger.py): pure logic over Arrow tables, checked
against a plain pandas computation of the same stats."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from connectors import schema
from connectors.timewindow import Window
from sinks.base import MISSING_PREFIX, ChunkScope, held_member, held_of
from sinks.ledger import (
    LEDGER_SCHEMA,
    MISSING_REASON,
    PARTIAL_REASON,
    ledger_rows,
    tag_stats,
)

T0 = datetime(2024, 3, 1, tzinfo=UTC)
HOUR = Window(T0, T0 + timedelta(hours=1))
TS = pa.timestamp("ms", tz="UTC")


def rows(tag: list[str], offsets_s: list[float], quality: list[int | None]) -> pa.Table:
    """Tag history rows (tag, ts, quality) at T0 + offsets."""
    ms = [HOUR.start_ms + int(s * 1000) for s in offsets_s]
    return pa.table(
        {
            "tag": pa.array(tag).dictionary_encode(),
            "ts": pa.array(ms, pa.int64()).cast(TS),
            "quality": pa.array(quality, pa.int16()),
        }
    )


def chunk(members: tuple[str, ...], window: Window = HOUR, **kw: object) -> ChunkScope:
    return ChunkScope("f", "hist", schema.KIND_TAG_HISTORY, members, window, "c1", node="n1", **kw)  # type: ignore[arg-type]


def by_tag(table: pa.Table) -> dict[str, dict[str, object]]:
    return {row["tag"]: row for row in table.to_pylist()}


def test_stats_per_tag_count_quality_shares_and_gaps() -> None:
    table = rows(
        ["a", "a", "a", "a", "b"],
        [0, 10, 20, 50, 5],  # a: gaps 10, 10, 30 -> longest 30, usual 10
        [192, 100, 0, None, 216],  # good, uncertain, bad, none (bad)
    )
    found = by_tag(ledger_rows(chunk(("a", "b", "quiet")), table))
    a = found["a"]
    assert (a["samples"], a["good"], a["uncertain"], a["bad"]) == (4, 0.25, 0.25, 0.5)
    assert (a["longest_gap_ms"], a["usual_gap_ms"]) == (30_000, 10_000)
    assert (a["first_ts"], a["last_ts"]) == (T0, T0 + timedelta(seconds=50))
    b = found["b"]
    assert (b["samples"], b["good"], b["longest_gap_ms"], b["usual_gap_ms"]) == (1, 1.0, None, None)
    quiet = found["quiet"]  # asked, answered with nothing: complete, no samples
    assert (quiet["samples"], quiet["first_ts"], quiet["good"], quiet["status"]) == (
        0,
        None,
        None,
        "complete",
    )
    assert {row["status"] for row in found.values()} == {"complete"}


def test_tags_left_out_held_and_unfinished_windows_are_not_complete() -> None:
    table = rows(["a", "b"], [0, 0], [192, 192])
    members = ("a", "b", f"{MISSING_PREFIX}gone")
    found = by_tag(ledger_rows(chunk(members, held={"b": "link offline"}), table))
    assert (found["a"]["status"], found["a"]["reason"]) == ("complete", None)
    assert (found["b"]["status"], found["b"]["reason"]) == ("held", "link offline")
    assert (found["gone"]["status"], found["gone"]["reason"]) == ("missing", MISSING_REASON)
    assert found["gone"]["samples"] == 0
    future = Window(T0, datetime.now(UTC) + timedelta(hours=1))
    (row,) = ledger_rows(chunk(("a",), future), rows(["a"], [0], [192])).to_pylist()
    assert (row["status"], row["reason"]) == ("partial", PARTIAL_REASON)


def test_a_held_member_names_its_link_and_tag_whatever_they_hold() -> None:
    link, tag = "to: remote/ß,1", "/Plant A/x:y, z"
    assert held_of(held_member(tag, link)) == (link, tag)
    assert held_of(f"{MISSING_PREFIX}{tag}") is None
    assert held_of(tag) is None


def test_rows_in_any_order_give_the_same_ledger() -> None:
    table = rows(["b", "a", "b", "a", "a"], [30, 20, 0, 0, 10], [0, 192, 192, 64, 192])
    ordered = table.take(pa.array([3, 4, 1, 2, 0]))  # grouped by tag, times ascending
    members = ("a", "b")
    now = datetime.now(UTC)
    shuffled = ledger_rows(chunk(members), table, committed_at=now)
    assert shuffled.equals(ledger_rows(chunk(members), ordered, committed_at=now))
    assert by_tag(shuffled)["b"]["longest_gap_ms"] == 30_000


def test_an_alarm_chunk_has_one_row_for_its_selection() -> None:
    table = pa.table(
        {
            "path": ["/x", "/y", "/x"],
            "ts": pa.array([HOUR.start_ms + s for s in (5000, 0, 1000)]).cast(TS),
        }
    )
    scope = ChunkScope("f", "al", schema.KIND_ALARM_HISTORY, ("/",), HOUR, "c1", node="n1")
    (row,) = ledger_rows(scope, table).to_pylist()
    assert (row["tag"], row["samples"], row["longest_gap_ms"], row["usual_gap_ms"]) == (
        "/",
        3,
        4000,
        2500,
    )
    assert row["good"] is None


def test_the_ledger_has_its_schema_even_without_rows() -> None:
    empty = rows([], [], [])
    table = ledger_rows(chunk(("a",)), empty)
    assert table.schema == LEDGER_SCHEMA
    assert table.column("samples").to_pylist() == [0]


@pytest.mark.parametrize(
    "tags", [40, 200, 2000]
)  # a partition per tag; one sort (few rows, many tags)
def test_stats_equal_a_plain_pandas_computation(tags: int) -> None:
    generator = np.random.default_rng(7)
    count = 20_000
    tag = [f"t{i}" for i in generator.integers(0, tags, count)]
    offsets = generator.integers(0, 3_600_000, count)
    quality = generator.choice([0, 8, 64, 100, 191, 192, 216], count)
    ms = (HOUR.start_ms + offsets).tolist()
    table = pa.table(
        {
            "tag": pa.array(tag).dictionary_encode(),
            "ts": pa.array(ms, pa.int64()).cast(TS),
            "quality": pa.array(quality, pa.int16()),
        }
    )
    names, stats = tag_stats(table)
    got = pd.DataFrame(stats, index=names.to_pylist()).sort_index()
    frame = pd.DataFrame({"tag": tag, "ts": ms, "q": quality}).sort_values(["tag", "ts"])
    frame["gap"] = frame.groupby("tag")["ts"].diff()
    grouped = frame.groupby("tag")
    want = pd.DataFrame(
        {
            "samples": grouped.size(),
            "first_ts": grouped["ts"].min(),
            "last_ts": grouped["ts"].max(),
            "good": grouped["q"].apply(lambda q: (q >= 192).mean()),
            "bad": grouped["q"].apply(lambda q: (q < 64).mean()),
            "longest_gap_ms": grouped["gap"].max(),
            "usual_gap_ms": np.floor(grouped["gap"].median()),
        }
    ).sort_index()
    pd.testing.assert_frame_equal(
        got[want.columns].astype(float), want.astype(float), check_names=False
    )
