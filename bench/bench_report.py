"""Coverage report on millions of rows: aggregated in the sink against read-whole, time and memory.

    .venv/bin/python bench/bench_report.py [--rows 5000000] [--tags 400] [--days 4] [--runs 3]
        [--sinks lake,duck,pg] [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

Writes one tag-history dataset of ROWS samples (TAGS tags over DAYS days, 1 % bad quality)
into each sink once, then, alternating the two contenders run by run, computes the flow's
coverage (rows, bad quality, min/mean/max per tag and bucket) in a fresh process each:

* `in-sink`: what `historian report` does, `pipelines.report.coverage.tag_coverage` on the
  sink (the lake scanned batch by batch, one SQL GROUP BY in the warehouse);
* `read-whole`: the same numbers from the whole dataset read into memory first through
  `Sink.read` (what the report did before, and what it still does for other sinks).

Prints, per sink and contender, medians over `--runs` processes of: wall and CPU seconds
of the computation (CPU: this process's threads; a database server's own work is not in
it), rows/s, the process's peak RSS (imports included) and how much the peak grew
during the computation; the ratio compares medians of the same run. Both contenders must
give the same numbers. Then the whole `historian report` command on each sink (process
start and imports included: what a user waits for; wall and CPU seconds; 400 tags x 96 hourly buckets by
default) and the size of the page it writes.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import yaml

from connectors.schema import KIND_TAG_HISTORY, TAG_HISTORY_SCHEMA, frame_from_table
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.models import load_config
from pipelines.report.coverage import tag_coverage
from sinks.base import ChunkScope, Progress

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
DAY_MS = 86_400_000
CONTENDERS = ("in-sink", "read-whole")


def day_of_rows(day: int, tags: list[str], rows: int, rng: np.random.Generator) -> pa.Table:
    """One day of `rows` samples spread over `tags` on a regular grid, 1 % bad quality."""
    per_tag = rows // len(tags)
    step = DAY_MS // per_tag
    ts = np.tile(START_MS + day * DAY_MS + np.arange(per_tag, dtype=np.int64) * step, len(tags))
    count = len(ts)
    quality = np.where(rng.random(count) < 0.01, 0, 192).astype(np.int16)
    value = np.where(quality >= 192, rng.normal(50, 10, count), np.nan)
    return pa.table(
        {
            "node": pa.array(["node1"] * count).dictionary_encode().cast(pa.string()),
            "tag": pa.array(np.repeat(tags, per_tag)),
            "ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
            "seq": np.zeros(count, np.int16),
            "value": pa.array(value, from_pandas=True),
            "value_bool": pa.nulls(count, pa.bool_()),
            "value_str": pa.nulls(count, pa.string()),
            "quality": quality,
            "extra": np.zeros(count, np.int64),
        },
        schema=TAG_HISTORY_SCHEMA,
    )


def make_project(folder: Path, sinks: list[str], pg: tuple[str, str] | None) -> Path:
    definitions: dict[str, Any] = {
        "lake": {"type": "parquet", "url": "lake"},
        "duck": {"type": "sql", "url": "duckdb:///warehouse.duckdb"},
    }
    if pg is not None:
        definitions["pg"] = {"type": "sql", "url": pg[0], "schema": pg[1]}
    flows = {
        f"f_{name}": {"node": "n", "tags": {"paths": ["/x"]}, "start": "-1d", "sinks": [name]}
        for name in sinks
    }
    document = {
        "nodes": {"n": {"url": "http://127.0.0.1:9"}},
        "sinks": {k: v for k, v in definitions.items() if k in sinks},
        "flows": flows,
    }
    path = folder / "flows.yaml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def fill(path: Path, sinks: list[str], rows: int, tag_count: int, days: int) -> None:
    tags = [f"/Plant {t % 4}/Line {t % 9}/Sensor {t:04d}" for t in range(tag_count)]
    config = load_config(path, env={})
    with SinkSet(config, path.parent) as opened:
        for name in sinks:
            sink = opened.get(name)
            rng = np.random.default_rng(1)
            started = time.perf_counter()
            for day in range(days):
                table = day_of_rows(day, tags, rows // days, rng)
                window = Window.from_ms(START_MS + day * DAY_MS, START_MS + (day + 1) * DAY_MS)
                scope = ChunkScope(
                    f"f_{name}",
                    f"f_{name}",
                    KIND_TAG_HISTORY,
                    tuple(tags),
                    window,
                    f"{name}-{day}",
                    {"kind": KIND_TAG_HISTORY},
                    node="node1",
                )
                sink.write(scope, frame_from_table(table), table.num_rows)
            print(f"# {name}: {rows:,} rows written in {time.perf_counter() - started:.1f} s")


class ReadWhole:
    """The sink seen only through `read` and `progress`: the report's read-whole path."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def read(self, dataset: str, kind: str) -> Any:
        return self.sink.read(dataset, kind)

    def progress(self, flow: str) -> Progress:
        return self.sink.progress(flow)  # type: ignore[no-any-return]


def high_water_mb() -> float:
    """This process's peak RSS (VmHWM): unlike `ru_maxrss`, not inherited from the parent
    that forked it, which holds the generated rows."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("bench_report needs Linux (/proc/self/status)")


def measure(path: Path, sink_name: str, contender: str) -> dict[str, Any]:
    """In this (fresh) process: one coverage computation, its time and the peak RSS."""
    config = load_config(path, env={})
    flow = f"f_{sink_name}"
    with SinkSet(config, path.parent) as opened:
        sink = opened.get(sink_name)
        target = sink if contender == "in-sink" else ReadWhole(sink)
        before = high_water_mb()
        started, cpu = time.perf_counter(), time.process_time()
        cov = tag_coverage(target, flow, flow)  # type: ignore[arg-type]
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {
        "seconds": seconds,
        "cpu": cpu,
        "rows": int(cov.rows.sum()),
        "peak_rss_mb": high_water_mb(),
        "growth_mb": high_water_mb() - before,
        "digest": [int(cov.bad.sum()), round(float(np.nansum(cov.total)), 3), cov.grid.count],
    }


def run_child(path: Path, sink_name: str, contender: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--measure", sink_name, contender, "--config", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def report_command(path: Path, sink_name: str, runs: int) -> tuple[float, float, int]:
    """Median wall and CPU seconds (user + system) of `historian report` on the sink's flow,
    and the size of the page it writes."""
    historian = Path(sys.executable).with_name("historian")
    page = path.parent / f"{sink_name}.html"
    times, cpus = [], []
    for _ in range(runs):
        command = [str(historian), "report", f"f_{sink_name}", "--out", str(page)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        began = time.perf_counter()
        subprocess.run([*command, "--config", str(path)], capture_output=True, check=True)
        times.append(time.perf_counter() - began)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(times), statistics.median(cpus), page.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--tags", type=int, default=400)
    parser.add_argument("--days", type=int, default=4, help="days of history (one chunk each)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sinks", default="lake,duck,pg")
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--measure", nargs=2, metavar=("SINK", "CONTENDER"), help=argparse.SUPPRESS)
    parser.add_argument("--config", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.config, *args.measure)))
        return
    sinks = [s for s in args.sinks.split(",") if s]
    schema = f"bench_report_{uuid.uuid4().hex[:8]}"
    pg = (args.pg_url, schema) if "pg" in sinks else None
    with tempfile.TemporaryDirectory(prefix="bench-report-") as folder:
        path = make_project(Path(folder), sinks, pg)
        try:
            fill(path, sinks, args.rows, args.tags, args.days)
            print(
                "| sink | contender | wall s | CPU s | rows/s | peak RSS MB | peak growth MB "
                "| time / read-whole |"
            )
            print("|---|---|---:|---:|---:|---:|---:|---:|")
            for name in sinks:
                results: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
                for _ in range(args.runs):  # alternate: both see the same machine noise
                    for contender in CONTENDERS:
                        results[contender].append(run_child(path, name, contender))
                digests = {json.dumps(r["digest"]) for rs in results.values() for r in rs}
                assert len(digests) == 1, f"{name}: the contenders disagree: {digests}"
                wall = {c: statistics.median(r["seconds"] for r in rs) for c, rs in results.items()}
                for contender, measures in results.items():
                    rows = measures[0]["rows"]
                    rss = statistics.median(r["peak_rss_mb"] for r in measures)
                    growth = statistics.median(r["growth_mb"] for r in measures)
                    cpu = statistics.median(r["cpu"] for r in measures)
                    ratio = wall[contender] / wall["read-whole"]
                    print(
                        f"| {name} | {contender} | {wall[contender]:.2f} | {cpu:.2f} | "
                        f"{rows / wall[contender]:,.0f} | {rss:.0f} | {growth:.0f} | {ratio:.2f}x |"
                    )
            print()
            print("| sink | `historian report` wall s | CPU s | page KB |")
            print("|---|---:|---:|---:|")
            for name in sinks:
                seconds, cpu, size = report_command(path, name, args.runs)
                print(f"| {name} | {seconds:.2f} | {cpu:.2f} | {size / 1024:,.0f} |")
        finally:
            if pg is not None:
                import sqlalchemy as sa

                engine = sa.create_engine(args.pg_url)
                with engine.begin() as conn:
                    conn.execute(sa.text(f'drop schema if exists "{schema}" cascade'))
                engine.dispose()


if __name__ == "__main__":
    main()
