"""Row timestamps as a node sends them -> epoch milliseconds, decided per tag of an answer.

The spec shows epoch ms (node-facts.md); a node may send epoch seconds (integers, or with
a millisecond fraction) or ISO 8601 text instead. The unit is read from the stamps of one
tag's rows together, never row by row: stamps that are all below 1e11 in magnitude are
seconds (1e11 ms is 1973, 1e11 s the year 5138), other integers are milliseconds, a
fraction is only possible in seconds, and text is ISO 8601 (naive text is UTC, as the
spec reads `start`/`end`). Whatever else arrives is named by the caller; rows that land
outside the query under this reading (another unit, a stray stamp) are judged there
(`connectors/fetch.py`): an answer is complete only when its rows fall in the window.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SECONDS_BELOW = 100_000_000_000
_MS = pa.timestamp("ms", tz="UTC")
_NAIVE_MS = pa.timestamp("ms")
_TIMED = r"^[+-]?\d{4,}-\d\d-\d\d[T ]\d\d:\d\d"


class StampError(ValueError):
    """Stamps that are neither epoch seconds, epoch ms nor ISO 8601 text."""


def in_seconds(ts: np.ndarray[Any, Any]) -> bool:
    """Whether one tag's numeric stamps (none empty) are epoch seconds."""
    return bool(np.abs(ts).max() < SECONDS_BELOW)


def ms_of_integers(ts: pa.Array) -> pa.Array:
    """One tag's int64 stamps in ms: as they are, or times 1000 when they are seconds."""
    if not len(ts):
        return ts
    if pc.min(ts).as_py() >= SECONDS_BELOW:
        return ts  # the common answer: one look, no copy
    if not in_seconds(ts.to_numpy(zero_copy_only=False)):
        return ts
    return pc.multiply(ts, 1000)


def ms_of_seconds_with_fraction(ts: pa.Array) -> pa.Array:
    """One tag's stamps read as doubles, some with a fraction: epoch seconds, rounded to ms.
    StampError unless they are seconds (a fraction of a millisecond means nothing)."""
    values = ts.to_numpy(zero_copy_only=False)
    if not np.isfinite(values).all() or not in_seconds(values):
        first = next(v for v in values.tolist() if not (abs(v) < SECONDS_BELOW))
        raise StampError(f"timestamp {first!r} is not an integer (epoch ms) nor epoch seconds")
    return pa.array(np.rint(values * 1000).astype(np.int64), type=pa.int64())


def ms_of_texts(ts: pa.Array) -> pa.Array:
    """One tag's ISO 8601 stamps in epoch ms (with a zone or offset; naive text is UTC).
    StampError names the first that is not ISO 8601 with a time of day (a date alone does
    not stamp a sample)."""
    timed = pc.match_substring_regex(ts, _TIMED)
    if not pc.all(timed).as_py():
        first = ts.filter(pc.invert(timed))[0].as_py()
        raise StampError(f"timestamp {first!r} is not epoch ms, epoch seconds or ISO 8601 text")
    try:
        return ts.cast(_MS).cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    try:
        return ts.cast(_NAIVE_MS).cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        pass
    for text in ts.to_pylist():
        try:
            pa.array([text]).cast(_MS)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            try:
                pa.array([text]).cast(_NAIVE_MS)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                raise StampError(
                    f"timestamp {text!r} is not epoch ms, epoch seconds or ISO 8601 text"
                ) from None
    raise StampError("timestamps mix ISO 8601 text with and without a zone")


def stamps_of_values(values: list[Any]) -> pa.Array | None:
    """One tag's stamps, as sent, as int64 when they are all of one kind: integers (and
    integral numbers) as they are, for `ms_of_integers` to read; numbers with a fraction
    and text in ms. None when they are not of one kind (the caller goes row by row);
    StampError when they are of one kind but not a timestamp."""
    try:
        array = pa.array(values)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None
    if array.null_count:
        return None
    if array.type == pa.int64():
        return array
    if array.type == pa.float64():
        if bool in set(map(type, values)):
            return None
        if pc.all(pc.equal(pc.floor(array), array)).as_py() is not False:
            try:
                return array.cast(pa.int64())
            except pa.ArrowInvalid:  # beyond int64
                return None
        return ms_of_seconds_with_fraction(array)
    if pa.types.is_string(array.type):
        return ms_of_texts(array)
    return None


def ms_of_tags(
    ts: np.ndarray[Any, np.dtype[np.int64]],
    starts: np.ndarray[Any, np.dtype[np.int64]],
    counts: np.ndarray[Any, np.dtype[np.int64]],
) -> np.ndarray[Any, np.dtype[np.int64]] | None:
    """The int64 stamps of many tags (tag i's from starts[i], counts[i] of them, none
    empty) in ms, each tag read as `ms_of_integers` reads it; None when none is in seconds
    (nothing copied: the common answer)."""
    if not len(ts):
        return None
    if int(ts.min()) >= SECONDS_BELOW:  # the common answer: one look
        return None
    small = np.abs(ts) < SECONDS_BELOW
    seconds = np.logical_and.reduceat(small, starts)
    if not seconds.any():
        return None
    scale = np.repeat(np.where(seconds, 1000, 1).astype(np.int64), counts)
    scaled: np.ndarray[Any, np.dtype[np.int64]] = ts * scale
    return scaled


class BucketStamping:
    """Where this node stamps an aggregated bucket `[b, b+interval)`: at `b` (the spec's
    reading, and the one convention stored: a bucket's row carries its start) or at
    `b+interval`. Learned from answers, kept by the run's engine for all its chunks
    (`HistoryEngine.stamping`), shown as a node fact.

    An aggregated answer over `[start, end)` proves the stamping when a row falls on
    `start` (bucket starts: no end-stamped bucket can be there) or on the end of its last
    bucket (bucket ends); an answer that proves neither is read as the answers before it
    proved, and refused while nothing is proven.
    """

    def __init__(self, at_end: bool | None = None) -> None:
        self.at_end = at_end
        self._lock = threading.Lock()

    def describe(self) -> str:
        """The learned stamping in words, for node facts."""
        if self.at_end is None:
            return "not learned yet"
        return "bucket end (stored as its start)" if self.at_end else "bucket start"

    def starts_of(
        self, ts: np.ndarray[Any, np.dtype[np.int64]], start_ms: int, end_ms: int, interval_ms: int
    ) -> np.ndarray[Any, np.dtype[np.int64]] | None:
        """The bucket starts of an answer's row stamps `ts` (asked over `[start, end)`), or
        None when they are the stamps already; StampError when the answer contradicts what
        was learned, or nothing is known of the stamping yet."""
        if not len(ts):
            return None
        buckets = -((start_ms - end_ms) // interval_ms)
        on_start = bool((ts == start_ms).any())
        on_end = bool((ts == start_ms + buckets * interval_ms).any())
        with self._lock:
            if on_start != on_end:
                if self.at_end is not None and self.at_end != on_end:
                    raise StampError(
                        f"aggregated rows stamped at their bucket's {_side(on_end)}, where "
                        f"earlier answers stamped them at its {_side(self.at_end)}"
                    )
                self.at_end = on_end
            elif self.at_end is None and not on_start:
                raise StampError(
                    "aggregated rows neither on the query's start nor on its last bucket's "
                    "end: where the node stamps a bucket (start or end) is not known yet"
                )
            at_end = self.at_end if on_start == on_end else on_end
        if not at_end:
            return None
        starts: np.ndarray[Any, np.dtype[np.int64]] = ts - np.int64(interval_ms)
        return starts


def _side(at_end: bool) -> str:
    return "end" if at_end else "start"
