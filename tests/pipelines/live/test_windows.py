"""The tail's windows of event time (pure): each commit writes every row held for the
windows that changed, a late sample lands where it belongs or is handed to history."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa

from connectors.schema import TAG_HISTORY_SCHEMA
from connectors.timewindow import Window
from pipelines.live.windows import WindowBuffer

S = 1_000


def rows(*samples: tuple[str, int]) -> pa.Table:
    count = len(samples)
    return pa.table(
        {
            "node": ["n"] * count,
            "tag": [tag for tag, _ in samples],
            "ts": pa.array([ts for _, ts in samples], pa.int64()).cast(
                TAG_HISTORY_SCHEMA.field("ts").type
            ),
            "seq": pa.array([0] * count, pa.int16()),
            "value": pa.array([float(ts) for _, ts in samples]),
            "value_bool": pa.nulls(count, pa.bool_()),
            "value_str": pa.nulls(count, pa.string()),
            "quality": pa.array([192] * count, pa.int16()),
            "extra": pa.nulls(count, pa.int64()),
        },
        schema=TAG_HISTORY_SCHEMA,
    )


def buffer() -> WindowBuffer:
    return WindowBuffer(timedelta(seconds=1), timedelta(seconds=2))


def stamps(table: pa.Table) -> list[tuple[str, int, int]]:
    ts = table.column("ts").cast(pa.int64()).to_pylist()
    return list(
        zip(table.column("tag").to_pylist(), ts, table.column("seq").to_pylist(), strict=True)
    )


def test_a_commit_writes_runs_of_contiguous_windows_with_seq_numbered() -> None:
    held = buffer()
    assert held.add(rows(("a", 10_100), ("a", 10_100), ("b", 11_500), ("a", 13_000))) == []
    first, second = held.take()
    assert first.window == Window.from_ms(10 * S, 12 * S)
    assert stamps(first.rows) == [("a", 10_100, 0), ("a", 10_100, 1), ("b", 11_500, 0)]
    assert second.window == Window.from_ms(13 * S, 14 * S)
    assert list(held.take()) == [], "nothing new: nothing to write"


def test_a_late_sample_rewrites_its_window_with_every_row_held_for_it() -> None:
    held = buffer()
    held.add(rows(("a", 10_100), ("a", 12_100)))
    list(held.take())
    assert held.add(rows(("b", 10_700))) == []
    (batch,) = held.take()
    assert batch.window == Window.from_ms(10 * S, 11 * S)
    assert stamps(batch.rows) == [("a", 10_100, 0), ("b", 10_700, 0)]


def test_a_sample_past_late_within_or_in_a_fence_is_left_to_history() -> None:
    held = buffer()
    held.add(rows(("a", 10_100), ("a", 20_100)))
    list(held.take())
    held.forget_old()  # 10 s window: more than 2 s before the newest committed
    assert held.add(rows(("a", 10_200))) == [Window.from_ms(10 * S, 11 * S)]
    fenced = held.fence(Window.from_ms(19_500, 20_500))
    assert fenced == Window.from_ms(19 * S, 21 * S)
    assert held.add(rows(("a", 20_300))) == [Window.from_ms(20 * S, 21 * S)]
    assert held.rows_held() == 0, "the fenced window's rows went with it"
    assert held.add(rows(("a", 21_000))) == []
    (batch,) = held.take()
    assert batch.window == Window.from_ms(21 * S, 22 * S)


def test_samples_not_yet_committed_are_never_late() -> None:
    held = buffer()
    assert held.add(rows(("a", 1_000), ("a", 60_000))) == []
    assert [batch.window.start_ms for batch in held.take()] == [1 * S, 60 * S]


def test_a_tag_behind_a_steady_lag_is_written_not_left_to_history() -> None:
    held = buffer()
    held.add(rows(("local", 130_000), ("remote", 10_000)))
    list(held.take())
    held.forget_old()
    # 120 s behind the local tag, 1 s after its own newest: its window, not a gap.
    assert held.add(rows(("remote", 11_000))) == []
    (batch,) = held.take()
    assert batch.window == Window.from_ms(11 * S, 12 * S)
    held.add(rows(("remote", 14_000)))
    list(held.take())
    held.forget_old()  # its rows of 10-12 s are more than 2 s behind its own newest
    assert held.add(rows(("remote", 10_500))) == [Window.from_ms(10 * S, 11 * S)]


def test_a_quiet_tags_rows_are_let_go_after_keep() -> None:
    held = buffer()
    held.add(rows(("quiet", 1_000), ("busy", 1_000)))
    list(held.take())
    held.add(rows(("busy", 1_000 + 11 * 60 * S)))
    list(held.take())
    held.forget_old()
    assert held.rows_held() == 1, "only the busy tag's newest row is left"
    assert held.add(rows(("quiet", 1_500))) == [Window.from_ms(1 * S, 2 * S)]
