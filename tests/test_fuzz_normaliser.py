"""The normaliser fuzzed with arbitrary JSON: only the project's typed error comes out."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.errors import MalformedAnswer
from connectors.normalise import (
    parse_alarm_history_answer,
    parse_history_answer,
    parse_tag_details,
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=30,
)
rows = st.lists(st.lists(scalars, min_size=0, max_size=6), max_size=6)
history_like = st.dictionaries(
    st.text(min_size=1, max_size=10),
    st.fixed_dictionaries({"request": json_values, "data": rows | json_values}),
    max_size=4,
)


def _check(parse: Any, body: bytes) -> None:
    error: MalformedAnswer | None = None
    try:
        parse(body)
    except MalformedAnswer as exc:
        error = exc
    if error is not None:
        assert error.operation
        assert "\n" not in str(error)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values)
def test_arbitrary_json_history_answers(value: Any) -> None:
    _check(lambda b: parse_history_answer(b, "n", chunk_label="fuzz"), json.dumps(value).encode())


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(history_like)
def test_history_shaped_answers(value: Any) -> None:
    body = json.dumps(value).encode()
    try:
        page = parse_history_answer(body, "n", chunk_label="fuzz")
    except MalformedAnswer:
        return
    # Whatever is accepted is kept whole: one row per input row, nothing dropped.
    expected = sum(
        len(entry["data"]) for entry in value.values() if isinstance(entry["data"], list)
    )
    assert page.table.num_rows == expected


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values)
def test_arbitrary_json_alarm_answers(value: Any) -> None:
    _check(
        lambda b: parse_alarm_history_answer(b, "n", chunk_label="fuzz"), json.dumps(value).encode()
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values)
def test_arbitrary_json_tag_details(value: Any) -> None:
    _check(lambda b: parse_tag_details(b, "n", 0), json.dumps(value).encode())


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes(body: bytes) -> None:
    _check(lambda b: parse_history_answer(b, "n"), body)
    _check(lambda b: parse_alarm_history_answer(b, "n"), body)
