"""A backfill on a node's worst day: faults at 20% of requests, restarts, a lost warehouse.

The outcome is always one of two: output identical, row for row, to a fault-free run;
or a clear error with state intact, after which the next run completes it exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.destinations import SinkSet
from pipelines.nodes import NodePool
from pipelines.runner import RunFailed, RunRequest, run_flow
from tests.fixtures import canonical, load, write_config

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
START = NOW - timedelta(hours=2)


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    sim = SimulatedNode(SimConfig(seed=13, tags=20, raw_cap=700))
    sim.set_clock(int(NOW.timestamp() * 1000))
    return sim


@pytest.fixture(scope="module")
def server(node: SimulatedNode) -> Iterator[Any]:
    with run_server(node, http_port=0, https_port=None) as handle:
        yield handle


def flow(**extra: Any) -> dict[str, Any]:
    spec = {
        "node": "n",
        "tags": {"browse": "/", "include": ["."]},
        "mode": "raw",
        "window": "20m",
        "batch": 7,
        "start": START.isoformat(),
        "settle": "0s",
    }
    spec.update(extra)
    return spec


def node_config(url: str, **extra: Any) -> dict[str, Any]:
    return {"url": url, "retries": 8, "read_timeout": "1s", "max_connections": 2, **extra}


def run(path: Path, **kwargs: Any) -> Any:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, "f", nodes=nodes, sinks=sinks, now=NOW, **kwargs)


def contents(path: Path) -> dict[str, list[Any]]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: canonical(sinks.get(name).read("f", "tag_history"))
            for name in config.flows["f"].sinks
        }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, server: Any) -> list[Any]:
    work = tmp_path_factory.mktemp("reference")
    path = write_config(
        work, node=node_config(server.http_url), flows={"f": flow()}, sinks=["lake"]
    )
    run(path)
    return contents(path)["lake"]


@pytest.mark.parametrize(
    "kinds",
    [
        ["500", "502", "503", "504"],
        ["429"],
        ["reset"],
        ["truncate", "nonjson"],
        ["slow"],
    ],
    ids=["5xx", "429", "reset", "truncated+nonjson", "slow"],
)
def test_faults_at_20_percent_change_nothing(
    tmp_path: Path, node: SimulatedNode, server: Any, reference: list[Any], kinds: list[str]
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url), flows={"f": flow()})
    node.faults.configure(rate=0.2, kinds=kinds, seed=len(kinds), slow_s=1.5)
    try:
        summary = run(path)
    finally:
        injected = sum(node.faults.injected[k] for k in kinds)
        node.faults.clear()
    assert injected > 0, "faults were injected"
    assert summary.chunks_done == summary.chunks_planned
    for name, rows in contents(path).items():
        assert rows == reference, name


def test_spent_retries_stop_cleanly_and_the_next_run_completes(
    tmp_path: Path, node: SimulatedNode, server: Any, reference: list[Any]
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url, retries=1), flows={"f": flow()})
    node.faults.configure(rate=0.6, kinds=["503"], seed=5, operations=["tag.historyMany"])
    try:
        with pytest.raises(RunFailed) as caught:
            run(path)
    finally:
        node.faults.clear()
    message = str(caught.value)
    assert "tag.historyMany" in message
    assert "503" in message
    assert caught.value.summary.chunks_done < caught.value.summary.chunks_planned
    run(path)
    for name, rows in contents(path).items():
        assert rows == reference, name


def test_the_node_restarting_mid_run(
    tmp_path: Path, server: Any, reference: list[Any], node: SimulatedNode
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url), flows={"f": flow()})
    config = load(path)
    restarted = []

    def restart_once(outcome: Any, summary: Any) -> None:
        if not restarted:
            restarted.append(True)
            server.restart(down_s=0.3)  # the process dies and comes back on the same port

    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        run_flow(config, "f", nodes=nodes, sinks=sinks, now=NOW, on_chunk=restart_once)
    assert restarted
    for name, rows in contents(path).items():
        assert rows == reference, name


def test_restart_service_answers_503_then_the_run_goes_on(
    tmp_path: Path, server: Any, reference: list[Any], node: SimulatedNode
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url), flows={"f": flow()})
    config = load(path)
    done = []

    def restart_service(outcome: Any, summary: Any) -> None:
        if not done:
            done.append(True)
            nodes.get("n").client.system_restart_service()

    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        run_flow(config, "f", nodes=nodes, sinks=sinks, now=NOW, on_chunk=restart_service)
    for name, rows in contents(path).items():
        assert rows == reference, name


@pytest.mark.postgres
def test_postgres_connection_lost_mid_run(
    tmp_path: Path, server: Any, reference: list[Any], pg_url: str, pg_schema: str
) -> None:
    import sqlalchemy as sa

    path = write_config(
        tmp_path,
        node=node_config(server.http_url),
        flows={"f": flow()},
        pg=(pg_url, pg_schema),
        sinks=["pg"],
    )
    engine = sa.create_engine(pg_url)
    killed = []

    def kill_backends(outcome: Any, summary: Any) -> None:
        if not killed:
            with engine.begin() as conn:
                rows = conn.execute(
                    sa.text(
                        "select pg_terminate_backend(pid) from pg_stat_activity "
                        "where datname = current_database() and pid <> pg_backend_pid() "
                        "and application_name = :mine"
                    ),
                    # Only this test's sink: its connections name its own schema.
                    {"mine": f"historian {pg_schema}"},
                ).fetchall()
            killed.append(len(rows))

    failure: RunFailed | None = None
    try:
        run(path, on_chunk=kill_backends)
    except RunFailed as exc:
        failure = exc
    if failure is not None:
        assert "sink" in str(failure).lower()
        run(path)  # the next run completes from intact state
    engine.dispose()
    assert killed
    assert killed[0] >= 1
    assert contents(path)["pg"] == reference


def test_an_explicit_range_rerun_after_faults_is_still_exact(
    tmp_path: Path, node: SimulatedNode, server: Any, reference: list[Any]
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url), flows={"f": flow()})
    run(path)
    node.faults.configure(rate=0.2, kinds=["reset", "503", "truncate"], seed=77)
    try:
        run(path, request=RunRequest(start=START, end=NOW))
    finally:
        node.faults.clear()
    for name, rows in contents(path).items():
        assert rows == reference, name
