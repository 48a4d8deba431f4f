"""What `window: auto` chooses, and how long its chunks take to commit.

    .venv/bin/python bench/auto_window.py                # 24 h backfill, each node profile
    .venv/bin/python bench/auto_window.py --hours 12 --runs 3

For each node profile (a node that caps raw answers at 300 or 700 samples per tag without
saying so, and one that does not), a raw backfill with `window: auto` into a Parquet lake and DuckDB,
direct (no Prefect): the window chosen, the chunks, the most rows in one chunk and the
seconds from one chunk's commit to the next (median and max over the run; the first chunk
also pays for imports and the lake's first files). A chunk that commits in well under the
time between two kills is what lets a run killed again and again make progress.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import ChunkOutcome, RunRequest, RunSummary
from pipelines.core.units import run_flow
from tests.fixtures import load, write_config

END = datetime(2026, 11, 20, tzinfo=UTC)
PROFILES: dict[str, dict[str, Any]] = {
    "cap 300, 10 tags at 1 s": {"tags": 10, "raw_cap": 300, "period_ms": 1000},
    "cap 700, 40 tags of 1-60 s": {"tags": 40, "raw_cap": 700, "period_ms": None},
    "no cap, 200 tags of 1-60 s": {"tags": 200, "raw_cap": 10_000, "period_ms": None},
}


def one_run(profile: dict[str, Any], hours: int) -> dict[str, Any]:
    node = SimulatedNode(SimConfig(seed=3, **profile))
    node.set_clock(int(END.timestamp() * 1000))
    start = END - timedelta(hours=hours)
    commits: list[float] = []
    rows: list[int] = []

    def record(outcome: ChunkOutcome, summary: RunSummary) -> None:
        commits.append(time.perf_counter())
        rows.append(outcome.rows_fetched)

    with tempfile.TemporaryDirectory() as folder, run_server(node, https_port=None) as handle:
        flow = {
            "node": "n",
            "tags": {"browse": "/", "include": ["."]},
            "window": "auto",
            "start": start.isoformat(),
            "settle": "0s",
        }
        path = write_config(Path(folder), node={"url": handle.http_url}, flows={"f": flow})
        config = load(path)
        began = time.perf_counter()
        with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
            summary = run_flow(
                config,
                "f",
                nodes=nodes,
                sinks=sinks,
                request=RunRequest(start=start, end=END),
                on_chunk=record,
                now=END,
            )
    gaps = [later - earlier for earlier, later in zip([began, *commits], commits, strict=False)]
    return {
        "window": summary.window_label,
        "chunks": len(rows),
        "rows": summary.rows,
        "max_rows": max(rows, default=0),
        "median_s": statistics.median(gaps[1:] or gaps),
        "max_s": max(gaps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    print("| node | window | chunks | rows | most rows in a chunk | s per chunk, median | max |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, profile in PROFILES.items():
        results = [one_run(profile, args.hours) for _ in range(args.runs)]
        median = statistics.median(result["median_s"] for result in results)
        worst = statistics.median(result["max_s"] for result in results)
        first = results[0]
        print(
            f"| {name} | {first['window']} | {first['chunks']} | {first['rows']:,} | "
            f"{first['max_rows']:,} | {median:.2f} | {worst:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
