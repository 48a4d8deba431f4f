"""Link outages and store-and-forward (issue 28, item 1): windows of remote tags behind a
link that is offline or still draining are held, not marked complete, and read again once
the link has delivered; a bound turns a long hold into a missing window.

The whole pipeline against the simulator (`link-outage` profile, its clock set by the
test) over loopback, into the lake and DuckDB, and the real PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from connectors import models
from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.cli.app import app
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.holds import (
    ANY_LINK,
    LinkHealth,
    TagLink,
    apply_holds,
    holds_of,
    link_health,
    tag_links,
)
from pipelines.core.runner import RunSummary
from pipelines.core.units import run_flow
from pipelines.state import held_windows, missing_windows
from sinks.base import ReadsLedger
from tests.fixtures import history_rows, load, truth_history_rows, write_config

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
START = NOW - timedelta(minutes=30)
RAW = HistoryOptions(mode="raw")
MINUTE = timedelta(minutes=1)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


@contextmanager
def served(profile: str = "link-outage") -> Iterator[tuple[SimulatedNode, str]]:
    node = SimulatedNode(SimConfig(seed=21, tags=60, profile=profile))
    node.set_clock(ms(NOW))
    with run_server(node, http_port=0, https_port=None) as server:
        yield node, server.http_url


def chosen_tags(node: SimulatedNode) -> tuple[list[str], list[str]]:
    """Every remote tag, and as many local ones."""
    specs = node.tree().specs
    remote = [spec.path for spec in specs if spec.remote_lag_ms]
    local = [spec.path for spec in specs if not spec.remote_lag_ms][: len(remote)]
    assert remote
    assert local
    return remote, local


def config_for(
    tmp_path: Path, url: str, tags: list[str], pg: tuple[str, str] | None, **extra: Any
) -> Path:
    flow: dict[str, Any] = {
        "node": "n",
        "tags": {"paths": tags},
        "mode": "raw",
        "window": "1m",
        "start": START.isoformat(),
        "settle": "0s",
        "lookback": "2m",  # the issue's look-back: shorter than the outage
        **extra,
    }
    sinks = ["lake", "duck", "pg"] if pg else ["lake", "duck"]
    return write_config(tmp_path, node={"url": url}, flows={"f": flow}, pg=pg, sinks=sinks)


def run_at(path: Path, node: SimulatedNode, now: datetime) -> RunSummary:
    """One run with the node's clock (and the run's) at `now`."""
    node.set_clock(ms(now))
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, "f", nodes=nodes, sinks=sinks, now=now)


def sink_rows(path: Path, before: datetime) -> dict[str, list[Any]]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: [
                row
                for row in history_rows(sinks.get(name).read("f", "tag_history"))
                if row[1] < ms(before)
            ]
            for name in config.flows["f"].sinks
        }


def progresses(path: Path) -> dict[str, Any]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {name: sinks.get(name).progress("f") for name in config.flows["f"].sinks}


def ledger_statuses(path: Path) -> dict[str, dict[str, set[str]]]:
    """Per sink keeping a ledger, each tag's statuses in it (the latest windows' included)."""
    config = load(path)
    found: dict[str, dict[str, set[str]]] = {}
    with SinkSet(config, path.parent) as sinks:
        for name in config.flows["f"].sinks:
            sink = sinks.get(name)
            if isinstance(sink, ReadsLedger):
                table = sink.read_ledger("f").to_pylist()
                found[name] = {}
                for row in table:
                    found[name].setdefault(row["tag"], set()).add(row["status"])
    return found


def state_output(path: Path) -> str:
    return CliRunner().invoke(app, ["state", "--config", str(path)]).output


def pg_of(warehouse: str, request: pytest.FixtureRequest) -> tuple[str, str] | None:
    if warehouse != "postgres":
        return None
    return request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema")


WAREHOUSES = ["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("warehouse", WAREHOUSES)
def test_an_outage_longer_than_the_lookback_reaches_every_sink_after_the_link_drains(
    tmp_path: Path, warehouse: str, request: pytest.FixtureRequest
) -> None:
    pg = pg_of(warehouse, request)
    with served() as (node, url):
        remote, local = chosen_tags(node)
        outage = NOW + MINUTE
        node.link.set_outage(ms(outage), offline_s=240, drain_s=60)
        path = config_for(tmp_path, url, remote + local, pg)
        summaries = [run_at(path, node, NOW + i * MINUTE) for i in range(0, 12)]
    # Everything the node holds up to where the last run's look-back begins.
    until = NOW + 11 * MINUTE - timedelta(minutes=3)
    want = truth_history_rows(node, remote + local, [Window(START, until)], RAW)
    outage_rows = [r for r in want if r[0] in remote and ms(outage) <= r[1] < ms(outage) + 240_000]
    assert outage_rows, "the outage's samples are part of the truth"
    for sink, rows in sink_rows(path, until).items():
        lost = set(want) - set(rows)
        assert not lost, f"{sink}: {len(lost)} of {len(want)} rows lost, {sorted(lost)[:2]}"
        assert sorted(rows) == want, sink
    during = summaries[3]  # offline
    assert sorted(during.held) == sorted(remote)
    assert "link 'to-remote' offline since" in " ".join(during.remarks)
    draining = summaries[5]  # back at +5 min, draining until +6
    assert sorted(draining.held) == sorted(remote)
    assert "still draining" in draining.holds["to-remote"]
    assert not summaries[-1].held
    for sink, progress in progresses(path).items():
        assert held_windows(progress) == {}, sink
        assert missing_windows(progress) == {}, sink


def test_state_shows_the_hold_while_it_lasts_and_other_tags_go_on(tmp_path: Path) -> None:
    with served() as (node, url):
        remote, local = chosen_tags(node)
        node.link.set_outage(ms(NOW + MINUTE), offline_s=600, drain_s=60)
        path = config_for(tmp_path, url, remote + local, None)
        for i in range(0, 5):
            summary = run_at(path, node, NOW + i * MINUTE)
        shown = state_output(path)
        for sink, progress in progresses(path).items():
            held = held_windows(progress)
            assert sorted(held) == sorted(remote), sink
            assert {link for link, _ in held.values()} == {"to-remote"}
            for tag in local:  # the local tags are complete up to the last run
                assert progress.windows_of(tag)[-1].end == NOW + 4 * MINUTE, sink
    assert summary.watermark_after is not None
    assert summary.watermark_after <= NOW + MINUTE
    assert f"HELD f -> lake: tag {remote[0]!r} behind link 'to-remote'" in shown
    assert "not complete until the link is back and drained" in shown
    for sink, statuses in ledger_statuses(path).items():
        assert sorted(statuses) == sorted(remote + local), f"{sink}: only tags in the ledger"
        for tag in remote:
            assert "held" in statuses[tag], f"{sink}: {tag} held in the ledger"
        for tag in local:
            assert "held" not in statuses[tag], sink


@pytest.mark.parametrize("warehouse", WAREHOUSES)
def test_a_hold_past_hold_max_is_reported_missing_and_read_again_later(
    tmp_path: Path, warehouse: str, request: pytest.FixtureRequest
) -> None:
    pg = pg_of(warehouse, request)
    with served() as (node, url):
        remote, local = chosen_tags(node)
        node.link.set_outage(ms(NOW + MINUTE), offline_s=600, drain_s=0)
        path = config_for(tmp_path, url, remote + local, pg, hold_max="3m")
        for i in range(0, 8):
            summary = run_at(path, node, NOW + i * MINUTE)
        assert summary.missing
        assert sorted(summary.missing) == sorted(remote)
        for sink, progress in progresses(path).items():
            assert sorted(missing_windows(progress)) == sorted(remote), sink
            assert sorted(held_windows(progress)) == sorted(remote), sink
        assert f"MISSING f -> lake: tag {remote[0]!r}" in state_output(path)
        later = NOW + 14 * MINUTE  # the link back at +11 min, nothing left to drain
        run_at(path, node, later)
    until = later - timedelta(minutes=3)
    want = truth_history_rows(node, remote + local, [Window(START, until)], RAW)
    for sink, rows in sink_rows(path, until).items():
        assert sorted(rows) == want, sink
    for sink, progress in progresses(path).items():
        assert missing_windows(progress) == {}, sink
        assert held_windows(progress) == {}, sink


def test_a_node_showing_only_online_is_held_for_the_lookback_after_it_is_back(
    tmp_path: Path,
) -> None:
    with served("link-outage-online-only") as (node, url):
        remote, local = chosen_tags(node)
        node.link.set_outage(ms(NOW + MINUTE), offline_s=180, drain_s=60)
        path = config_for(tmp_path, url, remote + local, None)
        summaries = [run_at(path, node, NOW + i * MINUTE) for i in range(0, 10)]
    assert sorted(summaries[4].held) == sorted(remote)  # back at +4, no sf shown
    assert "no store-and-forward state" in summaries[4].holds["to-remote"]
    assert not summaries[-1].held
    until = NOW + 9 * MINUTE - timedelta(minutes=3)
    want = truth_history_rows(node, remote + local, [Window(START, until)], RAW)
    for sink, rows in sink_rows(path, until).items():
        assert sorted(rows) == want, sink


def test_the_simulated_link_hides_the_outage_then_drains_it_oldest_first() -> None:
    node = SimulatedNode(SimConfig(seed=21, tags=60, profile="link-outage"))
    remote, local = chosen_tags(node)
    start = NOW + MINUTE
    node.link.set_outage(ms(start), offline_s=240, drain_s=60)
    truth = node.ground_truth(remote[0], ms(start), ms(start) + 240_000, RAW)
    assert truth

    def seen(now: datetime, tag: str = remote[0]) -> list[int]:
        node.set_clock(ms(now))
        answer = node.handle(
            "GET",
            "tag",
            "history",
            {
                "path": tag,
                "start": str(ms(start)),
                "end": str(ms(start) + 239_999),
                "options.mode": "raw",
            },
            None,
        )
        return [row[0] for row in orjson.loads(answer.body)["data"]]

    def link(now: datetime) -> dict[str, Any]:
        node.set_clock(ms(now))
        answer = orjson.loads(node.handle("GET", "link", "get", {}, None).body)
        return dict(answer["links"]["to-remote"])

    assert seen(NOW + 3 * MINUTE) == []
    assert link(NOW + 3 * MINUTE)["online"] is False
    half = seen(NOW + 5 * MINUTE + timedelta(seconds=30))  # half the buffer drained
    assert half == [row[0] for row in truth][: len(half)]
    assert 0 < len(half) < len(truth)
    assert link(NOW + 5 * MINUTE + timedelta(seconds=30))["remote"]["sf"]["backlog"] > 0
    assert seen(NOW + 7 * MINUTE) == [row[0] for row in truth]
    assert link(NOW + 7 * MINUTE)["remote"]["sf"]["backlog"] == 0
    assert seen(NOW + 3 * MINUTE, local[0]), "local tags are not behind the link"


# -- reading what the node shows (pure) ------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("marker", "link"),
    [
        ("to-remote", "to-remote"),
        ({"link": "to-remote"}, "to-remote"),
        ({"node": "site-b"}, "site-b"),
        (True, None),
        ({}, None),
        (7, None),
    ],
)
def test_any_non_null_remote_marker_is_remote_and_maps_to_a_link_when_it_names_one(
    marker: Any, link: str | None
) -> None:
    body = orjson.dumps(
        {"tags": {"a": {"fullPath": "/g/a", "remote": marker}, "b": {"remote": None}}}
    )
    assert tag_links([(body, "/g/")]) == {"/g/a": TagLink(link, None, None)}


def test_a_link_draining_or_offline_holds_its_tags_and_an_unnamed_link_holds_all() -> None:
    answer = models.Links.model_validate(
        {
            "links": {
                "a": {"name": "a", "online": True, "remote": {"sf": {"backlog": 3}}},
                "b": {"name": "b", "online": True, "remote": {"sf": {"paused": False}}},
            }
        }
    )
    links = link_health(answer)
    assert links["a"].draining == "sf.backlog 3"
    assert links["b"].draining is None
    tags = {"/x": TagLink("a", True, None), "/y": TagLink("b", True, None)}
    tags["/z"] = TagLink(None, True, None)
    tags["/w"] = TagLink("b", False, T0)
    holds = holds_of(tags, links, now=T0, lookback=MINUTE)
    assert sorted(holds) == ["/w", "/x", "/z"]
    assert holds["/z"].link == "a"
    assert holds["/w"].since == T0
    calm = {"b": LinkHealth("b", True, None, True)}
    assert holds_of({"/z": TagLink(None, True, None)}, calm, now=T0, lookback=MINUTE) == {}
    offline = {"b": LinkHealth("b", False, None, False)}
    assert (
        holds_of({"/z": TagLink(None, None, None)}, offline, now=T0, lookback=MINUTE)["/z"].link
        == "b"
    )
    assert ANY_LINK == "some link"


def test_a_window_before_the_outage_is_not_held_and_an_old_one_turns_missing() -> None:
    tags = {"/x": TagLink("a", False, T0)}
    holds = holds_of(tags, {}, now=T0 + 10 * MINUTE, lookback=MINUTE)
    members = ("/x", "/y")
    before = Window(T0 - MINUTE, T0)
    assert apply_holds(members, before, holds, now=T0, hold_max=MINUTE) is None
    inside = Window(T0, T0 + MINUTE)
    out = apply_holds(members, inside, holds, now=T0 + MINUTE, hold_max=MINUTE * 5)
    assert out is not None
    assert out.held == ("/x",)
    assert out.members == ("/y", "held:a:/x")
    old = apply_holds(members, inside, holds, now=T0 + 10 * MINUTE, hold_max=MINUTE * 5)
    assert old is not None
    assert old.expired == ("/x",)
    assert old.members == ("/y", "missing:/x")
