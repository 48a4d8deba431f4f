"""Re-writing what the lake already holds: cost that does not grow with compacted files,
and files that stay readable for readers that listed them."""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from sinks.lake.files import RETIRED_KEY
from sinks.lake.sink import ParquetLake
from sinks.store.objects import LakeStore
from tests.sinks.lake.lake_frames import concat, history_frame, in_scope, rows_of, scope, window
from tests.sinks.lake.stores import Crash, Crasher, HookedStore

TAGS = ("/plant/a", "/plant/b", "/plant/c", "/plant/d")
MINUTES = 60


def minute(m: int) -> Any:
    return window(m / 60, (m + 1) / 60)


def write_minute(lake: ParquetLake, m: int, **kw: Any) -> None:
    frame = history_frame(TAGS, minute(m), step_s=20)
    for column, value in kw.items():
        frame[column] = frame[column] + value
    lake.write(scope(TAGS, minute(m), f"m{m:02d}"), frame, len(frame))


def compacted_hour(root: Path, store: LakeStore | None = None) -> tuple[ParquetLake, Path]:
    """An hour of one-minute chunks, compacted into one file."""
    lake = ParquetLake(str(root), store=store)
    for m in range(MINUTES):
        write_minute(lake, m)
    lake.compact("hist")
    (merged,) = [p for p in (root / "hist").rglob("*.parquet") if pq.read_metadata(p).num_rows]
    return lake, merged


def _of_ledger(name: str, args: tuple[Any, ...]) -> bool:
    """Is this store call about a chunk's ledger file (sinks/lake/ledger.py)?"""
    if name == "write_parquet":
        return "samples" in args[0].schema.names
    return name == "replace" and ".coverage/" in str(args[1])


class FileOps:
    """Counts a lake's file operations: what a write costs, not how long it takes."""

    NAMES = ("write_parquet", "write_parquet_parts", "replace", "copy_over", "read_table")

    def __init__(self, root: Path) -> None:
        self.store = HookedStore(str(root))
        self.calls: Counter[str] = Counter()
        self.ledger: Counter[str] = Counter()
        self.rows_written = 0

    def start(self) -> None:
        """Count from now on."""
        for name in self.NAMES:
            self.store.hook(name, partial(self._count, name))

    def _count(self, name: str, operation: Any, *args: Any, **kwargs: Any) -> Any:
        if _of_ledger(name, args):  # the chunk's ledger file, counted apart
            self.ledger[name] += 1
            return operation(*args, **kwargs)
        self.calls[name] += 1
        if name == "write_parquet":
            self.rows_written += args[0].num_rows
        return operation(*args, **kwargs)


def test_reextracting_unchanged_rows_over_a_compacted_file_writes_no_data(
    tmp_lake: Path,
) -> None:
    ops = FileOps(tmp_lake)
    lake, merged = compacted_hour(tmp_lake, ops.store)
    before, stat = rows_of(lake.read("hist", "tag_history")), merged.stat()
    progress = lake.progress("f")
    ops.start()
    for m in range(MINUTES):  # the same chunks again, same rows
        write_minute(lake, m)
    assert ops.rows_written == 0, "no data file written"
    assert ops.calls["write_parquet"] == 1, "one 0-row file, retiring the merged inputs"
    assert ops.calls["copy_over"] == MINUTES - 1, "each input retired in place, once"
    assert ops.calls["replace"] == 0, "no data file moved"
    assert ops.ledger == {"write_parquet": MINUTES, "replace": MINUTES}, "each chunk's ledger"
    assert ops.calls["read_table"] == 1, "the compacted file was read once, not once a chunk"
    after = merged.stat()
    assert (after.st_ino, after.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)
    assert rows_of(lake.read("hist", "tag_history")) == before
    assert lake.progress("f") == progress
    assert {r.chunk_id for r in lake.chunk_log("f", 100)} == {f"m{m:02d}" for m in range(60)}
    marker = orjson.loads((tmp_lake / "_historian/_flows/f/markers/m07.json").read_bytes())
    assert marker["files"] == [{"path": str(merged.relative_to(tmp_lake / "hist")), "rows": 720}]


def test_a_changed_chunk_over_a_compacted_file_joins_it_in_one_rename(
    tmp_lake: Path,
) -> None:
    ops = FileOps(tmp_lake)
    lake, merged = compacted_hour(tmp_lake, ops.store)
    write_minute(lake, 30)  # unchanged rows: the first write retires the merged inputs
    others = {p: p.stat().st_mtime_ns for p in (tmp_lake / "hist").rglob("*.parquet")}
    ops.start()
    write_minute(lake, 30, value=0.5)  # a late correction of one minute
    assert ops.calls["write_parquet"] == 1
    assert ops.calls["replace"] == 1, "one rename: a reader sees the file before or after"
    assert ops.rows_written == pq.read_metadata(merged).num_rows
    changed = [p for p, t in others.items() if p.stat().st_mtime_ns != t]
    assert changed == [merged]
    hour = history_frame(TAGS, window(0, 1), step_s=20)
    fixed = history_frame(TAGS, minute(30), step_s=20)
    fixed["value"] = fixed["value"] + 0.5
    expected = concat(
        [in_scope(hour, TAGS, window(0, 0.5)), fixed, in_scope(hour, TAGS, window(31 / 60, 1))]
    )
    assert rows_of(lake.read("hist", "tag_history")) == rows_of(expected)


def test_emptied_files_stay_readable_until_the_grace_has_passed(tmp_lake: Path) -> None:
    lake, merged = compacted_hour(tmp_lake)
    files = sorted((tmp_lake / "hist").rglob("*.parquet"))
    assert len(files) == MINUTES, "inputs are emptied, not removed: listings stay readable"
    assert sum(pq.read_metadata(p).num_rows == 0 for p in files) == MINUTES - 1
    assert pq.read_table(files[0]).schema.names == pq.read_table(merged).schema.names
    lake.compact("hist")
    write_minute(lake, 5)
    assert len(list((tmp_lake / "hist").rglob("*.parquet"))) == MINUTES, "within the grace"
    write_minute(ParquetLake(str(tmp_lake), reader_grace_s=0), 5)  # a write to the partition
    assert list((tmp_lake / "hist").rglob("*.parquet")) == [merged]


def test_a_compaction_past_the_grace_removes_emptied_files_of_every_partition(
    tmp_lake: Path,
) -> None:
    lake = ParquetLake(str(tmp_lake))
    for day in range(3):  # three date partitions of four small files each
        for h in range(4):
            frame = history_frame(TAGS, window(day * 24 + h, day * 24 + h + 1), step_s=600)
            lake.write(
                scope(TAGS, window(day * 24 + h, day * 24 + h + 1), f"d{day}h{h}"),
                frame,
                len(frame),
            )
    lake.compact("hist")
    assert len(list((tmp_lake / "hist").rglob("*.parquet"))) == 12
    ParquetLake(str(tmp_lake), reader_grace_s=0).compact("hist")
    assert len(list((tmp_lake / "hist").rglob("*.parquet"))) == 3, "one per day, all swept"


def retired(root: Path) -> tuple[int, int]:
    """How many 0-row data files the lake holds, and how many of them are retired."""
    empty = [p for p in (root / "hist").rglob("*.parquet") if not pq.read_metadata(p).num_rows]
    stamped = [p for p in empty if RETIRED_KEY in (pq.read_schema(p).metadata or {})]
    return len(empty), len(stamped)


def test_0_row_files_are_retired_then_removed_past_the_grace_whatever_kills_the_writer(
    tmp_lake: Path,
) -> None:
    """A write retires the 0-row files it finds (the grace starts then) and a write past
    the grace removes them; killed half-way through either, no row is lost, and the next
    write finishes the job: no 0-row file stays forever."""
    lake, merged = compacted_hour(tmp_lake)
    before = rows_of(lake.read("hist", "tag_history"))
    assert retired(tmp_lake) == (MINUTES - 1, 0)
    crasher = Crasher(("copy_over", "remove"))
    crasher.arm(10)  # the tenth retirement: killed while retiring
    with pytest.raises(Crash):
        write_minute(ParquetLake(str(tmp_lake), store=crasher.store(str(tmp_lake))), 5)
    assert retired(tmp_lake) == (MINUTES - 1, 9), "some retired, none removed"
    write_minute(ParquetLake(str(tmp_lake)), 5)
    assert retired(tmp_lake) == (MINUTES - 1, MINUTES - 1), "the next write retires the rest"
    write_minute(ParquetLake(str(tmp_lake)), 6)
    assert retired(tmp_lake) == (MINUTES - 1, MINUTES - 1), "kept within the grace"
    crasher.arm(5)  # killed while removing, past the grace
    with pytest.raises(Crash):
        write_minute(
            ParquetLake(str(tmp_lake), reader_grace_s=0, store=crasher.store(str(tmp_lake))), 5
        )
    assert retired(tmp_lake) == (MINUTES - 5, MINUTES - 5)
    assert rows_of(ParquetLake(str(tmp_lake)).read("hist", "tag_history")) == before
    write_minute(ParquetLake(str(tmp_lake), reader_grace_s=0), 5)
    assert list((tmp_lake / "hist").rglob("*.parquet")) == [merged]
    assert [p.name for p in (tmp_lake / "hist").rglob("*") if p.is_file()] == [merged.name]
    assert not list((tmp_lake / "_historian/hist/tmp").iterdir())
    assert rows_of(ParquetLake(str(tmp_lake)).read("hist", "tag_history")) == before
