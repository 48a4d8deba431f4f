"""The live feed: every history sample as a `tag` event once history shows it (spec: Events).

A node queues an event for each sample it stores; here history is a closed form
(`history.py`), so the events of a stretch of the node's clock are what became visible
in it: the samples of the local tags stamped in (since, until] (a tag over the link: those
its lag and the link's store-and-forward buffer let through by `until`, not by `since`,
stamped at their origin, so out of order), the samples `add_late_sample` added since, and
a `status` event on each remote tag when the link went offline or came back. Nothing is
generated until a subscription is polled (`Feed.advance`), and a stretch is generated for
all tags at once (`history.generate_many`), in slices of at most `SLICE_CELLS` samples.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from connectors.simulator.history import GOOD, Samples, Tags, generate_many
from connectors.simulator.links import Outage
from connectors.simulator.tagtree import TagSpec, without_history

if TYPE_CHECKING:
    from connectors.simulator.node import SimulatedNode

# A sample event as the queues hold it, (path, value, quality, ts); other events as dicts.
Item = tuple[str, Any, int, int] | dict[str, Any]
# Samples of all tags generated at once, at most (about 40 MB in flight): a long stretch
# (a subscription nobody polled for a while) is made a slice at a time.
SLICE_CELLS = 250_000


@dataclass(frozen=True)
class _Group:
    """Tags that share a period, a type and a link lag, generated together."""

    tags: Tags
    lag_ms: int
    history_start_ms: int
    paths: np.ndarray  # object: each tag's path, by row


def groups_of(
    specs: list[TagSpec], with_history: bool, start_of: Callable[[TagSpec], int]
) -> list[_Group]:
    """The tags with history in groups of one period, type, lag and history start."""
    by_key: dict[tuple[int, str, int, int], list[TagSpec]] = {}
    for spec in specs:
        if with_history and without_history(spec):
            continue
        key = (spec.period_ms, spec.type, spec.remote_lag_ms, start_of(spec))
        by_key.setdefault(key, []).append(spec)
    return [
        _Group(Tags.of(members), key[2], key[3], np.array([s.path for s in members], dtype=object))
        for key, members in by_key.items()
    ]


def _hidden_mask(ts: np.ndarray, hidden: tuple[int, int] | None) -> np.ndarray:
    if hidden is None:
        return np.zeros(len(ts), dtype=bool)
    return (ts >= hidden[0]) & (ts < hidden[1])


class Feed:
    """The events of one node's local tags, from a cursor on the node's clock on.

    Every subscription shares the one cursor (`Subscriptions` catches them all up
    together), so each stretch is generated once however many subscribe.
    """

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node
        self._lock = threading.Lock()
        self.cursor_ms = node.now_ms()
        self._late_seen = 0
        self._groups: list[_Group] | None = None

    def tags_changed(self) -> None:
        """The tree gained or lost tags: group them again at the next advance."""
        with self._lock:
            self._groups = None

    def skip(self, now_ms: int) -> None:
        """Nobody listens: move the cursor to `now_ms` without generating anything."""
        with self._lock:
            self.cursor_ms = now_ms
            self._late_seen = self._node.late_count()

    def advance(self, now_ms: int) -> Iterator[list[Item]]:
        """The events from the cursor to `now_ms`, a slice at a time (each slice in time
        order, or tag by tag on an `events_unordered` node); the cursor moves with them."""
        with self._lock:
            groups = self._groups
            if groups is None:
                specs = self._node.tree().specs
                with_history = self._node.behaves("null_without_history")
                start_of = self._node.history_start_of
                groups = self._groups = groups_of(list(specs), with_history, start_of)
            step = self._step_ms(groups)
            late = self._node.late_since(self._late_seen)
            self._late_seen += len(late)
            since = self.cursor_ms
            while since < now_ms:
                until = min(now_ms, since + step)
                items = self._between(groups, since, until, late)
                late = []
                self.cursor_ms = since = until
                if items:
                    yield items
            if late:
                yield [(path, value, GOOD, ts) for path, ts, value in late]

    @staticmethod
    def _step_ms(groups: list[_Group]) -> int:
        """How much of the clock one slice covers: about SLICE_CELLS samples of all tags."""
        if not groups:
            return 1 << 40
        per_ms = sum(len(g.tags.specs) / g.tags.period_ms for g in groups)
        return max(1000, int(SLICE_CELLS / per_ms))

    def _between(
        self,
        groups: list[_Group],
        since: int,
        until: int,
        late: list[tuple[str, int, Any]],
    ) -> list[Item]:
        outage = self._node.link.outage
        paths: list[np.ndarray] = []
        stamps: list[np.ndarray] = []
        values: list[Any] = []
        qualities: list[np.ndarray] = []
        for group in groups:
            rows, samples = self._visible(group, since, until, outage)
            if len(rows):
                paths.append(group.paths[rows])
                stamps.append(samples.ts)
                values.extend(samples.values)
                qualities.append(samples.quality)
        items: list[Item] = []
        ts = np.zeros(0, dtype=np.int64)
        if stamps:
            ts = np.concatenate(stamps)
            items = list(
                zip(
                    np.concatenate(paths).tolist(),
                    values,
                    np.concatenate(qualities).tolist(),
                    ts.tolist(),
                    strict=True,
                )
            )
        extra: list[Item] = [(path, value, GOOD, stamp) for path, stamp, value in late]
        extra += self._status_events(outage, since, until)
        if extra:
            items += extra
            ts = np.concatenate([ts, np.array([_stamp(item) for item in extra], dtype=np.int64)])
        if self._node.behaves("events_unordered") or len(items) < 2:
            return items
        return [items[i] for i in np.argsort(ts, kind="stable").tolist()]

    def _visible(
        self, group: _Group, since: int, until: int, outage: Outage | None
    ) -> tuple[np.ndarray, Samples]:
        """The samples of `group` history shows at `until` and did not at `since`."""
        lag = group.lag_ms
        lower, upper = since - lag + 1, until - lag
        hidden_then = hidden_now = None
        if lag and outage is not None:
            hidden_then, hidden_now = outage.hidden(since), outage.hidden(until)
            if hidden_then is not None:
                lower = min(lower, hidden_then[0])
        start = group.history_start_ms
        rows, samples = generate_many(group.tags, lower, upper, history_start_ms=start)
        if hidden_then is None and hidden_now is None:
            return rows, samples
        ts = samples.ts
        shown_then = (ts <= since - lag) & ~_hidden_mask(ts, hidden_then)
        new = ~_hidden_mask(ts, hidden_now) & ~shown_then
        if new.all():
            return rows, samples
        positions = np.flatnonzero(new)
        return rows[positions], samples.slice_at(positions)

    def _status_events(self, outage: Outage | None, since: int, until: int) -> list[Item]:
        """A `status` event on every remote tag for each link change in (since, until]: the
        tag's data as a read shows it then, and `status` {ts, value 0 offline | 1 online}."""
        if outage is None:
            return []
        changes = [(at, value) for at, value in ((outage.start_ms, 0), (outage.end_ms, 1))]
        changes = [(at, value) for at, value in changes if since < at <= until]
        if not changes:
            return []
        tags = self._node.tags
        remote = [spec for spec in self._node.tree().specs if spec.remote_lag_ms]
        found = self._node.last_samples(remote)
        events: list[Item] = []
        for at, status in changes:
            for spec in remote:
                value, quality, ts = tags.current(spec, found)
                events.append(
                    {
                        "type": "tag",
                        "tag": spec.path,
                        "data": {"value": value, "quality": quality, "ts": ts},
                        "status": {"ts": at, "value": status},
                    }
                )
        return events


def _stamp(item: Item) -> int:
    """Where an event sorts: a sample at its stamp, a status change at its time."""
    if isinstance(item, tuple):
        return item[3]
    status = item.get("status") or {}
    return int(status.get("ts", 0))


def event_of(item: Item) -> dict[str, Any]:
    """The event as the wire shows it (spec: Events, `tag`)."""
    if isinstance(item, dict):
        return item
    path, value, quality, ts = item
    return {
        "type": "tag",
        "tag": path,
        "data": {"value": value, "quality": quality, "ts": ts},
        "status": None,
    }
