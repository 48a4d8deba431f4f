"""Answer bytes -> typed Arrow tables, fast, and never a silent drop.

History rows are `[ts_ms, value, quality, extra]` (node-facts.md); 2 to 4 elements are
accepted, the value may be null, a number, a boolean or a string, and a tag whose type
changes over time keeps every value in its own column (`value` for numbers, never
booleans; `value_bool`; `value_str`). The timestamp must be an integer (an integral
float is accepted), quality and the fourth element integers or null. Anything of another
shape raises `MalformedAnswer` naming the tag, the row and the chunk; nothing is dropped.

Speed (bench/bench_normalise.py): a compact answer is walked once by msgspec, which keeps
each tag's rows as raw text; tags of number or boolean rows become CSV by one byte
translation and Arrow's CSV reader types them in C, outside the GIL (connectors/fastrows.py
says why that reading is exact); other tags are parsed by orjson. Whatever that reading
cannot vouch for, a wrong answer included, is read again the careful way: orjson parses
the whole answer while the cyclic garbage collector is paused (millions of fresh lists
would trigger it again and again), each tag's rows are columnised by one list
comprehension per column and pyarrow converts and type-checks each column in C; only the
value column needs a Python type census, because pyarrow would read `true` as 1.0 after a
float. Whatever that does not accept goes row by row, handling short rows and mixed
types, and naming the first offending row when the answer is wrong.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from connectors import fastrows
from connectors.errors import MalformedAnswer
from connectors.schema import (
    ALARM_HISTORY_SCHEMA,
    TAG_HISTORY_ENCODED_SCHEMA,
    TAG_HISTORY_SCHEMA,
    TAG_METADATA_SCHEMA,
    TS_TYPE,
    frame_from_table,
    sort_key,
)

_NONE = type(None)
_INT16_MIN, _INT16_MAX = -32768, 32767
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT32_MAX = 2**31 - 1
# pyarrow's conversion errors; TypeError and ValueError cover its Python-side checks.
_CONVERSION_ERRORS = (pa.ArrowException, OverflowError, TypeError, ValueError)

_Columns6 = tuple[pa.Array, pa.Array, pa.Array, pa.Array, pa.Array, pa.Array]


@dataclass(frozen=True)
class TagStats:
    """What one answer held for one tag: enough for the engine to continue a capped answer.

    `last_ts_ms` is the newest timestamp (whatever the row order), `at_last_ts` the rows on
    it; `null_data` is true when the entry's `data` was null rather than a list, which a
    node answers for a tag it left out (node-facts.md: not the same as no rows).
    """

    rows: int
    first_ts_ms: int | None
    last_ts_ms: int | None
    at_last_ts: int
    null_data: bool = False


@dataclass(frozen=True)
class HistoryPage:
    """One history answer: rows of every tag (TAG_HISTORY_SCHEMA, or its encoded form) and
    per-tag stats.

    `seq` numbers the rows of one (tag, ts) in answer order, within this answer only;
    `assign_seq` renumbers after pages are combined.
    """

    table: pa.Table
    tags: dict[str, TagStats]

    def answered(self) -> set[str]:
        """The tags this answer holds an entry with a list of rows for (empty or not)."""
        return {tag for tag, stats in self.tags.items() if not stats.null_data}


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


def _where(subject: str | None, chunk_label: str) -> str | None:
    if subject is None:
        return chunk_label or None
    return subject + (f" in {chunk_label}" if chunk_label else "")


def _loads(body: bytes | str, operation: str, chunk_label: str) -> Any:
    """orjson.loads that reports a non-JSON or truncated body as MalformedAnswer."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedAnswer(
            operation,
            f"answer is not JSON ({exc.msg})",
            where=_where(None, chunk_label),
            body=body,
        ) from None


# -- tag history ----------------------------------------------------------------------------


class _Careful(Exception):
    """The byte-level reading cannot vouch for this answer: read it the careful way."""


class _Pieces:
    """Per-tag column pieces, concatenated once at the end."""

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.counts: list[int] = []
        self.columns: list[_Columns6] = []
        self.seq: list[np.ndarray[Any, np.dtype[np.int16]]] = []

    def add(self, tag: str, columns: _Columns6 | None, seq: Any) -> None:
        self.tags.append(tag)
        if columns is None:
            self.counts.append(0)
            return
        self.counts.append(len(columns[0]))
        self.columns.append(columns)
        self.seq.append(seq)

    def add_all(self, tags: list[str], counts: list[int], columns: _Columns6) -> None:
        """Tags whose rows are `columns`, one tag's after the other (`counts` each); their
        `seq` is numbered by `table_and_stats`."""
        self.tags.extend(tags)
        self.counts.extend(counts)
        if len(columns[0]):
            self.columns.append(columns)

    def table(self, node: str, encoded: bool) -> pa.Table:
        """The table, with the `seq` pieces given to `add`."""
        if not self.columns:
            return _schema(encoded).empty_table()
        ts = pa.concat_arrays([piece[0] for piece in self.columns])
        return self._table(node, ts, np.concatenate(self.seq), encoded)

    def table_and_stats(self, node: str, encoded: bool) -> tuple[pa.Table, list[TagStats]]:
        """The table and each tag's stats, `seq` numbered here for all tags at once (the
        pieces were added without); _Careful when one millisecond has too many samples."""
        counts = np.array(self.counts, dtype=np.int64)
        if not self.columns:
            return _schema(encoded).empty_table(), [TagStats(0, None, None, 0)] * len(counts)
        ts = pa.concat_arrays([piece[0] for piece in self.columns])
        ts_np = ts.to_numpy(zero_copy_only=False)
        starts = np.cumsum(counts) - counts
        filled = counts > 0
        rising, never_back = _order_within(ts_np, starts[filled])
        if never_back:
            # The common answer: each tag's samples in time order, so the first is the
            # earliest, the last the latest, and the last one's seq + 1 counts the samples
            # on the last millisecond; with rising times no sample shares its millisecond.
            ends = starts[filled] + counts[filled] - 1
            if rising:
                seq = np.zeros(len(ts_np), dtype=np.int64)
            else:
                seq = _seq_of_tags(ts_np, starts[filled], counts[filled])
                if int(seq.max()) > _INT16_MAX:
                    raise _Careful  # the careful reading names the tag
            first = ts_np[starts[filled]].tolist()
            last = ts_np[ends]
            at_last = seq[ends] + 1
        else:
            seq = _seq_of_tags(ts_np, starts[filled], counts[filled])
            if int(seq.max()) > _INT16_MAX:
                raise _Careful  # the careful reading names the tag
            first = np.minimum.reduceat(ts_np, starts[filled]).tolist()
            last = np.maximum.reduceat(ts_np, starts[filled])
            at_last = np.add.reduceat(ts_np == np.repeat(last, counts[filled]), starts[filled])
        filled_stats = iter(
            [
                TagStats(rows, low, high, at)
                for rows, low, high, at in zip(
                    counts[filled].tolist(), first, last.tolist(), at_last.tolist(), strict=True
                )
            ]
        )
        stats = [next(filled_stats) if rows else TagStats(0, None, None, 0) for rows in counts]
        return self._table(node, ts, seq.astype(np.int16), encoded), stats

    def _table(self, node: str, ts: pa.Array, seq: np.ndarray[Any, Any], encoded: bool) -> pa.Table:
        """`encoded`: `node` and `tag` as dictionaries (TAG_HISTORY_ENCODED_SCHEMA), which the
        tags' spans give for free; else strings (TAG_HISTORY_SCHEMA)."""
        total = len(ts)
        indices = np.repeat(np.arange(len(self.tags), dtype=np.int32), self.counts)
        tag = pa.DictionaryArray.from_arrays(
            pa.array(indices), pa.array(self.tags, type=pa.string())
        )
        if encoded:
            node_column: pa.Array = pa.DictionaryArray.from_arrays(
                pa.array(np.zeros(total, dtype=np.int32)), pa.array([node], type=pa.string())
            )
        else:
            tag = tag.cast(pa.string())
            node_column = _repeated(node, total)
        value, value_bool, value_str, quality, extra = (
            _concat([piece[i] for piece in self.columns], total) for i in range(1, 6)
        )
        return pa.Table.from_arrays(
            [
                node_column,
                tag,
                ts.cast(TS_TYPE),
                pa.array(seq, type=pa.int16()),
                value,
                value_bool,
                value_str,
                quality,
                extra,
            ],
            schema=_schema(encoded),
        )


def _concat(pieces: list[pa.Array], total: int) -> pa.Array:
    """The pieces one after the other; a column of nulls only (a value column that no tag
    of the answer uses) is made at once instead of from a piece per tag."""
    if sum(piece.null_count for piece in pieces) == total:
        return pa.nulls(total, pieces[0].type)
    return pa.concat_arrays(pieces)


def _schema(encoded: bool) -> pa.Schema:
    return TAG_HISTORY_ENCODED_SCHEMA if encoded else TAG_HISTORY_SCHEMA


def _repeated(text: str, n: int) -> pa.Array:
    """`text` n times as a string array, built from its buffers (a dictionary cast costs
    about 30 ns a row)."""
    encoded = text.encode()
    if n * len(encoded) > _INT32_MAX:  # beyond 32-bit offsets: let Arrow say so
        return pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(n, dtype=np.int32)), pa.array([text], type=pa.string())
        ).cast(pa.string())
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(encoded))
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(encoded * n))


def _seq_of(ts: np.ndarray[Any, np.dtype[np.int64]]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """0, 1, ... for samples sharing a timestamp, in answer order (any row order)."""
    n = len(ts)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if n > 1 and bool(np.any(ts[1:] < ts[:-1])):
        order = np.argsort(ts, kind="stable")
        unsorted = np.empty(n, dtype=np.int64)
        unsorted[order] = _seq_of(ts[order])
        return unsorted
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    np.not_equal(ts[1:], ts[:-1], out=starts[1:])
    run_start = np.flatnonzero(starts)
    run_index = np.cumsum(starts) - 1
    seq: np.ndarray[Any, np.dtype[np.int64]] = np.arange(n) - run_start[run_index]
    return seq


def _order_within(
    ts: np.ndarray[Any, np.dtype[np.int64]], starts: np.ndarray[Any, np.dtype[np.int64]]
) -> tuple[bool, bool]:
    """Whether the timestamps of each tag's rows (from each of `starts` to the next, none
    empty) rise strictly, and whether they never go back."""
    if len(ts) < 2:
        return True, True
    boundaries = starts[1:] - 1  # a tag's first row may be earlier than the previous tag's last
    rising = ts[1:] > ts[:-1]
    rising[boundaries] = True
    if rising.all():
        return True, True
    never_back = ts[1:] >= ts[:-1]
    never_back[boundaries] = True
    return False, bool(never_back.all())


def _seq_of_tags(
    ts: np.ndarray[Any, np.dtype[np.int64]],
    starts: np.ndarray[Any, np.dtype[np.int64]],
    counts: np.ndarray[Any, np.dtype[np.int64]],
) -> np.ndarray[Any, np.dtype[np.int64]]:
    """`_seq_of` of each tag's rows `ts[start:start + count]` (none empty), in one go where
    the rows of a tag are in time order, tag by tag where they are not."""
    n = len(ts)
    tag_starts = np.zeros(n, dtype=bool)
    tag_starts[starts] = True
    starts_run = tag_starts.copy()
    np.not_equal(ts[1:], ts[:-1], out=starts_run[1:])
    starts_run |= tag_starts
    run_start = np.flatnonzero(starts_run)
    seq: np.ndarray[Any, np.dtype[np.int64]] = np.arange(n) - run_start[np.cumsum(starts_run) - 1]
    backwards = np.flatnonzero((ts[1:] < ts[:-1]) & ~tag_starts[1:]) + 1
    if len(backwards):
        for tag in np.unique(np.searchsorted(starts, backwards, side="right") - 1).tolist():
            begin, end = int(starts[tag]), int(starts[tag] + counts[tag])
            seq[begin:end] = _seq_of(ts[begin:end])
    return seq


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


def _fast_tag(data: list[Any]) -> _Columns6 | None:
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
    ts = _fast_int(ts_raw, pa.int64(), nullable=False)
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


class _RowError(Exception):
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
        raise _RowError(index, f"{what} {_short(item)} is not {expected}")
    if not low <= item <= high:
        raise _RowError(index, f"{what} {item} is out of range {low}..{high}")
    return item


def _careful_tag(data: list[Any]) -> _Columns6:
    """Row by row: rows of 2 to 4 elements, values of changing types, exact errors."""
    n = len(data)
    ts: list[int] = [0] * n
    numbers: list[float | None] = [None] * n
    flags: list[bool | None] = [None] * n
    texts: list[str | None] = [None] * n
    quality: list[int | None] = [None] * n
    extra: list[int | None] = [None] * n
    for index, row in enumerate(data):
        if type(row) is not list:
            raise _RowError(index, f"row is {_json_type(row)}, not an array")
        if not 2 <= len(row) <= 4:
            raise _RowError(index, f"row has {len(row)} elements (2 to 4 expected)")
        ts[index] = _careful_int(row[0], index, "timestamp", _INT64_MIN, _INT64_MAX, False)
        item = row[1]
        kind = type(item)
        if kind is bool:
            flags[index] = item
        elif kind is int or kind is float:
            numbers[index] = float(item)
        elif kind is str:
            texts[index] = item
        elif item is not None:
            raise _RowError(index, f"value is {_json_type(item)}, not a number, boolean or string")
        if len(row) > 2:
            quality[index] = _careful_int(row[2], index, "quality", _INT16_MIN, _INT16_MAX, True)
        if len(row) > 3:
            extra[index] = _careful_int(row[3], index, "extra", _INT64_MIN, _INT64_MAX, True)
    return (
        pa.array(ts, type=pa.int64()),
        pa.array(numbers, type=pa.float64()),
        pa.array(flags, type=pa.bool_()),
        pa.array(texts, type=pa.string()),
        pa.array(quality, type=pa.int16()),
        pa.array(extra, type=pa.int64()),
    )


def _json_type(item: Any) -> str:
    """The JSON type of a parsed item with its article, for messages: "an array"."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    return names.get(type(item), "null" if item is None else "a number")


def _short(item: Any) -> str:
    """A value for an error message; never raises (integers beyond 64 bits included)."""
    try:
        text = orjson.dumps(item).decode() if item is not None else "null"
    except TypeError:
        text = repr(item)
    return text if len(text) <= 40 else text[:37] + "..."


def _columns_of(data: list[Any]) -> _Columns6:
    """A tag's rows as columns: the fast path, else the careful one (which raises _RowError)."""
    columns = _fast_tag(data)
    return columns if columns is not None else _careful_tag(data)


def _finish_tag(
    pieces: _Pieces, tag: str, columns: _Columns6, operation: str, chunk_label: str
) -> TagStats:
    """Number the samples of one tag sharing a millisecond, add them to `pieces`; its stats."""
    ts_np = columns[0].to_numpy(zero_copy_only=False)
    seq = _seq_of(ts_np)
    if len(seq) and int(seq.max()) > _INT16_MAX:
        raise MalformedAnswer(
            operation,
            f"more than {_INT16_MAX + 1} samples on one millisecond",
            where=_where(f"tag {tag!r}", chunk_label),
        )
    pieces.add(tag, columns, seq.astype(np.int16))
    last = int(ts_np.max())
    return TagStats(len(ts_np), int(ts_np.min()), last, int(np.count_nonzero(ts_np == last)))


def _add_tag(pieces: _Pieces, tag: str, data: Any, operation: str, chunk_label: str) -> TagStats:
    """Columnise one tag's rows into `pieces`; its stats for continuation."""
    if data is None or (type(data) is list and not data):
        pieces.add(tag, None, None)
        return TagStats(0, None, None, 0, null_data=data is None)
    if type(data) is not list:
        raise MalformedAnswer(
            operation,
            f"data is {_json_type(data)}, not a list of rows",
            where=_where(f"tag {tag!r}", chunk_label),
        )
    try:
        columns = _columns_of(data)
    except _RowError as exc:
        raise MalformedAnswer(
            operation,
            f"row {exc.index}: {exc.message}",
            where=_where(f"tag {tag!r}", chunk_label),
        ) from None
    return _finish_tag(pieces, tag, columns, operation, chunk_label)


def _member_columns(member: msgspec.Raw) -> _Columns6 | None:
    """A tag's `data` text read by orjson and columnised like the careful reading does."""
    try:
        data = fastrows.load_member(member)
    except orjson.JSONDecodeError:
        raise _Careful from None
    if data is None or (type(data) is list and not data):
        return None
    if type(data) is not list:
        raise _Careful
    try:
        return _columns_of(data)
    except _RowError:
        raise _Careful from None


def _history_entries(answer: Any, operation: str, chunk_label: str) -> Iterator[tuple[str, Any]]:
    if not isinstance(answer, dict):
        raise MalformedAnswer(
            operation,
            f"answer is {_json_type(answer)}, not an object keyed by tag path",
            where=_where(None, chunk_label),
        )
    for tag, entry in answer.items():
        if not isinstance(entry, dict):
            raise MalformedAnswer(
                operation,
                f"entry is {_json_type(entry)}, not an object with request and data",
                where=_where(f"tag {tag!r}", chunk_label),
            )
        if "data" not in entry:
            raise MalformedAnswer(
                operation, "entry has no data", where=_where(f"tag {tag!r}", chunk_label)
            )
        yield tag, entry["data"]


def parse_history_answer(
    body: bytes | str,
    node: str,
    *,
    operation: str = "tag.historyMany",
    chunk_label: str = "",
    encoded: bool = False,
) -> HistoryPage:
    """A historyMany / historyFilter answer `{path: {request, data}}` as one typed table.

    Rows keep the answer's order (tags in answer order, rows as sent); every tag key of the
    answer is in `tags`, also those with no rows. An answer the byte-level reading cannot
    vouch for, a wrong one included, is read again by `parse_history_answer_careful`: the
    result (and the error) is always that reading's. `encoded`: the table is of
    TAG_HISTORY_ENCODED_SCHEMA (`node` and `tag` dictionaries, whose dictionary may hold
    tags without rows), else of TAG_HISTORY_SCHEMA.
    """
    with gc_paused():
        page = None
        if type(body) is bytes:
            page = history_page_from_bytes(body, node, encoded=encoded)
        if page is None:
            page = parse_history_answer_careful(
                body, node, operation=operation, chunk_label=chunk_label, encoded=encoded
            )
    return page


def parse_history_answer_careful(
    body: bytes | str,
    node: str,
    *,
    operation: str = "tag.historyMany",
    chunk_label: str = "",
    encoded: bool = False,
) -> HistoryPage:
    """The reference reading: orjson parses the whole answer, each tag is columnised from
    its Python lists, and the first thing wrong raises MalformedAnswer naming it."""
    pieces = _Pieces()
    stats: dict[str, TagStats] = {}
    with gc_paused():
        answer = _loads(body, operation, chunk_label)
        for tag, data in _history_entries(answer, operation, chunk_label):
            stats[tag] = _add_tag(pieces, tag, data, operation, chunk_label)
        del answer
        table = pieces.table(node, encoded)
    return HistoryPage(table, stats)


def history_page_from_bytes(body: bytes, node: str, *, encoded: bool = False) -> HistoryPage | None:
    """The page `parse_history_answer_careful` gives, with tags of number (or boolean) rows
    read from the bytes by `fastrows` and the others by orjson; None whenever this reading
    cannot vouch for that: an answer that is not compact, repeats a key or is wrong."""
    with gc_paused():
        try:
            return _history_from_bytes(body, node, encoded)
        except _Careful:
            return None


def _history_from_bytes(body: bytes, node: str, encoded: bool) -> HistoryPage:
    """See `history_page_from_bytes`; raises _Careful where that returns None."""
    answer = fastrows.split_answer(body)
    if answer is None:
        raise _Careful
    datas: list[msgspec.Raw] = []
    for entry in answer.values():
        data = entry.get("data")
        if data is None:
            raise _Careful
        for key, member in entry.items():
            if key != "data" and not fastrows.member_is_json(member):
                raise _Careful
        datas.append(data)
    csv, plans = fastrows.data_as_csv(datas)
    try:
        whole = fastrows.read_whole(csv, plans)
        read = fastrows.read_plans(csv, plans) if whole is None else []
    except fastrows.Refused:
        raise _Careful from None
    pieces = _Pieces()
    if whole is not None:  # every tag planned, all of one kind
        run = cast(list[fastrows.CsvPlan], plans)
        pieces.add_all(list(answer), [p.rows for p in run], _csv_columns(whole, run[0].booleans))
    else:
        for tag, data, plan, rows in zip(answer, datas, plans, read, strict=True):
            if plan is None or rows is None:
                pieces.add(tag, _member_columns(data), None)
            else:
                pieces.add(tag, _csv_columns(rows, plan.booleans), None)
    table, stats = pieces.table_and_stats(node, encoded)
    by_tag = dict(zip(answer, stats, strict=True))
    for tag, data in zip(answer, datas, strict=True):
        if len(data) == 4 and bytes(data) == b"null":
            by_tag[tag] = TagStats(0, None, None, 0, null_data=True)
    return HistoryPage(table, by_tag)


def _csv_columns(rows: fastrows.Columns, booleans: bool) -> _Columns6:
    """The six columns of rows `fastrows` read: their values are numbers or booleans."""
    ts, value, quality, extra = rows
    n = len(ts)
    if booleans:
        return ts, _nulls_float(n), value, _nulls_str(n), quality, extra
    return ts, value, _nulls_bool(n), _nulls_str(n), quality, extra


def parse_single_history_answer(
    body: bytes | str,
    node: str,
    path: str,
    *,
    operation: str = "tag.history",
    chunk_label: str = "",
) -> HistoryPage:
    """A `tag?cmd=history` answer `{request, data}` for the one tag `path`."""
    pieces = _Pieces()
    with gc_paused():
        answer = _loads(body, operation, chunk_label)
        if not isinstance(answer, dict) or "data" not in answer:
            raise MalformedAnswer(
                operation,
                "answer is not an object with request and data",
                where=_where(f"tag {path!r}", chunk_label),
            )
        stats = {path: _add_tag(pieces, path, answer["data"], operation, chunk_label)}
        del answer
        table = pieces.table(node, False)
    return HistoryPage(table, stats)


def assign_seq(table: pa.Table) -> pa.Table:
    """Sort by (tag, ts), keeping the input order among ties, and renumber `seq` within ties.

    Used after pages of one chunk are combined: `seq` of a page counts only that page.
    """
    if table.num_rows == 0:
        return table
    # A dictionary-encoded tag sorts and compares by the rank of its name (`sort_key`).
    keys = pa.table({"tag": sort_key(table.column("tag")), "ts": table.column("ts")})
    # sort_indices is a stable sort: rows of one (tag, ts) keep their input order.
    order = pc.sort_indices(keys, sort_keys=[("tag", "ascending"), ("ts", "ascending")])
    table = table.take(order)
    tags = keys.column("tag").take(order).combine_chunks()
    ts = table.column("ts").combine_chunks().cast(pa.int64()).to_numpy(zero_copy_only=False)
    n = table.num_rows
    continues = np.zeros(n, dtype=bool)
    if n > 1:
        same_tag = pc.equal(tags.slice(1), tags.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        continues[1:] = same_tag & (ts[1:] == ts[:-1])
    starts = ~continues
    run_start = np.flatnonzero(starts)
    run_index = np.cumsum(starts) - 1
    seq = np.arange(n) - run_start[run_index]
    if int(seq.max()) > _INT16_MAX:
        raise ValueError(f"more than {_INT16_MAX + 1} samples of one tag on one millisecond")
    index = table.schema.get_field_index("seq")
    return table.set_column(
        index, table.schema.field("seq"), pa.array(seq.astype(np.int16), type=pa.int16())
    )


def history_table(table: pa.Table) -> pa.Table:
    """The tag-history table in the kind's schema, `node` and `tag` dictionary-encoded
    when the table's tag is."""
    return table.cast(_schema(pa.types.is_dictionary(table.schema.field("tag").type)))


def history_frame(table: pa.Table) -> pd.DataFrame:
    """`history_table` as a DataFrame with Arrow-backed dtypes."""
    return frame_from_table(history_table(table))


# -- alarm history --------------------------------------------------------------------------

_ALARM_KNOWN = frozenset({"path", "ts", "status", "priority", "value", "description", "ackInfo"})
# Positional alarm events (the spec does not show `data` elements; node-facts.md says accept
# arrays): [ts, path, status, priority, value, description, ackInfo, ...]. Elements after
# the seventh are kept in `extra` as {"_rest": [...]}.
ALARM_POSITIONS = ("ts", "path", "status", "priority", "value", "description", "ackInfo")


def _json_text(value: Any) -> str | None:
    """JSON text with sorted keys (stable across runs), or None for null."""
    if value is None:
        return None
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _text(value: Any) -> str | None:
    """Strings as they are, other values as JSON text."""
    if value is None or isinstance(value, str):
        return value
    return _json_text(value)


def _alarm_int(value: Any, what: str, low: int, high: int) -> int | None:
    if value is None:
        return None
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{what} {_short(value)} is not an integer in {low}..{high}")
    return int(value)


def _alarm_record(element: Any, index: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The known fields of one alarm event and its unknown ones (None when there are none)."""
    if isinstance(element, dict):
        unknown = {key: value for key, value in element.items() if key not in _ALARM_KNOWN}
        return element, unknown or None
    if isinstance(element, list):
        record = dict(zip(ALARM_POSITIONS, element, strict=False))
        rest = element[len(ALARM_POSITIONS) :]
        return record, ({"_rest": rest} if rest else None)
    raise ValueError(f"alarm event {index} is {_json_type(element)}, not an object or array")


def _alarm_row(node: str, element: Any, index: int) -> list[Any]:
    """One ALARM_HISTORY_SCHEMA row; ValueError says what is wrong."""
    record, unknown = _alarm_record(element, index)
    path = record.get("path")
    if not isinstance(path, str):
        raise ValueError(f"alarm event {index} has no string path")
    try:
        ts = _alarm_int(record.get("ts"), "ts", _INT64_MIN, _INT64_MAX)
        if ts is None:
            raise ValueError("ts is missing")
        status = _alarm_int(record.get("status"), "status", _INT16_MIN, _INT16_MAX)
        priority = _alarm_int(record.get("priority"), "priority", _INT16_MIN, _INT16_MAX)
    except ValueError as exc:
        raise ValueError(f"alarm event {index} ({path!r}): {exc}") from None
    ack = record.get("ackInfo")
    ack_ts = ack_user = ack_msg = None
    if isinstance(ack, dict):
        try:
            ack_ts = _alarm_int(ack.get("ts"), "ack ts", _INT64_MIN, _INT64_MAX)
        except ValueError:
            ack_ts = None  # kept verbatim in ack_info
        ack_user = _text(ack.get("user"))
        ack_msg = _text(ack.get("msg"))
    return [
        node,
        path,
        ts,
        status,
        priority,
        _json_text(record.get("value")),
        _text(record.get("description")),
        ack_ts,
        ack_user,
        ack_msg,
        _json_text(ack),
        _json_text(unknown),
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
    operation: str = "alarm.history",
    chunk_label: str = "",
) -> pa.Table:
    """An `alarm?cmd=history` answer `{request, data: [...]}` as ALARM_HISTORY_SCHEMA rows.

    Events are objects shaped like the alarm record or positional arrays (ALARM_POSITIONS);
    `value` and `ack_info` are JSON text, unknown fields go to `extra` (JSON, sorted keys).
    """
    with gc_paused():
        answer = _loads(body, operation, chunk_label)
    if isinstance(answer, dict) and "data" in answer:
        data = answer["data"]
    elif isinstance(answer, list):
        data = answer
    else:
        raise MalformedAnswer(
            operation,
            f"answer is {_json_type(answer)} without data, not an object with request and data",
            where=_where("alarm history", chunk_label),
        )
    if data is None:
        data = []
    if not isinstance(data, list):
        raise MalformedAnswer(
            operation,
            f"data is {_json_type(data)}, not a list of alarm events",
            where=_where("alarm history", chunk_label),
        )
    try:
        rows = [_alarm_row(node, element, index) for index, element in enumerate(data)]
    except ValueError as exc:
        raise MalformedAnswer(
            operation, str(exc), where=_where("alarm history", chunk_label)
        ) from None
    return _table_of_rows(rows, ALARM_HISTORY_SCHEMA)


# -- tag details -> tag dimension -----------------------------------------------------------


def _dig(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]... or None when any level is missing or not an object."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _bool_or_none(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _entry_path(name: str, full_path: Any, group: str | None) -> Any:
    """A details entry's tag path: its `fullPath`; without one, the key when it is a path,
    else the key as a name in `group` (a group's own details: names are unique there)."""
    if full_path:
        return full_path
    if group is not None and not name.startswith("/"):
        return group + name
    return name


def parse_tag_details(
    body_or_obj: bytes | str | Mapping[str, Any],
    node: str,
    updated_at_ms: int,
    *,
    group: str | None = None,
) -> pa.Table:
    """A `tag?cmd=details` answer as TAG_METADATA_SCHEMA rows, one per tag (by fullPath).

    `tags` is keyed by tag name (or path, on some nodes); the row's tag is `fullPath`
    (without one: see `_entry_path`; `group` names the group a non-recursive answer is of).
    `config` keeps the whole tag configuration as JSON text (sorted keys). Built column by
    column with the collector paused: a run that names 10,000 tags reads 10,000 entries.
    """
    operation = "tag.details"
    with gc_paused():
        if isinstance(body_or_obj, bytes | str):
            answer: Any = _loads(body_or_obj, operation, "")
        else:
            answer = body_or_obj
        if not isinstance(answer, Mapping):
            raise MalformedAnswer(operation, "answer is not an object", where="tag details")
        tags = answer.get("tags")
        if tags is None:
            tags = {}
        if not isinstance(tags, Mapping):
            raise MalformedAnswer(operation, "tags is not an object", where="tag details")
        return _details_table(tags, node, updated_at_ms, group)


def _details_table(
    tags: Mapping[str, Any], node: str, updated_at_ms: int, group: str | None = None
) -> pa.Table:
    """TAG_METADATA_SCHEMA columns of the `tags` object of a details answer."""
    operation = "tag.details"
    columns: list[list[Any]] = [[] for _ in range(len(TAG_METADATA_SCHEMA) - 2)]
    (path_c, descr_c, type_c, number_c, units_c, format_c, deadband_c, access_c) = columns[:8]
    (enabled_c, mode_c, hist_deadband_c, views_c, config_c) = columns[8:]
    for name, entry in tags.items():
        if not isinstance(entry, Mapping):
            raise MalformedAnswer(operation, "a tag entry is not an object", where=f"tag {name!r}")
        path = _entry_path(name, entry.get("fullPath"), group)
        if not isinstance(path, str):
            raise MalformedAnswer(operation, "fullPath is not a string", where=f"tag {name!r}")
        path_c.append(path)
        config = entry.get("config")
        if not isinstance(config, Mapping):
            for column in columns[1:12]:
                column.append(None)
            config_c.append(_json_text(config) if config else None)
            continue
        descr_c.append(_text(config.get("description")))
        type_c.append(_text(config.get("type")))
        number_c.append(_text(config.get("numberType")))
        units_c.append(_text(config.get("engUnits")))
        format_c.append(_text(config.get("format")))
        deadband_c.append(_text(config.get("deadband")))
        access_c.append(_text(config.get("clientAccess")))
        history = _dig(config, "extensions", "history")
        enabled_c.append(_bool_or_none(_dig(history, "enabled")))
        mode_c.append(_text(_dig(history, "config", "mode")))
        hist_deadband_c.append(_text(_dig(history, "config", "deadband")))
        views_c.append(_json_text(config.get("views")))
        config_c.append(_json_text(config) if config else None)
    n = len(path_c)
    arrays = [pa.array([node] * n, type=pa.string())]
    fields = list(TAG_METADATA_SCHEMA)[1:-1]
    arrays.extend(
        pa.array(values, type=field.type) for field, values in zip(fields, columns, strict=True)
    )
    arrays.append(pa.array(np.full(n, updated_at_ms, dtype=np.int64)).cast(TS_TYPE))
    return pa.Table.from_arrays(arrays, schema=TAG_METADATA_SCHEMA)


class _DetailsEntry(msgspec.Struct, rename={"full_path": "fullPath"}):
    full_path: Any = None


class _DetailsAnswer(msgspec.Struct):
    tags: dict[str, _DetailsEntry] | None = None


_DETAILS_DECODER = msgspec.json.Decoder(_DetailsAnswer)


def tag_details_paths(body: bytes | str, *, group: str | None = None) -> list[str]:
    """The tag paths of a `tag?cmd=details` answer, as `parse_tag_details` names them.

    Reads the paths only (configurations are skipped, not built): resolving a run's
    10,000 tags needs their names, not their metadata, unless metadata is written.
    """
    operation = "tag.details"
    try:
        answer = _DETAILS_DECODER.decode(body)
    except msgspec.ValidationError:
        parse_tag_details(body, "", 0)  # says what is wrong, the way the full reading does
        raise MalformedAnswer(operation, "unexpected shape", where="tag details") from None
    except msgspec.DecodeError as exc:
        _loads(body, operation, "")  # not JSON: reported as such
        raise MalformedAnswer(operation, f"answer is not JSON ({exc})", body=body) from None
    paths: list[str] = []
    for name, entry in (answer.tags or {}).items():
        path = _entry_path(name, entry.full_path, group)
        if not isinstance(path, str):
            raise MalformedAnswer(operation, "fullPath is not a string", where=f"tag {name!r}")
        paths.append(path)
    return paths
