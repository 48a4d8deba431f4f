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
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunRequest
from pipelines.core.units import run_flow
from pipelines.planning import align_down, plan_windows
from tests.fixtures import history_rows, load, truth_history_rows, write_config

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
