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

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.csv as pacsv

# tag -> member -> raw text; msgspec validates the whole answer while building it.
Entries = dict[str, dict[str, msgspec.Raw]]
Columns = tuple[pa.Array, pa.Array, pa.Array, pa.Array]  # ts, value, quality, extra

_ANSWER = msgspec.json.Decoder(Entries)
_WHITESPACE = b" \t\n\r"
_TO_CSV = bytes.maketrans(b"[]", b",\n")
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
class CsvRows:
    """A tag's `data` text as CSV lines, its row count if it is what it seems, and whether
    its values look boolean (it holds `t` or `f`) rather than numeric."""

    lines: bytes
    rows: int
    booleans: bool


def rows_as_csv(data: bytes) -> CsvRows | None:
    """`data` as CSV lines when it may be rows of numbers (or of booleans) and nulls only;
    None when it holds anything else (a string, an object, a top level that is no list of
    lists); the CSV reader decides the rest."""
    if b'"' in data or b"{" in data:
        return None
    if any(space in data for space in (b" ", b"\n", b"\r", b"\t")):
        data = data.translate(None, _WHITESPACE)  # only between tokens: there are no strings
    if not data.startswith(b"[["):
        return None
    booleans = b"t" in data or b"f" in data
    return CsvRows(data.translate(_TO_CSV), data.count(b"]") - 1, booleans)


def read_rows(lines: bytes, rows: int, booleans: bool) -> Columns | None:
    """ts, value, quality, extra of lines made by `rows_as_csv`; None unless they are
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


def read_many(texts: list[CsvRows], booleans: bool) -> list[Columns | None]:
    """`read_rows` of each text, in one CSV read when all of them are well formed (the
    counts add up only if each does: a text never gives fewer lines than its count)."""
    if len(texts) > 1:
        counts = [text.rows for text in texts]
        together = read_rows(b"".join(text.lines for text in texts), sum(counts), booleans)
        if together is not None:
            offsets = np.cumsum([0, *counts]).tolist()
            return [
                (
                    together[0].slice(start, rows),
                    together[1].slice(start, rows),
                    together[2].slice(start, rows),
                    together[3].slice(start, rows),
                )
                for start, rows in zip(offsets, counts, strict=False)
            ]
    return [read_rows(text.lines, text.rows, text.booleans) for text in texts]


def value_doubts(values: pa.Array, lines: bytes) -> tuple[bool, bool]:
    """(an infinite value, a value orjson reads otherwise) among doubles of `read_rows`.

    An infinity is a number beyond a double: orjson rejects such an answer, the CSV reader
    makes it inf. -0.0 written `-0` is the integer 0 to orjson, so +0.0. Slots under nulls
    are looked at too: at worst that sends a good tag the careful way.
    """
    data = values.buffers()[1]
    if data is None:
        return False, False
    array = np.frombuffer(data, dtype=np.float64)[values.offset : values.offset + len(values)]
    negative_zero = bool((np.signbit(array) & (array == 0)).any())
    return bool(np.isinf(array).any()), negative_zero and b",-0," in lines
