"""A Prefect flow run's memory is bounded as the direct path's: fetch tasks never run
ahead of the writer by more than the node's connections, and no fetched chunk outlives
its write (`engine.HELD`; tests/pipelines/core/test_memory_bound.py for the direct path)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from pipelines.orchestration.env import configure_prefect

configure_prefect()

from connectors.simulator import SimConfig, SimulatedNode, run_server  # noqa: E402
from pipelines.core.runner import RunRequest  # noqa: E402
from pipelines.orchestration.flows import run_prefect  # noqa: E402
from tests.fixtures import HeldWriter, write_config  # noqa: E402
from tests.pipelines.core.test_memory_bound import CONNECTIONS, END, WINDOWS  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def prefect_server() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def test_a_stopped_writer_holds_a_prefect_runs_fetch_tasks_to_the_nodes_connections(
    tmp_path: Path,
) -> None:
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
        # After each write, the writer waits until the fetch tasks are at rest: then the
        # chunk just written (let go when the run asks for the next) and the chunks the
        # tasks fetched meanwhile, one per connection while enough were left, are held.
        writer = HeldWriter()
        summary = run_prefect(
            path,
            "f",
            RunRequest(start=END - timedelta(hours=WINDOWS), end=END),
            on_chunk=writer,
        )
    assert summary.chunks_done == WINDOWS
    assert summary.rows > 0
    # 4 before coalesce let go of a written small chunk; at least 2: fetching ran ahead.
    assert 2 <= writer.peak <= CONNECTIONS + 1, (writer.seen, writer.peak)
    assert node.peak_in_flight <= CONNECTIONS
