"""The tail's subscription on a node: named, found again after a crash, drained, cancelled.

A subscription's custom `data` names the tool, the flow, the node and the run (spec:
Subscribe, "Custom data given at subscribe is returned with the subscription record"):
a tail that starts cancels the subscriptions an earlier tail of the same flow and node
left behind (killed before it could cancel), so the node stops queueing for nobody.
A poll drains the queue in answers of at most `limit` events while `remainingEvents`
says more are there. What may have lost events is said, not hidden: `discardedEvents`,
a poll that failed, a subscription the node no longer has (then subscribed again).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.errors import NodeError, SubscriptionGone, one_line
from connectors.models import SubscriptionRecord
from connectors.normalise.events import EventsPage
from connectors.subscriptions import NodeSubscriptions

log = logging.getLogger("historian.live")
TOOL = "historian"
# Answers drained in one poll at most: a queue filling faster than it drains still lets
# the tail commit (and the node's discards say what was lost).
MAX_ANSWERS = 50


def subscription_data(flow: str, node: str, run: str) -> dict[str, Any]:
    """The custom data naming a tail's subscription."""
    return {TOOL: {"flow": flow, "node": node, "run": run}}


def is_ours(record: SubscriptionRecord, flow: str, node: str) -> bool:
    """Whether a subscription was made by a tail of `flow` on `node` (any run)."""
    data = record.data
    named = data.get(TOOL) if isinstance(data, dict) else None
    return isinstance(named, dict) and named.get("flow") == flow and named.get("node") == node


@dataclass
class Poll:
    """What one poll brought (each answer read: `connectors.normalise.events`), and
    whether events may have been lost before it."""

    pages: list[EventsPage] = field(default_factory=list)
    discarded: int = 0
    lost: str | None = None  # why events may be missing: a failed poll, a lost subscription


class LiveSubscription:
    """One tail's subscription on one node."""

    def __init__(
        self, subscriptions: NodeSubscriptions, flow: str, node: str, run: str, limit: int
    ) -> None:
        self._subscriptions = subscriptions
        self._data = subscription_data(flow, node, run)
        self._flow, self._node = flow, node
        self._limit = limit
        self.id: int | None = None
        self.model: dict[str, Any] = {}

    def open(self) -> int:
        """Cancel the stale subscriptions of this flow and node, then subscribe; how many
        stale ones there were (a tail before this one ended without cancelling)."""
        stale = [r for r in self._subscriptions.records() if is_ours(r, self._flow, self._node)]
        for record in stale:
            log.warning(
                "%s: cancelling subscription %d left by an earlier tail", self._flow, record.id
            )
            self._cancel_quietly(record.id)
        self._subscribe()
        return len(stale)

    def _subscribe(self) -> None:
        made = self._subscriptions.subscribe(self._data)
        self.id, self.model = made.id, made.model

    def poll(
        self,
        node: str,
        types: Mapping[str, str],
        *,
        invalid_as_null: bool,
        stop: threading.Event | None = None,
    ) -> Poll:
        """Drain the queue (at most MAX_ANSWERS answers), the samples as history rows of
        `node` typed by `types`; a failure is a `lost` poll, and a subscription the node
        no longer has is made again."""
        poll = Poll()
        if self.id is None:  # lost, and not made again at the last poll
            poll.lost = "no subscription on the node"
            self._resubscribe(poll)
            return poll
        try:
            for _ in range(MAX_ANSWERS):
                page = self._subscriptions.poll(
                    self.id, self._limit, node=node, types=types, invalid_as_null=invalid_as_null
                )
                poll.pages.append(page)
                poll.discarded += page.discarded_events
                if page.remaining_events <= 0 or (stop is not None and stop.is_set()):
                    break
        except SubscriptionGone:
            gone, self.id = self.id, None
            poll.lost = f"subscription {gone} is gone from the node; subscribed again"
            self._resubscribe(poll)
        except NodeError as exc:
            poll.lost = f"poll failed ({one_line(exc)})"
        return poll

    def _resubscribe(self, poll: Poll) -> None:
        try:
            self._subscribe()
        except NodeError as exc:
            poll.lost = f"{poll.lost}: not subscribed again ({one_line(exc)})"

    def verify(self) -> str | None:
        """Whether the node still lists our subscription as ours (a node that restarted
        may number another's with our id): None, or why not (then subscribed again)."""
        try:
            records = self._subscriptions.records()
        except NodeError as exc:
            return f"subscriptions not listed ({one_line(exc)})"
        if any(r.id == self.id and r.data == self._data for r in records):
            return None
        gone, self.id = self.id, None
        poll = Poll(lost=f"subscription {gone} is no longer ours on the node; subscribed again")
        self._resubscribe(poll)
        return poll.lost

    def cancel(self) -> None:
        """Cancel the subscription (the node stops queueing); failing to is logged, and the
        next tail cancels it as stale."""
        if self.id is not None:
            self._cancel_quietly(self.id)
            self.id = None

    def _cancel_quietly(self, subscription_id: int) -> None:
        try:
            self._subscriptions.cancel(subscription_id)
        except NodeError as exc:
            log.warning("%s: subscription %d not cancelled: %s", self._flow, subscription_id, exc)
