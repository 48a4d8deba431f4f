"""The coverage report counts rows, gaps and bad quality per tag, and escapes every path."""

from __future__ import annotations

import html
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from connectors.schema import ALARM_HISTORY_SCHEMA, TAG_HISTORY_SCHEMA, frame_from_table
from pipelines.destinations import SinkSet
from pipelines.report import coverage, flow_coverage, render_html, report_markdown, write_report
from tests.fixtures import load, write_config

START = datetime(2026, 1, 1, tzinfo=UTC)


def frame(rows: list[tuple[str, datetime, int]]) -> pd.DataFrame:
    columns: dict[str, list[object]] = {name: [] for name in TAG_HISTORY_SCHEMA.names}
    for tag, ts, quality in rows:
        columns["node"].append("n")
        columns["tag"].append(tag)
        columns["ts"].append(ts)
        columns["seq"].append(0)
        columns["value"].append(1.0)
        columns["value_bool"].append(None)
        columns["value_str"].append(None)
        columns["quality"].append(quality)
        columns["extra"].append(0)
    return frame_from_table(pa.table(columns, schema=TAG_HISTORY_SCHEMA))


def test_gaps_and_bad_quality_are_counted_per_bucket() -> None:
    hour = timedelta(hours=1)
    rows = [("/a", START + i * hour, 192) for i in range(10) if i not in (3, 4)]
    rows += [("/b", START + i * hour, 0 if i == 7 else 192) for i in range(10)]
    cov = coverage(frame(rows), "f", "tag_history", bucket=hour)
    assert cov.members == ["/a", "/b"]
    assert cov.buckets == 10
    assert cov.gaps(0) == 2
    assert cov.gaps(1) == 0
    assert cov.bad_buckets(1) == 1
    assert cov.totals == {"rows": 18, "bad_rows": 1, "members": 2}
    assert "| /a | 8 | 2 | 0 |" in report_markdown(cov)


def test_hostile_paths_are_escaped_in_the_page() -> None:
    hostile = "/x/<script>alert('x')</script> & \"quotes\""
    cov = coverage(frame([(hostile, START, 192)]), "f", "tag_history")
    page = render_html(cov, title="Coverage of f", where="Read from lake")
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
    assert page.count("<svg") == 1


def test_an_empty_dataset_gives_an_empty_page() -> None:
    cov = coverage(frame([]), "f", "tag_history")
    assert cov.members == []
    assert "0 series" in render_html(cov, title="t", where="w")


# -- through the sinks: the page a user gets from `historian report` ------------------------

HOUR = timedelta(hours=1)
HOSTILE = "/Plant <A>/\"Temp\" & 'x' </svg><script>alert(1)</script>"
SILENT = "/Plant A/never reports"


def scope(flow: str, kind: str, members: tuple[str, ...], start: datetime, end: datetime) -> Any:
    from connectors.timewindow import Window
    from sinks.base import ChunkScope

    return ChunkScope(
        flow=flow,
        dataset=flow,
        kind=kind,
        members=members,
        window=Window(start, end),
        chunk_id=f"{flow}-1",
        attrs={"kind": kind, "node": "n"},
    )


@pytest.mark.parametrize("sink", ["lake", "duck"])
def test_write_report_reads_the_flows_first_sink_and_counts_gaps(tmp_path: Path, sink: str) -> None:
    path = write_config(
        tmp_path,
        node={"url": "http://127.0.0.1:9"},
        flows={
            "f": {"node": "n", "tags": {"paths": ["/a", HOSTILE, SILENT]}, "start": "-1d"},
            "al": {"node": "n", "kind": "alarm_history", "start": "-1d"},
        },
        sinks=[sink],
    )
    # /a has rows in 10 of 12 hours; the hostile tag in all 12, two hours of bad quality;
    # the silent tag is covered by the chunk but never reported a sample.
    rows = [("/a", START + i * HOUR, 192) for i in range(12) if i not in (5, 6)]
    rows += [(HOSTILE, START + i * HOUR, 0 if i in (2, 3) else 192) for i in range(12)]
    members = ("/a", HOSTILE, SILENT)
    alarms = frame_from_table(
        pa.table(
            {
                "node": ["n"] * 3,
                "path": ["/al/one", "/al/one", "/al/two"],
                "ts": [START, START + HOUR, START + 11 * HOUR],
                "status": [1, 0, 1],
                **{
                    name: [None] * 3
                    for name in ALARM_HISTORY_SCHEMA.names
                    if name not in ("node", "path", "ts", "status")
                },
            },
            schema=ALARM_HISTORY_SCHEMA,
        )
    )
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        target = sinks.get(sink)
        target.write(scope("f", "tag_history", members, START, START + 12 * HOUR), frame(rows), 22)
        target.write(scope("al", "alarm_history", ("/",), START, START + 12 * HOUR), alarms, 3)
        page_path = write_report(config, "f", tmp_path / "out" / "f.html", sinks=sinks, bucket="1h")
        alarm_page = write_report(config, "al", tmp_path / "out" / "al.html", sinks=sinks)
        cov, _ = flow_coverage(config, "f", sinks=sinks, bucket="1h")

    assert cov.members == sorted(members)
    assert cov.buckets == 12
    index = {member: i for i, member in enumerate(cov.members)}
    assert cov.gaps(index["/a"]) == 2
    assert cov.gaps(index[HOSTILE]) == 0
    assert cov.bad_buckets(index[HOSTILE]) == 2
    assert cov.gaps(index[SILENT]) == 12, "a covered tag without rows is all gap"
    assert cov.totals == {"rows": 22, "bad_rows": 2, "members": 3}

    page = page_path.read_text(encoding="utf-8")
    assert "<script" not in page
    assert "</svg><script>" not in page
    assert page.count("<svg") == page.count("</svg>") == 1
    for member in members:
        assert html.escape(member) in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', ""), (
        "no external assets"
    )
    alarm_html = alarm_page.read_text(encoding="utf-8")
    assert "/al/one" in alarm_html
    assert "/al/two" in alarm_html
    assert "3 events" in alarm_html


def test_the_automatic_bucket_gives_about_a_hundred_buckets() -> None:
    rows = [("/a", START + i * timedelta(minutes=7), 192) for i in range(2000)]
    cov = coverage(frame(rows), "f", "tag_history")
    assert cov.bucket == timedelta(hours=3)
    assert 50 <= cov.buckets <= 100
    assert cov.start.hour % 3 == 0, "buckets are aligned to UTC multiples of their size"
