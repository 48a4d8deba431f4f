"""History answers -> typed Arrow tables: exact values, never a silent drop; the byte-level
reading (fastrows) gives what the careful one gives."""

from __future__ import annotations

import contextlib
import gc
import math
from collections import Counter
from typing import Any

import msgspec
import orjson
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connectors.errors import MalformedAnswer
from connectors.normalise import fastrows
from connectors.normalise.history import (
    HistoryPage,
    TagStats,
    assign_seq,
    history_frame,
    history_page_from_bytes,
    parse_history_answer,
    parse_history_answer_careful,
    parse_single_history_answer,
)
from connectors.schema import (
    TAG_HISTORY_ENCODED_SCHEMA,
    TAG_HISTORY_SCHEMA,
)
from tests.connectors.normalise.json_values import T0, json_values

ODD_PATH = '/Plant A/Line 1/Temp, "inlet" ü.1'


def many(entries: dict[str, Any]) -> bytes:
    """A historyMany answer with the spec's request echo."""
    return orjson.dumps(
        {
            path: {"request": {"tag": path, "options": {"mode": "raw"}, "data": None}, "data": rows}
            for path, rows in entries.items()
        }
    )


def rows_of(page: HistoryPage) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = page.table.to_pylist()
    return rows


def ms(row: dict[str, Any]) -> int:
    return int(row["ts"].timestamp() * 1000)


# -- tag history: values -------------------------------------------------------------------


def test_numeric_rows_become_typed_columns_in_answer_order() -> None:
    page = parse_history_answer(
        many({ODD_PATH: [[T0, 1.5, 192, 0], [T0 + 1000, 2, 192, 7], [T0 + 2000, None, 0, 0]]}),
        "node-1",
    )
    assert page.table.schema == TAG_HISTORY_SCHEMA
    rows = rows_of(page)
    assert [ms(r) for r in rows] == [T0, T0 + 1000, T0 + 2000]
    assert [r["value"] for r in rows] == [1.5, 2.0, None]
    assert [r["quality"] for r in rows] == [192, 192, 0]
    assert [r["extra"] for r in rows] == [0, 7, 0]
    assert {r["node"] for r in rows} == {"node-1"}
    assert {r["tag"] for r in rows} == {ODD_PATH}
    assert all(r["value_bool"] is None and r["value_str"] is None for r in rows)


def test_tag_changing_type_keeps_each_value_in_its_own_column() -> None:
    page = parse_history_answer(
        many({"/t": [[T0, 1, 192, 0], [T0 + 1, True, 192, 0], [T0 + 2, "RUN", 192, 0]]}), "n"
    )
    rows = rows_of(page)
    assert [(r["value"], r["value_bool"], r["value_str"]) for r in rows] == [
        (1.0, None, None),
        (None, True, None),
        (None, None, "RUN"),
    ]


def test_booleans_are_never_numbers_even_after_a_float() -> None:
    page = parse_history_answer(many({"/t": [[T0, 1.5, 192, 0], [T0 + 1, True, 192, 0]]}), "n")
    rows = rows_of(page)
    assert rows[1]["value"] is None
    assert rows[1]["value_bool"] is True


@pytest.mark.parametrize(
    ("values", "column"),
    [([True, False, None], "value_bool"), (["a", "", None], "value_str")],
)
def test_homogeneous_boolean_and_string_tags(values: list[Any], column: str) -> None:
    page = parse_history_answer(
        many({"/t": [[T0 + i, v, 192, 0] for i, v in enumerate(values)]}), "n"
    )
    assert [r[column] for r in rows_of(page)] == values
    assert page.table.column("value").null_count == 3


def test_short_rows_have_null_quality_and_extra() -> None:
    page = parse_history_answer(many({"/t": [[T0, 1], [T0 + 1, 2, 192], [T0 + 2, 3, 192, 9]]}), "n")
    rows = rows_of(page)
    assert [r["quality"] for r in rows] == [None, 192, 192]
    assert [r["extra"] for r in rows] == [None, None, 9]


def test_integral_float_timestamps_and_qualities_are_accepted() -> None:
    page = parse_history_answer(many({"/t": [[float(T0), 1, 192.0, 0.0]]}), "n")
    row = rows_of(page)[0]
    assert (ms(row), row["quality"], row["extra"]) == (T0, 192, 0)


def test_large_integer_value_falls_back_without_losing_the_row() -> None:
    big = 2**60 + 1
    page = parse_history_answer(many({"/t": [[T0, big, 192, 0], [T0 + 1, 0.5, 192, 0]]}), "n")
    assert [r["value"] for r in rows_of(page)] == [float(big), 0.5]


def test_null_and_empty_data_are_zero_rows_but_null_is_not_an_answer() -> None:
    page = parse_history_answer(many({"/a": None, "/b": [], "/c": [[T0, 1, 192, 0]]}), "n")
    assert page.table.num_rows == 1
    assert page.tags["/a"] == TagStats(0, None, None, 0, null_data=True)
    assert page.tags["/b"] == TagStats(0, None, None, 0)
    assert page.tags["/c"] == TagStats(1, T0, T0, 1)
    assert page.answered() == {"/b", "/c"}


def test_null_data_is_told_apart_by_the_careful_reading_too() -> None:
    body = b'{"/a": {"data": null}, "/b": {"data": []}}  '  # not compact: the careful path
    page = parse_history_answer(body, "n")
    assert page.answered() == {"/b"}


def test_empty_answer_is_an_empty_table_of_the_schema() -> None:
    page = parse_history_answer(b"{}", "n")
    assert page.table.num_rows == 0
    assert page.table.schema == TAG_HISTORY_SCHEMA
    assert page.tags == {}


def test_stats_count_rows_sharing_the_last_timestamp() -> None:
    rows = [[T0, 1, 192, 0], [T0 + 5, 2, 192, 0], [T0 + 5, 3, 192, 0], [T0 + 5, 4, 192, 0]]
    page = parse_history_answer(many({"/t": rows}), "n")
    assert page.tags["/t"] == TagStats(rows=4, first_ts_ms=T0, last_ts_ms=T0 + 5, at_last_ts=3)


def test_seq_numbers_samples_sharing_a_millisecond_in_answer_order() -> None:
    rows = [[T0 + 1, 1, 192, 0], [T0, 2, 192, 0], [T0 + 1, 3, 192, 0], [T0, 4, 192, 0]]
    page = parse_history_answer(many({"/a": rows, "/b": [[T0 + 1, 9, 192, 0]]}), "n")
    got = [(r["tag"], ms(r) - T0, r["seq"], r["value"]) for r in rows_of(page)]
    assert got == [
        ("/a", 1, 0, 1.0),
        ("/a", 0, 0, 2.0),
        ("/a", 1, 1, 3.0),
        ("/a", 0, 1, 4.0),
        ("/b", 1, 0, 9.0),
    ]


def test_single_history_answer() -> None:
    body = orjson.dumps({"request": {"tag": ODD_PATH}, "data": [[T0, 4.25, 192, 0]]})
    page = parse_single_history_answer(body, "n", ODD_PATH)
    assert [(r["tag"], r["value"]) for r in rows_of(page)] == [(ODD_PATH, 4.25)]
    assert page.tags == {ODD_PATH: TagStats(1, T0, T0, 1)}


def test_history_frame_has_arrow_backed_utc_columns() -> None:
    frame = history_frame(parse_history_answer(many({"/t": [[T0, 1.0, 192, 0]]}), "n").table)
    assert all(isinstance(dtype, pd.ArrowDtype) for dtype in frame.dtypes)
    assert frame["ts"].dtype == pd.ArrowDtype(pa.timestamp("ms", tz="UTC"))
    assert frame["ts"].iloc[0] == pd.Timestamp("2024-01-01T00:00:00Z")


def test_assign_seq_sorts_and_renumbers_across_pages_keeping_page_order() -> None:
    first = parse_history_answer(many({"/b": [[T0 + 2, 1, 192, 0]], "/a": [[T0, 1, 192, 0]]}), "n")
    second = parse_history_answer(many({"/b": [[T0 + 2, 2, 192, 0], [T0 + 1, 3, 192, 0]]}), "n")
    table = assign_seq(pa.concat_tables([first.table, second.table]))
    got = [(r["tag"], ms(r) - T0, r["seq"], r["value"]) for r in table.to_pylist()]
    assert got == [("/a", 0, 0, 1.0), ("/b", 1, 0, 3.0), ("/b", 2, 0, 1.0), ("/b", 2, 1, 2.0)]
    assert table.schema == TAG_HISTORY_SCHEMA


def test_encoded_pages_hold_the_same_rows_with_names_as_dictionaries() -> None:
    answers = [
        many({"/b": [[T0 + 2, 1, 192, 0]], "/a": [[T0, 1, 192, 0]], "/none": []}),
        many({"/b": [[T0 + 2, "text", 192, 0]], "/a": [[T0, True, None]]}),  # careful path
    ]
    for body in answers:
        plain = parse_history_answer(body, "n")
        encoded = parse_history_answer(body, "n", encoded=True)
        assert encoded.table.schema == TAG_HISTORY_ENCODED_SCHEMA
        assert encoded.table.to_pylist() == plain.table.to_pylist()
        assert encoded.tags == plain.tags
    empty = parse_history_answer(b"{}", "n", encoded=True)
    assert empty.table.schema == TAG_HISTORY_ENCODED_SCHEMA


def test_assign_seq_of_encoded_pages_orders_by_name_not_by_dictionary_index() -> None:
    first = parse_history_answer(
        many({"/b": [[T0 + 2, 1, 192, 0]], "/a": [[T0, 1, 192, 0]]}), "n", encoded=True
    )
    second = parse_history_answer(
        many({"/b": [[T0 + 2, 2, 192, 0], [T0 + 1, 3, 192, 0]]}), "n", encoded=True
    )
    table = assign_seq(pa.concat_tables([first.table, second.table]))
    got = [(r["tag"], ms(r) - T0, r["seq"], r["value"]) for r in table.to_pylist()]
    assert got == [("/a", 0, 0, 1.0), ("/b", 1, 0, 3.0), ("/b", 2, 0, 1.0), ("/b", 2, 1, 2.0)]
    assert table.schema == TAG_HISTORY_ENCODED_SCHEMA
    frame = history_frame(table)
    assert frame["tag"].dtype == pd.ArrowDtype(TAG_HISTORY_ENCODED_SCHEMA.field("tag").type)
    assert list(frame["tag"]) == ["/a", "/b", "/b", "/b"]


def test_assign_seq_of_an_empty_table() -> None:
    assert assign_seq(TAG_HISTORY_SCHEMA.empty_table()).num_rows == 0


# -- tag history: wrong shapes ---------------------------------------------------------------

BAD_ANSWERS = {
    "not JSON": b"<html>502 Bad Gateway</html>",
    "truncated": many({"/t": [[T0, 1, 192, 0]]})[:-7],
    "array": b"[]",
    "entry not object": b'{"/t": [1, 2]}',
    "entry without data": b'{"/t": {"request": {}}}',
    "data not a list": b'{"/t": {"data": {"a": 1}}}',
    "row not a list": b'{"/t": {"data": [5]}}',
    "row an object": b'{"/t": {"data": [{"0": 1, "1": 2, "2": 3, "3": 4}]}}',
    "row a string": b'{"/t": {"data": ["abcd"]}}',
    "row empty": b'{"/t": {"data": [[]]}}',
    "row of one": b'{"/t": {"data": [[1704067200000]]}}',
    "row of five": b'{"/t": {"data": [[1704067200000, 1, 192, 0, 0]]}}',
    "ts string": b'{"/t": {"data": [["2024-01-01", 1, 192, 0]]}}',
    "ts null": b'{"/t": {"data": [[1, 1, 192, 0], [null, 1, 192, 0]]}}',
    "ts fraction of a millisecond": b'{"/t": {"data": [[1700000000000.5, 1, 192, 0]]}}',
    "ts numbers and text": b'{"/t": {"data": [[1700000000000, 1, 192, 0], ["2024-01-01T00:00:00Z", 1, 192, 0]]}}',
    "ts boolean": b'{"/t": {"data": [[true, 1, 192, 0]]}}',
    "ts boolean after float": b'{"/t": {"data": [[1.0, 1, 192, 0], [true, 1, 192, 0]]}}',
    "ts too big": b'{"/t": {"data": [[18446744073709551615, 1, 192, 0]]}}',
    "value object": b'{"/t": {"data": [[1, {"v": 1}, 192, 0]]}}',
    "value array": b'{"/t": {"data": [[1, [1], 192, 0]]}}',
    "quality string": b'{"/t": {"data": [[1, 1, "good", 0]]}}',
    "quality too big": b'{"/t": {"data": [[1, 1, 40000, 0]]}}',
    "quality boolean": b'{"/t": {"data": [[1, 1, true, 0]]}}',
    "extra string": b'{"/t": {"data": [[1, 1, 192, "x"]]}}',
    "extra fraction": b'{"/t": {"data": [[1, 1, 192, 0.5]]}}',
}


@pytest.mark.parametrize("body", BAD_ANSWERS.values(), ids=BAD_ANSWERS.keys())
def test_wrong_shapes_raise_malformed_answer_naming_tag_and_chunk(body: bytes) -> None:
    with pytest.raises(MalformedAnswer) as caught:
        parse_history_answer(body, "n", chunk_label="12 tags /t [2024-01-01T00:00Z, +1h)")
    error = caught.value
    assert error.operation == "tag.historyMany"
    assert error.where is not None
    assert "12 tags /t [2024-01-01T00:00Z, +1h)" in error.where
    if body.startswith(b'{"/t"') and body.endswith(b"}"):
        assert "'/t'" in error.where


def test_wrong_row_is_named_by_index() -> None:
    body = b'{"/t": {"data": [[1, 1, 192, 0], [2, 1, 192, 0], [3, {}, 192, 0]]}}'
    with pytest.raises(MalformedAnswer, match=r"row 2: value is an object"):
        parse_history_answer(body, "n", operation="tag.historyFilter")


def test_single_history_answer_without_data_is_malformed() -> None:
    with pytest.raises(MalformedAnswer, match="request and data") as caught:
        parse_single_history_answer(b'{"request": {}}', "n", "/t", chunk_label="c")
    assert caught.value.operation == "tag.history"


def test_more_samples_on_one_millisecond_than_seq_can_number_is_malformed() -> None:
    with pytest.raises(MalformedAnswer, match="one millisecond"):
        parse_history_answer(many({"/t": [[T0, 1, 192, 0]] * 32769}), "n")


@pytest.mark.parametrize("enabled_before", [True, False])
def test_gc_state_is_restored_after_success_and_failure(enabled_before: bool) -> None:
    was = gc.isenabled()
    try:
        if not enabled_before:
            gc.disable()
        parse_history_answer(many({"/t": [[T0, 1, 192, 0]]}), "n")
        assert gc.isenabled() is enabled_before
        with pytest.raises(MalformedAnswer):
            parse_history_answer(b'{"/t": {"data": [[1, {}]]}}', "n")
        assert gc.isenabled() is enabled_before
    finally:
        if was:
            gc.enable()


# -- tag history: the byte-level reading (fastrows) agrees with the careful one -------------


def page_rows(page: HistoryPage) -> list[tuple[Any, ...]]:
    """Rows of a page with the sign of each double (Arrow and == see -0.0 as 0.0)."""
    rows = []
    for row in page.table.to_pylist():
        value = row["value"]
        rows.append((*row.values(), None if value is None else math.copysign(1.0, value)))
    return rows


def outcome(parse: Any, body: bytes) -> tuple[Any, ...]:
    """What a reading of `body` gives: its rows, stats and schema, or its error."""
    try:
        page = parse(body, "n", operation="tag.historyFilter", chunk_label="c")
    except MalformedAnswer as exc:
        return ("error", str(exc), exc.where, exc.operation)
    return ("page", page_rows(page), page.tags, page.table.schema)


def answer_text(entries: dict[str, str]) -> bytes:
    """A compact historyMany answer whose `data` texts are written as given."""
    return (
        "{"
        + ",".join(
            f'{orjson.dumps(tag).decode()}:{{"request":{{"tag":{orjson.dumps(tag).decode()},'
            f'"options":{{"mode":"raw","invalidAsNull":true}},"data":null}},"data":{data}}}'
            for tag, data in entries.items()
        )
        + "}"
    ).encode()


BYTE_READING_CASES = {
    "numbers": {"/t": f"[[{T0},1.5,192,0],[{T0 + 1000},2,192,7],[{T0 + 2000},-3.25,0,0]]"},
    "nulls": {"/t": f"[[{T0},null,0,null],[{T0 + 1},null,null,0],[{T0 + 2},4,192,0]]"},
    "only nulls": {"/t": f"[[{T0},null,null,null],[{T0 + 1},null,0,0]]"},
    "booleans": {"/t": f"[[{T0},true,192,0],[{T0 + 1},false,null,null],[{T0 + 2},null,0,0]]"},
    "booleans mixed with numbers": {"/t": f"[[{T0},1.5,192,0],[{T0 + 1},true,192,0]]"},
    "numbers mixed with strings": {"/t": f'[[{T0},1,192,0],[{T0 + 1},"a],[b",192,0]]'},
    "integral float timestamps": {"/t": f"[[{T0}.0,1,192.0,0.0],[{float(T0 + 1)},2,192,0]]"},
    "short rows": {"/t": f"[[{T0},1],[{T0 + 1},2,192],[{T0 + 2},3,192,9]]"},
    "huge integers": {
        "/t": f"[[{T0},{2**60 + 1},192,{2**63 - 1}],[{T0 + 1},{2**64},192,{-(2**63)}],"
        f"[{T0 + 2},{10**30},192,0],[{T0 + 3},{-(2**70)},192,0]]"
    },
    "negative numbers": {"/t": f"[[{T0},-1.5,-1,-7],[{T0 + 1},-7,-32768,-1]]"},
    "exponents": {
        "/t": f"[[{T0},1e3,192,0],[{T0 + 1},1E+3,192,0],[{T0 + 2},-2.5e-3,192,0],"
        f"[{T0 + 3},1e-400,192,0],[{T0 + 4},5e-324,192,0],[{T0 + 5},1.7976931348623157e308,192,0]]"
    },
    "negative zeros": {"/t": f"[[{T0},-0.0,192,0],[{T0 + 1},-1e-400,192,0],[{T0 + 2},-0e0,0,0]]"},
    "integer -0 quality and extra": {"/t": f"[[{T0},1,-0,-0]]"},
    "integer -0 is +0.0": {"/t": f"[[{T0},-0,192,0],[{T0 + 1},-0.0,192,0]]"},
    "duplicate timestamps": {
        "/t": f"[[{T0},1,192,0],[{T0},2,192,0],[{T0 + 5},3,0,0],[{T0 + 5},4,0,0]]"
    },
    "unsorted rows": {
        "/t": f"[[{T0 + 2},1,192,0],[{T0},2,192,0],[{T0 + 2},3,192,0],[{T0 + 1},4,0,0]]"
    },
    "empty data": {"/a": "null", "/b": "[]", "/c": f"[[{T0},1,192,0]]", "/d": "[ ]"},
    "whitespace inside data": {"/t": f"[ [{T0}, 1.5,\n192, 0] ,\t[{T0 + 1} ,null,0,0] ]"},
    "odd tag paths": {ODD_PATH: f"[[{T0},1,192,0]]", '/a[[1,2]]"],[': f"[[{T0},2,192,0]]"},
    # Read at once, no slice per tag (fastrows.read_whole), when all tags are of one kind:
    "many number tags": {
        f"/n {i}": [
            f"[[{T0},{i}.5,192,0],[{T0 + 1},null,0,null]]",
            f"[[{T0 + 2},1,192,0],[{T0},2,192,0],[{T0 + 2},3,192,0]]",
            f"[[{T0},-0.0,192,0],[{T0},1e-400,0,0]]",
        ][i % 3]
        for i in range(9)
    },
    "many number tags, one with an integer -0": {
        "/a": f"[[{T0},1.5,192,0]]",
        "/b": f"[[{T0},-0,192,0],[{T0 + 1},-0.0,192,0]]",
        "/c": f"[[{T0},2,192,0]]",
    },
    "many boolean tags": {
        f"/b {i}": f"[[{T0},{'true' if i % 2 else 'false'},192,0],[{T0 + 1},null,null,null]]"
        for i in range(5)
    },
    "many tags of every kind": {
        f"/tag {i}": [
            f"[[{T0},{i}.5,192,0],[{T0 + 1},null,0,0]]",
            f"[[{T0},true,192,0]]",
            f'[[{T0},"RUN",192,0]]',
            f"[[{T0}.0,1,192,0]]",
            "null",
        ][i % 5]
        for i in range(12)
    },
}


@pytest.mark.parametrize("entries", BYTE_READING_CASES.values(), ids=BYTE_READING_CASES.keys())
def test_byte_reading_gives_the_careful_page(entries: dict[str, str]) -> None:
    body = answer_text(entries)
    careful = outcome(parse_history_answer_careful, body)
    assert careful[0] == "page"
    page = history_page_from_bytes(body, "n")
    assert page is not None  # the bytes vouched for it
    assert outcome(lambda *_, **__: page, body) == careful
    assert outcome(parse_history_answer, body) == careful


def test_byte_reading_keeps_signs_and_nulls_of_values() -> None:
    body = answer_text({"/t": BYTE_READING_CASES["integer -0 is +0.0"]["/t"]})
    page = history_page_from_bytes(body, "n")
    assert page is not None
    assert [r[-1] for r in page_rows(page)] == [1.0, -1.0]
    page = history_page_from_bytes(answer_text(BYTE_READING_CASES["nulls"]), "n")
    assert page is not None
    assert page.table.column("value").to_pylist() == [None, None, 4.0]


def test_number_and_boolean_tags_are_read_as_csv(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_orjson(member: Any) -> Any:
        raise AssertionError(f"{bytes(member)!r} read by orjson")

    monkeypatch.setattr(fastrows, "load_member", no_orjson)
    for name in ("numbers", "nulls", "booleans", "exponents", "negative zeros", "huge integers"):
        body = answer_text(BYTE_READING_CASES[name])
        assert history_page_from_bytes(body, "n") is not None, name


def test_tags_of_one_kind_are_read_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_slices(*_: Any) -> Any:
        raise AssertionError("read tag by tag")

    monkeypatch.setattr(fastrows, "read_plans", no_slices)
    for name in ("many number tags", "many boolean tags"):
        body = answer_text(BYTE_READING_CASES[name])
        assert history_page_from_bytes(body, "n") is not None, name


def test_tags_of_each_kind_are_read_at_once_wherever_they_stand(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Numbers, booleans and strings interleaved: one read of the numbers, one of the
    # booleans (not one per run of neighbours), the same page as the careful reading.
    kinds = (f"[[{T0},1.5,192,0],[{T0 + 1},null,0,null]]", f"[[{T0},true,192,0]]", '[[1,"a",0,0]]')
    body = answer_text({f"/t {i}": kinds[i % 3] for i in range(9)})
    reads: list[int] = []
    read_rows = fastrows.read_rows

    def counted(lines: Any, rows: int, booleans: bool) -> Any:
        reads.append(rows)
        return read_rows(lines, rows, booleans)

    monkeypatch.setattr(fastrows, "read_rows", counted)
    page = history_page_from_bytes(body, "n")
    assert page is not None
    assert sorted(reads) == [3, 6]  # 3 boolean tags of 1 row, 3 number tags of 2
    assert outcome(lambda *_, **__: page, body) == outcome(parse_history_answer_careful, body)


COMPACT_BAD_ANSWERS = {
    **{name: body.replace(b": ", b":").replace(b", ", b",") for name, body in BAD_ANSWERS.items()},
    "number beyond a double in a later tag": answer_text(
        {"/a": f"[[{T0},1,192,0]]", "/t": f"[[{T0},1e400,192,0]]"}
    ),
    "number beyond a double in a request": (
        b'{"/t":{"request":{"x":[1e400]},"data":[[1,1,192,0]]}}'
    ),
    "invalid UTF-8 in a request": b'{"/t":{"request":"\xff","data":[[1,1,192,0]]}}',
    "lone surrogate in a request": b'{"/t":{"request":"\\ud800","data":[[1,1,192,0]]}}',
    "repeated tag hiding a bad entry": b'{"/t":{"data":[[1,1e400,192,0]]},"/t":{"data":[]}}',
    "repeated data hiding a bad one": b'{"/t":{"data":[[1,"\xff",192,0]],"data":[]}}',
    "five scalars after the rows": b'{"/t":{"data":[[1,2,192,0],5,6,7,8,9]}}',
    "nested array in a row": b'{"/t":{"data":[[1,2,192,0],[5,[6],7,8]]}}',
    "timestamp beyond int64": b'{"/t":{"data":[[9223372036854775808,1,192,0]]}}',
    "more samples on one millisecond than seq numbers": answer_text(
        {"/t": "[" + ",".join([f"[{T0},1,192,0]"] * 32769) + "]"}
    ),
}


@pytest.mark.parametrize("body", COMPACT_BAD_ANSWERS.values(), ids=COMPACT_BAD_ANSWERS.keys())
def test_wrong_compact_answers_raise_the_careful_error(body: bytes) -> None:
    assert history_page_from_bytes(body, "n") is None
    careful = outcome(parse_history_answer_careful, body)
    assert careful[0] == "error"
    assert outcome(parse_history_answer, body) == careful


def test_answers_that_are_not_compact_are_read_the_careful_way() -> None:
    entries = {"/t": f"[[{T0},1,192,0]]"}
    compact = answer_text(entries)
    assert history_page_from_bytes(compact, "n") is not None
    spaced = (
        compact.replace(b'"/t":{', b'"/t": {'),
        compact.replace(b',"data":[[', b', "data":[['),
        compact.replace(b"]]}}", b"]] }}"),
    )
    for body in spaced:
        assert body != compact
        assert history_page_from_bytes(body, "n") is None
        assert outcome(parse_history_answer, body) == outcome(parse_history_answer_careful, body)
    # whitespace around the answer is no reason to give up
    assert history_page_from_bytes(b" \n" + compact + b"\r\n", "n") is not None


def read_as_csv(*datas: bytes) -> list[fastrows.Columns | None]:
    csv, plans = fastrows.data_as_csv([msgspec.Raw(data) for data in datas])
    return fastrows.read_plans(csv, plans)


@pytest.mark.parametrize(
    "data",
    [
        b"[[1,2,3,4]]",
        b"[[1,null,3,4],[5,6.5e1,-7,8]]",
        b"[[1,true,3,4],[5,false,null,null]]",
    ],
)
def test_data_as_csv_reads_lists_of_four_scalars(data: bytes) -> None:
    (columns,) = read_as_csv(data)
    assert columns is not None
    expected = list(zip(*orjson.loads(data), strict=True))
    assert [column.to_pylist() for column in columns] == [list(c) for c in expected]


NOT_CSV_ROWS = [
    b"null",
    b"[]",
    b"[5]",
    b"[null,[1,2,3,4]]",
    b"[[]]",
    b"[[1,2,3,4],[]]",
    b"[[1,2,3]]",
    b"[[1,2,3,4,5]]",
    b"[[1,2,3,4],5,6,7,8,9]",
    b"[[1,2,3,4],[5,6,7,8],9,10,11,12,13]",
    b"[[1,2,3,4],[5,[6],7,8]]",
    b"[[1,2,3,[4]],[5,6,7,8]]",
    b"[[1,[2,3],4]]",
    b"[[[1,2,3,4]]]",
    b"[[[1,2,3,4],[5,6,7,8]]]",
    b"[[1,2,3,4],[[5,6,7,8]]]",
    b'[[1,"a",3,4]]',
    b"[[1,{},3,4]]",
    b"[[1,2,3,4]" + b",[1,2,3,4]" * 3 + b",1,2,3,4,5]",
    b"[[1.5,2,3,4]]",
    b"[[1,2,3.0,4]]",
    b"[[1,2,40000,4]]",
    b"[[1,2,3,9223372036854775808]]",
    b"[[1,1,3,4],[2,true,3,4]]",
    b"[[true,2,3,4]]",
    b"[[1, 2,3,4]]",
]


@pytest.mark.parametrize("data", NOT_CSV_ROWS)
def test_data_as_csv_reads_nothing_else(data: bytes) -> None:
    assert read_as_csv(data) == [None]
    # nor among neighbours that are fine, alone or read in one go
    good = b"[[1,2,3,4],[5,6,7,8]]"
    read = read_as_csv(good, data, good, good)
    assert read[1] is None
    assert [None if r is None else r[0].to_pylist() for r in read] == [[1, 5], None, [1, 5], [1, 5]]


@pytest.mark.parametrize(
    "data", [b"[[1,2,3,4],[null,2,3,4]]", b"[[1,1e400,3,4]]", b"[[1,-1e400,3,4]]"]
)
def test_what_the_careful_reading_refuses_is_refused(data: bytes) -> None:
    good = b"[[1,2,3,4]]"
    for datas in ((data,), (good, data, good)):
        with pytest.raises(fastrows.Refused):
            read_as_csv(*datas)


def test_a_value_written_as_the_integer_minus_zero_is_left_to_orjson() -> None:
    read = read_as_csv(b"[[1,-0.0,3,4]]", b"[[1,-0,3,4]]", b"[[1,0,3,4]]")
    assert [None if r is None else r[1].to_pylist() for r in read] == [[-0.0], None, [0.0]]


def test_neighbours_of_one_kind_are_read_in_one_go_and_split_again() -> None:
    read = read_as_csv(
        b"[[1,2,3,4]]", b"[[2,true,3,4]]", b"[[3,false,3,4]]", b"[[4,5,6,7],[8,9,10,11]]"
    )
    assert [None if r is None else r[0].to_pylist() for r in read] == [[1], [2], [3], [4, 8]]
    assert [None if r is None else r[1].type for r in read] == [
        pa.float64(),
        pa.bool_(),
        pa.bool_(),
        pa.float64(),
    ]


# -- tag history: properties ----------------------------------------------------------------


def _rows_in(answer: Any) -> int:
    return sum(len(entry["data"] or []) for entry in answer.values())


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    st.one_of(
        json_values,
        st.dictionaries(st.text(max_size=4), json_values, max_size=3),
        st.dictionaries(
            st.text(max_size=4),
            st.fixed_dictionaries({"data": json_values}),
            max_size=3,
        ),
        st.dictionaries(
            st.text(max_size=4),
            st.fixed_dictionaries(
                {"data": st.lists(st.lists(json_values, max_size=6), max_size=6)}
            ),
            max_size=3,
        ),
    )
)
def test_any_json_either_parses_every_row_or_raises_malformed_answer(answer: Any) -> None:
    try:
        body = orjson.dumps(answer)
    except orjson.JSONEncodeError:
        return  # integers beyond 64 bits cannot be sent
    page: HistoryPage | None = None
    error: MalformedAnswer | None = None
    try:
        page = parse_history_answer(body, "n", chunk_label="fuzz")
    except MalformedAnswer as exc:
        error = exc
    if page is None:
        assert error is not None
        assert error.where is not None
        assert "fuzz" in error.where
        return
    assert page.table.num_rows == _rows_in(answer)
    assert set(page.tags) == set(answer)
    assert page.table.schema == TAG_HISTORY_SCHEMA


@settings(deadline=None)
@given(st.binary(max_size=60))
def test_any_bytes_either_parse_or_raise_malformed_answer(body: bytes) -> None:
    with contextlib.suppress(MalformedAnswer):
        parse_history_answer(body, "n")


good_values = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
ts_ms = st.integers(T0 - 10, T0 + 10)
good_rows = st.one_of(
    st.tuples(ts_ms, good_values),
    st.tuples(ts_ms, good_values, st.none() | st.integers(0, 255)),
    st.tuples(
        ts_ms,
        good_values,
        st.none() | st.integers(0, 255),
        st.none() | st.integers(-(2**63), 2**63 - 1),
    ),
).map(list)


def _reference(tag: str, rows: list[list[Any]]) -> list[tuple[Any, ...]]:
    """The obvious per-row reading of the node-facts row format."""
    seen: Counter[int] = Counter()
    expected = []
    for row in rows:
        ts, value = row[0], row[1]
        quality = row[2] if len(row) > 2 else None
        extra = row[3] if len(row) > 3 else None
        number = float(value) if type(value) in (int, float) else None
        flag = value if type(value) is bool else None
        text = value if type(value) is str else None
        expected.append((tag, ts, seen[ts], number, flag, text, quality, extra))
        seen[ts] += 1
    return expected


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=6),
        st.one_of(
            st.lists(good_rows, max_size=12),
            # homogeneous 4-element rows: the fast path
            st.lists(
                st.tuples(ts_ms, st.floats(-1e9, 1e9) | st.none(), st.just(192), st.just(0)).map(
                    list
                ),
                max_size=12,
            ),
        ),
        max_size=4,
    )
)
def test_well_formed_rows_match_the_per_row_reference(answer: dict[str, list[list[Any]]]) -> None:
    page = parse_history_answer(many(answer), "n")
    got = [
        (
            r["tag"],
            ms(r),
            r["seq"],
            r["value"],
            r["value_bool"],
            r["value_str"],
            r["quality"],
            r["extra"],
        )
        for r in rows_of(page)
    ]
    expected = [item for tag, rows in answer.items() for item in _reference(tag, rows)]
    assert got == expected
    for tag, rows in answer.items():
        stamps = [row[0] for row in rows]
        last = max(stamps) if stamps else None
        assert page.tags[tag] == TagStats(
            len(rows), min(stamps) if stamps else None, last, stamps.count(last) if stamps else 0
        )


@settings(deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["/a", "/b"]), st.integers(0, 3)), max_size=30))
def test_assign_seq_numbers_ties_in_input_order(samples: list[tuple[str, int]]) -> None:
    table = pa.Table.from_pylist(
        [
            {"node": "n", "tag": tag, "ts": T0 + offset, "seq": 0, "value": float(i)}
            for i, (tag, offset) in enumerate(samples)
        ],
        schema=TAG_HISTORY_SCHEMA,
    )
    got = [(r["tag"], ms(r) - T0, r["seq"], r["value"]) for r in assign_seq(table).to_pylist()]
    seen: Counter[tuple[str, int]] = Counter()
    expected = []
    for i, (tag, offset) in sorted(enumerate(samples), key=lambda item: (item[1], item[0])):
        expected.append((tag, offset, seen[(tag, offset)], float(i)))
        seen[(tag, offset)] += 1
    assert got == expected


def test_nan_is_never_invented_for_a_null_value() -> None:
    page = parse_history_answer(many({"/t": [[T0, None, 0, 0]]}), "n")
    value = page.table.column("value")[0].as_py()
    assert value is None
    assert not (isinstance(value, float) and math.isnan(value))


# Row stamps in another unit (issue 27, item 1): each tag's stamps are read in their unit.
MS = 1_763_640_000_123
STAMPS_OF_ONE_MOMENT = {
    "epoch ms": f"[[{MS},1,192,0]]",
    "epoch seconds": f"[[{MS // 1000},1,192,0],[{MS // 1000 + 1},2,192,0]]",
    "epoch seconds as integral floats": f"[[{MS // 1000}.0,1,192,0]]",
    "epoch seconds with a fraction": f"[[{MS / 1000},1,192,0],[{MS // 1000},2,192,0]]",
    "ISO 8601 with Z": '[["2025-11-20T12:00:00.123Z",1,192,0]]',
    "ISO 8601 with an offset": '[["2025-11-20T13:00:00.123+01:00",1,192,0]]',
    "ISO 8601 without a zone (UTC)": '[["2025-11-20T12:00:00.123",1,192,0]]',
}


@pytest.mark.parametrize("data", STAMPS_OF_ONE_MOMENT.values(), ids=STAMPS_OF_ONE_MOMENT.keys())
def test_row_stamps_are_read_in_their_unit_tag_by_tag(data: str) -> None:
    body = answer_text({"/other": f"[[{T0},1,192,0]]", "/t": data})
    careful = outcome(parse_history_answer_careful, body)
    assert outcome(parse_history_answer, body) == careful
    page = parse_history_answer(body, "n")
    stamps = [
        int(row["ts"].timestamp() * 1000) for row in page.table.to_pylist() if row["tag"] == "/t"
    ]
    assert stamps[0] in (MS, MS - 123), stamps
    assert page.tags["/t"].first_ts_ms == min(stamps)
    others = [row["ts"] for row in page.table.to_pylist() if row["tag"] == "/other"]
    assert [int(ts.timestamp() * 1000) for ts in others] == [T0]
