"""Fetch planned chunks from the node and turn them into exactly the node's rows.

One chunk is (tag batch x half-open window). The engine asks the node, normalises the
answer, continues capped raw answers until every tag's window is complete, keeps only
rows inside `[start, end)` (the node's bounds are inclusive; a boundary sample belongs to
exactly one window), and numbers samples that share a millisecond (`seq`).

Window starts and the modes (documented in docs/node-behaviour.md as well):

* raw: the query starts 1 ms before the window so that a node with an exclusive start
  bound still returns a sample on the boundary; rows outside the window are dropped.
* aggregated: windows are aligned by the planner to UTC multiples of `interval`, and the
  query starts exactly on the window start, so buckets land on :00, :15, :30, :45.
* delta and filter: the node computes them from the first sample of the query, so a
  result depends on where a window starts. The engine starts every query exactly on a
  grid-aligned window boundary, so the same window always gives the same rows and a
  re-run is idempotent; the first sample of every window is reported (as a new reference),
  which a single long query over the same range would not report. Use raw mode when the
  exact event set of a long range matters.

Memory stays bounded: `stream` keeps at most `max_in_flight` chunks fetching and yields
each chunk's frame as soon as it is complete.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import MalformedAnswer
from connectors.normalise import (
    HistoryPage,
    assign_seq,
    history_frame,
    parse_alarm_history_answer,
    parse_history_answer,
)
from connectors.options import AlarmFilter, HistoryOptions
from connectors.schema import (
    ALARM_HISTORY_SCHEMA,
    TAG_HISTORY_ENCODED_SCHEMA,
    frame_from_table,
    sort_key,
)
from connectors.timewindow import Window
from pipelines.planning import Chunk

log = logging.getLogger("historian.engine")

# A raw answer whose busiest tag has at least this many samples may have hit a node cap.
_MIN_CAP_GUESS = 2
_ONE_MS = timedelta(milliseconds=1)


class HistoryClient(Protocol):
    """The part of `connectors.client.NodeClient` the engine uses."""

    def tag_history_many_bytes(
        self, paths: Sequence[str], start: datetime, end: datetime, options: HistoryOptions
    ) -> bytes: ...

    def tag_history_filter_bytes(
        self,
        paths: Sequence[str],
        start: datetime,
        end: datetime,
        options: HistoryOptions,
        *,
        filter_regex: str | None = None,
        recurrent: bool | None = None,
    ) -> bytes: ...

    def alarm_history_bytes(
        self, path: str, start: datetime, end: datetime, filt: AlarmFilter | None = None
    ) -> bytes: ...


@dataclass(frozen=True)
class FilterQuery:
    """Fetch through `historyFilter`: one group path and a regex instead of a path list."""

    group: str
    regex: str | None
    recurrent: bool


@dataclass
class ChunkResult:
    """A chunk's rows and what it cost to get them."""

    chunk: Chunk
    frame: pd.DataFrame
    rows_fetched: int
    requests: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    continuations: int = 0
    # The planned chunks a joined result holds (pipelines/coalesce.py); empty for one chunk.
    parts: tuple[Chunk, ...] = ()

    @property
    def chunks(self) -> int:
        """Planned chunks this result completes."""
        return len(self.parts) or 1


@dataclass
class _CapKnowledge:
    """What the engine has learned about the node's own cap on raw samples per tag."""

    known: int | None = None
    lower_bound: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def maybe_capped(self, rows: int, busiest: int, limit: int | None) -> bool:
        if rows <= 0:
            return False
        if limit is not None and rows >= limit:
            return True
        if self.known is not None:
            return rows >= self.known
        return rows == busiest and rows >= max(self.lower_bound, _MIN_CAP_GUESS)

    def learn(self, first_page_rows: int, found_more: bool) -> None:
        with self.lock:
            if found_more:
                if self.known is None or first_page_rows < self.known:
                    self.known = first_page_rows
                    log.info("node caps raw answers at %d samples per tag", first_page_rows)
            else:
                self.lower_bound = max(self.lower_bound, first_page_rows)


class HistoryEngine:
    """Fetch tag-history chunks; raw answers are continued until complete."""

    def __init__(
        self,
        client: HistoryClient,
        node: str,
        options: HistoryOptions,
        *,
        filter_query: FilterQuery | None = None,
        raw_cap: int | None = None,
        max_in_flight: int = 4,
        malformed_retries: int = 3,
    ) -> None:
        self.client = client
        self.malformed_retries = malformed_retries
        self.node = node
        self.options = options
        self.filter_query = filter_query
        self.max_in_flight = max(1, max_in_flight)
        self._cap = _CapKnowledge(known=raw_cap)

    # -- one chunk -------------------------------------------------------------------

    def fetch_chunk(self, chunk: Chunk) -> ChunkResult:
        """All rows of the chunk's tags in its window, exactly once each."""
        began = time.perf_counter()
        result = ChunkResult(chunk=chunk, frame=pd.DataFrame(), rows_fetched=0)
        members = set(chunk.members)
        window = chunk.window
        raw = self.options.mode == "raw"
        query_start = window.start - _ONE_MS if raw else window.start
        page = self._query(chunk, chunk.members, Window(query_start, window.end), result)
        tables = [page.table]
        if raw:
            tables.extend(self._continue_capped(chunk, page, result))
        # Continuation pages hold only asked members: the first page's tags tell whether
        # any row of another tag is there to drop.
        others = not members.issuperset(page.tags)
        if len(tables) > 1:
            # `seq` of a page counts only that page: renumber over the combined pages.
            table = assign_seq(_inside(pa.concat_tables(tables), window, members, others))
        else:
            # One page: its `seq` is already the chunk's (the window filter drops whole
            # milliseconds); only the (tag, ts) order may be missing, and usually is not.
            table = _by_tag_ts(_inside(tables[0], window, members, others))
        result.frame = history_frame(table)
        result.rows_fetched = table.num_rows
        result.seconds = time.perf_counter() - began
        return result

    def _query(
        self, chunk: Chunk, paths: Sequence[str], window: Window, result: ChunkResult
    ) -> HistoryPage:
        """One request, re-asked when the answer is malformed (an HTML page from a proxy, a
        body cut short): such answers are usually transient, and a chunk is only written
        from a complete answer. A malformed answer that persists is an error."""
        for attempt in range(self.malformed_retries + 1):
            if self.filter_query is not None and len(paths) == len(chunk.members):
                body = self.client.tag_history_filter_bytes(
                    [self.filter_query.group],
                    window.start,
                    window.end,
                    self.options,
                    filter_regex=self.filter_query.regex,
                    recurrent=self.filter_query.recurrent,
                )
                operation = "tag.historyFilter"
            else:
                body = self.client.tag_history_many_bytes(
                    list(paths), window.start, window.end, self.options
                )
                operation = "tag.historyMany"
            result.requests += 1
            result.bytes_received += len(body)
            try:
                return parse_history_answer(
                    body, self.node, operation=operation, chunk_label=chunk.label, encoded=True
                )
            except MalformedAnswer as exc:
                if attempt >= self.malformed_retries:
                    raise
                log.warning("%s; asking again (%d of %d)", exc, attempt + 1, self.malformed_retries)
                time.sleep(min(2.0, 0.1 * 2**attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _continue_capped(
        self, chunk: Chunk, first: HistoryPage, result: ChunkResult
    ) -> Iterator[pa.Table]:
        """Pages after the last timestamp of every tag that may have hit a cap."""
        window = chunk.window
        limit = self.options.limit
        # tag -> (last ts, rows of that tag already seen on it)
        pending: dict[str, tuple[int, int]] = {}
        first_rows: dict[str, int] = {}
        busiest = max((s.rows for s in first.tags.values()), default=0)
        for tag, stats in first.tags.items():
            if tag not in chunk.members or stats.last_ts_ms is None:
                continue
            if stats.last_ts_ms < window.end_ms and self._cap.maybe_capped(
                stats.rows, busiest, limit
            ):
                pending[tag] = (stats.last_ts_ms, stats.at_last_ts)
                if self._cap.known is None and (limit is None or stats.rows < limit):
                    first_rows[tag] = stats.rows
        while pending:
            # Tags that stopped on the same millisecond continue together in one request.
            by_ts: dict[int, dict[str, int]] = {}
            for tag, (last_ts, seen) in pending.items():
                by_ts.setdefault(last_ts, {})[tag] = seen
            next_pending: dict[str, tuple[int, int]] = {}
            for last_ts, seen_by_tag in sorted(by_ts.items()):
                # 1 ms early, so that a node with an exclusive start bound still returns
                # the samples on last_ts that the previous page could not hold.
                start = Window.from_ms(last_ts - 1, max(last_ts + 1, window.end_ms))
                result.continuations += 1
                page = self._query(chunk, list(seen_by_tag), start, result)
                fresh = _fresh_rows(page.table, last_ts, seen_by_tag)
                with_more = (
                    set(fresh.column("tag").unique().to_pylist()) if fresh.num_rows else set()
                )
                busiest = max((s.rows for s in page.tags.values()), default=0)
                for tag in seen_by_tag:
                    found_more = tag in with_more
                    if tag in first_rows:
                        self._cap.learn(first_rows.pop(tag), found_more)
                    page_stats = page.tags.get(tag)
                    if not found_more or page_stats is None or page_stats.last_ts_ms is None:
                        continue
                    if page_stats.last_ts_ms < window.end_ms and self._cap.maybe_capped(
                        page_stats.rows, busiest, limit
                    ):
                        if page_stats.last_ts_ms == last_ts:
                            raise MalformedAnswer(
                                "tag.historyMany",
                                f"more samples on {last_ts} ms than the node returns in one "
                                "answer; cannot page past them",
                                where=f"{tag} in {chunk.label}",
                            )
                        next_pending[tag] = (page_stats.last_ts_ms, page_stats.at_last_ts)
                if fresh.num_rows:
                    yield fresh
            pending = next_pending

    # -- many chunks -----------------------------------------------------------------

    def stream(self, chunks: Iterable[Chunk]) -> Iterator[ChunkResult]:
        """Fetch chunks concurrently, at most `max_in_flight` at once; yield as they finish."""
        yield from stream_bounded(self.fetch_chunk, chunks, self.max_in_flight)


class AlarmEngine:
    """Fetch alarm-history chunks: one request per window, rows kept in `[start, end)`."""

    def __init__(
        self,
        client: HistoryClient,
        node: str,
        path: str,
        filt: AlarmFilter,
        *,
        max_in_flight: int = 2,
        malformed_retries: int = 3,
    ) -> None:
        self.client = client
        self.malformed_retries = malformed_retries
        self.node = node
        self.path = path
        self.filt = filt
        self.max_in_flight = max(1, max_in_flight)

    def fetch_chunk(self, chunk: Chunk) -> ChunkResult:
        began = time.perf_counter()
        window = chunk.window
        requests = 0
        for attempt in range(self.malformed_retries + 1):
            body = self.client.alarm_history_bytes(self.path, window.start, window.end, self.filt)
            requests += 1
            try:
                table = parse_alarm_history_answer(body, self.node, chunk_label=chunk.label)
                break
            except MalformedAnswer as exc:
                if attempt >= self.malformed_retries:
                    raise
                log.warning("%s; asking again (%d of %d)", exc, attempt + 1, self.malformed_retries)
                time.sleep(min(2.0, 0.1 * 2**attempt))
        ts = table.column("ts").cast(pa.int64())
        keep = pc.and_(pc.greater_equal(ts, window.start_ms), pc.less(ts, window.end_ms))
        table = table.filter(keep).sort_by([("ts", "ascending"), ("path", "ascending")])
        # The natural key is (node, path, ts, status): a repeated event is one event.
        table = _distinct(table, ["path", "ts", "status"])
        frame = frame_from_table(table.cast(ALARM_HISTORY_SCHEMA))
        return ChunkResult(
            chunk=chunk,
            frame=frame,
            rows_fetched=table.num_rows,
            requests=requests,
            bytes_received=len(body),
            seconds=time.perf_counter() - began,
        )

    def stream(self, chunks: Iterable[Chunk]) -> Iterator[ChunkResult]:
        yield from stream_bounded(self.fetch_chunk, chunks, self.max_in_flight)


def stream_bounded(
    fetch: Callable[[Chunk], ChunkResult], chunks: Iterable[Chunk], max_in_flight: int
) -> Iterator[ChunkResult]:
    """Run `fetch` over chunks in a thread pool, never more than `max_in_flight` pending.

    The first failure cancels what has not started and is raised after running fetches end;
    results already yielded stay yielded (the caller has written them).
    """
    iterator = iter(chunks)
    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="fetch") as pool:
        in_flight: set[Future[ChunkResult]] = set()

        def refill() -> None:
            while len(in_flight) < max_in_flight:
                chunk = next(iterator, None)
                if chunk is None:
                    return
                in_flight.add(pool.submit(fetch, chunk))

        try:
            refill()
            while in_flight:
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                in_flight.difference_update(done)
                # Refill before handing results out: fetching goes on while the caller
                # writes (at most 2 x max_in_flight chunks held at once).
                refill()
                for future in done:
                    yield future.result()
        finally:
            for future in in_flight:
                future.cancel()


def _fresh_rows(table: pa.Table, last_ts: int, seen_by_tag: dict[str, int]) -> pa.Table:
    """Rows of the asked tags that the previous page did not hold: after `last_ts`, or on it
    beyond the first `seen` (a page's `seq` numbers a tag's rows on one ms in answer order)."""
    position = pc.index_in(table.column("tag"), value_set=pa.array(list(seen_by_tag)))
    seen = pc.take(pa.array(list(seen_by_tag.values()), type=pa.int64()), pc.fill_null(position, 0))
    ts = table.column("ts").cast(pa.int64())
    on_last = pc.and_(
        pc.equal(ts, last_ts), pc.greater_equal(table.column("seq").cast(pa.int64()), seen)
    )
    keep = pc.and_(pc.is_valid(position), pc.or_(pc.greater(ts, last_ts), on_last))
    return table.filter(keep)


def _inside(table: pa.Table, window: Window, members: set[str], others: bool = True) -> pa.Table:
    """Rows of `members` in `[start, end)`; `others` False: every row's tag is a member.
    The pages are of TAG_HISTORY_ENCODED_SCHEMA (`node` and `tag` dictionaries), and so is
    the result."""
    ts = table.column("ts").cast(pa.int64())
    keep = pc.and_(pc.greater_equal(ts, window.start_ms), pc.less(ts, window.end_ms))
    if others:
        keep = pc.and_(keep, pc.is_in(table.column("tag"), value_set=pa.array(sorted(members))))
    if pc.all(keep).as_py() is not False:  # nothing to drop: no copy of every column
        return table.cast(TAG_HISTORY_ENCODED_SCHEMA)
    return table.filter(keep).cast(TAG_HISTORY_ENCODED_SCHEMA)


def _by_tag_ts(table: pa.Table) -> pa.Table:
    """Rows in (tag, ts) order, ties in their order (what `assign_seq` gives a single page)."""
    n = table.num_rows
    if n < 2:
        return table
    # A dictionary-encoded tag is compared by the rank of its name: no string compared.
    keys = pa.table({"tag": sort_key(table.column("tag")), "ts": table.column("ts")})
    tag, ts = keys.column("tag"), keys.column("ts")
    tag_before, tag_after = tag.slice(0, n - 1), tag.slice(1)
    ordered = pc.or_(
        pc.less(tag_before, tag_after),
        pc.and_(pc.equal(tag_before, tag_after), pc.less_equal(ts.slice(0, n - 1), ts.slice(1))),
    )
    if pc.all(ordered).as_py():
        return table
    return table.take(pc.sort_indices(keys, sort_keys=[("tag", "ascending"), ("ts", "ascending")]))


def _distinct(table: pa.Table, keys: list[str]) -> pa.Table:
    if table.num_rows < 2:
        return table
    index = pa.array(range(table.num_rows), type=pa.int64())
    with_index = table.select(keys).append_column("__i", index)
    first = with_index.group_by(keys, use_threads=False).aggregate([("__i", "min")])
    chosen = pc.sort_indices(first.column("__i_min"))
    rows = pc.take(first.column("__i_min"), chosen)
    return table.take(rows)
