"""The overlap planner on its own: which earlier files a chunk touches, and in what order."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from connectors import schema
from connectors.timewindow import Window
from sinks.lake.files import FileInfo
from sinks.lake.journal import Plan
from sinks.lake.overlap import may_overlap
from sinks.lake.rows import sorted_rows, table_of
from sinks.lake.sink import ParquetLake
from tests.sinks.lake.lake_frames import history_frame, scope, window

TAGS = ("/plant/a", "/plant/b", "/plant/c", "/plant/d")
KIND = schema.KIND_TAG_HISTORY
DAY = "node-n1/date=2024-03-01"


@pytest.fixture
def lake(tmp_lake: Path) -> Iterator[ParquetLake]:
    sink = ParquetLake(str(tmp_lake), partition="date")
    sink.open()
    yield sink
    sink.close()


def write(lake: ParquetLake, members: Sequence[str], win: Window, chunk: str) -> None:
    frame = history_frame(members, win)
    lake.write(scope(members, win, chunk), frame, len(frame))


def planned(
    lake: ParquetLake, members: Sequence[str], win: Window, chunk: str, step_s: int = 600
) -> Plan:
    """The plan of writing `chunk` (its files staged, then discarded: nothing applied)."""
    sink_scope = scope(members, win, chunk)
    table = table_of(history_frame(members, win, step_s=step_s), KIND, "test")
    plan = Plan(ident=chunk, dataset="hist")
    lake.parts.datasets.check(sink_scope)
    lake.parts.writes.plan(plan, sink_scope, sorted_rows(table, schema.KEYS[KIND]))
    lake.parts.journal.discard(plan)
    return plan


def steps(plan: Plan) -> list[tuple[str, str, Any]]:
    """(op, file name, new) of each operation, in order."""
    return [(op["op"], op["dest"].rsplit("/", 1)[-1], op.get("new")) for op in plan.ops]


def info(
    rows: int = 10, ts: tuple[int, int] | None = (100, 200), key: Any = ("b", "d")
) -> FileInfo:
    ts_min, ts_max = ts or (None, None)
    key_min, key_max = key or (None, None)
    return FileInfo(rows, ts_min, ts_max, key_min, key_max, (("f", "k"),))


@pytest.mark.parametrize(
    ("file", "kind", "start", "end", "members", "overlaps"),
    [
        (info(rows=0), KIND, 0, 1000, ["c"], False),
        (info(), KIND, 200, 300, ["c"], True),
        (info(), KIND, 201, 300, ["c"], False),
        (info(), KIND, 0, 100, ["c"], False),
        (info(), KIND, 0, 101, ["c"], True),
        (info(), KIND, 0, 1000, ["a", "e"], False),
        (info(), KIND, 0, 1000, ["a", "d"], True),
        (info(ts=None, key=None), KIND, 0, 1, ["z"], True),
        (info(), schema.KIND_ALARM_HISTORY, 0, 1000, ["a"], True),
    ],
)
def test_a_footer_rules_a_file_out_only_when_it_proves_no_row_is_in_scope(
    file: FileInfo, kind: str, start: int, end: int, members: list[str], overlaps: bool
) -> None:
    scope_window = Window.from_ms(start, end)
    assert may_overlap(file, kind, scope_window, members) is overlaps


def test_a_first_chunk_places_one_new_file(lake: ParquetLake) -> None:
    plan = planned(lake, TAGS[:2], window(0, 6), "k1")
    assert steps(plan) == [("place", "part-k1.parquet", True)]
    assert plan.rows == 72
    assert plan.updates == {}
    assert plan.marker is not None
    assert plan.marker["files"] == [{"path": f"{DAY}/part-k1.parquet", "rows": 72}]


def test_a_rewritten_chunk_swaps_its_own_file_in_one_rename(lake: ParquetLake) -> None:
    write(lake, TAGS[:2], window(0, 6), "k1")
    plan = planned(lake, TAGS[:2], window(0, 6), "k1", step_s=300)
    assert steps(plan) == [("place", "part-k1.parquet", False)]
    assert plan.ops[0]["was"] is not None
    assert plan.rows == 144


def test_unchanged_rows_over_a_compacted_file_plan_no_file_operation(lake: ParquetLake) -> None:
    write(lake, TAGS[:2], window(0, 3), "k1")
    write(lake, TAGS[:2], window(3, 6), "k2")
    assert lake.compact("hist", min_rows=1000) == 2
    plan = planned(lake, TAGS[:2], window(0, 3), "k1")
    assert plan.ops == []
    assert plan.marker is not None
    assert plan.marker["files"] == [{"path": f"{DAY}/part-k2.parquet", "rows": 72}]


def test_an_overlap_of_two_files_joins_the_last_then_trims_the_other(lake: ParquetLake) -> None:
    write(lake, TAGS[:2], window(0, 6), "A")
    write(lake, TAGS[2:], window(0, 6), "O")
    plan = planned(lake, TAGS[1:3], window(3, 9), "B")
    assert steps(plan) == [
        ("place", "part-O.parquet", False),  # O's other rows and B's, one rename
        ("place", "part-A.parquet", False),  # A without B's scope
    ]
    assert plan.updates == {
        ("f", "A"): (set(), {f"{DAY}/part-A.parquet": 54}),
        ("f", "O"): (set(), {f"{DAY}/part-O.parquet": 126}),  # 54 of O, 72 of B
    }
    assert plan.marker is not None
    assert plan.marker["files"] == [{"path": f"{DAY}/part-O.parquet", "rows": 126}]


def test_a_file_all_in_the_scope_of_another_chunk_is_emptied_after_new_rows_land(
    tmp_lake: Path,
) -> None:
    lake = ParquetLake(str(tmp_lake), partition="date", target_file_rows=50)
    write(lake, TAGS[:1], window(0, 3), "A")
    write(lake, TAGS[1:2], window(0, 3), "O")
    plan = planned(lake, TAGS[:2], window(0, 3), "B", step_s=300)
    assert steps(plan) == [
        ("place", "part-B-1.parquet", True),  # 72 rows outgrow target_file_rows: new files
        ("place", "part-B-2.parquet", True),
        ("empty", "part-A.parquet", None),
        ("empty", "part-O.parquet", None),
    ]
    assert plan.updates == {
        ("f", "A"): ({f"{DAY}/part-A.parquet"}, {}),
        # O's file was the one to join: where its rows outside the scope would travel
        ("f", "O"): (
            {f"{DAY}/part-O.parquet"},
            {f"{DAY}/part-B-1.parquet": 36, f"{DAY}/part-B-2.parquet": 36},
        ),
    }
