"""History rows of numbers or booleans read from the answer bytes in C, no Python object
per value.

The common answer is compact JSON whose tags hold rows `[ts, value, quality, extra]` of
numbers (or booleans) and nulls. msgspec walks the answer once, validating all of it, and
hands each member of each tag entry back as its raw text (`msgspec.Raw`, a view of the
body). A `data` text without strings or objects is turned into CSV by one byte
translation (`[` -> `,`, `]` -> newline) and read by Arrow's CSV reader with typed columns
(int64, float64 or bool, int16, int64), which releases the GIL while it works.

Why that is exact, for valid JSON without quote, brace or whitespace, starting with `[[`:
a line is the text between two `]`, and the reader accepts it only with 6 fields whose
last 4 are typed, so never empty: scalars. The first field is empty (a line starts at the
text's `[` or after a `]`, which valid JSON follows with `,`). Between scalars valid JSON
has commas, so a line is `[[a,b,c,d]` (the first), `,[a,b,c,d]` (one row) or `,s,a,b,c,d]`
(five scalars ending some array). Every `[` is then the text's first or opens one row,
closed by that row's `]`, so a line of the third kind can only close the outer array and
be the last. Hence `]` minus one (the outer array's) counts the rows, and the lines are
that many exactly when every line is one row of 4 scalars: the data is a list of such
rows. Anything else fails the reader or the count, and the caller reads that tag (or the
whole answer) with orjson.

Where JSON and this reading could still disagree, the caller checks the doubles read:
a number too big for a double (orjson rejects the answer, the CSV reader makes it
infinite) and the integer `-0` (orjson reads the integer 0, so +0.0; the reader -0.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, cast

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

# tag -> member -> raw text; msgspec validates the whole answer while building it.
Entries = dict[str, dict[str, msgspec.Raw]]
Columns = tuple[pa.Array, pa.Array, pa.Array, pa.Array]  # ts, value, quality, extra

_ANSWER = msgspec.json.Decoder(Entries)
_WHITESPACE = b" \t\n\r"
# Not in a text of number or boolean rows that the CSV reading takes: strings, objects and
# whitespace (the careful way reads those).
_NOT_IN_CSV_ROWS = (b'"', b"{", b" ", b"\n", b"\r", b"\t")
_TO_CSV = bytes.maketrans(b"[]", b",\n")
_WHOLE_LOOK_BYTES = 1 << 20
_CLOSE = b"]"
_COLUMNS = ["open", "row", "ts", "value", "quality", "extra"]
_READ = pacsv.ReadOptions(column_names=_COLUMNS, use_threads=False, block_size=1 << 24)
_PARSE = pacsv.ParseOptions(
    quote_char=False, double_quote=False, escape_char=False, ignore_empty_lines=True
)


def _convert(value_type: pa.DataType) -> pacsv.ConvertOptions:
    return pacsv.ConvertOptions(
        column_types={
            "ts": pa.int64(),
            "value": value_type,
            "quality": pa.int16(),
            "extra": pa.int64(),
        },
        null_values=["null"],
        true_values=["true"],
        false_values=["false"],
        strings_can_be_null=False,
        quoted_strings_can_be_null=False,
        include_columns=_COLUMNS[2:],
    )


_CONVERT = {False: _convert(pa.float64()), True: _convert(pa.bool_())}
# A member of an entry sits at depth 3 of the answer; orjson limits nesting, so members it
# reads alone are wrapped to keep their depth.
_MEMBER_OPEN, _MEMBER_CLOSE = b'{"":{"":', b"}}"


def split_answer(body: bytes) -> Entries | None:
    """Each tag's members as raw text, or None unless the answer is compact JSON, an object
    of objects, without a repeated key (the careful reading then decides and explains).

    The length check: a compact answer is exactly its keys (orjson writes the shortest JSON
    string), its members' texts and the punctuation between them; a repeated key, whose
    first value the dict forgets (and so nobody would validate), makes the body longer.
    """
    try:
        answer = _ANSWER.decode(body)
    except (msgspec.DecodeError, ValueError):  # ValueError: a key that is not UTF-8
        return None
    try:
        length = 2 + max(len(answer) - 1, 0)  # {} and commas
        for tag, entry in answer.items():
            length += len(orjson.dumps(tag)) + 1 + 2 + max(len(entry) - 1, 0)
            for key, member in entry.items():
                length += len(orjson.dumps(key)) + 1 + len(member)
    except orjson.JSONEncodeError:  # a key orjson cannot write: let orjson judge the answer
        return None
    return answer if length == _stripped_length(body) else None


def _stripped_length(body: bytes) -> int:
    start, end = 0, len(body)
    while end > start and body[end - 1] in _WHITESPACE:
        end -= 1
    while start < end and body[start] in _WHITESPACE:
        start += 1
    return end - start


def member_is_json(member: msgspec.Raw) -> bool:
    """Whether orjson accepts the member where it stands (msgspec is more lenient on strings
    and on numbers beyond a double)."""
    try:
        orjson.loads(b"".join((_MEMBER_OPEN, member, _MEMBER_CLOSE)))
    except orjson.JSONDecodeError:
        return False
    return True


def load_member(member: bytes | msgspec.Raw) -> Any:
    """The member as orjson reads it where it stands; orjson.JSONDecodeError if it cannot."""
    return orjson.loads(b"".join((_MEMBER_OPEN, member, _MEMBER_CLOSE)))[""][""]


@dataclass(frozen=True)
class CsvPlan:
    """Where one tag's `data` lies in the CSV text of all tags, the rows it holds if it is
    what it seems, and whether its values look boolean (it holds `t` or `f`)."""

    start: int
    end: int
    rows: int
    booleans: bool


def data_as_csv(datas: list[msgspec.Raw]) -> tuple[bytes, list[CsvPlan | None]]:
    """The `data` texts of all tags, one after the other, as CSV lines, with each text's
    plan: None for a text that cannot be rows of numbers (or booleans) and nulls (a string,
    an object, whitespace, a top level that is no list of lists); the reader decides the
    rest. One copy and one translation for the whole answer, no slice copied."""
    text = b"".join(datas)
    plans: list[CsvPlan | None] = []
    if not datas:
        return text, plans
    # What holds for the whole text holds for each part: a text without strings, objects
    # or booleans (the common answer) is looked at once, not once per tag. Only where
    # tags are many for the bytes: a large answer with a string tag would be read twice.
    clean = len(text) <= _WHOLE_LOOK_BYTES and not any(
        text.find(byte) >= 0 for byte in _NOT_IN_CSV_ROWS
    )
    maybe_booleans = text.find(b"t") >= 0 or text.find(b"f") >= 0
    lengths = np.fromiter(map(len, datas), dtype=np.int64, count=len(datas))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        if text.startswith(b"[[", start, end) and (
            clean or not any(text.find(byte, start, end) >= 0 for byte in _NOT_IN_CSV_ROWS)
        ):
            booleans = maybe_booleans and (
                text.find(b"t", start, end) >= 0 or text.find(b"f", start, end) >= 0
            )
            # Counted in place: a NumPy mask summed per text would be 9 bytes per byte.
            plans.append(CsvPlan(start, end, text.count(_CLOSE, start, end) - 1, booleans))
        else:
            plans.append(None)
    return text.translate(_TO_CSV), plans


def read_rows(lines: pa.Buffer, rows: int, booleans: bool) -> Columns | None:
    """ts, value, quality, extra of lines made by `data_as_csv`; None unless they are
    exactly `rows` rows of 4 values, each null or of its column's type (value: double, or
    boolean when `booleans`)."""
    try:
        table = pacsv.read_csv(
            pa.BufferReader(lines),
            read_options=_READ,
            parse_options=_PARSE,
            convert_options=_CONVERT[booleans],
        )
    except pa.ArrowException:
        return None
    if table.num_rows != rows:
        return None
    ts, value, quality, extra = (column.combine_chunks() for column in table.columns)
    return ts, value, quality, extra


class Refused(Exception):
    """Rows the CSV reader took that the careful reading refuses: a null timestamp, or a
    number beyond a double (orjson rejects the answer, the reader makes it infinite)."""


def read_plans(csv: bytes, plans: list[CsvPlan | None]) -> list[Columns | None]:
    """`read_rows` of each planned text (None where there is no plan, where the text is
    not rows of 4 values, or holds the integer `-0`): the texts of one kind (numbers,
    booleans) in one read, wherever they stand, when all of them are well formed (the
    counts add up only if each does: no text gives fewer lines than its count), each alone
    otherwise; Refused for what the careful reading refuses. One read per kind, not per
    run of neighbours: an answer mixing kinds (strings between numbers) paid a read per
    run, a fixed cost per chunk that small windows felt (BENCHMARKS.md, small chunks)."""
    buffer = pa.py_buffer(csv)
    read: list[Columns | None] = [None] * len(plans)
    for booleans in (False, True):
        indices = [
            index
            for index, plan in enumerate(plans)
            if plan is not None and plan.booleans == booleans
        ]
        if indices:
            _read_kind(csv, buffer, [cast(CsvPlan, plans[i]) for i in indices], indices, read)
    return read


def _read_kind(
    csv: bytes,
    buffer: pa.Buffer,
    run: list[CsvPlan],
    indices: list[int],
    read: list[Columns | None],
) -> None:
    """`read_plans` of the texts `run` of one kind (at `indices` of `read`)."""
    together = None
    if len(run) > 1:
        together = read_rows(_lines_of(csv, buffer, run), sum(p.rows for p in run), run[0].booleans)
    if together is None:
        for index, each in zip(indices, run, strict=True):
            lines = buffer.slice(each.start, each.end - each.start)
            read[index] = _checked(read_rows(lines, each.rows, each.booleans), csv, [each])[0]
        return
    at = 0
    checked = _checked(together, csv, run)
    for index, each, fine in zip(indices, run, checked, strict=True):
        if fine is not None:
            read[index] = cast(Columns, tuple(c.slice(at, each.rows) for c in together))
        at += each.rows


def _lines_of(csv: bytes, buffer: pa.Buffer, run: list[CsvPlan]) -> pa.Buffer:
    """The lines of the texts of `run`, one after the other: a slice where they are
    neighbours, else one copy of them (lines of whole texts join into lines of rows)."""
    if all(one.end == after.start for one, after in pairwise(run)):
        return buffer.slice(run[0].start, run[-1].end - run[0].start)
    view = memoryview(csv)
    return pa.py_buffer(b"".join(view[p.start : p.end] for p in run))


def read_whole(csv: bytes, plans: list[CsvPlan | None]) -> Columns | None:
    """The rows of every text at once, one text after the other, when all are planned, of
    one kind, and read alike by JSON: what `read_plans` gives in slices, without a slice
    per text (an answer of thousands of tags with a few rows each). None where that does
    not hold (`read_plans` then decides per text); Refused as `read_plans`."""
    if not plans or any(plan is None for plan in plans):
        return None
    run = cast(list[CsvPlan], plans)
    if any(plan.booleans != run[0].booleans for plan in run):
        return None
    lines = pa.py_buffer(csv).slice(run[0].start, run[-1].end - run[0].start)
    columns = read_rows(lines, sum(plan.rows for plan in run), run[0].booleans)
    if columns is None or any(each is None for each in _checked(columns, csv, run)):
        return None
    return columns


def _checked(columns: Columns | None, csv: bytes, run: list[CsvPlan]) -> list[Columns | None]:
    """`columns` of the texts `run` read together, for each text: itself if JSON reads it
    alike, None if one of its values was written as the integer `-0` (the integer 0 to
    orjson, so +0.0 where the reader gives -0.0); Refused as that says."""
    if columns is None:
        return [None] * len(run)
    ts, values = columns[0], columns[1]
    if ts.null_count:
        raise Refused
    if run[0].booleans:
        return [columns] * len(run)
    low, high = pc.min_max(values).values()
    if not high.is_valid:  # no value at all
        return [columns] * len(run)
    if high.as_py() == math.inf or low.as_py() == -math.inf:
        raise Refused
    negative_zero = _negative_zeros(values)
    if not negative_zero.any():  # null slots are looked at too: harmless
        return [columns] * len(run)
    checked: list[Columns | None] = []
    at = 0
    for each in run:
        written_as_integer = (
            negative_zero[at : at + each.rows].any()
            and csv.find(b",-0,", each.start, each.end) >= 0
        )
        checked.append(None if written_as_integer else columns)
        at += each.rows
    return checked


def _negative_zeros(values: pa.Array) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Where the doubles are -0.0 (the one double whose bits are the lowest int64)."""
    data = values.buffers()[1]
    bits = np.frombuffer(data, dtype=np.int64)[values.offset : values.offset + len(values)]
    lowest: np.ndarray[Any, np.dtype[np.bool_]] = bits == np.iinfo(np.int64).min
    return lowest
