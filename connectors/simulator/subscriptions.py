"""Tag subscriptions: polled event queues of `tag` and `model` events (spec: Events).

Each subscription holds a bounded queue (`EVENT_QUEUE` events); when it is full the oldest
event is dropped and counted, and `subscriptionEvents` reports that count once
(`discardedEvents`, "since last query") and what a `limit` left (`remainingEvents`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from connectors.simulator.protocol import (
    Answer,
    Handler,
    Params,
    RequestError,
    json_answer,
    parse_int,
)

EVENT_QUEUE = 10_000


@dataclass
class _Subscription:
    data: Any
    queue: deque[dict[str, Any]] = field(default_factory=deque)
    discarded: int = 0


class Subscriptions:
    """The subscriptions of one node; `publish` is called by writes and model changes."""

    def __init__(self, model: Callable[[], dict[str, Any]], capacity: int = EVENT_QUEUE) -> None:
        self._model = model
        self._capacity = capacity
        self._lock = threading.Lock()
        self._items: dict[int, _Subscription] = {}
        self._next_id = 1

    def handlers(self) -> dict[str, Handler]:
        return {
            "tag.subscribe": self.subscribe,
            "tag.subscriptions": self.list,
            "tag.subscriptionEvents": self.events,
            "tag.cancelSubscription": self.cancel,
        }

    def publish(self, event: dict[str, Any]) -> None:
        """Queue `event` on every subscription, dropping (and counting) the oldest if full."""
        with self._lock:
            for item in self._items.values():
                if len(item.queue) >= self._capacity:
                    item.queue.popleft()
                    item.discarded += 1
                item.queue.append(event)

    def publish_tag(self, path: str, value: Any, quality: int, ts: int) -> None:
        self.publish(
            {
                "type": "tag",
                "tag": path,
                "data": {"value": value, "quality": quality, "ts": ts},
                "status": None,
            }
        )

    def publish_model(self) -> None:
        self.publish({"type": "model", "model": self._model()})

    def subscribe(self, body: Params) -> Answer:
        model = self._model()
        with self._lock:
            sid = self._next_id
            self._next_id += 1
            self._items[sid] = _Subscription(data=body.get("data"))
        return json_answer({"id": sid, "model": model})

    def list(self, params: Params) -> Answer:
        with self._lock:
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
        with self._lock:
            item = self._items[self._id(params)]
            count = len(item.queue) if limit is None else min(limit, len(item.queue))
            events = [item.queue.popleft() for _ in range(count)]
            discarded, item.discarded = item.discarded, 0
            return json_answer(
                {
                    "discardedEvents": discarded,
                    "remainingEvents": len(item.queue),
                    "events": events,
                }
            )

    def cancel(self, body: Params) -> Answer:
        with self._lock:
            del self._items[self._id(body)]
        return Answer()
