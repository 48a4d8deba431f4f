"""The simulator's array-based history against the loop it replaced, kept here as reference.

`reference_*` is the former `connectors/simulator/history.py` (samples as Python lists,
one bucket at a time), verbatim but for names. The node must give the very same samples
and the very same aggregated rows (same values, types and signs after rounding to 6
decimals), over many tags, ranges, intervals and methods, with gaps, bad-quality
stretches, duplicates, late samples (nulls too), booleans and strings, and whatever way
a long range is cut into blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.options import METHODS, HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, history
from connectors.simulator.tagtree import STATES, TagSpec, build_tags, mix

NOW = 1_780_000_000_000  # 2026-05-28
HOUR = 3_600_000
HISTORY_START = SimConfig().history_start_ms
GOOD = 192

# -- the reference: the former history.py -----------------------------------------------


@dataclass
class RefSamples:
    ts: np.ndarray
    values: list[Any]
    quality: np.ndarray
    extra: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)


def reference_values(spec: TagSpec, k: np.ndarray, ts: np.ndarray) -> list[Any]:
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


def reference_stored(
    spec: TagSpec, lower: int, upper: int, history_start_ms: int, first_k: int, last_k: int
) -> tuple[np.ndarray, np.ndarray]:
    k = np.arange(first_k, last_k + 1, dtype=np.int64)
    ts = history_start_ms + k * spec.period_ms
    if spec.irregular:
        ts = ts + (mix(k, spec.salt + 1) % np.uint64(spec.period_ms // 2)).astype(np.int64)
    keep = (ts >= lower) & (ts <= upper)
    keep &= (mix(k // 600, spec.salt + 2) % np.uint64(20)) != 0
    return k[keep], ts[keep]


def reference_generate(
    spec: TagSpec,
    start_ms: int,
    end_ms: int,
    *,
    visible_until_ms: int,
    late: Sequence[tuple[int, Any, int]] = (),
    max_count: int | None = None,
    history_start_ms: int = HISTORY_START,
) -> RefSamples:
    upper = min(end_ms, visible_until_ms - spec.remote_lag_ms)
    lower = max(start_ms, history_start_ms)
    if upper < lower:
        empty = RefSamples(np.zeros(0, np.int64), [], np.zeros(0, np.int64), np.zeros(0, np.int64))
        return reference_with_late(empty, start_ms, end_ms, late, visible_until_ms, max_count)
    period = spec.period_ms
    k_first = max(0, (lower - history_start_ms) // period - 1)
    k_last = (upper - history_start_ms) // period + 1
    if max_count is None:
        k, ts = reference_stored(spec, lower, upper, history_start_ms, k_first, k_last)
    else:
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        found = 0
        step = max(4 * 600, 2 * max_count)
        while k_first <= k_last and found < max_count:
            block_last = min(k_last, k_first + step - 1)
            part = reference_stored(spec, lower, upper, history_start_ms, k_first, block_last)
            parts.append(part)
            found += len(part[0])
            k_first = block_last + 1
        k = np.concatenate([p[0] for p in parts])[:max_count]
        ts = np.concatenate([p[1] for p in parts])[:max_count]
    block = mix(k // 50, spec.salt + 3) % np.uint64(40)
    quality = np.full(len(k), GOOD, dtype=np.int64)
    quality[block == 0] = 0
    quality[block == 1] = 64
    extra = np.zeros(len(k), dtype=np.int64)
    values = reference_values(spec, k, ts)
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
    samples = RefSamples(ts, values, quality, extra)
    return reference_with_late(samples, start_ms, end_ms, late, visible_until_ms, max_count)


def reference_with_late(
    samples: RefSamples,
    start_ms: int,
    end_ms: int,
    late: Sequence[tuple[int, Any, int]],
    visible_until_ms: int,
    max_count: int | None = None,
) -> RefSamples:
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
    return RefSamples(ts[order], [values[i] for i in order.tolist()], quality[order], extras[order])


def reference_previous_event(
    spec: TagSpec, before_ms: int, *, visible_until_ms: int, late: Sequence[Any] = ()
) -> tuple[Any, int] | None:
    newest = visible_until_ms - spec.remote_lag_ms
    newest = max([newest] + [ts for ts, _, arrived in late if arrived <= visible_until_ms])
    window_end = min(before_ms, newest + 1)
    span = (600 + 100) * spec.period_ms
    while window_end > HISTORY_START:
        found = reference_generate(
            spec, window_end - span, window_end - 1, visible_until_ms=visible_until_ms, late=late
        )
        if len(found):
            return found.values[-1], int(found.quality[-1])
        window_end -= span
        span = min(span * 2, 64 * 600 * spec.period_ms)
    return None


def reference_aggregated_rows(
    samples: RefSamples,
    start_ms: int,
    end_ms: int,
    interval_ms: int,
    method: str,
    tag_type: str,
    previous: tuple[Any, int] | None = None,
) -> list[tuple[Any, ...]]:
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
                    result = reference_time_weighted(
                        ts_all, numbers, good_all, lo, hi, bucket, upper, previous
                    )
            if isinstance(result, float):
                result = round(result, 6)
            rows.append((bucket, result, GOOD if result is not None else 0, 0))
        if hi > lo:
            previous = (samples.values[hi - 1], int(samples.quality[hi - 1]))
        bucket = upper
    return rows


def reference_time_weighted(
    ts_all: np.ndarray,
    numbers: np.ndarray,
    good_all: np.ndarray,
    lo: int,
    hi: int,
    bucket: int,
    upper: int,
    previous: tuple[Any, int] | None,
) -> float:
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


def reference_aggregated(
    spec: TagSpec,
    start: int,
    end: int,
    interval: int,
    method: str,
    late: Sequence[tuple[int, Any, int]],
    now: int = NOW,
) -> list[tuple[Any, ...]]:
    """What the former node answered (node.history_rows, aggregated branch)."""
    samples = reference_generate(spec, start, end + interval - 1, visible_until_ms=now, late=late)
    previous = None
    if method == "avg" and spec.type != "string":
        previous = reference_previous_event(spec, start, visible_until_ms=now, late=late)
    return reference_aggregated_rows(samples, start, end, interval, method, spec.type, previous)


# -- helpers ---------------------------------------------------------------------------


def strict(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Rows with every value as (type, repr): 1 and 1.0, 0.0 and -0.0, nan all differ."""
    return [tuple((type(v).__name__, repr(v)) for v in row) for row in rows]


def specs(seed: int, count: int = 30, period_ms: int | None = None) -> list[TagSpec]:
    return build_tags(seed, count, False, period_ms)


def late_samples(
    rng: np.random.Generator, spec: TagSpec, start: int, end: int, count: int
) -> list[tuple[int, Any, int]]:
    """Late samples of every kind for `spec`: on bucket-like round stamps, on stamps of
    generated samples, anywhere; nulls and (for numbers) ints and odd floats."""
    late: list[tuple[int, Any, int]] = []
    for _ in range(count):
        where = int(rng.integers(0, 3))
        if where == 0:
            ts = start + int(rng.integers(0, max(1, (end - start) // 60_000))) * 60_000
        elif where == 1:
            ts = (
                start
                + int(rng.integers(0, max(1, (end - start) // spec.period_ms))) * spec.period_ms
            )
        else:
            ts = int(rng.integers(start - HOUR, end + HOUR))
        pick = int(rng.integers(0, 5))
        value: Any
        if pick == 0:
            value = None
        elif spec.type == "string":
            value = STATES[pick % len(STATES)] if pick < 3 else 'late, "string"'
        elif spec.type == "boolean":
            value = bool(pick % 2)
        else:
            value = [1234.5, 7, -0.0000004, 3.14159265358979][pick - 1]
        arrived = NOW - int(rng.integers(-HOUR, HOUR))  # some not arrived yet
        late.append((ts, value, arrived))
    return late


# -- tests -----------------------------------------------------------------------------


@pytest.mark.parametrize(("seed", "period_ms"), [(5, None), (11, None), (5, 1000), (8, 60_000)])
def test_samples_are_the_same_as_the_reference_generator(seed: int, period_ms: int | None) -> None:
    rng = np.random.default_rng(seed)
    for spec in specs(seed, 25, period_ms):
        start = NOW - int(rng.integers(1, 400)) * HOUR + int(rng.integers(0, 3_600_000))
        end = start + int(rng.integers(0, 8 * HOUR))
        late = late_samples(rng, spec, start, end, int(rng.integers(0, 6)))
        max_count = None if rng.integers(0, 2) else int(rng.integers(1, 20_000))
        new = history.generate(
            spec,
            start,
            end,
            history_start_ms=HISTORY_START,
            visible_until_ms=NOW,
            late=late,
            max_count=max_count,
        )
        old = reference_generate(
            spec, start, end, visible_until_ms=NOW, late=late, max_count=max_count
        )
        assert new.ts.tolist() == old.ts.tolist()
        assert strict([new.values]) == strict([old.values])
        assert new.quality.tolist() == old.quality.tolist()
        assert new.extra.tolist() == old.extra.tolist()
        if len(old):
            assert strict([[new.value(-1)]]) == strict([[old.values[-1]]])
        for mode in ("delta", "filter"):
            rows = history.delta_rows if mode == "delta" else history.filter_rows
            assert len(rows(new, spec.deadband)) <= len(new)


def check_aggregates(
    spec: TagSpec,
    start: int,
    end: int,
    interval: int,
    method: str,
    late: Sequence[tuple[int, Any, int]],
    block_samples: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(history, "BLOCK_SAMPLES", block_samples)
    new = history.aggregate(
        spec,
        start,
        end,
        interval,
        method,
        history_start_ms=HISTORY_START,
        visible_until_ms=NOW,
        late=late,
    )
    old = reference_aggregated(spec, start, end, interval, method, late)
    assert strict(new) == strict(old), (spec, start, end, interval, method, late)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("seed", "period_ms"), [(3, None), (5, None), (7, 1000), (9, 60_000)])
def test_aggregated_rows_are_the_same_as_the_reference_loop(
    method: str, seed: int, period_ms: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng([seed, METHODS.index(method)])
    intervals = (1_000, 7_000, 60_000, 300_000, 900_000, 3_600_000)
    for spec in specs(seed, 20, period_ms):
        interval = int(rng.choice(intervals))
        start = NOW - int(rng.integers(1, 200)) * HOUR - int(rng.integers(0, interval))
        span = min(interval * int(rng.integers(0, 400)), 8 * HOUR)
        end = start + span + int(rng.integers(0, 2)) * int(rng.integers(1, interval + 1))
        late = late_samples(rng, spec, start, end, int(rng.integers(0, 8)))
        block = int(rng.choice([1, 5_000, 1 << 18]))
        check_aggregates(spec, start, end, interval, method, late, block, monkeypatch)


def test_aggregates_where_history_begins_and_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buckets before the first sample, across the start of history, and up to now (and
    past it: a tag over a link is not visible yet)."""
    for spec in specs(13, 20):
        for method in ("avg", "first", "min", "stddev"):
            for start, end in (
                (HISTORY_START - 2 * HOUR, HISTORY_START + HOUR),
                (NOW - HOUR, NOW + HOUR),
            ):
                check_aggregates(spec, start, end, 300_000, method, (), 1000, monkeypatch)


@pytest.mark.parametrize("method", METHODS)
def test_hand_made_samples_aggregate_as_the_reference(method: str) -> None:
    """Cases the generator seldom makes: good events that hold no time (a non-good event
    on the same millisecond, no lead: `avg` is their plain mean), signed zeros, NaN,
    a null event, an int, a bucket of bad events only, empty buckets."""
    t = NOW - 10 * HOUR
    ts = [t, t, t + 4_000, t + 10_000, t + 10_000, t + 12_000, t + 25_000, t + 31_000]
    values: list[Any] = [10.0, 11.0, -0.0, 0.0, -0.0, math.nan, None, 7]
    quality = [GOOD, 0, 0, GOOD, GOOD, GOOD, GOOD, 64]
    reference = RefSamples(
        np.array(ts, dtype=np.int64), values, np.array(quality), np.zeros(len(ts), np.int64)
    )
    data = np.array([0.0 if v is None else float(v) for v in values])
    odd = {6: None, 7: 7}
    samples = history.Samples(reference.ts, data, reference.quality, reference.extra, "number", odd)
    for previous in (None, (5.5, GOOD), (None, GOOD), (3.0, 0)):
        for start in (t - 10_000, t):
            new = history.aggregated_rows(
                samples, start, t + 40_000, 10_000, method, "number", previous
            )
            old = reference_aggregated_rows(
                reference, start, t + 40_000, 10_000, method, "number", previous
            )
            assert strict(new) == strict(old)
    # the first bucket [t, t + 10 s) with no lead: 10.0 holds no time, the mean is 10.0
    first = history.aggregated_rows(samples, t, t + 10_000, 10_000, "avg", "number", None)
    assert first == [(t, 10.0, GOOD, 0)]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 50),
    index=st.integers(0, 29),
    method=st.sampled_from(METHODS),
    interval=st.integers(1, 3_000_000),
    offset=st.integers(0, 400 * HOUR),
    buckets=st.integers(0, 300),
    block=st.sampled_from([1, 3, 1000, 1 << 18]),
    late_count=st.integers(0, 5),
)
def test_aggregated_rows_match_the_reference_anywhere(
    seed: int,
    index: int,
    method: str,
    interval: int,
    offset: int,
    buckets: int,
    block: int,
    late_count: int,
) -> None:
    spec = specs(seed)[index]
    start = NOW - offset
    end = start + min(buckets * interval, 12 * HOUR)
    late = late_samples(np.random.default_rng(seed), spec, start, end, late_count)
    with pytest.MonkeyPatch.context() as patch:
        check_aggregates(spec, start, end, interval, method, late, block, patch)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(-1e7, 1e7),
        st.integers(-(10**12), 10**12).map(lambda n: (n + 0.5) / 1e6),
        st.integers(-(10**9), 10**9).map(lambda n: n / 1e3 + 0.0000005),
    )
)
def test_rounding_to_6_decimals_is_pythons_round(value: float) -> None:
    rounded = history._round6(np.array([value, value], dtype=np.float64))
    assert strict([rounded.tolist()]) == strict([[round(value, 6)] * 2])


def test_node_answers_aggregates_of_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the node (as the wire answers): late samples added by the test API count."""
    node = SimulatedNode(SimConfig(seed=6, tags=20))
    node.set_clock(NOW)
    start, end = NOW - 30 * HOUR, NOW - 20 * HOUR
    spec = node.tree().by_path[node.tag_paths()[0]]
    node.add_late_sample(spec.path, start + 90_000, 99.5)
    late = [(start + 90_000, 99.5, NOW)]
    monkeypatch.setattr(history, "BLOCK_SAMPLES", 2_000)
    for method in METHODS:
        options = HistoryOptions(mode="aggregated", method=method, interval_ms=900_000)
        rows = node.ground_truth(spec.path, start, end, options)
        expected = reference_aggregated(spec, start, end, 900_000, method, late)
        assert strict(rows) == strict([list(row) for row in expected])


def test_one_period_for_every_tag_keeps_gaps_quality_and_duplicates() -> None:
    """`period_ms`: every tag regular on that grid, the rest of its behaviour unchanged."""
    node = SimulatedNode(SimConfig(seed=7, tags=30, period_ms=1000))
    mixed = SimulatedNode(SimConfig(seed=7, tags=30))
    for n in (node, mixed):
        n.set_clock(NOW)
    options = HistoryOptions(mode="raw", invalid_as_null=False)
    start, end = NOW - 30 * HOUR, NOW - 27 * HOUR
    seen_gap = seen_bad = seen_duplicate = False
    for path in node.tag_paths():
        spec, before = node.tree().by_path[path], mixed.tree().by_path[path]
        assert spec.period_ms == 1000
        assert not spec.irregular
        assert (spec.type, spec.duplicates, spec.remote_lag_ms) == (
            before.type,
            before.duplicates,
            before.remote_lag_ms,
        )
        rows = node.ground_truth(path, start, end, options)
        stamps = np.array([row[0] for row in rows])
        assert np.all((stamps - HISTORY_START) % 1000 == 0)
        steps = np.diff(stamps)
        seen_gap |= bool((steps > 1000).any())
        seen_duplicate |= bool((steps == 0).any())
        seen_bad |= any(row[2] < GOOD for row in rows)
        assert len(rows) > 0.8 * (end - start) / 1000
    assert seen_gap
    assert seen_bad
    assert seen_duplicate
    remote = node.tree("sim-remote").specs
    assert {s.period_ms for s in remote} == {1000}


@pytest.mark.parametrize("period_ms", [0, -5, 86_400_001])
def test_a_period_out_of_range_is_refused(period_ms: int) -> None:
    with pytest.raises(ValueError, match="period_ms"):
        SimConfig(period_ms=period_ms)
