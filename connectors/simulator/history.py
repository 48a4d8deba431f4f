"""Deterministic tag history on demand, and the Historian's four modes over it.

Sample k of a tag is stamped `history_start + k*period (+ jitter < period/2 for irregular
tags)`, so the samples of any range come from a closed form, vectorised with numpy.
Gaps (blocks of 600 samples missing, about 5%), bad (0) and uncertain (64) quality
stretches, duplicate events on one millisecond (every 97th sample of some tags) and late
samples (tags over a link, and samples added with `add_late_sample`) are all part of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from connectors.simulator.tagtree import STATES, TagSpec, mix

GOOD = 192
UNCERTAIN = 64
BAD = 0
GAP_BLOCK = 600
QUALITY_BLOCK = 50


@dataclass
class Samples:
    """Every stored event of one tag in a range, in time order (values as Python objects)."""

    ts: np.ndarray  # int64 epoch ms
    values: list[Any]  # float | bool | str
    quality: np.ndarray  # int64
    extra: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.ts)

    def slice(self, start: int, stop: int) -> Samples:
        return Samples(
            self.ts[start:stop],
            self.values[start:stop],
            self.quality[start:stop],
            self.extra[start:stop],
        )


def _values(spec: TagSpec, k: np.ndarray, ts: np.ndarray) -> list[Any]:
    if spec.type == "number":
        noise = (mix(k, spec.salt + 5) % np.uint64(1000)).astype(np.float64) / 1000.0 - 0.5
        wave = np.sin(2 * math.pi * ts.astype(np.float64) / spec.wave_ms)
        numbers: list[Any] = np.round(spec.offset + spec.amplitude * wave + noise, 3).tolist()
        return numbers
    if spec.type == "boolean":
        flags: list[Any] = ((mix(k // np.int64(30), spec.salt + 6) & np.uint64(1)) == 1).tolist()
        return flags
    picks = (mix(k // np.int64(40), spec.salt + 7) % np.uint64(len(STATES))).astype(np.int64)
    return [STATES[p] for p in picks.tolist()]


def _stored(
    spec: TagSpec, lower: int, upper: int, history_start_ms: int, first_k: int, last_k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Indices k in [first_k, last_k] and stamps of the stored samples in [lower, upper]."""
    k = np.arange(first_k, last_k + 1, dtype=np.int64)
    ts = history_start_ms + k * spec.period_ms
    if spec.irregular:
        ts = ts + (mix(k, spec.salt + 1) % np.uint64(spec.period_ms // 2)).astype(np.int64)
    keep = (ts >= lower) & (ts <= upper)
    # Gaps: whole blocks of samples that the node never stored.
    keep &= (mix(k // GAP_BLOCK, spec.salt + 2) % np.uint64(20)) != 0
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
        return _with_late(_empty(), spec, start_ms, end_ms, late, visible_until_ms, max_count)
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
    block = mix(k // QUALITY_BLOCK, spec.salt + 3) % np.uint64(40)
    quality = np.full(len(k), GOOD, dtype=np.int64)
    quality[block == 0] = BAD
    quality[block == 1] = UNCERTAIN
    extra = np.zeros(len(k), dtype=np.int64)
    values = _values(spec, k, ts)
    if spec.duplicates and len(k):
        twice = (k % 97) == 0
        if twice.any():
            counts = np.where(twice, 2, 1)
            ts = np.repeat(ts, counts)
            quality = np.repeat(quality, counts)
            extra = np.repeat(extra, counts)
            dup_index = np.repeat(np.arange(len(k)), counts)
            second = np.zeros(len(ts), dtype=bool)
            second[1:] = dup_index[1:] == dup_index[:-1]
            extra[second] = 1
            values = [values[i] for i in dup_index.tolist()]
            if spec.type == "number":
                for position in np.flatnonzero(second).tolist():
                    values[position] = round(values[position] + 0.125, 3)
    samples = Samples(ts, values, quality, extra)
    return _with_late(samples, spec, start_ms, end_ms, late, visible_until_ms, max_count)


def _empty() -> Samples:
    return Samples(np.zeros(0, np.int64), [], np.zeros(0, np.int64), np.zeros(0, np.int64))


def _with_late(
    samples: Samples,
    spec: TagSpec,
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
    ts = np.concatenate([samples.ts, np.array([t for t, _ in extra], dtype=np.int64)])
    values = samples.values + [v for _, v in extra]
    quality = np.concatenate([samples.quality, np.full(len(extra), GOOD, dtype=np.int64)])
    extras = np.concatenate([samples.extra, np.zeros(len(extra), dtype=np.int64)])
    order = np.argsort(ts, kind="stable")
    if max_count is not None:
        order = order[:max_count]
    return Samples(ts[order], [values[i] for i in order.tolist()], quality[order], extras[order])


# -- modes -------------------------------------------------------------------------------


def raw_rows(
    samples: Samples, *, invalid_as_null: bool, limit: int | None
) -> list[tuple[Any, ...]]:
    count = len(samples) if limit is None else min(limit, len(samples))
    part = samples.slice(0, count)
    values = list(part.values)
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
    chosen = [0]
    last_value = samples.values[0]
    last_quality = int(samples.quality[0])
    qualities = samples.quality.tolist()
    for index in range(1, len(samples)):
        value = samples.values[index]
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
    ts = samples.ts.tolist()
    quality = samples.quality.tolist()
    extra = samples.extra.tolist()
    return [(ts[i], samples.values[i], quality[i], extra[i]) for i in indices]


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
    newest = visible_until_ms - spec.remote_lag_ms
    newest = max([newest] + [ts for ts, _, arrived in late if arrived <= visible_until_ms])
    window_end = min(before_ms, newest + 1)
    span = (GAP_BLOCK + 100) * spec.period_ms
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
            return found.values[-1], int(found.quality[-1])
        window_end -= span
        span = min(span * 2, 64 * GAP_BLOCK * spec.period_ms)
    return None


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
    """
    ts_all = samples.ts
    good_all = samples.quality >= GOOD
    numeric = tag_type != "string"
    if numeric:
        as_float = [float(v) if v is not None else math.nan for v in samples.values]
        numbers = np.asarray(as_float, dtype=np.float64)
    rows: list[tuple[Any, ...]] = []
    bucket = start_ms
    while bucket < end_ms:
        upper = bucket + interval_ms
        lo = int(np.searchsorted(ts_all, bucket, side="left"))
        hi = int(np.searchsorted(ts_all, upper, side="left"))
        good = np.flatnonzero(good_all[lo:hi]) + lo
        if not len(good):
            rows.append((bucket, None, 0, 0))
        else:
            first, last = int(good[0]), int(good[-1])
            result: Any = None
            if method == "first":
                result = samples.values[first]
            elif method == "last":
                result = samples.values[last]
            elif numeric:
                values = numbers[good]
                if method == "min":
                    result = float(values.min())
                elif method == "max":
                    result = float(values.max())
                elif method == "delta":
                    result = float(numbers[last] - numbers[first])
                elif method == "stddev":
                    result = float(values.std())
                else:
                    result = _time_weighted(
                        ts_all, numbers, good_all, lo, hi, bucket, upper, previous
                    )
            if isinstance(result, float):
                result = round(result, 6)
            rows.append((bucket, result, GOOD if result is not None else 0, 0))
        if hi > lo:
            previous = (samples.values[hi - 1], int(samples.quality[hi - 1]))
        bucket = upper
    return rows


def _time_weighted(
    ts_all: np.ndarray,
    numbers: np.ndarray,
    good_all: np.ndarray,
    lo: int,
    hi: int,
    bucket: int,
    upper: int,
    previous: tuple[Any, int] | None,
) -> float:
    """Time-weighted mean over [bucket, upper) of the held good values."""
    ts = ts_all[lo:hi]
    ends = np.append(ts[1:], upper)
    weights = np.where(good_all[lo:hi], (ends - ts).astype(np.float64), 0.0)
    total = float(weights.sum())
    weighted = float(np.where(weights > 0, numbers[lo:hi] * weights, 0.0).sum())
    if previous is not None and previous[1] >= GOOD and previous[0] is not None:
        lead = float(ts[0] - bucket)
        if lead > 0:
            total += lead
            weighted += float(previous[0]) * lead
    if total <= 0:
        return float(numbers[lo:hi][good_all[lo:hi]].mean())
    return weighted / total
