"""Issue 15's six situations, each against a node that differs from the default reading.

Each test runs the whole pipeline (direct) against the real simulator over loopback, with
the profile that reproduces the situation, into a Parquet lake and DuckDB, and compares
the sinks with the simulator's ground truth row for row. Each failed before the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from connectors.options import AlarmFilter, HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.cli.app import app
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunFailed, RunRequest, RunSummary
from pipelines.core.units import run_flow
from pipelines.planning import align_down, plan_windows
from pipelines.state import missing_windows, tag_members
from tests.fixtures import (
    alarm_rows,
    history_rows,
    load,
    truth_alarm_rows,
    truth_history_rows,
    write_config,
)

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
RAW = HistoryOptions(mode="raw")


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@contextmanager
def served(
    profile: str, *, tags: int = 24, raw_cap: int = 10_000
) -> Iterator[tuple[SimulatedNode, str]]:
    node = SimulatedNode(SimConfig(seed=21, tags=tags, raw_cap=raw_cap, profile=profile))
    node.set_clock(ms(NOW))
    with run_server(node, http_port=0, https_port=None) as server:
        yield node, server.http_url


def flow_of(tags: dict[str, Any], **extra: Any) -> dict[str, Any]:
    flow: dict[str, Any] = {
        "node": "n",
        "tags": tags,
        "mode": "raw",
        "window": "30m",
        "batch": 7,
        "start": (NOW - timedelta(hours=2)).isoformat(),
        "settle": "0s",
    }
    flow.update(extra)
    return flow


def run(
    path: Path, flow: str, *, now: datetime = NOW, request: RunRequest | None = None
) -> RunSummary:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, flow, nodes=nodes, sinks=sinks, request=request, now=now)


def contents(path: Path, dataset: str, kind: str = "tag_history") -> dict[str, list[Any]]:
    config = load(path)
    read = alarm_rows if kind == "alarm_history" else history_rows
    written = {name for flow in config.flows.values() for name in flow.sinks}
    with SinkSet(config, path.parent) as sinks:
        return {name: read(sinks.get(name).read(dataset, kind)) for name in sorted(written)}


def assert_sinks_hold(path: Path, dataset: str, want: list[Any], kind: str = "tag_history") -> None:
    assert want, "the truth is not empty"
    for sink, rows in contents(path, dataset, kind).items():
        missing = sorted(set(want) - set(rows))
        extra = sorted(set(rows) - set(want))
        assert (missing[:3], extra[:3]) == ([], []), sink
        assert len(rows) == len(want), f"{sink}: duplicated rows"


# -- 1. leaf names repeated across groups ---------------------------------------------------


@pytest.mark.parametrize(
    "selection",
    [
        pytest.param({"group": "/Plant A/", "regex": ".", "recurrent": True}, id="group"),
        pytest.param({"browse": "/", "include": ["^/Plant A/"]}, id="browse"),
    ],
)
def test_tags_sharing_a_leaf_name_are_all_extracted(
    tmp_path: Path, selection: dict[str, Any]
) -> None:
    with served("repeated-names") as (node, url):
        under = sorted(p for p in node.tag_paths() if p.startswith("/Plant A/"))
        leaves = [p.rsplit("/", 1)[1] for p in under]
        assert len(set(leaves)) < len(leaves), "the profile repeats names"
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow_of(selection)})
        summary = run(path, "f")
    assert_sinks_hold(
        path, "f", truth_history_rows(node, under, [Window(NOW - timedelta(hours=2), NOW)], RAW)
    )
    assert summary.tags == len(under)
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.sinks:
            metadata = sinks.get(name).read("tag_metadata", "tag_metadata")
            assert sorted(metadata["tag"]) == under, name


# -- 2. an end in the future -----------------------------------------------------------------


def test_an_end_in_the_future_is_cut_at_now_minus_settle_and_later_runs_continue(
    tmp_path: Path,
) -> None:
    with served("default") as (node, url):
        tags = node.tag_paths()[:6]
        flow = flow_of(
            {"paths": tags}, window="15m", settle="2m", start=(NOW - timedelta(hours=1)).isoformat()
        )
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow})
        future = RunRequest(
            start=NOW - timedelta(hours=1), end=NOW + timedelta(hours=3), backfill=True
        )
        first = run(path, "f", request=future)
        later = NOW + timedelta(minutes=40)
        node.set_clock(ms(later))
        run(path, "f", now=later)
    span = Window(NOW - timedelta(hours=1), later - timedelta(minutes=2))
    assert_sinks_hold(path, "f", truth_history_rows(node, tags, [span], RAW))
    assert first.watermark_after == NOW - timedelta(minutes=2)
    assert any("cut at" in line for line in first.remarks)


def test_state_shows_and_repairs_progress_recorded_past_now(tmp_path: Path) -> None:
    """Progress poisoned the old way (complete past what the node had when written) is
    shown by `historian state` and forgotten by `historian state repair`."""
    # The node's clock is the wall clock, as on a real node: repair judges chunks by the
    # wall-clock time they were committed at, so a node clock behind it (aligned down a
    # minute) would hold less than a repaired chunk claims.
    real = datetime.now(UTC).replace(microsecond=0)
    node = SimulatedNode(SimConfig(seed=21, tags=12))
    node.set_clock(ms(real))
    cli = CliRunner()
    with run_server(node, http_port=0, https_port=None) as server:
        tags = node.tag_paths()[:4]
        flow = flow_of(
            {"paths": tags},
            window="15m",
            settle="5m",
            start=(real - timedelta(hours=1)).isoformat(),
        )
        path = write_config(tmp_path, node={"url": server.http_url}, flows={"f": flow})
        # A run that believes it is 3 hours later, on a node that does too (a node behind
        # the run's clock now bounds the run), records empty windows as complete.
        node.set_clock(ms(real + timedelta(hours=3)))
        run(path, "f", now=real + timedelta(hours=3))
        node.set_clock(ms(real))
        shown = cli.invoke(app, ["state", "--config", str(path)])
        assert "POISONED" in shown.output
        assert "historian state repair f" in shown.output
        repaired = cli.invoke(app, ["state", "repair", "f", "--config", str(path)])
        assert repaired.exit_code == 0, repaired.output
        assert repaired.output.count("repaired f in") == 2
        assert "POISONED" not in cli.invoke(app, ["state", "--config", str(path)]).output
        later = real + timedelta(minutes=10)
        node.set_clock(ms(later))
        run(path, "f", now=later)
    span = Window(real - timedelta(hours=1), later - timedelta(minutes=5))
    want = truth_history_rows(node, tags, [span], RAW)
    for sink, rows in contents(path, "f").items():
        # What the node said it had at its clock 3 hours ahead stays (data stays).
        assert sorted(r for r in rows if r[1] < ms(span.end)) == sorted(want), sink


# -- 3. older nodes --------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["node-1.21.5", "node-1.21.12"])
def test_an_older_node_gets_priority_and_the_maximum_is_applied_here(
    tmp_path: Path, profile: str
) -> None:
    with served(profile) as (node, url):
        flow = {
            "node": "n",
            "kind": "alarm_history",
            "alarms": {"path": "/", "min_priority": 2, "max_priority": 3},
            "window": "6h",
            "start": (NOW - timedelta(days=1)).isoformat(),
            "settle": "0s",
        }
        path = write_config(tmp_path, node={"url": url}, flows={"alarms": flow})
        run(path, "alarms")
    want = truth_alarm_rows(
        node, Window(NOW - timedelta(days=1), NOW), AlarmFilter(min_priority=2, max_priority=3)
    )
    assert {row[3] for row in want} == {2, 3}
    assert_sinks_hold(path, "alarms", want, "alarm_history")


def test_a_method_the_node_cannot_compute_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    with served("node-1.21.5") as (node, url):
        flow = flow_of(
            {"paths": node.tag_paths()[:3]},
            mode="aggregated",
            method="stddev",
            interval="15m",
            window="1h",
        )
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow})
        with pytest.raises(RunFailed) as caught:
            run(path, "f")
    message = str(caught.value)
    assert "\n" not in message
    assert "flows.f.method" in message
    assert "1.21.10" in message
    assert "1.21.5" in message
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.sinks:
            assert sinks.get(name).read("f", "tag_history").empty, name
            assert sinks.get(name).read("tag_metadata", "tag_metadata").empty, name


# -- 4. delta and filter windows on the grid -------------------------------------------------


@pytest.mark.parametrize("mode", ["delta", "filter"])
def test_delta_and_filter_rows_do_not_depend_on_when_runs_happen(tmp_path: Path, mode: str) -> None:
    start = NOW - timedelta(hours=3) + timedelta(minutes=7)  # off the 30-minute grid
    with served("default") as (node, url):
        tags = node.tag_paths()[:6]
        flow = flow_of({"paths": tags}, mode=mode, start=start.isoformat())
        (tmp_path / "often").mkdir()
        (tmp_path / "once").mkdir()
        often = write_config(tmp_path / "often", node={"url": url}, flows={"f": flow})
        for moment in (NOW - timedelta(minutes=71), NOW - timedelta(minutes=23), NOW):
            run(often, "f", now=moment)
        once = write_config(tmp_path / "once", node={"url": url}, flows={"f": flow})
        run(once, "f", request=RunRequest(start=start, end=NOW))
    grid = plan_windows(
        Window(align_down(start, timedelta(minutes=30)), NOW), timedelta(minutes=30)
    )
    want = truth_history_rows(node, tags, grid, HistoryOptions(mode=mode))  # type: ignore[arg-type]
    assert_sinks_hold(often, "f", want)
    assert_sinks_hold(once, "f", want)


# -- 5. a tag left out of an answer ----------------------------------------------------------


def test_a_named_tag_the_node_leaves_out_stops_the_run_naming_tag_and_chunk(tmp_path: Path) -> None:
    with served("lost-tags") as (node, url):
        lost = next(p for p in node.tag_paths() if node.tree().by_path[p].index % 7 == 3)
        tags = [lost, *[p for p in node.tag_paths() if p != lost][:4]]
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow_of({"paths": tags})})
        with pytest.raises(RunFailed) as caught:
            run(path, "f")
    message = str(caught.value)
    assert "\n" not in message
    assert f"tag {lost!r} left out of the node's answers for 5 tags" in message
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.sinks:
            assert not sinks.get(name).progress("f").windows_of(lost), name


@pytest.mark.parametrize(
    "warehouse", ["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_group_tag_the_node_leaves_out_is_reported_missing_and_never_complete(
    tmp_path: Path, warehouse: str, request: pytest.FixtureRequest
) -> None:
    pg = None
    if warehouse == "postgres":
        pg = (request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))
    with served("lost-tags") as (node, url):
        under = sorted(p for p in node.tag_paths() if p.startswith("/Plant B/"))
        lost = sorted(p for p in under if node.tree().by_path[p].index % 7 == 3)
        assert lost
        flow = flow_of({"group": "/Plant B/", "recurrent": True})
        sinks = ["lake", "pg"] if pg else None
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow}, pg=pg, sinks=sinks)
        summary = run(path, "f")
        again = run(path, "f", request=RunRequest(start=NOW - timedelta(hours=2), backfill=True))
    kept = [p for p in under if p not in lost]
    assert_sinks_hold(
        path, "f", truth_history_rows(node, kept, [Window(NOW - timedelta(hours=2), NOW)], RAW)
    )
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.flows["f"].sinks:
            progress = sinks.get(name).progress("f")
            assert tag_members(progress) == kept, name
            assert sorted(missing_windows(progress)) == lost, name
    assert sorted(summary.missing) == lost
    assert all(len(windows) == 4 for windows in summary.missing.values())
    assert any("left out of the node's answers" in line for line in summary.remarks)
    assert again.chunks_done == again.chunks_planned == 4, "a backfill asks for them again"
    shown = CliRunner().invoke(app, ["state", "--config", str(path)])
    assert f"MISSING f -> lake: tag {lost[0]!r}" in shown.output


def test_tags_left_out_once_are_asked_again_and_nothing_is_missing(tmp_path: Path) -> None:
    with served("flaky-tags-null+raw-cap", raw_cap=300) as (node, url):
        under = sorted(p for p in node.tag_paths() if p.startswith("/Plant B/"))
        flow = flow_of({"group": "/Plant B/", "recurrent": True})
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow})
        summary = run(path, "f")
    assert_sinks_hold(
        path, "f", truth_history_rows(node, under, [Window(NOW - timedelta(hours=2), NOW)], RAW)
    )
    assert summary.missing == {}


# -- 6. timestamps outside the window --------------------------------------------------------


def test_rows_stamped_outside_the_query_are_dropped_counted_and_never_steer(tmp_path: Path) -> None:
    with served("garbled-timestamps+raw-cap") as (node, url):
        tags = node.tag_paths()[:12]
        path = write_config(tmp_path, node={"url": url}, flows={"f": flow_of({"paths": tags})})
        summary = run(path, "f")
    assert_sinks_hold(
        path, "f", truth_history_rows(node, tags, [Window(NOW - timedelta(hours=2), NOW)], RAW)
    )
    assert summary.rows_out_of_range > 0
    assert any("stamped outside their query" in line for line in summary.remarks)
