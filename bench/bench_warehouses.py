"""Warehouse loaders side by side: PostgreSQL binary COPY vs ADBC, MariaDB vs pandas to_sql.

    .venv/bin/python bench/bench_warehouses.py [--rows 2000000] [--chunk 200000] [--repeat 3]
        [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]
        [--mariadb-url mysql+pymysql://root@127.0.0.1:3306/test] [--only NAME ...]

The 2 M-row raw tag-history workload of bench/bench_sql.py (1000 tags, chunks of one
hour). Every contender runs in a child process of its own (its peak RSS is that process's
`ru_maxrss`, the chunks it loads included), and the contenders take turns within each
repeat, so all of them see the same machine noise. Medians in rows/s.

* `pg-copy` / `pg-adbc`: the bare load. The same narrow Arrow chunks (series_id, ts, ...,
  as `SqlWarehouse` hands them to its loader) are appended to the same keyed table
  `historian_rows_<dataset>` made by the sink, one transaction per chunk, on one
  connection: by `sinks.sql.load.copy_binary` (our vectorised binary COPY) or by
  `adbc_driver_postgresql`'s `adbc_ingest` (Arrow's own COPY). Both bare: the sink's
  delete, chunk record and progress merge are left out of both.
* `pg-sink`: the whole `SqlWarehouse.write` path (two chunks at once, as the runner).
* `mariadb-sink`: the whole `SqlWarehouse.write` path into MariaDB (LOAD DATA LOCAL INFILE).
* `mariadb-to_sql`: pandas `DataFrame.to_sql` (SQLAlchemy + PyMySQL executemany, 10,000
  rows a batch) appending the same frames to a table of its own (pandas makes it: no
  key): the baseline a hand-written loader would be, on `--to-sql-rows` rows (its rate
  does not depend on the table's size: no index). It only inserts (no key to keep, no
  delete, no state), which favours it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_sql import chunk
from connectors import schema
from connectors.timewindow import Window
from sinks.base import ChunkScope
from sinks.sql.load import copy_binary
from sinks.sql.rows import typed_table
from sinks.sql.warehouse import SqlWarehouse

CONTENDERS = ("pg-copy", "pg-adbc", "pg-sink", "mariadb-sink", "mariadb-to_sql")


@contextmanager
def fresh_sink(url: str) -> Iterator[SqlWarehouse]:
    """An open warehouse in a new schema (PostgreSQL) or database (MariaDB), dropped after."""
    name = f"bench_{uuid.uuid4().hex[:10]}"
    sink = SqlWarehouse(url, schema=name)
    sink.open()
    try:
        yield sink
    finally:
        sink.close()
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            if url.startswith("postgresql"):
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
            else:
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
        engine.dispose()


def made_table(sink: SqlWarehouse, scope: ChunkScope) -> None:
    """The dataset's table as the sink makes it (an empty chunk creates it)."""
    empty = ChunkScope(
        "made",
        scope.dataset,
        scope.kind,
        scope.members,
        Window.from_ms(0, 1),
        "made",
        scope.attrs,
        node=scope.node,
    )
    sink.write(empty, schema.empty_frame(scope.kind), 0)


def timed(total: int, load: Callable[[], None]) -> float:
    started = time.perf_counter()
    load()
    return total / (time.perf_counter() - started)


def pg_bare(url: str, chunks: list[tuple[ChunkScope, pd.DataFrame]], adbc: bool) -> float:
    with fresh_sink(url) as sink:
        rate = _pg_bare(sink, chunks, adbc)
        with sink.engine.connect() as conn:
            target = sink._ensure_dataset(chunks[0][0].dataset, chunks[0][0].kind).target
            held = conn.exec_driver_sql(f"SELECT count(*) FROM {target}").scalar()
        if held != sum(len(frame) for _, frame in chunks):
            sys.exit(f"{'ADBC' if adbc else 'COPY'} loaded {held} rows, not all")
        return rate


def _pg_bare(
    sink: SqlWarehouse, chunks: list[tuple[ChunkScope, pd.DataFrame]], adbc: bool
) -> float:
    made_table(sink, chunks[0][0])
    storage = sink._ensure_dataset(chunks[0][0].dataset, chunks[0][0].kind)
    tables = [sink._narrow(typed_table(frame, scope.kind)) for scope, frame in chunks]
    total = sum(t.num_rows for t in tables)
    if not adbc:

        def load() -> None:
            for table in tables:
                with sink.engine.begin() as conn:
                    copy_binary(conn, storage.target, table)

        return timed(total, load)
    import adbc_driver_postgresql.dbapi as adbc_dbapi

    plain = sink.url.set(drivername="postgresql").render_as_string(hide_password=False)
    table_name = storage.target.split(".")[-1].strip('"')
    with adbc_dbapi.connect(plain) as conn:

        def load() -> None:
            for table in tables:
                with conn.cursor() as cursor:
                    cursor.adbc_ingest(table_name, table, mode="append", db_schema_name=sink.schema)
                conn.commit()

        return timed(total, load)


def sink_path(url: str, chunks: list[tuple[ChunkScope, pd.DataFrame]]) -> float:
    with fresh_sink(url) as sink:
        total = sum(len(frame) for _, frame in chunks)

        def load() -> None:
            with ThreadPoolExecutor(max_workers=sink.write_concurrency) as pool:
                list(pool.map(lambda c: sink.write(c[0], c[1], len(c[1])), chunks))

        return timed(total, load)


def to_sql(url: str, chunks: list[tuple[ChunkScope, pd.DataFrame]]) -> float:
    with fresh_sink(url) as sink:
        # What a hand-written loader hands pandas: plain numpy/object columns, naive UTC.
        frames = []
        for _, frame in chunks:
            plain = frame.astype(object).where(frame.notna(), None)
            plain["ts"] = frame["ts"].dt.tz_convert("UTC").dt.tz_localize(None).astype(object)
            frames.append(plain)
        total = sum(len(frame) for frame in frames)
        table = "hist_to_sql"

        def load() -> None:
            for frame in frames:
                with sink.engine.begin() as conn:
                    frame.to_sql(
                        table, conn, schema=sink.schema, if_exists="append", index=False,
                        chunksize=10_000,
                    )  # fmt: skip

        return timed(total, load)


def child(args: argparse.Namespace) -> None:
    chunks = [chunk(i, args.chunk) for i in range(max(1, args.rows // args.chunk))]
    name = args.child
    if name == "pg-copy":
        rate = pg_bare(args.pg_url, chunks, adbc=False)
    elif name == "pg-adbc":
        rate = pg_bare(args.pg_url, chunks, adbc=True)
    elif name == "pg-sink":
        rate = sink_path(args.pg_url, chunks)
    elif name == "mariadb-sink":
        rate = sink_path(args.mariadb_url, chunks)
    else:
        rate = to_sql(args.mariadb_url, chunks)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rate": rate, "peak_mb": peak_mb}))


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
    parser.add_argument(
        "--mariadb-url",
        default=os.environ.get(
            "HISTORIAN_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
        ),
    )
    parser.add_argument(
        "--to-sql-rows",
        type=int,
        default=400_000,
        help="rows for the to_sql baseline (at ~10k rows/s, 2 M would take minutes a run)",
    )
    parser.add_argument("--only", nargs="*", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print(
        f"{args.rows:,} tag-history rows in chunks of {args.chunk:,}; median of {args.repeat}; "
        f"{os.cpu_count()} CPUs; each contender in a child process, taking turns; "
        f"mariadb-to_sql on {args.to_sql_rows:,} rows",
        flush=True,
    )
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in args.only}
    for _ in range(args.repeat):
        for name in args.only:
            rows = args.to_sql_rows if name == "mariadb-to_sql" else args.rows
            command = [sys.executable, __file__, "--child", name, "--rows", str(rows)]
            command += ["--chunk", str(args.chunk), "--pg-url", args.pg_url]
            command += ["--mariadb-url", args.mariadb_url]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{name} failed: {done.stderr.strip()[-2000:]}")
            results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"  {name}: {results[name][-1]['rate']:,.0f} rows/s", flush=True)
    medians = {name: statistics.median(r["rate"] for r in runs) for name, runs in results.items()}
    for name, runs in results.items():
        spread = ", ".join(f"{r['rate']:,.0f}" for r in runs)
        peak = max(r["peak_mb"] for r in runs)
        print(f"{name:<15} {medians[name]:>12,.0f} rows/s  peak RSS {peak:>5.0f} MB  ({spread})")
    for fast, slow in (("pg-copy", "pg-adbc"), ("mariadb-sink", "mariadb-to_sql")):
        if fast in medians and slow in medians:
            print(f"{fast} / {slow}: {medians[fast] / medians[slow]:.2f}x")


if __name__ == "__main__":
    main()
