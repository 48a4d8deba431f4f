"""The simulator's history semantics, checked against independent computations.

Pure tests (no HTTP): `ground_truth` is recomputed here from raw samples, so these tests
pin down what the modes mean, not only that the node agrees with itself.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode

NOW = 1_780_000_000_000  # 2026-05-28
HOUR = 3_600_000
START = NOW - 30 * HOUR
END = START + 2 * HOUR
RAW_ALL = HistoryOptions(mode="raw", invalid_as_null=False)


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    node = SimulatedNode(SimConfig(seed=5, tags=40))
    node.set_clock(NOW)
    return node


def numeric_tags(node: SimulatedNode) -> list[str]:
    return [p for p in node.tag_paths() if node.tag_type(p) == "number"]


def raw(node: SimulatedNode, path: str, start: int = START, end: int = END) -> list[list[Any]]:
    return node.ground_truth(path, start, end, RAW_ALL)


def test_same_seed_gives_the_same_history_and_another_seed_does_not() -> None:
    first, second = (
        SimulatedNode(SimConfig(seed=9, tags=10)),
        SimulatedNode(SimConfig(seed=9, tags=10)),
    )
    other = SimulatedNode(SimConfig(seed=10, tags=10))
    for n in (first, second, other):
        n.set_clock(NOW)
    path = first.tag_paths()[0]
    assert raw(first, path) == raw(second, path)
    assert raw(first, path) != raw(other, path)


def test_raw_ground_truth_is_half_open_ordered_and_after_history_start(node: SimulatedNode) -> None:
    for path in node.tag_paths()[:10]:
        rows = raw(node, path)
        stamps = [row[0] for row in rows]
        assert stamps == sorted(stamps)
        assert all(START <= ts < END for ts in stamps)
        assert all(len(row) == 4 and isinstance(row[3], int) for row in rows)
    early = node.config.history_start_ms
    assert raw(node, node.tag_paths()[0], early - 10 * HOUR, early) == []


def test_a_range_is_the_concatenation_of_its_parts(node: SimulatedNode) -> None:
    """Closed-form generation: any split of a range gives the same samples."""
    for path in node.tag_paths()[:8]:
        middle = START + 37 * 60_000 + 123
        assert raw(node, path) == raw(node, path, START, middle) + raw(node, path, middle, END)


def test_the_tree_holds_bad_quality_gaps_duplicates_and_all_three_types(
    node: SimulatedNode,
) -> None:
    big = SimulatedNode(SimConfig(seed=5, tags=200))
    big.set_clock(NOW)
    qualities: set[int] = set()
    duplicates = 0
    for path in big.tag_paths()[:60]:
        rows = big.ground_truth(path, NOW - 48 * HOUR, NOW - 24 * HOUR, RAW_ALL)
        qualities.update(row[2] for row in rows)
        stamps = [row[0] for row in rows]
        duplicates += len(stamps) - len(set(stamps))
    assert {0, 64, 192} <= qualities
    assert duplicates > 0
    assert {big.tag_type(p) for p in big.tag_paths()} == {"number", "boolean", "string"}


def test_invalid_values_are_null_by_default_in_raw(node: SimulatedNode) -> None:
    for path in node.tag_paths():
        rows = node.ground_truth(path, NOW - 48 * HOUR, NOW - 24 * HOUR, HistoryOptions(mode="raw"))
        bad = [row for row in rows if row[2] < 192]
        if bad:
            assert all(row[1] is None for row in bad)
            assert all(row[1] is not None for row in rows if row[2] >= 192)
            return
    pytest.fail("no tag with bad quality in 24 h")


def test_no_sample_is_after_now_and_remote_tags_lag(node: SimulatedNode) -> None:
    details = {p: node.tags.entry(node.tree().by_path[p], details=True) for p in node.tag_paths()}
    lagged = [p for p, d in details.items() if d["remote"] is not None]
    assert lagged, "the tree should hold tags over a link"
    for path in node.tag_paths():
        rows = raw(node, path, NOW - HOUR, NOW + HOUR)
        lag = details[path]["remote"]["lag_ms"] if path in lagged else 0
        assert all(row[0] <= NOW - lag for row in rows)


def test_late_sample_becomes_visible_from_now_on() -> None:
    node = SimulatedNode(SimConfig(seed=5, tags=10))
    node.set_clock(NOW)
    path = next(p for p in node.tag_paths() if node.tag_type(p) == "number")
    stamp = NOW - 5 * HOUR + 17
    before = raw(node, path, stamp - 60_000, stamp + 60_000)
    node.add_late_sample(path, stamp, 1234.5)
    after = raw(node, path, stamp - 60_000, stamp + 60_000)
    assert [stamp, 1234.5, 192, 0] in after
    assert len(after) == len(before) + 1


@pytest.mark.parametrize("method", ["first", "last", "min", "max", "delta", "stddev"])
def test_aggregated_methods_match_the_raw_samples_of_each_bucket(
    node: SimulatedNode, method: str
) -> None:
    interval = 10 * 60_000
    options = HistoryOptions(mode="aggregated", method=method, interval_ms=interval)  # type: ignore[arg-type]
    for path in numeric_tags(node)[:6]:
        rows = node.ground_truth(path, START, END, options)
        assert [row[0] for row in rows] == list(range(START, END, interval))
        samples = raw(node, path, START, END + interval)
        for bucket, value, quality, _ in rows:
            good = [r[1] for r in samples if bucket <= r[0] < bucket + interval and r[2] >= 192]
            if not good:
                assert (value, quality) == (None, 0)
                continue
            mean = sum(good) / len(good)
            expected = {
                "first": good[0],
                "last": good[-1],
                "min": min(good),
                "max": max(good),
                "delta": good[-1] - good[0],
                "stddev": math.sqrt(sum((v - mean) ** 2 for v in good) / len(good)),
            }[method]
            assert quality == 192
            assert value == pytest.approx(expected, abs=1e-5)


def test_aggregated_avg_is_time_weighted_with_the_previous_value_held(node: SimulatedNode) -> None:
    interval = 15 * 60_000
    options = HistoryOptions(mode="aggregated", method="avg", interval_ms=interval)
    for path in numeric_tags(node)[:6]:
        rows = node.ground_truth(path, START, END, options)
        samples = raw(node, path, START - 24 * HOUR, END + interval)
        for bucket, value, _, _ in rows:
            upper = bucket + interval
            inside = [r for r in samples if bucket <= r[0] < upper]
            if not any(r[2] >= 192 for r in inside):
                assert value is None
                continue
            before = [r for r in samples if r[0] < bucket]
            held = before[-1] if before else None
            total = weighted = 0.0
            if held is not None and held[2] >= 192:
                total += inside[0][0] - bucket
                weighted += held[1] * (inside[0][0] - bucket)
            for row, following in zip(inside, [*inside[1:], [upper]], strict=True):
                if row[2] >= 192:
                    total += following[0] - row[0]
                    weighted += row[1] * (following[0] - row[0])
            assert value == pytest.approx(weighted / total, abs=1e-5)


def test_aggregated_bucket_starting_at_end_is_excluded_and_buckets_are_not_aligned(
    node: SimulatedNode,
) -> None:
    path = numeric_tags(node)[0]
    start = START + 7_777  # not on any grid: the node does not align, the engine does
    options = HistoryOptions(mode="aggregated", method="max", interval_ms=60_000)
    rows = node.ground_truth(path, start, start + 5 * 60_000, options)
    assert [row[0] for row in rows] == [start + n * 60_000 for n in range(5)]


def test_booleans_aggregate_as_zero_one_and_strings_only_first_and_last(
    node: SimulatedNode,
) -> None:
    big = SimulatedNode(SimConfig(seed=5, tags=100))
    big.set_clock(NOW)
    boolean = next(p for p in big.tag_paths() if big.tag_type(p) == "boolean")
    text = next(p for p in big.tag_paths() if big.tag_type(p) == "string")

    def agg(path: str, method: str) -> list[Any]:
        options = HistoryOptions(mode="aggregated", method=method, interval_ms=HOUR)  # type: ignore[arg-type]
        return [row[1] for row in big.ground_truth(path, START, END, options) if row[2] == 192]

    assert all(0.0 <= v <= 1.0 for v in agg(boolean, "avg"))
    assert all(isinstance(v, bool) for v in agg(boolean, "last"))
    assert all(isinstance(v, str) for v in agg(text, "first"))
    empty = HistoryOptions(mode="aggregated", method="max", interval_ms=HOUR)
    assert all(row[1] is None for row in big.ground_truth(text, START, END, empty))


def test_default_aggregation_method_is_the_tags_configured_one(node: SimulatedNode) -> None:
    path = numeric_tags(node)[0]
    default = HistoryOptions(mode="aggregated", interval_ms=HOUR)
    avg = HistoryOptions(mode="aggregated", method="avg", interval_ms=HOUR)
    assert node.ground_truth(path, START, END, default) == node.ground_truth(path, START, END, avg)


def reported_by_delta(rows: list[list[Any]], deadband: float) -> list[list[Any]]:
    """Independent walk: first event, then changes beyond the deadband or of quality."""
    out: list[list[Any]] = []
    for row in rows:
        if not out:
            out.append(row)
            continue
        last = out[-1]
        if row[2] != last[2] or abs(row[1] - last[1]) > deadband:
            out.append(row)
    return out


@pytest.mark.parametrize("deadband", [None, 0.0, 2.5, 20.0])
def test_delta_reports_changes_beyond_the_deadband(
    node: SimulatedNode, deadband: float | None
) -> None:
    for path in numeric_tags(node)[:5]:
        configured = node.tree().by_path[path].deadband
        options = HistoryOptions(mode="delta", deadband=deadband)
        rows = node.ground_truth(path, START, END, options)
        expected = reported_by_delta(raw(node, path), configured if deadband is None else deadband)
        assert rows == expected


def test_delta_with_a_larger_deadband_reports_fewer_events(node: SimulatedNode) -> None:
    path = numeric_tags(node)[0]
    counts = [
        len(node.ground_truth(path, START, END, HistoryOptions(mode="delta", deadband=d)))
        for d in (0.0, 1.0, 10.0, 1000.0)
    ]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] > counts[-1]


def test_filter_reports_the_event_before_and_after_each_change(node: SimulatedNode) -> None:
    """Computed like the wire (end inclusive), then cut to ts < end: a change exactly on
    `end` brings the event before it into [start, end)."""
    for path in numeric_tags(node)[:5]:
        samples = raw(node, path, START, END + 1)
        changes = reported_by_delta(samples, 3.0)
        index = {id(row): i for i, row in enumerate(samples)}
        wanted: set[int] = set()
        for row in changes:
            position = index[id(row)]
            wanted.update({position, position - 1} if position else {position})
        expected = [samples[i] for i in sorted(wanted) if samples[i][0] < END]
        assert (
            node.ground_truth(path, START, END, HistoryOptions(mode="filter", deadband=3.0))
            == expected
        )


def test_delta_depends_on_where_the_window_starts(node: SimulatedNode) -> None:
    """Documented: delta/filter results are computed from the window's first event."""
    path = numeric_tags(node)[0]
    options = HistoryOptions(mode="delta", deadband=5.0)
    whole = node.ground_truth(path, START, END, options)
    differs = 0
    for minutes in range(1, 40):
        later = START + minutes * 60_000 + 500
        tail = node.ground_truth(path, later, END, options)
        assert tail[0] == raw(node, path, later, END)[0]
        differs += [row for row in whole if row[0] >= later] != tail
    assert differs > 0


def test_remote_node_has_the_same_shape_but_other_values(node: SimulatedNode) -> None:
    remote = HistoryOptions(mode="raw", invalid_as_null=False, remote_node="sim-remote")
    path = node.tag_paths()[0]
    assert node.ground_truth(path, START, END, remote) != raw(node, path)
    assert len(node.ground_truth(path, START, END, remote)) > 0


def test_hostile_names_are_part_of_the_tree() -> None:
    node = SimulatedNode(SimConfig(seed=1, tags=20, hostile_names=True))
    paths = node.tag_paths()
    assert "/Hostile/'; DROP TABLE tag_history; --" in paths
    assert any(len(p) > 1000 for p in paths)
    assert any("\x01" in p for p in paths)
    assert not any("\x00" in p for p in paths)
    assert len(set(paths)) == len(paths) == 20


@pytest.mark.parametrize("limit", [1, 7, 500])
def test_capped_raw_of_a_long_range_is_the_first_samples_late_ones_included(limit: int) -> None:
    node = SimulatedNode(SimConfig(seed=5, tags=10, raw_cap=500))
    node.set_clock(NOW)
    start = NOW - 3 * 365 * 24 * HOUR
    for path in node.tag_paths():
        node.add_late_sample(path, start + 1_500, "late" if node.tag_type(path) == "string" else 1)
        spec = node.tree().by_path[path]
        capped = node.history_rows(
            node.tree(), spec, start, NOW, HistoryOptions(mode="raw", limit=limit), capped=True
        )
        truth = node.ground_truth(path, start, start + 24 * HOUR, HistoryOptions(mode="raw"))
        assert [list(row) for row in capped] == truth[:limit]
