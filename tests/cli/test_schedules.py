"""Schedules that fire: `historian serve` on its own local Prefect server, and a work pool
served by `prefect worker start` against a `prefect server start`. Each test waits (bounded)
for scheduled runs that complete, and compares the rows they wrote with the simulator's
ground truth row for row."""

from __future__ import annotations

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
import yaml

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.state import flow_watermark
from tests.fixtures import history_rows, load, truth_history_rows, write_config
from tests.prefect_server import PREFECT, api_call, delete_pool_deployments, prefect_env

HISTORIAN = str(Path(sys.executable).with_name("historian"))
SEED, TAGS = 11, 12
WAIT_S = 240  # for two scheduled runs to complete, on a shared, busy machine


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


def completed_scheduled_runs(api: str, config: Path) -> list[dict[str, Any]]:
    """The completed runs a schedule of `config`'s flows started (a shared server also
    holds other tests' runs)."""
    body = {"flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}}
    runs = api_call("POST", f"{api}/flow_runs/filter", json=body).json()
    ours = str(config.resolve())
    return [
        run
        for run in runs
        if run["auto_scheduled"] and run["parameters"].get("config_path") == ours
    ]


def wait_for_runs(api: str, config: Path, count: int, alive: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT_S
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline and alive():
        try:
            runs = completed_scheduled_runs(api, config)
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
    deadline = time.monotonic() + 300  # the server starts within 240 s or serve says why
    while time.monotonic() < deadline and process.poll() is None:
        for line in path.read_text().splitlines():
            if needle in line:
                return line
        time.sleep(0.2)
    raise AssertionError(f"no {needle!r} line: {path.read_text()}")


def start_serve(config: Path, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`historian serve` on its own local server, its output in `serve.out`."""
    out = tmp_path / "serve.out"
    with out.open("wb") as sink:
        serve = subprocess.Popen(
            [HISTORIAN, "serve", "--config", str(config)],
            cwd=tmp_path,
            env=prefect_env(tmp_path),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return serve, out


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
    serve, out = start_serve(config, tmp_path)
    with stopped_at_exit(serve):
        line = first_line(out, "local Prefect server", serve)
        api = line.split(" API ")[1].split()[0]
        assert api.startswith("http://127.0.0.1:"), line
        assert api.endswith("/api"), line
        runs = wait_for_runs(api, config, 2, lambda: serve.poll() is None)
        assert {run["name"].split()[0] for run in runs} == {"f"}
        below = descendants(serve.pid)
        assert below, "the server runs as a child of serve"
        serve.send_signal(signal.SIGINT)
        # Ctrl-C ends serve as it ends every command: 130 and one line (test_cli_interrupt).
        assert serve.wait(timeout=60) == 130, out.read_text()
    assert [pid for pid in below if running(pid)] == [], "serve's children ended with it"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{api}/health", timeout=2)
    output = out.read_text()
    assert "Traceback" not in output, output
    assert assert_rows_are_the_truth(config, tags, start) > 0


FLEET_SEEDS = {"plant_a": SEED, "plant_b": SEED + 1}


def fleet_scheduled_config(tmp_path: Path, start: datetime) -> tuple[Path, list[str]]:
    """`scheduled_config` over two simulator nodes (one flow, `node: [plant_a, plant_b]`)."""
    path, tags = scheduled_config(tmp_path, start)
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["nodes"] = {
        name: {"simulator": {"seed": seed, "tags": TAGS}} for name, seed in FLEET_SEEDS.items()
    }
    document["flows"]["f"]["node"] = list(FLEET_SEEDS)
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path, tags


@pytest.mark.slow
def test_serve_fires_a_fleet_flow_and_each_node_gets_its_own_rows(tmp_path: Path) -> None:
    start = (datetime.now(UTC) - timedelta(minutes=30)).replace(second=0, microsecond=0)
    config, tags = fleet_scheduled_config(tmp_path, start)
    serve, out = start_serve(config, tmp_path)
    with stopped_at_exit(serve):
        line = first_line(out, "local Prefect server", serve)
        api = line.split(" API ")[1].split()[0]
        runs = wait_for_runs(api, config, 2, lambda: serve.poll() is None)
        serve.send_signal(signal.SIGINT)
        # Ctrl-C ends serve as it ends every command: 130 and one line (test_cli_interrupt).
        assert serve.wait(timeout=60) == 130, out.read_text()
    assert {run["name"].split()[0] for run in runs} == {"f"}, runs
    output = out.read_text()
    assert "Traceback" not in output, output
    cfg = load(config)
    with SinkSet(cfg, config.parent) as sinks:
        lake = sinks.get("lake")
        units = dict(cfg.flow_units("f"))
        assert sorted(units) == sorted(FLEET_SEEDS)
        covered = {
            node: flow_watermark(lake.progress(key), tags, start) for node, key in units.items()
        }
        frame = lake.read("f", "tag_history")
    for node, seed in FLEET_SEEDS.items():
        watermark = covered[node]
        assert watermark is not None, f"{node}: nothing extracted"
        assert watermark > start, f"{node}: nothing extracted"
        expected = truth_history_rows(
            SimulatedNode(SimConfig(seed=seed, tags=TAGS)),
            tags,
            [Window(start, watermark)],
            HistoryOptions(mode="raw"),
        )
        assert expected, f"{node}: the node had rows in the span"
        mine = frame[frame["node"].astype(str) == node].reset_index(drop=True)
        assert history_rows(mine) == expected, f"{node}: rows differ from its ground truth"
    assert set(frame["node"].astype(str)) == set(FLEET_SEEDS)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_serve_takes_its_server_along(tmp_path: Path) -> None:
    start = datetime.now(UTC) - timedelta(minutes=5)
    config, _ = scheduled_config(tmp_path, start)
    serve, out = start_serve(config, tmp_path)
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


@pytest.mark.slow
def test_a_work_pool_deployment_fires_on_a_prefect_server_with_a_worker(
    tmp_path: Path, prefect_api: tuple[str, dict[str, str]]
) -> None:
    start = (datetime.now(UTC) - timedelta(minutes=30)).replace(second=0, microsecond=0)
    config, tags = scheduled_config(tmp_path, start)
    api, server_env = prefect_api
    env = {**server_env, "PREFECT_HOME": str(tmp_path / "prefect")}
    pool = "plant-schedules"  # of this test's own on the shared server
    created = subprocess.run(
        [PREFECT, "work-pool", "create", pool, "--type", "process"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    try:
        deployed = subprocess.run(
            [HISTORIAN, "deploy", "--pool", pool, "--config", str(config)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        assert f"deployed 1 flows (f; scheduled: f) to work pool {pool}" in deployed.stdout
        out = tmp_path / "worker.out"
        with out.open("wb") as sink:
            worker = subprocess.Popen(
                [PREFECT, "worker", "start", "--pool", pool],
                cwd=tmp_path,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        with stopped_at_exit(worker):
            runs = wait_for_runs(api, config, 2, lambda: worker.poll() is None)
            worker.send_signal(signal.SIGINT)
            worker.wait(timeout=60)
    finally:
        delete_pool_deployments(api, pool)
    assert {run["name"].split()[0] for run in runs} == {"f"}, runs
    assert {run["work_pool_name"] for run in runs} == {pool}
    assert assert_rows_are_the_truth(config, tags, start) > 0


def test_deploy_without_a_prefect_server_is_refused(tmp_path: Path) -> None:
    config_with_schedule(tmp_path, {"interval": "1h"})
    line = one_error_line(run_cli("deploy", "--pool", "plant", cwd=tmp_path), 2)
    assert "PREFECT_API_URL" in line


# -- schedules refused before anything is served -------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HISTORIAN, *args],
        cwd=cwd,
        env={**prefect_env(cwd), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=180,
    )


def one_error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    assert "Traceback" not in output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def config_with_schedule(tmp_path: Path, schedule: dict[str, Any] | None) -> Path:
    flow: dict[str, Any] = {
        "node": "n",
        "tags": {"browse": "/", "include": ["."]},
        "start": "-1h",
    }
    if schedule is not None:
        flow["schedule"] = schedule
    return write_config(
        tmp_path, node={"simulator": {"seed": 3, "tags": 10}}, flows={"f": flow}, sinks=["lake"]
    )


def test_a_cron_prefect_refuses_is_named_by_check_and_serve_starts_nothing(
    tmp_path: Path,
) -> None:
    config_with_schedule(tmp_path, {"cron": "61 * * * *"})
    check = run_cli("check", cwd=tmp_path)
    assert one_error_line(check, 1) == "error: 1 check failed: schedule f"
    failures = [
        line
        for line in (check.stdout + check.stderr).splitlines()
        if "flows.f.schedule.cron" in line
    ]
    assert len(failures) == 1, "the failure is printed once"
    assert '"61 * * * *"' in failures[0]
    assert "ok node" in check.stdout, "the rest is still checked"
    serve = run_cli("serve", cwd=tmp_path)
    line = one_error_line(serve, 2)
    assert "flows.yaml: flows.f.schedule.cron" in line
    assert not (tmp_path / "prefect" / "historian-server.log").exists(), "no server started"


def test_a_good_schedule_is_shown_by_check(tmp_path: Path) -> None:
    config_with_schedule(tmp_path, {"cron": "5 * * * *", "timezone": "Europe/Paris"})
    check = run_cli("check", cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "ok schedule f: cron 5 * * * * (Europe/Paris)" in check.stdout


@pytest.mark.parametrize(
    ("schedule", "key", "why"),
    [
        ({"cron": "5 * * * *", "timezone": "Europe/Pariss"}, "timezone", "'Europe/Pariss'"),
        ({"interval": "0s"}, "interval", "at least 1s"),
        ({"interval": "15m", "cron": "5 * * * *"}, "schedule", "exactly one of"),
    ],
)
def test_a_bad_schedule_fails_config_validation_in_one_line(
    tmp_path: Path, schedule: dict[str, Any], key: str, why: str
) -> None:
    config_with_schedule(tmp_path, schedule)
    for command in ("check", "serve"):
        line = one_error_line(run_cli(command, cwd=tmp_path), 2)
        assert f"flows.f.schedule{'' if key == 'schedule' else '.' + key}" in line
        assert why in line


def test_serving_a_flow_without_a_schedule_is_refused(tmp_path: Path) -> None:
    config_with_schedule(tmp_path, None)
    line = one_error_line(run_cli("serve", "--flow", "f", cwd=tmp_path), 2)
    assert "flows.f: has no schedule or live: to serve" in line


def test_a_sharded_backfill_without_a_pool_is_refused_in_one_line(tmp_path: Path) -> None:
    config_with_schedule(tmp_path, None)
    for flags in (["--shards", "4"], ["--per-node"]):
        result = run_cli("backfill", "f", "--start", "-2h", *flags, cwd=tmp_path)
        line = one_error_line(result, 2)
        assert "--shards and --per-node need --pool NAME" in line
        assert not (tmp_path / "lake").exists(), "nothing was written"


def test_a_sharded_backfill_without_a_prefect_server_is_refused(tmp_path: Path) -> None:
    config_with_schedule(tmp_path, None)
    result = run_cli(
        "backfill", "f", "--start", "-2h", "--shards", "2", "--pool", "p", cwd=tmp_path
    )
    assert "PREFECT_API_URL" in one_error_line(result, 2)
