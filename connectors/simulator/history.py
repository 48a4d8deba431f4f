"""Deterministic tag history on demand, and the Historian's four modes over it.

Sample k of a tag is stamped `history_start + k*period (+ jitter < period/2 for irregular
tags)`, so the samples of any range come from a closed form, vectorised with numpy.
Gaps (blocks of 600 samples missing, about 5%), bad (0) and uncertain (64) quality
stretches, duplicate events on one millisecond (every 97th sample of some tags) and late
samples (tags over a link, and samples added with `add_late_sample`) are all part of it.

Values stay in numpy arrays until an answer needs Python objects: aggregated answers are
computed on the arrays (all buckets at once), a long range block by block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import Any

import numpy as np

from connectors.simulator.tagtree import STATES, Salt, TagSpec, mix

GOOD = 192
UNCERTAIN = 64
BAD = 0
GAP_BLOCK = 600
QUALITY_BLOCK = 50
# Aggregated answers generate at most about this many samples at once (whole buckets).
BLOCK_SAMPLES = 1 << 16
_STATES = np.array(STATES, dtype=object)


@dataclass
class Samples:
    """Every stored event of one tag in a range, in time order.

    `data` holds the values as one array (number: float64, boolean: bool, string: index
    into STATES); `odd` holds, by position, values that came as they are (late samples,
    any type) and stand in for `data` there.
    """

    ts: np.ndarray  # int64 epoch ms
    data: np.ndarray
    quality: np.ndarray  # int64
    extra: np.ndarray  # int64
    kind: str  # number | boolean | string
    odd: dict[int, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ts)

    def slice(self, start: int, stop: int) -> Samples:
        odd = {i - start: v for i, v in self.odd.items() if start <= i < stop}
        return Samples(
            self.ts[start:stop],
            self.data[start:stop],
            self.quality[start:stop],
            self.extra[start:stop],
            self.kind,
            odd,
        )

    def slice_at(self, positions: np.ndarray) -> Samples:
        """The samples at `positions` (ascending), as `slice` gives a run of them."""
        odd: dict[int, Any] = {}
        if self.odd:
            moved = {int(p): i for i, p in enumerate(positions.tolist())}
            odd = {moved[i]: v for i, v in self.odd.items() if i in moved}
        return Samples(
            self.ts[positions],
            self.data[positions],
            self.quality[positions],
            self.extra[positions],
            self.kind,
            odd,
        )

    @property
    def values(self) -> list[Any]:
        """The values as Python objects (float | bool | str | whatever a late sample held)."""
        return self.pick(None)

    def pick(self, positions: np.ndarray | None) -> list[Any]:
        """The values at `positions` (None: all) as Python objects."""
        data = self.data if positions is None else self.data[positions]
        out: list[Any] = (_STATES[data] if self.kind == "string" else data).tolist()
        if self.odd:
            if positions is None:
                for position, value in self.odd.items():
                    out[position] = value
            else:
                for index, position in enumerate(positions.tolist()):
                    if position in self.odd:
                        out[index] = self.odd[position]
        return out

    def value(self, position: int) -> Any:
        """The value at `position` (negative counts from the end) as a Python object."""
        position %= len(self)
        if position in self.odd:
            return self.odd[position]
        return self.pick(np.array([position]))[0]

    def numbers(self) -> tuple[np.ndarray, np.ndarray]:
        """The values as float64 (booleans 0/1, None NaN), and where they are None."""
        numbers = self.data.astype(np.float64)
        missing = np.zeros(len(self), dtype=bool)
        for position, value in self.odd.items():
            if value is None:
                numbers[position] = math.nan
                missing[position] = True
            else:
                numbers[position] = float(value)
        return numbers, missing


def _hash_blocks(k: np.ndarray, size: int, salt: Salt, modulus: int) -> np.ndarray:
    """`mix(k // size, salt) % modulus`, hashing each block once (k is ascending); with a
    column of salts (many tags), one row per salt."""
    if not len(k):
        return np.zeros(0, dtype=np.uint64)
    blocks = k // np.int64(size)
    first = int(blocks[0])
    table = mix(np.arange(first, int(blocks[-1]) + 1, dtype=np.int64), salt)
    return (table % np.uint64(modulus))[..., blocks - first]


def _values(spec: TagSpec | Tags, k: np.ndarray, ts: np.ndarray) -> np.ndarray:
    if spec.type == "number":
        noise = (mix(k, spec.salt + 5) % np.uint64(1000)).astype(np.float64) / 1000.0 - 0.5
        wave = np.sin(2 * math.pi * ts.astype(np.float64) / spec.wave_ms)
        return np.round(spec.offset + spec.amplitude * wave + noise, 3)
    if spec.type == "boolean":
        flags: np.ndarray = _hash_blocks(k, 30, spec.salt + 6, 2) == 1
        return flags
    return _hash_blocks(k, 40, spec.salt + 7, len(STATES)).astype(np.int64)


def _quality(block: np.ndarray) -> np.ndarray:
    """Quality from a sample's quality-block hash: bad, uncertain or good."""
    quality = np.full(block.shape, GOOD, dtype=np.int64)
    quality[block == 0] = BAD
    quality[block == 1] = UNCERTAIN
    return quality


def _doubled(
    ts: np.ndarray, data: np.ndarray, quality: np.ndarray, twice: np.ndarray, kind: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The samples with those marked `twice` stored twice on one millisecond: (ts, data,
    quality, extra, index of each one's original); the second has `extra` 1 and, for a
    number, the value + 0.125."""
    counts = np.where(twice, 2, 1)
    index = np.repeat(np.arange(len(ts)), counts)
    ts, quality, data = ts[index], quality[index], data[index]
    second = np.zeros(len(ts), dtype=bool)
    second[1:] = index[1:] == index[:-1]
    extra = second.astype(np.int64)
    if kind == "number":
        data[second] = np.round(data[second] + 0.125, 3)
    return ts, data, quality, extra, index


def _stored(
    spec: TagSpec, lower: int, upper: int, history_start_ms: int, first_k: int, last_k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices k in [first_k, last_k] and stamps of the stored samples in [lower, upper]."""
    period = spec.period_ms
    if not spec.irregular:
        # On the grid: the stamps in [lower, upper] are one run of k, no mask needed.
        first_k = max(first_k, -((history_start_ms - lower) // period))
        last_k = min(last_k, (upper - history_start_ms) // period)
    k = np.arange(first_k, last_k + 1, dtype=np.int64)
    ts = history_start_ms + k * np.int64(period)
    keep: np.ndarray | None = None
    if spec.irregular:
        ts = ts + (mix(k, spec.salt + 1) % np.uint64(period // 2)).astype(np.int64)
        keep = (ts >= lower) & (ts <= upper)
    # Gaps: whole blocks of samples that the node never stored.
    stored = _hash_blocks(k, GAP_BLOCK, spec.salt + 2, 20) != 0
    if spec.hidden is not None:  # still in a link's buffer
        stored &= (ts < spec.hidden[0]) | (ts >= spec.hidden[1])
    keep = stored if keep is None else keep & stored
    if keep.all():
        return k, ts
    return k[keep], ts[keep]


def generate(
    spec: TagSpec,
    start_ms: int,
    end_ms: int,
    *,
    history_start_ms: int,
    visible_until_ms: int,
    late: Sequence[tuple[int, Any, int]] = (),
    max_count: int | None = None,
) -> Samples:
    """Events with start_ms <= ts <= end_ms (inclusive), visible at `visible_until_ms`.

    `max_count`: only the first `max_count` events are needed (a capped raw answer), so a
    long range is generated block by block until there are enough.
    """
    upper = min(end_ms, visible_until_ms - spec.remote_lag_ms)
    lower = max(start_ms, history_start_ms)
    if upper < lower:
        empty = _empty(spec.type)
        return _with_late(empty, start_ms, end_ms, late, visible_until_ms, max_count)
    period = spec.period_ms
    k_first = max(0, (lower - history_start_ms) // period - 1)
    k_last = (upper - history_start_ms) // period + 1
    if max_count is None:
        k, ts = _stored(spec, lower, upper, history_start_ms, k_first, k_last)
    else:
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        found = 0
        step = max(4 * GAP_BLOCK, 2 * max_count)
        while k_first <= k_last and found < max_count:
            block_last = min(k_last, k_first + step - 1)
            part = _stored(spec, lower, upper, history_start_ms, k_first, block_last)
            parts.append(part)
            found += len(part[0])
            k_first = block_last + 1
        k = np.concatenate([p[0] for p in parts])[:max_count]
        ts = np.concatenate([p[1] for p in parts])[:max_count]
    quality = _quality(_hash_blocks(k, QUALITY_BLOCK, spec.salt + 3, 40))
    extra = np.zeros(len(k), dtype=np.int64)
    data = _values(spec, k, ts)
    if spec.duplicates and len(k):
        twice = (k % 97) == 0
        if twice.any():
            ts, data, quality, extra, _ = _doubled(ts, data, quality, twice, spec.type)
    samples = Samples(ts, data, quality, extra, spec.type)
    return _with_late(samples, start_ms, end_ms, late, visible_until_ms, max_count)


@dataclass(frozen=True)
class Tags:
    """Tags of one period and type as columns, for `generate_many`: the attributes of a
    TagSpec that values are made of, one row per tag, so each sample is computed with the
    same operations as `generate` computes it for its tag alone."""

    specs: tuple[TagSpec, ...]
    type: str
    period_ms: int
    salt: np.ndarray  # uint64 (n, 1)
    offset: np.ndarray  # float64 (n, 1)
    amplitude: np.ndarray  # float64 (n, 1)
    wave_ms: np.ndarray  # int64 (n, 1)
    irregular: np.ndarray  # bool (n, 1)
    duplicates: np.ndarray  # bool (n,)

    @classmethod
    def of(cls, specs: Sequence[TagSpec]) -> Tags:
        """`specs`, all of one period and type."""

        def column(values: list[Any], dtype: Any) -> np.ndarray:
            return np.array(values, dtype=dtype).reshape(-1, 1)

        return cls(
            tuple(specs),
            specs[0].type,
            specs[0].period_ms,
            column([s.salt for s in specs], np.uint64),
            column([s.offset for s in specs], np.float64),
            column([s.amplitude for s in specs], np.float64),
            column([s.wave_ms for s in specs], np.int64),
            column([s.irregular for s in specs], bool),
            np.array([s.duplicates for s in specs], dtype=bool),
        )


def generate_many(
    tags: Tags, lower: int, upper: int, *, history_start_ms: int
) -> tuple[np.ndarray, Samples]:
    """The stored samples of many tags with lower <= ts <= upper, as `generate` gives each
    (no late samples, no link): (the row in `tags` of each sample, the samples tag by tag,
    each tag's in time order). One pass over a (tags x samples) grid: a short range of
    10,000 tags costs a few numpy calls, not 10,000."""
    lower = max(lower, history_start_ms)
    if upper < lower or not tags.specs:
        return np.zeros(0, dtype=np.int64), _empty(tags.type)
    period = tags.period_ms
    k = np.arange(
        max(0, (lower - history_start_ms) // period - 1),
        (upper - history_start_ms) // period + 2,
        dtype=np.int64,
    )
    grid = history_start_ms + k * np.int64(period)
    ts = np.broadcast_to(grid, (len(tags.specs), len(k)))
    if tags.irregular.any():
        jitter = (mix(k, tags.salt + 1) % np.uint64(period // 2)).astype(np.int64)
        ts = ts + np.where(tags.irregular, jitter, 0)
    keep = (ts >= lower) & (ts <= upper)
    keep &= _hash_blocks(k, GAP_BLOCK, tags.salt + 2, 20) != 0
    rows, columns = np.nonzero(keep)
    quality = _quality(_hash_blocks(k, QUALITY_BLOCK, tags.salt + 3, 40)[rows, columns])
    data = _values(tags, k, ts)[rows, columns]
    ts, k = ts[rows, columns], k[columns]
    extra = np.zeros(len(ts), dtype=np.int64)
    twice = tags.duplicates[rows] & ((k % 97) == 0)
    if twice.any():
        ts, data, quality, extra, index = _doubled(ts, data, quality, twice, tags.type)
        rows = rows[index]
    return rows, Samples(ts, data, quality, extra, tags.type)


def _empty(kind: str) -> Samples:
    dtype = {"number": np.float64, "boolean": bool}.get(kind, np.int64)
    zeros = np.zeros(0, np.int64)
    return Samples(zeros, np.zeros(0, dtype), zeros, zeros, kind)


def _with_late(
    samples: Samples,
    start_ms: int,
    end_ms: int,
    late: Sequence[tuple[int, Any, int]],
    visible_until_ms: int,
    max_count: int | None = None,
) -> Samples:
    """Merge store-and-forward samples (ts, value, arrived_at) that have arrived by now.

    With `max_count`, `samples` may be the first events only: a late sample after the last
    of them may not belong to the first `max_count`, and the result is cut to that many.
    """
    last = end_ms
    if max_count is not None and len(samples) >= max_count:
        last = int(samples.ts[-1])
    extra = [
        (ts, value)
        for ts, value, arrived in late
        if start_ms <= ts <= last and arrived <= visible_until_ms
    ]
    if not extra:
        return samples
    count = len(samples)
    ts = np.concatenate([samples.ts, np.array([t for t, _ in extra], dtype=np.int64)])
    data = np.concatenate([samples.data, np.zeros(len(extra), dtype=samples.data.dtype)])
    quality = np.concatenate([samples.quality, np.full(len(extra), GOOD, dtype=np.int64)])
    extras = np.concatenate([samples.extra, np.zeros(len(extra), dtype=np.int64)])
    order = np.argsort(ts, kind="stable")
    if max_count is not None:
        order = order[:max_count]
    moved_to = np.full(len(ts), -1, dtype=np.int64)
    moved_to[order] = np.arange(len(order))
    odd = dict(samples.odd) | {count + i: value for i, (_, value) in enumerate(extra)}
    placed = {int(moved_to[i]): value for i, value in odd.items() if moved_to[i] >= 0}
    return Samples(ts[order], data[order], quality[order], extras[order], samples.kind, placed)


# -- modes -------------------------------------------------------------------------------


def raw_rows(
    samples: Samples, *, invalid_as_null: bool, limit: int | None
) -> list[tuple[Any, ...]]:
    count = len(samples) if limit is None else min(limit, len(samples))
    part = samples.slice(0, count)
    values = part.values
    if invalid_as_null:
        for index in np.flatnonzero(part.quality < GOOD).tolist():
            values[index] = None
    return list(
        zip(part.ts.tolist(), values, part.quality.tolist(), part.extra.tolist(), strict=True)
    )


def _changed(previous: Any, value: Any, deadband: float) -> bool:
    if (
        isinstance(value, float | int)
        and not isinstance(value, bool)
        and isinstance(previous, float | int)
        and not isinstance(previous, bool)
    ):
        return abs(value - previous) > deadband
    return bool(value != previous)


def _reported(samples: Samples, deadband: float) -> list[int]:
    """Indices `delta` reports: the first event, then each change beyond the deadband."""
    if not len(samples):
        return []
    values = samples.values
    chosen = [0]
    last_value = values[0]
    last_quality = int(samples.quality[0])
    qualities = samples.quality.tolist()
    for index in range(1, len(samples)):
        value = values[index]
        if qualities[index] != last_quality or _changed(last_value, value, deadband):
            chosen.append(index)
            last_value, last_quality = value, qualities[index]
    return chosen


def delta_rows(samples: Samples, deadband: float) -> list[tuple[Any, ...]]:
    return _rows_at(samples, _reported(samples, deadband))


def filter_rows(samples: Samples, deadband: float) -> list[tuple[Any, ...]]:
    """`filter`: the event before and the event after each change beyond the deadband."""
    reported = _reported(samples, deadband)
    chosen = set(reported)
    chosen.update(index - 1 for index in reported if index > 0)
    return _rows_at(samples, sorted(chosen))


def _rows_at(samples: Samples, indices: list[int]) -> list[tuple[Any, ...]]:
    at = np.array(indices, dtype=np.int64)
    return list(
        zip(
            samples.ts[at].tolist(),
            samples.pick(at),
            samples.quality[at].tolist(),
            samples.extra[at].tolist(),
            strict=True,
        )
    )


def previous_event(
    spec: TagSpec,
    before_ms: int,
    *,
    history_start_ms: int,
    visible_until_ms: int,
    late: Sequence[tuple[int, Any, int]] = (),
) -> tuple[Any, int] | None:
    """(value, quality) of the last event stamped before `before_ms`, or None.

    Searches back window by window (a gap is a block of `GAP_BLOCK` samples), so the
    answer does not depend on where a query starts.
    """
    window_end, span = _first_window(spec, before_ms, visible_until_ms, late)
    return _search_back(
        spec,
        window_end,
        span,
        history_start_ms=history_start_ms,
        visible_until_ms=visible_until_ms,
        late=late,
    )


def _first_window(
    spec: TagSpec, before_ms: int, visible_until_ms: int, late: Sequence[tuple[int, Any, int]]
) -> tuple[int, int]:
    """(end, span) of the first window `previous_event` searches: [end - span, end)."""
    newest = visible_until_ms - spec.remote_lag_ms
    newest = max([newest] + [ts for ts, _, arrived in late if arrived <= visible_until_ms])
    return min(before_ms, newest + 1), (GAP_BLOCK + 100) * spec.period_ms


def _search_back(
    spec: TagSpec,
    window_end: int,
    span: int,
    *,
    history_start_ms: int,
    visible_until_ms: int,
    late: Sequence[tuple[int, Any, int]],
) -> tuple[Any, int] | None:
    while window_end > history_start_ms:
        found = generate(
            spec,
            window_end - span,
            window_end - 1,
            history_start_ms=history_start_ms,
            visible_until_ms=visible_until_ms,
            late=late,
        )
        if len(found):
            return found.value(-1), int(found.quality[-1])
        window_end -= span
        span = _next_span(spec, span)
    return None


def _next_span(spec: TagSpec, span: int) -> int:
    return min(span * 2, 64 * GAP_BLOCK * spec.period_ms)


def aggregate(
    spec: TagSpec,
    start_ms: int,
    end_ms: int,
    interval_ms: int,
    method: str,
    *,
    history_start_ms: int,
    visible_until_ms: int,
    late: Sequence[tuple[int, Any, int]] = (),
) -> list[tuple[Any, ...]]:
    """The aggregated rows of buckets [b, b+interval), start <= b < end (`aggregated_rows`).

    Samples are generated a block of whole buckets at a time (about `BLOCK_SAMPLES`), the
    last event of a block carrying into the next, so a year of 1 s samples never sits in
    memory at once and the rows are the same as from one pass over the whole range.
    """
    buckets = _bucket_count(start_ms, end_ms, interval_ms)
    if buckets == 0:
        return []
    seen = _Seen(history_start_ms, visible_until_ms, late)
    previous = None
    lead_ms = 0  # the first block also covers the first window of the previous-event search
    if method == "avg" and spec.type != "string":
        previous, lead_ms = _avg_previous(spec, start_ms, seen)
    per_block = max(1, BLOCK_SAMPLES * spec.period_ms // interval_ms)
    rows: list[tuple[Any, ...]] = []
    for first in range(0, buckets, per_block):
        block_start = start_ms + first * interval_ms
        block_end = block_start + min(per_block, buckets - first) * interval_ms
        samples = generate(
            spec,
            block_start - lead_ms,
            block_end - 1,
            history_start_ms=history_start_ms,
            visible_until_ms=visible_until_ms,
            late=late,
        )
        if lead_ms:
            samples, previous = _without_lead(spec, samples, block_start, lead_ms, seen)
            lead_ms = 0
        rows += aggregated_rows(
            samples, block_start, block_end, interval_ms, method, spec.type, previous
        )
        if len(samples):
            previous = (samples.value(-1), int(samples.quality[-1]))
    return rows


@dataclass(frozen=True)
class _Seen:
    """What of a tag's history a query sees: from its start, up to the node's clock, with
    the late samples that have arrived."""

    history_start_ms: int
    visible_until_ms: int
    late: Sequence[tuple[int, Any, int]]

    def search_back(self, spec: TagSpec, window_end: int, span: int) -> tuple[Any, int] | None:
        return _search_back(
            spec,
            window_end,
            span,
            history_start_ms=self.history_start_ms,
            visible_until_ms=self.visible_until_ms,
            late=self.late,
        )


def _avg_previous(spec: TagSpec, start_ms: int, seen: _Seen) -> tuple[tuple[Any, int] | None, int]:
    """The event before `start` that `avg` carries into the first bucket, or (None, lead)
    when the first block is to be generated `lead` ms early to find it there."""
    window_end, span = _first_window(spec, start_ms, seen.visible_until_ms, seen.late)
    if window_end == start_ms and window_end > seen.history_start_ms:
        return None, span
    return seen.search_back(spec, window_end, span), 0


def _without_lead(
    spec: TagSpec, samples: Samples, block_start: int, lead_ms: int, seen: _Seen
) -> tuple[Samples, tuple[Any, int] | None]:
    """The first block's samples from `block_start` on, and the last event before it (from
    the lead, else searched further back)."""
    before = int(np.searchsorted(samples.ts, block_start, side="left"))
    previous: tuple[Any, int] | None
    if before:
        previous = (samples.value(before - 1), int(samples.quality[before - 1]))
    else:
        previous = seen.search_back(spec, block_start - lead_ms, _next_span(spec, lead_ms))
    return samples.slice(before, len(samples)), previous


def _bucket_count(start_ms: int, end_ms: int, interval_ms: int) -> int:
    return max(0, -((start_ms - end_ms) // interval_ms))


def aggregated_rows(
    samples: Samples,
    start_ms: int,
    end_ms: int,
    interval_ms: int,
    method: str,
    tag_type: str,
    previous: tuple[Any, int] | None = None,
) -> list[tuple[Any, ...]]:
    """One row per bucket [b, b+interval) with b = start + n*interval and start <= b < end.

    `samples` covers [start, end + interval); `previous` is the (value, quality) of the last
    event before `start`. Only good-quality events count. `avg` is time-weighted: each
    value holds from its event to the next event (also across a bucket boundary, so the
    start of a bucket carries the previous event's value); time after a non-good event
    does not count. `min`/`max`/`first`/`last`/`delta` (last - first)/`stddev`
    (population) use the good events inside the bucket. A bucket without a good event is
    `[b, null, 0, 0]`. Booleans count as 0/1 (`first`/`last` stay booleans); strings
    have `first` and `last` only.

    All buckets at once: each bucket's events are one run of the arrays (searchsorted),
    and each result is computed with the same floating-point operations in the same order
    as numpy does for that bucket alone (sums and extremes of equal-length runs reduced
    along rows, which numpy reduces exactly as each run on its own), then rounded to 6
    decimals exactly as `round(value, 6)`.
    """
    count = _bucket_count(start_ms, end_ms, interval_ms)
    if count == 0:
        return []
    buckets = _Buckets.of(samples, start_ms + interval_ms * np.arange(count + 1, dtype=np.int64))
    results: list[Any]
    if method in ("first", "last"):
        results = _first_or_last(buckets, method, tag_type)
    elif tag_type == "string":
        results = [None] * len(buckets.starts)
    else:
        results = _round6(_numeric(buckets, method, previous)).tolist()
    values: list[Any]
    has = buckets.has
    quality = np.where(has, GOOD, 0)
    if has.all():
        values = results
    else:
        spread = np.full(count, None, dtype=object)
        spread[has] = np.array(results, dtype=object)  # keeps the Python objects
        values = spread.tolist()
    if (method in ("first", "last") or tag_type == "string") and None in results:
        quality[[i for i, v in enumerate(values) if v is None]] = 0
    bounds = buckets.bounds
    return list(zip(bounds[:-1].tolist(), values, quality.tolist(), repeat(0), strict=False))


@dataclass(frozen=True)
class _Buckets:
    """Buckets [bounds[i], bounds[i+1]) over `part`, the samples inside them: the events of
    bucket i are `lo[i]:hi[i]` of `part`; the good events of each bucket that `has` one are
    one run `starts[j]:starts[j]+lengths[j]` of `good_at` (searchsorted, no loop)."""

    bounds: np.ndarray
    part: Samples
    lo: np.ndarray
    hi: np.ndarray
    good: np.ndarray
    has: np.ndarray
    good_at: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, samples: Samples, bounds: np.ndarray) -> _Buckets:
        edges = np.searchsorted(samples.ts, bounds, side="left")
        part = samples.slice(int(edges[0]), int(edges[-1]))
        lo = edges[:-1] - edges[0]
        hi = edges[1:] - edges[0]
        good = part.quality >= GOOD
        good_before = np.zeros(len(part) + 1, dtype=np.int64)
        np.cumsum(good, out=good_before[1:])
        good_first = good_before[lo]
        good_count = good_before[hi] - good_first
        has = good_count > 0
        good_at = np.flatnonzero(good)
        starts, lengths = good_first[has], good_count[has]
        return cls(bounds, part, lo, hi, good, has, good_at, starts, lengths)

    def first_good(self) -> np.ndarray:
        return np.asarray(self.good_at[self.starts])

    def last_good(self) -> np.ndarray:
        return np.asarray(self.good_at[self.starts + self.lengths - 1])


def _first_or_last(buckets: _Buckets, method: str, tag_type: str) -> list[Any]:
    """The first or last good value of each bucket holding one, as the node rounds it."""
    part = buckets.part
    picked = buckets.first_good() if method == "first" else buckets.last_good()
    if tag_type == "number" and part.kind == "number" and not part.odd:
        return list(_round6(part.data[picked]).tolist())
    if tag_type != "string" and part.odd:
        part.numbers()  # a value that is not a number fails here, as it always did
    return [round(v, 6) if isinstance(v, float) else v for v in part.pick(picked)]


def _numeric(buckets: _Buckets, method: str, previous: tuple[Any, int] | None) -> np.ndarray:
    """min, max, delta, stddev or the time-weighted avg of each bucket holding a good value
    (booleans as 0/1), before rounding."""
    b = buckets
    numbers, missing = b.part.numbers()
    with np.errstate(all="ignore"):
        if method in ("min", "max"):
            return _runs(numbers[b.good_at], b.starts, b.lengths, method)
        if method == "delta":
            return np.asarray(numbers[b.last_good()] - numbers[b.first_good()])
        if method == "stddev":
            return _stddev(numbers[b.good_at], b.starts, b.lengths)
        found = _time_weighted(
            b.part, numbers, missing, b.good, b.has, b.lo, b.hi, b.bounds, previous
        )
        return np.asarray(found[b.has])


def _runs(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray, how: str) -> np.ndarray:
    """`values[s:s+n].<how>()` for each run (n >= 1), as numpy computes it for that run.

    The runs are disjoint and in order. Runs of equal length are taken as the rows of one
    2-D array (a view when they follow each other) and reduced along axis 1, which numpy
    does with the same inner loop (the same pairwise summation order) as a 1-D reduction
    of each. (Not so along the last axis of a 3-D array: its order differs.)
    """
    out = np.empty(len(starts), dtype=np.float64)
    if not len(starts):
        return out
    groups: list[slice | np.ndarray]
    if int(lengths.min()) == int(lengths.max()):
        groups = [slice(None)]
    else:
        order = np.argsort(lengths, kind="stable")
        groups = list(np.split(order, np.flatnonzero(np.diff(lengths[order])) + 1))
    for group in groups:
        first, last = starts[group][[0, -1]].tolist()
        n = int(lengths[group][0])
        count = len(starts[group])
        if last - first == n * (count - 1):  # disjoint runs in order: they follow each other
            rows = values[first : first + n * count].reshape(count, n)
        else:
            rows = values[starts[group][:, None] + np.arange(n)]
        out[group] = getattr(rows, how)(axis=1)
    return out


def _stddev(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Population standard deviation of each run, step for step as `np.std` (runs tile
    `values`)."""
    means = _runs(values, starts, lengths, "sum") / lengths
    deviations = values - np.repeat(means, lengths)
    squares = deviations * deviations
    deviation: np.ndarray = np.sqrt(_runs(squares, starts, lengths, "sum") / lengths)
    return deviation


def _time_weighted(
    part: Samples,
    numbers: np.ndarray,
    missing: np.ndarray,
    good: np.ndarray,
    has: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    bounds: np.ndarray,
    previous: tuple[Any, int] | None,
) -> np.ndarray:
    """Time-weighted mean over each bucket [bounds[i], bounds[i+1]) of the held good values.

    Each event holds until the next event in its bucket (the last one until the bucket's
    end); the bucket's lead, before its first event, holds the last event before it
    (from an earlier bucket, else `previous`) if that one is good and not null. A bucket
    whose good events hold no time at all (and has no lead) is the plain mean of them.
    """
    ts = part.ts
    ends = np.empty_like(ts)
    ends[:-1] = ts[1:]
    filled = hi > lo
    ends[hi[filled] - 1] = bounds[1:][filled]
    weights = np.where(good, (ends - ts).astype(np.float64), 0.0)
    terms = np.where(weights > 0, numbers * weights, 0.0)
    total = np.zeros(len(lo))
    weighted = np.zeros(len(lo))
    total[filled] = _runs(weights, lo[filled], hi[filled] - lo[filled], "sum")
    weighted[filled] = _runs(terms, lo[filled], hi[filled] - lo[filled], "sum")
    # The lead of each bucket, carried by the event before it.
    lead = np.zeros(len(lo))
    lead[filled] = (ts[lo[filled]] - bounds[:-1][filled]).astype(np.float64)
    before = lo - 1
    inside = before >= 0
    carries = np.zeros(len(lo), dtype=bool)
    carried = np.zeros(len(lo))
    carries[inside] = (part.quality[before[inside]] >= GOOD) & ~missing[before[inside]]
    carried[inside] = numbers[before[inside]]
    if previous is not None and previous[1] >= GOOD and previous[0] is not None:
        carries[~inside] = True
        carried[~inside] = float(previous[0])
    lead_counts = carries & (lead > 0)
    total = np.where(lead_counts, total + lead, total)
    weighted = np.where(lead_counts, weighted + carried * lead, weighted)
    result = weighted / total
    for bucket in np.flatnonzero(has & (total <= 0)).tolist():
        run = slice(int(lo[bucket]), int(hi[bucket]))
        result[bucket] = float(numbers[run][good[run]].mean())
    return result


def _round6(values: np.ndarray) -> np.ndarray:
    """`round(v, 6)` of each value, vectorised.

    rint(v * 1e6) / 1e6 is exactly Python's correctly rounded result wherever v * 1e6 is
    not within a few ulps of a half (the same integer is picked, and both divide it by
    10**6 correctly rounded); those rare values, and |v| >= 1e6, NaN and inf, go through
    `round` itself.
    """
    with np.errstate(all="ignore"):
        scaled = values * 1e6
        out = np.rint(scaled) / 1e6
        half = np.abs(np.abs(scaled - np.trunc(scaled)) - 0.5)
        sure = (half > 8 * np.spacing(np.abs(scaled))) & (np.abs(values) < 1e6)
    for index in np.flatnonzero(~sure).tolist():
        out[index] = round(float(values[index]), 6)
    return out


# Behaviours that change how rows are written on the wire, not what the node holds: the
# ground truth stays in epoch ms, buckets stamped at their start, numbers as numbers.
WIRE_BEHAVIOURS = frozenset(
    {"rows_epoch_seconds", "rows_epoch_micros", "rows_iso", "buckets_at_end", "numbers_as_strings"}
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_of_ms(ts_ms: int) -> str:
    """Epoch ms as ISO 8601 UTC text with milliseconds and `Z` (the `rows_iso` behaviour)."""
    moment = _EPOCH + timedelta(milliseconds=ts_ms)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def wire_rows(
    rows: list[tuple[Any, ...]],
    behaviours: frozenset[str],
    *,
    number_tag: bool,
    bucket_ms: int | None,
) -> list[tuple[Any, ...]]:
    """`rows` as a node of `behaviours` writes them: stamps in epoch seconds
    (`rows_epoch_seconds`) or ISO 8601 text (`rows_iso`), aggregated buckets stamped at
    their end (`buckets_at_end`, `bucket_ms` the interval of an aggregated answer), values
    of a number tag as strings (`numbers_as_strings`). Unchanged for other nodes."""
    if not rows or behaviours.isdisjoint(WIRE_BEHAVIOURS):
        return rows
    shift = bucket_ms if bucket_ms is not None and "buckets_at_end" in behaviours else 0
    as_text = number_tag and "numbers_as_strings" in behaviours
    seconds = "rows_epoch_seconds" in behaviours
    micros = "rows_epoch_micros" in behaviours
    iso = "rows_iso" in behaviours
    out: list[tuple[Any, ...]] = []
    for ts, value, *rest in rows:
        stamp: Any = ts + shift
        if seconds:
            stamp = stamp / 1000
        elif micros:
            stamp = stamp * 1000
        elif iso:
            stamp = iso_of_ms(stamp)
        if as_text and type(value) in (int, float):
            value = repr(value)
        out.append((stamp, value, *rest))
    return out
