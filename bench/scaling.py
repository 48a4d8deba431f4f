"""How this pipeline's cost grows with tags, with range and with concurrency (Parquet target).

    .venv/bin/python bench/scaling.py
    .venv/bin/python bench/scaling.py --lengths 6,12,24,48 --runs 1   # peak RSS vs run length

One replay-mode simulator (400 tags, mixed 1-60 s periods) in its own process; for each
point the pipeline contender runs once to warm the node's cache, then `--runs` times
measured (median reported): wall time, rows/s, CPU time and peak RSS of the extracting
process (GNU time), start-up and imports included. `--lengths` runs one backfill of all
400 tags per length instead (2.6 M rows per 6 h): the peak RSS against the rows of one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import HERE, PYTHON, Measure, Workload, measured, start_simulator
from contenders import Work


def run_once(url: str, tags_file: Path, work: Work, concurrency: int) -> Measure:
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as out:
        stdout, wall, cpu, rss = measured(
            [
                PYTHON,
                str(HERE / "contenders.py"),
                "pipeline",
                "--url",
                url,
                "--tags-file",
                str(tags_file),
                "--work",
                work.to_json(),
                "--target",
                "parquet",
                "--out",
                out,
                "--concurrency",
                str(concurrency),
            ]
        )
    rows = int(json.loads(stdout.strip().splitlines()[-1])["rows"])
    return Measure("pipeline", "parquet", rows, wall, cpu, rss)


def point(url: str, paths: list[str], hours: int, concurrency: int, runs: int) -> Measure:
    tags_file = Path(tempfile.mkstemp(suffix=".json")[1])
    tags_file.write_text(json.dumps(paths), encoding="utf-8")
    work = Workload("scaling", len(paths), timedelta(hours=hours), "").work()
    run_once(url, tags_file, work, concurrency)  # warms the node's replay cache
    measures = [run_once(url, tags_file, work, concurrency) for _ in range(runs)]
    tags_file.unlink()
    return Measure(
        "pipeline",
        "parquet",
        measures[0].rows,
        statistics.median(m.wall_s for m in measures),
        statistics.median(m.cpu_s for m in measures),
        statistics.median(m.peak_rss_mb for m in measures),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--lengths",
        default="",
        help="comma-separated hours: one backfill of all 400 tags per length",
    )
    args = parser.parse_args()
    simulator, url = start_simulator(Workload("scaling", 400, timedelta(hours=1), ""))
    try:
        tags = httpx.get(
            f"{url}/tag?cmd=details&path=%2F&options.recurrent=true", timeout=60
        ).json()
        paths = sorted(entry["fullPath"] for entry in tags["tags"].values())
        print(
            "| varied | tags | hours | concurrency | rows | wall s | rows/s | CPU s | peak RSS MB |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        if args.lengths:
            plan = [("length", 400, int(h), 2) for h in args.lengths.split(",")]
        else:
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
