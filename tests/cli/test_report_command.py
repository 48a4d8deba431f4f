"""`historian report` as a user runs it: options, exit codes, one-line errors, the page written."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from connectors.schema import ALARM_HISTORY_SCHEMA, TAG_HISTORY_SCHEMA, frame_from_table
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from sinks.base import ChunkScope
from tests.cli.test_cli import assert_clean_failure, historian
from tests.fixtures import load, write_config

START = datetime(2026, 3, 2, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake holding two days of one tag every minute and a few alarms (no node needed)."""
    folder = tmp_path_factory.mktemp("report")
    path = write_config(
        folder,
        node={"url": "http://127.0.0.1:9"},
        flows={
            "temps": {"node": "n", "tags": {"paths": ["/Plant/Temp"]}, "start": "-1d"},
            "alarms": {"node": "n", "kind": "alarm_history", "start": "-1d"},
        },
        sinks=["lake"],
    )
    minutes = 48 * 60
    rows = pa.table(
        {
            "node": ["n"] * minutes,
            "tag": ["/Plant/Temp"] * minutes,
            "ts": [START + timedelta(minutes=m) for m in range(minutes)],
            "seq": [0] * minutes,
            "value": [float(m % 60) for m in range(minutes)],
            "value_bool": [None] * minutes,
            "value_str": [None] * minutes,
            "quality": [192] * minutes,
            "extra": [0] * minutes,
        },
        schema=TAG_HISTORY_SCHEMA,
    )
    alarms = pa.table(
        {
            "node": ["n"] * 2,
            "path": ["/Alarms/Temp HI"] * 2,
            "ts": [START + HOUR, START + 2 * HOUR],
            "status": [3, 0],
            "priority": [4, 4],
            **{
                f.name: [None] * 2
                for f in ALARM_HISTORY_SCHEMA
                if f.name not in ("node", "path", "ts", "status", "priority")
            },
        },
        schema=ALARM_HISTORY_SCHEMA,
    )
    window = Window(START, START + 48 * HOUR)
    with SinkSet(load(path), folder) as sinks:
        lake = sinks.get("lake")
        attrs: dict[str, object] = {}
        lake.write(
            ChunkScope(
                "temps",
                "temps",
                "tag_history",
                ("/Plant/Temp",),
                window,
                "t1",
                {**attrs, "kind": "tag_history"},
                node="n",
            ),
            frame_from_table(rows),
            minutes,
        )
        lake.write(
            ChunkScope(
                "alarms",
                "alarms",
                "alarm_history",
                ("/",),
                window,
                "a1",
                {**attrs, "kind": "alarm_history"},
                node="n",
            ),
            frame_from_table(alarms),
            2,
        )
    return folder


def test_report_with_start_end_and_bucket_writes_the_page_it_names(project: Path) -> None:
    result = historian(
        "report",
        "temps",
        "--start",
        "2026-03-03T06:00:00Z",
        "--end",
        "2026-03-03T12:00",
        "--bucket",
        "1h",
        "--out",
        "six.html",
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "report: six.html"
    page = (project / "six.html").read_text(encoding="utf-8")
    assert "2026-03-03 06:00Z to 2026-03-03 12:00Z (UTC), in buckets of 1 h." in page
    assert "<b>360</b>rows" in page, "six hours of one row a minute"
    assert page.count("<svg") == 3


def test_report_defaults_to_everything_held_and_a_file_named_after_the_flow(project: Path) -> None:
    result = historian("report", "temps", cwd=project)
    assert result.returncode == 0, result.stderr
    page = (project / "temps-report.html").read_text(encoding="utf-8")
    assert "2026-03-02 00:00Z to 2026-03-04 00:00Z (UTC), in buckets of 30 min." in page
    assert "<b>2,880</b>rows" in page


def test_report_of_an_alarm_flow_counts_by_priority_and_status(project: Path) -> None:
    result = historian("report", "alarms", "--out", "alarms.html", cwd=project)
    assert result.returncode == 0, result.stderr
    page = (project / "alarms.html").read_text(encoding="utf-8")
    assert "Critical (2)" in page
    assert "active, unacknowledged (1)" in page
    assert "cleared, acknowledged (1)" in page


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--start", "2026-03-03", "--end", "2026-03-02"], ["--end must be after --start"]),
        (["--start", "yesterday-ish"], ["--start", "yesterday-ish", "is not a time"]),
        (["--bucket", "1s"], ["report temps", "172,800 buckets", "at most 2,000"]),
        (["--bucket", "soon"], ["--bucket", "'soon' is not a duration"]),
        (
            ["--start", "2027-01-01"],
            ["report temps", "nothing to draw from 2027-01-01T00:00:00Z", "2026-03-04T00:00:00Z"],
        ),
    ],
    ids=["reversed", "bad-time", "too-many-buckets", "bad-bucket", "after-everything"],
)
def test_report_refuses_a_range_it_cannot_draw_in_one_line(
    project: Path, args: list[str], needles: list[str]
) -> None:
    out = project / "refused.html"
    result = historian("report", "temps", *args, "--out", str(out), cwd=project)
    assert_clean_failure(result, 2, *needles)
    assert not out.exists(), "nothing written"


def test_report_of_an_unknown_flow_names_the_known_ones(project: Path) -> None:
    result = historian("report", "nope", "--out", "nope.html", cwd=project)
    assert_clean_failure(result, 2, "no flow named 'nope'", "temps")
    assert not (project / "nope.html").exists()
