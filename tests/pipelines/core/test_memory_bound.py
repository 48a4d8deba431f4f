"""A run's memory is bounded by what it holds: fetching never runs ahead of the writer by
more than the node's connections (`engine.stream_bounded`), and no fetched chunk outlives
its write (`engine.HELD` counts them until they are collected)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunRequest
from pipelines.core.units import run_flow
from sinks.base import Reads
from tests.fixtures import HeldWriter, history_rows, load, truth_history_rows, write_config

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


@pytest.mark.parametrize("sink", ["lake", "pg", "duck", "delta", "ice"])
def test_an_answer_over_the_cap_is_written_in_pieces_no_larger_than_one_answer(
    tmp_path: Path, sink: str, request: pytest.FixtureRequest
) -> None:
    """One tag's window answered in more than `max_answer_mb` (1 MB here) is asked again
    in halves of the window; each half is written on its own (a write of its own scope),
    so the window's rows are never held and copied whole (issue: one 65 MB answer took a
    run to 1.47 GB). The lake and the warehouse end with the node's rows exactly, and
    progress with the chunk's whole window: a second run has nothing to fetch."""
    node = SimulatedNode(
        SimConfig(seed=3, tags=10, period_ms=10, raw_cap=10**8, profile="raw-uncapped")
    )
    node.set_clock(int(END.timestamp() * 1000))
    tag = node.tag_paths()[0]
    window = Window(END - timedelta(minutes=10), END)
    pg = None
    if sink == "pg":
        pg = (request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))
    with run_server(node, http_port=0, https_port=None) as handle:
        flow = {
            "node": "n",
            "tags": {"paths": [tag]},
            "mode": "raw",
            "window": "10m",
            "start": window.start.isoformat(),
            "settle": "0s",
        }
        settings = {"url": handle.http_url, "max_answer_mb": 1}
        path = write_config(
            tmp_path,
            node=settings,
            flows={"f": flow},
            pg=pg,
            sinks=[sink],
        )
        config = load(path)
        run = RunRequest(end=window.end)  # from the flow's start: complete windows skipped
        with NodePool(config) as nodes, SinkSet(config, tmp_path) as sinks:
            summary = run_flow(config, "f", nodes=nodes, sinks=sinks, request=run, now=END)
            again = run_flow(config, "f", nodes=nodes, sinks=sinks, request=run, now=END)
            target = sinks.get(sink)
            writes = target.chunk_log("f")
            assert isinstance(target, Reads)
            rows = history_rows(target.read("f", "tag_history"))
    want = truth_history_rows(node, [tag], [window], HistoryOptions(mode="raw"))
    assert len(want) > 50_000  # ~1.5 MB of answer
    assert rows == want
    assert summary.chunks_done == 1  # one planned chunk ...
    assert summary.requests >= 2  # ... over the cap (not counted: not read), asked in halves
    assert len(writes) >= 2, writes  # ... written a piece at a time
    assert max(write.rows_committed for write in writes) < len(want), writes
    assert sum(write.rows_committed for write in writes) == len(want)
    # The pieces tile the window: each a part of it, none overlapping, none missing.
    pieces = sorted(w.window for w in writes)
    edges = [edge for piece in pieces for edge in (piece.start, piece.end)]
    assert edges[0] == window.start, edges
    assert edges[-1] == window.end, edges
    assert edges[1:-1:2] == edges[2::2], edges  # each piece ends where the next starts
    assert again.chunks_done == 0
