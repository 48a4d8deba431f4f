"""The run summary as printed, pinned to the character: a table with a status column when
several flows ran or one failed, then remarks, failures, destinations and read-back lines."""

from __future__ import annotations

import shlex
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pipelines.cli.base import out
from pipelines.cli.summary import FlowOutcome, print_outcomes
from pipelines.core.runner import RunSummary
from tests.fixtures import load, write_config

MARK = datetime(2026, 11, 20, 1, 30, tzinfo=UTC)


def summary(flow: str, **fields: object) -> RunSummary:
    values: dict[str, object] = {
        "rows": 1200,
        "chunks_planned": 4,
        "chunks_done": 4,
        "seconds": 2.0,
        "tags": 3,
        "window": timedelta(minutes=15),
        "watermark_after": MARK,
    }
    values.update(fields)
    return RunSummary(flow=flow, dataset=flow, kind="tag_history", node="n", **values)  # type: ignore[arg-type]


def printed(tmp_path: Path, outcomes: list[FlowOutcome], title: str = "historian run") -> str:
    flows = {
        "a": {"node": "n", "tags": {"paths": ["/x"]}, "start": "-1d"},
        "b": {"node": "n", "tags": {"paths": ["/y"]}, "start": "-1d", "sinks": ["lake"]},
    }
    path = write_config(tmp_path, node={"url": "http://127.0.0.1:1"}, flows=flows)
    with out.capture() as captured:
        print_outcomes(load(path), path, outcomes, title=title)
    return "".join(line.rstrip() + "\n" for line in captured.get().splitlines())


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # read-back lines name paths relative to the working folder


def test_one_flow_that_succeeded_has_no_status_column_and_says_where_to_read(
    tmp_path: Path,
) -> None:
    done = summary("a", sinks={"lake": "the lake", "duck": "the warehouse"})
    python = shlex.quote(sys.executable)
    assert printed(tmp_path, [FlowOutcome("a", done)]) == (
        "historian run\n"
        "┏━━━━━━┳━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━┓\n"
        "┃ flow ┃  rows ┃ chunks ┃ window ┃ skipped ┃ seconds ┃ rows/s ┃ tags ┃ watermark            ┃\n"
        "┡━━━━━━╇━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━┩\n"
        "│ a    │ 1,200 │    4/4 │ 15m    │       0 │     2.0 │    600 │    3 │ 2026-11-20 01:30:00Z │\n"
        "└──────┴───────┴────────┴────────┴─────────┴─────────┴────────┴──────┴──────────────────────┘\n"
        "  a -> lake: the lake\n"
        "  a -> duck: the warehouse\n"
        "Read it back:\n"
        f"  {python} -c 'import pandas as pd; print(pd.read_parquet(\"lake/a\"))'\n"
        f'  {python} -c \'import duckdb; duckdb.connect("warehouse.duckdb", read_only=True)'
        '.sql("select tag, count(*) from a group by tag order by 2 desc limit 5").show()\'\n'
    )


def test_several_flows_show_a_status_each_a_row_per_node_remarks_and_failures(
    tmp_path: Path,
) -> None:
    nodes = [summary("a", key=f"a@{n}", rows=600, chunks_done=2, chunks_planned=2) for n in "mn"]
    nodes[1].error = "node n: refused"
    fleet = summary("a", units=nodes, notes=["end cut at now - settle"], sinks={"lake": "L"})
    fleet.missing = {"/x": [], "/z": []}
    fleet.rows_out_of_range = 2
    idle = summary("b", rows=0, chunks_done=0, chunks_skipped=4, sinks={"lake": "L"})
    outcomes = [
        FlowOutcome("a", fleet, "flow a: node n: refused (2 chunks committed)"),
        FlowOutcome("b", idle),
        FlowOutcome("c", None, "flow c: node: down"),
    ]
    python = shlex.quote(sys.executable)
    assert printed(tmp_path, outcomes, title="historian backfill") == (
        "historian backfill\n"
        "┏━━━━━━━┳━━━━━━━┳━━━━━━━━┳━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━┳━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┓\n"
        "┃ flow  ┃  rows ┃ chunks ┃ window ┃ skipped ┃ seconds ┃ rows/s ┃ tags ┃ watermark            ┃ status ┃\n"
        "┡━━━━━━━╇━━━━━━━╇━━━━━━━━╇━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━╇━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━┩\n"
        "│ a     │ 1,200 │    4/4 │ 15m    │       0 │     2.0 │    600 │    3 │ 2026-11-20 01:30:00Z │ failed │\n"
        "│   a@m │   600 │    2/2 │ 15m    │       0 │     2.0 │    300 │    3 │ 2026-11-20 01:30:00Z │ ok     │\n"
        "│   a@n │   600 │    2/2 │ 15m    │       0 │     2.0 │    300 │    3 │ 2026-11-20 01:30:00Z │ failed │\n"
        "│ b     │     0 │    0/4 │ 15m    │       4 │     2.0 │      0 │    3 │ 2026-11-20 01:30:00Z │ ok     │\n"
        "│ c     │     - │      - │ -      │       - │       - │      - │    - │ -                    │ failed │\n"
        "└───────┴───────┴────────┴────────┴─────────┴─────────┴────────┴──────┴──────────────────────┴────────┘\n"
        "  a: end cut at now - settle\n"
        "  a: 2 tags were left out of the node's answers in 0 windows ('/x' first): not complete there; `historian state` lists them\n"
        "  a: 2 rows stamped outside their query were dropped\n"
        "  failed flow a: node n: refused (2 chunks committed)\n"
        "  failed flow c: node: down\n"
        "  a -> lake: L\n"
        "Read it back:\n"
        f"  {python} -c 'import pandas as pd; print(pd.read_parquet(\"lake/a\"))'\n"
        f'  {python} -c \'import duckdb; duckdb.connect("warehouse.duckdb", read_only=True)'
        '.sql("select tag, count(*) from a group by tag order by 2 desc limit 5").show()\'\n'
    )


def test_one_flow_that_failed_has_a_status_column_and_no_second_failure_line(
    tmp_path: Path,
) -> None:
    failed = summary("b", chunks_done=0, sinks={"lake": "L"})
    text = printed(tmp_path, [FlowOutcome("b", failed, "flow b: sink: full")])
    assert text.splitlines()[2].endswith("┃ status ┃")
    assert text.splitlines()[4].endswith("│ failed │")
    assert "flow b: sink: full" not in text
    assert text.endswith("┘\n"), "nothing committed: no destination, nothing to read back"
