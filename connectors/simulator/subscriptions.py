"""Tag subscriptions: polled event queues of `tag` and `model` events (spec: Events).

Each subscription holds a bounded queue (`QueueRules.capacity` events); when it is full
the oldest events are dropped and counted, and `subscriptionEvents` reports that count
once (`discardedEvents`, "since last query"; `discards_cumulative`: since the
subscription began) and what a `limit` left (`remainingEvents`). The samples history
stores reach the queues when a subscription is polled or listed (`events.Feed`: what
became visible since the last poll, for every subscription at once); writes and model
changes are queued when they happen, after the samples before them. A subscription lives
until it is cancelled or the node restarts (`restart`; `subscriptions_survive_restart`:
kept). An unknown id is 404 `subscription N not found`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from connectors.simulator.events import Feed, Item, event_of
from connectors.simulator.history import iso_of_ms
from connectors.simulator.protocol import (
    Answer,
    Handler,
    Params,
    RequestError,
    gc_paused,
    json_answer,
    parse_int,
)

# Events a subscription's queue holds (spec: "event queue capacity: not shown"): enough
# for 10,000 tags at 1 Hz polled every 10 s. `events_queue_small` holds SMALL_EVENT_QUEUE.
EVENT_QUEUE = 100_000
SMALL_EVENT_QUEUE = 1_000
# Events one answer holds without a `limit` on an `events_limit_default` node.
DEFAULT_EVENTS_LIMIT = 500


@dataclass(frozen=True)
class QueueRules:
    """How this node's queues read what the spec leaves open (profiles.py)."""

    capacity: int = EVENT_QUEUE
    default_limit: int | None = None
    discards_cumulative: bool = False
    survive_restart: bool = False
    ids_reused: bool = False  # a restart numbers new subscriptions from 1 again
    # How the node writes a sample's stamp and a number on the wire, as in its history
    # rows (`rows_epoch_seconds`, `rows_iso`, `numbers_as_strings`).
    wire: frozenset[str] = frozenset()

    @classmethod
    def of(cls, behaviours: frozenset[str]) -> QueueRules:
        return cls(
            capacity=SMALL_EVENT_QUEUE if "events_queue_small" in behaviours else EVENT_QUEUE,
            default_limit=DEFAULT_EVENTS_LIMIT if "events_limit_default" in behaviours else None,
            discards_cumulative="discards_cumulative" in behaviours,
            survive_restart="subscriptions_survive_restart" in behaviours,
            ids_reused="subscription_ids_reused" in behaviours,
            wire=behaviours & _WIRE,
        )

    def on_the_wire(self, item: Item) -> dict[str, Any]:
        """The event of `item` as this node writes it."""
        event = event_of(item)
        if not self.wire or not isinstance(item, tuple):
            return event
        data = event["data"]
        if "rows_epoch_seconds" in self.wire:
            data["ts"] = data["ts"] / 1000
        elif "rows_iso" in self.wire:
            data["ts"] = iso_of_ms(data["ts"])
        if "numbers_as_strings" in self.wire and type(data["value"]) is float:
            data["value"] = repr(data["value"])
        return event


_WIRE = frozenset({"rows_epoch_seconds", "rows_iso", "numbers_as_strings"})


@dataclass
class _Subscription:
    data: Any
    queue: deque[Item] = field(default_factory=deque)
    discarded: int = 0


class Subscriptions:
    """The subscriptions of one node; `publish` is called by writes and model changes.

    `feed` (None: only published events) brings history's samples at each poll.
    """

    def __init__(
        self,
        model: Callable[[], dict[str, Any]],
        capacity: int | None = None,
        *,
        rules: QueueRules | None = None,
        feed: Feed | None = None,
        clock: Callable[[], int] | None = None,
        full_model: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self._model = model
        self._full_model = full_model or model
        rules = rules or QueueRules()
        if capacity is not None:
            rules = replace(rules, capacity=capacity)
        self.rules = rules
        self._feed = feed
        self._clock = clock
        self._lock = threading.RLock()
        self._items: dict[int, _Subscription] = {}
        self._next_id = 1

    def handlers(self) -> dict[str, Handler]:
        return {
            "tag.subscribe": self.subscribe,
            "tag.subscriptions": self.list,
            "tag.subscriptionEvents": self.events,
            "tag.cancelSubscription": self.cancel,
        }

    # -- queueing --------------------------------------------------------------------------

    def exclusive(self) -> AbstractContextManager[bool]:
        """The queues' lock, for a change of what history shows (a late sample, a tag
        added or removed) made between two catch-ups; taken before the node's own lock,
        as a poll takes them."""
        return self._lock

    def catch_up(self) -> None:
        """Queue on every subscription the samples history shows since the last catch-up."""
        feed, clock = self._feed, self._clock
        if feed is None or clock is None:
            return
        with self._lock, gc_paused():
            now = clock()
            if not self._items:
                feed.skip(now)
                return
            for batch in feed.advance(now):
                self._queue(batch)

    def _queue(self, batch: list[Item]) -> None:
        """`batch` on every queue, the oldest events dropped (and counted) past capacity."""
        capacity = self.rules.capacity
        for item in self._items.values():
            queue = item.queue
            if len(batch) >= capacity:
                item.discarded += len(queue) + len(batch) - capacity
                item.queue = deque(batch[len(batch) - capacity :])
                continue
            queue.extend(batch)
            for _ in range(len(queue) - capacity):
                queue.popleft()
                item.discarded += 1

    def publish(self, event: dict[str, Any]) -> None:
        """Queue `event` on every subscription (after the samples before it)."""
        with self._lock:
            self.catch_up()
            self._queue([event])

    def publish_tag(self, path: str, value: Any, quality: int, ts: int) -> None:
        self.publish(event_of((path, value, quality, ts)))

    def publish_model(self) -> None:
        """A `model` event: the full tag model (`subscribe` answers the first tags')."""
        self.publish({"type": "model", "model": self._full_model()})

    def restart(self) -> None:
        """The node restarted: its subscriptions are gone (`survive_restart`: kept), and
        with `ids_reused` the next is numbered 1 again."""
        if self.rules.survive_restart:
            return
        with self._lock:
            self._items.clear()
            if self.rules.ids_reused:
                self._next_id = 1

    # -- the operations --------------------------------------------------------------------

    def subscribe(self, body: Params) -> Answer:
        model = self._model()
        with self._lock:
            self.catch_up()  # the others' events so far; the new one's start now
            sid = self._next_id
            self._next_id += 1
            self._items[sid] = _Subscription(data=body.get("data"))
        return json_answer({"id": sid, "model": model})

    def list(self, params: Params) -> Answer:
        with self._lock:
            self.catch_up()
            return json_answer(
                [
                    {
                        "id": sid,
                        "data": item.data,
                        "discardedEvents": item.discarded,
                        "events": len(item.queue),
                    }
                    for sid, item in self._items.items()
                ]
            )

    def _id(self, source: Params) -> int:
        sid = parse_int(source.get("id"), "id")
        if sid is None:
            raise RequestError(400, "id is required")
        if sid not in self._items:
            raise RequestError(404, f"subscription {sid} not found")
        return sid

    def events(self, params: Params) -> Answer:
        limit = parse_int(params.get("limit"), "limit")
        if limit is not None and limit < 0:
            raise RequestError(400, "limit must not be negative")
        if limit is None:
            limit = self.rules.default_limit
        with self._lock:
            item = self._items[self._id(params)]
            self.catch_up()
            queue = item.queue
            count = len(queue) if limit is None else min(limit, len(queue))
            taken = [queue.popleft() for _ in range(count)]
            discarded = item.discarded
            if not self.rules.discards_cumulative:
                item.discarded = 0
            remaining = len(queue)
        return Answer(body=self._events_body(discarded, remaining, taken))

    def cancel(self, body: Params) -> Answer:
        with self._lock:
            del self._items[self._id(body)]
        return Answer()

    def _events_body(self, discarded: int, remaining: int, items: Iterable[Item]) -> bytes:
        """The answer's JSON; the cyclic collector paused while its dicts are made (tens
        of thousands of them would run it again and again)."""
        with gc_paused():
            return orjson.dumps(
                {
                    "discardedEvents": discarded,
                    "remainingEvents": remaining,
                    "events": [self.rules.on_the_wire(item) for item in items],
                }
            )
