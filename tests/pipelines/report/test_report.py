"""The coverage report: numbers equal on every sink, readable axes, escaped paths, one page."""

from __future__ import annotations

import html
import itertools
import re
import shutil
import subprocess
import tempfile
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from connectors.schema import (
    ALARM_HISTORY_SCHEMA,
    KIND_ALARM_HISTORY,
    KIND_TAG_HISTORY,
    TAG_HISTORY_SCHEMA,
    frame_from_table,
)
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.report.charts import MAX_ROWS_DRAWN, alarm_figures, label, log_ticks, tag_figures
from pipelines.report.coverage import (
    MAX_BUCKETS,
    AlarmCoverage,
    RangeError,
    TagCoverage,
    TimeGrid,
    alarm_coverage,
    natural_key,
    nice_bucket,
    plan_grid,
    tag_coverage,
)
from pipelines.report.page import render_alarm_page, render_tag_page, write_report
from pipelines.state import missing_member
from sinks.base import ChunkScope
from tests.fixtures import load, write_config

START = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday
HOUR = timedelta(hours=1)
HOSTILE = "/Plant <A>/\"Temp\" & 'x' </svg><script>alert(1)</script> $x$ \x01 --> 🌊"
SILENT = "/Plant A/never reports"
NUMBER, FLAG, TEXT = "/Plant A/Line 1/Temp", "/Plant A/Pump running", "/Plant A/Batch"


def tag_table(rows: list[tuple[str, datetime, Any, int | None]], seq: int = 0) -> pa.Table:
    """(tag, ts, value, quality) rows: a float, a bool or a str value, or None."""
    columns: dict[str, list[Any]] = {name: [] for name in TAG_HISTORY_SCHEMA.names}
    for tag, ts, value, quality in rows:
        columns["node"].append("n")
        columns["tag"].append(tag)
        columns["ts"].append(ts)
        columns["seq"].append(seq)
        columns["value"].append(value if isinstance(value, float) else None)
        columns["value_bool"].append(value if isinstance(value, bool) else None)
        columns["value_str"].append(value if isinstance(value, str) else None)
        columns["quality"].append(quality)
        columns["extra"].append(0)
    return pa.table(columns, schema=TAG_HISTORY_SCHEMA)


def alarm_table(rows: list[tuple[str, datetime, int | None, int | None]]) -> pa.Table:
    """(path, ts, priority, status) rows."""
    count = len(rows)
    columns = {
        "node": ["n"] * count,
        "path": [r[0] for r in rows],
        "ts": [r[1] for r in rows],
        "priority": [r[2] for r in rows],
        "status": [r[3] for r in rows],
    }
    rest = {f.name: [None] * count for f in ALARM_HISTORY_SCHEMA if f.name not in columns}
    return pa.table({**columns, **rest}, schema=ALARM_HISTORY_SCHEMA)


def scope(flow: str, kind: str, members: tuple[str, ...], window: Window, chunk: str) -> ChunkScope:
    return ChunkScope(
        flow, flow, kind, members, window, f"{flow}-{chunk}", {"kind": kind}, node="n"
    )


def history_rows() -> list[tuple[str, datetime, Any, int | None]]:
    """Two days of a number, a flag, a text tag and a hostile path, with gaps and bad quality."""
    rng = np.random.default_rng(3)
    rows: list[tuple[str, datetime, Any, int | None]] = []
    for minute in range(0, 48 * 60, 7):
        ts = START + timedelta(minutes=minute, seconds=int(rng.integers(0, 60)))
        hour = minute // 60
        if not 10 <= hour < 14:  # a four-hour gap
            quality = 0 if 20 <= hour < 22 else 192
            rows.append((NUMBER, ts, float(np.round(rng.normal(50, 10), 3)), quality))
        rows.append((FLAG, ts, bool(minute % 3), 192))
        rows.append((TEXT, ts, f"batch {hour}", 192))
        quality = None if hour == 30 else (64 if hour == 31 else 192)
        value = None if quality != 192 else float(minute)
        rows.append((HOSTILE, ts, value, quality))
    return rows


SINKS = [
    "lake",
    "duck",
    pytest.param("pg", marks=pytest.mark.postgres),
    pytest.param("mariadb", marks=pytest.mark.mariadb),
]


@pytest.fixture(params=SINKS)
def project(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Any]:
    """flows.yaml with flows `f` (tags) and `al` (alarms) whose first sink is the one under test
    (a server warehouse, PostgreSQL or MariaDB, is the sink named `pg`)."""
    sink = request.param
    pg = None
    if sink == "pg":
        pg = (request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))
    if sink == "mariadb":
        sink = "pg"
        pg = (request.getfixturevalue("mariadb_url"), request.getfixturevalue("mariadb_schema"))
    return two_flows(tmp_path, sink, pg), sink


def two_flows(folder: Path, sink: str, pg: tuple[str, str] | None = None) -> Path:
    """flows.yaml with flows `f` (the tags above) and `al` (alarms), both into `sink`."""
    tags = {"paths": [NUMBER, FLAG, TEXT, HOSTILE, SILENT]}
    return write_config(
        folder,
        node={"url": "http://127.0.0.1:9"},
        flows={
            "f": {"node": "n", "tags": tags, "start": "-1d"},
            "al": {"node": "n", "kind": "alarm_history", "start": "-1d"},
        },
        pg=pg,
        sinks=[sink],
    )


def fill(sinks: SinkSet, name: str) -> pa.Table:
    """Write the history (one chunk, progress over both days) and a day of alarms."""
    sink = sinks.get(name)
    table = tag_table(history_rows())
    members = (NUMBER, FLAG, TEXT, HOSTILE, SILENT)
    sink.write(
        scope("f", KIND_TAG_HISTORY, members, Window(START, START + 48 * HOUR), "1"),
        frame_from_table(table),
        table.num_rows,
    )
    alarms = alarm_table(ALARMS)
    sink.write(
        scope("al", KIND_ALARM_HISTORY, ("/",), Window(START, START + 24 * HOUR), "1"),
        frame_from_table(alarms),
        alarms.num_rows,
    )
    return table


ALARMS = [
    ("/Alarms/a HI", START + timedelta(minutes=5), 4, 3),
    ("/Alarms/a HI", START + timedelta(minutes=9), 4, 1),
    ("/Alarms/a HI", START + timedelta(minutes=50), 4, 0),
    ("/Alarms/b LO", START + timedelta(hours=3), 1, 3),
    ("/Alarms/b LO", START + timedelta(hours=3, minutes=1), 1, 2),
    ("/Alarms/" + HOSTILE, START + timedelta(hours=7), 2, 3),
    ("/Alarms/odd", START + timedelta(hours=23), None, 9),  # outside the spec: counted as other
]


def expected_coverage(table: pa.Table, grid: TimeGrid) -> dict[str, pd.DataFrame]:
    """The same numbers, computed the obvious way with pandas on every row."""
    frame = table.to_pandas()
    ms = table.column("ts").cast(pa.int64()).to_numpy()
    frame["bucket"] = (ms - grid.start_ms) // grid.bucket_ms
    good = frame["quality"].fillna(-1) >= 192
    numeric = frame["value"].where(frame["value"].notna(), frame["value_bool"].astype("float64"))
    frame["v"] = numeric.where(good)
    frame["bad"] = (~good).astype(int)
    grouped = frame.groupby(["tag", "bucket"])
    return {
        "rows": grouped.size().unstack(fill_value=0),
        "bad": grouped["bad"].sum().unstack(fill_value=0),
        "low": grouped["v"].min().unstack(),
        "high": grouped["v"].max().unstack(),
        "total": grouped["v"].sum().unstack(fill_value=0.0),
        "counted": grouped["v"].count().unstack(fill_value=0),
    }


def dense(expected: pd.DataFrame, members: list[str], count: int, fill: float) -> np.ndarray:
    return expected.reindex(index=members, columns=range(count)).fillna(fill).to_numpy()


# -- the numbers ---------------------------------------------------------------------------------


def test_every_sink_gives_the_numbers_pandas_gives(project: tuple[Path, Any]) -> None:
    path, name = project
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        table = fill(sinks, name)
        cov = tag_coverage(sinks.get(name), "f", "f", bucket=HOUR)
    assert cov.members == sorted([NUMBER, FLAG, TEXT, HOSTILE, SILENT])
    assert cov.window == Window(START, START + 48 * HOUR), "the extracted range, both days"
    assert (cov.grid.start_ms, cov.grid.count) == (int(START.timestamp() * 1000), 48)
    expected = expected_coverage(table, cov.grid)
    for name_, fill_value in (("rows", 0), ("bad", 0), ("counted", 0)):
        assert np.array_equal(
            getattr(cov, name_), dense(expected[name_], cov.members, 48, fill_value)
        ), name_
    for name_ in ("low", "high", "total"):
        want = dense(expected[name_], cov.members, 48, np.nan if name_ != "total" else 0.0)
        assert np.allclose(getattr(cov, name_), want, equal_nan=True), name_
    index = {member: i for i, member in enumerate(cov.members)}
    assert cov.gaps(index[NUMBER]) == 4, "the four-hour hole"
    assert cov.bad_buckets(index[NUMBER]) == 2
    assert cov.gaps(index[SILENT]) == 48, "an extracted tag without a row is all gap"
    assert cov.bad_buckets(index[HOSTILE]) == 2, "null quality counts as bad, like 64"
    assert np.nanmax(cov.high[index[FLAG]]) == 1.0
    assert np.nanmin(cov.low[index[FLAG]]) == 0.0
    assert cov.counted[index[TEXT]].sum() == 0, "text values have no trend"
    assert cov.totals == {
        "members": 5,
        "rows": table.num_rows,
        "bad_rows": int((table.column("quality").to_pandas().fillna(-1) < 192).sum()),
        "members_with_gaps": 2,
        "members_held": 0,
        "members_missing": 0,
    }


def test_start_and_end_cut_the_rows_and_the_extracted_range(project: tuple[Path, Any]) -> None:
    path, name = project
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        table = fill(sinks, name)
        cov = tag_coverage(sinks.get(name), "f", "f", start=START + 9 * HOUR, end=START + 15 * HOUR)
        hourly = tag_coverage(
            sinks.get(name), "f", "f", start=START + 9 * HOUR, end=START + 15 * HOUR, bucket=HOUR
        )
    assert cov.window == Window(START + 9 * HOUR, START + 15 * HOUR)
    assert cov.grid.bucket == timedelta(minutes=5), "six hours make 72 buckets of 5 minutes"
    ts = table.column("ts").to_pandas()
    inside = ((ts >= START + 9 * HOUR) & (ts < START + 15 * HOUR)).sum()
    assert cov.rows.sum() == inside
    index = hourly.members.index(NUMBER)
    assert hourly.gaps(index) == 4, "10:00 to 14:00"


def test_buckets_outside_the_progress_are_not_extracted_not_gaps(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        node={"url": "http://127.0.0.1:9"},
        flows={"f": {"node": "n", "tags": {"paths": ["/a", "/b"]}, "start": "-1d"}},
        sinks=["lake"],
    )
    config = load(path)
    rows = tag_table([("/a", START + i * HOUR, 1.0, 192) for i in range(6)])
    with SinkSet(config, path.parent) as sinks:
        lake = sinks.get("lake")
        lake.write(
            scope("f", KIND_TAG_HISTORY, ("/a", "/b"), Window(START, START + 4 * HOUR), "1"),
            frame_from_table(rows.slice(0, 4)),
            4,
        )
        lake.write(
            scope("f", KIND_TAG_HISTORY, ("/a",), Window(START + 4 * HOUR, START + 6 * HOUR), "2"),
            frame_from_table(rows.slice(4)),
            2,
        )
        cov = tag_coverage(lake, "f", "f", bucket=HOUR)
    assert cov.members == ["/a", "/b"]
    assert (cov.gaps(0), cov.not_extracted(0)) == (0, 0)
    assert (cov.gaps(1), cov.not_extracted(1)) == (4, 2), "/b was extracted for 4 of the 6 hours"


def test_a_tag_the_node_left_out_is_drawn_with_its_missing_windows(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        node={"url": "http://127.0.0.1:9"},
        flows={"f": {"node": "n", "tags": {"paths": ["/a", "/b"]}, "start": "-1d"}},
        sinks=["lake"],
    )
    rows = tag_table([("/a", START + i * HOUR, 1.0, 192) for i in range(3)])
    members = ("/a", missing_member("/b"))  # what the engine writes when /b is not answered
    with SinkSet(load(path), tmp_path) as sinks:
        lake = sinks.get("lake")
        lake.write(
            scope("f", KIND_TAG_HISTORY, members, Window(START, START + 3 * HOUR), "1"),
            frame_from_table(rows),
            3,
        )
        cov = tag_coverage(lake, "f", "f", bucket=HOUR)
    # Its own series (not one named `missing:/b`), its windows drawn as missing (ledger).
    assert cov.members == ["/a", "/b"]
    assert cov.window == Window(START, START + 3 * HOUR)
    assert (cov.missing_buckets(1), cov.rows[1].sum(), cov.gaps(1)) == (3, 0, 0)
    assert cov.totals["members_missing"] == 1


def test_held_and_missing_windows_come_from_the_ledger_drawn_apart_from_gaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(
        tmp_path,
        node={"url": "http://127.0.0.1:9"},
        flows={"f": {"node": "n", "tags": {"paths": ["/a", "/b", "/c"]}, "start": "-1d"}},
        sinks=["lake"],
    )
    rows = tag_table([("/a", START + i * HOUR, 1.0, 192) for i in (0, 2)])
    rows = pa.concat_tables([rows, tag_table([("/b", START, 2.0, 192)])])
    window = Window(START, START + 3 * HOUR)
    held = ChunkScope(
        "f", "f", KIND_TAG_HISTORY, ("/a", "/b", missing_member("/c")), window, "f-1",
        {"kind": KIND_TAG_HISTORY}, node="n", held={"/b": "link to site 2 still draining"},
    )  # fmt: skip

    def no_scan(self: object) -> None:
        raise AssertionError("the range was taken from the rows, not the ledger")

    monkeypatch.setattr("sinks.lake.coverage.LakeCoverage.span", no_scan)
    with SinkSet(load(path), tmp_path) as sinks:
        lake = sinks.get("lake")
        lake.write(held, frame_from_table(rows), 3)
        cov = tag_coverage(lake, "f", "f", bucket=HOUR)
    assert cov.members == ["/a", "/b", "/c"]
    assert cov.window == window
    assert [cov.held_buckets(i) for i in range(3)] == [0, 3, 0]
    assert [cov.missing_buckets(i) for i in range(3)] == [0, 0, 3]
    # A held window is not proven (progress leaves it out): its empty buckets are held,
    # not gaps; an extracted bucket without rows stays a gap.
    assert [cov.gaps(i) for i in range(3)] == [1, 0, 0], "gaps stay gaps"
    assert cov.reasons == {"/b": ["link to site 2 still draining"]}
    page = render_tag_page(cov, title="t", where="w")
    assert "link to site 2 still draining" in page
    assert "<th>held buckets</th><th>missing buckets</th>" in page


def test_alarms_are_counted_by_priority_and_status(project: tuple[Path, Any]) -> None:
    path, name = project
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        fill(sinks, name)
        cov = alarm_coverage(sinks.get(name), "al", "al", bucket=HOUR)
    assert cov.paths == sorted({row[0] for row in ALARMS})
    assert cov.totals == {"paths": 4, "events": 7}
    assert cov.by_priority.sum(axis=1).tolist() == [1, 2, 1, 0, 3], "other, Low .. Critical"
    assert cov.by_status.sum(axis=1).tolist() == [1, 1, 1, 3, 1], "states 0..3, then other"
    a = cov.paths.index("/Alarms/a HI")
    assert cov.events[a, 0] == 3
    assert cov.path_status[a].tolist() == [1, 1, 0, 1, 0]
    assert cov.by_priority[4, 0] == 3, "three Critical events in the first hour"


def test_the_report_never_reads_a_whole_dataset(project: tuple[Path, Any]) -> None:
    path, name = project
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        fill(sinks, name)
        sink = sinks.get(name)

        def refuse(dataset: str, kind: str) -> pd.DataFrame:
            raise AssertionError(f"read({dataset!r}) loads every row")

        sink.read = refuse  # type: ignore[method-assign]
        tags = tag_coverage(sink, "f", "f")
        alarms = alarm_coverage(sink, "al", "al")
    assert tags.rows.sum() > 0
    assert alarms.events.sum() == len(ALARMS)


# -- the time grid -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("span", "bucket"),
    [
        (timedelta(seconds=50), timedelta(seconds=1)),
        (timedelta(hours=1), timedelta(minutes=1)),
        (timedelta(days=1), timedelta(minutes=15)),
        (timedelta(days=30), timedelta(hours=12)),
        (timedelta(days=365), timedelta(days=7)),
        (timedelta(days=3650), timedelta(days=91)),
    ],
)
def test_the_automatic_bucket_is_round_and_gives_at_most_a_hundred(
    span: timedelta, bucket: timedelta
) -> None:
    assert nice_bucket(span) == bucket
    grid = plan_grid(Window(START + timedelta(minutes=7), START + timedelta(minutes=7) + span))
    assert grid.count <= 101
    weeks = bucket % timedelta(days=7) == timedelta(0)
    origin = 4 * 86_400_000 if weeks else 0  # weeks (and multiples) from Monday 1970-01-05
    assert (grid.start_ms - origin) % grid.bucket_ms == 0


def test_weekly_buckets_start_on_monday() -> None:
    grid = plan_grid(
        Window(START + timedelta(days=3), START + timedelta(days=300)), timedelta(days=7)
    )
    assert datetime.fromtimestamp(grid.start_ms / 1000, UTC).weekday() == 0


@pytest.mark.parametrize(
    ("bucket", "message"),
    [
        (timedelta(seconds=1), f"at most {MAX_BUCKETS:,}"),
        (timedelta(milliseconds=10), "shorter than a second"),
    ],
)
def test_a_bucket_that_cannot_be_drawn_is_a_range_error(bucket: timedelta, message: str) -> None:
    with pytest.raises(RangeError, match=message):
        plan_grid(Window(START, START + timedelta(days=365)), bucket)


# -- the pictures --------------------------------------------------------------------------------


def made_up_coverage(span: timedelta, members: int) -> TagCoverage:
    window = Window(START + timedelta(minutes=13), START + timedelta(minutes=13) + span)
    grid = plan_grid(window)
    rng = np.random.default_rng(1)
    shape = (members, grid.count)
    rows = rng.integers(0, 400, shape)
    low = rng.normal(0, 1, shape)
    return TagCoverage(
        flow="f",
        window=window,
        grid=grid,
        members=[
            f"/Plant/Line {i}/" + "Tag with a long name " * (i % 3) + str(i) for i in range(members)
        ],
        rows=rows,
        bad=np.where(rng.random(shape) < 0.1, rows // 2, 0),
        low=np.where(rows > 0, low, np.nan),
        high=np.where(rows > 0, low + 1, np.nan),
        total=np.where(rows > 0, low + 0.5, 0.0),
        counted=np.where(rows > 0, 1, 0),
        extracted=rng.random(shape) < 0.95,
    )


def label_boxes(figure: Any) -> list[tuple[str, Any]]:
    """Every tick label matplotlib draws (ticks inside the view), every text beside the
    axes (series names, trend ranges) and every legend's text, with its box on the page."""
    figure.draw_without_rendering()
    boxes = []
    axes = list(figure.axes)
    axes += [
        c for ax in figure.axes for c in ax.get_children() if type(c).__name__ == "SecondaryAxis"
    ]
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            for tick in axis.get_major_ticks():
                if not lo <= tick.get_loc() <= hi:
                    continue
                for text in (tick.label1, tick.label2):
                    if text.get_visible() and text.get_text():
                        boxes.append((text.get_text(), text.get_window_extent()))
        boxes += [(t.get_text(), t.get_window_extent()) for t in ax.texts if t.get_text()]
        legend = ax.get_legend()
        if legend is not None:  # the keys' entries and titles, in words
            texts = [*legend.get_texts(), legend.get_title()]
            boxes += [(t.get_text(), t.get_window_extent()) for t in texts if t.get_text()]
    return boxes


SPANS = [
    timedelta(seconds=40),
    timedelta(minutes=10),
    timedelta(hours=1),
    timedelta(hours=7),
    timedelta(days=1),
    timedelta(days=9),
    timedelta(days=31),
    timedelta(days=365),
    timedelta(days=800),
    timedelta(days=3650),
]


@pytest.mark.parametrize("span", SPANS, ids=[str(s) for s in SPANS])
def test_no_labels_overlap_at_any_range(span: timedelta) -> None:
    for name, figure in tag_figures(made_up_coverage(span, 30)):
        boxes = label_boxes(figure)
        assert len(boxes) > 3, name
        for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2):
            assert not box_a.overlaps(box_b), f"{name}: {a!r} overlaps {b!r}"


def test_four_hundred_tags_get_a_label_each_without_overlap() -> None:
    cov = made_up_coverage(timedelta(days=2), 450)
    grid = dict(tag_figures(cov))["grid"]
    names = [t for t in grid.axes[0].texts if t.get_text()]
    assert [t.get_text() for t in names] == [label(m) for m in cov.members[:MAX_ROWS_DRAWN]]
    boxes = [box for text, box in label_boxes(grid) if text in {t.get_text() for t in names}]
    assert len(boxes) == MAX_ROWS_DRAWN
    ordered = sorted(boxes, key=lambda b: b.y0)
    assert all(low.y1 <= high.y0 + 0.01 for low, high in itertools.pairwise(ordered))


def test_labels_keep_the_leaf_and_show_control_characters() -> None:
    assert label("/a/b/c") == "/a/b/c"
    assert label("/x" * 40 + "/Leaf name").endswith("/x/Leaf name")
    assert label("/x" * 40 + "/Leaf name").startswith("…")
    assert label("/a\x01b") == "/a\\x01b"


def test_series_are_in_natural_order() -> None:
    names = ["/T 10", "/T 9", "/T 09", "/a", "/T 100", "/T 9b"]
    assert sorted(names, key=natural_key) == ["/T 09", "/T 9", "/T 9b", "/T 10", "/T 100", "/a"]


def test_colour_bar_ticks_are_round_numbers_up_to_the_peak() -> None:
    assert log_ticks(60) == [1, 2, 5, 10, 20, 50]
    assert log_ticks(3600) == [1, 10, 100, 1000]


# -- the page ------------------------------------------------------------------------------------


class Elements(HTMLParser):
    """Element names and every text node of a page, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.urls: list[str] = []
        self.text: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.urls += [v or "" for k, v in attrs if k in ("href", "src", "xlink:href")]
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if not self._in_style:
            self.text.append(data)


def parsed(page: str) -> Elements:
    elements = Elements()
    elements.feed(page)
    return elements


def test_write_report_is_one_self_contained_page_with_every_path_escaped(
    project: tuple[Path, Any],
) -> None:
    path, name = project
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        fill(sinks, name)
        tags_page = write_report(
            config, "f", path.parent / "out" / "f.html", sinks=sinks
        ).read_text(encoding="utf-8")
        alarm_page = write_report(
            config, "al", path.parent / "out" / "al.html", sinks=sinks
        ).read_text(encoding="utf-8")
    for page, figures in ((tags_page, 3), (alarm_page, 3)):
        elements = parsed(page)
        assert "script" not in elements.tags
        assert elements.tags.count("svg") == figures
        assert all(url.startswith(("data:image/png;base64,", "#")) for url in elements.urls), (
            elements.urls
        )
        assert re.search(r"https?://(?!www\.w3\.org/)", page) is None, "nothing to fetch"
        assert "\\x01" in "".join(elements.text), "the control character is shown escaped"
    text = "".join(parsed(tags_page).text)
    assert html.escape(HOSTILE.replace("\x01", "\\x01")) in tags_page
    assert "…" in text, "the hostile path is shortened on the axis"
    assert "$x$" in text, "no mathtext: a $ stays a $"
    assert "2026-01-05 00:00Z to 2026-01-07 00:00Z" in text
    assert "in buckets of 30 min" in text
    alarm_text = "".join(parsed(alarm_page).text)
    for words in ("Critical (3)", "Low (2)", "active, unacknowledged (3)", "other (1)", "7"):
        assert words in alarm_text, words
    assert "gap" not in alarm_text
    assert "bad quality" not in alarm_text


def test_an_empty_dataset_gives_a_page_that_says_so(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        node={"url": "http://127.0.0.1:9"},
        flows={"f": {"node": "n", "tags": {"paths": ["/a"]}, "start": "-1d"}},
        sinks=["lake"],
    )
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        page = write_report(config, "f", tmp_path / "f.html", sinks=sinks).read_text(
            encoding="utf-8"
        )
    assert "Nothing extracted and no row held" in page
    assert "<svg" not in page


def test_pages_render_without_matplotlib_warnings() -> None:
    cov = made_up_coverage(timedelta(days=2), 5)
    page = render_tag_page(cov, title="t", where="w")
    assert page.count("<svg") == 3
    alarms = AlarmCoverage(
        "al",
        cov.window,
        cov.grid,
        ["/a 🌊"],
        cov.rows[:1],
        np.ones((5, cov.grid.count), np.int64),
        np.ones((5, cov.grid.count), np.int64),
        np.ones((1, 5), np.int64),
        np.ones((1, 5), np.int64),
    )
    assert (
        render_alarm_page(alarms, title="t", where="w").count("<svg")
        == len(alarm_figures(alarms))
        == 3
    )


# -- in a real browser ---------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium not installed (apt-get install -y chromium); bench/report_screenshot.py documents the check",
)


def in_chromium(page: Path, png: Path) -> str:
    """The page as headless Chromium renders it, offline with a fresh profile: its DOM, and
    its screenshot in `png`."""
    assert CHROMIUM is not None
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--window-size=1280,1400",
        "--force-color-profile=srgb",
    ]
    with tempfile.TemporaryDirectory(prefix="historian-chromium-") as profile:
        common = [CHROMIUM, *flags, f"--user-data-dir={profile}"]
        dom = subprocess.run(
            [*common, "--dump-dom", page.as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        subprocess.run(
            [*common, f"--screenshot={png}", page.as_uri()],
            capture_output=True,
            timeout=120,
            check=True,
        )
    return dom


def screen_colours(png: Path) -> dict[tuple[int, int, int], int]:
    """How many pixels of the screenshot have each colour."""
    from PIL import Image

    with Image.open(png) as shot:
        colours = shot.convert("RGB").getcolors(maxcolors=1 << 22)
    assert colours is not None
    return {colour: count for count, colour in colours}


@pytest.mark.slow
@needs_chromium
def test_headless_chromium_draws_the_page_offline_with_hostile_paths_as_text(
    tmp_path: Path,
) -> None:
    path = two_flows(tmp_path, "lake")
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        fill(sinks, "lake")
        page = write_report(config, "f", tmp_path / "f.html", sinks=sinks)
    dom = in_chromium(page, tmp_path / "f.png")
    elements = parsed(dom)
    assert "script" not in elements.tags, "the hostile path did not become markup"
    assert elements.tags.count("svg") == 3
    assert elements.tags.count("tr") == 6, "a header and five tags: the table survived"
    assert "</svg><script>alert(1)</script>" in "".join(elements.text)
    assert len(screen_colours(tmp_path / "f.png")) > 50, "the screenshot shows the drawings"


def shares_coverage(shares: list[float], rows: int = 400) -> TagCoverage:
    """A day of hourly buckets, `rows` rows in each, per tag that share of them bad."""
    window = Window(START, START + timedelta(days=1))
    grid = plan_grid(window, HOUR)
    shape = (len(shares), grid.count)
    counts = np.full(shape, rows, np.int64)
    bad = np.array([[round(rows * share)] * grid.count for share in shares], np.int64)
    return TagCoverage(
        flow="f",
        window=window,
        grid=grid,
        members=[f"/Plant/{share:.0%} bad" for share in shares],
        rows=counts,
        bad=bad,
        low=np.zeros(shape),
        high=np.ones(shape),
        total=np.full(shape, 0.5),
        counted=np.ones(shape, np.int64),
        extracted=np.ones(shape, bool),
    )


def rgb(colour: Any) -> tuple[int, int, int]:
    red, green, blue = (round(float(c) * 255) for c in list(colour)[:3])
    return red, green, blue


@pytest.mark.slow
@needs_chromium
def test_headless_chromium_colours_buckets_by_bad_share_from_a_neutral_zero_with_a_key(
    tmp_path: Path,
) -> None:
    """Three tags whose buckets are 0%, 3% and 100% bad: in the rendered page the first is
    the good green, the second a light pink, the third the full red, each a whole row of
    cells; and the key says what each colour means, in words and %."""
    from matplotlib import colormaps

    from pipelines.report.charts import bad_share_colours

    page = tmp_path / "shares.html"
    page.write_text(render_tag_page(shares_coverage([0.0, 0.03, 1.0]), title="t", where="w"))
    dom = in_chromium(page, tmp_path / "shares.png")
    seen = screen_colours(tmp_path / "shares.png")

    good = rgb(colormaps["Greens"](1.0))  # 400 rows, the most of any bucket: the darkest
    light, full = (rgb(c) for c in bad_share_colours(np.array([0.03, 1.0])))
    row_px = 24 * 10  # a row of 24 cells, at least 10 px wide and 10 px high on screen
    for name, colour in (("0% bad: good", good), ("3% bad", light), ("100% bad", full)):
        assert seen.get(colour, 0) >= row_px, (
            name,
            colour,
            sorted(seen.items(), key=lambda c: -c[1])[:8],
        )
    assert sum(light) / 3 >= 220, f"3% bad is light: {light}"
    assert max(full) <= 170, f"100% bad is the full, dark red: {full}"
    assert full[0] > 2 * full[1], f"100% bad is red: {full}"
    old_salmon = rgb(colormaps["Reds"](0.35))  # the scale that made 3% look all bad
    assert seen.get(old_salmon, 0) < row_px

    text = " ".join(" ".join(parsed(dom).text).split())
    for words in (
        "bad-quality rows in a bucket",
        "0%: none bad",
        "3%: a few bad",
        "25%",
        "100%: all bad",
    ):
        assert words in text, words
