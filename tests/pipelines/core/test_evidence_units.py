"""Issue 27, items 1, 3 and 5: an answer is complete only when it proves it.

Each test runs the whole pipeline (direct) against the real simulator over loopback with
the profile that reproduces the situation, into a Parquet lake and DuckDB, and compares
the sinks with the simulator's ground truth row for row (or, where nothing exact is
possible, checks that the run stops with one line and nothing is marked complete). Each
failed before the pipeline handled its situation.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.options import AlarmFilter, HistoryOptions
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.core.runner import RunFailed, RunRequest
from tests.fixtures import load, truth_alarm_rows, truth_history_rows, write_config
from tests.pipelines.core.test_situations import NOW, assert_sinks_hold, flow_of, run, served

START = NOW - timedelta(hours=2)
SPAN = Window(START, NOW)
RAW = HistoryOptions(mode="raw")
AVG = HistoryOptions(mode="aggregated", method="avg", interval_ms=900_000)


def aggregated_flow(tags: dict[str, Any]) -> dict[str, Any]:
    return flow_of(tags, mode="aggregated", method="avg", interval="15m", window="1h")


def nothing_complete(path: Path, flow: str, tags: list[str]) -> None:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.flows[flow].sinks:
            progress = sinks.get(name).progress(flow)
            for tag in tags:
                assert not progress.windows_of(tag), f"{name}: {tag} marked complete"
            assert sinks.get(name).read(flow, "tag_history").empty, name


# -- 1. timestamps in another unit ---------------------------------------------------------


@pytest.mark.parametrize("profile", ["rows-epoch-seconds", "rows-iso"])
@pytest.mark.parametrize("mode", ["raw", "aggregated"])
def test_row_stamps_in_seconds_or_iso_text_are_read_in_their_unit(
    tmp_path: Path, profile: str, mode: str
) -> None:
    with served(profile) as (node, url):
        tags = node.tag_paths()[:10]
        flow = flow_of({"paths": tags}) if mode == "raw" else aggregated_flow({"paths": tags})
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow})
        summary = run(path, "f")
    assert_sinks_hold(
        path, "f", truth_history_rows(node, tags, [SPAN], RAW if mode == "raw" else AVG)
    )
    assert summary.rows_out_of_range == 0


def test_alarm_stamps_in_iso_text_are_read_as_such(tmp_path: Path) -> None:
    with served("rows-iso") as (node, url):
        flow = {
            "node": "n",
            "kind": "alarm_history",
            "alarms": {"path": "/"},
            "window": "6h",
            "start": (NOW - timedelta(days=1)).isoformat(),
            "settle": "0s",
        }
        path = write_config(tmp_path, node={"url": url}, flows={"alarms": flow})
        run(path, "alarms")
    want = truth_alarm_rows(node, Window(NOW - timedelta(days=1), NOW), AlarmFilter())
    assert_sinks_hold(path, "alarms", want, "alarm_history")


@pytest.mark.parametrize("mode", ["raw", "aggregated"])
def test_an_answer_in_an_unknown_unit_is_refused_in_one_line_and_nothing_is_complete(
    tmp_path: Path, mode: str
) -> None:
    """Stamps in microseconds: every row outside the query. Refused, not complete, and a
    backfill against a plain node afterwards is exact."""
    with served("rows_epoch_micros") as (node, url):
        tags = node.tag_paths()[:10]
        flow = flow_of({"paths": tags}) if mode == "raw" else aggregated_flow({"paths": tags})
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow})
        with pytest.raises(RunFailed) as caught:
            run(path, "f")
    message = str(caught.value)
    assert "\n" not in message
    assert "outside the query" in message
    nothing_complete(path, "f", tags)
    with served("default") as (plain, url):
        write_config(tmp_path, node={"url": url}, flows={"f": flow})
        run(path, "f", request=RunRequest(start=START, backfill=True))
    options = RAW if mode == "raw" else AVG
    assert_sinks_hold(path, "f", truth_history_rows(plain, tags, [SPAN], options))


def test_a_few_stray_rows_beside_rows_in_the_window_are_dropped_and_counted(
    tmp_path: Path,
) -> None:
    with served("garbled-timestamps+rows-epoch-seconds") as (node, url):
        tags = node.tag_paths()[:12]
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow_of({"paths": tags})})
        summary = run(path, "f")
    assert_sinks_hold(path, "f", truth_history_rows(node, tags, [SPAN], RAW))
    assert summary.rows_out_of_range > 0


# -- 3. aggregated buckets stamped at their end ----------------------------------------------


@pytest.mark.parametrize("profile", ["buckets-at-end", "buckets-at-end+rows-iso"])
def test_buckets_stamped_at_their_end_are_stored_at_their_start(
    tmp_path: Path, profile: str
) -> None:
    with served(profile) as (node, url):
        tags = node.tag_paths()[:10]
        path = write_config(
            tmp_path, node={"url": url}, flows={"f": aggregated_flow({"paths": tags})}
        )
        summary = run(path, "f")
    assert_sinks_hold(path, "f", truth_history_rows(node, tags, [SPAN], AVG))
    assert summary.rows_out_of_range == 0


# -- 5. numbers sent as strings --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["raw", "aggregated"])
def test_numbers_sent_as_strings_land_in_the_number_column(tmp_path: Path, mode: str) -> None:
    with served("numbers-as-strings") as (node, url):
        tags = node.tag_paths()[:12]
        assert {node.tree().by_path[t].type for t in tags} >= {"number", "boolean", "string"}
        flow = flow_of({"paths": tags}) if mode == "raw" else aggregated_flow({"paths": tags})
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow})
        summary = run(path, "f")
    assert_sinks_hold(
        path, "f", truth_history_rows(node, tags, [SPAN], RAW if mode == "raw" else AVG)
    )
    assert summary.values_not_of_type == 0


def test_a_value_that_is_not_of_the_tags_type_is_kept_counted_and_reported(
    tmp_path: Path,
) -> None:
    with served("numbers-as-strings") as (node, url):
        tags = [t for t in node.tag_paths() if node.tree().by_path[t].type == "number"][:4]
        node.add_late_sample(tags[0], int((NOW - timedelta(minutes=30)).timestamp() * 1000), "n/a")
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow_of({"paths": tags})})
        summary = run(path, "f")
    want = truth_history_rows(node, tags, [SPAN], RAW)
    assert sum(1 for row in want if row[3] == ("str", "n/a")) == 1
    assert_sinks_hold(path, "f", want)
    assert summary.values_not_of_type == 1
    assert any("not of their tag's configured type" in line for line in summary.remarks)
