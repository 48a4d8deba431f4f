"""A fleet on a work pool, all real parts on loopback: `prefect server start` (the session's,
tests/prefect_server.py), a process work pool with TWO `prefect worker start`, FOUR simulated
nodes, a moto S3 lake and PostgreSQL. A sharded backfill completes with both workers doing
work and the lake and the warehouse equal to the nodes' ground truth row for row; then a
worker is SIGKILLed mid-run: the rest completes, the backfill names the crashed shard, and
running it again (once Prefect reports the crash) completes that shard, still exact. All
along, no node is asked more than its `max_connections` at once across both workers (the
simulators count).

This process reads the lake before the workers write it again and keeps its filesystem
object: what it reads afterwards is what a long-lived reader sees."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from contextlib import ExitStack, suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from tests.cli.test_schedules import HISTORIAN, descendants, stopped_at_exit
from tests.fixtures import history_rows, load, own_database, truth_history_rows
from tests.prefect_server import PREFECT, delete_pool_deployments
from tests.sinks.moto_s3 import fsspec_options, moto_bucket

SEEDS = (41, 42, 43, 44)
TAGS = 10
MAX_CONNECTIONS = 2
SHARDS = 2
WAIT_S = 600  # a backfill of four flows over two workers on a shared, busy 2-core machine
POOL = "plant-fleet"  # of this test's own on the session's shared Prefect server


def hours_ago(hours: int) -> datetime:
    return (datetime.now(UTC) - timedelta(hours=hours)).replace(minute=0, second=0, microsecond=0)


def fleet_config(tmp_path: Path, urls: list[str], s3: dict[str, Any], pg: str) -> Path:
    """One flow per node (f1..f4), every tag, into the S3 lake and PostgreSQL."""
    nodes = {
        f"n{i + 1}": {"url": url, "max_connections": MAX_CONNECTIONS} for i, url in enumerate(urls)
    }
    flows = {
        f"f{i + 1}": {
            "node": f"n{i + 1}",
            "tags": {"browse": "/", "include": ["."]},
            "mode": "raw",
            "window": "30m",
            "batch": 4,
            "start": hours_ago(48).isoformat(),
            "settle": "0s",
            "sinks": ["lake", "pg"],
        }
        for i in range(len(urls))
    }
    document = {
        "nodes": nodes,
        "sinks": {
            "lake": {"type": "parquet", "url": "s3://lake/fleet", "storage_options": s3},
            "pg": {"type": "sql", "url": pg, "schema": "fleet"},
        },
        "flows": flows,
    }
    path = tmp_path / "flows.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 180) -> str:
    done = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def backfills(
    config: Path, env: dict[str, str], start: datetime, end: datetime
) -> list[subprocess.Popen[str]]:
    """`historian backfill fK --shards 2 --pool POOL` for every flow, at once."""
    return [
        subprocess.Popen(
            [
                HISTORIAN,
                "backfill",
                f"f{i + 1}",
                "--start",
                start.isoformat(),
                "--end",
                end.isoformat(),
                "--shards",
                str(SHARDS),
                "--pool",
                POOL,
                "--config",
                str(config),
            ],
            env=env,
            cwd=config.parent,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(len(SEEDS))
    ]


def finished(processes: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    results = []
    for process in processes:
        out, err = process.communicate(timeout=WAIT_S)
        assert "Traceback" not in out + err, out + err
        results.append((process.returncode, out + err))
    return results


def assert_exact(config: Path, nodes: list[SimulatedNode], start: datetime, end: datetime) -> int:
    """Lake and warehouse hold exactly each node's rows of [start, end), every flow, as a
    reader that read the lake before sees them."""
    cfg = load(config)
    total = 0
    with SinkSet(cfg, config.parent) as sinks:
        for i, node in enumerate(nodes):
            flow = f"f{i + 1}"
            expected = truth_history_rows(
                node, node.tag_paths(), [Window(start, end)], HistoryOptions(mode="raw")
            )
            assert expected
            for sink in ("lake", "pg"):
                frame = sinks.get(sink).read(flow, "tag_history")
                ts = pd.to_datetime(frame["ts"], utc=True)
                inside = frame[(ts >= pd.Timestamp(start)) & (ts < pd.Timestamp(end))]
                assert history_rows(inside) == expected, f"{sink} {flow}"
            total += len(expected)
    return total


def start_worker(name: str, env: dict[str, str], tmp_path: Path) -> subprocess.Popen[bytes]:
    with (tmp_path / f"{name}.out").open("wb") as out:
        return subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", POOL, "--name", name, "--limit", "2"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def runs_of(api: str, worker: str, state: str) -> list[str]:
    """Ids of the flow runs in `state` the worker submitted (from the API)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from pipelines.orchestration.fleet import workers_of

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType(state)]))
            )
        )
        by = workers_of(client, [r.id for r in runs])
    return [str(r.id) for r in runs if by.get(r.id) == worker]


def fetching(api: str, flow_run_ids: list[str]) -> bool:
    """Whether a fetch task of one of these flow runs has started (from the API)."""
    import uuid

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    if not flow_run_ids:
        return False
    ids = [uuid.UUID(i) for i in flow_run_ids]
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
    return any(t.name.startswith("fetch ") and t.start_time is not None for t in tasks)


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL a worker and every process below it (its flow runs): a machine lost."""
    below = descendants(process.pid)
    process.kill()
    for pid in below:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_sharded_backfill_on_two_workers_survives_losing_one(
    tmp_path: Path, pg_url: str, prefect_api: tuple[str, dict[str, str]]
) -> None:
    pytest.importorskip("s3fs")
    nodes = [SimulatedNode(SimConfig(seed=seed, tags=TAGS)) for seed in SEEDS]
    for node in nodes:
        # every history answer takes a while: fetches overlap, and a kill lands mid-run
        node.faults.configure(rate=1.0, kinds=["slow"], slow_s=0.3, operations=["tag.historyMany"])
    with ExitStack() as stack:
        servers = [stack.enter_context(run_server(n, http_port=0, https_port=None)) for n in nodes]
        s3 = fsspec_options(stack.enter_context(moto_bucket("lake")))
        pg = stack.enter_context(own_database(pg_url, "fleet"))
        config = fleet_config(tmp_path, [s.http_url for s in servers], s3, pg)
        api, server_env = prefect_api
        env = {
            **server_env,
            "PREFECT_HOME": str(tmp_path / "prefect"),
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "1",
        }
        run([PREFECT, "work-pool", "create", POOL, "--type", "process"], env, tmp_path)
        stack.callback(delete_pool_deployments, api, POOL)
        deployed = run(
            [HISTORIAN, "deploy", "--pool", POOL, "--config", str(config)], env, tmp_path
        )
        assert "deployed 4 flows" in deployed
        workers = {name: start_worker(name, env, tmp_path) for name in ("w1", "w2")}
        stack.enter_context(stopped_at_exit(*workers.values()))

        # 1. a sharded backfill, both workers: exact
        first = (hours_ago(30), hours_ago(27))
        outcomes = finished(backfills(config, env, *first))
        assert all(code == 0 for code, _ in outcomes), [out for code, out in outcomes if code]
        lines = [line for _, out in outcomes for line in out.splitlines()]
        shard_lines = [line for line in lines if re.match(r"f\d \d-of-2: completed", line)]
        assert len(shard_lines) == len(SEEDS) * SHARDS, lines
        ran_on = {line.rsplit("worker ", 1)[1] for line in shard_lines}
        assert ran_on == {"w1", "w2"}, "both workers ran shards"
        assert assert_exact(config, nodes, *first) > 0
        peaks = [node.peak_in_flight for node in nodes]
        assert max(peaks) <= MAX_CONNECTIONS, peaks
        assert max(peaks) > 1, f"fetches overlapped on a node: {peaks}"

        # 2. w1 dies mid-run: the other shards complete, the crashed one is named
        second = (hours_ago(27), hours_ago(24))
        for node in nodes:
            node.reset_peak()
        pending = backfills(config, env, *second)
        deadline = time.monotonic() + WAIT_S
        # a run of w1 under way, none still starting (a run that never started has no
        # heartbeat to miss: nothing would mark it crashed)
        # and into its fetches: a fetch task of that run has started
        while runs_of(api, "w1", "PENDING") or not fetching(api, runs_of(api, "w1", "RUNNING")):
            assert time.monotonic() < deadline, "w1 never fetched for a shard"
            time.sleep(0.5)
        kill_tree(workers["w1"])
        outcomes = finished(pending)
        failed = [out for code, out in outcomes if code != 0]
        assert failed, "a shard of the killed worker crashed"
        for out in failed:
            assert re.search(r"shards did not complete: f\d \d-of-2 \(crashed\)", out), out
        for code, out in outcomes:
            assert code in (0, 1), out

        # 3. the same backfills again, as soon as they report the crash (the lost run's
        # lake lease lapses before Prefect calls it crashed), with a worker in place of
        # the lost one: only what is left runs, and it is exact
        workers["w3"] = start_worker("w3", env, tmp_path)
        stack.enter_context(stopped_at_exit(workers["w3"]))
        outcomes = finished(backfills(config, env, *second))
        assert all(code == 0 for code, _ in outcomes), [out for code, out in outcomes if code]
        assert assert_exact(config, nodes, *first) > 0
        assert assert_exact(config, nodes, *second) > 0
        peaks = [node.peak_in_flight for node in nodes]
        assert max(peaks) <= MAX_CONNECTIONS, peaks
