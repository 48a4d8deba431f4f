"""Pure planning: durations, the UTC grid, batches under a byte budget, stable chunk ids."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.timewindow import Window, from_ms, to_ms
from pipelines.planning import (
    NICE_SIZES,
    aggregated_span,
    align_down,
    align_up,
    batch_members,
    chunk_id,
    chunk_label,
    density_per_hour,
    encoded_batch_len,
    encoded_path_len,
    on_window_grid,
    parse_duration,
    plan_chunks,
    plan_windows,
    query_batches,
    short_duration,
    tags_per_query,
    whole_buckets,
    window_for_density,
)

T0 = datetime(2024, 1, 1, tzinfo=UTC)
MS = timedelta(milliseconds=1)


def at(hours: float = 0, minutes: float = 0) -> datetime:
    return T0 + timedelta(hours=hours, minutes=minutes)


# -- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("15m", timedelta(minutes=15)),
        ("1h", timedelta(hours=1)),
        ("1d", timedelta(days=1)),
        ("90s", timedelta(seconds=90)),
        ("2w", timedelta(weeks=2)),
        ("500ms", timedelta(milliseconds=500)),
        ("1.5h", timedelta(minutes=90)),
        ("1h30m", timedelta(minutes=90)),
        (" 2 h ", timedelta(hours=2)),
        ("0s", timedelta(0)),
        (90, timedelta(seconds=90)),
        (0.25, timedelta(milliseconds=250)),
        (timedelta(minutes=3), timedelta(minutes=3)),
    ],
)
def test_parse_duration_reads_units(
    text: str | int | float | timedelta, expected: timedelta
) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "15",
        "abc",
        "1y",
        "15 minutes",
        "-1h",
        "1h-",
        -5,
        True,
        float("inf"),
        None,
        timedelta(-1),
    ],
)
def test_parse_duration_refuses_with_a_message_naming_the_input(text: Any) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        parse_duration(text)


# -- the UTC grid --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("moment", "step", "down", "up"),
    [
        (at(0, 7), timedelta(minutes=15), at(0, 0), at(0, 15)),
        (at(0, 15), timedelta(minutes=15), at(0, 15), at(0, 15)),
        (at(13, 1), timedelta(days=1), at(0), at(24)),
        (at(0, 0) + timedelta(microseconds=10), timedelta(hours=1), at(0), at(1)),
        (
            datetime(1969, 12, 31, 23, 59, tzinfo=UTC),
            timedelta(hours=1),
            datetime(1969, 12, 31, 23, tzinfo=UTC),
            datetime(1970, 1, 1, tzinfo=UTC),
        ),
        (
            datetime(1970, 1, 1, tzinfo=UTC),
            timedelta(hours=1),
            *[datetime(1970, 1, 1, tzinfo=UTC)] * 2,
        ),
    ],
)
def test_align_on_epoch_multiples(
    moment: datetime, step: timedelta, down: datetime, up: datetime
) -> None:
    assert align_down(moment, step) == down
    assert align_up(moment, step) == up


@pytest.mark.parametrize(
    "step", [timedelta(0), timedelta(seconds=-1), timedelta(microseconds=1500)]
)
def test_align_refuses_steps_that_are_not_whole_positive_milliseconds(step: timedelta) -> None:
    with pytest.raises(ValueError, match="whole number of milliseconds"):
        align_down(at(1), step)


def test_align_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError, match="naive"):
        align_down(datetime(2024, 1, 1), timedelta(hours=1))  # noqa: DTZ001


def test_plan_windows_cuts_on_the_grid_and_clips_to_the_span() -> None:
    windows = plan_windows(Window(at(0, 10), at(3, 20)), timedelta(hours=1))
    assert windows == [
        Window(at(0, 10), at(1)),
        Window(at(1), at(2)),
        Window(at(2), at(3)),
        Window(at(3), at(3, 20)),
    ]


def test_plan_windows_off_the_grid_starts_at_the_span() -> None:
    windows = plan_windows(Window(at(0, 10), at(2, 30)), timedelta(hours=1), grid=False)
    assert windows == [
        Window(at(0, 10), at(1, 10)),
        Window(at(1, 10), at(2, 10)),
        Window(at(2, 10), at(2, 30)),
    ]


def test_aggregated_span_widens_to_whole_buckets() -> None:
    span = aggregated_span(Window(at(0, 7), at(1, 31)), timedelta(minutes=15))
    assert span == Window(at(0, 0), at(1, 45))


# spans and sizes in milliseconds around 2024-01-01
offsets = st.integers(min_value=-50_000, max_value=50_000)
sizes_ms = st.integers(min_value=1, max_value=20_000)


@st.composite
def spans(draw: st.DrawFn) -> Window:
    start = draw(offsets)
    length = draw(st.integers(min_value=1, max_value=80_000))
    return Window(T0 + start * MS, T0 + (start + length) * MS)


def _at_most_300_windows(span: Window, size_ms: int) -> int:
    return max(size_ms, (span.end_ms - span.start_ms) // 300 + 1)


@given(spans(), sizes_ms)
def test_windows_tile_the_span_on_the_grid(span: Window, size_ms: int) -> None:
    size_ms = _at_most_300_windows(span, size_ms)
    windows = plan_windows(span, size_ms * MS)
    assert windows[0].start == span.start
    assert windows[-1].end == span.end
    for before, after in itertools.pairwise(windows):
        assert before.end == after.start
        assert to_ms(after.start) % size_ms == 0
    assert all(w.end - w.start <= size_ms * MS for w in windows)


@given(spans(), spans(), sizes_ms)
def test_overlapping_spans_cut_time_at_the_same_instants(
    a: Window, b: Window, size_ms: int
) -> None:
    size_ms = max(_at_most_300_windows(a, size_ms), _at_most_300_windows(b, size_ms))

    def inner(span: Window) -> set[datetime]:
        return {w.start for w in plan_windows(span, size_ms * MS)[1:]}

    if a.overlaps(b):
        low, high = max(a.start, b.start), min(a.end, b.end)
        assert {s for s in inner(a) if low < s < high} == {s for s in inner(b) if low < s < high}


@given(spans(), st.integers(min_value=1, max_value=9_000))
def test_aggregated_span_starts_and_ends_on_bucket_multiples(
    span: Window, interval_ms: int
) -> None:
    widened = aggregated_span(span, interval_ms * MS)
    assert to_ms(widened.start) % interval_ms == 0
    assert to_ms(widened.end) % interval_ms == 0
    assert widened.start <= span.start < widened.start + interval_ms * MS
    assert widened.end - interval_ms * MS < span.end <= widened.end


# -- batches -------------------------------------------------------------------------------

path_chars = st.characters(codec="utf-8", exclude_categories=["Cs"])
paths = st.text(path_chars, min_size=1, max_size=30).map(lambda s: "/" + s)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(paths, max_size=40),
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=400, max_value=2_000),
)
def test_batches_keep_order_and_stay_within_count_and_bytes(
    members: list[str], max_batch: int, budget: int
) -> None:
    batches = batch_members(members, max_batch=max_batch, max_query_bytes=budget)
    assert [m for batch in batches for m in batch] == members
    for batch in batches:
        assert 1 <= len(batch) <= max_batch
        assert encoded_batch_len(batch) <= budget
    # greedy: the next batch's first member did not fit into the previous batch
    for before, after in itertools.pairwise(batches):
        grown = (*before, after[0])
        assert len(grown) > max_batch or encoded_batch_len(grown) > budget


@given(st.text() | st.text(alphabet='/ ,.%"\\\x00\x1f\x7fAz09_-~éü€😀\u2028'))
def test_a_path_is_measured_as_its_encoded_json(path: str) -> None:
    # Most paths are counted without encoding: the count must be the encoding's.
    assert encoded_path_len(path) == encoded_batch_len([path]) - encoded_batch_len([])


def test_batches_split_when_the_bytes_run_out_before_the_count() -> None:
    members = [f"/Plant/Line {i}/Temperature, inlet ü" for i in range(10)]
    one = encoded_batch_len(members[:1])
    batches = batch_members(members, max_batch=100, max_query_bytes=one * 3)
    assert [len(b) for b in batches] == [3, 3, 3, 1]


def test_a_path_too_long_for_any_request_is_named() -> None:
    long_path = "/Plant/" + "x" * 200
    with pytest.raises(
        ValueError, match=r"tag path '/Plant/x+'\.\.\. \(207 characters\) is 2\d\d bytes"
    ):
        batch_members(["/a", long_path], max_batch=10, max_query_bytes=200)


def test_batches_refuse_a_batch_size_below_one() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        batch_members(["/a"], max_batch=0)


def test_custom_encoded_length_is_used() -> None:
    batches = batch_members(
        ["/a", "/b", "/c"], max_batch=10, max_query_bytes=30, encoded_len=lambda p: 10
    )
    assert batches == [("/a", "/b"), ("/c",)]


# -- window sizing -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("per_hour", "tags", "interval", "expected"),
    [
        (3600, 100, None, timedelta(minutes=30)),  # 360k rows/h -> 0.55 h
        (3600, 1, None, timedelta(days=2) - timedelta(days=1)),  # 3600 rows/h -> 55 h -> 1d
        (60, 1, None, timedelta(days=31)),
        (1e9, 50, None, timedelta(minutes=1)),  # too dense for anything: the minimum
        (0, 10, None, timedelta(days=31)),
        (4, 100, timedelta(minutes=15), timedelta(days=7)),
        (3600 / 7, 100, timedelta(minutes=7), timedelta(minutes=119)),  # 2h // 7m buckets
    ],
)
def test_window_for_density_examples(
    per_hour: float, tags: int, interval: timedelta | None, expected: timedelta
) -> None:
    assert window_for_density(per_hour, tags, interval=interval) == expected


@given(
    st.floats(min_value=0, max_value=1e7),
    st.integers(min_value=1, max_value=500),
    st.none() | st.integers(min_value=1, max_value=3_600_000).map(lambda ms: ms * MS),
)
def test_window_for_density_is_nice_bounded_and_whole_buckets(
    per_hour: float, tags: int, interval: timedelta | None
) -> None:
    size = window_for_density(per_hour, tags, interval=interval)
    if interval is None:
        assert size in NICE_SIZES
        hours = size / timedelta(hours=1)
        assert size == NICE_SIZES[0] or per_hour * tags * hours <= 200_000
    else:
        assert size % interval == timedelta(0)
        assert size >= interval


@given(st.floats(min_value=0, max_value=1e6), st.floats(min_value=0, max_value=1e6))
def test_denser_data_never_gets_larger_windows(a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert window_for_density(high, 10) <= window_for_density(low, 10)


@pytest.mark.parametrize("rate", [float("nan"), float("inf"), -1.0])
def test_window_for_density_refuses_rates_that_are_not_finite(rate: float) -> None:
    with pytest.raises(ValueError, match="rate"):
        window_for_density(rate, 10)


# -- chunks --------------------------------------------------------------------------------


def test_chunk_ids_are_stable_20_hex_and_depend_on_every_input() -> None:
    window = Window(at(0), at(1))
    base = chunk_id("f", "d", ["/a", "/b"], window, "raw")
    assert re.fullmatch(r"[0-9a-f]{20}", base)
    assert base == chunk_id("f", "d", ("/a", "/b"), Window(at(0), at(1)), "raw")
    variants = [
        chunk_id("g", "d", ["/a", "/b"], window, "raw"),
        chunk_id("f", "e", ["/a", "/b"], window, "raw"),
        chunk_id("f", "d", ["/b", "/a"], window, "raw"),
        chunk_id("f", "d", ["/a"], window, "raw"),
        chunk_id("f", "d", ["/a", "/b"], Window(at(0), at(2)), "raw"),
        chunk_id("f", "d", ["/a", "/b"], window, "aggregated/avg/900000"),
    ]
    assert len({base, *variants}) == 7


def test_plan_chunks_is_window_major_with_labels() -> None:
    batches = [("/Plant A/x", "/Plant A/y"), ("/Plant A/z",)]
    chunks = plan_chunks(
        "f", "d", "tag_history", batches, Window(at(0, 30), at(2)), timedelta(hours=1), "k"
    )
    assert [(c.window.start, c.members) for c in chunks] == [
        (at(0, 30), batches[0]),
        (at(0, 30), batches[1]),
        (at(1), batches[0]),
        (at(1), batches[1]),
    ]
    assert chunks[0].label == "2 tags /Plant A/x [2024-01-01T00:30Z, +30m)"
    assert chunks[3].label == "1 tag /Plant A/z [2024-01-01T01:00Z, +1h)"
    assert all(c.unit_key == "f" and c.dataset == "d" and c.kind == "tag_history" for c in chunks)


def test_chunk_labels_show_seconds_and_alarm_paths() -> None:
    label = chunk_label(
        ["/Alarms/"], Window(at(0) + timedelta(seconds=30), at(0, 2)), noun="alarm path"
    )
    assert label == "1 alarm path /Alarms/ [2024-01-01T00:00:30Z, +90s)"
    assert short_duration(timedelta(milliseconds=1500)) == "1500ms"
    assert short_duration(timedelta(hours=36)) == "36h"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8),
        min_size=1,
        max_size=9,
        unique=True,
    ),
    st.integers(min_value=1, max_value=4),
    spans(),
    sizes_ms,
    st.none() | st.integers(min_value=1, max_value=5_000),
)
def test_plan_covers_every_member_and_millisecond_exactly_once(
    members: list[str], max_batch: int, span: Window, size_ms: int, interval_ms: int | None
) -> None:
    size = _at_most_300_windows(span, size_ms) * MS
    if interval_ms is not None:
        span = aggregated_span(span, interval_ms * MS)
        size = window_for_density(3600, max_batch, interval=interval_ms * MS, min_size=MS)
    batches = batch_members(members, max_batch=max_batch)
    chunks = plan_chunks("f", "d", "tag_history", batches, span, size, "k")
    # exactly once: per member, the windows tile the span with no gap and no overlap
    per_member: dict[str, list[Window]] = {}
    for chunk in chunks:
        for member in chunk.members:
            per_member.setdefault(member, []).append(chunk.window)
    assert set(per_member) == set(members)
    for windows in per_member.values():
        assert windows == sorted(windows)
        assert windows[0].start == span.start
        assert windows[-1].end == span.end
        assert all(a.end == b.start for a, b in itertools.pairwise(windows))
    if interval_ms is not None:
        assert all(to_ms(c.window.start) % interval_ms == 0 for c in chunks)
        assert all(to_ms(c.window.end) % interval_ms == 0 for c in chunks)
    # same inputs, same ids; ids are unique within a plan
    again = plan_chunks("f", "d", "tag_history", batches, span, size, "k")
    assert [c.chunk_id for c in again] == [c.chunk_id for c in chunks]
    assert len({c.chunk_id for c in chunks}) == len(chunks)


@settings(max_examples=60, deadline=None)
@given(st.integers(-500, 500), st.integers(1, 400), st.integers(1, 120), st.integers(1, 3))
def test_plan_counts_each_member_millisecond_once_brute_force(
    start: int, length: int, size_ms: int, members: int
) -> None:
    span = Window(T0 + start * MS, T0 + (start + length) * MS)
    names = [f"/t{i}" for i in range(members)]
    chunks = plan_chunks(
        "f", "d", "tag_history", batch_members(names, max_batch=2), span, size_ms * MS, "k"
    )
    seen: Counter[tuple[str, int]] = Counter()
    for chunk in chunks:
        for member in chunk.members:
            for ms in range(chunk.window.start_ms, chunk.window.end_ms):
                seen[(member, ms)] += 1
    expected = {(m, ms) for m in names for ms in range(span.start_ms, span.end_ms)}
    assert set(seen) == expected
    assert set(seen.values()) == {1}


@pytest.mark.parametrize(
    ("size", "outcome"),
    [(timedelta(hours=1), nullcontext()), (timedelta(0), pytest.raises(ValueError, match="step"))],
)
def test_plan_windows_refuses_a_zero_size(
    size: timedelta, outcome: AbstractContextManager[Any]
) -> None:
    with outcome:
        assert plan_windows(Window(from_ms(0), from_ms(1)), size)


@pytest.mark.parametrize("text", ["99999999999999d", "1" * 400 + "s", 10**30, 1e300])
def test_a_duration_past_what_a_timedelta_holds_is_a_value_error(text: Any) -> None:
    with pytest.raises(ValueError, match=r"is too long \(at most 999,999,999 days\)$"):
        parse_duration(text)


# -- density probes ------------------------------------------------------------------------

HOUR_MS = 3_600_000


def test_an_uncapped_probe_counts_rows_per_hour_and_missing_tags_as_zero() -> None:
    answered = [(3600, HOUR_MS - 1000), (60, HOUR_MS - 60_000)]
    # The busiest tag is measured up to its last sample, a second before the end: a hair more.
    assert density_per_hour(answered, 4, 0, HOUR_MS) == pytest.approx((3601 + 60) / 4, abs=0.01)


def test_a_probe_cut_by_a_node_cap_is_measured_up_to_the_last_sample() -> None:
    # A node capping raw answers at 300 samples: tags at 1 Hz stop after 300 s.
    capped = [(300, 299_000)] * 10
    assert density_per_hour(capped, 10, 0, HOUR_MS) == pytest.approx(300 * 3600 / 299)
    # A slower tag beside them is not cut, and counts over the whole hour.
    mixed = [(300, 299_000), (60, HOUR_MS - 60_000)]
    assert density_per_hour(mixed, 2, 0, HOUR_MS) == pytest.approx((300 * 3600 / 299 + 60) / 2)


def test_a_probe_that_saw_nothing_is_zero() -> None:
    assert density_per_hour([(0, None), (0, None)], 2, 0, HOUR_MS) == 0


# -- a run's span, batches and queries ------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (at(0, 7), at(1, 31), Window(at(0, 0), at(1, 30))),  # the partial last bucket waits
        (at(0, 0), at(1, 0), Window(at(0, 0), at(1, 0))),
        (at(0, 7), at(0, 14), None),  # no bucket whole
    ],
)
def test_an_aggregated_span_keeps_whole_buckets_only(
    start: datetime, end: datetime, expected: Window | None
) -> None:
    assert whole_buckets(Window(start, end), timedelta(minutes=15)) == expected


def test_a_delta_span_starts_on_the_window_grid_and_its_look_back_follows() -> None:
    span = Window(at(0, 7), at(3))
    assert on_window_grid(span, None, timedelta(hours=1)) == (Window(at(0), at(3)), None)
    aligned, always = on_window_grid(span, Window(at(0, 7), at(1)), timedelta(hours=1))
    assert aligned == always == Window(at(0), at(3))


def test_one_query_takes_every_member_and_otherwise_batches_do() -> None:
    members = [f"/t{i}" for i in range(5)]
    assert query_batches(members, max_batch=2, one_query=True) == [tuple(members)]
    assert query_batches(members, max_batch=2, one_query=False) == [
        ("/t0", "/t1"),
        ("/t2", "/t3"),
        ("/t4",),
    ]
    assert tags_per_query(5, max_batch=2, one_query=True) == 5
    assert tags_per_query(5, max_batch=2, one_query=False) == 2
    assert tags_per_query(1, max_batch=2, one_query=False) == 1
