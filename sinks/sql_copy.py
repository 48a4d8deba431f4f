"""Arrow table -> PostgreSQL binary COPY stream, vectorised (no per-row Python).

Why binary: the server parses it far faster than CSV (no timestamp or float text parsing),
NULL and the empty string cannot be confused, and floats survive bit for bit. Why not
psycopg's `write_row`: it is a Python call per row, slower than the server ingests.

Format (PostgreSQL docs, "COPY ... Binary Format"): a fixed header, then per row a
big-endian int16 field count and per field an int32 byte length (-1 for NULL) followed by
the value in the type's binary send format; a trailing int16 -1 ends the stream.

How: every field becomes a column of per-row byte strings (length word + payload, built
with NumPy), and Arrow's `binary_join_element_wise` concatenates them row by row in C++.
The joined column's data buffer is then exactly the rows of the stream, back to back.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
TRAILER = b"\xff\xff"
# timestamptz on the wire: int64 microseconds since 2000-01-01 00:00:00 UTC.
PG_EPOCH_US = 946_684_800_000_000
_MICROS_PER_UNIT = {"s": 1_000_000, "ms": 1_000, "us": 1}
_NULL_LENGTH = b"\xff\xff\xff\xff"
_BYTES = pa.large_binary()
_EMPTY = pa.scalar(b"", _BYTES)


def pg_type_name(kind: pa.DataType) -> str:
    """The PostgreSQL type a column of this Arrow type is loaded as."""
    if pa.types.is_timestamp(kind):
        return "timestamptz"
    if pa.types.is_float64(kind):
        return "float8"
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_int16(kind):
        return "int2"
    if pa.types.is_int32(kind):
        return "int4"
    if pa.types.is_int64(kind):
        return "int8"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "text"
    raise TypeError(f"no binary COPY encoding for Arrow type {kind}")


def _send_format(column: pa.Array) -> npt.NDArray[np.generic]:
    """Big-endian send-format values of a fixed-width column (NULL slots hold zeros)."""
    kind = column.type
    filler = False if pa.types.is_boolean(kind) else 0
    raw: npt.NDArray[np.generic] = np.asarray(
        column.cast(pa.int64()).fill_null(0)
        if pa.types.is_timestamp(kind)
        else column.fill_null(filler)
    )
    if pa.types.is_timestamp(kind):
        micros = raw // 1000 if kind.unit == "ns" else raw * _MICROS_PER_UNIT[kind.unit]
        return np.asarray(micros - PG_EPOCH_US).astype(">i8")
    if pa.types.is_boolean(kind):
        return raw.astype(np.uint8)
    if pa.types.is_float64(kind):
        return raw.astype(">f8")
    return raw.astype({"int2": ">i2", "int4": ">i4", "int8": ">i8"}[pg_type_name(kind)])


def _fixed_pieces(blocks: npt.NDArray[np.uint8]) -> pa.Array:
    """A binary column whose row i is blocks[i] (all rows the same width)."""
    n, width = blocks.shape
    offsets = np.arange(n + 1, dtype=np.int64) * width
    data = np.ascontiguousarray(blocks).reshape(-1)
    return pa.Array.from_buffers(_BYTES, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _constant(n: int, value: bytes) -> pa.Array:
    return _fixed_pieces(np.tile(np.frombuffer(value, np.uint8), (n, 1)))


def _valid(column: pa.Array) -> npt.NDArray[np.bool_]:
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    mask: npt.NDArray[np.bool_] = column.is_valid().to_numpy(zero_copy_only=False)
    return mask


def _length_words(lengths: npt.NDArray[np.int64], valid: npt.NDArray[np.bool_]) -> pa.Array:
    words = np.where(valid, lengths, -1).astype(">i4").view(np.uint8).reshape(-1, 4)
    return _fixed_pieces(words)


def _field_pieces(column: pa.Array) -> list[pa.Array]:
    """Per-row byte strings (length word + payload) of one field."""
    n = len(column)
    valid = _valid(column)
    if pg_type_name(column.type) == "text":
        text = pc.fill_null(column, "").cast(pa.large_string()).cast(_BYTES)
        lengths = pc.binary_length(text).to_numpy(zero_copy_only=False).astype(np.int64)
        return [_length_words(lengths, valid), text]
    values = _send_format(column)
    width = values.dtype.itemsize
    block = np.empty((n, 4 + width), dtype=np.uint8)
    block[:, :4] = np.frombuffer(width.to_bytes(4, "big"), np.uint8)
    block[:, 4:] = np.ascontiguousarray(values).view(np.uint8).reshape(n, width)
    pieces = _fixed_pieces(block)
    if valid.all():
        return [pieces]
    return [pc.if_else(pa.array(valid), pieces, _constant(n, _NULL_LENGTH))]


def encode_rows(table: pa.Table) -> bytes:
    """The rows of a table in binary COPY form, without the stream's header and trailer."""
    n = table.num_rows
    if n == 0:
        return b""
    pieces = [_constant(n, len(table.columns).to_bytes(2, "big"))]
    for chunked in table.columns:
        column = chunked.combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        pieces.extend(_field_pieces(column))
    rows = pc.binary_join_element_wise(*pieces, _EMPTY)
    offsets = np.frombuffer(rows.buffers()[1], dtype=np.int64)[rows.offset : rows.offset + n + 1]
    return memoryview(rows.buffers()[2])[int(offsets[0]) : int(offsets[-1])].tobytes()


def iter_binary_copy(table: pa.Table, rows_per_piece: int = 50_000) -> Iterator[bytes]:
    """The COPY stream in pieces, so the server can ingest one while the next is encoded."""
    yield HEADER
    for start in range(0, table.num_rows, rows_per_piece):
        yield encode_rows(table.slice(start, rows_per_piece))
    yield TRAILER


def encode_binary_copy(table: pa.Table) -> bytes:
    """The whole COPY ... (FORMAT binary) stream of a table: header, rows, trailer."""
    return b"".join((HEADER, encode_rows(table), TRAILER))
