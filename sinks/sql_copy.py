"""Arrow table -> PostgreSQL binary COPY stream, vectorised with NumPy (no per-row Python).

Why binary: the server parses it far faster than CSV (no timestamp or float text parsing),
NULL and the empty string cannot be confused, and floats survive bit for bit. Why not
psycopg's `write_row`: it is a Python call per row, slower than the server can ingest.

Format (PostgreSQL docs, "COPY ... Binary Format"): a fixed header, then per row a
big-endian int16 field count and per field an int32 byte length (-1 for NULL) followed by
the value in the type's binary send format; a trailing int16 -1 ends the stream.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa

HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
TRAILER = b"\xff\xff"
# timestamptz on the wire: int64 microseconds since 2000-01-01 00:00:00 UTC.
PG_EPOCH_US = 946_684_800_000_000
_UNIT_TO_US = {"s": 1_000_000, "ms": 1_000, "us": 1, "ns": None}

Bytes = npt.NDArray[np.uint8]
Ints = npt.NDArray[np.int64]


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


def _fixed_values(column: pa.Array) -> Bytes:
    """Big-endian send format of a fixed-width column, one row per line of a 2-D byte view."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        raw = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        factor = _UNIT_TO_US[kind.unit]
        micros = raw // 1000 if factor is None else raw * factor
        data = (micros - PG_EPOCH_US).astype(">i8")
    elif pa.types.is_boolean(kind):
        data = column.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8)
    elif pa.types.is_float64(kind):
        data = column.fill_null(0.0).to_numpy(zero_copy_only=False).astype(">f8")
    else:
        width = {"int2": ">i2", "int4": ">i4", "int8": ">i8"}[pg_type_name(kind)]
        data = column.fill_null(0).to_numpy(zero_copy_only=False).astype(width)
    return np.ascontiguousarray(data).view(np.uint8).reshape(len(column), -1)


def _string_parts(column: pa.Array) -> tuple[Ints, Bytes]:
    """Start offsets (len n + 1) into a UTF-8 byte buffer, for a string or large_string array."""
    if pa.types.is_large_string(column.type):
        offset_type: type[np.integer[npt.NBitBase]] = np.int64
    else:
        offset_type = np.int32
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], dtype=offset_type)[
        column.offset : column.offset + len(column) + 1
    ].astype(np.int64)
    data = (
        np.frombuffer(buffers[2], dtype=np.uint8)
        if buffers[2] is not None
        else np.zeros(0, np.uint8)
    )
    return offsets, data


def _valid(column: pa.Array) -> npt.NDArray[np.bool_]:
    if column.null_count == 0:
        return np.ones(len(column), dtype=bool)
    mask: npt.NDArray[np.bool_] = column.is_valid().to_numpy(zero_copy_only=False)
    return mask


def encode_binary_copy(table: pa.Table) -> bytes:
    """The whole COPY ... (FORMAT binary) stream of a table: header, rows, trailer."""
    n = table.num_rows
    if n == 0:
        return HEADER + TRAILER
    columns = [chunked.combine_chunks() for chunked in table.columns]
    columns = [
        c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in columns
    ]
    # Per column: validity, payload length per row (0 for NULL), and the payload source.
    lengths: list[Ints] = []
    valids: list[npt.NDArray[np.bool_]] = []
    for column in columns:
        valid = _valid(column)
        if pg_type_name(column.type) == "text":
            offsets, _ = _string_parts(column)
            length = np.diff(offsets)
        else:
            width = _fixed_values(column[:1]).shape[1]
            length = np.full(n, width, dtype=np.int64)
        lengths.append(np.where(valid, length, 0))
        valids.append(valid)
    row_size = 2 + sum(4 + length for length in lengths)
    row_start = np.zeros(n, dtype=np.int64)
    np.cumsum(row_size[:-1], out=row_start[1:])
    total = len(HEADER) + int(row_start[-1] + row_size[-1]) + len(TRAILER)
    out = np.zeros(total, dtype=np.uint8)
    out[: len(HEADER)] = np.frombuffer(HEADER, dtype=np.uint8)
    out[-2:] = 0xFF
    base = row_start + len(HEADER)
    _scatter_rows(out, base, np.full((n, 1), len(columns), dtype=">i2").view(np.uint8))
    field_start = base + 2
    for column, length, valid in zip(columns, lengths, valids, strict=True):
        header = np.where(valid, length, -1).astype(">i4").view(np.uint8).reshape(n, 4)
        _scatter_rows(out, field_start, header)
        payload_start = field_start + 4
        if pg_type_name(column.type) == "text":
            offsets, data = _string_parts(column)
            _scatter_strings(out, payload_start, offsets[:-1], length, data)
        else:
            values = _fixed_values(column)
            _scatter_rows(out, payload_start[valid], values[valid])
        field_start = payload_start + length
    return out.tobytes()


def _scatter_rows(out: Bytes, starts: Ints, rows: Bytes) -> None:
    """out[starts[i] : starts[i] + width] = rows[i] for every i, in one indexing step."""
    if len(starts) == 0:
        return
    width = rows.shape[1]
    out[(starts[:, None] + np.arange(width, dtype=np.int64)).ravel()] = rows.ravel()


def _scatter_strings(out: Bytes, dest: Ints, src: Ints, length: Ints, data: Bytes) -> None:
    """Copy data[src[i] : src[i] + length[i]] to out[dest[i] : ...] for every i at once."""
    total = int(length.sum())
    if total == 0:
        return
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)
    out[np.repeat(dest, length) + within] = data[np.repeat(src, length) + within]
