"""Change subscriptions of a node: against the real simulator over loopback, and their
answers read without I/O.

A write shows up as a `tag` event, a configuration change as a `model` event; a `limit`
leaves the rest for the next poll; a cancelled subscription is gone from the list.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import pytest

from connectors import models
from connectors.admin import NodeAdmin
from connectors.client import NodeClient
from connectors.errors import MalformedAnswer
from connectors.simulator import SimulatedNode
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
