"""History answers -> typed Arrow tables, fast, and never a silent drop.

History rows are `[ts_ms, value, quality, extra]` (node-facts.md); 2 to 4 elements are
accepted, the value may be null, a number, a boolean or a string, and a tag whose type
changes over time keeps every value in its own column (`value` for numbers, never
booleans; `value_bool`; `value_str`). The timestamp is epoch ms, or epoch seconds or
ISO 8601 text, each tag's stamps read in their unit together (stamps.py); quality and the
fourth element are integers or null. Anything of another shape raises `MalformedAnswer`
naming the tag, the row and the chunk; nothing is dropped.

Speed (bench/bench_normalise.py): a compact answer is walked once by msgspec, which keeps
each tag's rows as raw text; tags of number or boolean rows become CSV by one byte
translation and Arrow's CSV reader types them in C, outside the GIL (fastrows.py says
why that reading is exact); other tags are parsed by orjson. Whatever that reading
cannot vouch for, a wrong answer included, is read again the careful way: orjson parses
the whole answer while the cyclic garbage collector is paused (millions of fresh lists
would trigger it again and again), each tag's rows are columnised by one list
comprehension per column and pyarrow converts and type-checks each column in C; only the
value column needs a Python type census, because pyarrow would read `true` as 1.0 after a
float. Whatever that does not accept goes row by row, handling short rows and mixed
types, and naming the first offending row when the answer is wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import MalformedAnswer
from connectors.normalise import fastrows, stamps
from connectors.normalise.common import (
    INT16_MAX,
    gc_paused,
    json_type,
    load_json,
    where_of,
)
from connectors.normalise.rows import Columns6, RowError, columns_of, csv_columns
from connectors.schema import (
    TAG_HISTORY_ENCODED_SCHEMA,
    TAG_HISTORY_SCHEMA,
    TS_TYPE,
    frame_from_table,
    sort_key,
)

_INT32_MAX = 2**31 - 1


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


class _Careful(Exception):
    """The byte-level reading cannot vouch for this answer: read it the careful way."""


class _Pieces:
    """Per-tag column pieces, concatenated once at the end."""

    def __init__(self) -> None:
        self.tags: list[str] = []
        self.counts: list[int] = []
        self.columns: list[Columns6] = []
        self.seq: list[np.ndarray[Any, np.dtype[np.int16]]] = []

    def add(self, tag: str, columns: Columns6 | None, seq: Any) -> None:
        self.tags.append(tag)
        if columns is None:
            self.counts.append(0)
            return
        self.counts.append(len(columns[0]))
        self.columns.append(columns)
        self.seq.append(seq)

    def add_all(self, tags: list[str], counts: list[int], columns: Columns6) -> None:
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
        in_ms = stamps.ms_of_tags(ts_np, starts[filled], counts[filled])
        if in_ms is not None:  # some tags stamped in epoch seconds
            ts_np = in_ms
            ts = pa.array(in_ms, type=pa.int64())
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
                if int(seq.max()) > INT16_MAX:
                    raise _Careful  # the careful reading names the tag
            first = ts_np[starts[filled]].tolist()
            last = ts_np[ends]
            at_last = seq[ends] + 1
        else:
            seq = _seq_of_tags(ts_np, starts[filled], counts[filled])
            if int(seq.max()) > INT16_MAX:
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


def _finish_tag(
    pieces: _Pieces, tag: str, columns: Columns6, operation: str, chunk_label: str
) -> TagStats:
    """Number the samples of one tag sharing a millisecond, add them to `pieces`; its stats.
    Stamps in epoch seconds are read as such (`stamps.ms_of_integers`)."""
    columns = (stamps.ms_of_integers(columns[0]), *columns[1:])
    ts_np = columns[0].to_numpy(zero_copy_only=False)
    seq = _seq_of(ts_np)
    if len(seq) and int(seq.max()) > INT16_MAX:
        raise MalformedAnswer(
            operation,
            f"more than {INT16_MAX + 1} samples on one millisecond",
            where=where_of(f"tag {tag!r}", chunk_label),
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
            f"data is {json_type(data)}, not a list of rows",
            where=where_of(f"tag {tag!r}", chunk_label),
        )
    try:
        columns = columns_of(data)
    except RowError as exc:
        raise MalformedAnswer(
            operation,
            f"row {exc.index}: {exc.message}",
            where=where_of(f"tag {tag!r}", chunk_label),
        ) from None
    return _finish_tag(pieces, tag, columns, operation, chunk_label)


def _member_columns(member: msgspec.Raw) -> Columns6 | None:
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
        return columns_of(data)
    except RowError:
        raise _Careful from None


def _history_entries(answer: Any, operation: str, chunk_label: str) -> Iterator[tuple[str, Any]]:
    if not isinstance(answer, dict):
        raise MalformedAnswer(
            operation,
            f"answer is {json_type(answer)}, not an object keyed by tag path",
            where=where_of(None, chunk_label),
        )
    for tag, entry in answer.items():
        if not isinstance(entry, dict):
            raise MalformedAnswer(
                operation,
                f"entry is {json_type(entry)}, not an object with request and data",
                where=where_of(f"tag {tag!r}", chunk_label),
            )
        if "data" not in entry:
            raise MalformedAnswer(
                operation, "entry has no data", where=where_of(f"tag {tag!r}", chunk_label)
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
        answer = load_json(body, operation, chunk_label)
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
    datas = _datas_of(answer)
    csv, plans = fastrows.data_as_csv(datas)
    try:
        whole = fastrows.read_whole(csv, plans)
        read = fastrows.read_plans(csv, plans) if whole is None else []
    except fastrows.Refused:
        raise _Careful from None
    pieces = _Pieces()
    if whole is not None:  # every tag planned, all of one kind
        run = cast(list[fastrows.CsvPlan], plans)
        pieces.add_all(list(answer), [p.rows for p in run], csv_columns(whole, run[0].booleans))
    else:
        for tag, data, plan, rows in zip(answer, datas, plans, read, strict=True):
            if plan is None or rows is None:
                pieces.add(tag, _member_columns(data), None)
            else:
                pieces.add(tag, csv_columns(rows, plan.booleans), None)
    table, stats = pieces.table_and_stats(node, encoded)
    by_tag = dict(zip(answer, stats, strict=True))
    for tag, data in zip(answer, datas, strict=True):
        if len(data) == 4 and bytes(data) == b"null":
            by_tag[tag] = TagStats(0, None, None, 0, null_data=True)
    return HistoryPage(table, by_tag)


def _datas_of(answer: fastrows.Entries) -> list[msgspec.Raw]:
    """Each entry's `data` as raw text; _Careful when an entry has none or another member
    is not JSON (what only the careful reading can name)."""
    datas: list[msgspec.Raw] = []
    for entry in answer.values():
        data = entry.get("data")
        if data is None:
            raise _Careful
        for key, member in entry.items():
            if key != "data" and not fastrows.member_is_json(member):
                raise _Careful
        datas.append(data)
    return datas


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
        answer = load_json(body, operation, chunk_label)
        if not isinstance(answer, dict) or "data" not in answer:
            raise MalformedAnswer(
                operation,
                "answer is not an object with request and data",
                where=where_of(f"tag {path!r}", chunk_label),
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
    if int(seq.max()) > INT16_MAX:
        raise ValueError(f"more than {INT16_MAX + 1} samples of one tag on one millisecond")
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
