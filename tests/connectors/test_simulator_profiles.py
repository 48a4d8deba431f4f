"""Simulator profiles: each behaviour shows on the wire, and only where it is switched on."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode
from connectors.simulator.profiles import BEHAVIOURS, PROFILES, behaviours_of
from connectors.simulator.tags import GARBLED_MS

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
NOW_MS = int(NOW.timestamp() * 1000)
HOUR_MS = 3_600_000


def node_of(profile: str, **config: Any) -> SimulatedNode:
    node = SimulatedNode(SimConfig(seed=5, tags=config.pop("tags", 24), profile=profile, **config))
    node.set_clock(NOW_MS)
    return node


def busy_path(node: SimulatedNode) -> str:
    """A tag with samples in the last hour (some tags are in a gap there)."""
    raw = HistoryOptions(mode="raw")
    return next(
        p for p in node.tag_paths() if len(node.ground_truth(p, NOW_MS - HOUR_MS, NOW_MS, raw)) > 10
    )


def get(node: SimulatedNode, resource: str, cmd: str, **params: Any) -> Any:
    answer = node.handle("GET", resource, cmd, {k: str(v) for k, v in params.items()}, None)
    assert answer.status == 200, answer.body
    return orjson.loads(answer.body) if answer.body else None


def many(node: SimulatedNode, paths: list[str], start: int, end: int, **options: Any) -> Any:
    params = {"paths": orjson.dumps(paths).decode(), "start": start, "end": end}
    params.update({f"options.{k}": v for k, v in options.items()})
    return get(node, "tag", "historyMany", **params)


def test_profiles_compose_and_unknown_names_are_refused() -> None:
    assert behaviours_of("default") == frozenset()
    assert behaviours_of("repeated-names+raw-cap") == {"repeated_names", "raw_cap_small"}
    assert behaviours_of(["node-1.21.5", "rows_3"]) >= {"version_1_21_5", "rows_3"}
    with pytest.raises(ValueError, match="unknown simulator profile 'nope'"):
        behaviours_of("default+nope")
    with pytest.raises(ValueError, match="exclude each other"):
        behaviours_of("rows-2+rows-3")
    assert all(b in BEHAVIOURS for behaviours in PROFILES.values() for b in behaviours)


def test_repeated_names_repeat_leaf_names_across_groups() -> None:
    plain = node_of("default").tag_paths()
    repeated = node_of("repeated-names").tag_paths()
    leaf = lambda path: path.rsplit("/", 1)[1]  # noqa: E731
    assert len({leaf(p) for p in plain}) == len(plain)
    assert len({leaf(p) for p in repeated}) < len(repeated) / 3
    assert len(set(repeated)) == len(repeated), "paths stay unique"


def test_details_keyed_by_name_keep_one_of_two_tags_sharing_a_name() -> None:
    node = node_of("repeated-names")
    answer = get(node, "tag", "details", **{"path": "/Plant A/", "options.recurrent": "true"})
    under = [p for p in node.tag_paths() if p.startswith("/Plant A/")]
    assert len(answer["tags"]) < len(under)
    by_path = get(
        node_of("details-by-path"),
        "tag",
        "details",
        **{"path": "/Plant A/", "options.recurrent": "true"},
    )
    assert sorted(by_path["tags"]) == sorted(under)
    assert all(entry["fullPath"] == key for key, entry in by_path["tags"].items())


@pytest.mark.parametrize(
    ("profile", "version"), [("default", "1.21.13"), ("node-1.21.12", "1.21.12")]
)
def test_system_status_reports_the_profiles_version(profile: str, version: str) -> None:
    assert get(node_of(profile), "system", "status")["n3"]["versions"] == [version]


def test_verbose_versions_spell_the_runtime_beside_the_node() -> None:
    versions = get(node_of("node-1.21.5"), "system", "status")["n3"]["versions"]
    assert any("Node.js" in v for v in versions)
    assert any("1.21.5" in v for v in versions)


def alarm_priorities(node: SimulatedNode, **filters: Any) -> set[int]:
    params = {"path": "/", "start": NOW_MS - 24 * HOUR_MS, "end": NOW_MS}
    params.update({f"options.filter.{k}": v for k, v in filters.items()})
    return {event["priority"] for event in get(node, "alarm", "history", **params)["data"]}


def test_an_older_node_ignores_min_and_max_priority_but_reads_priority() -> None:
    assert alarm_priorities(node_of("default"), minPriority=2, maxPriority=3) == {2, 3}
    old = node_of("node-1.21.12")
    assert alarm_priorities(old, minPriority=2, maxPriority=3) == {1, 2, 3, 4}
    assert alarm_priorities(old, priority=3) == {3, 4}


def test_a_node_before_1_21_10_answers_the_default_method_for_stddev() -> None:
    path = busy_path(node_of("default"))
    start, end = NOW_MS - HOUR_MS, NOW_MS
    asked = {"mode": "aggregated", "interval": 900_000, "method": "stddev"}
    default = {"mode": "aggregated", "interval": 900_000}
    old = node_of("node-1.21.5")
    assert many(old, [path], start, end, **asked) != many(
        node_of("default"), [path], start, end, **asked
    )
    assert (
        many(old, [path], start, end, **asked)[path]["data"]
        == many(old, [path], start, end, **default)[path]["data"]
    )


def test_an_exclusive_raw_start_leaves_out_the_sample_on_start() -> None:
    node, exclusive = node_of("default"), node_of("raw-exclusive-start")
    path = busy_path(node)
    first = node.ground_truth(path, NOW_MS - HOUR_MS, NOW_MS, HistoryOptions(mode="raw"))[0][0]
    inclusive_rows = many(node, [path], first, first + 60_000, mode="raw")[path]["data"]
    exclusive_rows = many(exclusive, [path], first, first + 60_000, mode="raw")[path]["data"]
    assert inclusive_rows[0][0] == first
    assert exclusive_rows[0][0] > first


@pytest.mark.parametrize(
    ("profile", "limit", "rows"),
    [
        ("raw-cap", None, 250),
        ("raw-cap", 5000, 250),
        ("raw-cap", 100, 100),
        ("raw-uncapped", None, None),
        ("raw-uncapped", 300, 300),
    ],
)
def test_raw_caps_with_and_without_limit(profile: str, limit: int | None, rows: int | None) -> None:
    node = node_of(profile, raw_cap=400)
    fast = next(p for p in node.tag_paths() if node.tree().by_path[p].period_ms == 1000)
    options = {"mode": "raw"} | ({"limit": limit} if limit else {})
    data = many(node, [fast], NOW_MS - 6 * HOUR_MS, NOW_MS, **options)[fast]["data"]
    truth = node.ground_truth(fast, NOW_MS - 6 * HOUR_MS, NOW_MS + 1, HistoryOptions(mode="raw"))
    assert len(data) == (rows if rows is not None else len(truth))


@pytest.mark.parametrize(
    ("profile", "honoured"), [("filter-path-only", "path"), ("filter-paths-only", "paths")]
)
def test_history_filter_honouring_only_one_name(profile: str, honoured: str) -> None:
    node = node_of(profile)
    ignored = "paths" if honoured == "path" else "path"
    params = {
        "start": NOW_MS - 60_000,
        "end": NOW_MS,
        "options.mode": "raw",
        "options.recurrent": "true",
    }
    assert get(node, "tag", "historyFilter", **params, **{honoured: '["/Plant A/"]'})
    refused = node.handle("GET", "tag", "historyFilter", {**params, ignored: '["/Plant A/"]'}, None)
    assert refused.status == 400


@pytest.mark.parametrize(("profile", "width"), [("default", 4), ("rows-3", 3), ("rows-2", 2)])
def test_history_rows_have_the_profiles_width_on_the_wire_and_in_the_truth(
    profile: str, width: int
) -> None:
    node = node_of(profile)
    path = busy_path(node)
    data = many(node, [path], NOW_MS - HOUR_MS, NOW_MS, mode="raw")[path]["data"]
    truth = node.ground_truth(path, NOW_MS - HOUR_MS, NOW_MS, HistoryOptions(mode="raw"))
    assert {len(row) for row in data} == {width}
    assert {len(row) for row in truth} == {width}


def test_epoch_seconds_are_read_and_answered_for_alarms() -> None:
    node = node_of("epoch-seconds")
    start_s, end_s = (NOW_MS - 24 * HOUR_MS) // 1000, NOW_MS // 1000
    answer = get(node, "alarm", "history", path="/", start=start_s, end=end_s)
    assert answer["data"], "epoch seconds read as seconds: a day of events"
    assert all(start_s <= event["ts"] <= end_s for event in answer["data"])
    truth = node.alarm_ground_truth(NOW_MS - 24 * HOUR_MS, NOW_MS)
    assert [e["ts"] // 1000 for e in truth] == [e["ts"] for e in answer["data"]]


@pytest.mark.parametrize(
    ("profile", "shape"),
    [("flaky-tags", "absent"), ("flaky-tags-null", "null"), ("flaky-tags-renamed", "name")],
)
def test_flaky_tags_are_left_out_the_first_time_only(profile: str, shape: str) -> None:
    node = node_of(profile)
    paths = node.tag_paths()
    first = many(node, paths, NOW_MS - 60_000, NOW_MS, mode="raw")
    again = many(node, paths, NOW_MS - 60_000, NOW_MS, mode="raw")
    left_out = [p for p in paths if not isinstance((first.get(p) or {}).get("data"), list)]
    assert 0 < len(left_out) < len(paths)
    assert sorted(again) == sorted(paths)
    if shape == "null":
        assert all(first[p]["data"] is None for p in left_out)
    elif shape == "name":
        assert all(p.rsplit("/", 1)[1] in first for p in left_out)
    else:
        assert all(p not in first for p in left_out)


def test_lost_tags_are_never_answered_but_are_in_details() -> None:
    node = node_of("lost-tags")
    paths = node.tag_paths()
    lost = [p for p in paths if node.tree().by_path[p].index % 7 == 3]
    for _ in range(2):
        answer = many(node, paths, NOW_MS - 60_000, NOW_MS, mode="raw")
        assert sorted(set(paths) - set(answer)) == sorted(lost)
    details = get(node, "tag", "details", **{"path": "/", "options.recurrent": "true"})
    assert {e["fullPath"] for e in details["tags"].values()} >= set(lost)


def test_garbled_stamps_are_added_outside_every_query() -> None:
    node = node_of("garbled-timestamps")
    paths = node.tag_paths()
    answer = many(node, paths, NOW_MS - HOUR_MS, NOW_MS, mode="raw")
    outside = {
        path: [row[0] for row in entry["data"] if not NOW_MS - HOUR_MS <= row[0] <= NOW_MS]
        for path, entry in answer.items()
    }
    affected = {p for p, stamps in outside.items() if stamps}
    assert affected == {p for p in paths if node.tree().by_path[p].index % 5 == 2}
    assert all(stamp in GARBLED_MS for stamps in outside.values() for stamp in stamps)
    assert all(
        row[0] != GARBLED_MS[i]
        for p in affected
        for row in node.ground_truth(p, NOW_MS - HOUR_MS, NOW_MS, HistoryOptions(mode="raw"))
        for i in range(3)
    ), "the ground truth holds only samples"


def test_custom_tag_paths_are_served() -> None:
    paths = ("/G 1/x", "/G 2/x", "/G 2/sub, y/x")
    node = SimulatedNode(SimConfig(seed=1, tag_paths=paths))
    assert node.tag_paths() == list(paths)
    with pytest.raises(ValueError, match="distinct"):
        SimConfig(tag_paths=("/a", "/a"))
