"""A poll's `tag` events as tag-history rows: the rows a raw history run writes for them.

An event carries what a raw history row carries (spec: Events, `data` {value, quality,
ts}), so its row is the history row: the value in the column of its JSON type, then of
its tag's configured type (`connectors.normalise.typed`, as a run's fetch does), the
flow's `invalidAsNull` rule (the node's default: on) nulling the value of a sample whose
quality is not good, and `seq` numbered over a window's rows when they are committed
(`assign_seq`). `extra` stays null: an event has no such element.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson
import pyarrow as pa

from connectors.models import TagEvent
from connectors.normalise.typed import by_configured_type
from connectors.schema import GOOD_QUALITY, TAG_HISTORY_SCHEMA


def event_rows(
    events: Iterable[TagEvent],
    node: str,
    types: Mapping[str, str],
    *,
    invalid_as_null: bool,
) -> pa.Table:
    """TAG_HISTORY_SCHEMA rows of the events that carry a sample (`seq` 0: numbered at
    commit); `types`: tag -> configured type, the tags to keep."""
    tags: list[str] = []
    ts: list[int] = []
    quality: list[int | None] = []
    numbers: list[float | None] = []
    flags: list[bool | None] = []
    texts: list[str | None] = []
    for event in events:
        data = event.data
        if data is None or data.ts is None or event.tag not in types:
            continue
        value = data.value
        if invalid_as_null and (data.quality is None or data.quality < GOOD_QUALITY):
            value = None
        tags.append(event.tag)
        ts.append(int(data.ts))
        quality.append(data.quality)
        number, flag, text = _columns(value)
        numbers.append(number)
        flags.append(flag)
        texts.append(text)
    count = len(tags)
    table = pa.table(
        {
            "node": pa.array([node] * count, pa.string()),
            "tag": pa.array(tags, pa.string()),
            "ts": pa.array(ts, pa.int64()).cast(TAG_HISTORY_SCHEMA.field("ts").type),
            "seq": pa.array([0] * count, pa.int16()),
            "value": pa.array(numbers, pa.float64()),
            "value_bool": pa.array(flags, pa.bool_()),
            "value_str": pa.array(texts, pa.string()),
            "quality": pa.array(quality, pa.int16()),
            "extra": pa.nulls(count, pa.int64()),
        },
        schema=TAG_HISTORY_SCHEMA,
    )
    typed, _ = by_configured_type(table, types)
    return typed


def _columns(value: Any) -> tuple[float | None, bool | None, str | None]:
    """(value, value_bool, value_str) of one value, by its JSON type."""
    if value is None:
        return None, None, None
    if isinstance(value, bool):
        return None, value, None
    if isinstance(value, int | float):
        return float(value), None, None
    if isinstance(value, str):
        return None, None, value
    return None, None, orjson.dumps(value).decode()  # an object or a list, as JSON text
