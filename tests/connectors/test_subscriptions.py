"""Change subscriptions of a node: against the real simulator over loopback, and their
answers read without I/O.

A write shows up as a `tag` event, a configuration change as a `model` event; a `limit`
leaves the rest for the next poll; a cancelled subscription is gone from the list.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from connectors import models
from connectors.admin import NodeAdmin
from connectors.client import NodeClient
from connectors.errors import MalformedAnswer, SubscriptionGone
from connectors.normalise.events import EventsPage, parse_events_page
from connectors.normalise.history import assign_seq, parse_history_answer
from connectors.options import HistoryOptions
from connectors.schema import TAG_HISTORY_SCHEMA
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.subscriptions import NodeSubscriptions, parse_events


@pytest.fixture
def subscriptions(client: NodeClient, node: SimulatedNode) -> Iterator[NodeSubscriptions]:
    """The node's subscriptions with its clock stopped: no history sample becomes an
    event while a test runs, so its events are the ones it made."""
    node.set_clock(node.now_ms())
    yield NodeSubscriptions(client)
    node.set_clock(None)


def test_subscription_collects_the_event_of_a_write(
    subscriptions: NodeSubscriptions, admin: NodeAdmin, number_tag: str
) -> None:
    number = number_tag
    subscription = subscriptions.subscribe({"owner": "test"})
    assert isinstance(subscription.id, int)
    assert subscription.model
    try:
        listed = {record.id: record for record in subscriptions.records()}
        assert listed[subscription.id].data == {"owner": "test"}
        admin.tag_write(number, 7.0)
        admin.tag_write(number, 8.0)
        first = subscriptions.events(subscription.id, limit=1)
        assert first.remaining_events == 1
        rest = subscriptions.events(subscription.id)
        events = [*first.events, *rest.events]
        assert all(isinstance(event, models.TagEvent) for event in events)
        assert [(e.tag, e.data.value) for e in events] == [(number, 7.0), (number, 8.0)]  # type: ignore[union-attr]
    finally:
        subscriptions.cancel(subscription.id)
    assert subscription.id not in {record.id for record in subscriptions.records()}


def test_model_change_is_a_model_event(subscriptions: NodeSubscriptions, admin: NodeAdmin) -> None:
    with subscriptions.subscribed() as subscription:
        document = {"version": {"main": 1}, "result": ["Object", {}], "editor": {}}
        admin.module_set_config_data("Historian", "tags", document)
        events = subscriptions.events(subscription.id).events
        assert any(isinstance(event, models.ModelEvent) and event.model for event in events)
    assert subscription.id not in {record.id for record in subscriptions.records()}


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ({"events": [{"type": "tag", "tag": "/a", "data": {"value": 1}}]}, nullcontext()),
        ({"events": [{"type": "model", "model": {"x": 1}}]}, nullcontext()),
        ({"events": [{"type": "future", "what": 1}]}, nullcontext()),
        ({"events": [{"type": "tag"}]}, pytest.raises(MalformedAnswer, match="event")),
        ({"discardedEvents": "many"}, pytest.raises(MalformedAnswer, match="counts")),
        ([], pytest.raises(MalformedAnswer, match="not an object")),
    ],
    ids=["tag", "model", "unknown-kept", "tag-without-path", "bad-count", "array"],
)
def test_events_answer_is_typed_by_kind_or_refused(answer: Any, outcome: Any) -> None:
    with outcome:
        events = parse_events(answer).events
        kinds = {"tag": models.TagEvent, "model": models.ModelEvent, "future": dict}
        assert isinstance(events[0], kinds[answer["events"][0]["type"]])


# -- a poll read as the rows a history run writes -------------------------------------------

T0 = 1_780_000_000_000
RAW = HistoryOptions(mode="raw", invalid_as_null=False)


def test_a_polls_rows_are_the_rows_a_history_run_writes_for_the_same_samples(
    client: NodeClient, node: SimulatedNode
) -> None:
    live = NodeSubscriptions(client)
    local = [s.path for s in node.tree().specs if not s.remote_lag_ms]
    types = {path: node.tag_type(path) for path in local}
    node.set_clock(T0)
    try:
        with live.subscribed({"flow": "f"}) as subscription:
            node.set_clock(T0 + 120_000)
            page = live.poll(subscription.id, node="sim", types=types, invalid_as_null=True)
        params = {
            "paths": orjson.dumps(local).decode(),
            "start": str(T0 + 1),
            "end": str(T0 + 120_000),
            "options.mode": "raw",
            "options.invalidAsNull": "true",
        }
        answer = node.handle("GET", "tag", "historyMany", params, None)
        history = assign_seq(parse_history_answer(answer.body, "sim").table)
    finally:
        node.set_clock(None)
    assert page.discarded_events == 0
    assert page.remaining_events == 0
    rows = page.rows.filter(pc.is_in(page.rows.column("tag"), value_set=pa.array(local)))
    assert rows.schema == TAG_HISTORY_SCHEMA
    assert rows.num_rows > 1000
    # The same rows, column for column, but `extra`: events do not carry it.
    assert rows.drop_columns(["extra"]).equals(history.drop_columns(["extra"]))
    assert rows.column("extra").null_count == rows.num_rows
    assert pc.sum(pc.less(rows.column("quality"), 192)).as_py() > 0
    assert pc.max(rows.column("seq")).as_py() == 1  # two samples on one millisecond


def test_polling_a_subscription_the_node_lost_is_subscription_gone(
    subscriptions: NodeSubscriptions, node: SimulatedNode
) -> None:
    with subscriptions.subscribed() as subscription:
        subscriptions.cancel(subscription.id)  # gone before the block ends: left so
        with pytest.raises(SubscriptionGone, match=f"subscription {subscription.id} is not"):
            subscriptions.poll(subscription.id, node="sim")
        with pytest.raises(SubscriptionGone):
            subscriptions.events(subscription.id)


def event(ts: Any, value: Any = 1.5, quality: Any = 192, tag: str = "/a", **more: Any) -> Any:
    return {
        "type": "tag",
        "tag": tag,
        "data": {"value": value, "quality": quality, "ts": ts},
    } | more


def page_of(*events: Any, **counts: Any) -> EventsPage:
    return parse_events_page(orjson.dumps({"events": list(events), **counts}), "n")


@pytest.mark.parametrize(
    "stamps",
    [
        [T0, T0 + 500],
        [T0 / 1000, (T0 + 500) / 1000],
        [T0 // 1000, T0 // 1000 + 1],
        ["2026-05-28T20:26:40.000Z", "2026-05-28T20:26:40.500Z"],
    ],
    ids=["epoch-ms", "epoch-seconds-fraction", "epoch-seconds", "iso"],
)
def test_event_stamps_are_read_in_the_units_history_rows_may_use(stamps: list[Any]) -> None:
    page = page_of(*(event(ts) for ts in stamps))
    got = page.rows.column("ts").cast(pa.int64()).to_pylist()
    assert got[0] == T0
    assert got[1] in (T0 + 500, T0 + 1000)
    typed = parse_events({"events": [event(ts) for ts in stamps]}).events
    assert [e.data.ts for e in typed] == got  # type: ignore[union-attr]


def test_a_status_event_is_a_link_change_not_a_sample() -> None:
    status = event(T0, status={"ts": T0 + 5, "value": 0})
    page = page_of(event(T0 + 1), status, {"type": "model", "model": {"tags": {}}}, {"type": "x"})
    assert page.rows.num_rows == 1
    assert page.statuses.to_pylist()[0]["value"] == 0
    assert page.statuses.column("tag").to_pylist() == ["/a"]
    assert page.models == [{"tags": {}}]
    assert page.unknown == [{"type": "x"}]
    assert page.events == 4


def test_values_follow_the_flows_invalid_as_null_and_the_tags_configured_type() -> None:
    body = orjson.dumps({"events": [event(T0, 2.5, 0), event(T0 + 1, "12.5", 192, tag="/n")]})
    kept = parse_events_page(body, "n", types={"/n": "number"}, invalid_as_null=False)
    nulled = parse_events_page(body, "n", types={"/n": "number"}, invalid_as_null=True)
    assert kept.rows.column("value").to_pylist() == [2.5, 12.5]
    assert kept.rows.column("value_str").null_count == 2
    assert nulled.rows.column("value").to_pylist() == [None, 12.5]


@pytest.mark.parametrize(
    ("events", "where"),
    [
        ([event(T0), event(T0 + 1), event("yesterday")], "event 2"),
        ([event(T0), "tag"], "event 1"),
        ([{"type": "tag", "data": {"ts": T0}}], "event 0"),
        ([event(T0), event(T0, value={"x": 1})], "event 1"),
        ([event(T0, status="offline")], "event 0"),
    ],
    ids=["stamp", "not-an-object", "no-path", "value-object", "status-text"],
)
def test_a_malformed_event_is_refused_naming_its_index(events: list[Any], where: str) -> None:
    with pytest.raises(MalformedAnswer, match=f"in {where}"):
        page_of(*events)


def test_counts_that_are_not_counts_are_refused() -> None:
    with pytest.raises(MalformedAnswer, match="counts"):
        page_of(event(T0), discardedEvents=-1)
    assert page_of(event(T0), discardedEvents=3).may_have_lost


@pytest.mark.parametrize("profile", ["rows-epoch-seconds", "rows-iso", "numbers-as-strings"])
def test_events_written_as_a_profiles_history_rows_are_read_as_the_default_ones(
    profile: str,
) -> None:
    pages = []
    for name in ("default", profile):
        node = SimulatedNode(SimConfig(seed=4, tags=30, profile=name))
        node.set_clock(T0)
        sid = orjson.loads(node.handle("POST", "tag", "subscribe", {}, None).body)["id"]
        node.set_clock(T0 + 60_000)
        body = node.handle("GET", "tag", "subscriptionEvents", {"id": str(sid)}, None).body
        types = {path: node.tag_type(path) for path in node.tag_paths()}
        pages.append(parse_events_page(body, "n", types=types))
    assert pages[0].rows.num_rows > 100
    assert pages[1].rows.equals(pages[0].rows)


def test_a_slow_poller_over_loopback_is_told_how_many_events_it_lost() -> None:
    node = SimulatedNode(SimConfig(seed=4, tags=30, profile="events-queue-small"))
    node.set_clock(T0)
    with run_server(node, https_port=None) as server:
        settings = NodeSettings(url=server.http_url, name="sim", backoff_base_s=0.01)
        with NodeClient(settings) as client:
            live = NodeSubscriptions(client)
            with live.subscribed({"flow": "f"}) as subscription:
                node.set_clock(T0 + 600_000)
                queued = {r.id: r for r in live.records()}[subscription.id]
                page = live.poll(subscription.id, limit=600, node="sim")
                rest = live.poll(subscription.id, node="sim")
    made = sum(
        len(
            node.ground_truth(s.path, T0 + 1 - s.remote_lag_ms, T0 + 600_001 - s.remote_lag_ms, RAW)
        )
        for s in node.tree().specs
    )
    assert queued.events == 1000
    assert queued.discarded_events == made - 1000
    assert page.discarded_events == made - 1000
    assert page.remaining_events == 400
    assert (page.rows.num_rows, rest.rows.num_rows) == (600, 400)
    assert rest.discarded_events == 0


def test_events_without_a_status_key_are_samples_too() -> None:
    plain = {"type": "tag", "tag": "/a", "data": {"value": 1.5, "quality": 192, "ts": T0}}
    page = page_of(plain, {**plain, "data": {**plain["data"], "ts": T0 + 1}})
    assert page.rows.column("ts").cast(pa.int64()).to_pylist() == [T0, T0 + 1]
    assert page.statuses.num_rows == 0
