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

`--one-file` shows the cause alone: one 400,000-row file (20 row groups) beside a small
one, its path replaced every few milliseconds, by a rename of a hard link, with another
file of other row groups or a 0-row file, while the readers read the folder.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
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


def one_file(root: Path, stop: threading.Event) -> None:
    """Replace `root/hist/f.parquet` (each time by a rename) until `stop`."""
    import pyarrow.parquet as pq

    folder = root / "hist"
    folder.mkdir()
    versions = []
    for index, (rows, group) in enumerate([(400_000, 20_000), (300_000, 30_000), (0, 1)]):
        table = pa.table({"k": pa.array(range(rows)), "s": [f"x{i * index}" for i in range(rows)]})
        pq.write_table(table, root / f"v{index}.parquet", row_group_size=group)
        versions.append(root / f"v{index}.parquet")
    pq.write_table(pa.table({"k": [1], "s": ["a"]}), folder / "a.parquet")
    os.link(versions[0], folder / "f.parquet")
    swaps = 0
    while not stop.wait(0.003):
        swaps += 1
        temp = folder / f".f.{swaps}.tmp"
        os.link(versions[swaps % 3], temp)
        os.replace(temp, folder / "f.parquet")
    print(f"one file: replaced {swaps} times")


def one_file_readers(root: Path) -> dict[str, Callable[[], pa.Table]]:
    import pyarrow.dataset as pads

    folder = root / "hist"

    def over_arrow() -> pa.Table:
        con = duckdb.connect()
        con.register("lake", pads.dataset(str(folder), format="parquet"))
        return con.sql("select count(*), max(s) from lake").to_arrow_table()

    return {
        "pyarrow.dataset": lambda: pads.dataset(str(folder), format="parquet").to_table(),
        "duckdb over pyarrow.dataset": over_arrow,
        "duckdb read_parquet glob": lambda: (
            duckdb.connect()
            .sql(f"select count(*), max(s) from read_parquet('{folder}/*.parquet')")
            .to_arrow_table()
        ),
    }


class Loops:
    """Readers looping in threads until `stop`: reads, failures, reads that missed rows."""

    def __init__(self, readers: dict[str, Callable[[], pa.Table]], expected: int) -> None:
        self.stop = threading.Event()
        self.expected = expected
        self.reads: Counter[str] = Counter()
        self.failures: dict[str, Counter[str]] = {name: Counter() for name in readers}
        self.threads = [threading.Thread(target=self.loop, args=item) for item in readers.items()]
        for thread in self.threads:
            thread.start()

    def loop(self, name: str, read: Callable[[], pa.Table]) -> None:
        while not self.stop.is_set():
            try:
                table = read()
            except Exception as exc:  # what a reader sees
                self.failures[name][f"{type(exc).__name__}: {exc}"[:90]] += 1
                continue
            self.reads[name] += 1
            if self.expected:
                self.reads[f"{name} missed"] += lake_readers.distinct_keys(table) < self.expected

    def report(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()
        for name, found in self.failures.items():
            failed = sum(found.values())
            print(
                f"{name:28} {self.reads[name] + failed:5} reads, {failed} failed, "
                f"{self.reads[f'{name} missed']} missed rows"
            )
            for line, count in found.most_common(4):
                print(f"    {count} x {line}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=30, help="the writer's time")
    parser.add_argument("--grace", type=float, default=3600.0, help="the writer's reader grace")
    parser.add_argument("--one-file", action="store_true", help="one file replaced, alone")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lake-readers-")) / "lake"
    root.mkdir()
    try:
        measure(args, root)
    finally:
        shutil.rmtree(root.parent, ignore_errors=True)


def measure(args: argparse.Namespace, root: Path) -> None:
    if args.one_file:
        stopped = threading.Event()
        swapper = threading.Thread(target=one_file, args=(root, stopped))
        swapper.start()
        while not (root / "hist" / "f.parquet").exists():
            time.sleep(0.05)
        loops = Loops(one_file_readers(root), 0)
        time.sleep(args.seconds)  # a bench runs for a time; the readers count meanwhile
        loops.report()
        stopped.set()
        swapper.join()
        return
    lake_readers.seed_lake(root)
    loops = Loops(readers(root), lake_readers.distinct_keys(lake_readers.read_keys(root)))
    code = lake_readers.WRITER.format(
        repo=str(Path(__file__).resolve().parents[1]),
        tags=lake_readers.TAGS,
        root=str(root),
        seconds=args.seconds,
        target=lake_readers.TARGET,
        grace=args.grace,
    )
    writer = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd()
    )
    print(f"writer: {len(writer.stdout.split())} passes, exit {writer.returncode}")
    loops.report()


if __name__ == "__main__":
    main()
