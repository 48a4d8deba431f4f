"""One flow on a fleet of nodes, end to end on real simulators over loopback.

Three simulated nodes with different seeds serve the same tag paths (a plant's template
copied to three sites), so a sink that replaced a scope by tag alone would lose another
node's rows. Every sink must hold exactly each node's ground truth, keyed by the node's
configured name; state and locks are per (flow, node); a node that is down fails its
own part only, and the next run completes it.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from connectors.options import AlarmFilter, HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.simulator.tagtree import tag_paths
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunFailed, RunRequest, RunSummary
from pipelines.core.units import run_flow
from pipelines.state import flow_watermark
from tests.fixtures import alarm_rows, history_rows, load, truth_alarm_rows, truth_history_rows

HISTORIAN = str(Path(sys.executable).with_name("historian"))
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
START = NOW - timedelta(hours=2)
SEEDS = {"plant_a": 11, "plant_b": 12, "plant_c": 13}
PATHS = tag_paths(18)
GROUP = "/Plant A/"
# Every node serves the same paths (False: each under a group of its own, to tell a
# fleet failure from a sink that replaces by tag alone while debugging).
SAME_PATHS = True


def node_paths(name: str) -> list[str]:
    if SAME_PATHS:
        return list(PATHS)
    return [path.replace(GROUP, f"{GROUP}{name}/", 1) for path in PATHS]


def simulator(name: str, clock: datetime | None = NOW) -> SimulatedNode:
    node = SimulatedNode(
        SimConfig(seed=SEEDS[name], tags=len(PATHS), tag_paths=tuple(node_paths(name)))
    )
    if clock is not None:
        node.set_clock(int(clock.timestamp() * 1000))
    return node


@pytest.fixture
def h20a_pg(pg_url: str) -> Iterator[tuple[str, str]]:
    """A schema of our own in the real PostgreSQL, dropped afterwards."""
    import sqlalchemy as sa

    schema = f"h20a_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(pg_url)
    try:
        yield pg_url, schema
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f'drop schema if exists "{schema}" cascade'))
        engine.dispose()


def fleet_config(
    tmp_path: Path,
    urls: dict[str, str],
    *,
    node: Any = "plant_*",
    pg: tuple[str, str] | None = None,
    duck: bool = True,
    start: datetime = START,
) -> Path:
    """flows.yaml: the nodes (with `node_defaults`), a lake, DuckDB and/or PostgreSQL,
    and flow `f` on `node`."""
    sinks: dict[str, Any] = {"lake": {"type": "parquet", "url": "lake"}}
    if duck:
        sinks["duck"] = {"type": "sql", "url": "duckdb:///warehouse.duckdb"}
    if pg is not None:
        sinks["pg"] = {"type": "sql", "url": pg[0], "schema": pg[1]}
    document = {
        "node_defaults": {"max_connections": 2, "retries": 0, "connect_timeout": "2s"},
        "nodes": {name: {"url": url} for name, url in urls.items()},
        "sinks": sinks,
        "flows": {
            "f": {
                "node": node,
                "tags": {"group": GROUP, "regex": ".", "recurrent": True},
                "mode": "raw",
                "window": "30m",
                "batch": 4,
                "start": start.isoformat(),
                "settle": "0s",
                "sinks": list(sinks),
            },
            "alarms": {
                "node": node,
                "kind": "alarm_history",
                "alarms": {"path": "/", "min_priority": 2},
                "window": "6h",
                "start": (start - timedelta(hours=22)).isoformat(),
                "settle": "0s",
                "sinks": list(sinks),
            },
        },
    }
    path = tmp_path / "flows.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True, sort_keys=False), "utf-8")
    return path


def run(path: Path, request: RunRequest | None = None, flow: str = "f") -> RunSummary:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, flow, nodes=nodes, sinks=sinks, request=request, now=NOW)


def rows_by_node(frame: pd.DataFrame) -> dict[str, list[Any]]:
    """A sink's rows per node (the `node` column), as `history_rows` shows them."""
    if frame.empty:
        return {}
    return {
        str(node): history_rows(part.reset_index(drop=True))
        for node, part in frame.groupby(frame["node"].astype(str), sort=True)
    }


def truth(nodes: dict[str, SimulatedNode], span: Window) -> dict[str, list[Any]]:
    """Each node's ground truth in `span`, keyed by its configured name."""
    return {
        name: truth_history_rows(
            node, [p for p in node_paths(name) if p.startswith(GROUP)], [span], HistoryOptions()
        )
        for name, node in nodes.items()
    }


def assert_sinks_hold(path: Path, want: dict[str, list[Any]]) -> None:
    config = load(path)
    assert all(want.values()), "every node's truth has rows"
    with SinkSet(config, path.parent) as sinks:
        for name in config.sinks:
            got = rows_by_node(sinks.get(name).read("f", "tag_history"))
            assert sorted(got) == sorted(want), f"{name}: nodes"
            for node, rows in want.items():
                assert len(got[node]) == len(set(got[node])), f"{name}/{node}: duplicates"
                assert got[node] == rows, f"{name}/{node}: rows differ from the node's truth"


def watermarks(path: Path, sink: str = "lake") -> dict[str, datetime | None]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        found = {}
        for node, key in config.flow_units("f"):
            progress = sinks.get(sink).progress(key)
            members = [p for p in node_paths(node) if p.startswith(GROUP)]
            found[key] = flow_watermark(progress, members, START)
        return found


@pytest.fixture
def served() -> Iterator[tuple[dict[str, SimulatedNode], dict[str, str]]]:
    nodes = {name: simulator(name) for name in SEEDS}
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(run_server(node, http_port=0, https_port=None)).http_url
            for name, node in nodes.items()
        }
        yield nodes, urls


def test_a_flow_on_a_node_pattern_fills_lake_duckdb_and_postgres_with_every_nodes_truth(
    tmp_path: Path,
    served: tuple[dict[str, SimulatedNode], dict[str, str]],
    h20a_pg: tuple[str, str],
) -> None:
    nodes, urls = served
    path = fleet_config(tmp_path, urls, pg=h20a_pg)
    summary = run(path)
    assert [unit.key for unit in summary.units] == ["f@plant_a", "f@plant_b", "f@plant_c"]
    assert all(unit.error is None and unit.chunks_done for unit in summary.units)
    assert summary.rows == sum(unit.rows for unit in summary.units) > 0
    assert summary.watermark_after == NOW
    assert_sinks_hold(path, truth(nodes, Window(START, NOW)))
    assert set(watermarks(path).values()) == {NOW}
    assert set(watermarks(path, "pg").values()) == {NOW}
    alarms = run(path, flow="alarms")
    assert [unit.rows > 0 for unit in alarms.units] == [True] * 3
    span = Window(START - timedelta(hours=22), NOW)
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.sinks:
            frame = sinks.get(name).read("alarms", "alarm_history")
            for node_name, node in nodes.items():
                got = alarm_rows(frame[frame["node"].astype(str) == node_name])
                want = truth_alarm_rows(node, span, AlarmFilter(min_priority=2))
                assert want, node_name
                assert got == want, f"{name}/{node_name}: alarms differ from the node's truth"
    again = run(path)  # incremental: every unit is up to date
    assert again.rows == 0
    assert again.chunks_planned == 0
    assert [unit.node for unit in again.units] == ["plant_a", "plant_b", "plant_c"]


def test_a_node_that_is_down_fails_alone_and_the_next_run_completes_it(
    tmp_path: Path, served: tuple[dict[str, SimulatedNode], dict[str, str]]
) -> None:
    nodes, urls = served
    down = dict(urls)
    with run_server(simulator("plant_b"), http_port=0, https_port=None) as gone:
        down["plant_b"] = gone.http_url  # a port nothing listens on once it is closed
    path = fleet_config(tmp_path, down, node=["plant_a", "plant_b", "plant_c"])
    with pytest.raises(RunFailed) as caught:
        run(path)
    failed = caught.value
    assert failed.nodes == ("plant_b",)
    assert str(failed).startswith("1 of 3 nodes failed: node plant_b: ")
    units = {unit.node: unit for unit in failed.summary.units}
    assert units["plant_b"].error
    assert not units["plant_b"].chunks_done
    assert units["plant_a"].error is None
    assert units["plant_c"].error is None
    marks = watermarks(path)
    assert marks == {"f@plant_a": NOW, "f@plant_b": None, "f@plant_c": NOW}
    partial = {name: rows for name, rows in truth(nodes, Window(START, NOW)).items()}
    assert_sinks_hold(path, {n: r for n, r in partial.items() if n != "plant_b"})

    path = fleet_config(tmp_path, urls, node=["plant_a", "plant_b", "plant_c"])
    again = run(path)
    by_node = {unit.node: unit for unit in again.units}
    assert by_node["plant_b"].chunks_done == by_node["plant_b"].chunks_planned > 0
    assert by_node["plant_a"].chunks_planned == by_node["plant_c"].chunks_planned == 0
    assert_sinks_hold(path, partial)


def test_run_one_node_then_reset_one_node_only(
    tmp_path: Path, served: tuple[dict[str, SimulatedNode], dict[str, str]]
) -> None:
    nodes, urls = served
    path = fleet_config(tmp_path, urls, node="plant_[ab]", duck=False)
    only_b = run(path, RunRequest(nodes=("plant_b",)))
    assert [unit.key for unit in only_b.units] == ["f@plant_b"]
    assert watermarks(path) == {"f@plant_a": None, "f@plant_b": NOW}
    run(path)
    assert set(watermarks(path).values()) == {NOW}
    reset = cli(tmp_path, "state", "reset", "f", "--node", "plant_a", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert "reset flow 'f' on node plant_a:" in reset.stdout
    assert watermarks(path) == {"f@plant_a": None, "f@plant_b": NOW}
    state = cli(tmp_path, "state", "--flow", "f")
    assert state.returncode == 0, state.stderr
    assert "f@plant_a" in state.stdout
    assert "f@plant_b" in state.stdout
    wrong = cli(tmp_path, "state", "reset", "f", "--node", "plant_c", "--yes")
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines() == [
        "error: --node: 'plant_c' is not a node of flow 'f' (its nodes: plant_a, plant_b)"
    ]
    want = truth(
        {name: node for name, node in nodes.items() if name != "plant_c"}, Window(START, NOW)
    )
    assert_sinks_hold(path, want)


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HISTORIAN, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.slow
def test_two_processes_on_different_nodes_of_one_flow_run_at_once_and_both_complete(
    tmp_path: Path, h20a_pg: tuple[str, str]
) -> None:
    # Real time here: each process plans against its own clock; the range is explicit.
    end = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    start = end - timedelta(hours=1)
    nodes = {name: simulator(name, clock=None) for name in ("plant_a", "plant_b")}
    with ExitStack() as stack:
        urls = {
            name: stack.enter_context(run_server(node, http_port=0, https_port=None)).http_url
            for name, node in nodes.items()
        }
        # The lake and PostgreSQL: one DuckDB file takes one writing process at a time.
        path = fleet_config(tmp_path, urls, node="plant_*", pg=h20a_pg, duck=False, start=start)
        procs = [
            subprocess.Popen(
                [HISTORIAN, *backfill_args(start, end, node)],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for node in ("plant_a", "plant_b")
        ]
        results = [proc.communicate(timeout=300) for proc in procs]
        assert [proc.returncode for proc in procs] == [0, 0], results
        config = load(path)
        # plant_a's lock held here: a run of plant_a stops at it, plant_b's does not.
        with SinkSet(config, path.parent) as sinks, ExitStack() as held:
            for name in config.sinks:
                held.enter_context(sinks.get(name).lock("f@plant_a"))
            blocked = cli(tmp_path, *backfill_args(start, end, "plant_a"))
            free = cli(tmp_path, *backfill_args(start, end, "plant_b"))
        assert blocked.returncode == 1
        assert "f@plant_a" in blocked.stderr, blocked.stderr
        assert free.returncode == 0, free.stderr
    assert_sinks_hold(path, truth(nodes, Window(start, end)))


def backfill_args(start: datetime, end: datetime, node: str) -> list[str]:
    return [
        "backfill",
        "f",
        "--start",
        start.isoformat(),
        "--end",
        end.isoformat(),
        "--node",
        node,
        "--direct",
    ]


@pytest.mark.slow
def test_a_slow_node_holds_back_none_of_the_others_chunks(
    tmp_path: Path, served: tuple[dict[str, SimulatedNode], dict[str, str]]
) -> None:
    nodes, urls = served
    slow_s = 20.0  # far longer than the other nodes' whole run, however busy the machine
    nodes["plant_b"].faults.configure(rate=0.0, kinds=[], slow_s=slow_s)
    nodes["plant_b"].faults.fail_next("slow", 1, operations=["tag.historyFilter"])
    path = fleet_config(tmp_path, urls, duck=False)
    committed: list[str] = []
    config = load(path)
    with NodePool(config) as pool, SinkSet(config, path.parent) as sinks:
        summary = run_flow(
            config,
            "f",
            nodes=pool,
            sinks=sinks,
            now=NOW,
            on_chunk=lambda outcome, unit: committed.extend([unit.node] * outcome.chunks),
        )
    assert nodes["plant_b"].faults.injected["slow"] == 1
    assert sorted(committed) == sorted(
        unit.node for unit in summary.units for _ in range(unit.chunks_done)
    )
    # plant_b's slow chunk is the last to commit: every chunk of the others went before it.
    others = [i for i, node in enumerate(committed) if node != "plant_b"]
    assert committed[-1] == "plant_b"
    assert others
    assert_sinks_hold(path, truth(nodes, Window(START, NOW)))
