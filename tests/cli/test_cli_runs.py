"""`historian runs`: every run and backfill appends its outcome to a run log beside
flows.yaml, whatever became of it (ok, failed, interrupted), and lists them."""

from __future__ import annotations

import json
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from tests.cli.held_node import held_node
from tests.cli.test_cli import historian, small_flow
from tests.cli.test_cli_interrupt import FIRST_WINDOW_END, RUNS, command, environment, flow_config
from tests.fixtures import write_config


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with run_server(SimulatedNode(SimConfig(seed=23, tags=12)), https_port=None) as handle:
        yield handle.http_url


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_runs_lists_an_ok_a_failed_and_an_interrupted_run(tmp_path: Path, sim_url: str) -> None:
    env = environment(tmp_path)
    empty = historian("runs", cwd=tmp_path)
    assert empty.returncode == 0, empty.stderr
    assert "no runs recorded yet" in empty.stdout

    with held_node(sim_url, answer=1) as node:
        flow_config(tmp_path, node)
        node.release.set()
        ok = historian(*RUNS["default"], cwd=tmp_path)
        assert ok.returncode == 0, ok.stderr
        (tmp_path / "lake").rename(tmp_path / "lake-ok")  # the next run starts afresh
    with held_node(sim_url, until=FIRST_WINDOW_END) as node:
        flow_config(tmp_path, node)
        with command(RUNS["default"], tmp_path, env) as run:
            run.wait_for("a chunk committed", run.committed)
            run.wait_for("a history request held by the node", node.held)
            run.interrupt(signal.SIGTERM)
        assert run.process.returncode == 143, run.output()

    down = {"url": f"http://127.0.0.1:{closed_port()}", "retries": 1}
    # The same backfill, on a node that is not there.
    write_config(tmp_path, node=down, flows={"f": _flow(tmp_path)}, sinks=["lake"])
    failed = historian(*RUNS["default"], cwd=tmp_path)
    assert failed.returncode == 1

    entries = [
        json.loads(line)
        for line in (tmp_path / ".historian" / "runs.jsonl").read_text().splitlines()
    ]
    assert [e["status"] for e in entries] == ["ok", "interrupted", "failed"]
    assert entries[0]["rows"] > 0
    assert entries[0]["error"] is None
    assert entries[1]["rows"] > 0, "what the interrupted run committed"
    assert entries[1]["chunks"] >= 1
    assert entries[2]["error"].startswith("flow f: node n: ")
    assert all(e["flow"] == "f" and e["command"] == "backfill" for e in entries)
    assert all(e["start"] <= e["end"] for e in entries)

    listed = historian("runs", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    statuses = [word for word in ("ok", "interrupted", "failed") if f" {word} " in listed.stdout]
    assert statuses == ["ok", "interrupted", "failed"], listed.stdout
    last = historian("runs", "f", "-n", "1", cwd=tmp_path)
    assert " failed " in last.stdout
    assert " ok " not in last.stdout
    other = historian("runs", "nope", cwd=tmp_path)
    assert "no runs of flow nope recorded yet" in other.stdout


def _flow(tmp_path: Path) -> dict[str, object]:
    import yaml

    document = yaml.safe_load((tmp_path / "flows.yaml").read_text())
    flow: dict[str, object] = document["flows"]["f"]
    flow.pop("sinks", None)
    return flow


def _watermark_cells(text: str) -> list[str]:
    """The time cells (`2026-12-01 21:41:47Z`) of the table rows of flow f."""
    rows = [line for line in text.splitlines() if line.startswith("│ f ")]
    return [cell for row in rows for cell in re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", row)]


def test_a_failed_runs_summary_shows_the_watermark_state_shows(
    tmp_path: Path, sim_url: str
) -> None:
    flow = small_flow(window="30m", start="-2h")
    write_config(tmp_path, node={"url": sim_url}, flows={"f": flow}, sinks=["lake"])
    first = historian("run", "f", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    down = {"url": f"http://127.0.0.1:{closed_port()}", "retries": 1}
    write_config(tmp_path, node=down, flows={"f": _flow(tmp_path)}, sinks=["lake"])
    failed = historian("run", "f", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert "failed" in failed.stdout
    state = historian("state", cwd=tmp_path)
    assert state.returncode == 0, state.stderr
    stored = _watermark_cells(state.stdout)[:1]  # complete up to (then the span per tag)
    assert stored, state.stdout
    assert _watermark_cells(failed.stdout) == stored, failed.stdout
    assert _watermark_cells(first.stdout) == stored, "the first run's own watermark"
