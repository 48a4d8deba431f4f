"""How this pipeline's cost grows with tags, with range and with concurrency (Parquet target).

    .venv/bin/python bench/scaling.py

One replay-mode simulator (400 tags) in its own process; for each point the pipeline
contender runs once to warm the node's cache, then `--runs` times measured (median
reported): wall time, rows/s, CPU time and peak RSS of the extracting process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import Measure, run_contender, start_simulator

END = datetime(2026, 11, 1, tzinfo=UTC)


def point(url: str, paths: list[str], hours: int, concurrency: int, runs: int) -> Measure:
    tags_file = Path(tempfile.mkstemp(suffix=".json")[1])
    tags_file.write_text(json.dumps(paths), encoding="utf-8")
    start = (END - timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")
    end = END.strftime("%Y-%m-%dT%H:%M:%SZ")
    extra = ["--concurrency", str(concurrency)]
    run_contender("pipeline", "parquet", url, tags_file, start, end, "", extra=extra)
    measures = [
        run_contender("pipeline", "parquet", url, tags_file, start, end, "", extra=extra)
        for _ in range(runs)
    ]
    wall = statistics.median(m.wall_s for m in measures)
    return Measure(
        "pipeline",
        "parquet",
        measures[0].rows,
        wall,
        statistics.median(m.cpu_s for m in measures),
        statistics.median(m.peak_rss_mb for m in measures),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    simulator, url = start_simulator(400)
    try:
        tags = httpx.get(
            f"{url}/tag?cmd=details&path=%2F&options.recurrent=true", timeout=60
        ).json()
        paths = sorted(entry["fullPath"] for entry in tags["tags"].values())
        print(
            "| varied | tags | hours | concurrency | rows | wall s | rows/s | CPU s | peak RSS MB |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        plan = [("tags", n, 6, 2) for n in (50, 100, 200, 400)]
        plan += [("range", 100, h, 2) for h in (3, 12, 24)]
        plan += [("concurrency", 200, 6, c) for c in (1, 4)]
        for varied, count, hours, concurrency in plan:
            m = point(url, paths[:count], hours, concurrency, args.runs)
            print(
                f"| {varied} | {count} | {hours} | {concurrency} | {m.rows:,} | {m.wall_s:.2f} | "
                f"{m.rows_per_s:,.0f} | {m.cpu_s:.2f} | {m.peak_rss_mb:.0f} |",
                flush=True,
            )
    finally:
        simulator.terminate()
        simulator.wait(timeout=10)


if __name__ == "__main__":
    main()
