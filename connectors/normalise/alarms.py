"""Alarm history answers -> ALARM_HISTORY_SCHEMA rows: events as objects or positional
arrays (node-facts.md) in a configured or proven order (`connectors/normalise/positions.py`),
unknown fields kept as JSON text, the first wrong event named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from connectors.errors import MalformedAnswer
from connectors.normalise.common import (
    INT16_MAX,
    INT16_MIN,
    INT64_MAX,
    INT64_MIN,
    gc_paused,
    json_text,
    json_type,
    load_json,
    short_text,
    text_of,
    where_of,
)
from connectors.normalise.positions import (
    configured_positions,
    named_record,
    proven_positions,
)
from connectors.normalise.stamps import SECONDS_BELOW, StampError, ms_of_texts
from connectors.schema import (
    ALARM_HISTORY_SCHEMA,
)

_ALARM_KNOWN = frozenset({"path", "ts", "status", "priority", "value", "description", "ackInfo"})


def _alarm_int(value: Any, what: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} {short_text(value)} is not an integer in {low}..{high}")
    return int(value)


def _alarm_stamp(value: Any, what: str) -> int | None:
    """An event stamp in epoch ms: integers as sent (epoch seconds below 1e11 are scaled
    by the fetcher, `connectors.fetch._alarm_ms`), seconds with a fraction and ISO 8601
    text (`stamps`) converted here."""
    if type(value) is float and not value.is_integer() and abs(value) < SECONDS_BELOW:
        return round(value * 1000)
    if type(value) is str:
        try:
            return int(ms_of_texts(pa.array([value])).to_pylist()[0])
        except StampError as exc:
            raise ValueError(f"{what}: {exc}") from None
    return _alarm_int(value, what, INT64_MIN, INT64_MAX)


def _alarm_record(
    element: Any, index: int, positions: dict[int, str]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The known fields of one alarm event and its unknown ones (None when there are none)."""
    if isinstance(element, dict):
        unknown = {key: value for key, value in element.items() if key not in _ALARM_KNOWN}
        return element, unknown or None
    if isinstance(element, list):
        return named_record(element, positions)
    raise ValueError(f"alarm event {index} is {json_type(element)}, not an object or array")


def _positions(data: list[Any], fields: Sequence[str] | None, node: str) -> dict[int, str]:
    """Where each field sits in the answer's array events: configured, else proven."""
    arrays = [element for element in data if isinstance(element, list)]
    if not arrays:
        return {}
    if fields is not None:
        return configured_positions(arrays, fields, node)
    return proven_positions(arrays, node)


def _alarm_row(node: str, element: Any, index: int, positions: dict[int, str]) -> list[Any]:
    """One ALARM_HISTORY_SCHEMA row; ValueError says what is wrong."""
    record, unknown = _alarm_record(element, index, positions)
    path = record.get("path")
    if not isinstance(path, str):
        raise ValueError(f"alarm event {index} has no string path")
    try:
        ts = _alarm_stamp(record.get("ts"), "ts")
        if ts is None:
            raise ValueError("ts is missing")
        status = _alarm_int(record.get("status"), "status", INT16_MIN, INT16_MAX)
        priority = _alarm_int(record.get("priority"), "priority", INT16_MIN, INT16_MAX)
    except ValueError as exc:
        raise ValueError(f"alarm event {index} ({path!r}): {exc}") from None
    ack = record.get("ackInfo")
    ack_ts = ack_user = ack_msg = None
    if isinstance(ack, dict):
        try:
            ack_ts = _alarm_stamp(ack.get("ts"), "ack ts")
        except ValueError:
            ack_ts = None  # kept verbatim in ack_info
        ack_user = text_of(ack.get("user"))
        ack_msg = text_of(ack.get("msg"))
    return [
        node,
        path,
        ts,
        status,
        priority,
        json_text(record.get("value")),
        text_of(record.get("description")),
        ack_ts,
        ack_user,
        ack_msg,
        json_text(ack),
        json_text(unknown),
    ]


def _table_of_rows(rows: list[list[Any]], schema: pa.Schema) -> pa.Table:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(schema)
    arrays = []
    for field, values in zip(schema, columns, strict=True):
        if pa.types.is_timestamp(field.type):
            arrays.append(pa.array(values, type=pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def parse_alarm_history_answer(
    body: bytes | str,
    node: str,
    *,
    fields: Sequence[str] | None = None,
    operation: str = "alarm.history",
    chunk_label: str = "",
) -> pa.Table:
    """An `alarm?cmd=history` answer `{request, data: [...]}` as ALARM_HISTORY_SCHEMA rows.

    Events are objects shaped like the alarm record, or positional arrays in the order
    `fields` gives (the node's `alarm_fields`) or, without it, the one order the answer
    proves; never a guessed one. `value` and `ack_info` are JSON text, unknown fields and
    unnamed positions (`_<position>`) go to `extra` (JSON, sorted keys).
    """
    with gc_paused():
        answer = load_json(body, operation, chunk_label)
    if isinstance(answer, dict) and "data" in answer:
        data = answer["data"]
    elif isinstance(answer, list):
        data = answer
    else:
        raise MalformedAnswer(
            operation,
            f"answer is {json_type(answer)} without data, not an object with request and data",
            where=where_of("alarm history", chunk_label),
        )
    if data is None:
        data = []
    if not isinstance(data, list):
        raise MalformedAnswer(
            operation,
            f"data is {json_type(data)}, not a list of alarm events",
            where=where_of("alarm history", chunk_label),
        )
    try:
        positions = _positions(data, fields, node)
        rows = [_alarm_row(node, element, index, positions) for index, element in enumerate(data)]
    except ValueError as exc:
        raise MalformedAnswer(
            operation, str(exc), where=where_of("alarm history", chunk_label)
        ) from None
    return _table_of_rows(rows, ALARM_HISTORY_SCHEMA)
