"""A fleet through a work pool on this machine: how Prefect's part scales with workers.

Simulated nodes (50 by default) served from this process, one flow per node into a shared
Parquet lake on local disk, a real `prefect server start` (its access log counts the API
requests) and a process work pool. For 1, 2 and 4 workers (`prefect worker start --limit
L`, each a round of its own over a fresh time range so nothing is skipped), one
backfill flow run per node is submitted the way `historian backfill --per-node` does
(`pipelines.orchestration.fleet.submit_backfill`) and waited for. Per round it prints:

* flow runs per minute (submission of the first to the end of the last);
* Prefect API requests per flow run (HTTP requests in the server's access log during the
  round, divided by the runs; the events websocket counts once per connection; the
  waiting command's 1 s polls are in it);
* scheduling overhead per shard: the submit call (`run_deployment`), and the time from a
  worker's claim (Pending) to the flow's start (Running): its process, imports, engine;
* throughput: rows the round wrote (read back from the lake) per second, overall and per
  worker.

Prefect state goes to a throwaway PREFECT_HOME; the server's database is its SQLite
default unless `--database-url` names a PostgreSQL one (postgresql+asyncpg://...).

    nice -n 5 .venv/bin/python bench/fleet.py [--nodes 50] [--tags 10] [--hours 2]
        [--window 30m] [--workers 1,2,4] [--limit 2] [--runs N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

HOME = tempfile.mkdtemp(prefix="historian-bench-fleet-")
os.environ["PREFECT_HOME"] = HOME
os.environ.pop("PREFECT_API_URL", None)

from connectors.simulator import SimConfig, SimulatedNode, run_server  # noqa: E402
from pipelines.config.models import load_config  # noqa: E402
from pipelines.orchestration.children import Child  # noqa: E402
from pipelines.orchestration.server import local_server  # noqa: E402

BIN = Path(sys.executable).parent
PREFECT = str(BIN / "prefect")
HISTORIAN = str(BIN / "historian")


@contextmanager
def prefect_server(log: Path, database_url: str | None) -> Iterator[tuple[str, dict[str, str]]]:
    """`prefect server start` (as `historian serve` starts one) with its access log on
    (INFO), and the env of the workers and commands that use it."""
    server_env = {"PREFECT_SERVER_LOGGING_LEVEL": "INFO"}
    if database_url:
        server_env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    with local_server(log, server_env) as api:
        env = {
            **os.environ,
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PREFECT_WORKER_PREFETCH_SECONDS": "1",
            "PREFECT_API_URL": api,
        }
        yield api, env


def api_requests(log: Path) -> int:
    """HTTP requests the server logged so far (uvicorn's access lines)."""
    text = log.read_text(errors="replace")
    return text.count(' HTTP/1.1" ')


def write_config(directory: Path, urls: list[str], tags: int, window: str) -> Path:
    document = {
        "nodes": {f"n{i:03d}": {"url": url, "max_connections": 2} for i, url in enumerate(urls)},
        "sinks": {"lake": {"type": "parquet", "url": str(directory / "lake")}},
        "flows": {
            f"f{i:03d}": {
                "node": f"n{i:03d}",
                "tags": {"browse": "/", "include": ["."]},
                "mode": "raw",
                "window": window,
                "batch": tags,
                "start": "-30d",
                "settle": "0s",
                "sinks": ["lake"],
            }
            for i in range(len(urls))
        },
    }
    path = directory / "flows.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def run(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:3])} failed: {done.stdout}{done.stderr}")


def one_round(
    config_path: Path,
    env: dict[str, str],
    log: Path,
    workers: int,
    limit: int,
    span: tuple[datetime, datetime],
    flows: list[str],
) -> dict[str, Any]:
    """Start `workers` workers, submit one run per flow of `flows`, wait, stop the workers."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from pipelines.orchestration.fleet import ShardRun, submit_backfill, wait_for_shards

    config = load_config(config_path)
    with ExitStack() as stack:
        for w in range(workers):
            out = stack.enter_context((log.parent / f"worker-{workers}-{w}.log").open("wb"))
            stack.enter_context(
                Child(
                    [
                        PREFECT,
                        "worker",
                        "start",
                        "--pool",
                        "bench",
                        "--name",
                        f"w{w}",
                        "--limit",
                        str(limit),
                    ],
                    env=env,
                    stdout=out.fileno(),
                    stderr=out.fileno(),
                )
            )
        stack.enter_context(temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}))
        time.sleep(3)  # the workers register with the pool
        before = api_requests(log)
        began = time.monotonic()
        submitted = []
        submit_s = []
        for flow in flows:
            t = time.perf_counter()
            submitted += submit_backfill(
                config, flow, [ShardRun(flow, None, None)], pool="bench", start=span[0], end=span[1]
            )
            submit_s.append(time.perf_counter() - t)
        results = wait_for_shards(submitted, poll_s=1.0)
        wall = time.monotonic() - began
        requests = api_requests(log) - before
        with get_client(sync_client=True) as client:
            waits = [start_overhead(client, r.flow_run_id) for r in results]
    starts = [w for w in waits if w is not None]
    failed = [r.run.label for r in results if not r.ok]
    rows = lake_rows(config_path, flows, span)
    by_worker: dict[str, int] = {}
    for r in results:
        by_worker[r.worker or "?"] = by_worker.get(r.worker or "?", 0) + 1
    return {
        "workers": workers,
        "limit": limit,
        "flow_runs": len(results),
        "failed": failed,
        "wall_s": round(wall, 1),
        "flow_runs_per_minute": round(len(results) / wall * 60, 1),
        "api_requests_per_flow_run": round(requests / len(results), 1),
        "submit_ms_median": round(statistics.median(submit_s) * 1000, 1),
        # a worker's claim (Pending) to the flow's start (Running): process, imports, engine
        "start_overhead_s_median": round(statistics.median(starts), 1) if starts else None,
        "run_s_median": round(statistics.median(r.seconds for r in results), 1),
        "rows": rows,
        "rows_per_s": round(rows / wall),
        "rows_per_s_per_worker": round(rows / wall / workers),
        "runs_by_worker": by_worker,
    }


def start_overhead(client: Any, flow_run_id: Any) -> float | None:
    """Seconds from the run's Pending state (a worker claimed it) to Running (it began)."""
    states = {s.type.value: s.timestamp for s in client.read_flow_run_states(flow_run_id)}
    if "PENDING" not in states or "RUNNING" not in states:
        return None
    return float((states["RUNNING"] - states["PENDING"]).total_seconds())


def lake_rows(config_path: Path, flows: list[str], span: tuple[datetime, datetime]) -> int:
    """Rows the round's flows hold in the lake within its span (what the round wrote)."""
    import pandas as pd

    from pipelines.config.destinations import SinkSet

    config = load_config(config_path)
    total = 0
    with SinkSet(config, config_path.parent) as sinks:
        for flow in flows:
            frame = sinks.get("lake").read(flow, "tag_history")
            ts = pd.to_datetime(frame["ts"], utc=True)
            total += int(((ts >= pd.Timestamp(span[0])) & (ts < pd.Timestamp(span[1]))).sum())
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--tags", type=int, default=10)
    parser.add_argument("--hours", type=int, default=2)
    parser.add_argument("--window", default="30m")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--limit", type=int, default=2, help="flow runs at once per worker")
    parser.add_argument(
        "--runs", type=int, default=None, help="flow runs per round (default: one per node)"
    )
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rounds = [int(w) for w in args.workers.split(",")]
    runs = args.runs or args.nodes
    directory = Path(HOME)
    log = directory / "server.log"
    nodes = [SimulatedNode(SimConfig(seed=1000 + i, tags=args.tags)) for i in range(args.nodes)]
    end = (datetime.now(UTC) - timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
    results = []
    with ExitStack() as stack:
        servers = [stack.enter_context(run_server(n, http_port=0, https_port=None)) for n in nodes]
        config = write_config(directory, [s.http_url for s in servers], args.tags, args.window)
        _, env = stack.enter_context(prefect_server(log, args.database_url))
        run([PREFECT, "work-pool", "create", "bench", "--type", "process"], env)
        run([HISTORIAN, "deploy", "--pool", "bench", "--config", str(config)], env)
        for i, workers in enumerate(rounds):
            span_end = end - timedelta(hours=args.hours * i)
            span = (span_end - timedelta(hours=args.hours), span_end)
            # each round its own nodes (round-robin over all of them) and its own hours
            names = [f"f{(i * runs + k) % args.nodes:03d}" for k in range(runs)]
            result = one_round(config, env, log, workers, args.limit, span, names)
            results.append(result)
            print(json.dumps(result), flush=True)
    print(
        f"\n{args.nodes} nodes served, {runs} flow runs per round, each one node x {args.tags} "
        f"tags x {args.hours} h ({args.window} windows), "
        f"worker --limit {args.limit}, server database "
        f"{'PostgreSQL' if args.database_url else 'SQLite'}"
    )
    print(
        "| workers | flow runs/min | API requests/run | submit ms | start overhead s | run s "
        "| rows/s | rows/s/worker |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['workers']} | {r['flow_runs_per_minute']} | {r['api_requests_per_flow_run']} | "
            f"{r['submit_ms_median']} | {r['start_overhead_s_median']} | {r['run_s_median']} | "
            f"{r['rows_per_s']:,} | {r['rows_per_s_per_worker']:,} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if any(r["failed"] for r in results):
        raise SystemExit(f"failed flow runs: {[r['failed'] for r in results]}")


if __name__ == "__main__":
    main()
