"""Plain-folder readers beside a writer: what `pyarrow.dataset` sees while the lake changes.

The writer (another process) compacts sixty one-minute files, then re-extracts data that
was complete before it started, in the shapes runs take: chunk by chunk over the
compacted file and over a chunk's file, with another window size and other tag batches
across two or three files; it finds every file older than the reader grace (`AgedStore`).
A pyarrow.dataset reader loop reads the dataset meanwhile (DuckDB's `read_parquet` reads
it list-then-read in `test_readers_of_a_lake_older_than_the_grace_...`). Every read must
hold every row that was there before the writer began (its key; values may be either
version) and no read may fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from sinks.lake.sink import ParquetLake
from sinks.store.objects import Entry
from tests.sinks.lake.lake_frames import history_frame, scope, window
from tests.sinks.lake.stores import HookedStore

TAGS = tuple(f"/plant/t{i:02d}" for i in range(8))
KEY = ["node", "tag", "ts", "seq"]
HOURS = 3
TARGET = 1000  # files under 50 rows are small; a 20-minute chunk file (160 rows) is not


def seed_lake(root: Path) -> None:
    """Three hours, complete before the writer: the first of one-minute chunks (the writer
    compacts them first), the others 20-minute chunks of a file each (above the small-file
    size, so they stay)."""
    lake = ParquetLake(str(root), target_file_rows=TARGET)
    for start in range(0, 60):
        win = window(start / 60, (start + 1) / 60)
        frame = history_frame(TAGS, win, step_s=60)
        lake.write(scope(TAGS, win, f"seed{start:03d}"), frame, len(frame))
    for start in range(60, HOURS * 60, 20):
        win = window(start / 60, (start + 20) / 60)
        frame = history_frame(TAGS, win, step_s=60)
        lake.write(scope(TAGS, win, f"seed{start:03d}"), frame, len(frame))


WRITER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    from sinks.lake.sink import ParquetLake
    from tests.sinks.lake.lake_frames import history_frame, scope, window
    tags = {tags!r}
    from tests.sinks.lake.test_lake_readers import AgedStore
    lake = ParquetLake(
        {root!r}, target_file_rows={target}, store=AgedStore({root!r}), reader_grace_s={grace}
    )

    def write(members, start_min, minutes, chunk, step_s, shift):
        win = window(start_min / 60, (start_min + minutes) / 60)
        frame = history_frame(members, win, step_s=step_s)
        frame["value"] = frame["value"] + shift  # another version of the same rows
        lake.write(scope(members, win, chunk), frame, len(frame))

    lake.compact("hist")  # 60 one-minute files into one, the others emptied
    generation = 0
    deadline = time.monotonic() + {seconds}
    while generation == 0 or time.monotonic() < deadline:  # one pass at least
        generation += 1
        for m in range(30, 40):  # minute chunks over the compacted file
            write(tags, m, 1, f"g{{generation}}m{{m}}", 60, generation)
        for m in range(60, 70):  # over a 20-minute chunk's file
            write(tags, m, 1, f"g{{generation}}n{{m}}", 60, generation)
        for m in range(0, 175, 7):  # another window size, some across two files
            write(tags[:5], m, 7, f"g{{generation}}w{{m}}", 60, generation)
        for m in range(90, 120, 3):  # two tag batches, one window across two files
            write(tags[:4], m, 3, f"g{{generation}}a{{m}}", 60, generation)
            write(tags[4:], m, 3, f"g{{generation}}b{{m}}", 60, generation)
        write(tags, 100, 45, f"g{{generation}}x", 60, generation)  # across three files
        lake.compact("hist")
        print(generation, flush=True)
    """
)


def read_keys(root: Path) -> pa.Table:
    found = pads.dataset(str(root / "hist"), format="parquet", partitioning="hive")
    return found.to_table(columns=KEY)


def duckdb_over_arrow(root: Path) -> pa.Table:
    """DuckDB scanning the lake through pyarrow.dataset: each file read through one handle
    (DuckDB's own read_parquet opens a file again by path while it scans it, so a file
    replaced meanwhile reads as another's bytes; docs/reliability.md)."""
    import duckdb

    con = duckdb.connect()
    con.register("lake", pads.dataset(str(root / "hist"), format="parquet", partitioning="hive"))
    return con.sql(f"select {', '.join(KEY)} from lake").to_arrow_table()


def distinct_keys(table: pa.Table) -> int:
    return table.select(KEY).group_by(KEY).aggregate([]).num_rows


READER_PROCESS = textwrap.dedent(
    """
    import sys, threading
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from tests.sinks.lake.test_lake_readers import distinct_keys, read_keys
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    reads = failed = missing = 0
    while not done.is_set():
        try:
            seen = read_keys(Path({root!r}))
        except Exception as exc:
            failed += 1
            print("error", type(exc).__name__, str(exc)[:200], flush=True)
            continue
        reads += 1
        missing += distinct_keys(seen) < {expected}
        if reads == 1:
            print("ready", flush=True)
    print("done", reads, failed, missing, flush=True)
    """
)


class Reader:
    """A reader looping in a thread until `stop`: its reads, its failures (any error, as a
    user would see it) and the reads that missed a row complete before the writer."""

    def __init__(self, read: Callable[[], pa.Table], expected: int, stop: threading.Event):
        self.read, self.expected, self.stop = read, expected, stop
        self.ready = threading.Event()
        self.reads = self.missing = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                seen = self.read()
            except Exception as exc:  # what a reader would see: any error is a failure
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            self.reads += 1
            self.missing += distinct_keys(seen) < self.expected
            self.ready.set()


@pytest.mark.slow
def test_readers_beside_a_writer_never_miss_a_row_nor_fail(tmp_lake: Path) -> None:
    """Readers in threads (pyarrow.dataset; DuckDB through it) and in a process loop over
    the lake from before the writer starts until it ends; the writer (another process)
    finds every file an hour old (0-row files older than the grace too), compacts, and
    re-extracts in every shape. No read fails, none misses a row.

    The writer's grace outlasts its writing (`WRITING_S`): a 0-row file removed a grace
    after its retirement can race a listing taken in the instant before (on this loaded
    machine one pass of the writer took over a minute, and 1 read in ~650 failed at the
    default 60 s), which no plain folder can rule out (docs/reliability.md)."""
    seed_lake(tmp_lake)
    before = read_keys(tmp_lake)
    assert before.num_rows == len(TAGS) * HOURS * 60
    expected = distinct_keys(before)
    repo = str(Path(__file__).resolve().parents[3])
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            READER_PROCESS.format(repo=repo, root=str(tmp_lake), expected=expected),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
    )
    stop = threading.Event()
    readers = {
        "pyarrow.dataset": Reader(lambda: read_keys(tmp_lake), expected, stop),
        "duckdb over pyarrow.dataset": Reader(lambda: duckdb_over_arrow(tmp_lake), expected, stop),
    }
    writer: subprocess.Popen[str] | None = None
    try:
        assert other.stdout is not None
        assert other.stdin is not None
        assert other.stdout.readline().strip() == "ready", "the reader process read once"
        for reader in readers.values():
            reader.thread.start()
        for name, reader in readers.items():
            assert reader.ready.wait(120), f"{name} read once before the writer began"
        code = WRITER.format(
            repo=repo, tags=TAGS, root=str(tmp_lake), seconds=6, target=TARGET, grace=WRITING_S
        )
        writer = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
        )
        out, _ = writer.communicate(timeout=600)
        stop.set()
        other.stdin.close()
        lines = other.stdout.read().splitlines()
    finally:
        stop.set()
        for process in (writer, other):
            if process is not None and process.poll() is None:
                process.kill()
        for reader in readers.values():
            reader.thread.join(timeout=120)
        other.wait(timeout=60)
    assert writer.returncode == 0
    assert len(out.split()) >= 1, "the writer went through its shapes at least once"
    _, reads, failed, missing = lines[-1].split()
    counts = {
        **{name: (r.reads, len(r.errors), r.missing) for name, r in readers.items()},
        "pyarrow.dataset in a process": (int(reads), int(failed), int(missing)),
    }
    print(f"\nreads, failed, missed rows beside {len(out.split())} writer passes: {counts}")
    for name, reader in readers.items():
        assert reader.errors == [], f"{name}: {len(reader.errors)} failed: {reader.errors[:3]}"
    assert [line for line in lines if line.startswith("error")] == [], "the process's reads"
    for name, (done, _, missed) in counts.items():
        assert done >= 5, f"{name} read while the writer wrote"
        assert missed == 0, f"{name}: {missed} of {done} reads missed rows complete before"
    assert read_keys(tmp_lake).num_rows == before.num_rows, "once each when the writer is done"


NODES = ("plant a/line 1", "ünïcödé 漢字", "site.eu-1", "50", "100% it's")


def test_every_reader_sees_each_nodes_rows_with_its_node_column(tmp_lake: Path) -> None:
    """One dataset, several nodes with the same tag paths, each under node-<encoded>/:
    pyarrow.dataset, DuckDB and Polars read it as a Hive layout and pandas with its
    defaults, every one with the files' own node column, whatever the name holds."""
    import duckdb
    import pandas as pd
    import polars as pl

    lake = ParquetLake(str(tmp_lake))
    frames = []
    for node in NODES:
        frame = history_frame(TAGS[:2], window(0, 1), node=node)
        lake.write(
            scope(TAGS[:2], window(0, 1), "c1", flow=f"f@{node}", node=node), frame, len(frame)
        )
        frames.append(frame)

    def rows(table: pa.Table) -> list[tuple[str, str, int]]:
        ts = table.column("ts").cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_pylist()
        return sorted(zip(table["node"].to_pylist(), table["tag"].to_pylist(), ts, strict=True))

    expected = rows(pa.Table.from_pandas(pd.concat(frames), preserve_index=False))
    top = tmp_lake / "hist"
    assert sorted(p.name for p in top.iterdir()) == sorted(
        "node-" + quote(node, safe="") for node in NODES
    )
    hive = pads.dataset(str(top), format="parquet", partitioning="hive")
    assert rows(hive.to_table(columns=["node", "tag", "ts"])) == expected
    found = duckdb.sql(
        f"select node, tag, ts from read_parquet('{top}/**/*.parquet', hive_partitioning=1)"
    ).fetch_arrow_table()
    assert rows(found) == expected
    polars = pl.scan_parquet(f"{top}/**/*.parquet", hive_partitioning=True).collect()
    assert rows(polars.select(["node", "tag", "ts"]).to_arrow()) == expected
    plain = pd.read_parquet(str(top), columns=["node", "tag", "ts"])
    assert rows(pa.Table.from_pandas(plain, preserve_index=False)) == expected


class AgedStore(HookedStore):
    """The lake as a writer finds it `AGE_S` later: every file it lists looks that much
    older (a file's age on local disk includes its ctime, which `os.utime` cannot set)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        for name in ("listdir", "find"):
            self.hook(name, self._aged)

    @staticmethod
    def _aged(operation: Callable[..., list[Entry]], *args: Any) -> list[Entry]:
        return [replace(e, modified_s=e.modified_s - AGE_S) for e in operation(*args)]


AGE_S = 3600.0
# The writers' reader grace: longer than any of their passes on a loaded machine, shorter
# than the age every file seems to have (`AGE_S`).
WRITING_S = 1800


def listed(root: Path) -> tuple[pads.Dataset, list[str]]:
    """What two readers list before they read: pyarrow.dataset's discovery, DuckDB's glob."""
    import duckdb

    glob = f"{root / 'hist'}/**/*.parquet"
    files = [row[0] for row in duckdb.sql(f"select file from glob('{glob}')").fetchall()]
    return pads.dataset(str(root / "hist"), format="parquet", partitioning="hive"), files


def listed_readers(found: pads.Dataset, files: list[str]) -> dict[str, Callable[[], pa.Table]]:
    """The two readers, each reading what it listed (called after the write)."""
    import duckdb

    names = ", ".join(f"'{f}'" for f in files)
    query = f"select {', '.join(KEY)} from read_parquet([{names}], hive_partitioning=1)"
    return {
        "pyarrow.dataset": lambda: found.to_table(columns=KEY),
        "duckdb": lambda: duckdb.sql(query).fetch_arrow_table(),
    }


def test_readers_of_a_lake_older_than_the_grace_never_fail_during_re_extractions(
    tmp_lake: Path,
) -> None:
    """Every file of the lake (0-row files emptied by its compaction included) is older
    than the reader grace when it is re-extracted twice, chunk by chunk. Before each write
    pyarrow.dataset and DuckDB list the lake; after it they read what they listed: no read
    fails, and every row complete before is there. Files a write empties, and the 0-row
    files it finds, stay readable for the grace period counted from that write (a grace of
    `WRITING_S`, shorter than the files' age and longer than the test: at the default 60 s
    a loaded machine took longer than the grace between two of these writes)."""
    seed_lake(tmp_lake)
    ParquetLake(str(tmp_lake), target_file_rows=TARGET).compact("hist")
    empty = [p for p in (tmp_lake / "hist").rglob("*.parquet") if not pq.read_metadata(p).num_rows]
    assert len(empty) == 59, "the compaction left its inputs as 0-row files"
    expected = read_keys(tmp_lake).group_by(KEY).aggregate([])
    lake = ParquetLake(
        str(tmp_lake),
        target_file_rows=TARGET,
        store=AgedStore(str(tmp_lake)),
        reader_grace_s=WRITING_S,
    )
    reads = 0
    failures: list[str] = []
    for generation in (1, 2):
        for m in (*range(28, 42), *range(58, 62), *range(0, 175, 7)):
            minutes = 7 if m % 7 == 0 and m not in (28, 35) else 1
            win = window(m / 60, (m + minutes) / 60)
            frame = history_frame(TAGS, win, step_s=60)
            frame["value"] = frame["value"] + generation
            found, files = listed(tmp_lake)
            lake.write(scope(TAGS, win, f"g{generation}m{m}"), frame, len(frame))
            for reader, read in listed_readers(found, files).items():
                reads += 1
                try:
                    table = read()
                except Exception as exc:  # what a reader would see: any error is a failure
                    failures.append(f"{reader} after g{generation}m{m}: {exc}"[:300])
                    continue
                keys = table.select(KEY).cast(expected.schema).group_by(KEY).aggregate([])
                lost = keys.join(expected, KEY, join_type="right anti")
                assert lost.num_rows == 0, f"a read after g{generation}m{m} missed rows"
    assert failures == [], f"{len(failures)} of {reads} reads failed"
    assert set(empty) <= set((tmp_lake / "hist").rglob("*.parquet")), "kept through the grace"
