"""Change subscriptions of a node (spec: Events): subscribe, poll events, list, cancel.

The node pushes nothing: changes of tag data and of the tag model queue in a subscription
that the client polls with `tag/?cmd=subscriptionEvents`; `discardedEvents` counts what the
node's queue dropped since the last poll, `remainingEvents` what a `limit` left for the
next. A live tail subscribes once (`subscribed`), polls `poll` (the answer read straight
into the rows a history run writes: connectors/normalise/events.py) or `events` (typed
models), and cancels on the way out. A subscription the node no longer knows (cancelled,
lost in a restart: 404) is `SubscriptionGone`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

import httpx
from pydantic import ValidationError

from connectors import models
from connectors.answers import Requester, empty, json_of, model_of, models_of
from connectors.errors import FatalNodeError, MalformedAnswer, SubscriptionGone
from connectors.normalise.events import EventsPage, events_and_counts, parse_events_page
from connectors.normalise.rows import RowError, columns_of
from connectors.normalise.stamps import ms_of_integers

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
        """The events queued since the last poll, at most `limit` of them, as models."""
        return parse_events(json_of(_EVENTS, self._events_response(subscription_id, limit)))

    def poll(
        self,
        subscription_id: int,
        limit: int | None = None,
        *,
        node: str,
        types: Mapping[str, str] | None = None,
        invalid_as_null: bool = True,
    ) -> EventsPage:
        """The events queued since the last poll (at most `limit`), the samples as the
        rows of TAG_HISTORY_SCHEMA a history run writes for them (`node` in their `node`
        column, values in the column of `types[tag]`, the flow's `invalid_as_null`)."""
        response = self._events_response(subscription_id, limit)
        return parse_events_page(
            response.content, node, types=types, invalid_as_null=invalid_as_null
        )

    def _events_response(self, subscription_id: int, limit: int | None) -> httpx.Response:
        params = {"id": subscription_id, "limit": limit}
        with _gone_if_unknown(subscription_id):
            return self._client.request(_EVENTS, "GET", "tag/", "subscriptionEvents", params)

    def cancel(self, subscription_id: int) -> None:
        """End the subscription; SubscriptionGone if the node no longer has it."""
        body = {"id": subscription_id}
        with _gone_if_unknown(subscription_id):
            response = self._client.request(
                "tag.cancelSubscription", "POST", "tag/", "cancelSubscription", body=body
            )
        empty("tag.cancelSubscription", response)

    @contextmanager
    def subscribed(self, data: Any = None) -> Iterator[models.Subscription]:
        """A subscription for the block, cancelled when it ends (so the node's queue does
        not keep filling for a reader that has gone); one already gone is left so."""
        subscription = self.subscribe(data)
        try:
            yield subscription
        finally:
            with suppress(SubscriptionGone):
                self.cancel(subscription.id)


@contextmanager
def _gone_if_unknown(subscription_id: int) -> Iterator[None]:
    """A 404 about a subscription as SubscriptionGone (the simulator's reading: an
    unknown id is 404 `subscription N not found`)."""
    try:
        yield
    except FatalNodeError as exc:
        if exc.status != 404:
            raise
        raise SubscriptionGone(
            exc.operation,
            f"subscription {subscription_id} is not on the node (cancelled, or the node restarted)",
            status=exc.status,
            body=exc.body_start,
        ) from None


def parse_events(data: Any) -> models.SubscriptionEvents:
    """A `subscriptionEvents` answer (decoded JSON), each event typed by its `type`; stamps
    in the units history answers may use (epoch ms, seconds, ISO 8601) read as epoch ms.
    MalformedAnswer names `counts` or `event N` (from 0)."""
    events, discarded, remaining = events_and_counts(data)
    stamped = _in_ms(events)
    return models.SubscriptionEvents(
        discarded_events=discarded,
        remaining_events=remaining,
        events=[_event(index, item) for index, item in enumerate(stamped)],
    )


def _in_ms(events: list[Any]) -> list[Any]:
    """The events with each tag event's `data.ts` in epoch ms, the stamps of the answer
    read together as history rows' are (`normalise.rows`)."""
    at = [
        index
        for index, item in enumerate(events)
        if isinstance(item, dict)
        and item.get("type") == "tag"
        and isinstance(item.get("data"), dict)
        and item["data"].get("ts") is not None
    ]
    if not at:
        return events
    try:
        ts = columns_of([[events[index]["data"]["ts"], None] for index in at])[0]
    except RowError as exc:
        raise MalformedAnswer(_EVENTS, exc.message, where=f"event {at[exc.index]}") from None
    stamps = ms_of_integers(ts).to_pylist()
    out = list(events)
    for index, stamp in zip(at, stamps, strict=True):
        out[index] = {**events[index], "data": {**events[index]["data"], "ts": stamp}}
    return out


def _event(index: int, item: Any) -> Event:
    kind = item.get("type") if isinstance(item, dict) else None
    try:
        if kind == "tag":
            return models.TagEvent.model_validate(item)
        if kind == "model":
            return models.ModelEvent.model_validate(item)
    except ValidationError as exc:
        raise MalformedAnswer(
            _EVENTS, f"unexpected event: {exc.errors()[0]['msg']}", where=f"event {index}"
        ) from None
    if not isinstance(item, dict):
        raise MalformedAnswer(_EVENTS, "event is not an object", where=f"event {index}")
    return item
