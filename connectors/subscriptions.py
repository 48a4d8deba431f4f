"""Change subscriptions of a node (spec: Events): subscribe, poll events, list, cancel.

The node pushes nothing: changes of tag data and of the tag model queue in a subscription
that the client polls with `tag/?cmd=subscriptionEvents`; `discardedEvents` counts what the
node's queue dropped since the last poll, `remainingEvents` what a `limit` left for the
next. A live tail subscribes once (`subscribed`), polls `events` and cancels on the way out.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pydantic import ValidationError

from connectors import models
from connectors.answers import Requester, empty, json_of, model_of, models_of
from connectors.errors import MalformedAnswer

Event = models.TagEvent | models.ModelEvent | dict[str, Any]
"""A `tag` or `model` event; an event of another type is kept as the node sent it."""

_EVENTS = "tag.subscriptionEvents"


class NodeSubscriptions:
    """The subscriptions of one node, through a client's requests (`NodeClient`)."""

    def __init__(self, client: Requester) -> None:
        self._client = client

    def subscribe(self, data: Any = None) -> models.Subscription:
        """A new subscription; `data` (any JSON) comes back with its record in `records`."""
        body = {"data": data} if data is not None else None
        response = self._client.request("tag.subscribe", "POST", "tag", "subscribe", body=body)
        return model_of("tag.subscribe", response, models.Subscription)

    def records(self) -> list[models.SubscriptionRecord]:
        """Every subscription of the node, with its pending and discarded event counts."""
        response = self._client.request("tag.subscriptions", "GET", "tag", "subscriptions")
        return models_of("tag.subscriptions", response, models.SubscriptionRecord)

    def events(self, subscription_id: int, limit: int | None = None) -> models.SubscriptionEvents:
        """The events queued since the last poll, at most `limit` of them."""
        params = {"id": subscription_id, "limit": limit}
        response = self._client.request(_EVENTS, "GET", "tag/", "subscriptionEvents", params)
        return parse_events(json_of(_EVENTS, response))

    def cancel(self, subscription_id: int) -> None:
        body = {"id": subscription_id}
        response = self._client.request(
            "tag.cancelSubscription", "POST", "tag/", "cancelSubscription", body=body
        )
        empty("tag.cancelSubscription", response)

    @contextmanager
    def subscribed(self, data: Any = None) -> Iterator[models.Subscription]:
        """A subscription for the block, cancelled when it ends (so the node's queue does
        not keep filling for a reader that has gone)."""
        subscription = self.subscribe(data)
        try:
            yield subscription
        finally:
            self.cancel(subscription.id)


def parse_events(data: Any) -> models.SubscriptionEvents:
    """A `subscriptionEvents` answer (decoded JSON), each event typed by its `type`."""
    if not isinstance(data, dict):
        raise MalformedAnswer(_EVENTS, "answer is not an object", where="events")
    events = [_event(item) for item in data.get("events") or []]
    try:
        return models.SubscriptionEvents(
            discarded_events=data.get("discardedEvents") or 0,
            remaining_events=data.get("remainingEvents") or 0,
            events=events,
        )
    except ValidationError as exc:
        raise MalformedAnswer(_EVENTS, str(exc.errors()[0]["msg"]), where="counts") from None


def _event(item: Any) -> Event:
    kind = item.get("type") if isinstance(item, dict) else None
    try:
        if kind == "tag":
            return models.TagEvent.model_validate(item)
        if kind == "model":
            return models.ModelEvent.model_validate(item)
    except ValidationError as exc:
        raise MalformedAnswer(
            _EVENTS, f"unexpected event: {exc.errors()[0]['msg']}", where="events"
        ) from None
    return item  # type: ignore[no-any-return]
