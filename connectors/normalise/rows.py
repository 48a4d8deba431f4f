"""One tag's history rows -> six typed Arrow columns (ts, value, value_bool, value_str,
quality, extra), exactly or not at all.

The fast path columnises the rows by one list comprehension per column and lets pyarrow
convert and type-check each column in C; only the value column needs a Python type census,
because pyarrow would read `true` as 1.0 after a float. Whatever that does not accept goes
row by row, handling short rows and mixed types, and naming the first offending
row (`RowError`) when the answer is wrong.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors.normalise import fastrows
from connectors.normalise.common import (
    INT16_MAX,
    INT16_MIN,
    INT64_MAX,
    INT64_MIN,
    json_type,
    short_text,
)
from connectors.normalise.stamps import StampError, stamps_of_values

_NONE = type(None)
# pyarrow's conversion errors; TypeError and ValueError cover its Python-side checks.
_CONVERSION_ERRORS = (pa.ArrowException, OverflowError, TypeError, ValueError)

Columns6 = tuple[pa.Array, pa.Array, pa.Array, pa.Array, pa.Array, pa.Array]


def _integral(array: pa.Array) -> bool:
    """True when every non-null double of `array` has an integral value."""
    return pc.all(pc.equal(pc.floor(array), array)).as_py() is not False


def _fast_int(values: list[Any], arrow_type: pa.DataType, nullable: bool) -> pa.Array | None:
    """An integer column converted and checked in C; None when it needs the careful path."""
    try:
        array = pa.array(values)
    except _CONVERSION_ERRORS:
        return None
    kind = array.type
    if kind == pa.null():
        return pa.nulls(len(values), arrow_type) if nullable else None
    if kind == pa.float64():
        # A float first makes pyarrow read `true` as 1.0: look for booleans explicitly.
        if bool in set(map(type, values)) or not _integral(array):
            return None
    elif kind != pa.int64():
        return None
    if not nullable and array.null_count:
        return None
    try:
        return array.cast(arrow_type)
    except _CONVERSION_ERRORS:
        return None


def _fast_values(values: list[Any]) -> tuple[pa.Array, pa.Array, pa.Array] | None:
    """Value columns of a tag whose values are all numbers, all booleans or all strings."""
    n = len(values)
    kinds = set(map(type, values))
    kinds.discard(_NONE)
    try:
        if kinds <= {int, float}:
            return pa.array(values, type=pa.float64()), _nulls_bool(n), _nulls_str(n)
        if kinds == {bool}:
            return _nulls_float(n), pa.array(values, type=pa.bool_()), _nulls_str(n)
        if kinds == {str}:
            return _nulls_float(n), _nulls_bool(n), pa.array(values, type=pa.string())
    except _CONVERSION_ERRORS:
        return None
    return None


def _nulls_float(n: int) -> pa.Array:
    return pa.nulls(n, pa.float64())


def _nulls_bool(n: int) -> pa.Array:
    return pa.nulls(n, pa.bool_())


def _nulls_str(n: int) -> pa.Array:
    return pa.nulls(n, pa.string())


def _fast_tag(data: list[Any]) -> Columns6 | None:
    """The common case: every row a 4-element list of well-typed values; else None."""
    try:
        if set(map(len, data)) != {4}:
            return None
        ts_raw = [row[0] for row in data]
        values = [row[1] for row in data]
        quality_raw = [row[2] for row in data]
        extra_raw = [row[3] for row in data]
    except (TypeError, KeyError):  # a row without len(), or an object row
        return None
    try:
        ts = stamps_of_values(ts_raw)
    except StampError:
        return None  # the careful path names the row
    if ts is None:
        return None
    split = _fast_values(values)
    if split is None:
        return None
    quality = _fast_int(quality_raw, pa.int16(), nullable=True)
    if quality is None:
        return None
    extra = _fast_int(extra_raw, pa.int64(), nullable=True)
    if extra is None:
        return None
    return ts, split[0], split[1], split[2], quality, extra


class RowError(Exception):
    """A wrong row found by the careful path: its index and what is wrong with it."""

    def __init__(self, index: int, message: str) -> None:
        self.index = index
        self.message = message
        super().__init__(message)


def _careful_int(item: Any, index: int, what: str, low: int, high: int, nullable: bool) -> Any:
    if item is None and nullable:
        return None
    kind = type(item)
    if kind is float and item.is_integer():
        item = int(item)
        kind = int
    if kind is not int:
        expected = "an integer or null" if nullable else "an integer (epoch ms)"
        raise RowError(index, f"{what} {short_text(item)} is not {expected}")
    if not low <= item <= high:
        raise RowError(index, f"{what} {item} is out of range {low}..{high}")
    return item


def _careful_stamps(raw: list[Any]) -> pa.Array:
    """One tag's stamps (`stamps.stamps_of_values`), or RowError naming the first row whose
    stamp is not of the kind of the first (epoch ms, epoch seconds, ISO 8601 text)."""
    try:
        ts = stamps_of_values(raw)
    except StampError as exc:
        raise RowError(0, str(exc)) from None
    if ts is not None:
        return ts
    first = _STAMP_KINDS.get(type(raw[0]))
    for index, item in enumerate(raw):
        kind = _STAMP_KINDS.get(type(item))
        if kind is None or kind != first:
            expected = "epoch ms, epoch seconds or ISO 8601 text"
            if first is not None and kind is not None:
                expected += f" of one kind (row 0 is {first})"
            raise RowError(index, f"timestamp {short_text(item)} is not {expected}")
        if type(item) is int and not INT64_MIN <= item <= INT64_MAX:
            raise RowError(index, f"timestamp {item} is out of range {INT64_MIN}..{INT64_MAX}")
    raise RowError(0, "timestamps are not epoch ms, epoch seconds or ISO 8601 text in range")


# What a stamp may be sent as: numbers (epoch ms or seconds) or ISO 8601 text.
_STAMP_KINDS = {int: "a number", float: "a number", str: "text"}


def _careful_tag(data: list[Any]) -> Columns6:
    """Row by row: rows of 2 to 4 elements, values of changing types, exact errors."""
    n = len(data)
    ts: list[Any] = [0] * n
    numbers: list[float | None] = [None] * n
    flags: list[bool | None] = [None] * n
    texts: list[str | None] = [None] * n
    quality: list[int | None] = [None] * n
    extra: list[int | None] = [None] * n
    for index, row in enumerate(data):
        if type(row) is not list:
            raise RowError(index, f"row is {json_type(row)}, not an array")
        if not 2 <= len(row) <= 4:
            raise RowError(index, f"row has {len(row)} elements (2 to 4 expected)")
        ts[index] = row[0]
        item = row[1]
        kind = type(item)
        if kind is bool:
            flags[index] = item
        elif kind is int or kind is float:
            numbers[index] = float(item)
        elif kind is str:
            texts[index] = item
        elif item is not None:
            raise RowError(index, f"value is {json_type(item)}, not a number, boolean or string")
        if len(row) > 2:
            quality[index] = _careful_int(row[2], index, "quality", INT16_MIN, INT16_MAX, True)
        if len(row) > 3:
            extra[index] = _careful_int(row[3], index, "extra", INT64_MIN, INT64_MAX, True)
    return (
        _careful_stamps(ts) if n else pa.array([], type=pa.int64()),
        pa.array(numbers, type=pa.float64()),
        pa.array(flags, type=pa.bool_()),
        pa.array(texts, type=pa.string()),
        pa.array(quality, type=pa.int16()),
        pa.array(extra, type=pa.int64()),
    )


def columns_of(data: list[Any]) -> Columns6:
    """A tag's rows as columns: the fast path, else the careful one (which raises RowError)."""
    columns = _fast_tag(data)
    return columns if columns is not None else _careful_tag(data)


def csv_columns(rows: fastrows.Columns, booleans: bool) -> Columns6:
    """The six columns of rows `fastrows` read: their values are numbers or booleans."""
    ts, value, quality, extra = rows
    n = len(ts)
    if booleans:
        return ts, _nulls_float(n), value, _nulls_str(n), quality, extra
    return ts, value, _nulls_bool(n), _nulls_str(n), quality, extra
