"""A run's memory is bounded by what it holds: fetching never runs ahead of the writer by
more than the node's connections (`engine.stream_bounded`), and no fetched chunk outlives
its write (`engine.HELD` counts them until they are collected)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunRequest
from pipelines.core.units import run_flow
from tests.fixtures import HeldWriter, load, write_config

END = datetime(2026, 11, 20, tzinfo=UTC)
CONNECTIONS = 2
WINDOWS = 8


def test_a_stopped_writer_holds_fetching_to_the_nodes_connections(tmp_path: Path) -> None:
    node = SimulatedNode(SimConfig(seed=5, tags=10, period_ms=60_000))
    node.set_clock(int(END.timestamp() * 1000))
    with run_server(node, http_port=0, https_port=None) as handle:
        flow = {
            "node": "n",
            "tags": {"browse": "/", "include": ["."]},  # 10 tags: one batch, one chunk a window
            "mode": "raw",
            "window": "1h",
            "start": (END - timedelta(hours=WINDOWS)).isoformat(),
            "settle": "0s",
        }
        node_settings = {"url": handle.http_url, "max_connections": CONNECTIONS}
        path = write_config(tmp_path, node=node_settings, flows={"f": flow}, sinks=["lake"])
        config = load(path)
        # Held while the writer stops after its n-th write: that chunk (let go when the
        # writer asks for the next) and the fetches that ran ahead, one per connection
        # while enough chunks were left, then fewer.
        writer = HeldWriter(until=lambda n: 1 + min(CONNECTIONS, WINDOWS - n))
        with NodePool(config) as nodes, SinkSet(config, tmp_path) as sinks:
            summary = run_flow(
                config,
                "f",
                nodes=nodes,
                sinks=sinks,
                request=RunRequest(start=END - timedelta(hours=WINDOWS), end=END),
                on_chunk=writer,
                now=END,
            )
    assert summary.chunks_done == WINDOWS
    assert summary.rows > 0
    # Reached after every write, and never more at any moment of the run.
    assert writer.seen == [1 + min(CONNECTIONS, WINDOWS - n) for n in range(1, WINDOWS + 1)]
    assert writer.peak == CONNECTIONS + 1
    assert node.peak_in_flight <= CONNECTIONS
