"""Answer bytes -> typed Arrow tables, fast, and never a silent drop.

History rows are `[ts_ms, value, quality, extra]` (node-facts.md); 2 to 4 elements are
accepted, the value may be null, a number, a boolean or a string, and a tag whose type
changes over time keeps every value in its own column (`value`, `value_bool`,
`value_str`). Anything of another shape raises `MalformedAnswer` naming the tag and the
chunk.

Speed: the answer is parsed with orjson while the cyclic garbage collector is paused
(millions of small lists would trigger it again and again), and each tag's rows are
columnised with `zip(*rows)` and one type census per column (`set(map(type, column))`),
so the common case never runs Python code per row. Rows of mixed shapes or types take a
careful per-row path.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import MalformedAnswer
from connectors.schema import (
    ALARM_HISTORY_SCHEMA,
    TAG_HISTORY_SCHEMA,
    TAG_METADATA_SCHEMA,
    frame_from_table,
)

_NONE = type(None)
_NUMBER_TYPES = frozenset({int, float, _NONE})
_INT16_MAX = 32767


@dataclass(frozen=True)
class TagStats:
    """What one answer held for one tag: enough for the engine to continue a capped answer."""

    rows: int
    first_ts_ms: int | None
    last_ts_ms: int | None
    at_last_ts: int


@dataclass(frozen=True)
class HistoryPage:
    """One history answer: rows of every tag (TAG_HISTORY_SCHEMA) and per-tag stats."""

    table: pa.Table
    tags: dict[str, TagStats]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector (not reference counting) around bulk parsing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _loads(body: bytes | str, operation: str, chunk_label: str) -> Any:
    try:
        with gc_paused():
            return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedAnswer(
            operation, f"answer is not JSON ({exc.msg})", where=chunk_label or None, body=body
        ) from None


class _Columns:
    """Per-tag column pieces, concatenated once at the end."""

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.counts: list[int] = []
        self.ts: list[pa.Array] = []
        self.seq: list[np.ndarray[Any, np.dtype[np.int16]]] = []
        self.value: list[pa.Array] = []
        self.value_bool: list[pa.Array] = []
        self.value_str: list[pa.Array] = []
        self.quality: list[pa.Array] = []
        self.extra: list[pa.Array] = []

    def table(self, node: str) -> pa.Table:
        total = sum(self.counts)
        if total == 0:
            return TAG_HISTORY_SCHEMA.empty_table()
        indices = np.repeat(np.arange(len(self.tags), dtype=np.int32), self.counts)
        tag = pa.DictionaryArray.from_arrays(
            pa.array(indices), pa.array(self.tags, type=pa.string())
        ).cast(pa.string())
        node_column = pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(total, dtype=np.int32)), pa.array([node], type=pa.string())
        ).cast(pa.string())
        ts = pa.concat_arrays(self.ts).cast(pa.timestamp("ms", tz="UTC"))
        return pa.Table.from_arrays(
            [
                node_column,
                tag,
                ts,
                pa.array(np.concatenate(self.seq), type=pa.int16()),
                pa.concat_arrays(self.value),
                pa.concat_arrays(self.value_bool),
                pa.concat_arrays(self.value_str),
                pa.concat_arrays(self.quality),
                pa.concat_arrays(self.extra),
            ],
            schema=TAG_HISTORY_SCHEMA,
        )


def _seq_of(ts: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, np.dtype[np.int16]]:
    """0, 1, ... for samples sharing a timestamp, in answer order."""
    n = len(ts)
    if n == 0:
        return np.zeros(0, dtype=np.int16)
    if n > 1 and bool(np.any(ts[1:] < ts[:-1])):
        order = np.argsort(ts, kind="stable")
        seq_sorted = _seq_of(ts[order])
        seq = np.empty(n, dtype=np.int16)
        seq[order] = seq_sorted
        return seq
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.not_equal(ts[1:], ts[:-1], out=starts[1:])
    run_start = np.flatnonzero(starts)
    run_index = np.cumsum(starts) - 1
    seq = np.arange(n) - run_start[run_index]
    if seq.max(initial=0) > _INT16_MAX:
        raise ValueError("more than 32767 samples on one millisecond")
    return seq.astype(np.int16)


def _bad(operation: str, message: str, tag: str, chunk_label: str) -> MalformedAnswer:
    where = f"tag {tag!r}" + (f" in {chunk_label}" if chunk_label else "")
    return MalformedAnswer(operation, message, where=where)


def _int_column(
    values: Sequence[Any], arrow_type: pa.DataType, what: str, nullable: bool
) -> pa.Array | None:
    """An integer column when every element is an int (or an integral float); else None."""
    kinds = set(map(type, values))
    if kinds <= {int} or (nullable and kinds <= {int, _NONE}):
        try:
            return pa.array(values, type=arrow_type)
        except (OverflowError, pa.ArrowInvalid):
            return None
    if kinds <= {int, float} or (nullable and kinds <= {int, float, _NONE}):
        floats = pa.array(values, type=pa.float64())
        if pc.all(pc.equal(pc.floor(floats), floats)).as_py() is False:
            return None
        try:
            return floats.cast(arrow_type)
        except (pa.ArrowInvalid, OverflowError):
            return None
    return None


def _add_tag(columns: _Columns, tag: str, data: Any, operation: str, chunk_label: str) -> TagStats:
    if data is None:
        data = []
    if not isinstance(data, list):
        raise _bad(operation, "data is not a list of rows", tag, chunk_label)
    n = len(data)
    if n == 0:
        columns.tags.append(tag)
        columns.counts.append(0)
        return TagStats(0, None, None, 0)
    if set(map(type, data)) != {list}:
        raise _bad(operation, "a history row is not an array", tag, chunk_label)
    lengths = set(map(len, data))
    if lengths == {4}:
        ts_raw, values, quality_raw, extra_raw = zip(*data, strict=True)
    elif lengths <= {2, 3, 4} and lengths:
        ts_raw, values, quality_raw, extra_raw = _pad_rows(data)
    else:
        bad_len = sorted(lengths - {2, 3, 4})[0]
        raise _bad(
            operation, f"a history row has {bad_len} elements (2 to 4 expected)", tag, chunk_label
        )

    ts = _int_column(ts_raw, pa.int64(), "timestamp", nullable=False)
    if ts is None:
        raise _bad(
            operation, "a history row's timestamp is not an integer (epoch ms)", tag, chunk_label
        )
    quality = _int_column(quality_raw, pa.int16(), "quality", nullable=True)
    if quality is None:
        raise _bad(operation, "a history row's quality is not a small integer", tag, chunk_label)
    extra = _int_column(extra_raw, pa.int64(), "extra", nullable=True)
    if extra is None:
        raise _bad(operation, "a history row's fourth element is not an integer", tag, chunk_label)

    value, value_bool, value_str = _value_columns(values, tag, operation, chunk_label)
    ts_np = ts.to_numpy(zero_copy_only=False)
    try:
        seq = _seq_of(ts_np)
    except ValueError as exc:
        raise _bad(operation, str(exc), tag, chunk_label) from None
    last = int(ts_np.max())
    columns.tags.append(tag)
    columns.counts.append(n)
    columns.ts.append(ts)
    columns.seq.append(seq)
    columns.value.append(value)
    columns.value_bool.append(value_bool)
    columns.value_str.append(value_str)
    columns.quality.append(quality)
    columns.extra.append(extra)
    return TagStats(n, int(ts_np.min()), last, int(np.count_nonzero(ts_np == last)))


def _pad_rows(data: list[list[Any]]) -> tuple[tuple[Any, ...], ...]:
    padded = [row + [None] * (4 - len(row)) for row in data]
    return tuple(zip(*padded, strict=True))  # type: ignore[return-value]


def _value_columns(
    values: Sequence[Any], tag: str, operation: str, chunk_label: str
) -> tuple[pa.Array, pa.Array, pa.Array]:
    n = len(values)
    kinds = set(map(type, values))
    if kinds <= _NUMBER_TYPES:
        try:
            return (
                pa.array(values, type=pa.float64()),
                pa.nulls(n, pa.bool_()),
                pa.nulls(n, pa.string()),
            )
        except OverflowError:
            pass
    elif kinds <= {bool, _NONE}:
        return (
            pa.nulls(n, pa.float64()),
            pa.array(values, type=pa.bool_()),
            pa.nulls(n, pa.string()),
        )
    elif kinds <= {str, _NONE}:
        return (
            pa.nulls(n, pa.float64()),
            pa.nulls(n, pa.bool_()),
            pa.array(values, type=pa.string()),
        )
    # The slow path: a tag whose type changed over time, or odd values.
    numbers: list[float | None] = [None] * n
    flags: list[bool | None] = [None] * n
    texts: list[str | None] = [None] * n
    for index, item in enumerate(values):
        kind = type(item)
        if kind is bool:
            flags[index] = item
        elif kind is int or kind is float:
            numbers[index] = float(item)
        elif kind is str:
            texts[index] = item
        elif item is not None:
            raise _bad(
                operation,
                f"a history value is a {'object' if kind is dict else 'array'}, not a number, "
                "boolean or string",
                tag,
                chunk_label,
            )
    return (
        pa.array(numbers, type=pa.float64()),
        pa.array(flags, type=pa.bool_()),
        pa.array(texts, type=pa.string()),
    )


def _history_entries(answer: Any, operation: str, chunk_label: str) -> Iterator[tuple[str, Any]]:
    if not isinstance(answer, dict):
        raise MalformedAnswer(
            operation,
            f"answer is a {type(answer).__name__}, not an object keyed by tag path",
            where=chunk_label or None,
        )
    for tag, entry in answer.items():
        if not isinstance(entry, dict):
            raise _bad(operation, "entry is not an object with request and data", tag, chunk_label)
        if "data" not in entry:
            raise _bad(operation, "entry has no data", tag, chunk_label)
        yield tag, entry["data"]


def parse_history_answer(
    body: bytes | str,
    node: str,
    *,
    operation: str = "tag.historyMany",
    chunk_label: str = "",
) -> HistoryPage:
    """A historyMany / historyFilter answer `{path: {request, data}}` as one typed table."""
    answer = _loads(body, operation, chunk_label)
    columns = _Columns()
    stats: dict[str, TagStats] = {}
    with gc_paused():
        for tag, data in _history_entries(answer, operation, chunk_label):
            stats[tag] = _add_tag(columns, tag, data, operation, chunk_label)
        table = columns.table(node)
    return HistoryPage(table, stats)


def parse_single_history_answer(
    body: bytes | str,
    node: str,
    path: str,
    *,
    operation: str = "tag.history",
    chunk_label: str = "",
) -> HistoryPage:
    """A `tag?cmd=history` answer `{request, data}` for one tag."""
    answer = _loads(body, operation, chunk_label)
    if not isinstance(answer, dict) or "data" not in answer:
        raise _bad(operation, "answer is not an object with request and data", path, chunk_label)
    columns = _Columns()
    with gc_paused():
        stats = {path: _add_tag(columns, path, answer["data"], operation, chunk_label)}
        table = columns.table(node)
    return HistoryPage(table, stats)


def assign_seq(table: pa.Table) -> pa.Table:
    """Sort by (tag, ts) keeping answer order among ties, and renumber `seq` within ties."""
    if table.num_rows == 0:
        return table
    order = pc.sort_indices(table, sort_keys=[("tag", "ascending"), ("ts", "ascending")])
    table = table.take(order)
    tags = table.column("tag").combine_chunks()
    ts = table.column("ts").combine_chunks().cast(pa.int64()).to_numpy(zero_copy_only=False)
    n = table.num_rows
    same_tag = np.zeros(n, dtype=bool)
    if n > 1:
        equal = pc.equal(tags.slice(1), tags.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        same_tag[1:] = equal & (ts[1:] == ts[:-1])
    starts = ~same_tag
    run_start = np.flatnonzero(starts)
    run_index = np.cumsum(starts) - 1
    seq = (np.arange(n) - run_start[run_index]).astype(np.int16)
    index = table.schema.get_field_index("seq")
    return table.set_column(index, table.schema.field("seq"), pa.array(seq, type=pa.int16()))


def history_frame(table: pa.Table) -> pd.DataFrame:
    """The tag-history table as a DataFrame with Arrow-backed dtypes."""
    return frame_from_table(table.cast(TAG_HISTORY_SCHEMA))


# -- alarm history ------------------------------------------------------------------------

_ALARM_KNOWN = ("path", "ts", "status", "priority", "value", "description", "ackInfo")
# Positional alarm rows (documented choice): [ts, path, status, priority, value, description,
# ackInfo, ...]; further elements are kept in `extra` as a JSON array.
_ALARM_POSITIONS = ("ts", "path", "status", "priority", "value", "description", "ackInfo")


def _json_text(value: Any) -> str | None:
    if value is None:
        return None
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _small_int(value: Any, what: str, where: str, operation: str) -> int | None:
    if value is None:
        return None
    if type(value) is int and -_INT16_MAX <= value <= _INT16_MAX:
        return value
    raise MalformedAnswer(operation, f"alarm {what} {value!r} is not a small integer", where=where)


def parse_alarm_history_answer(
    body: bytes | str,
    node: str,
    *,
    operation: str = "alarm.history",
    chunk_label: str = "",
) -> pa.Table:
    """An alarm history answer `{request, data: [...]}` as ALARM_HISTORY_SCHEMA rows."""
    answer = _loads(body, operation, chunk_label)
    where = chunk_label or "alarm history"
    if isinstance(answer, dict) and "data" in answer:
        data = answer["data"]
    elif isinstance(answer, list):
        data = answer
    else:
        raise MalformedAnswer(
            operation, "answer is not an object with request and data", where=where
        )
    if data is None:
        data = []
    if not isinstance(data, list):
        raise MalformedAnswer(operation, "data is not a list of alarm events", where=where)
    columns: dict[str, list[Any]] = {name: [] for name in ALARM_HISTORY_SCHEMA.names}
    for index, element in enumerate(data):
        if isinstance(element, list):
            record: dict[str, Any] = dict(zip(_ALARM_POSITIONS, element, strict=False))
            rest = element[len(_ALARM_POSITIONS) :]
            unknown: Any = {"_rest": rest} if rest else None
        elif isinstance(element, dict):
            record = element
            extras = {k: v for k, v in element.items() if k not in _ALARM_KNOWN}
            unknown = extras or None
        else:
            raise MalformedAnswer(
                operation, f"alarm event {index} is neither an object nor an array", where=where
            )
        path = record.get("path")
        ts = record.get("ts")
        if not isinstance(path, str):
            raise MalformedAnswer(operation, f"alarm event {index} has no path", where=where)
        if type(ts) is float and ts.is_integer():
            ts = int(ts)
        if type(ts) is not int:
            raise MalformedAnswer(
                operation, f"alarm event {index} has no integer ts", where=f"{path!r} in {where}"
            )
        ack = record.get("ackInfo")
        if ack is not None and not isinstance(ack, dict):
            ack = {"info": ack}
        ack_ts = ack.get("ts") if ack else None
        if ack_ts is not None and type(ack_ts) is not int:
            ack_ts = None
        description = record.get("description")
        columns["node"].append(node)
        columns["path"].append(path)
        columns["ts"].append(ts)
        columns["status"].append(_small_int(record.get("status"), "status", path, operation))
        columns["priority"].append(_small_int(record.get("priority"), "priority", path, operation))
        columns["value"].append(_json_text(record.get("value")))
        columns["description"].append(
            description
            if isinstance(description, str) or description is None
            else _json_text(description)
        )
        columns["ack_ts"].append(ack_ts)
        columns["ack_user"].append(_text_or_none(ack.get("user")) if ack else None)
        columns["ack_msg"].append(_text_or_none(ack.get("msg")) if ack else None)
        columns["ack_info"].append(_json_text(record.get("ackInfo")))
        columns["extra"].append(_json_text(unknown))
    arrays = []
    for field in ALARM_HISTORY_SCHEMA:
        values = columns[field.name]
        if pa.types.is_timestamp(field.type):
            arrays.append(pa.array(values, type=pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=ALARM_HISTORY_SCHEMA)


def _text_or_none(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return _json_text(value)


# -- tag details -> tag dimension ----------------------------------------------------------


def parse_tag_details(
    body_or_obj: bytes | str | Mapping[str, Any], node: str, updated_at_ms: int
) -> pa.Table:
    """A `tag?cmd=details` answer as TAG_METADATA_SCHEMA rows (one per tag, by fullPath)."""
    operation = "tag.details"
    answer = (
        _loads(body_or_obj, operation, "") if isinstance(body_or_obj, bytes | str) else body_or_obj
    )
    if not isinstance(answer, Mapping):
        raise MalformedAnswer(operation, "answer is not an object", where="tag details")
    tags = answer.get("tags") or {}
    if not isinstance(tags, Mapping):
        raise MalformedAnswer(operation, "tags is not an object", where="tag details")
    rows: dict[str, list[Any]] = {name: [] for name in TAG_METADATA_SCHEMA.names}
    for name, entry in tags.items():
        if not isinstance(entry, Mapping):
            raise MalformedAnswer(operation, "a tag entry is not an object", where=f"tag {name!r}")
        path = entry.get("fullPath") or name
        if not isinstance(path, str):
            raise MalformedAnswer(operation, "fullPath is not a string", where=f"tag {name!r}")
        config = entry.get("config") or {}
        if not isinstance(config, Mapping):
            config = {}
        history = (config.get("extensions") or {}).get("history") or {}
        history_config = history.get("config") or {} if isinstance(history, Mapping) else {}
        rows["node"].append(node)
        rows["tag"].append(path)
        rows["description"].append(_text_or_none(config.get("description")))
        rows["type"].append(_text_or_none(config.get("type")))
        rows["number_type"].append(_text_or_none(config.get("numberType")))
        rows["eng_units"].append(_text_or_none(config.get("engUnits")))
        rows["format"].append(_text_or_none(config.get("format")))
        rows["deadband"].append(_scalar_text(config.get("deadband")))
        rows["client_access"].append(_text_or_none(config.get("clientAccess")))
        enabled = history.get("enabled") if isinstance(history, Mapping) else None
        rows["history_enabled"].append(enabled if isinstance(enabled, bool) else None)
        rows["history_mode"].append(
            _scalar_text(history_config.get("mode"))
            if isinstance(history_config, Mapping)
            else None
        )
        rows["history_deadband"].append(
            _scalar_text(history_config.get("deadband"))
            if isinstance(history_config, Mapping)
            else None
        )
        rows["views"].append(_json_text(config.get("views")))
        rows["config"].append(_json_text(dict(config)) if config else None)
        rows["updated_at"].append(updated_at_ms)
    arrays = []
    for field in TAG_METADATA_SCHEMA:
        values = rows[field.name]
        if pa.types.is_timestamp(field.type):
            arrays.append(pa.array(values, type=pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, type=field.type))
    return pa.Table.from_arrays(arrays, schema=TAG_METADATA_SCHEMA)


def _scalar_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return orjson.dumps(value).decode()
    return _json_text(value)
