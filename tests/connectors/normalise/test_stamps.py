"""Row stamps in their unit, bucket stamping learned from answers, values by configured type."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import numpy as np
import pyarrow as pa
import pytest

from connectors.normalise.stamps import BucketStamping, StampError, ms_of_tags, stamps_of_values
from connectors.normalise.typed import by_configured_type

MS = 1_763_640_000_000
HOUR = 3_600_000
QUARTER = 900_000


@pytest.mark.parametrize(
    ("values", "want"),
    [
        pytest.param([MS, MS + 1], [MS, MS + 1], id="epoch ms"),
        pytest.param([MS // 1000], [MS // 1000], id="seconds left for the tag's reading"),
        pytest.param([MS / 1000 + 0.25], [MS + 250], id="seconds with a fraction"),
        pytest.param(["2025-11-20T12:00:00Z"], [MS], id="ISO 8601"),
    ],
)
def test_stamps_of_one_kind_are_read_at_once(values: list[object], want: list[int]) -> None:
    stamps = stamps_of_values(values)
    assert stamps is not None
    assert stamps.to_pylist() == want


@pytest.mark.parametrize(
    "values",
    [
        pytest.param([MS + 0.5], id="a fraction of a millisecond"),
        pytest.param(["2025-11-20"], id="a date without a time"),
        pytest.param(["soon"], id="text that is no time"),
    ],
)
def test_stamps_that_are_no_timestamp_are_refused(values: list[object]) -> None:
    with pytest.raises(StampError):
        stamps_of_values(values)


def test_each_tag_of_an_answer_is_read_in_its_own_unit() -> None:
    ts = np.array([MS, MS + 5, MS // 1000, MS // 1000 + 1, -1, MS], dtype=np.int64)
    starts, counts = np.array([0, 2, 4]), np.array([2, 2, 2])
    scaled = ms_of_tags(ts, starts, counts)
    assert scaled is not None
    assert scaled.tolist() == [MS, MS + 5, MS, MS + 1000, -1, MS]
    assert ms_of_tags(np.array([MS, MS + 1], dtype=np.int64), starts[:1], counts[:1]) is None


def stamps_at(*offsets: int) -> np.ndarray:
    return np.array([MS + offset for offset in offsets], dtype=np.int64)


@pytest.mark.parametrize(
    ("learned", "rows", "want", "raises"),
    [
        (None, stamps_at(0, QUARTER, 3 * QUARTER), None, nullcontext()),
        (None, stamps_at(QUARTER, 2 * QUARTER, HOUR), stamps_at(0, QUARTER, 3 * QUARTER), None),
        (True, stamps_at(QUARTER, 2 * QUARTER), stamps_at(0, QUARTER), None),
        (False, stamps_at(QUARTER, 2 * QUARTER), None, nullcontext()),
        (None, stamps_at(QUARTER, 2 * QUARTER), None, pytest.raises(StampError, match="not known")),
        (False, stamps_at(QUARTER, HOUR), None, pytest.raises(StampError, match="earlier")),
    ],
)
def test_bucket_stamping_is_learned_from_rows_on_the_query_start_or_last_end(
    learned: bool | None,
    rows: np.ndarray,
    want: np.ndarray | None,
    raises: AbstractContextManager[object] | None,
) -> None:
    stamping = BucketStamping(learned)
    with raises or nullcontext():
        starts = stamping.starts_of(rows, MS, MS + HOUR, QUARTER)
        if want is None:
            assert starts is None
        else:
            assert starts is not None
            assert starts.tolist() == want.tolist()
            assert stamping.at_end is True


def test_text_of_a_number_tag_goes_to_the_number_column_and_the_rest_is_counted() -> None:
    table = pa.table(
        {
            "tag": pa.array(["/n", "/n", "/n", "/b", "/b", "/s"]).dictionary_encode(),
            "value": pa.array([None, None, 2.0, None, None, None], pa.float64()),
            "value_bool": pa.array([None] * 6, pa.bool_()),
            "value_str": pa.array(["12.5", "n/a", None, "true", "yes", "7"]),
        }
    )
    typed, not_of_type = by_configured_type(table, {"/n": "number", "/b": "boolean"})
    assert typed.column("value").to_pylist() == [12.5, None, 2.0, None, None, None]
    assert typed.column("value_bool").to_pylist() == [None, None, None, True, None, None]
    assert typed.column("value_str").to_pylist() == [None, "n/a", None, None, "yes", "7"]
    assert not_of_type == 2
