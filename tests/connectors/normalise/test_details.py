"""Tag details answers -> TAG_METADATA_SCHEMA rows, and the paths alone, which agree."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.errors import MalformedAnswer
from connectors.normalise.details import (
    parse_tag_details,
    tag_details_paths,
    tag_details_paths_and_types,
)
from connectors.schema import TAG_METADATA_SCHEMA
from tests.connectors.normalise.json_values import T0, json_values

DETAILS = {
    "description": "",
    "_templates": [],
    "tags": {
        "Temp": {
            "id": 1,
            "fullPath": "/Plant A/Temp",
            "remote": None,
            "config": {
                "description": "Inlet temperature",
                "type": "number",
                "numberType": "float64",
                "format": "%.1f",
                "deadband": "0.1u",
                "clientAccess": "R",
                "engUnits": "°C",
                "views": ["main"],
                "extensions": {
                    "history": {
                        "enabled": True,
                        "module": "Historian",
                        "config": {"mode": "deadband", "deadband": 0.5},
                    }
                },
            },
        },
        "Bare": {"id": 2},
    },
}


def test_tag_details_become_the_tag_dimension() -> None:
    table = parse_tag_details(orjson.dumps(DETAILS), "node-1", T0)
    assert table.schema == TAG_METADATA_SCHEMA
    temp, bare = table.to_pylist()
    assert temp["tag"] == "/Plant A/Temp"
    assert (temp["type"], temp["number_type"], temp["eng_units"]) == ("number", "float64", "°C")
    assert (temp["deadband"], temp["client_access"], temp["format"]) == ("0.1u", "R", "%.1f")
    assert temp["history_enabled"] is True
    assert (temp["history_mode"], temp["history_deadband"]) == ("deadband", "0.5")
    assert temp["views"] == '["main"]'
    assert orjson.loads(temp["config"]) == DETAILS["tags"]["Temp"]["config"]  # type: ignore[index]
    assert int(temp["updated_at"].timestamp() * 1000) == T0
    assert bare["tag"] == "Bare"
    assert bare["config"] is None
    assert bare["history_enabled"] is None


# Any JSON, and details-shaped answers whose tag entries are any JSON.
DETAILS_ANSWERS = st.one_of(
    json_values,
    st.fixed_dictionaries({"tags": st.dictionaries(st.text(max_size=3), json_values, max_size=3)}),
)


def test_tag_details_accept_a_parsed_mapping() -> None:
    assert parse_tag_details(DETAILS, "n", T0).num_rows == 2


@settings(max_examples=200, deadline=None)
@given(DETAILS_ANSWERS)
def test_any_details_json_either_parses_or_raises_malformed_answer(answer: Any) -> None:
    try:
        body = orjson.dumps(answer)
    except orjson.JSONEncodeError:
        return
    try:
        table = parse_tag_details(body, "n", T0)
    except MalformedAnswer:
        return
    assert table.schema == TAG_METADATA_SCHEMA


def test_details_paths_name_the_tags_the_full_reading_names() -> None:
    assert tag_details_paths(orjson.dumps(DETAILS)) == ["/Plant A/Temp", "Bare"]


@settings(max_examples=200, deadline=None)
@given(DETAILS_ANSWERS)
def test_details_paths_agree_with_the_full_reading(answer: Any) -> None:
    try:
        body = orjson.dumps(answer)
    except orjson.JSONEncodeError:
        return
    try:
        expected: list[str] | type[MalformedAnswer] = (
            parse_tag_details(body, "n", T0).column("tag").to_pylist()
        )
    except MalformedAnswer:
        expected = MalformedAnswer
    if expected is MalformedAnswer:
        with pytest.raises(MalformedAnswer):
            tag_details_paths(body)
    else:
        assert tag_details_paths(body) == expected


def test_details_paths_of_a_truncated_answer_are_malformed() -> None:
    with pytest.raises(MalformedAnswer, match="not JSON"):
        tag_details_paths(orjson.dumps(DETAILS)[:40])


def test_paths_and_configured_types_are_read_in_one_pass() -> None:
    body = (
        b'{"tags": {"a": {"fullPath": "/g/a", "config": {"type": "number", "x": [1]}},'
        b' "b": {"config": {"type": "boolean"}}, "c": {"fullPath": "/g/c", "config": null},'
        b' "d": {"fullPath": "/g/d", "config": {"type": 5}}}}'
    )
    paths, types = tag_details_paths_and_types(body, group="/g/")
    assert paths == tag_details_paths(body, group="/g/") == ["/g/a", "/g/b", "/g/c", "/g/d"]
    assert types == {"/g/a": "number", "/g/b": "boolean"}
    odd = b'{"tags": {"a": {"fullPath": "/g/a", "config": "number"}}}'
    assert tag_details_paths_and_types(odd) == (["/g/a"], {})
