"""Pure planning: durations, UTC-grid windows, tag batches, chunk ids.

Windows sit on a UTC grid of their size (epoch multiples), so a re-run, a resumed
backfill and an incremental run all cut time the same way and produce the same chunk
ids. Aggregated spans are widened to whole buckets of `interval`, so 15-minute averages
land on :00, :15, :30, :45 whatever the run's start time.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote

import orjson

from connectors.timewindow import EPOCH, Window, iso_utc

_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
NICE_SIZES = [
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=15),
    timedelta(minutes=30),
    timedelta(hours=1),
    timedelta(hours=2),
    timedelta(hours=6),
    timedelta(hours=12),
    timedelta(days=1),
    timedelta(days=7),
    timedelta(days=31),
]


def parse_duration(text: str | int | float | timedelta) -> timedelta:
    """`15m`, `1h`, `1d`, `90s`, `2w`, `500ms`, or a number of seconds."""
    if isinstance(text, timedelta):
        return text
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a duration like 15m, 1h or 1d")
    if isinstance(text, int | float):
        if text < 0:
            raise ValueError(f"{text!r} is negative")
        return timedelta(seconds=text)
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 15m, 1h or 1d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _ms(step: timedelta) -> int:
    total = step // timedelta(milliseconds=1)
    if total <= 0:
        raise ValueError(f"step {step} is not positive")
    return int(total)


def align_down(moment: datetime, step: timedelta) -> datetime:
    """The latest multiple of `step` since the epoch at or before `moment` (UTC grid)."""
    offset = _ms(moment - EPOCH)
    size = _ms(step)
    return EPOCH + timedelta(milliseconds=offset - offset % size)


def align_up(moment: datetime, step: timedelta) -> datetime:
    down = align_down(moment, step)
    return down if down == moment else down + step


def plan_windows(span: Window, size: timedelta, *, grid: bool = True) -> list[Window]:
    """Consecutive half-open windows covering `span` exactly once, cut on the UTC grid."""
    _ms(size)
    windows: list[Window] = []
    cursor = span.start
    while cursor < span.end:
        boundary = align_down(cursor, size) + size if grid else cursor + size
        upper = min(boundary, span.end)
        windows.append(Window(cursor, upper))
        cursor = upper
    return windows


def aggregated_span(span: Window, interval: timedelta) -> Window:
    """Widen a span to whole buckets: start down and end up to multiples of `interval`."""
    return Window(align_down(span.start, interval), align_up(span.end, interval))


def _default_encoded_len(path: str) -> int:
    return len(quote(orjson.dumps(path).decode(), safe=""))


def batch_members(
    members: Sequence[str],
    *,
    max_batch: int,
    max_query_bytes: int = 7000,
    encoded_len: Callable[[str], int] | None = None,
) -> list[tuple[str, ...]]:
    """Order-preserving batches whose JSON-array query value stays under the byte budget."""
    if max_batch < 1:
        raise ValueError("max_batch must be at least 1")
    measure = encoded_len or _default_encoded_len
    separator = len(quote(",", safe=""))
    brackets = len(quote("[]", safe=""))
    batches: list[tuple[str, ...]] = []
    current: list[str] = []
    size = brackets
    for path in members:
        cost = measure(path)
        if brackets + cost > max_query_bytes:
            raise ValueError(
                f"tag path {path[:80]!r}... is {cost} bytes encoded, more than one request "
                f"may carry ({max_query_bytes})"
            )
        extra = cost + (separator if current else 0)
        if current and (len(current) >= max_batch or size + extra > max_query_bytes):
            batches.append(tuple(current))
            current, size = [], brackets
            extra = cost
        current.append(path)
        size += extra
    if current:
        batches.append(tuple(current))
    return batches


def window_for_density(
    samples_per_hour_per_tag: float,
    tags_per_batch: int,
    *,
    target_rows: int = 200_000,
    min_size: timedelta = timedelta(minutes=1),
    max_size: timedelta = timedelta(days=31),
    interval: timedelta | None = None,
) -> timedelta:
    """The largest nice window whose request carries about `target_rows` rows (or fewer)."""
    per_hour = max(samples_per_hour_per_tag, 1e-6) * max(tags_per_batch, 1)
    ideal = timedelta(hours=target_rows / per_hour)
    chosen = min_size
    for size in NICE_SIZES:
        if min_size <= size <= max_size and size <= ideal:
            chosen = size
    if interval is not None:
        steps = max(1, chosen // interval)
        chosen = steps * interval
    return chosen


def chunk_id(
    flow: str, dataset: str, members: Sequence[str], window: Window, options_key: str
) -> str:
    """A stable id of the work: same flow, dataset, tags, window and options -> same id."""
    digest = hashlib.blake2b(digest_size=10)
    digest.update(
        orjson.dumps([flow, dataset, list(members), window.start_ms, window.end_ms, options_key])
    )
    return digest.hexdigest()


@dataclass(frozen=True, order=True)
class Chunk:
    """One request's worth of work: a batch of members over one half-open window."""

    flow: str
    dataset: str
    kind: str
    members: tuple[str, ...]
    window: Window
    chunk_id: str
    label: str


def chunk_label(members: Sequence[str], window: Window) -> str:
    first = members[0] if members else "-"
    if len(first) > 40:
        first = first[:37] + "..."
    size = window.end - window.start
    return f"{len(members)} tags {first} [{iso_utc(window.start)[:16]}Z, +{_short(size)})"


def _short(size: timedelta) -> str:
    seconds = size.total_seconds()
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= length and seconds % length == 0:
            return f"{int(seconds // length)}{unit}"
    return f"{seconds:g}s"


def plan_chunks(
    flow: str,
    dataset: str,
    kind: str,
    batches: Sequence[tuple[str, ...]],
    span: Window,
    size: timedelta,
    options_key: str,
) -> list[Chunk]:
    """Window-major chunks: every batch of the first window, then the next window."""
    chunks: list[Chunk] = []
    for window in plan_windows(span, size):
        for batch in batches:
            chunks.append(
                Chunk(
                    flow=flow,
                    dataset=dataset,
                    kind=kind,
                    members=batch,
                    window=window,
                    chunk_id=chunk_id(flow, dataset, batch, window, options_key),
                    label=chunk_label(batch, window),
                )
            )
    return chunks
