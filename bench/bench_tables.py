"""Table formats beside the plain lake: 2 M tag-history rows as 10 chunks of 200 k.

    .venv/bin/python bench/bench_tables.py [--rows 2000000] [--chunk 200000] [--runs 3]
        [--sinks parquet,delta,iceberg]

Each run of each sink is a fresh child process (its peak RSS is its own: VmHWM, imports
included; `base` is the RSS after imports, before the first chunk). The child builds
each chunk just before its write, off the clock (bench_sql's workload: 1,000 tags, one
hour per chunk), and writes every chunk into a new, empty sink through `Sink.write`
(the whole path: frame -> Arrow, scope check, the replace, the record of the chunk),
then writes one chunk again onto the full table (the replace a re-run does), then runs
`compact()`; the peak is taken then, and the whole table is read back and counted
after (a check, outside the figures). Sinks are alternated run by run so they see the same machine noise. Prints
medians: load rows/s, replace rows/s, compact seconds, peak and base RSS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SINKS = ("parquet", "delta", "iceberg")


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("bench_tables needs Linux (/proc/self/status)")


def make_sink(kind: str, root: Path) -> Any:
    if kind == "parquet":
        from sinks.lake.sink import ParquetLake

        return ParquetLake(str(root / "lake"))
    if kind == "delta":
        from sinks.tables.delta import DeltaLake

        return DeltaLake(str(root / "delta"))
    from sinks.tables.iceberg import IcebergLake

    return IcebergLake(str(root / "iceberg"))


def child(kind: str, rows: int, chunk_rows: int) -> dict[str, float]:
    """In this fresh process: load every chunk, replace one, compact; times and RSS.

    Each chunk's frame is built just before its write, off the clock, and dropped after:
    the peak is the sink's, with one chunk in hand (as in a run)."""
    from bench.bench_sql import chunk

    count = rows // chunk_rows
    base = rss_mb("VmRSS")
    with tempfile.TemporaryDirectory(prefix="bench_tables_") as folder:
        sink = make_sink(kind, Path(folder))
        sink.open()
        spent = 0.0
        for index in range(count):
            scope, frame = chunk(index, chunk_rows)
            started = time.perf_counter()
            sink.write(scope, frame, len(frame))
            spent += time.perf_counter() - started
            del frame
        load = count * chunk_rows / spent
        scope, frame = chunk(count // 2, chunk_rows)
        started = time.perf_counter()
        sink.write(scope, frame, len(frame))
        replace = len(frame) / (time.perf_counter() - started)
        del frame
        started = time.perf_counter()
        sink.compact(scope.dataset)
        compact_s = time.perf_counter() - started
        peak = rss_mb("VmHWM")
        assert len(sink.read(scope.dataset, scope.kind)) == count * chunk_rows
        sink.close()
    return {
        "load": load,
        "replace": replace,
        "compact_s": compact_s,
        "peak_mb": peak,
        "base_mb": base,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--chunk", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sinks", default=",".join(SINKS))
    parser.add_argument("--child", choices=SINKS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.rows, args.chunk)))
        return
    kinds = [k for k in args.sinks.split(",") if k]
    results: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for _ in range(args.runs):
        for kind in kinds:
            out = subprocess.run(
                [sys.executable, __file__, "--child", kind, "--rows", str(args.rows),
                 "--chunk", str(args.chunk)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            results[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    lake = (
        statistics.median(r["load"] for r in results.get("parquet", []))
        if ("parquet" in results)
        else None
    )
    print(f"{args.rows:,} rows in chunks of {args.chunk:,}, medians of {args.runs} runs")
    print(
        "| sink | load rows/s | vs lake | replace rows/s | compact s | peak RSS MB | base RSS MB |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind, runs in results.items():
        load = statistics.median(r["load"] for r in runs)
        ratio = f"{lake / load:.2f}x" if lake else "-"
        print(
            f"| {kind} | {load:,.0f} | {ratio} | "
            f"{statistics.median(r['replace'] for r in runs):,.0f} | "
            f"{statistics.median(r['compact_s'] for r in runs):.2f} | "
            f"{statistics.median(r['peak_mb'] for r in runs):.0f} | "
            f"{statistics.median(r['base_mb'] for r in runs):.0f} |"
        )


if __name__ == "__main__":
    main()
