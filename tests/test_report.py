"""The coverage report counts rows, gaps and bad quality per tag, and escapes every path."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pyarrow as pa

from connectors.schema import TAG_HISTORY_SCHEMA, frame_from_table
from pipelines.report import coverage, render_html, report_markdown

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
