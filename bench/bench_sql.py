"""SQL warehouse load speed: 2 M tag-history rows as 10 chunks of 200 k, PostgreSQL and DuckDB.

    .venv/bin/python bench/bench_sql.py [--rows 2000000] [--chunk 200000] [--repeat 3]
        [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test] [--no-duckdb] [--formats]

Frames are built before the clock starts. Each repeat writes every chunk into a fresh
warehouse (a new PostgreSQL schema, a new DuckDB file) through `SqlWarehouse.write`, as
many chunks at once as the sink's `write_concurrency` (what the runner does): the
whole path, i.e. frame -> Arrow, scope check, encoding, one transaction with staging,
delete, insert, chunk record and progress merge. Then one chunk is written again onto
the full table (the idempotent replace a re-run does). Prints medians in rows/s.
`--formats` also times the bare COPY of one chunk into an unindexed temporary table in
each candidate format (vectorised binary, pyarrow CSV, psycopg `write_row`).
`--against REV` loads the sinks/ package of git revision REV (e.g. c01bdc2, before the
narrow layout) as `sinks_REV` and alternates it with the working tree's, run by run, so
both see the same machine noise; it prints both medians and their ratio.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.revisions import sinks_module_at
from connectors import schema
from connectors.timewindow import Window
from sinks.base import ChunkScope
from sinks.sql.pg_copy import encode_binary_copy
from sinks.sql.warehouse import SqlWarehouse

START_MS = 1_709_251_200_000  # 2024-03-01T00:00:00Z
HOUR_MS = 3_600_000
TAGS = 1000
ATTRS = {"kind": schema.KIND_TAG_HISTORY, "node": "node1", "mode": "raw"}


def chunk(index: int, rows: int) -> tuple[ChunkScope, pd.DataFrame]:
    """One hour of `rows` samples spread over TAGS tags, typed like the normaliser's output."""
    tags = [f"Plant {t % 7}/Line {t % 13}/Sensor {t:04d}.PV" for t in range(TAGS)]
    per_tag = rows // TAGS
    start = START_MS + index * HOUR_MS
    ts = np.tile(start + np.arange(per_tag, dtype=np.int64) * (HOUR_MS // per_tag), TAGS)
    n = len(ts)
    rng = np.random.default_rng(index)
    columns = {
        "node": pa.array(["node1"] * n, pa.string()),
        "tag": pa.array(np.repeat(np.array(tags, dtype=object), per_tag), pa.string()),
        "ts": pa.array(ts).cast(schema.TS_TYPE),
        "seq": pa.array(np.zeros(n, dtype=np.int16)),
        "value": pa.array(rng.normal(50, 10, n)),
        "value_bool": pa.nulls(n, pa.bool_()),
        "value_str": pa.nulls(n, pa.string()),
        "quality": pa.array(np.full(n, 192, dtype=np.int16)),
        "extra": pa.nulls(n, pa.int64()),
    }
    frame = schema.frame_from_table(pa.table(columns, schema=schema.TAG_HISTORY_SCHEMA))
    window = Window.from_ms(start, start + HOUR_MS)
    scope = ChunkScope(
        "bench", "hist", schema.KIND_TAG_HISTORY, tuple(tags), window, f"c{index}", ATTRS,
        node="node1",
    )  # fmt: skip
    return scope, frame


def run_once(
    make: Callable[[], tuple[SqlWarehouse, Callable[[], None]]],
    chunks: list[tuple[ChunkScope, pd.DataFrame]],
) -> tuple[float, float]:
    """(rows/s loading every chunk, rows/s replacing one chunk on the full table)."""
    sink, cleanup = make()
    try:
        sink.open()
        total = sum(len(frame) for _, frame in chunks)
        # As many chunks at once as the runner writes to this sink (PostgreSQL: 2).
        writers = sink.write_concurrency
        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=writers) as pool:
            list(pool.map(lambda c: sink.write(c[0], c[1], len(c[1])), chunks))
        load = total / (time.perf_counter() - started)
        scope, frame = chunks[len(chunks) // 2]
        started = time.perf_counter()
        sink.write(scope, frame, len(frame))
        replace = len(frame) / (time.perf_counter() - started)
        return load, replace
    finally:
        sink.close()
        cleanup()


def sinks_at(revision: str) -> type[SqlWarehouse]:
    """SqlWarehouse of sinks/ at a git revision, imported as package `sinks_<revision>`."""
    warehouse: type[SqlWarehouse] = sinks_module_at(revision, "sql.warehouse", "sql").SqlWarehouse
    return warehouse


def postgres(
    url: str, kind: type[SqlWarehouse] = SqlWarehouse
) -> Callable[[], tuple[SqlWarehouse, Callable[[], None]]]:
    def make() -> tuple[SqlWarehouse, Callable[[], None]]:
        name = f"bench_{uuid.uuid4().hex[:10]}"

        def drop() -> None:
            engine = sa.create_engine(url)
            with engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
            engine.dispose()

        return kind(url, schema=name, connect_args={"application_name": "historian-bench"}), drop

    return make


def duckdb_file() -> tuple[SqlWarehouse, Callable[[], None]]:
    folder = tempfile.mkdtemp(prefix="bench-duck-")

    def remove() -> None:
        for path in Path(folder).glob("*"):
            path.unlink()
        os.rmdir(folder)

    return SqlWarehouse(f"duckdb:///{folder}/w.duckdb"), remove


def copy_formats(url: str, frame: pd.DataFrame, repeat: int) -> None:
    """Bare COPY of one chunk into an unindexed temp table, per candidate format."""
    table = schema.table_from_frame(frame, schema.KIND_TAG_HISTORY)
    cols = ", ".join(table.column_names)
    types = ["text", "text", "timestamptz", "int2", "float8", "bool", "text", "int2", "int8"]
    engine = sa.create_engine(url)

    def binary(cursor: object, copy: object) -> None:
        payload = memoryview(encode_binary_copy(table))
        for offset in range(0, len(payload), 1 << 20):
            copy.write(payload[offset : offset + (1 << 20)])  # type: ignore[attr-defined]

    def csv(cursor: object, copy: object) -> None:
        buffer = io.BytesIO()
        pacsv.write_csv(
            table, buffer, pacsv.WriteOptions(include_header=False, quoting_style="all_valid")
        )
        view = buffer.getbuffer()
        for offset in range(0, len(view), 1 << 20):
            copy.write(view[offset : offset + (1 << 20)])  # type: ignore[attr-defined]

    def write_row(cursor: object, copy: object) -> None:
        copy.set_types(types)  # type: ignore[attr-defined]
        for row in zip(*(c.to_pylist() for c in table.columns), strict=True):
            copy.write_row(row)  # type: ignore[attr-defined]

    candidates = {
        "binary (vectorised, used)": (binary, "binary"),
        "csv (pyarrow)": (csv, "csv"),
        "binary (write_row)": (write_row, "binary"),
    }
    for label, (feed, fmt) in candidates.items():
        rates = []
        for _ in range(repeat):
            with engine.connect() as conn:
                raw = conn.connection.dbapi_connection
                assert raw is not None
                with raw.cursor() as cursor:
                    cursor.execute(
                        f"CREATE TEMP TABLE fmt ({', '.join(f'{n} {t}' for n, t in zip(table.column_names, types, strict=True))})"
                    )
                    started = time.perf_counter()
                    with cursor.copy(f"COPY fmt ({cols}) FROM STDIN (FORMAT {fmt})") as copy:
                        feed(cursor, copy)
                    rates.append(table.num_rows / (time.perf_counter() - started))
                conn.rollback()
        print(f"  COPY {label:<28} {statistics.median(rates):>12,.0f} rows/s")
    engine.dispose()


def compare_postgres(
    args: argparse.Namespace, chunks: list[tuple[ChunkScope, pd.DataFrame]]
) -> None:
    """This tree vs `--against REV` on PostgreSQL, alternating within every repeat."""
    contenders = {
        "this tree": postgres(args.pg_url),
        args.against: postgres(args.pg_url, sinks_at(args.against)),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for _ in range(args.repeat):
        for name, make in contenders.items():
            results[name].append(run_once(make, chunks))
    loads = {name: statistics.median(r[0] for r in runs) for name, runs in results.items()}
    for name, runs in results.items():
        spread = ", ".join(f"{r[0]:,.0f}" for r in runs)
        replace = statistics.median(r[1] for r in runs)
        print(
            f"PostgreSQL {name:<10} load {loads[name]:>10,.0f} rows/s  replace "
            f"{replace:>10,.0f} rows/s  (load runs: {spread})"
        )
    print(f"ratio load this tree / {args.against}: {loads['this tree'] / loads[args.against]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--chunk", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "HISTORIAN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
        ),
    )
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-duckdb", action="store_true")
    parser.add_argument("--formats", action="store_true", help="also compare COPY formats")
    parser.add_argument("--against", metavar="REV", help="alternate with sinks/ at this revision")
    args = parser.parse_args()

    chunks = [chunk(i, args.chunk) for i in range(max(1, args.rows // args.chunk))]
    total = sum(len(f) for _, f in chunks)
    print(
        f"{total:,} tag-history rows in {len(chunks)} chunks of {len(chunks[0][1]):,}; "
        f"median of {args.repeat}; {os.cpu_count()} CPUs"
    )
    if args.against and not args.no_postgres:
        compare_postgres(args, chunks)
        return
    targets: list[tuple[str, Callable[[], tuple[SqlWarehouse, Callable[[], None]]]]] = []
    if not args.no_postgres:
        targets.append(("PostgreSQL", postgres(args.pg_url)))
    if not args.no_duckdb:
        targets.append(("DuckDB", duckdb_file))
    for label, make in targets:
        results = [run_once(make, chunks) for _ in range(args.repeat)]
        load = statistics.median(r[0] for r in results)
        replace = statistics.median(r[1] for r in results)
        spread = ", ".join(f"{r[0]:,.0f}" for r in results)
        print(f"{label:<11} load    {load:>12,.0f} rows/s   (runs: {spread})")
        print(
            f"{label:<11} replace {replace:>12,.0f} rows/s   (one chunk again onto the full table)"
        )
    if args.formats and not args.no_postgres:
        print("COPY formats, one chunk into an unindexed temporary table:")
        copy_formats(args.pg_url, chunks[0][1], args.repeat)


if __name__ == "__main__":
    main()
