"""Schedules that fire: `historian serve` on its own local Prefect server, and a work pool
served by `prefect worker start` against a `prefect server start`. Each test waits (bounded)
for scheduled runs that complete, and compares the rows they wrote with the simulator's
ground truth row for row."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode
from connectors.timewindow import Window
from pipelines.destinations import SinkSet
from pipelines.state import flow_watermark
from tests.fixtures import history_rows, load, truth_history_rows, write_config

HISTORIAN = str(Path(sys.executable).with_name("historian"))
PREFECT = str(Path(sys.executable).with_name("prefect"))
SEED, TAGS = 11, 12
WAIT_S = 150  # for two scheduled runs to complete, on a shared, busy machine


def scheduled_config(tmp_path: Path, start: datetime) -> tuple[Path, list[str]]:
    """A flow on the built-in simulator every 4 s, into the lake; its tag paths."""
    tags = SimulatedNode(SimConfig(seed=SEED, tags=TAGS)).tag_paths()[:4]
    flow = {
        "node": "n",
        "tags": {"paths": tags},
        "mode": "raw",
        "window": "10m",
        "start": start.isoformat(),
        # Some simulated tags arrive over a link 2 minutes late: never close those minutes.
        "settle": "3m",
        "schedule": {"interval": "4s"},
    }
    path = write_config(
        tmp_path,
        node={"simulator": {"seed": SEED, "tags": TAGS}},
        flows={"f": flow},
        sinks=["lake"],
    )
    return path, tags


def prefect_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        **extra,
    }
    env.pop("PREFECT_API_URL", None)
    env.pop("HISTORIAN_DEBUG", None)
    return env


def completed_scheduled_runs(api: str) -> list[dict[str, Any]]:
    body = {"flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}}
    runs = httpx.post(f"{api}/flow_runs/filter", json=body, timeout=10).json()
    return [run for run in runs if run["auto_scheduled"]]


def wait_for_runs(api: str, count: int, alive: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT_S
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline and alive():
        try:
            runs = completed_scheduled_runs(api)
        except httpx.HTTPError:
            runs = []
        if len(runs) >= count:
            return runs
        time.sleep(1)
    raise AssertionError(f"{len(runs)} scheduled runs completed within {WAIT_S} s")


def assert_rows_are_the_truth(config: Path, tags: list[str], start: datetime) -> int:
    """The lake holds exactly the node's rows from `start` to the flow's watermark."""
    cfg = load(config)
    with SinkSet(cfg, config.parent) as sinks:
        lake = sinks.get("lake")
        watermark = flow_watermark(lake.progress("f"), tags, start)
        frame = lake.read("f", "tag_history")
    assert watermark is not None
    assert watermark > start
    expected = truth_history_rows(
        SimulatedNode(SimConfig(seed=SEED, tags=TAGS)),
        tags,
        [Window(start, watermark)],
        HistoryOptions(mode="raw"),
    )
    assert expected, "the node had rows in the span"
    assert history_rows(frame) == expected
    return len(expected)


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def running(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def first_line(path: Path, needle: str, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        for line in path.read_text().splitlines():
            if needle in line:
                return line
        time.sleep(0.2)
    raise AssertionError(f"no {needle!r} line: {path.read_text()}")


@contextmanager
def stopped_at_exit(*processes: subprocess.Popen[bytes]) -> Iterator[None]:
    try:
        yield
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_serve_fires_the_schedule_on_its_own_server_and_stops_it(tmp_path: Path) -> None:
    start = (datetime.now(UTC) - timedelta(minutes=30)).replace(second=0, microsecond=0)
    config, tags = scheduled_config(tmp_path, start)
    out = tmp_path / "serve.out"
    with out.open("wb") as sink:
        serve = subprocess.Popen(
            [HISTORIAN, "serve", "--config", str(config)],
            cwd=tmp_path,
            env=prefect_env(tmp_path),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    with stopped_at_exit(serve):
        line = first_line(out, "local Prefect server", serve)
        api = line.split(" API ")[1].split()[0]
        assert api.startswith("http://127.0.0.1:"), line
        assert api.endswith("/api"), line
        runs = wait_for_runs(api, 2, lambda: serve.poll() is None)
        assert {run["name"].split()[0] for run in runs} == {"f"}
        below = descendants(serve.pid)
        assert below, "the server runs as a child of serve"
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=60) == 0, out.read_text()
    assert [pid for pid in below if running(pid)] == [], "serve's children ended with it"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{api}/health", timeout=2)
    assert "Traceback" not in out.read_text()
    assert assert_rows_are_the_truth(config, tags, start) > 0


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_serve_takes_its_server_along(tmp_path: Path) -> None:
    start = datetime.now(UTC) - timedelta(minutes=5)
    config, _ = scheduled_config(tmp_path, start)
    out = tmp_path / "serve.out"
    with out.open("wb") as sink:
        serve = subprocess.Popen(
            [HISTORIAN, "serve", "--config", str(config)],
            cwd=tmp_path,
            env=prefect_env(tmp_path),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    with stopped_at_exit(serve):
        first_line(out, "local Prefect server", serve)
        below = descendants(serve.pid)
        assert below
        serve.kill()
        serve.wait(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(running(pid) for pid in below):
        time.sleep(0.2)
    assert [pid for pid in below if running(pid)] == [], "SIGKILL of serve ends its server"
