"""The profile matrix: the same flows over every simulator profile, sinks equal to the truth.

For every profile (connectors/simulator/profiles.py, read when the tests are collected, so
a profile added there is in the matrix) the simulator is served over real loopback HTTP
and five flows run through the whole pipeline into a Parquet lake: raw over a group
(historyFilter), raw with a `limit` over named tags, 15-minute averages over a browse
selection, delta from an off-grid start, and alarms with a priority range. Raw, averages
and alarms go to the real PostgreSQL as well (`TO_PG`), and some profiles to DuckDB
(`WITH_DUCKDB`). Each sink must hold exactly the node's ground truth: 0 rows missing,
0 extra, 0 duplicated.

A node that cannot give exact data (tags lost for good, alarm arrays whose order nothing
proves) must instead stop the flow with one line; `MAY_REFUSE` names those flows and the
line. A refused flow leaves nothing marked complete that is not exact, and the same
backfill against a plain node on the same address afterwards is exact. A refusal not in
`MAY_REFUSE` fails the matrix with the flow's line: a new profile that cannot be exact
says so there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.options import AlarmFilter, HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.simulator.profiles import PROFILES, SUBSCRIPTION_BEHAVIOURS
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunFailed, RunRequest, RunSummary
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
START = NOW - timedelta(hours=2)
DELTA_START = START + timedelta(minutes=7)  # off the 30-minute grid
ALARM_START = NOW - timedelta(days=1)
ALARMS = AlarmFilter(min_priority=2, max_priority=3)
FLOWS = ("raw", "raw_limited", "avg", "delta", "alarms")
STARTS = {"delta": DELTA_START, "alarms": ALARM_START}
# Flows that also go to PostgreSQL: one of each kind of rows (raw samples, aggregates,
# alarm events) on every profile, so that the real server meets every reading.
TO_PG = ("raw", "avg", "alarms")
# A profile changes what the node answers, which reaches every sink as the same frames:
# these (the shapes of rows a sink is given: quality or not, rows out of range dropped,
# tags missing, alarms filtered here) go to DuckDB as well.
WITH_DUCKDB = {"default", "rows-2", "rows-3", "garbled-timestamps", "lost-tags", "node-1.21.5"}
# Where no exact answer is possible: the flows a profile must stop, with their line.
LEFT_OUT = "left out of the node's answers"
MAY_REFUSE: dict[str, dict[str, str]] = {
    "lost-tags": {"raw_limited": LEFT_OUT},
    "alarm-arrays-online": {"alarms": "alarm events are arrays"},
}


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
            "start": ALARM_START.isoformat(),
        },
    }


@dataclass(frozen=True)
class Members:
    """The tags of each tag flow on a node, and those it loses for good."""

    of: dict[str, list[str]]
    lost: frozenset[str]

    @classmethod
    def on(cls, node: SimulatedNode) -> Members:
        paths = node.tag_paths()
        loses = "loses_tags" in node.config.behaviours
        lost = frozenset(p for p in paths if loses and node.tree().by_path[p].index % 7 == 3)
        of = {
            "raw": sorted(p for p in paths if p.startswith("/Plant A/")),
            "raw_limited": [p for p in paths if p.startswith("/Plant B/")][:4],
            "avg": sorted(p for p in paths if p.startswith("/Usine")),
            "delta": [p for p in paths if p.startswith("/Plant A/Line 2/")][:3],
        }
        return cls(of, lost)


def node_of(profile: str) -> SimulatedNode:
    node = SimulatedNode(SimConfig(seed=31, tags=30, raw_cap=600, profile=profile))
    node.set_clock(int(NOW.timestamp() * 1000))
    return node


def truth(node: SimulatedNode, name: str, tags: list[str]) -> list[Any]:
    """The node's rows of one flow over its whole span."""
    # A node whose clock is behind ours has stored up to its own now: runs end there.
    end = NOW + timedelta(milliseconds=node.config.clock_offset_ms())
    if name == "alarms":
        return truth_alarm_rows(node, Window(ALARM_START, end), ALARMS)
    grid = plan_windows(
        Window(align_down(DELTA_START, timedelta(minutes=30)), end), timedelta(minutes=30)
    )
    options = {
        "raw": ([Window(START, end)], HistoryOptions(mode="raw")),
        "raw_limited": ([Window(START, end)], HistoryOptions(mode="raw")),
        "avg": (
            [Window(START, align_down(end, timedelta(minutes=15)))],
            HistoryOptions(mode="aggregated", method="avg", interval_ms=900_000),
        ),
        "delta": (grid, HistoryOptions(mode="delta")),
    }
    windows, how = options[name]
    return truth_history_rows(node, tags, windows, how)


def run(path: Path, name: str, request: RunRequest | None = None) -> RunSummary:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, name, nodes=nodes, sinks=sinks, request=request, now=NOW)


def kind_of(name: str) -> str:
    return "alarm_history" if name == "alarms" else "tag_history"


def sink_rows(path: Path, flow: str) -> dict[str, list[Any]]:
    config = load(path)
    read = alarm_rows if flow == "alarms" else history_rows
    with SinkSet(config, path.parent) as sinks:
        return {
            name: read(sinks.get(name).read(flow, kind_of(flow)))
            for name in config.flows[flow].sinks
        }


def completed(path: Path, flow: str) -> dict[str, dict[str, list[Window]]]:
    """Per sink, the windows each member of `flow` is marked complete for."""
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: {m: w for m, w in sinks.get(name).progress(flow).completed.items() if w}
            for name in config.flows[flow].sinks
        }


def assert_exact(got: dict[str, list[Any]], want: list[Any], what: str) -> None:
    assert want, f"{what}: the truth is not empty"
    for sink, rows in got.items():
        missing = len(set(want) - set(rows))
        extra = len(set(rows) - set(want))
        duplicated = len(rows) - len(set(rows))
        assert (missing, extra, duplicated) == (0, 0, 0), f"{what} in {sink}"


def sinks_of(profile: str, name: str) -> list[str]:
    duck = ["duck"] if profile in WITH_DUCKDB else []
    return ["lake", *duck, *(["pg"] if name in TO_PG else [])]


@contextmanager
def config_on(
    node: SimulatedNode,
    tmp_path: Path,
    members: Members,
    pg: tuple[str, str],
    profile: str,
    port: int = 0,
) -> Iterator[tuple[Path, int]]:
    """The matrix's flows.yaml (the sinks of `profile`) with `node` served on `port` (0:
    any), and that port."""
    with run_server(node, http_port=port, https_port=None) as server:
        documents = flows(members.of["raw_limited"], members.of["delta"])
        for name, flow in documents.items():
            flow["sinks"] = sinks_of(profile, name)
        path = write_config(tmp_path, node={"url": server.http_url}, flows=documents, pg=pg)
        yield path, int(server.http_url.rsplit(":", 1)[1])


def check_flow(path: Path, node: SimulatedNode, members: Members, name: str) -> None:
    """One flow run on `node`: exact (a group flow: exact for the tags kept, the lost ones
    reported missing); RunFailed propagates."""
    summary = run(path, name)
    tags = members.of.get(name, [])
    if name != "alarms":
        assert sorted(summary.missing) == sorted(members.lost & set(tags)), name
    kept = [t for t in tags if t not in members.lost]
    assert_exact(sink_rows(path, name), truth(node, name, kept), f"{node.config.profile}: {name}")


# Profiles of subscription behaviours only answer history as `default` does: their live
# events are held to history in tests/connectors/test_simulator_subscriptions.py.
HISTORY_PROFILES = [
    name for name, of in PROFILES.items() if not of <= SUBSCRIPTION_BEHAVIOURS or not of
]


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("profile", HISTORY_PROFILES)
def test_every_flow_is_exact_or_refused_on_every_profile(
    tmp_path: Path, profile: str, pg_url: str, pg_schema: str
) -> None:
    node = node_of(profile)
    members = Members.on(node)
    assert members.lost.isdisjoint(members.of["delta"])
    refused: dict[str, str] = {}
    with config_on(node, tmp_path, members, (pg_url, pg_schema), profile) as (path, port):
        for name in FLOWS:
            try:
                check_flow(path, node, members, name)
            except RunFailed as exc:
                refused[name] = str(exc)
    expected = MAY_REFUSE.get(profile, {})
    unexpected = {name: line for name, line in refused.items() if name not in expected}
    assert not unexpected, f"{profile}: refused where an exact answer is possible"
    assert sorted(refused) == sorted(expected), f"{profile}: exact where it cannot be"
    for name, line in refused.items():
        assert "\n" not in line
        assert expected[name] in line, name
        assert_nothing_complete_but_the_truth(path, node, members, name)
    if refused:
        pg = (pg_url, pg_schema)
        assert_plain_backfill_is_exact(tmp_path, members, pg, profile, port, refused)


def assert_nothing_complete_but_the_truth(
    path: Path, node: SimulatedNode, members: Members, name: str
) -> None:
    """A refused flow: no lost tag marked complete, and an alarm window complete only
    with every event the node has in it (a window without events proves itself before the
    refusal); what a sink holds is all the node's truth (the chunks of other tags written
    before the refusal)."""
    tags = [t for t in members.of.get(name, []) if t not in members.lost]
    want = set(truth(node, name, tags))
    held = sink_rows(path, name)
    for sink, done in completed(path, name).items():
        if name == "alarms":
            assert in_windows(want, done) <= set(held[sink]), f"{sink}: complete, events lost"
        else:
            assert members.lost.isdisjoint(done), f"{sink}: a lost tag complete"
    for sink, rows in held.items():
        assert set(rows) <= want, f"{sink}: rows that are not the node's"


def assert_plain_backfill_is_exact(
    tmp_path: Path,
    members: Members,
    pg: tuple[str, str],
    profile: str,
    port: int,
    refused: dict[str, str],
) -> None:
    """The refused flows backfilled against a plain node at the same address: exact."""
    plain = node_of("default")
    whole = Members(members.of, frozenset())
    with config_on(plain, tmp_path, whole, pg, profile, port) as (path, _):
        for name in refused:
            start = STARTS.get(name, START)
            run(path, name, RunRequest(start=start, backfill=True))
            tags = whole.of.get(name, [])
            assert_exact(sink_rows(path, name), truth(plain, name, tags), f"plain: {name}")
