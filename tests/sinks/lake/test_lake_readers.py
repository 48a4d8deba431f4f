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
    lake = ParquetLake({root!r}, target_file_rows={target}, store=AgedStore({root!r}))

    def write(members, start_min, minutes, chunk, step_s, shift):
        win = window(start_min / 60, (start_min + minutes) / 60)
        frame = history_frame(members, win, step_s=step_s)
        frame["value"] = frame["value"] + shift  # another version of the same rows
        lake.write(scope(members, win, chunk), frame, len(frame))

    lake.compact("hist")  # 60 one-minute files into one, the others emptied
    generation = 0
    deadline = time.monotonic() + {seconds}
    while time.monotonic() < deadline:
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


@pytest.mark.slow
def test_readers_beside_a_writer_never_miss_a_row_nor_fail(tmp_lake: Path) -> None:
    seed_lake(tmp_lake)
    before = read_keys(tmp_lake)
    assert before.num_rows == len(TAGS) * HOURS * 60
    expected = before.group_by(KEY).aggregate([])
    code = WRITER.format(
        repo=str(Path(__file__).resolve().parents[3]),
        tags=TAGS,
        root=str(tmp_lake),
        seconds=6,
        target=TARGET,
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    reads = failed = missing = twice = 0
    errors: list[str] = []
    try:
        while writer.poll() is None:
            try:
                seen = read_keys(tmp_lake)
            except Exception as exc:  # what a reader would see: any error is a failure
                failed += 1
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            reads += 1
            counts = seen.group_by(KEY).aggregate([([], "count_all")])
            present = counts.join(expected, KEY, join_type="right outer")
            missing += int(present.column("count_all").null_count > 0)
            twice += int(pa.compute.max(counts.column("count_all")).as_py() > 1)
    finally:
        if writer.poll() is None:
            writer.kill()
        out, _ = writer.communicate(timeout=30)
    generations = len(out.split())
    assert writer.returncode == 0
    assert generations >= 1, "the writer went through its shapes at least once"
    print(
        f"\n{reads + failed} reads beside {generations} writer passes: {failed} failed, "
        f"{missing} missed rows, {twice} saw a row twice"
    )
    assert reads >= 20
    assert errors == [], f"{failed} reads failed: {errors[:3]}"
    assert missing == 0, f"{missing} of {reads} reads missed rows complete before the writer"
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
    files it finds, stay readable for the grace period counted from that write."""
    seed_lake(tmp_lake)
    ParquetLake(str(tmp_lake), target_file_rows=TARGET).compact("hist")
    empty = [p for p in (tmp_lake / "hist").rglob("*.parquet") if not pq.read_metadata(p).num_rows]
    assert len(empty) == 59, "the compaction left its inputs as 0-row files"
    expected = read_keys(tmp_lake).group_by(KEY).aggregate([])
    lake = ParquetLake(str(tmp_lake), target_file_rows=TARGET, store=AgedStore(str(tmp_lake)))
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
