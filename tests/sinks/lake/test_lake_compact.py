"""The lake's compactor: batches of bounded rows and files, merged a row group at a time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

import sinks.lake.compact
from sinks.lake.compact import SmallFile, merge_batches, owners_of
from sinks.lake.sink import ParquetLake
from sinks.store.objects import Entry
from tests.sinks.lake.lake_frames import history_frame, rows_of, scope, window
from tests.sinks.lake.stores import HookedStore

TAGS = ("/plant/a", "/plant/b", "/plant/c")


def small(name: str, rows: int, *owners: str) -> SmallFile:
    return SmallFile(
        Entry(f"/lake/hist/{name}", name, 1, "v"), rows, tuple(("f", o) for o in owners)
    )


def names(batches: Sequence[Sequence[SmallFile]]) -> list[list[str]]:
    return [[item.entry.name for item in batch] for batch in batches]


@pytest.mark.parametrize(
    ("rows", "max_rows", "max_files", "expected"),
    [
        ([10, 10, 10, 10], 100, 10, [["a", "b", "c", "d"]]),
        ([10, 10, 10, 10], 20, 10, [["a", "b"], ["c", "d"]]),
        ([10, 10, 10, 10], 100, 3, [["a", "b", "c"]]),  # "d" alone: nothing to merge
        ([90, 20, 10, 10], 100, 10, [["b", "c", "d"]]),
        ([], 100, 10, []),
    ],
)
def test_batches_hold_at_most_max_rows_and_max_files(
    rows: list[int], max_rows: int, max_files: int, expected: list[list[str]]
) -> None:
    files = [small(name, n, name) for name, n in zip("abcd", rows, strict=False)]
    batches = merge_batches(files, max_rows=max_rows, max_files=max_files)
    assert names(batches) == expected
    for batch in batches:
        assert sum(item.rows for item in batch) <= max_rows
        assert len(batch) <= max_files


def test_owners_map_each_chunk_to_its_own_files_only() -> None:
    batch = [small("a", 5, "k1"), small("b", 5, "k2"), small("c", 5, "k1", "k3")]
    assert owners_of(batch) == {
        ("f", "k1"): ["/lake/hist/a", "/lake/hist/c"],
        ("f", "k2"): ["/lake/hist/b"],
        ("f", "k3"): ["/lake/hist/c"],
    }


def test_compaction_of_many_small_files_holds_bounded_rows_and_a_linear_intent(
    tmp_lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What made 2,880 one-minute files take 2 GB: every merged chunk's marker update listed
    every input file (quadratic), and all inputs were held at once. Now a merge holds at
    most `MERGE_MAX_ROWS` rows, and the intent names each input once per owner."""
    store = HookedStore(str(tmp_lake))
    lake = ParquetLake(str(tmp_lake), target_file_rows=10_000, store=store)
    for m in range(120):  # two hours of one-minute chunks: 120 files of 3 rows
        win = window(m / 60, (m + 1) / 60)
        frame = history_frame(TAGS, win, step_s=60)
        lake.write(scope(TAGS, win, f"m{m:03d}"), frame, len(frame))
    before = rows_of(lake.read("hist", "tag_history"))
    monkeypatch.setattr(sinks.lake.compact, "MERGE_MAX_ROWS", 100)
    held: list[int] = []
    merge = sinks.lake.compact.merged_rows

    def counting(read: Any, paths: Sequence[str], *args: Any) -> Any:
        schema, rows, groups = merge(read, paths, *args)
        held.append(rows)
        return schema, rows, groups

    monkeypatch.setattr(sinks.lake.compact, "merged_rows", counting)
    intents: list[dict[str, Any]] = []

    def recording(write_json: Any, path: str, value: Any, **kw: Any) -> None:
        if "/pending/" in path:
            intents.append(value)
        write_json(path, value, **kw)

    store.hook("write_json", recording)
    assert lake.compact("hist") == 120
    assert held == [99, 99, 99, 63], "33 files of 3 rows at a time: at most MERGE_MAX_ROWS"
    assert len(intents) == 4
    for intent in intents:
        assert all(len(update["remove"]) == 1 for update in intent["marker_updates"])
    assert max(len(orjson.dumps(intent)) for intent in intents) < 20_000
    assert rows_of(lake.read("hist", "tag_history")) == before
    counts = sorted(pq.read_metadata(p).num_rows for p in (tmp_lake / "hist").rglob("*.parquet"))
    assert counts == [0] * 116 + [63, 99, 99, 99], "merged, and the other inputs emptied"


def test_the_compactor_merges_one_partition_into_its_last_file_and_repoints_markers(
    tmp_lake: Path,
) -> None:
    lake = ParquetLake(str(tmp_lake), partition="date", target_file_rows=10_000)
    for number, hours in enumerate(((0, 1), (1, 2), (2, 3), (24, 25))):
        win = window(*hours)
        frame = history_frame(TAGS, win)
        lake.write(scope(TAGS, win, f"k{number}"), frame, len(frame))
    compactor = lake.parts.compactor
    assert compactor.partitions("hist", "tag_history") == [
        "node-n1/date=2024-03-01",
        "node-n1/date=2024-03-02",
    ]
    assert compactor.compact_partition("hist", "tag_history", "node-n1/date=2024-03-01", 1000) == 3
    assert compactor.compact_partition("hist", "tag_history", "node-n1/date=2024-03-01", 1000) == 0
    sizes = {p.name: pq.read_metadata(p).num_rows for p in (tmp_lake / "hist").rglob("*.parquet")}
    assert sizes == {
        "part-k0.parquet": 0,
        "part-k1.parquet": 0,
        "part-k2.parquet": 54,  # the last by name holds the batch
        "part-k3.parquet": 18,  # another partition, left alone
    }
    for chunk in ("k0", "k1", "k2"):
        marker = orjson.loads((tmp_lake / f"_historian/_flows/f/markers/{chunk}.json").read_bytes())
        assert marker["files"] == [{"path": "node-n1/date=2024-03-01/part-k2.parquet", "rows": 54}]
