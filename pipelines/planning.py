"""Pure planning: durations, UTC-grid windows, tag batches, chunk ids.

Windows sit on a UTC grid of their size (epoch multiples), so a re-run, a resumed
backfill and an incremental run all cut time the same way and produce the same chunk
ids. Aggregated spans are widened to whole buckets of `interval`, so 15-minute averages
land on :00, :15, :30, :45 whatever the run's start time. All arithmetic is in integer
epoch milliseconds, the node's unit, so no boundary drifts by a rounding error.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from urllib.parse import quote

import orjson

from connectors.errors import quoted
from connectors.timewindow import EPOCH, Window, iso_utc, to_ms
from pipelines.core.kinds import kind_of

_ONE_MS = timedelta(milliseconds=1)
_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}
_PART = r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)"
_DURATION = re.compile(rf"^\s*(?:{_PART}\s*)+$")
_PARTS = re.compile(_PART)
DURATION_EXAMPLES = "500ms, 90s, 15m, 1h, 1h30m, 1d or 2w"

NICE_SIZES = (
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
)


def parse_duration(text: str | int | float | timedelta) -> timedelta:
    """`15m`, `1h`, `1d`, `90s`, `2w`, `500ms`, `1h30m`, or a number of seconds.

    Negative, infinite, out-of-range and unreadable durations raise ValueError with an
    example.
    """
    if isinstance(text, timedelta):
        duration = text
    elif isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"{quoted(text)} is not a duration like {DURATION_EXAMPLES}")
    elif isinstance(text, int | float) and not math.isfinite(text):
        raise ValueError(f"{quoted(text)} is not a finite duration")
    elif isinstance(text, str) and _DURATION.match(text) is None:
        raise ValueError(f"{quoted(text)} is not a duration like {DURATION_EXAMPLES}")
    else:
        try:
            if isinstance(text, str):
                parts = (float(number) * _UNITS[unit] for number, unit in _PARTS.findall(text))
                duration = sum(parts, timedelta(0))
            else:
                duration = timedelta(seconds=text)
        except (OverflowError, ValueError):  # past what a timedelta holds
            raise ValueError(
                f"duration {quoted(text)} is too long (at most {timedelta.max.days:,} days)"
            ) from None
    if duration < timedelta(0):
        raise ValueError(f"duration {quoted(text)} is negative")
    return duration


def _step_ms(step: timedelta) -> int:
    """A positive step in whole milliseconds (the grid unit), else ValueError."""
    total = step // _ONE_MS
    if total <= 0 or step != total * _ONE_MS:
        raise ValueError(f"step {step} is not a positive whole number of milliseconds")
    return int(total)


def _from_ms(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def align_down(moment: datetime, step: timedelta) -> datetime:
    """The latest multiple of `step` since the epoch at or before `moment` (UTC grid)."""
    size = _step_ms(step)
    offset = to_ms(moment)
    return _from_ms(offset - offset % size)


def align_up(moment: datetime, step: timedelta) -> datetime:
    """The earliest multiple of `step` since the epoch at or after `moment` (UTC grid)."""
    down = align_down(moment, step)
    return down if down == moment else down + step


def plan_windows(span: Window, size: timedelta, *, grid: bool = True) -> list[Window]:
    """Consecutive half-open windows covering `span` exactly once.

    With `grid`, inner boundaries are multiples of `size` since the epoch (the first and
    last windows are clipped to the span), so any span cuts time at the same instants.
    Without it, windows of `size` start at the span's start.
    """
    size_ms = _step_ms(size)
    windows: list[Window] = []
    cursor = span.start
    while cursor < span.end:
        if grid:
            offset = to_ms(cursor)
            boundary = _from_ms(offset - offset % size_ms + size_ms)
        else:
            boundary = cursor + size
        upper = min(boundary, span.end)
        windows.append(Window(cursor, upper))
        cursor = upper
    return windows


def aggregated_span(span: Window, interval: timedelta) -> Window:
    """Widen a span to whole buckets: start down and end up to multiples of `interval`."""
    return Window(align_down(span.start, interval), align_up(span.end, interval))


def whole_buckets(span: Window, interval: timedelta) -> Window | None:
    """An aggregated run's span: both ends down to multiples of `interval`, so no bucket is
    asked for in part (a later run asks for the last one whole); None when none is whole."""
    start = align_down(span.start, interval)
    end = align_down(span.end, interval)
    return Window(start, end) if end > start else None


def on_window_grid(
    span: Window, always: Window | None, size: timedelta
) -> tuple[Window, Window | None]:
    """A delta or filter run's span and look-back: their rows depend on where a query
    starts, so the span starts on the window grid, and a look-back covers it all."""
    span = Window(align_down(span.start, size), span.end)
    return span, span if always is not None else None


def query_batches(
    members: Sequence[str], *, max_batch: int, one_query: bool
) -> list[tuple[str, ...]]:
    """The member batches of each window: every member in one query when the query names
    them all at once (a group through historyFilter, an alarm path), else `batch_members`."""
    if one_query:
        return [tuple(members)]
    return batch_members(members, max_batch=max_batch)


def tags_per_query(members: int, *, max_batch: int, one_query: bool) -> int:
    """How many tags one query of the flow asks for (what an auto window is sized by)."""
    return members if one_query else min(max_batch, members)


# What `quote(..., safe="")` leaves as it is; every other byte becomes `%XX`.
_UNRESERVED = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~"
# ASCII that JSON escapes (so that the plain count below would be wrong): quote, backslash,
# control characters.
_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f\x7f]')


def encoded_path_len(path: str) -> int:
    """Percent-encoded length of one path as an element of a JSON-array query value.

    Counted from the path's UTF-8 bytes, without encoding (a plan measures every path of
    the selection: 10,000 `quote` calls were a visible part of an hourly run), unless JSON
    would escape one of its characters; such a path is encoded.
    """
    if _JSON_ESCAPED.search(path) is None:
        try:
            raw = path.encode()  # what orjson writes for the path between its quotes
        except UnicodeEncodeError:  # a lone surrogate: orjson says what is wrong with it
            pass
        else:
            # Each byte quote() escapes grows by 2; the quotes are %22 each.
            return len(raw) + 2 * len(raw.translate(None, _UNRESERVED)) + 6
    return len(quote(orjson.dumps(path).decode(), safe=""))


def encoded_batch_len(batch: Sequence[str]) -> int:
    """Percent-encoded length of `paths=[...]`'s value: what a batch adds to the URL."""
    return len(quote(orjson.dumps(list(batch)).decode(), safe=""))


_BRACKETS = len(quote("[]", safe=""))
_COMMA = len(quote(",", safe=""))


def batch_members(
    members: Sequence[str],
    *,
    max_batch: int,
    max_query_bytes: int = 7000,
    encoded_len: Callable[[str], int] | None = None,
) -> list[tuple[str, ...]]:
    """Order-preserving batches of at most `max_batch` members whose encoded JSON array
    (`encoded_batch_len`) stays within `max_query_bytes`, so a URL never outgrows a proxy.

    `encoded_len(path)` is the cost of one path as an array element (default:
    `encoded_path_len`); brackets and commas are added, percent-encoded, around it.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, not {max_batch}")
    measure = encoded_len or encoded_path_len
    batches: list[tuple[str, ...]] = []
    current: list[str] = []
    size = _BRACKETS
    for path in members:
        cost = measure(path)
        if _BRACKETS + cost > max_query_bytes:
            raise ValueError(
                f"tag path {quoted(path)} is {cost} bytes encoded, more than one request may carry "
                f"({max_query_bytes} bytes); shorten it or raise max_query_bytes"
            )
        extra = cost + (_COMMA if current else 0)
        if current and (len(current) >= max_batch or size + extra > max_query_bytes):
            batches.append(tuple(current))
            current, size, extra = [], _BRACKETS, cost
        current.append(path)
        size += extra
    if current:
        batches.append(tuple(current))
    return batches


# Rows a chunk of an auto window is sized to carry: at the pipeline's measured rates
# (BENCHMARKS.md, "Auto windows") a chunk of this many rows commits well within a second, so
# a run that is killed again and again still commits chunks between the kills.
AUTO_CHUNK_ROWS = 200_000


def density_per_hour(
    tags: Iterable[tuple[int, int | None]], probed: int, start_ms: int, end_ms: int
) -> float:
    """Samples per tag and hour seen by one raw probe of `probed` tags over [start, end).

    `tags` holds (rows, last timestamp in ms) per tag of the answer. A node may cap raw
    answers without saying so (node-facts.md): the tags with the most rows, which a cap cuts
    at one count, are measured up to their last sample instead of over the whole probe, so
    a cap makes the estimate no lower than the truth. Tags missing from the answer count 0.
    """
    answered = list(tags)
    if probed < 1 or end_ms <= start_ms:
        raise ValueError("a probe needs tags and a range")
    busiest = max((rows for rows, _ in answered), default=0)
    hour_ms = 3_600_000
    total = 0.0
    for rows, last_ms in answered:
        covered_ms = end_ms - start_ms
        if rows == busiest and rows >= 2 and last_ms is not None:
            covered_ms = min(covered_ms, max(last_ms - start_ms, 1000))
        total += rows * hour_ms / covered_ms
    return total / probed


def window_for_density(
    samples_per_hour_per_tag: float,
    tags_per_batch: int,
    *,
    target_rows: int = AUTO_CHUNK_ROWS,
    min_size: timedelta = timedelta(minutes=1),
    max_size: timedelta = timedelta(days=31),
    interval: timedelta | None = None,
) -> timedelta:
    """The largest nice window (NICE_SIZES within [min_size, max_size]) whose request
    carries at most about `target_rows`; `min_size` when even that is too much.

    For aggregated queries the size is rounded down to a whole number of `interval`s
    (at least one), so every window holds whole buckets.
    """
    if not math.isfinite(samples_per_hour_per_tag) or samples_per_hour_per_tag < 0:
        raise ValueError(f"samples per hour {samples_per_hour_per_tag!r} is not a finite rate")
    if target_rows < 1:
        raise ValueError(f"target_rows must be at least 1, not {target_rows}")
    per_hour = max(samples_per_hour_per_tag, 1e-6) * max(tags_per_batch, 1)
    ideal_hours = target_rows / per_hour
    chosen = min_size
    for size in NICE_SIZES:
        if min_size <= size <= max_size and size / timedelta(hours=1) <= ideal_hours:
            chosen = size
    if interval is not None:
        _step_ms(interval)
        chosen = max(1, chosen // interval) * interval
    return chosen


def chunk_id(
    unit_key: str, dataset: str, members: Sequence[str], window: Window, options_key: str
) -> str:
    """A stable 20-hex id of the work: same unit (`unit_key`: the flow, or `flow@node`),
    dataset, members (in the order given), window and options -> same id, across runs and
    machines."""
    digest = hashlib.blake2b(digest_size=10)
    digest.update(
        orjson.dumps(
            [unit_key, dataset, list(members), window.start_ms, window.end_ms, options_key]
        )
    )
    return digest.hexdigest()


@dataclass(frozen=True, order=True)
class Chunk:
    """One request's worth of work: a batch of members over one half-open window."""

    # The key of the (flow, node) unit that planned it (`pipelines.config.models.unit_key`).
    unit_key: str
    dataset: str
    kind: str
    members: tuple[str, ...]
    window: Window
    chunk_id: str
    label: str
    # Fetched by path (historyMany) even in a flow that reads its group through
    # historyFilter: the chunk holds only the tags of the group that a sink lacks.
    by_paths: bool = False


def _label_time(moment: datetime) -> str:
    text = iso_utc(moment)  # 2024-01-01T00:00:00.000Z
    if text.endswith(":00.000Z"):
        return text[:16] + "Z"
    if text.endswith(".000Z"):
        return text[:19] + "Z"
    return text


def short_duration(size: timedelta) -> str:
    """`1h`, `15m`, `36h`, `90s`, `1500ms`: the largest unit that divides the size."""
    total_ms = size // _ONE_MS
    for unit, length in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if total_ms >= length and total_ms % length == 0:
            return f"{total_ms // length}{unit}"
    return f"{total_ms}ms"


def window_text(window: Window) -> str:
    """`2026-11-30T10:00Z..11:00Z`: a window for a log line (the end's date when it differs)."""
    start, end = _label_time(window.start), _label_time(window.end)
    same_day = start[:11] == end[:11]
    return f"{start}..{end[11:] if same_day else end}"


def chunk_label(members: Sequence[str], window: Window, *, noun: str = "tag") -> str:
    """A short human name of a chunk for logs and errors: `12 tags /Plant A/x [..., +1h)`."""
    first = members[0] if members else "-"
    if len(first) > 40:
        first = first[:37] + "..."
    count = f"{len(members)} {noun}" + ("" if len(members) == 1 else "s")
    span = f"[{_label_time(window.start)}, +{short_duration(window.end - window.start)})"
    return f"{count} {first} {span}"


def plan_chunks(
    unit_key: str,
    dataset: str,
    kind: str,
    batches: Sequence[tuple[str, ...]],
    span: Window,
    size: timedelta,
    options_key: str,
) -> list[Chunk]:
    """Window-major chunks: every batch of the first window, then the next window, so a
    run fills time from its start and the watermark can advance as chunks complete."""
    noun = kind_of(kind).member_noun
    chunks: list[Chunk] = []
    for window in plan_windows(span, size):
        for batch in batches:
            chunks.append(
                Chunk(
                    unit_key=unit_key,
                    dataset=dataset,
                    kind=kind,
                    members=tuple(batch),
                    window=window,
                    chunk_id=chunk_id(unit_key, dataset, batch, window, options_key),
                    label=chunk_label(batch, window, noun=noun),
                )
            )
    return chunks


def sub_chunk(chunk: Chunk, members: Sequence[str], window: Window) -> Chunk:
    """A piece of `chunk` that was fetched apart (an answer too large, a window cut after
    timeouts), to be written on its own: its own scope and a stable id (the same piece of
    the same chunk has the same id in every run)."""
    noun = kind_of(chunk.kind).member_noun
    return replace(
        chunk,
        members=tuple(members),
        window=window,
        # The parent's id stands for the options it was planned with.
        chunk_id=chunk_id(chunk.unit_key, chunk.dataset, members, window, chunk.chunk_id),
        label=chunk_label(members, window, noun=noun),
    )


def narrow_chunk(
    chunk: Chunk,
    lacking: Sequence[str],
    *,
    max_batch: int,
    options_key: str,
    by_paths: bool,
) -> list[Chunk]:
    """The chunk cut down to the members a sink lacks over its window (after `state reset
    --tag`, only that tag is fetched again), in batches; the chunk itself when it lacks
    them all. `by_paths`: the flow reads a group through historyFilter, which cannot ask
    for some of its tags, so the cut chunks are asked by path."""
    if len(lacking) >= len(chunk.members):
        return [chunk]
    noun = kind_of(chunk.kind).member_noun
    return [
        replace(
            chunk,
            members=tuple(batch),
            chunk_id=chunk_id(chunk.unit_key, chunk.dataset, batch, chunk.window, options_key),
            label=chunk_label(batch, chunk.window, noun=noun),
            by_paths=by_paths,
        )
        for batch in batch_members(lacking, max_batch=max_batch)
    ]
