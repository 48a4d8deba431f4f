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


def test_alarm_arrays_are_read_positionally_with_the_rest_in_extra() -> None:
    body = alarm_answer([[T0, "/Alarms/a", 2, 1, False, "low", None, "x", 5]])
    row = parse_alarm_history_answer(body, "n").to_pylist()[0]
    assert (row["path"], row["status"], row["priority"], row["value"], row["description"]) == (
        "/Alarms/a",
        2,
        1,
        "false",
        "low",
    )
    assert orjson.loads(row["extra"]) == {"_rest": ["x", 5]}


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
