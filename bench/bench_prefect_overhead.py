"""What Prefect costs: one workload run direct (`run_flow`) and through Prefect (`run_prefect`).

The workload, by default the shape of the embedded flows.yaml `raw_history`: the simulator
on loopback, raw history of 200 tags over 6 hours in one-hour windows and batches of 100
tags (12 chunks; ~1.6 M rows), into a fresh Parquet lake each time. The two paths
alternate (direct, Prefect, direct, ...), after one warm-up of each (the warm-up starts
the ephemeral Prefect server, which `historian run` pays once per command). Prints the
median wall time, CPU time and peak RSS of each and the overhead in percent (target
< 10 %), plus the chunk count so the overhead per task can be read off.

`--server long-lived` runs the Prefect contenders against a Prefect server started for
the bench (`pipelines/orchestration/server.py`, as `historian serve` starts one), as a
`historian run` with PREFECT_API_URL uses one (without flow-run heartbeats, as that command
runs: `pipelines/orchestration/env.py`). `--server ephemeral` (default) is Prefect's own
throwaway server, as a one-off `historian run` without PREFECT_API_URL.

Peak RSS is this process's resident size sampled every 10 ms during each run (the runs
share one process, so the kernel's high-water mark would be the largest run's): what a
run adds on top of the imports and the simulator it shares with the other contenders.

Prefect state goes to a throwaway PREFECT_HOME, not the user's.

    .venv/bin/python bench/bench_prefect_overhead.py [--tags 200] [--hours 6] [--batch 100]
        [--window 1h] [--repeat 5] [--server ephemeral|long-lived] [--baseline OLD_FLOWS.py]

`--baseline` adds a third contender: `run_prefect` of another copy of pipelines/orchestration/flows.py
(e.g. `git show HEAD~1:pipelines/orchestration/flows.py > /tmp/flows_old.py`), run in the same
alternation, so a change to the flows is measured side by side with what it replaces.

Prefect's cost is per run (~0.2 s on an idle machine: flow run, states, artifact) plus
the engine's CPU per task run (one per chunk), which competes with the pipeline's own
parsing and writing for the cores; small chunks or a busy machine make it show.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

HOME = tempfile.mkdtemp(prefix="historian-bench-prefect-")
os.environ.setdefault("PREFECT_HOME", HOME)

from pipelines.orchestration.env import configure_prefect  # noqa: E402

configure_prefect()

from connectors.simulator import SimConfig, SimulatedNode, run_server  # noqa: E402
from pipelines.config.destinations import SinkSet  # noqa: E402
from pipelines.config.models import load_config  # noqa: E402
from pipelines.config.nodes import NodePool  # noqa: E402
from pipelines.core.runner import RunRequest, RunSummary  # noqa: E402
from pipelines.core.units import run_flow  # noqa: E402
from pipelines.orchestration.flows import run_prefect  # noqa: E402
from pipelines.orchestration.server import api_for_schedules  # noqa: E402

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def write_config(
    directory: Path, url: str, tags: list[str], start: datetime, batch: int, window: str
) -> Path:
    document = {
        "nodes": {"sim": {"url": url, "max_connections": 2}},
        "sinks": {"lake": {"type": "parquet", "url": "lake"}},
        "flows": {
            "bench": {
                "node": "sim",
                "tags": {"paths": tags},
                "mode": "raw",
                "window": window,
                "batch": batch,
                "start": start.isoformat(),
                "settle": "0s",
                "metadata": False,
                "sinks": ["lake"],
            }
        },
    }
    path = directory / "flows.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
    return path


def direct(path: Path, request: RunRequest) -> RunSummary:
    config = load_config(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, "bench", nodes=nodes, sinks=sinks, request=request)


def via_prefect(path: Path, request: RunRequest) -> RunSummary:
    return run_prefect(path, "bench", request)


def baseline_runner(path: str) -> Callable[[Path, RunRequest], RunSummary]:
    """`run_prefect` of another copy of the flows module, loaded from a file."""
    spec = importlib.util.spec_from_file_location("historian_flows_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline {path}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    run_old: Callable[..., RunSummary] = module.run_prefect

    def via_baseline(path: Path, request: RunRequest) -> RunSummary:
        return run_old(path, "bench", request)

    return via_baseline


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its children alive now (the server)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


@contextmanager
def peak_rss() -> Iterator[list[float]]:
    """This process's peak resident size in MB during the block, sampled every 10 ms."""
    import psutil

    me = psutil.Process()
    peak = [me.memory_info().rss / 2**20]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            peak[0] = max(peak[0], me.memory_info().rss / 2**20)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        stop.set()
        sampler.join()
        peak[0] = max(peak[0], me.memory_info().rss / 2**20)


def timed(
    run: Callable[[Path, RunRequest], RunSummary],
    url: str,
    tags: list[str],
    request: RunRequest,
    shape: tuple[int, str],
) -> tuple[float, float, float, RunSummary]:
    """One run into a fresh lake: wall and CPU seconds including opening and closing all,
    and the peak RSS in MB.

    The CPU time includes the in-process simulator's (the same work for every contender)
    and the Prefect server's, which competes for the same cores.
    """
    assert request.start is not None
    directory = Path(tempfile.mkdtemp(prefix="historian-bench-run-"))
    try:
        path = write_config(directory, url, tags, request.start, *shape)
        cpu = cpu_seconds()
        began = time.perf_counter()
        with peak_rss() as peak:
            summary = run(path, request)
        return time.perf_counter() - began, cpu_seconds() - cpu, peak[0], summary
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def flush_to_api() -> None:
    """Send the run logs and events Prefect still holds (it would at exit, too late for a
    server that stops before this process does)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all()
    EventsWorker.drain_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=int, default=200)
    parser.add_argument("--hours", type=int, default=6)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--window", default="1h")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--server",
        choices=("ephemeral", "long-lived"),
        default="ephemeral",
        help="Prefect's throwaway server, or a server started for the bench",
    )
    parser.add_argument(
        "--baseline", help="another pipelines/orchestration/flows.py to measure alongside"
    )
    args = parser.parse_args()
    node = SimulatedNode(SimConfig(seed=5, tags=max(10, args.tags)))
    node.set_clock(int(NOW.timestamp() * 1000))
    tags = node.tag_paths()[: args.tags]
    request = RunRequest(start=NOW - timedelta(hours=args.hours), end=NOW)
    shape = (args.batch, args.window)
    runs = {"direct": direct, "prefect": via_prefect}
    if args.baseline:
        runs["baseline"] = baseline_runner(args.baseline)
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    peaks: dict[str, list[float]] = {name: [] for name in runs}
    prefect_server = api_for_schedules() if args.server == "long-lived" else nullcontext()
    try:
        with prefect_server, run_server(node, http_port=0, https_port=None) as server:
            for run in runs.values():  # warm-up: imports, server start, caches
                *_, summary = timed(run, server.http_url, tags, request, shape)
            rows, chunks = summary.rows, summary.chunks_done
            for _ in range(args.repeat):
                for name, run in runs.items():
                    seconds, cpu, peak, summary = timed(run, server.http_url, tags, request, shape)
                    assert summary.rows == rows, "both paths must do the same work"
                    times[name].append(seconds)
                    cpus[name].append(cpu)
                    peaks[name].append(peak)
            flush_to_api()  # before the long-lived server stops
    finally:
        shutil.rmtree(HOME, ignore_errors=True)
    plain = statistics.median(times["direct"])
    print(
        f"workload: {len(tags)} tags x {args.hours} h raw, batch {args.batch}, window "
        f"{args.window}: {chunks} chunks, {rows:,} rows; Prefect server: {args.server}; "
        f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    plain_cpu = statistics.median(cpus["direct"])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        cpu = statistics.median(cpus[name])
        line = (
            f"{name:8s} median {median:.2f} s, CPU {cpu:.2f} s, peak RSS "
            f"{statistics.median(peaks[name]):.0f} MB over {args.repeat} runs"
        )
        if name != "direct":
            extra = median - plain
            line += (
                f": overhead {extra / plain * 100:+.1f} % "
                f"({extra / max(1, chunks) * 1000:+.0f} ms per chunk; target < 10 %), "
                f"CPU {(cpu - plain_cpu) / plain_cpu * 100:+.1f} %"
            )
        print(line)
    for name, seconds in times.items():
        print(f"  {name} wall: {' '.join(f'{x:.2f}' for x in seconds)}")
        print(f"  {name} CPU:  {' '.join(f'{x:.2f}' for x in cpus[name])}")
        print(f"  {name} RSS:  {' '.join(f'{x:.0f}' for x in peaks[name])}")


if __name__ == "__main__":
    main()
