"""The normaliser fuzzed with arbitrary JSON: only the project's typed error comes out."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from connectors.errors import MalformedAnswer
from connectors.normalise.alarms import parse_alarm_history_answer
from connectors.normalise.details import parse_tag_details
from connectors.normalise.history import (
    history_page_from_bytes,
    parse_history_answer,
    parse_history_answer_careful,
)


def examples(per_run: int) -> int:
    """Examples per test: most of the time goes to drawing them, so CI draws this many (a
    new set each run); HISTORIAN_FUZZ_EXAMPLES=N searches deeper."""
    return int(os.environ.get("HISTORIAN_FUZZ_EXAMPLES", per_run))


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


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values)
def test_arbitrary_json_history_answers(value: Any) -> None:
    _check(lambda b: parse_history_answer(b, "n", chunk_label="fuzz"), json.dumps(value).encode())


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow], deadline=None)
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


@settings(max_examples=examples(120), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values)
def test_arbitrary_json_alarm_answers(value: Any) -> None:
    _check(
        lambda b: parse_alarm_history_answer(b, "n", chunk_label="fuzz"), json.dumps(value).encode()
    )


@settings(max_examples=examples(120), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values)
def test_arbitrary_json_tag_details(value: Any) -> None:
    _check(lambda b: parse_tag_details(b, "n", 0), json.dumps(value).encode())


@settings(max_examples=examples(200), deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes(body: bytes) -> None:
    _check(lambda b: parse_history_answer(b, "n"), body)
    _check(lambda b: parse_alarm_history_answer(b, "n"), body)


# -- the byte-level reading against the careful one, on answers written as text -----------

T0 = 1_704_067_200_000
numbers = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(T0 - 3, T0 + 3).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(
        [
            *("-0", "-0.0", "0", "1e3", "1E+3", "-2.5e-3", "1e-400", "-1e-400", "1e400"),
            *("5e-324", "1.7976931348623157e308", "1.8e308", "1704067200000.0", "0.5e1"),
            *("192", "-32769"),
        ]
    ),
)
literals = st.sampled_from(["null", "true", "false", '"RUN"', '"a],[b"', "{}", "[]", "[1]"])
elements = st.one_of(numbers, numbers, literals)
stamps = st.integers(T0 - 3, T0 + 3).map(str) | numbers
text_rows = st.one_of(
    # mostly what the node sends: [ts, value, quality, extra]
    st.tuples(stamps, elements, st.sampled_from(["192", "0", "null"]) | elements, elements),
    st.lists(elements, min_size=0, max_size=6).map(tuple),
).map(lambda row: "[" + ",".join(row) + "]")
datas = st.one_of(
    st.lists(text_rows, max_size=6).map(lambda rows: "[" + ",".join(rows) + "]"),
    st.sampled_from(["null", "[]", "5", '"x"', "{}", "[5]", "[[1,2,3,4],5,6,7,8,9]"]),
)
keys = st.sampled_from(["/a", "/b", '/q"x', "/t ü", "/a[[1,2]]"]) | st.text(max_size=4)
members = st.tuples(
    st.sampled_from(["data", "data", "request", "other"]),
    datas | st.sampled_from(['{"tag":"/a","options":{"mode":"raw"}}', '"\\ud800"', "[1e400]"]),
)


def _json_key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


answers_as_text = st.lists(st.tuples(keys, st.lists(members, max_size=3)), max_size=4).map(
    lambda entries: (
        "{"
        + ",".join(
            _json_key(tag) + ":{" + ",".join(_json_key(k) + ":" + v for k, v in entry) + "}"
            for tag, entry in entries
        )
        + "}"
    )
)


def _outcome(parse: Any, body: bytes) -> tuple[Any, ...]:
    try:
        page = parse(body, "n", chunk_label="fuzz")
    except MalformedAnswer as exc:
        return ("error", str(exc), exc.where)
    signs = [
        None if v is None else math.copysign(1.0, v) for v in page.table.column("value").to_pylist()
    ]
    # Stamps as epoch ms: a stamp read in seconds may lie beyond Python's datetime range.
    index = page.table.schema.get_field_index("ts")
    rows = page.table.set_column(index, "ts", page.table.column("ts").cast(pa.int64()))
    return ("page", rows.to_pylist(), signs, page.tags, page.table.schema)


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(answers_as_text, st.data())
def test_the_byte_reading_always_agrees_with_the_careful_one(text: str, data: Any) -> None:
    body = text.encode()
    if data.draw(st.booleans()):  # a few bytes changed, inserted or dropped
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(body)))
            byte = data.draw(st.sampled_from(list(b'[],0123456789.-eEnulltrfs"{}: \n\xff')))
            cut = data.draw(st.integers(0, 1))
            body = body[:at] + bytes([byte]) * data.draw(st.integers(0, 1)) + body[at + cut :]
    careful = _outcome(parse_history_answer_careful, body)
    assert _outcome(parse_history_answer, body) == careful
    page = history_page_from_bytes(body, "n")
    event("read from the bytes" if page is not None else "read the careful way")
    if page is not None:
        assert _outcome(lambda b, n, chunk_label: page, body) == careful


node_rows = st.tuples(
    st.integers(T0 - 3, T0 + 3).map(str),
    st.one_of(numbers, st.sampled_from(["null", "true", "false"])),
    st.integers(-(2**15), 2**15 - 1).map(str) | st.just("null"),
    st.integers(-(2**63), 2**63 - 1).map(str) | st.just("null"),
).map(lambda row: "[" + ",".join(row) + "]")
node_answers = st.dictionaries(
    st.text(min_size=1, max_size=6),
    st.lists(node_rows, max_size=8).map(lambda rows: "[" + ",".join(rows) + "]"),
    max_size=5,
).map(
    lambda tags: (
        "{"
        + ",".join(
            f'{_json_key(tag)}:{{"request":{{"tag":{_json_key(tag)}}},"data":{rows}}}'
            for tag, rows in tags.items()
        )
        + "}"
    )
)


@settings(max_examples=examples(120), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(node_answers)
def test_the_byte_reading_of_answers_shaped_like_the_nodes(text: str) -> None:
    body = text.encode()
    careful = _outcome(parse_history_answer_careful, body)
    page = history_page_from_bytes(body, "n")
    event("read from the bytes" if page is not None else "read the careful way")
    if page is not None:
        assert _outcome(lambda b, n, chunk_label: page, body) == careful
    assert _outcome(parse_history_answer, body) == careful
