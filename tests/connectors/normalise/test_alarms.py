"""Alarm history answers -> ALARM_HISTORY_SCHEMA rows: objects and positional arrays, the
first wrong event named."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.errors import MalformedAnswer
from connectors.normalise.alarms import parse_alarm_history_answer
from connectors.schema import ALARM_HISTORY_SCHEMA
from tests.connectors.normalise.json_values import T0, json_values


def alarm_event(**fields: Any) -> dict[str, Any]:
    event = {
        "path": "/Alarms/Boiler, hi",
        "description": "Boiler high",
        "priority": 3,
        "status": 3,
        "ts": T0,
        "value": True,
        "ackInfo": None,
    }
    event.update(fields)
    return event


def alarm_answer(data: Any) -> bytes:
    return orjson.dumps({"request": {"path": "/Alarms/", "start": T0, "end": T0 + 1}, "data": data})


def test_alarm_objects_become_typed_rows_with_json_text_and_sorted_extra() -> None:
    ack = {"ts": T0 + 60_000, "user": "ops", "msg": "seen"}
    body = alarm_answer(
        [
            alarm_event(online=1, remote=None, origin={"z": 1, "a": [2]}),
            alarm_event(ts=T0 + 60_000, status=1, ackInfo=ack, value=12.5),
        ]
    )
    table = parse_alarm_history_answer(body, "node-1")
    assert table.schema == ALARM_HISTORY_SCHEMA
    first, second = table.to_pylist()
    assert first["node"] == "node-1"
    assert first["path"] == "/Alarms/Boiler, hi"
    assert int(first["ts"].timestamp() * 1000) == T0
    assert (first["status"], first["priority"]) == (3, 3)
    assert first["value"] == "true"
    assert first["description"] == "Boiler high"
    assert first["ack_info"] is None
    assert first["ack_ts"] is None
    assert first["extra"] == '{"online":1,"origin":{"a":[2],"z":1},"remote":null}'
    assert second["value"] == "12.5"
    assert int(second["ack_ts"].timestamp() * 1000) == T0 + 60_000
    assert (second["ack_user"], second["ack_msg"]) == ("ops", "seen")
    assert orjson.loads(second["ack_info"]) == ack
    assert second["extra"] is None


FIELDS = ("ts", "path", "status", "priority", "value", "description", "ackInfo")


def test_alarm_arrays_in_a_configured_order_are_read_with_the_rest_in_extra() -> None:
    body = alarm_answer([[T0, "/Alarms/a", 2, 1, False, "low", None, "x", 5]])
    row = parse_alarm_history_answer(body, "n", fields=FIELDS).to_pylist()[0]
    assert (row["path"], row["status"], row["priority"], row["value"], row["description"]) == (
        "/Alarms/a",
        2,
        1,
        "false",
        "low",
    )
    assert orjson.loads(row["extra"]) == {"_7": "x", "_8": 5}


def test_alarm_arrays_in_an_order_nothing_proves_are_refused_naming_shape_and_setting() -> None:
    # status 2 and priority 1 fit either field: [ts, path, priority, status] reads the same.
    body = alarm_answer([[T0, "/Alarms/a", 2, 1, False, "low", None]])
    with pytest.raises(MalformedAnswer) as caught:
        parse_alarm_history_answer(body, "plant_a", chunk_label="alarms [2024-01-01T00:00Z, +1d)")
    message = str(caught.value)
    assert "\n" not in message
    assert "alarm events are arrays (the first: [1704067200000, '/Alarms/a', 2, 1," in message
    assert "field order is not proven: 2 orders fit every event" in message
    assert "status at 2 or 3; priority at 2 or 3" in message
    assert "set nodes.plant_a.alarm_fields to the node's order" in message


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # a status 0 is no priority: the order is proven whichever way round
        ([[T0, "/a", 0, 2], [T0 + 1, "/a", 3, 2]], [(0, 2), (3, 2)]),
        ([[T0, "/a", 2, 0], [T0 + 1, "/a", 2, 3]], [(0, 2), (3, 2)]),
        # a priority 4 is no status
        ([["/a", T0, 4, 1, "text"]], [(1, 4)]),
    ],
    ids=["status-then-priority", "priority-then-status", "priority-4"],
)
def test_alarm_arrays_whose_values_prove_the_order_are_read_in_it(
    events: list[list[Any]], expected: list[tuple[int, int]]
) -> None:
    rows = parse_alarm_history_answer(alarm_answer(events), "n").to_pylist()
    assert [(row["status"], row["priority"]) for row in rows] == expected
    assert all(row["path"] == "/a" for row in rows)


def test_a_constant_column_beside_status_and_priority_proves_nothing() -> None:
    # [ts, path, online, status, priority]: online is always 1, a status or a priority too.
    body = alarm_answer([[T0, "/a", 1, 0, 2], [T0 + 1, "/a", 1, 3, 2]])
    with pytest.raises(MalformedAnswer, match="is not proven: 4 orders fit every event"):
        parse_alarm_history_answer(body, "n")


def test_a_configured_order_the_answer_contradicts_is_refused() -> None:
    body = alarm_answer([[T0, "/a", 4, 1]])  # a status 4: the node puts priority first
    with pytest.raises(MalformedAnswer) as caught:
        parse_alarm_history_answer(body, "n", fields=FIELDS)
    assert "event 0 holds 4 at 2, not a status" in str(caught.value)
    assert "nodes.n.alarm_fields [ts, path, status, priority, value, description, ackInfo]" in (
        str(caught.value)
    )


def test_objects_need_no_order_beside_arrays_in_one() -> None:
    body = alarm_answer([alarm_event(status=0, priority=4), [T0, "/a", 4, 0]])
    rows = parse_alarm_history_answer(body, "n").to_pylist()
    assert [(row["status"], row["priority"]) for row in rows] == [(0, 4), (0, 4)]


def test_alarm_answer_with_null_or_empty_data_is_empty() -> None:
    assert parse_alarm_history_answer(alarm_answer(None), "n").num_rows == 0
    assert parse_alarm_history_answer(alarm_answer([]), "n").schema == ALARM_HISTORY_SCHEMA


BAD_ALARMS = {
    "not JSON": b"oops",
    "no data": b'{"request": {}}',
    "data object": alarm_answer({"a": 1}),
    "event number": alarm_answer([5]),
    "no path": alarm_answer([{"ts": T0}]),
    "no ts": alarm_answer([{"path": "/a"}]),
    "ts string": alarm_answer([alarm_event(ts="2024")]),
    "ts huge": b'{"data": [{"path": "/a", "ts": 18446744073709551615}]}',
    "status string": alarm_answer([alarm_event(status="active")]),
    "priority too big": alarm_answer([alarm_event(priority=70000)]),
}


@pytest.mark.parametrize("body", BAD_ALARMS.values(), ids=BAD_ALARMS.keys())
def test_wrong_alarm_shapes_raise_malformed_answer(body: bytes) -> None:
    with pytest.raises(MalformedAnswer) as caught:
        parse_alarm_history_answer(body, "n", chunk_label="alarms [2024-01-01T00:00Z, +1d)")
    assert caught.value.operation == "alarm.history"
    assert caught.value.where is not None
    assert "alarms [2024-01-01T00:00Z, +1d)" in caught.value.where


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        json_values,
        st.lists(json_values, max_size=4),
        st.lists(
            st.dictionaries(
                st.sampled_from(["path", "ts", "status", "priority", "value", "ackInfo", "x"]),
                json_values,
            ),
            max_size=4,
        ),
    )
)
def test_any_alarm_json_either_parses_or_raises_malformed_answer(data: Any) -> None:
    try:
        body = alarm_answer(data)
    except orjson.JSONEncodeError:
        return
    try:
        table = parse_alarm_history_answer(body, "n")
    except MalformedAnswer:
        return
    assert table.num_rows == (len(data) if isinstance(data, list) else 0)
