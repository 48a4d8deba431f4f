"""Plain-folder readers of a lake beside its writer: how often each kind of read fails.

    .venv/bin/python bench/lake_readers.py --seconds 30

The lake and the writer of tests/sinks/lake/test_lake_readers.py (a process that compacts,
then re-extracts in every shape, finding every file an hour old), with three readers
looping side by side in threads until it is done: pyarrow.dataset, DuckDB scanning that
dataset (`FROM <registered pyarrow dataset>`), and DuckDB's own
`read_parquet('<root>/hist/**/*.parquet')`. Prints reads and failures per reader, with
the failures' first lines. DuckDB's own reader opens a file again by its path while it
scans it (a handle per scan thread), so a file the writer replaced or emptied in that
instant is read with the metadata of the one before (`TProtocolException: Invalid data`,
`Prefetch registered for bytes outside file`); the other two read each file through one
handle. `--grace` sets the writer's reader grace (default: longer than the run, so no
0-row file is removed while the readers read).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb
import pyarrow as pa

from tests.sinks.lake import test_lake_readers as lake_readers


def readers(root: Path) -> dict[str, Callable[[], pa.Table]]:
    columns = ", ".join(lake_readers.KEY)
    glob = f"{root / 'hist'}/**/*.parquet"

    def native() -> pa.Table:
        query = f"select {columns} from read_parquet('{glob}', hive_partitioning=1)"
        return duckdb.connect().sql(query).to_arrow_table()

    return {
        "pyarrow.dataset": lambda: lake_readers.read_keys(root),
        "duckdb over pyarrow.dataset": lambda: lake_readers.duckdb_over_arrow(root),
        "duckdb read_parquet glob": native,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=30, help="the writer's time")
    parser.add_argument("--grace", type=float, default=3600.0, help="the writer's reader grace")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lake-readers-")) / "lake"
    root.mkdir()
    lake_readers.seed_lake(root)
    expected = lake_readers.distinct_keys(lake_readers.read_keys(root))
    stop = threading.Event()
    reads: Counter[str] = Counter()
    failures: dict[str, Counter[str]] = {}

    def loop(name: str, read: Callable[[], pa.Table]) -> None:
        failures[name] = Counter()
        while not stop.is_set():
            try:
                missed = lake_readers.distinct_keys(read()) < expected
            except Exception as exc:  # what a reader sees
                failures[name][f"{type(exc).__name__}: {exc}"[:90]] += 1
                continue
            reads[name] += 1
            reads[f"{name} missed rows"] += missed

    code = lake_readers.WRITER.format(
        repo=str(Path(__file__).resolve().parents[1]),
        tags=lake_readers.TAGS,
        root=str(root),
        seconds=args.seconds,
        target=lake_readers.TARGET,
        grace=args.grace,
    )
    threads = [threading.Thread(target=loop, args=item) for item in readers(root).items()]
    for thread in threads:
        thread.start()
    writer = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd()
    )
    stop.set()
    for thread in threads:
        thread.join()
    print(f"writer: {len(writer.stdout.split())} passes, exit {writer.returncode}")
    for name, found in failures.items():
        done = reads[name]
        print(
            f"{name:28} {done + sum(found.values()):5} reads, {sum(found.values())} failed, "
            f"{reads[f'{name} missed rows']} missed rows"
        )
        for line, count in found.most_common(4):
            print(f"    {count} x {line}")


if __name__ == "__main__":
    main()
