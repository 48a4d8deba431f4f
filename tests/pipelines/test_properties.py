"""Property: whatever the tag tree, range and node profile, the lake holds the node's truth.

Hypothesis draws tag trees (leaf names repeated across groups, names with spaces, commas,
dots, quotes, percent signs and non-ASCII), ranges (starts off the window grid, ends in
the future), a selection (named paths or a whole group), a mode (raw or delta) and a
composed simulator profile; the pipeline runs against that simulator over loopback into a
Parquet lake, which must hold exactly the ground truth up to `now - settle`.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.simulator.profiles import _EXCLUSIVE, BEHAVIOURS
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunFailed, RunRequest
from pipelines.core.units import run_flow
from pipelines.planning import align_down, plan_windows
from tests.fixtures import (
    alarm_rows,
    history_rows,
    in_windows,
    load,
    truth_alarm_rows,
    truth_history_rows,
    write_config,
)

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=20)
# Profiles a node may combine and still give exact data (lost tags cannot).
LOSSLESS = (
    "default",
    "repeated-names",
    "details-by-path",
    "raw-exclusive-start",
    "raw-cap",
    "raw-uncapped",
    "filter-path-only",
    "filter-paths-only",
    "rows-3",
    "flaky-tags",
    "flaky-tags-null",
    "garbled-timestamps",
    "node-1.21.5",
    "raw-cap-per-answer",
    "browse-always-recurses",
    "null-without-history",
    "clock-behind",
    "other-node",
    "no-views",
)
GROUP_NAMES = ("Line 1", "Line, 2", "Bâtiment.Ü", "q'uote", "50%2F", "東京")
LEAF_NAMES = ("Temp.PV", "Flow, Rate", "Débit", 'say "hi"', "温度", "x")


@st.composite
def tag_trees(draw: st.DrawFn) -> tuple[str, ...]:
    """2 to 8 distinct tag paths, one or two groups deep, leaf names shared by groups."""
    count = draw(st.integers(2, 8))
    paths: list[str] = []
    for _ in range(count):
        groups = draw(st.lists(st.sampled_from(GROUP_NAMES), min_size=1, max_size=2))
        leaf = draw(st.sampled_from(LEAF_NAMES))
        path = "/" + "/".join(groups) + "/" + leaf
        if path not in paths:
            paths.append(path)
    return tuple(paths) if len(paths) >= 2 else (*paths, "/Line 1/only")


def run(path: Path, request: RunRequest) -> Any:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, "f", nodes=nodes, sinks=sinks, request=request, now=NOW)


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("HISTORIAN_PROPERTY_EXAMPLES", "12")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    paths=tag_trees(),
    profiles=st.lists(st.sampled_from(LOSSLESS), min_size=1, max_size=2),
    start_minutes=st.integers(30, 150),
    end_minutes=st.integers(-20, 120),
    mode=st.sampled_from(["raw", "delta"]),
    whole_group=st.booleans(),
)
def test_the_lake_holds_the_truth_of_any_tree_range_and_profile(
    paths: tuple[str, ...],
    profiles: list[str],
    start_minutes: int,
    end_minutes: int,
    mode: str,
    whole_group: bool,
) -> None:
    profile = "+".join(dict.fromkeys(profiles))
    try:
        config = SimConfig(seed=7, tag_paths=paths, raw_cap=200, profile=profile)
    except ValueError:
        assume(False)  # behaviours that exclude each other (raw-cap with raw-uncapped, ...)
        raise
    node = SimulatedNode(config)
    node.set_clock(int(NOW.timestamp() * 1000))
    start = NOW - timedelta(minutes=start_minutes, seconds=13)  # off every grid
    end = NOW + timedelta(minutes=end_minutes)  # often in the future: cut at now - settle
    selection = {"group": "/", "regex": "."} if whole_group else {"paths": list(paths)}
    flow = {
        "node": "n",
        "tags": selection,
        "mode": mode,
        "window": "20m",
        "batch": 3,
        "start": start.isoformat(),
        "settle": "0s",
    }
    with (
        tempfile.TemporaryDirectory() as directory,
        run_server(node, http_port=0, https_port=None) as server,
    ):
        path = write_config(
            Path(directory), node={"url": server.http_url}, flows={"f": flow}, sinks=["lake"]
        )
        # A node clock behind ours bounds the run: it has stored nothing past its own now.
        last = min(end, NOW + timedelta(milliseconds=node.config.clock_offset_ms()))
        run(path, RunRequest(start=start, end=end))
        config_loaded = load(path)
        with SinkSet(config_loaded, path.parent) as sinks:
            got = history_rows(sinks.get("lake").read("f", "tag_history"))
    if mode == "raw":
        windows = [Window(start, last)]
    else:
        windows = plan_windows(Window(align_down(start, WINDOW), last), WINDOW)
    want = truth_history_rows(node, sorted(paths), windows, HistoryOptions(mode=mode))  # type: ignore[arg-type]
    assert len(set(want) - set(got)) == 0, "rows missing"
    assert len(set(got) - set(want)) == 0, "rows invented"
    assert len(got) == len(set(got)), "rows duplicated"


@st.composite
def composed_profiles(draw: st.DrawFn) -> str:
    """Up to four behaviours of any kind that may hold at once: a behaviour that excludes
    one drawn before it (`_EXCLUSIVE`) is left out, so no example is thrown away."""
    drawn = draw(st.lists(st.sampled_from(sorted(BEHAVIOURS)), max_size=4, unique=True))
    kept: list[str] = []
    for name in drawn:
        if not any(pair <= {*kept, name} for pair in _EXCLUSIVE):
            kept.append(name)
    return "+".join(kept) or "default"


ALARM_FLOW = {"kind": "alarm_history", "alarms": {"path": "/"}, "window": "2h"}


def node_on(profile: str) -> SimulatedNode:
    node = SimulatedNode(SimConfig(seed=13, tags=15, raw_cap=300, profile=profile))
    node.set_clock(int(NOW.timestamp() * 1000))
    return node


def held_rows(path: Path, flow: str) -> tuple[list[Any], dict[str, list[Window]]]:
    """What the lake holds of `flow`, and what it marks complete (missing records aside)."""
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        lake = sinks.get("lake")
        kind = "alarm_history" if flow == "alarms" else "tag_history"
        read = alarm_rows if flow == "alarms" else history_rows
        completed = {m: w for m, w in lake.progress(flow).completed.items() if w}
        return read(lake.read(flow, kind)), completed


def truth_of(node: SimulatedNode, flow: str, tags: list[str], span: Window) -> set[Any]:
    if flow == "alarms":
        return set(truth_alarm_rows(node, span))
    return set(truth_history_rows(node, tags, [span], HistoryOptions(mode="raw")))


def assert_same(rows: list[Any], want: set[Any], what: str) -> None:
    assert set(rows) == want, what
    assert len(rows) == len(want), f"{what}: rows duplicated"


def outcome(path: Path, flow: str, request: RunRequest) -> str | None:
    """None when the flow ran, else its one-line refusal."""
    try:
        run_named(path, flow, request)
    except RunFailed as exc:
        return str(exc)
    return None


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("HISTORIAN_PROPERTY_EXAMPLES", "10")),
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a shrink runs whole pipelines
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    profile=composed_profiles(),
    start_minutes=st.integers(20, 300),
    end_minutes=st.integers(-30, 60),
    whole_group=st.booleans(),
)
def test_any_composed_profile_ends_exact_or_cleanly_refused(
    profile: str, start_minutes: int, end_minutes: int, whole_group: bool
) -> None:
    """Raw (a group or named tags) and alarms on a node of any composed profile: exact, or
    one line with nothing complete that is not the node's, and then exact against a plain
    node on the same address."""
    node = node_on(profile)
    loses = "loses_tags" in node.config.behaviours
    lost = {p for p in node.tag_paths() if loses and node.tree().by_path[p].index % 7 == 3}
    tags = sorted(node.tag_paths()) if whole_group else sorted(node.tag_paths())[:6]
    kept = [t for t in tags if t not in lost]
    start = NOW - timedelta(minutes=start_minutes, seconds=13)
    asked = min(NOW + timedelta(minutes=end_minutes), NOW)
    # A node whose clock is behind ours has stored up to its own now: runs end there.
    span = Window(start, min(asked, NOW + timedelta(milliseconds=node.config.clock_offset_ms())))
    selection = {"group": "/", "regex": "."} if whole_group else {"paths": tags}
    common = {"node": "n", "start": start.isoformat(), "settle": "0s", "sinks": ["lake"]}
    flows: dict[str, dict[str, Any]] = {
        "raw": {**common, "tags": selection, "mode": "raw", "window": "30m", "batch": 4},
        "alarms": {**common, **ALARM_FLOW},
    }
    request = RunRequest(start=start, end=asked)
    with tempfile.TemporaryDirectory() as directory:
        with run_server(node, http_port=0, https_port=None) as server:
            port = int(server.http_url.rsplit(":", 1)[1])
            path = write_config(Path(directory), node={"url": server.http_url}, flows=flows)
            refused = {flow: outcome(path, flow, request) for flow in flows}
        for flow, line in refused.items():
            rows, completed = held_rows(path, flow)
            if line is None:
                assert_same(rows, truth_of(node, flow, kept, span), f"{profile}: {flow}")
                continue
            assert "\n" not in line
            assert set(rows) <= truth_of(node, flow, kept, span), (
                f"{profile}: {flow}: not the node's"
            )
            if flow == "alarms":  # a window without events proves itself before the refusal
                claimed = in_windows(truth_of(node, flow, kept, span), completed)
                assert claimed <= set(rows), f"{profile}: alarm window complete, events lost"
            assert lost.isdisjoint(completed), f"{profile}: a lost tag complete"
        again = [flow for flow, line in refused.items() if line is not None]
        with run_server(node_on("default"), http_port=port, https_port=None) as plain:
            for flow in again:
                run_named(path, flow, RunRequest(start=start, end=asked, backfill=True))
                rows, _ = held_rows(path, flow)
                assert_same(rows, truth_of(plain.node, flow, tags, span), f"plain: {flow}")


def run_named(path: Path, flow: str, request: RunRequest) -> Any:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, flow, nodes=nodes, sinks=sinks, request=request, now=NOW)
