"""A `subscriptionEvents` answer -> the rows a history run writes for the same samples.

A live tail writes the newest part of the dataset a history run writes, so a poll's
samples become rows of TAG_HISTORY_SCHEMA read the way history rows are read: each
event's `data` is a row `[ts, value, quality, null]` for `rows.columns_of` (numbers, booleans and
text in their columns, the careful reading naming the first wrong one), stamps in their
unit read over the answer together (`stamps`), values moved to their tag's configured
type (`typed`), the flow's `invalidAsNull` applied to non-good quality (the node applies
it to history answers; events carry the value as stored; an event without a quality
keeps its value), `seq` numbered over (tag, ts)
with the rows sorted so (`history.assign_seq`). `extra` is null: events do not carry the
fourth element of a history row.

A `tag` event whose `status` is set says a remote tag's link changed (spec: Events, rule
1): it goes to `statuses`, not to the rows, its `data` being the tag's current value, not
a new sample. `model` events are kept whole, events of other types as they came.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import MalformedAnswer
from connectors.normalise.common import gc_paused, json_type, load_json
from connectors.normalise.history import assign_seq
from connectors.normalise.rows import Columns6, RowError, columns_of
from connectors.normalise.stamps import ms_of_integers
from connectors.normalise.typed import by_configured_type
from connectors.schema import GOOD_QUALITY, TAG_HISTORY_SCHEMA, TS_TYPE

OPERATION = "tag.subscriptionEvents"
# Values read apart by JSON type: numbers, booleans, text (and null with the numbers).
_KINDS = {float: 0, int: 0, type(None): 0, bool: 1, str: 2}
STATUS_SCHEMA = pa.schema(
    [
        pa.field("tag", pa.string(), nullable=False),
        pa.field("ts", TS_TYPE),
        pa.field("value", pa.int8()),  # 1 online, 0 offline
    ]
)


@dataclass(frozen=True)
class EventsPage:
    """One poll's answer, read: the counts, the samples as rows, and the other events."""

    discarded_events: int
    remaining_events: int
    rows: pa.Table  # TAG_HISTORY_SCHEMA, sorted by (tag, ts)
    statuses: pa.Table  # STATUS_SCHEMA, in event order
    models: list[dict[str, Any]] = field(default_factory=list)
    unknown: list[Any] = field(default_factory=list)
    events: int = 0

    @property
    def may_have_lost(self) -> bool:
        """Whether the node says it dropped events since the last poll."""
        return self.discarded_events > 0


def parse_events_page(
    body: bytes | str,
    node: str,
    *,
    types: Mapping[str, str] | None = None,
    invalid_as_null: bool = True,
) -> EventsPage:
    """A `subscriptionEvents` answer as an EventsPage; MalformedAnswer names what is wrong
    (`counts`, or `event N`, N counting from 0 in the answer's `events`)."""
    with gc_paused():
        answer = load_json(body, OPERATION, "")
        events, discarded, remaining = events_and_counts(answer)
        split = _Split()
        if not split.add_samples(events):
            for index, event in enumerate(events):
                split.add(index, event)
        del answer
        rows = split.rows(node, types or {}, invalid_as_null)
    return EventsPage(
        discarded,
        remaining,
        rows,
        split.status_table(),
        split.models,
        split.unknown,
        len(events),
    )


def events_and_counts(answer: Any) -> tuple[list[Any], int, int]:
    """(events, discardedEvents, remainingEvents) of a decoded answer; a missing count is 0."""
    if not isinstance(answer, dict):
        raise MalformedAnswer(
            OPERATION, f"answer is {json_type(answer)}, not an object", where="events"
        )
    events = answer.get("events")
    if events is None:
        events = []
    if type(events) is not list:
        raise MalformedAnswer(
            OPERATION, f"events is {json_type(events)}, not an array", where="events"
        )
    counts = []
    for name in ("discardedEvents", "remainingEvents"):
        count = answer.get(name)
        count = 0 if count is None else count
        if type(count) is not int or count < 0:
            raise MalformedAnswer(OPERATION, f"{name} {count!r} is not a count", where="counts")
        counts.append(count)
    return events, counts[0], counts[1]


def _where(index: int) -> str:
    return f"event {index}"


class _Split:
    """The events of an answer by kind, the samples as rows `[ts, value, quality, null]`."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.samples: list[list[Any]] = []
        self.at: list[int] = []  # each sample's event index
        self.status_tags: list[str] = []
        self.status_ts: list[Any] = []
        self.status_values: list[Any] = []
        self.models: list[dict[str, Any]] = []
        self.unknown: list[Any] = []

    def add_samples(self, events: list[Any]) -> bool:
        """The common answer at once: every event a sample (`tag`, no status, data with
        a ts), read by a comprehension per column; False (nothing added) otherwise."""
        try:
            if {e["type"] for e in events} != {"tag"} or any(e.get("status") for e in events):
                return False
            paths = [e["tag"] for e in events]
            samples = [
                [d["ts"], d["value"], d["quality"], None] for d in (e["data"] for e in events)
            ]
        except (KeyError, TypeError, AttributeError):
            return False
        if set(map(type, paths)) != {str} or not all(paths):
            return False
        self.paths, self.samples, self.at = paths, samples, list(range(len(events)))
        return True

    def add(self, index: int, event: Any) -> None:
        if type(event) is not dict:
            raise MalformedAnswer(
                OPERATION, f"event is {json_type(event)}, not an object", where=_where(index)
            )
        kind = event.get("type")
        if kind == "tag":
            self._tag(index, event)
        elif kind == "model":
            model = event.get("model")
            if type(model) is not dict:
                raise MalformedAnswer(
                    OPERATION, f"model is {json_type(model)}, not an object", where=_where(index)
                )
            self.models.append(model)
        else:
            self.unknown.append(event)

    def _tag(self, index: int, event: dict[str, Any]) -> None:
        path = event.get("tag")
        if type(path) is not str or not path:
            raise MalformedAnswer(OPERATION, "tag event without a tag path", where=_where(index))
        status = event.get("status")
        if status is not None:
            if type(status) is not dict:
                raise MalformedAnswer(
                    OPERATION, f"status is {json_type(status)}, not an object", where=_where(index)
                )
            self.status_tags.append(path)
            self.status_ts.append(status.get("ts"))
            self.status_values.append(status.get("value"))
            return
        data = event.get("data")
        if data is None:
            return  # nothing stored: no sample
        if type(data) is not dict:
            raise MalformedAnswer(
                OPERATION, f"data is {json_type(data)}, not an object", where=_where(index)
            )
        if "ts" not in data:
            raise MalformedAnswer(OPERATION, "data has no ts", where=_where(index))
        self.paths.append(path)
        self.samples.append([data["ts"], data.get("value"), data.get("quality"), None])
        self.at.append(index)

    def rows(self, node: str, types: Mapping[str, str], invalid_as_null: bool) -> pa.Table:
        """The samples as TAG_HISTORY_SCHEMA rows, sorted by (tag, ts), `seq` numbered."""
        if not self.samples:
            return TAG_HISTORY_SCHEMA.empty_table()
        ts, value, value_bool, value_str, quality, extra = self._columns()
        if invalid_as_null:
            bad = pc.fill_null(pc.less(quality, GOOD_QUALITY), False)  # no quality: kept
            value, value_bool, value_str = (
                pc.if_else(bad, pa.scalar(None, column.type), column)
                for column in (value, value_bool, value_str)
            )
        n = len(self.samples)
        table = pa.Table.from_arrays(
            [
                pa.array([node] * n, type=pa.string()),
                pa.array(self.paths, type=pa.string()),
                ms_of_integers(ts).cast(TS_TYPE),
                pa.array(np.zeros(n, dtype=np.int16)),
                value,
                value_bool,
                value_str,
                quality,
                extra,
            ],
            schema=TAG_HISTORY_SCHEMA,
        )
        table, _ = by_configured_type(table, types)
        return assign_seq(table)

    def _columns(self) -> Columns6:
        """The samples' columns, those of each JSON type of value read apart (each by the
        fast path of `columns_of`; mixed in one list, every value would go the careful
        way) and put back in event order."""
        samples = self.samples
        kinds = [_KINDS.get(type(row[1]), 3) for row in samples]
        parts: list[tuple[np.ndarray[Any, Any] | None, list[list[Any]]]] = [(None, samples)]
        if len(set(kinds)) != 1:
            order = np.argsort(np.array(kinds, dtype=np.int8), kind="stable")
            counts = np.bincount(kinds, minlength=4)
            bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
            parts = [
                (positions, [samples[i] for i in positions.tolist()])
                for positions in (order[a:b] for a, b in pairwise(bounds) if b > a)
            ]
        pieces = []
        for positions, rows in parts:
            try:
                pieces.append(columns_of(rows))
            except RowError as exc:
                index = exc.index if positions is None else int(positions[exc.index])
                raise MalformedAnswer(
                    OPERATION, exc.message, where=_where(self.at[index])
                ) from None
        if len(pieces) == 1:
            return pieces[0]
        back = np.argsort(np.concatenate([p for p, _ in parts if p is not None]), kind="stable")
        return tuple(  # type: ignore[return-value]
            pa.concat_arrays([piece[i] for piece in pieces]).take(pa.array(back)) for i in range(6)
        )

    def status_table(self) -> pa.Table:
        """The link changes: (tag, ts, value); a stamp or value that is not a number is
        MalformedAnswer naming its event."""
        if not self.status_tags:
            return STATUS_SCHEMA.empty_table()
        try:
            ts = ms_of_integers(pa.array(self.status_ts, type=pa.int64()))
            values = pa.array(self.status_values, type=pa.int8())
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            raise MalformedAnswer(
                OPERATION, "status is not {ts: epoch ms, value: 0 or 1}", where="events"
            ) from None
        return pa.Table.from_arrays(
            [pa.array(self.status_tags, type=pa.string()), ts.cast(TS_TYPE), values],
            schema=STATUS_SCHEMA,
        )
