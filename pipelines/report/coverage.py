"""What a flow's dataset holds per series and time bucket, aggregated where the data lives.

Tag history: rows, bad-quality rows (quality < 192, or none) and the min / mean / max of
the good values per (tag, bucket); booleans count as 0/1, text values have no trend.
Alarm history: events per (alarm path, bucket, priority, status) (`sinks.coverage`).

Years of rows are never loaded at once. A sink with a coverage reader
(`sinks.base.ReadsCoverage`) reduces the rows where they live - the warehouse in SQL
(one GROUP BY), the lake a record batch at a time - so memory follows series x
buckets, not rows. Any other sink is read whole through `Reads.read` (correct, unbounded).
The progress the sink keeps for the flow tells extracted buckets without rows (gaps)
from buckets never extracted.

Where the sink keeps the completeness ledger (`sinks.base.ReadsLedger`, `sinks.ledger`),
the report reads it instead of the data for what the data cannot say and what would
otherwise take a scan: the range to draw (the ledger's windows, not the rows' span),
the windows held (written, not proven complete, with why) and missing (left out of the
node's answers), each drawn apart from gaps.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.schema import KIND_ALARM_HISTORY, KIND_TAG_HISTORY
from connectors.timewindow import Window
from pipelines.core.kinds import kind_of
from pipelines.state import tag_members
from sinks.base import (
    Buckets,
    CoverageReader,
    Progress,
    Reads,
    ReadsCoverage,
    ReadsLedger,
    Sink,
    SinkError,
    merge_windows,
)
from sinks.coverage import (
    ALARM_KEYS,
    ALARM_PARTS,
    BATCH_ROWS,
    TAG_KEYS,
    TAG_PARTS,
    columns,
    partials,
)

TARGET_BUCKETS = 100
MAX_BUCKETS = 2000
# Round bucket sizes in seconds, smallest first: 1 s ... 1 year.
_BUCKET_CHOICES_S = (
    1, 5, 10, 15, 30, 60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
    86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400, 91 * 86400, 365 * 86400,
)  # fmt: skip
_DAY_MS = 86_400_000
_MONDAY_MS = 4 * _DAY_MS  # 1970-01-05, the first Monday: weeks start on Mondays
# Alarm priorities (spec: 1 Low .. 4 Critical) and states (spec: 0..3); index 0 / 4 hold
# values outside the spec's range, so nothing is dropped silently.
PRIORITIES = ("other", "Low", "Medium", "High", "Critical")
STATUSES = (
    "cleared, acknowledged",
    "active, acknowledged",
    "cleared, unacknowledged",
    "active, unacknowledged",
    "other",
)
_TS = pa.timestamp("ms", tz="UTC")
_DIGITS = re.compile(r"(\d+)")
_COMPACT_ROWS = 500_000  # partial groups held before they are merged again


class RangeError(ValueError):
    """The asked range or bucket cannot be drawn (empty range, too many buckets)."""


@dataclass(frozen=True)
class TimeGrid:
    """`count` buckets of `bucket` from `start` (a UTC multiple of the bucket)."""

    start_ms: int
    bucket_ms: int
    count: int

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.count * self.bucket_ms

    @property
    def bucket(self) -> timedelta:
        return timedelta(milliseconds=self.bucket_ms)

    def span(self, lo_ms: int, hi_ms: int) -> tuple[int, int]:
        """Indices [first, last) of the buckets that [lo_ms, hi_ms) touches, clipped."""
        first = max(0, (lo_ms - self.start_ms) // self.bucket_ms)
        last = min(self.count, -(-(hi_ms - self.start_ms) // self.bucket_ms))
        return int(first), int(max(first, last))


def nice_bucket(span: timedelta, target: int = TARGET_BUCKETS) -> timedelta:
    """The smallest round bucket (1 s ... 1 day, 1 week ... 1 year) giving <= `target` buckets."""
    for seconds in _BUCKET_CHOICES_S:
        if span / timedelta(seconds=seconds) <= target:
            return timedelta(seconds=seconds)
    return timedelta(seconds=_BUCKET_CHOICES_S[-1])


def plan_grid(window: Window, bucket: timedelta | None = None) -> TimeGrid:
    """Buckets covering `window`, on UTC multiples of their size (weeks from Monday).

    RangeError for a bucket under a second or one making more than MAX_BUCKETS.
    """
    size = bucket or nice_bucket(window.end - window.start)
    size_ms = int(size.total_seconds() * 1000)
    if size_ms < 1000:
        raise RangeError(f"bucket {size} is shorter than a second")
    origin = _MONDAY_MS if size_ms % (7 * _DAY_MS) == 0 else 0
    start_ms = window.start_ms - (window.start_ms - origin) % size_ms
    count = -(-(window.end_ms - start_ms) // size_ms)
    if count > MAX_BUCKETS:
        raise RangeError(
            f"buckets of {size} over {window.end - window.start} make {count:,} buckets "
            f"(at most {MAX_BUCKETS:,}): choose a larger bucket or a shorter range"
        )
    return TimeGrid(start_ms, size_ms, int(count))


@dataclass(frozen=True)
class TagCoverage:
    """Per tag (rows of each array, `members` order) and bucket (columns)."""

    flow: str
    window: Window | None  # the range drawn; None when there is nothing at all
    grid: TimeGrid
    members: list[str]
    rows: np.ndarray  # int64: rows
    bad: np.ndarray  # int64: rows of quality < 192 (or none)
    low: np.ndarray  # float64: min of good values, NaN where none
    high: np.ndarray  # float64: max of good values, NaN where none
    total: np.ndarray  # float64: sum of good values
    counted: np.ndarray  # int64: good values (numbers and booleans)
    extracted: np.ndarray  # bool: the flow's progress covers (part of) the bucket
    # bool: a ledger window held (not proven complete) / missing (left out by the node)
    # touches the bucket; all False where the sink keeps no ledger
    held: np.ndarray | None = None
    missing: np.ndarray | None = None
    # Per tag, why its windows are held (from the ledger), first reason first.
    reasons: dict[str, list[str]] = field(default_factory=dict)

    @property
    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counted > 0, self.total / np.maximum(self.counted, 1), np.nan)

    def gaps(self, index: int) -> int:
        """Extracted buckets in which the tag has no row."""
        return int(((self.rows[index] == 0) & self.extracted[index]).sum())

    def not_extracted(self, index: int) -> int:
        return int((~self.extracted[index]).sum())

    def held_buckets(self, index: int) -> int:
        """Buckets a held window of the tag touches (ledger)."""
        return 0 if self.held is None else int(self.held[index].sum())

    def missing_buckets(self, index: int) -> int:
        """Buckets a window the node left the tag out of touches (ledger)."""
        return 0 if self.missing is None else int(self.missing[index].sum())

    def bad_buckets(self, index: int) -> int:
        """Buckets in which the tag has at least one bad-quality row."""
        return int((self.bad[index] > 0).sum())

    @property
    def totals(self) -> dict[str, int]:
        return {
            "members": len(self.members),
            "rows": int(self.rows.sum()),
            "bad_rows": int(self.bad.sum()),
            "members_with_gaps": sum(1 for i in range(len(self.members)) if self.gaps(i)),
            "members_held": sum(1 for i in range(len(self.members)) if self.held_buckets(i)),
            "members_missing": sum(1 for i in range(len(self.members)) if self.missing_buckets(i)),
        }


@dataclass(frozen=True)
class AlarmCoverage:
    """Alarm events per path and bucket, and per priority / status (PRIORITIES, STATUSES)."""

    flow: str
    window: Window | None
    grid: TimeGrid
    paths: list[str]
    events: np.ndarray  # int64 [path, bucket]
    by_priority: np.ndarray  # int64 [priority index, bucket]
    by_status: np.ndarray  # int64 [status index, bucket]
    path_priority: np.ndarray  # int64 [path, priority index]
    path_status: np.ndarray  # int64 [path, status index]

    @property
    def totals(self) -> dict[str, int]:
        return {"paths": len(self.paths), "events": int(self.events.sum())}


# -- partial groups: what one batch (or one SQL answer) contributes --------------------------


class _Groups:
    """Partial aggregates merged as they come, so the held groups stay few."""

    def __init__(self, keys: Sequence[str], parts: dict[str, str]) -> None:
        self.keys = list(keys)
        self.parts = parts
        self._held: list[pa.Table] = []
        self._held_rows = 0

    def add(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self._held.append(table)
        self._held_rows += table.num_rows
        if self._held_rows > _COMPACT_ROWS and len(self._held) > 1:
            merged = self.result()
            self._held, self._held_rows = [merged], merged.num_rows

    def result(self) -> pa.Table:
        if not self._held:
            return pa.table({})
        table = pa.concat_tables(self._held) if len(self._held) > 1 else self._held[0]
        grouped = table.group_by(self.keys).aggregate(list(self.parts.items()))
        return grouped.rename_columns(
            [
                name.rsplit("_", 1)[0] if name not in self.keys else name
                for name in grouped.column_names
            ]
        )


# -- sources: where the rows are and how they are reduced there -------------------------------


class _FrameSource:
    """A sink without a coverage reader: its whole dataset through `Reads.read`, reduced
    in slices."""

    def __init__(self, sink: Reads, dataset: str, kind: str) -> None:
        self.kind = kind
        frame = sink.read(dataset, kind)
        self.table = pa.Table.from_pandas(frame[columns(kind)], preserve_index=False)
        self.table = self.table.set_column(1, "ts", pc.cast(self.table.column("ts"), _TS))

    def span(self) -> Window | None:
        if self.table.num_rows == 0:
            return None
        bounds = pc.min_max(pc.cast(self.table.column("ts"), pa.int64()))
        return Window.from_ms(int(bounds["min"].as_py()), int(bounds["max"].as_py()) + 1)

    def partials(self, window: Window, buckets: Buckets) -> Iterator[pa.Table]:
        ts = self.table.column("ts")
        wanted = pc.and_(
            pc.greater_equal(ts, pa.scalar(window.start_ms, _TS)),
            pc.less(ts, pa.scalar(window.end_ms, _TS)),
        )
        for batch in self.table.filter(wanted).to_batches(BATCH_ROWS):
            yield partials(batch, self.kind, buckets)


def _source(sink: object, dataset: str, kind: str) -> CoverageReader:
    """The sink's own coverage reader, else its dataset read whole."""
    if isinstance(sink, ReadsCoverage):
        return sink.coverage_reader(dataset, kind)
    if isinstance(sink, Reads):
        return _FrameSource(sink, dataset, kind)
    raise SinkError(f"sink {getattr(sink, 'name', sink)!r} cannot be read for a report")


# -- coverage of a flow ----------------------------------------------------------------------


def _progress_span(progress: Progress) -> Window | None:
    windows = [w for member in tag_members(progress) for w in progress.windows_of(member)]
    if not windows:
        return None
    return Window(min(w.start for w in windows), max(w.end for w in windows))


def _resolve(
    start: datetime | None,
    end: datetime | None,
    source: CoverageReader,
    progress: Progress,
    ledger: pa.Table | None = None,
) -> Window | None:
    """The range to draw: as asked, else from the first row or extracted window to the last.

    Only when a bound is missing: the ledger's windows where it has any, else the sink is
    asked for its rows' span (a full scan on some).
    """
    if start is not None and end is not None:
        return Window(start, end) if end > start else _nothing(start, end, [])
    rows_span = _ledger_span(ledger) if ledger is not None and ledger.num_rows else source.span()
    known = [s for s in (rows_span, _progress_span(progress)) if s is not None]
    lo = start or min((s.start for s in known), default=None)
    hi = end or max((s.end for s in known), default=None)
    if lo is None or hi is None:
        return None
    return Window(lo, hi) if hi > lo else _nothing(lo, hi, known)


def _ledger_span(ledger: pa.Table) -> Window:
    starts = pc.min(pc.cast(ledger.column("window_start"), pa.int64())).as_py()
    ends = pc.max(pc.cast(ledger.column("window_end"), pa.int64())).as_py()
    return Window.from_ms(int(starts), int(ends))


def flow_ledger(sink: object, flow: str, dataset: str) -> pa.Table | None:
    """The ledger rows of the flow's progress keys (`flow`, `flow@node`, its shards') in
    the dataset; None where the sink keeps no ledger."""
    if not isinstance(sink, ReadsLedger):
        return None
    table = sink.read_ledger(dataset)
    keys = table.column("flow")
    return table.filter(pc.or_(pc.equal(keys, flow), pc.starts_with(keys, f"{flow}@")))


def _marks(
    ledger: pa.Table | None, status: str, members: list[str], grid: TimeGrid, window: Window | None
) -> tuple[np.ndarray, dict[str, list[str]]]:
    """Buckets per member that a ledger window of `status` touches, and their reasons."""
    marks = np.zeros((len(members), grid.count), dtype=bool)
    reasons: dict[str, list[str]] = {}
    if ledger is None or window is None:
        return marks, reasons
    found = ledger.filter(pc.equal(ledger.column("status"), status))
    position = {name: i for i, name in enumerate(members)}
    starts = pc.cast(found.column("window_start"), pa.int64()).to_pylist()
    ends = pc.cast(found.column("window_end"), pa.int64()).to_pylist()
    for tag, lo, hi, why in zip(
        found.column("tag").to_pylist(),
        starts,
        ends,
        found.column("reason").to_pylist(),
        strict=True,
    ):
        row = position.get(tag)
        lo, hi = max(lo, window.start_ms), min(hi, window.end_ms)
        if row is None or lo >= hi:
            continue
        first, last = grid.span(lo, hi)
        marks[row, first:last] = True
        if why and why not in reasons.setdefault(tag, []):
            reasons[tag].append(why)
    return marks, reasons


def _flagged(ledger: pa.Table | None, window: Window | None) -> set[str]:
    """Tags with a held or missing ledger window in the range (drawn, rows or none)."""
    if ledger is None or window is None:
        return set()
    flagged = ledger.filter(
        pc.and_(
            pc.not_equal(ledger.column("status"), "complete"),
            pc.and_(
                pc.less(ledger.column("window_start"), pa.scalar(window.end_ms, _TS)),
                pc.greater(ledger.column("window_end"), pa.scalar(window.start_ms, _TS)),
            ),
        )
    )
    return {str(tag) for tag in flagged.column("tag").to_pylist()}


def _nothing(lo: datetime, hi: datetime, known: list[Window]) -> NoReturn:
    held = "no rows and no extracted window"
    if known:
        first, last = min(s.start for s in known), max(s.end for s in known)
        held = f"rows and extracted windows span {_iso(first)} to {_iso(last)}"
    raise RangeError(f"nothing to draw from {_iso(lo)} to {_iso(hi)}: {held}")


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _gather(
    sink: Sink,
    dataset: str,
    kind: str,
    progress: Progress,
    start: datetime | None,
    end: datetime | None,
    bucket: timedelta | None,
    ledger: pa.Table | None = None,
) -> tuple[Window | None, TimeGrid, pa.Table]:
    """The range, its buckets, and the dataset's groups in it (one row per group)."""
    source = _source(sink, dataset, kind)
    window = _resolve(start, end, source, progress, ledger)
    if window is None:
        return None, TimeGrid(0, 3_600_000, 0), pa.table({})
    grid = plan_grid(window, bucket)
    keys, parts = (TAG_KEYS, TAG_PARTS) if kind_of(kind).by_tag else (ALARM_KEYS, ALARM_PARTS)
    groups = _Groups(keys, parts)
    for part in source.partials(window, grid):
        groups.add(part)
    return window, grid, groups.result()


def tag_coverage(
    sink: Sink,
    flow: str,
    dataset: str,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    bucket: timedelta | None = None,
    progress: Progress | None = None,
) -> TagCoverage:
    """Tag history coverage of `flow` in `sink` over [start, end) (default: all it holds);
    `progress`: what counts as extracted (default: the sink's progress of `flow`)."""
    progress = progress or sink.progress(flow)
    ledger = flow_ledger(sink, flow, dataset)
    window, grid, found = _gather(
        sink, dataset, KIND_TAG_HISTORY, progress, start, end, bucket, ledger
    )
    in_range = {
        member
        for member in tag_members(progress)  # not the records of windows a node left out
        if window is not None
        and any(w.start < window.end and w.end > window.start for w in progress.windows_of(member))
    }
    members, index = _members(found, in_range | _flagged(ledger, window))
    shape = (len(members), grid.count)
    arrays: dict[str, np.ndarray] = {
        "rows": np.zeros(shape, np.int64),
        "bad": np.zeros(shape, np.int64),
        "low": np.full(shape, np.nan),
        "high": np.full(shape, np.nan),
        "total": np.zeros(shape),
        "counted": np.zeros(shape, np.int64),
    }
    if found.num_rows:
        at = (index, found.column("bucket").to_numpy())
        for name, values in arrays.items():
            column = found.column(name)
            filler = np.nan if name in ("low", "high") else 0
            values[at] = (
                column.fill_null(filler).to_numpy() if column.null_count else column.to_numpy()
            )
    extracted = _extracted(members, progress, grid, window)
    held, reasons = _marks(ledger, "held", members, grid, window)
    missing, _ = _marks(ledger, "missing", members, grid, window)
    return TagCoverage(
        flow,
        window,
        grid,
        members,
        extracted=extracted,
        held=held,
        missing=missing,
        reasons=reasons,
        **arrays,
    )


def natural_key(name: str) -> tuple[tuple[tuple[int, int | str], ...], str]:
    """Sort key that puts `Temp 9` before `Temp 10`; equal numbers (`9`, `09`) by the name."""
    parts = _DIGITS.split(name)  # text, digits, text, digits, ...
    return tuple((0, int(part)) if i % 2 else (1, part) for i, part in enumerate(parts)), name


def _members(found: pa.Table, extra: set[str]) -> tuple[list[str], np.ndarray]:
    """Member names (found and `extra`) in natural order, and each found group's index."""
    if not found.num_rows:
        return sorted(extra, key=natural_key), np.zeros(0, np.int64)
    encoded = found.column("member").combine_chunks().dictionary_encode()
    dictionary = [str(name) for name in encoded.dictionary.to_pylist()]
    members = sorted(set(dictionary) | extra, key=natural_key)
    position = {name: i for i, name in enumerate(members)}
    remap = np.array([position[name] for name in dictionary], dtype=np.int64)
    return members, remap[encoded.indices.to_numpy(zero_copy_only=False)]


def _extracted(
    members: list[str], progress: Progress, grid: TimeGrid, window: Window | None
) -> np.ndarray:
    """Buckets the flow's progress touches per member; all of them when it keeps none."""
    if not tag_members(progress) or window is None:
        return np.ones((len(members), grid.count), dtype=bool)
    extracted = np.zeros((len(members), grid.count), dtype=bool)
    for row, member in enumerate(members):
        for done in merge_windows(progress.windows_of(member)):
            lo = max(done.start_ms, window.start_ms)
            hi = min(done.end_ms, window.end_ms)
            if lo < hi:
                first, last = grid.span(lo, hi)
                extracted[row, first:last] = True
    return extracted


def alarm_coverage(
    sink: Sink,
    flow: str,
    dataset: str,
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    bucket: timedelta | None = None,
    progress: Progress | None = None,
) -> AlarmCoverage:
    """Alarm events of `flow` in `sink` per path, priority and status over [start, end)."""
    progress = progress or sink.progress(flow)
    window, grid, found = _gather(sink, dataset, KIND_ALARM_HISTORY, progress, start, end, bucket)
    paths, index = _members(found, set())
    columns = len(PRIORITIES)
    events = np.zeros((len(paths), grid.count), np.int64)
    by_priority = np.zeros((columns, grid.count), np.int64)
    by_status = np.zeros((len(STATUSES), grid.count), np.int64)
    path_priority = np.zeros((len(paths), columns), np.int64)
    path_status = np.zeros((len(paths), len(STATUSES)), np.int64)
    if found.num_rows:
        buckets = found.column("bucket").to_numpy()
        counts = found.column("events").to_numpy()
        priority = found.column("priority").fill_null(0).to_numpy()
        priority = np.where((priority >= 1) & (priority <= 4), priority, 0)
        status = found.column("status").fill_null(-1).to_numpy()
        status = np.where((status >= 0) & (status <= 3), status, len(STATUSES) - 1)
        np.add.at(events, (index, buckets), counts)
        np.add.at(by_priority, (priority, buckets), counts)
        np.add.at(by_status, (status, buckets), counts)
        np.add.at(path_priority, (index, priority), counts)
        np.add.at(path_status, (index, status), counts)
    return AlarmCoverage(
        flow, window, grid, paths, events, by_priority, by_status, path_priority, path_status
    )
