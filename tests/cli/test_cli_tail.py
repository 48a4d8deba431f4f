"""`historian tail`: one line per commit, and Ctrl-C or SIGTERM ends it within 5 s with the
one interrupt line, its subscription cancelled; `--duration` ends it with exit 0."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import orjson
import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.live.subscription import TOOL
from tests.cli.test_cli import historian
from tests.cli.test_cli_interrupt import Command, assert_interrupted, command, environment
from tests.fixtures import write_config

READY_S = 120


def listed(node: SimulatedNode) -> list[dict[str, object]]:
    records: list[dict[str, object]] = orjson.loads(node.subscriptions.list({}).body)
    return records


def until(what: str, check: object, run: Command | None = None) -> None:
    """Wait for an observed state of the node (`check()` true), at most READY_S."""
    assert callable(check)
    deadline = time.monotonic() + READY_S
    tick = threading.Event()
    while not check():
        if run is not None and run.process.poll() is not None:
            raise AssertionError(f"ended before {what}: {run.output()}")
        assert time.monotonic() < deadline, f"not within {READY_S} s: {what}"
        tick.wait(0.05)


def tail_config(tmp_path: Path, url: str, node: SimulatedNode) -> None:
    tags = node.tag_paths()[:3]
    flow = {
        "node": "n",
        "tags": {"paths": tags},
        "start": "2020-01-01T00:00:00Z",
        "settle": "2s",
        "live": {"commit_every": "500ms", "poll_every": "200ms", "late_within": "1s"},
    }
    write_config(tmp_path, node={"url": url}, flows={"live": flow}, sinks=["lake"])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_tail_cancels_its_subscription_and_ends_in_bounded_time(
    tmp_path: Path, signum: int
) -> None:
    node = SimulatedNode(SimConfig(seed=5, tags=10, period_ms=1000))
    with run_server(node, https_port=None) as server:
        tail_config(tmp_path, server.http_url, node)
        env = environment(tmp_path)
        with command(["tail", "live", "--config", "flows.yaml"], tmp_path, env) as run:
            until("the tail subscribed", lambda: len(listed(node)) == 1, run)
            (record,) = listed(node)
            assert isinstance(record["data"], dict)
            assert record["data"][TOOL]["flow"] == "live"
            run.wait_for("a commit line", run.committed)  # the node's live samples
            took = run.interrupt(signum)
            assert_interrupted(run, signum, took)
            assert listed(node) == [], "the subscription is cancelled on the way out"
            lines = [line for line in run.stdout if line.startswith("live: committed ")]
            assert lines, run.output()


def test_a_tail_with_a_duration_ends_by_itself(tmp_path: Path) -> None:
    node = SimulatedNode(SimConfig(seed=5, tags=10, period_ms=1000))
    with run_server(node, https_port=None) as server:
        tail_config(tmp_path, server.http_url, node)
        result = historian("tail", "live", "--duration", "2s", cwd=tmp_path, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "live: tail ended after" in result.stdout
        assert listed(node) == []


def test_tailing_an_alarm_flow_is_one_line_exit_2(tmp_path: Path) -> None:
    flow = {"kind": "alarm_history", "node": "n", "start": "2020-01-01T00:00:00Z", "live": {}}
    write_config(tmp_path, node={"url": "http://127.0.0.1:1"}, flows={"a": flow}, sinks=["lake"])
    result = historian("tail", "a", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: flows.yaml: flows.a: live: only tag_history flows can be tailed"
    ], result.stderr
