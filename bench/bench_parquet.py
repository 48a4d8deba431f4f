"""Parquet lake write speed: 5 M tag-history rows as 50 chunks, and an overlapping rewrite.

    .venv/bin/python bench/bench_parquet.py [--rows 5000000] [--chunks 50] [--repeat 3]

Prints the median rows/s of writing every chunk into a fresh lake (frames are built before
the clock starts; each write includes sorting, partitioning, staging, the intent, the
renames and the marker), then the cost of rewrites: the same chunk again (idempotent
swap) and a chunk whose window straddles two earlier chunks (their files are read,
trimmed and rewritten before the new file lands), and of compacting the lake.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from connectors import schema
from connectors.timewindow import Window
from sinks.base import ChunkScope
from sinks.lake.sink import ParquetLake

START_MS = 1_709_251_200_000  # 2024-03-01T00:00:00Z
HOUR_MS = 3_600_000


def chunk_frame(tags: list[str], start_ms: int, end_ms: int, rows_per_tag: int) -> pd.DataFrame:
    """`rows_per_tag` evenly spaced samples per tag in [start, end), typed like the normaliser."""
    step = (end_ms - start_ms) // rows_per_tag
    ts = np.tile(start_ms + np.arange(rows_per_tag, dtype=np.int64) * step, len(tags))
    n = len(ts)
    rng = np.random.default_rng(start_ms % 1000 + len(tags))
    columns = {
        "node": pa.array(["node1"] * n, pa.string()),
        "tag": pa.array(np.repeat(np.array(tags, dtype=object), rows_per_tag), pa.string()),
        "ts": pa.array(ts, pa.int64()).cast(schema.TS_TYPE),
        "seq": pa.array(np.zeros(n, dtype=np.int16)),
        "value": pa.array(rng.normal(50, 10, n)),
        "value_bool": pa.nulls(n, pa.bool_()),
        "value_str": pa.nulls(n, pa.string()),
        "quality": pa.array(np.full(n, 192, dtype=np.int16)),
        "extra": pa.nulls(n, pa.int64()),
    }
    return schema.frame_from_table(pa.table(columns, schema=schema.TAG_HISTORY_SCHEMA))


def scope(tags: list[str], start_ms: int, end_ms: int, chunk_id: str) -> ChunkScope:
    return ChunkScope(
        flow="bench",
        dataset="hist",
        kind=schema.KIND_TAG_HISTORY,
        members=tuple(tags),
        window=Window.from_ms(start_ms, end_ms),
        chunk_id=chunk_id,
        attrs={"kind": "tag_history", "mode": "raw"},
        node="node1",
    )


def timed(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batches", type=int, default=5, help="tag batches per window")
    parser.add_argument("--tags-per-batch", type=int, default=100)
    args = parser.parse_args()

    windows = max(1, args.chunks // args.batches)
    rows_per_chunk = args.rows // (windows * args.batches)
    rows_per_tag = max(1, rows_per_chunk // args.tags_per_batch)
    batches = [
        [f"/site/area{b}/tag {t:04d}.pv" for t in range(args.tags_per_batch)]
        for b in range(args.batches)
    ]
    chunks = []
    for w in range(windows):
        start, end = START_MS + w * HOUR_MS, START_MS + (w + 1) * HOUR_MS
        for b, tags in enumerate(batches):
            frame = chunk_frame(tags, start, end, rows_per_tag)
            chunks.append((scope(tags, start, end, f"w{w}b{b}"), frame))
    total = sum(len(frame) for _, frame in chunks)
    print(
        f"{total:,} rows as {len(chunks)} chunks "
        f"({windows} windows x {args.batches} batches of {args.tags_per_batch} tags)"
    )

    work = Path(tempfile.mkdtemp(prefix="bench-parquet-"))
    try:
        seconds = []
        for run in range(args.repeat):
            root = work / f"run{run}"
            lake = ParquetLake(str(root))
            lake.open()
            seconds.append(
                timed(lambda lake=lake: [lake.write(s, f, len(f)) for s, f in chunks])  # type: ignore[misc]
            )
            size = sum(p.stat().st_size for p in (root / "hist").rglob("*.parquet"))
            print(f"  run {run + 1}: {seconds[-1]:.2f} s, {total / seconds[-1]:,.0f} rows/s")
        median = statistics.median(seconds)
        print(
            f"write: median {median:.2f} s = {total / median:,.0f} rows/s; "
            f"{size / 1e6:.1f} MB on disk ({size / total:.1f} B/row, zstd)"
        )

        root = work / "run0"
        lake = ParquetLake(str(root))
        lake.open()
        same_scope, same_frame = chunks[0]
        swap = [
            timed(lambda: lake.write(same_scope, same_frame, len(same_frame))) for _ in range(3)
        ]
        print(
            f"rewrite of the same chunk ({len(same_frame):,} rows): "
            f"median {statistics.median(swap) * 1000:.0f} ms"
        )

        tags = batches[0]
        start, end = START_MS + HOUR_MS // 2, START_MS + 3 * HOUR_MS // 2
        straddle = chunk_frame(tags, start, end, rows_per_tag)
        cost = timed(
            lambda: lake.write(scope(tags, start, end, "straddle"), straddle, len(straddle))
        )
        print(
            f"overlapping rewrite ({len(straddle):,} rows, window across 2 earlier chunks, "
            f"both trimmed): {cost * 1000:.0f} ms"
        )
        print(f"  vs. a plain chunk write: {median / len(chunks) * 1000:.0f} ms")
        began = time.perf_counter()
        progress = lake.progress("bench")
        print(
            f"progress() over {len(lake.chunk_log('bench', 10_000))} markers: "
            f"{(time.perf_counter() - began) * 1000:.1f} ms ({len(progress.completed)} members)"
        )
        began = time.perf_counter()
        merged = lake.compact("hist", min_rows=lake.target_file_rows)
        compact_s = time.perf_counter() - began
        print(
            f"compact (files < {lake.target_file_rows:,} rows into ~{lake.target_file_rows:,}): "
            f"merged {merged} files in {compact_s:.2f} s"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
