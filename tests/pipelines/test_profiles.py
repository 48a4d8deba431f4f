"""The profile matrix: the same flows over every simulator profile, sinks equal to the truth.

For every profile (connectors/simulator/profiles.py) the simulator is served over real
loopback HTTP and five flows run through the whole pipeline into a Parquet lake (and
DuckDB for some, `WITH_DUCKDB`): raw over a group (historyFilter), raw with a `limit`
over named tags, 15-minute averages over a browse selection, delta from an off-grid
start, and alarms with a priority range. Each sink must hold exactly the node's ground truth: 0 rows missing, 0 extra, 0
duplicated. A node that loses tags for good (`lost-tags`) cannot give exact data: there
a flow naming such a tag must stop with one line, and a group flow must hold exactly the
other tags and report the lost ones missing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.options import AlarmFilter, HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.simulator.profiles import PROFILES
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunFailed, RunSummary
from pipelines.core.units import run_flow
from pipelines.planning import align_down, plan_windows
from tests.fixtures import (
    alarm_rows,
    history_rows,
    load,
    truth_alarm_rows,
    truth_history_rows,
    write_config,
)

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
START = NOW - timedelta(hours=2)
DELTA_START = START + timedelta(minutes=7)  # off the 30-minute grid
ALARMS = AlarmFilter(min_priority=2, max_priority=3)


def flows(raw_limited: list[str], delta: list[str]) -> dict[str, dict[str, Any]]:
    common = {"node": "n", "start": START.isoformat(), "settle": "0s"}
    return {
        "raw": {
            **common,
            "tags": {"group": "/Plant A/", "regex": ".", "recurrent": True},
            "mode": "raw",
            "window": "30m",
        },
        "raw_limited": {
            **common,
            "tags": {"paths": raw_limited},
            "mode": "raw",
            "limit": 150,
            "window": "1h",
            "batch": 2,
        },
        "avg": {
            **common,
            "tags": {"browse": "/", "include": ["^/Usine"]},
            "mode": "aggregated",
            "method": "avg",
            "interval": "15m",
            "window": "1h",
        },
        "delta": {
            **common,
            "tags": {"paths": delta},
            "mode": "delta",
            "window": "30m",
            "start": DELTA_START.isoformat(),
        },
        "alarms": {
            **common,
            "kind": "alarm_history",
            "alarms": {"path": "/", "min_priority": 2, "max_priority": 3},
            "window": "6h",
            "start": (NOW - timedelta(days=1)).isoformat(),
        },
    }


def run(path: Path, name: str) -> RunSummary:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, name, nodes=nodes, sinks=sinks, now=NOW)


def sink_rows(path: Path, flow: str, kind: str = "tag_history") -> dict[str, list[Any]]:
    config = load(path)
    read = alarm_rows if kind == "alarm_history" else history_rows
    with SinkSet(config, path.parent) as sinks:
        return {name: read(sinks.get(name).read(flow, kind)) for name in config.flows[flow].sinks}


def assert_exact(got: dict[str, list[Any]], want: list[Any], what: str) -> None:
    assert want, f"{what}: the truth is not empty"
    for sink, rows in got.items():
        missing = len(set(want) - set(rows))
        extra = len(set(rows) - set(want))
        duplicated = len(rows) - len(set(rows))
        assert (missing, extra, duplicated) == (0, 0, 0), f"{what} in {sink}"


# A profile changes what the node answers, which reaches every sink as the same frames:
# every profile is held to the truth in the lake, and these (the shapes of rows a sink is
# given: quality or not, rows out of range dropped, tags missing, alarms filtered here)
# in DuckDB as well, so that every sink meets them and the matrix is not profiles x sinks.
WITH_DUCKDB = {"default", "rows-2", "rows-3", "garbled-timestamps", "lost-tags", "node-1.21.5"}


@pytest.mark.slow
@pytest.mark.parametrize("profile", list(PROFILES))
def test_every_flow_extracts_exactly_the_truth_on_every_profile(
    tmp_path: Path, profile: str
) -> None:
    node = SimulatedNode(SimConfig(seed=31, tags=30, raw_cap=600, profile=profile))
    node.set_clock(int(NOW.timestamp() * 1000))
    paths = node.tag_paths()
    lost = {
        p
        for p in paths
        if "loses_tags" in node.config.behaviours and node.tree().by_path[p].index % 7 == 3
    }
    kept = [p for p in paths if p not in lost]
    named = [p for p in paths if p.startswith("/Plant B/")][:4]
    members = {
        "raw": sorted(p for p in paths if p.startswith("/Plant A/")),
        "raw_limited": named,
        "avg": sorted(p for p in paths if p.startswith("/Usine")),
        "delta": [p for p in paths if p.startswith("/Plant A/Line 2/")][:3],
    }
    assert lost.isdisjoint(members["delta"])
    # A node whose clock is behind ours has stored up to its own now: runs end there.
    end = NOW + timedelta(milliseconds=node.config.clock_offset_ms())
    span = Window(START, end)
    grid = plan_windows(
        Window(align_down(DELTA_START, timedelta(minutes=30)), end), timedelta(minutes=30)
    )
    buckets = Window(START, align_down(end, timedelta(minutes=15)))
    options = {
        "raw": ([span], HistoryOptions(mode="raw")),
        "raw_limited": ([span], HistoryOptions(mode="raw")),
        "avg": ([buckets], HistoryOptions(mode="aggregated", method="avg", interval_ms=900_000)),
        "delta": (grid, HistoryOptions(mode="delta")),
    }
    with run_server(node, http_port=0, https_port=None) as server:
        path = write_config(
            tmp_path,
            node={"url": server.http_url},
            flows=flows(named, members["delta"]),
            sinks=["lake", "duck"] if profile in WITH_DUCKDB else ["lake"],
        )
        for name, tags in members.items():
            if lost & set(tags) and name in ("raw_limited", "delta"):
                with pytest.raises(RunFailed, match="left out of the node's answers"):
                    run(path, name)
                continue
            summary = run(path, name)
            assert sorted(summary.missing) == sorted(lost & set(tags)), name
            windows, how = options[name]
            want = truth_history_rows(node, [t for t in tags if t in kept], windows, how)
            assert_exact(sink_rows(path, name), want, f"{profile}: {name}")
        run(path, "alarms")
    want = truth_alarm_rows(node, Window(NOW - timedelta(days=1), end), ALARMS)
    assert_exact(sink_rows(path, "alarms", "alarm_history"), want, f"{profile}: alarms")
