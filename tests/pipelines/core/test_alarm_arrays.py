"""Alarm events as arrays: read in the order the node is configured with or the answer
proves, never in a guessed one (issue 27, situation 4).

The whole pipeline runs against the simulator over loopback (profiles `alarm-arrays-*`)
into a Parquet lake and DuckDB, compared with the simulator's ground truth.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.options import AlarmFilter
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.simulator.alarms import ARRAY_ORDERS
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.models import ConfigError, parse_config
from pipelines.config.nodes import NodePool, node_settings
from pipelines.core.runner import RunFailed, RunSummary
from pipelines.core.units import run_flow
from tests.fixtures import alarm_rows, load, truth_alarm_rows, write_config

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
START = NOW - timedelta(days=1)
FLOW = {
    "node": "n",
    "kind": "alarm_history",
    "alarms": {"path": "/"},
    "window": "6h",
    "start": START.isoformat(),
    "settle": "0s",
}


@contextmanager
def served(profile: str) -> Iterator[tuple[SimulatedNode, str]]:
    node = SimulatedNode(SimConfig(seed=31, tags=30, profile=profile))
    node.set_clock(int(NOW.timestamp() * 1000))
    with run_server(node, http_port=0, https_port=None) as server:
        yield node, server.http_url


def run(path: Path) -> RunSummary:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, "f", nodes=nodes, sinks=sinks, now=NOW)


def held(path: Path) -> dict[str, list[Any]]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: alarm_rows(sinks.get(name).read("f", "alarm_history")) for name in config.sinks
        }


def assert_truth(path: Path, node: SimulatedNode) -> None:
    want = truth_alarm_rows(node, Window(START, NOW), AlarmFilter())
    assert want
    assert {(r[2], r[3]) for r in want} >= {(0, 4), (3, 1)}, "statuses and priorities vary"
    for sink, rows in held(path).items():
        assert rows == want, sink


@pytest.mark.parametrize("profile", ["alarm-arrays", "alarm-arrays-swapped"])
def test_alarm_arrays_whose_answer_proves_the_order_are_stored_exactly(
    tmp_path: Path, profile: str
) -> None:
    with served(profile) as (node, url):
        path = write_config(tmp_path, node={"url": url}, flows={"f": dict(FLOW)})
        run(path)
    assert_truth(path, node)


def test_alarm_arrays_in_an_unproven_order_stop_in_one_line_and_nothing_is_complete(
    tmp_path: Path,
) -> None:
    with served("alarm-arrays-online") as (_, url):
        path = write_config(tmp_path, node={"url": url}, flows={"f": dict(FLOW)})
        with pytest.raises(RunFailed) as caught:
            run(path)
    message = str(caught.value)
    assert "\n" not in message
    assert "alarm events are arrays" in message
    assert "set nodes.n.alarm_fields to the node's order" in message
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.sinks:
            assert not any(sinks.get(name).progress("f").completed.values()), name
    assert all(rows == [] for rows in held(path).values())


def test_alarm_arrays_in_the_configured_order_are_stored_exactly(tmp_path: Path) -> None:
    order = list(ARRAY_ORDERS["alarm_arrays_online"])
    with served("alarm-arrays-online") as (node, url):
        path = write_config(
            tmp_path, node={"url": url, "alarm_fields": order}, flows={"f": dict(FLOW)}
        )
        run(path)
    assert_truth(path, node)


def test_a_configured_order_the_node_contradicts_stops_in_one_line(tmp_path: Path) -> None:
    order = list(ARRAY_ORDERS["alarm_arrays"])  # status before priority; the node swaps them
    with served("alarm-arrays-swapped") as (_, url):
        path = write_config(
            tmp_path, node={"url": url, "alarm_fields": order}, flows={"f": dict(FLOW)}
        )
        with pytest.raises(RunFailed, match=r"is not this node's order") as caught:
            run(path)
    assert "\n" not in str(caught.value)


NODE = {"url": "http://node.test:3003"}


def document(fields: list[str]) -> dict[str, Any]:
    return {
        "nodes": {"n": {**NODE, "alarm_fields": fields}},
        "sinks": {"lake": {"type": "parquet", "url": "lake"}},
        "flows": {"f": {**FLOW, "sinks": ["lake"]}},
    }


def test_alarm_fields_reach_the_client_settings() -> None:
    config = parse_config(document(["ts", "path", "priority", "status"]), env={})
    settings = node_settings("n", config.nodes["n"])
    assert settings.alarm_fields == ("ts", "path", "priority", "status")


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        (["ts", "path", "status"], "the order must place priority"),
        (["ts", "path", "status", "status", "priority"], "status named more than once"),
        (["ts", "", "path", "status", "priority"], "every entry must be a field name"),
    ],
)
def test_a_wrong_alarm_fields_list_is_one_line_naming_the_key(fields: list[str], said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(document(fields), source="flows.yaml", env={})
    message = str(caught.value)
    assert "\n" not in message
    assert "nodes.n.alarm_fields" in message
    assert said in message
