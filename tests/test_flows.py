"""Prefect flows end to end on the ephemeral server: same rows as the direct path, schedules."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipelines.prefect_env import configure_prefect

configure_prefect()

from connectors.simulator import SimConfig, SimulatedNode, run_server  # noqa: E402
from pipelines.destinations import SinkSet  # noqa: E402
from pipelines.flows import build_deployments, run_prefect  # noqa: E402
from pipelines.nodes import NodePool  # noqa: E402
from pipelines.runner import RunRequest, run_flow  # noqa: E402
from tests.pipeline_helpers import canonical, load, write_config  # noqa: E402

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
START = NOW - timedelta(hours=1)


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    sim = SimulatedNode(SimConfig(seed=17, tags=20))
    sim.set_clock(int(NOW.timestamp() * 1000))
    return sim


@pytest.fixture(scope="module")
def server(node: SimulatedNode) -> Iterator[Any]:
    with run_server(node, http_port=0, https_port=None) as handle:
        yield handle


def flows(**extra: Any) -> dict[str, Any]:
    return {
        "f": {
            "node": "n",
            "tags": {"browse": "/", "include": ["."]},
            "mode": "raw",
            "window": "15m",
            "batch": 6,
            "start": START.isoformat(),
            "settle": "0s",
            "schedule": {"cron": "5 * * * *", "timezone": "Europe/Madrid"},
            **extra,
        },
        "alarms": {
            "node": "n",
            "kind": "alarm_history",
            "window": "6h",
            "start": (NOW - timedelta(days=1)).isoformat(),
            "settle": "0s",
            "schedule": {"interval": "1h"},
        },
        "once": {"node": "n", "tags": {"paths": ["/Plant A/Line 1/Temp. 000"]}, "start": "-1h"},
    }


def contents(path: Path, flow: str, kind: str) -> dict[str, list[Any]]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: canonical(sinks.get(name).read(flow, kind), kind)
            for name in config.flows[flow].sinks
        }


def test_a_prefect_run_writes_what_the_direct_run_writes(
    tmp_path: Path, server: Any, pg_url: str, pg_schema: str
) -> None:
    request = RunRequest(start=START, end=NOW)
    (tmp_path / "direct").mkdir()
    direct = write_config(
        tmp_path / "direct", node={"url": server.http_url}, flows=flows(), sinks=["lake", "duck"]
    )
    config = load(direct)
    with NodePool(config) as nodes, SinkSet(config, direct.parent) as sinks:
        run_flow(config, "f", nodes=nodes, sinks=sinks, request=request)
    expected = contents(direct, "f", "tag_history")["lake"]
    assert expected

    (tmp_path / "prefect").mkdir()
    via_prefect = write_config(
        tmp_path / "prefect",
        node={"url": server.http_url},
        flows=flows(),
        pg=(pg_url, pg_schema),
        sinks=["lake", "duck", "pg"],
    )
    seen: list[int] = []
    summary = run_prefect(
        via_prefect, "f", request, on_chunk=lambda o, s: seen.append(o.rows_fetched)
    )
    assert summary.chunks_done == summary.chunks_planned == len(seen)
    assert summary.rows == len(expected) == sum(seen)
    for name, rows in contents(via_prefect, "f", "tag_history").items():
        assert rows == expected, name

    # Incremental: a second run over the same state fetches nothing new and duplicates nothing.
    again = run_prefect(via_prefect, "f", RunRequest(end=NOW))
    assert again.rows == 0
    for name, rows in contents(via_prefect, "f", "tag_history").items():
        assert rows == expected, name

    alarms = run_prefect(via_prefect, "alarms", RunRequest(start=NOW - timedelta(days=1), end=NOW))
    assert alarms.rows > 0
    assert {len(rows) for rows in contents(via_prefect, "alarms", "alarm_history").values()} == {
        alarms.rows
    }


def test_a_transient_failure_is_retried_by_the_task(
    tmp_path: Path, server: Any, node: SimulatedNode
) -> None:
    path = write_config(
        tmp_path, node={"url": server.http_url, "retries": 0}, flows=flows(), sinks=["lake"]
    )
    node.faults.fail_next("503", count=1, operations=["tag.historyMany"])
    try:
        summary = run_prefect(path, "f", RunRequest(start=START, end=START + timedelta(minutes=15)))
    finally:
        injected = node.faults.injected["503"]
        node.faults.clear()
    assert injected >= 1
    assert summary.chunks_done == summary.chunks_planned


def test_deployments_carry_the_schedules_of_flows_yaml(tmp_path: Path, server: Any) -> None:
    path = write_config(tmp_path, node={"url": server.http_url}, flows=flows(), sinks=["lake"])
    deployments = {d.name: d for d in build_deployments(path)}
    assert set(deployments) == {"f", "alarms"}, "flows without a schedule are not deployed"
    cron = deployments["f"].schedules[0].schedule
    assert cron.cron == "5 * * * *"
    assert cron.timezone == "Europe/Madrid"
    interval = deployments["alarms"].schedules[0].schedule
    assert interval.interval == timedelta(hours=1)
    assert deployments["f"].parameters == {"flow_name": "f", "config_path": str(path.resolve())}
    assert deployments["alarms"].flow_name == "alarm-history"


@pytest.mark.slow
def test_the_dask_task_runner_on_a_local_cluster(
    tmp_path: Path, server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip(
        "prefect_dask", reason="prefect-dask is not installed (pip install -e '.[dask]')"
    )
    request = RunRequest(start=START, end=START + timedelta(minutes=30))
    (tmp_path / "threads").mkdir()
    threads = write_config(
        tmp_path / "threads", node={"url": server.http_url}, flows=flows(), sinks=["lake"]
    )
    run_prefect(threads, "f", request)
    (tmp_path / "dask").mkdir()
    dask = write_config(
        tmp_path / "dask",
        node={"url": server.http_url, "max_connections": 2},
        flows=flows(),
        sinks=["lake", "duck"],
    )
    monkeypatch.setenv("HISTORIAN_TASK_RUNNER", "dask")
    summary = run_prefect(dask, "f", request)
    assert summary.chunks_done == summary.chunks_planned > 0
    expected = contents(threads, "f", "tag_history")["lake"]
    for name, rows in contents(dask, "f", "tag_history").items():
        assert rows == expected, name
