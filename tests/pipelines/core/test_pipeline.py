"""The whole pipeline, direct (no Prefect), simulator -> engine -> lake, DuckDB, PostgreSQL,
MariaDB.

Exactly once: a re-run, a different window size and a late sample inside the look-back
all leave each sample once in every sink, equal to the node's ground truth.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunFailed, RunRequest
from pipelines.core.units import run_flow
from sinks.base import FlowLocked
from tests.fixtures import canonical, keys_of, load, write_config

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    sim = SimulatedNode(SimConfig(seed=3, tags=24))
    sim.set_clock(int(NOW.timestamp() * 1000))
    return sim


@pytest.fixture(scope="module")
def server(node: SimulatedNode) -> Iterator[Any]:
    with run_server(node, http_port=0, https_port=None) as handle:
        yield handle


def raw_flow(tags: list[str], **extra: Any) -> dict[str, Any]:
    flow: dict[str, Any] = {
        "node": "n",
        "tags": {"paths": tags},
        "mode": "raw",
        "window": "30m",
        "batch": 5,
        "start": (NOW - timedelta(hours=3)).isoformat(),
        "settle": "0s",
    }
    flow.update(extra)
    return flow


def run(path: Path, flow: str, *, now: datetime = NOW, request: RunRequest | None = None) -> Any:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, flow, nodes=nodes, sinks=sinks, request=request, now=now)


def contents(path: Path, dataset: str, kind: str = "tag_history") -> dict[str, list[Any]]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: canonical(sinks.get(name).read(dataset, kind), kind)
            for name in config.flows[next(iter(config.flows))].sinks
        }


def truth_keys(node: SimulatedNode, tags: list[str], start: datetime, end: datetime) -> list[Any]:
    keys = []
    for tag in tags:
        rows = node.ground_truth(
            tag,
            int(start.timestamp() * 1000),
            int(end.timestamp() * 1000),
            HistoryOptions(mode="raw"),
        )
        seen: dict[int, int] = {}
        for row in rows:
            ts = int(row[0])
            seq = seen.get(ts, 0)
            seen[ts] = seq + 1
            keys.append(("n", tag, ts, seq))
    return sorted(keys)


def as_ms_keys(frame: Any) -> list[Any]:
    out = []
    for node_name, tag, ts, seq in keys_of(frame):
        out.append((node_name, tag, int(ts.timestamp() * 1000), int(seq)))
    return sorted(out)


@pytest.fixture(
    params=[
        "lake+duckdb",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ]
)
def sink_setup(request: pytest.FixtureRequest) -> tuple[str, str] | None:
    """The sinks of a flow: the lake and DuckDB, or a server warehouse (url, schema)."""
    if request.param == "postgres":
        pg_url = request.getfixturevalue("pg_url")
        schema = request.getfixturevalue("pg_schema")
        return (pg_url, schema)
    if request.param == "mariadb":
        return request.getfixturevalue("mariadb_url"), request.getfixturevalue("mariadb_schema")
    return None


def test_a_run_lands_the_nodes_rows_exactly_once_in_every_sink(
    tmp_path: Path, node: SimulatedNode, server: Any, sink_setup: tuple[str, str] | None
) -> None:
    tags = node.tag_paths()[:10]
    path = write_config(
        tmp_path, node={"url": server.http_url}, flows={"f": raw_flow(tags)}, pg=sink_setup
    )
    summary = run(path, "f")
    assert summary.rows > 0
    assert summary.chunks_done == summary.chunks_planned
    want = truth_keys(node, tags, NOW - timedelta(hours=3), NOW)
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.flows[next(iter(config.flows))].sinks:
            frame = sinks.get(name).read("f", "tag_history")
            assert as_ms_keys(frame) == want, name
            assert str(frame["ts"].dtype).startswith("timestamp[ms, tz=UTC]"), name
    assert summary.rows == len(want)


def test_run_twice_and_with_another_window_leaves_the_same_rows(
    tmp_path: Path, node: SimulatedNode, server: Any, sink_setup: tuple[str, str] | None
) -> None:
    tags = node.tag_paths()[:8]
    path = write_config(
        tmp_path, node={"url": server.http_url}, flows={"f": raw_flow(tags)}, pg=sink_setup
    )
    run(path, "f")
    first = contents(path, "f")
    again = run(path, "f", request=RunRequest(start=NOW - timedelta(hours=3), end=NOW))
    assert again.chunks_done == again.chunks_planned > 0, "an explicit range re-extracts"
    assert contents(path, "f") == first
    # The same flow with 7-minute windows: overlapping, differently cut scopes.
    path = write_config(
        tmp_path,
        node={"url": server.http_url},
        pg=sink_setup,
        flows={"f": raw_flow(tags, window="7m", batch=3)},
    )
    run(path, "f", request=RunRequest(start=NOW - timedelta(hours=3), end=NOW))
    assert contents(path, "f") == first


def test_joined_and_chunk_by_chunk_writes_replace_each_other_exactly(
    tmp_path: Path,
    node: SimulatedNode,
    server: Any,
    sink_setup: tuple[str, str] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tags = node.tag_paths()[:10]
    path = write_config(
        tmp_path, node={"url": server.http_url}, flows={"f": raw_flow(tags)}, pg=sink_setup
    )
    want = truth_keys(node, tags, NOW - timedelta(hours=3), NOW)
    summary = run(path, "f")
    # 6 windows x 2 batches of 5 tags, each a few hundred rows: one write per window.
    assert summary.chunks_done == summary.chunks_planned == 12
    config = load(path)
    sink_names = config.flows["f"].sinks
    with SinkSet(config, path.parent) as sinks:
        for name in sink_names:
            log = sinks.get(name).chunk_log("f")
            # Each write records its tags and the node they came from (pipelines/state.py).
            assert [record.members for record in log] == [10 + 1] * 6, name

    def one_by_one(fetched: Any, expected: Any) -> Any:
        return fetched

    everything = RunRequest(start=NOW - timedelta(hours=3), end=NOW)
    with monkeypatch.context() as patched:
        patched.setattr("pipelines.core.runner.coalesce", one_by_one)
        again = run(path, "f", request=everything)
    assert again.chunks_done == 12
    with SinkSet(config, path.parent) as sinks:
        for name in sink_names:
            log = sinks.get(name).chunk_log("f", limit=12)
            assert [record.members for record in log] == [5 + 1] * 12, name
    last_hour = RunRequest(start=NOW - timedelta(hours=1), end=NOW)
    assert run(path, "f", request=last_hour).chunks_done == 4
    with SinkSet(config, path.parent) as sinks:
        for name in sink_names:
            assert as_ms_keys(sinks.get(name).read("f", "tag_history")) == want, name
            newest = sinks.get(name).chunk_log("f", limit=2)
            assert [record.members for record in newest] == [10 + 1, 10 + 1], name


def test_incremental_runs_continue_and_skip_what_is_done(
    tmp_path: Path, node: SimulatedNode, server: Any
) -> None:
    tags = node.tag_paths()[:6]
    path = write_config(tmp_path, node={"url": server.http_url}, flows={"f": raw_flow(tags)})
    early = NOW - timedelta(hours=1)
    first = run(path, "f", now=early)
    assert first.watermark_after == early
    second = run(path, "f", now=NOW)
    assert second.watermark_before == early
    assert second.span.start == early
    assert second.watermark_after == NOW
    nothing = run(path, "f", now=NOW)
    assert nothing.chunks_done == 0
    assert nothing.rows == 0
    want = truth_keys(node, tags, NOW - timedelta(hours=3), NOW)
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.flows[next(iter(config.flows))].sinks:
            assert as_ms_keys(sinks.get(name).read("f", "tag_history")) == want


def test_a_late_sample_inside_the_lookback_arrives_once(tmp_path: Path, server: Any) -> None:
    sim = SimulatedNode(SimConfig(seed=5, tags=12))
    sim.set_clock(int(NOW.timestamp() * 1000))
    with run_server(sim, http_port=0, https_port=None) as handle:
        tag = next(t for t in sim.tag_paths() if sim.tag_type(t) == "number")
        flow = raw_flow([tag], lookback="20m", window="10m")
        path = write_config(tmp_path, node={"url": handle.http_url}, flows={"f": flow})
        run(path, "f")
        late_ts = int((NOW - timedelta(minutes=5)).timestamp() * 1000) + 123
        sim.add_late_sample(tag, late_ts, 4242.5)
        run(path, "f")
        run(path, "f")
        config = load(path)
        with SinkSet(config, path.parent) as sinks:
            for name in config.flows[next(iter(config.flows))].sinks:
                frame = sinks.get(name).read("f", "tag_history")
                ts_ms = [int(t.timestamp() * 1000) for t in frame["ts"]]
                assert ts_ms.count(late_ts) == 1, name
                assert len(set(zip(frame["tag"], ts_ms, frame["seq"], strict=True))) == len(frame)


def test_a_second_run_of_the_same_flow_is_refused(
    tmp_path: Path, node: SimulatedNode, server: Any
) -> None:
    path = write_config(
        tmp_path, node={"url": server.http_url}, flows={"f": raw_flow(node.tag_paths()[:2])}
    )
    config = load(path)
    with (
        SinkSet(config, path.parent) as holder,
        holder.get("lake").lock("f"),
        NodePool(config) as nodes,
        SinkSet(config, path.parent) as sinks,
        pytest.raises(RunFailed) as caught,
    ):
        run_flow(config, "f", nodes=nodes, sinks=sinks, now=NOW)
    assert isinstance(caught.value.__cause__, FlowLocked)
    assert "already running" in str(caught.value)


def test_aggregated_and_alarm_flows(tmp_path: Path, node: SimulatedNode, server: Any) -> None:
    tags = node.tag_paths()[:5]
    flows = {
        "avg": {
            "node": "n",
            "tags": {"paths": tags},
            "mode": "aggregated",
            "method": "avg",
            "interval": "15m",
            "start": (NOW - timedelta(hours=5)).isoformat(),
            "settle": "0s",
        },
        "alarms": {
            "node": "n",
            "kind": "alarm_history",
            "alarms": {"path": "/"},
            "window": "6h",
            "start": (NOW - timedelta(days=2)).isoformat(),
            "settle": "0s",
        },
    }
    path = write_config(tmp_path, node={"url": server.http_url}, flows=flows)
    summary = run(path, "avg")
    assert summary.rows == len(tags) * 5 * 4
    alarms = run(path, "alarms")
    assert alarms.rows > 0
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.flows[next(iter(config.flows))].sinks:
            frame = sinks.get(name).read("avg", "tag_history")
            minutes = {t.minute for t in frame["ts"]}
            assert minutes <= {0, 15, 30, 45}
            alarm_frame = sinks.get(name).read("alarms", "alarm_history")
            assert len(alarm_frame) == alarms.rows
            metadata = sinks.get(name).read("tag_metadata", "tag_metadata")
            assert set(tags) <= set(metadata["tag"])


def test_hostile_tag_paths_round_trip_exactly(
    tmp_path: Path, sink_setup: tuple[str, str] | None
) -> None:
    sim = SimulatedNode(SimConfig(seed=9, tags=10, hostile_names=True))
    sim.set_clock(int(NOW.timestamp() * 1000))
    hostile = [
        t
        for t in sim.tag_paths()
        if any(c in t for c in "'\"\\;.") or len(t) > 200 or not t.isascii()
    ]
    assert len(hostile) >= 4
    with run_server(sim, http_port=0, https_port=None) as handle:
        flow = raw_flow(
            hostile, start=(NOW - timedelta(minutes=30)).isoformat(), window="15m", batch=2
        )
        path = write_config(
            tmp_path, node={"url": handle.http_url}, flows={"f": flow}, pg=sink_setup
        )
        run(path, "f")
    start_ms = int((NOW - timedelta(minutes=30)).timestamp() * 1000)
    with_rows = {
        t
        for t in hostile
        if sim.ground_truth(t, start_ms, int(NOW.timestamp() * 1000), HistoryOptions(mode="raw"))
    }
    assert len(with_rows) >= 4
    before = {p.resolve() for p in tmp_path.rglob("*")}
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.flows[next(iter(config.flows))].sinks:
            frame = sinks.get(name).read("f", "tag_history")
            assert set(frame["tag"]) == with_rows, name
            metadata = sinks.get(name).read("tag_metadata", "tag_metadata")
            assert set(hostile) <= set(metadata["tag"]), name
    for file in before:
        assert str(file).startswith(str(tmp_path.resolve()))
        assert "drop table" not in file.name.lower()
