"""Pure state: watermarks never run ahead of data; pending chunks are exactly the rest."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.timewindow import Window
from pipelines.planning import batch_members, narrow_chunk, plan_chunks
from pipelines.state import (
    common_progress,
    flow_watermark,
    incremental_span,
    is_covered,
    lacking_members,
    member_watermarks,
    pending_chunks,
    watermark,
)
from sinks.base import Progress

T0 = datetime(2024, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def w(start: float, end: float) -> Window:
    return Window(h(start), h(end))


def m(ms: int) -> datetime:
    return T0 + ms * MS


# -- watermark -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("completed", "origin", "expected"),
    [
        ([], h(0), None),
        ([w(0, 1)], h(0), h(1)),
        ([w(0, 1), w(1, 2), w(3, 4)], h(0), h(2)),  # touching joins, the gap stops it
        ([w(3, 4), w(0, 1), w(1, 2)], h(0), h(2)),  # any order
        ([w(0, 2), w(1, 3)], h(0), h(3)),  # overlapping
        ([w(-5, 1)], h(0), h(1)),  # started before the origin
        ([w(1, 2)], h(0), None),  # the origin itself is missing
        ([w(-1, 0)], h(0), None),  # ends exactly at the origin: nothing after it is done
        ([w(0, 1), w(2, 3)], h(2.5), h(3)),
    ],
)
def test_watermark_examples(
    completed: list[Window], origin: datetime, expected: datetime | None
) -> None:
    assert watermark(completed, origin) == expected


small_windows = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 10)).map(
        lambda p: Window(m(p[0]), m(p[0] + p[1]))
    ),
    max_size=8,
)


def _done_ms(completed: list[Window]) -> set[int]:
    return {ms for window in completed for ms in range(window.start_ms, window.end_ms)}


@given(small_windows, st.integers(0, 50))
def test_watermark_equals_the_millisecond_by_millisecond_reading(
    completed: list[Window], origin: int
) -> None:
    t0_ms = Window(T0, T0 + MS).start_ms
    done = {ms - t0_ms for ms in _done_ms(completed)}
    if origin not in done:
        expected = None
    else:
        end = origin
        while end in done:
            end += 1
        expected = m(end)
    assert watermark(completed, m(origin)) == expected


@given(small_windows, st.integers(0, 50), st.integers(1, 10))
def test_is_covered_equals_the_millisecond_by_millisecond_reading(
    completed: list[Window], start: int, length: int
) -> None:
    done = _done_ms(completed)
    window = Window(m(start), m(start + length))
    expected = all(ms in done for ms in range(window.start_ms, window.end_ms))
    assert is_covered(completed, window) is expected


def test_member_and_flow_watermarks() -> None:
    progress = Progress("f", {"/a": [w(0, 3)], "/b": [w(0, 1), w(1, 2)], "/c": [w(1, 5)]})
    assert member_watermarks(progress, ["/a", "/b", "/c", "/d"], h(0)) == {
        "/a": h(3),
        "/b": h(2),
        "/c": None,
        "/d": None,
    }
    assert flow_watermark(progress, ["/a", "/b"], h(0)) == h(2)
    assert flow_watermark(progress, ["/a", "/c"], h(0)) is None
    assert flow_watermark(progress, [], h(0)) is None


# -- pending chunks ------------------------------------------------------------------------


def _complete(progress: Progress, chunk_windows: list[tuple[tuple[str, ...], Window]]) -> None:
    for members, window in chunk_windows:
        for member in members:
            progress.completed.setdefault(member, []).append(window)


@given(
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(1, 12),
    st.data(),
)
def test_pending_chunks_after_completing_a_random_subset_are_exactly_the_rest(
    tags: int, max_batch: int, hours: int, data: st.DataObject
) -> None:
    members = [f"/Plant/t{i}" for i in range(tags)]
    chunks = plan_chunks(
        "f",
        "d",
        "tag_history",
        batch_members(members, max_batch=max_batch),
        w(0, hours),
        timedelta(hours=1),
        "k",
    )
    done = data.draw(st.sets(st.sampled_from(range(len(chunks)))))
    progress = Progress("f")
    _complete(progress, [(chunks[i].members, chunks[i].window) for i in sorted(done)])
    assert pending_chunks(chunks, progress) == [c for i, c in enumerate(chunks) if i not in done]


def test_a_chunk_is_pending_until_every_member_has_its_window() -> None:
    chunks = plan_chunks("f", "d", "tag_history", [("/a", "/b")], w(0, 2), timedelta(hours=1), "k")
    progress = Progress("f", {"/a": [w(0, 2)], "/b": [w(0, 0.5), w(1, 2)]})
    assert pending_chunks(chunks, progress) == [chunks[0]]


def test_completion_by_a_larger_window_counts() -> None:
    chunks = plan_chunks("f", "d", "tag_history", [("/a",)], w(0, 3), timedelta(hours=1), "k")
    progress = Progress("f", {"/a": [w(-1, 2.5)]})
    assert [c.window for c in pending_chunks(chunks, progress)] == [w(2, 3)]


def test_chunks_in_the_look_back_are_kept_even_when_complete() -> None:
    chunks = plan_chunks("f", "d", "tag_history", [("/a",)], w(0, 4), timedelta(hours=1), "k")
    progress = Progress("f", {"/a": [w(0, 4)]})
    assert pending_chunks(chunks, progress) == []
    kept = pending_chunks(chunks, progress, always=w(2.5, 4))
    assert [c.window for c in kept] == [w(2, 3), w(3, 4)]


# -- incremental span ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mark", "expected"),
    [
        (None, w(0, 9.75)),  # first run: from the history start
        (h(5), w(4, 9.75)),  # watermark minus one hour of look-back
        (h(0.5), w(0, 9.75)),  # look-back never reaches before the history start
        (h(9.9), w(8.9, 9.75)),
    ],
)
def test_incremental_span(mark: datetime | None, expected: Window) -> None:
    span = incremental_span(
        history_start=h(0),
        watermark=mark,
        now=h(10),
        lookback=timedelta(hours=1),
        settle=timedelta(minutes=15),
    )
    assert span == expected


def test_incremental_span_is_none_when_settle_leaves_nothing() -> None:
    assert (
        incremental_span(
            history_start=h(0),
            watermark=h(10),
            now=h(10),
            lookback=timedelta(0),
            settle=timedelta(minutes=5),
        )
        is None
    )
    assert (
        incremental_span(
            history_start=h(10),
            watermark=None,
            now=h(10),
            lookback=timedelta(0),
            settle=timedelta(0),
        )
        is None
    )


def test_incremental_span_refuses_negative_durations() -> None:
    with pytest.raises(ValueError, match="negative"):
        incremental_span(
            history_start=h(0),
            watermark=None,
            now=h(1),
            lookback=timedelta(hours=-1),
            settle=timedelta(0),
        )


@given(
    st.integers(0, 100),
    st.none() | st.integers(0, 100),
    st.integers(0, 200),
    st.integers(0, 30),
    st.integers(0, 30),
)
def test_incremental_span_never_starts_before_history_or_after_the_watermark(
    start: int, mark: int | None, now: int, lookback: int, settle: int
) -> None:
    span = incremental_span(
        history_start=m(start),
        watermark=None if mark is None else m(mark),
        now=m(now),
        lookback=lookback * MS,
        settle=settle * MS,
    )
    if span is None:
        return
    assert span.start >= m(start)
    if mark is not None:
        assert span.start <= max(m(start), m(mark))
    assert span.end == m(now - settle)


def test_lacking_members_are_those_some_sink_has_not_completed() -> None:
    chunks = plan_chunks(
        "f", "d", "tag_history", [("/a", "/b", "/c")], w(0, 2), timedelta(hours=1), "k"
    )
    lake = Progress("f", {"/a": [w(0, 2)], "/b": [w(0, 2)], "/c": [w(0, 2)]})
    warehouse = Progress("f", {"/a": [w(0, 2)], "/c": [w(0, 1)]})  # /b reset, /c behind
    lacking = lacking_members(chunks, [lake, warehouse])
    assert lacking == {chunks[0].chunk_id: ("/b",), chunks[1].chunk_id: ("/b", "/c")}


def test_members_sharing_one_window_list_each_get_their_own_answer() -> None:
    # Sinks share one list between members with equal windows (sinks.base.SharedWindows);
    # what is computed once per list must still be answered per member and per sink.
    shared, early = [w(0, 2)], [w(0, 1)]
    lake = Progress("f", {"/a": shared, "/b": shared, "/c": early})
    warehouse = Progress("f", {"/a": shared, "/b": [w(1, 2)], "/c": shared})
    assert member_watermarks(lake, ["/a", "/b", "/c", "/d"], h(0)) == {
        "/a": h(2),
        "/b": h(2),
        "/c": h(1),
        "/d": None,
    }
    assert member_watermarks(warehouse, ["/b", "/c"], h(0)) == {"/b": None, "/c": h(2)}
    chunks = plan_chunks(
        "f", "d", "tag_history", [("/a", "/b", "/c")], w(0, 2), timedelta(hours=1), "k"
    )
    assert lacking_members(chunks, [lake, warehouse]) == {
        chunks[0].chunk_id: ("/b",),
        chunks[1].chunk_id: ("/c",),
    }
    assert pending_chunks(chunks, lake) == [chunks[1]]


def test_a_narrowed_chunk_holds_only_the_lacking_tags_in_batches() -> None:
    (chunk,) = plan_chunks(
        "f", "d", "tag_history", [("/a", "/b", "/c", "/d")], w(0, 1), timedelta(hours=1), "k"
    )
    assert narrow_chunk(chunk, chunk.members, max_batch=2, options_key="k", by_paths=True) == [
        chunk
    ], "a chunk lacking every tag stays whole"
    narrowed = narrow_chunk(chunk, ("/b", "/c", "/d"), max_batch=2, options_key="k", by_paths=True)
    assert [c.members for c in narrowed] == [("/b", "/c"), ("/d",)]
    assert all(c.by_paths and c.window == chunk.window for c in narrowed)
    assert len({c.chunk_id for c in narrowed} | {chunk.chunk_id}) == 3, "ids of their own"


# -- a fleet flow's coverage: what every node holds ------------------------------------------


def test_common_progress_is_what_every_node_completed() -> None:
    a = Progress("f@a", {"/t1": [w(0, 4), w(6, 8)], "/t2": [w(0, 8)], "/only_a": [w(0, 1)]})
    b = Progress("f@b", {"/t1": [w(1, 7)], "/t2": [w(0, 2), w(3, 8)]})
    common = common_progress("f", [a, b])
    assert common.flow == "f"
    assert common.completed == {"/t1": [w(1, 4), w(6, 7)], "/t2": [w(0, 2), w(3, 8)]}
    assert common_progress("f", [a]) is a
    assert common_progress("f", []).completed == {}


@given(
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), max_size=6),
    st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), max_size=6),
)
def test_common_progress_covers_an_hour_exactly_when_both_do(
    left: list[tuple[int, int]], right: list[tuple[int, int]]
) -> None:
    a = Progress("a", {"/t": [w(s, s + n) for s, n in left]})
    b = Progress("b", {"/t": [w(s, s + n) for s, n in right]})
    both = common_progress("f", [a, b]).completed.get("/t", [])
    for hour in range(52):
        inside = [is_covered(p.windows_of("/t"), w(hour, hour + 1)) for p in (a, b)]
        assert is_covered(both, w(hour, hour + 1)) == all(inside)
