"""What `historian verify` costs on a lake holding a year of an hourly 10,000-tag flow.

The lake's check reads each committed chunk's marker and each data file's footer, never
its rows (`sinks.verify.lake`), so its cost grows with chunks and files, not with rows.
The lake built here has what a year of hourly runs leaves at the worst: `--hours` chunk
markers (8,760: one chunk of all `--tags` tags per hourly run) and a data file per chunk
(no compaction: a chunk of 10,000 tags at one sample a minute is 600,000 rows, above the
size compaction merges). Each file holds few rows but the footer of a 600,000-row file:
three row groups (256 Ki rows each) of the nine tag-history columns, with the owner and
dataset metadata the lake writes - what a footer read costs does not depend on the rows.
Markers name their 10,000 members by digest, as the lake's do.

Timed, each in a fresh sink object (a new `historian verify` process, the snapshot the
runs saved on disk), median of `--runs`:

* year: every chunk of the year (`historian verify f`);
* day: the chunks of the last day (`historian verify f --start -1d`), a daily check's scope.

`--warehouse URL` (PostgreSQL or DuckDB) times a warehouse instead, whose check counts the
rows (one GROUP BY over the checked range): a year of `--warehouse-tags` tags at one
sample an hour, loaded as daily chunks into a schema of its own (dropped after). Its cost
follows the rows, so 1,000 tags (8.76 M rows) scale tenfold to 10,000.

    .venv/bin/python bench/verify.py [--tags 10000] [--hours 8760] [--runs 3]
    .venv/bin/python bench/verify.py --warehouse postgresql+psycopg://postgres@127.0.0.1/test
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa

from connectors import schema
from connectors.timewindow import Window
from sinks.base import ChunkScope, Verified
from sinks.lake.files import DATASET_KEY, OWNERS_KEY
from sinks.lake.sink import ParquetLake
from sinks.lake.state import LakeState, new_marker
from sinks.sql.warehouse import SqlWarehouse
from sinks.store.layout import node_dir
from sinks.store.objects import LakeStore

T0 = datetime(2025, 1, 1, tzinfo=UTC)
ROW_GROUPS = 3  # a 600,000-row chunk file at 256 Ki rows per group


def hour(index: int) -> Window:
    return Window(T0 + timedelta(hours=index), T0 + timedelta(hours=index + 1))


def chunk_file(members: list[str], window: Window, chunk: str) -> pa.Table:
    """A few rows per row group, with the lake's file metadata (owners, dataset)."""
    count = 4 * ROW_GROUPS
    columns = {
        "node": pa.array(["n"] * count),
        "tag": pa.array(sorted(members[i * 997 % len(members)] for i in range(count))),
        "ts": pa.array([window.start_ms + i * 60_000 for i in range(count)], pa.int64()).cast(
            schema.TS_TYPE
        ),
        "seq": pa.array([0] * count, pa.int16()),
        "value": pa.array([float(i) for i in range(count)]),
        "value_bool": pa.array([None] * count, pa.bool_()),
        "value_str": pa.array([None] * count, pa.string()),
        "quality": pa.array([192] * count, pa.int16()),
        "extra": pa.array([None] * count, pa.int64()),
    }
    table = pa.table(columns, schema=schema.TAG_HISTORY_SCHEMA)
    about = {"dataset": "d", "kind": schema.KIND_TAG_HISTORY, "attrs": {"mode": "raw"}}
    metadata = {DATASET_KEY: orjson.dumps(about), OWNERS_KEY: orjson.dumps([["f", chunk]])}
    return table.replace_schema_metadata(metadata)


def build(root: str, tags: int, hours: int) -> None:
    """The year's files and markers, and the progress snapshot the runs leave."""
    store = LakeStore(root)
    state = LakeState(store)
    members = [f"/Plant A/Line {i // 100}/Débit {i:05d}" for i in range(tags)]
    for index in range(hours):
        window = hour(index)
        chunk = f"c{index:05d}"
        rel = f"{node_dir('n')}/date={window.start:%Y-%m-%d}/part-{chunk}.parquet"
        table = chunk_file(members, window, chunk)
        path = Path(store.path("d", rel))
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=table.num_rows // ROW_GROUPS)
        marker = new_marker(
            flow="f", dataset="d", kind=schema.KIND_TAG_HISTORY, chunk_id=chunk, window=window,
            members=members, files=[{"path": rel, "rows": table.num_rows}],
            rows_fetched=table.num_rows, rows_committed=table.num_rows,
        )  # fmt: skip
        state.write_marker(marker)
        if index % 24 == 23:  # the snapshot folded as the runs fold it, a few at a time
            state.progress("f")
    state.progress("f")


def timed(step: Callable[[], Verified]) -> tuple[float, Verified]:
    began = time.perf_counter()
    result = step()
    return time.perf_counter() - began, result


def verify_in_fresh_sink(root: str, window: Window | None) -> Verified:
    """What `historian verify` does in a new process: open the lake, check, close."""
    lake = ParquetLake(root)
    try:
        return lake.verify("f", "n", window)
    finally:
        lake.close()


def day_chunk(members: list[str], day: int) -> tuple[ChunkScope, pa.Table]:
    """A day of hourly samples of every member, as one chunk."""
    start = T0 + timedelta(days=day)
    window = Window(start, start + timedelta(days=1))
    stamps = np.arange(window.start_ms, window.end_ms, 3_600_000, dtype=np.int64)
    count = len(stamps) * len(members)
    columns = {
        "node": pa.array(["n"] * count),
        "tag": pa.array(np.repeat(np.array(members, dtype=object), len(stamps)), pa.string()),
        "ts": pa.array(np.tile(stamps, len(members))).cast(schema.TS_TYPE),
        "seq": pa.array(np.zeros(count, dtype=np.int16)),
        "value": pa.array(np.arange(count, dtype=np.float64)),
        "value_bool": pa.nulls(count, pa.bool_()),
        "value_str": pa.nulls(count, pa.string()),
        "quality": pa.array(np.full(count, 192, dtype=np.int16)),
        "extra": pa.nulls(count, pa.int64()),
    }
    attrs = {"kind": schema.KIND_TAG_HISTORY, "mode": "raw"}
    scope = ChunkScope(
        "f", "d", schema.KIND_TAG_HISTORY, tuple(members), window, f"d{day:03d}", attrs, node="n"
    )
    return scope, pa.table(columns, schema=schema.TAG_HISTORY_SCHEMA)


def bench_warehouse(url: str, tags: int, days: int, runs: int) -> None:
    """Load a year into a fresh schema, time verify of the year and of its last day."""
    name = f"bench_verify_{uuid.uuid4().hex[:8]}"
    sink = SqlWarehouse(url, schema=None if url.startswith("duckdb") else name)
    sink.open()
    try:
        members = [f"/Plant A/Line {i // 100}/Débit {i:05d}" for i in range(tags)]
        began = time.perf_counter()
        for day in range(days):
            scope, table = day_chunk(members, day)
            sink.write(scope, table, table.num_rows)
        print(f"loaded {days * 24 * tags:,} rows in {time.perf_counter() - began:.0f} s")
        last = Window(T0 + timedelta(days=days - 1), T0 + timedelta(days=days))
        for label, window in {"year": None, "day": last}.items():
            times = []
            for _ in range(runs):
                took, found = timed(lambda w=window: sink.verify("f", "n", w))  # type: ignore[misc]
                times.append(took)
            print(
                f"  {label:5} {found.chunks:6,} chunks, {len(found.damages)} damages: "
                f"{statistics.median(times):7.2f} s (median of {runs})"
            )
    finally:
        if not url.startswith("duckdb"):
            with sink.engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        sink.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tags", type=int, default=10_000)
    parser.add_argument("--hours", type=int, default=8_760)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warehouse", help="a warehouse URL to time instead of a lake")
    parser.add_argument("--warehouse-tags", type=int, default=1_000)
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args()
    if args.warehouse:
        bench_warehouse(args.warehouse, args.warehouse_tags, args.days, args.runs)
        return
    root = tempfile.mkdtemp(prefix="bench-verify-")
    try:
        began = time.perf_counter()
        build(root, args.tags, args.hours)
        print(f"built {args.hours:,} chunks in {time.perf_counter() - began:.0f} s")
        last_day = Window(hour(args.hours - 24).start, hour(args.hours - 1).end)
        scopes: dict[str, Window | None] = {"year": None, "day": last_day}
        for name, window in scopes.items():
            times = []
            for _ in range(args.runs):
                took, found = timed(lambda w=window: verify_in_fresh_sink(root, w))  # type: ignore[misc]
                times.append(took)
            print(
                f"  {name:5} {found.chunks:6,} chunks, {len(found.damages)} damages: "
                f"{statistics.median(times):7.2f} s (median of {args.runs})"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
