"""Fetch one window of history whole: ask, ask again for what is missing, continue capped
raw answers, and keep exactly the rows in `[start, end)`.

This is the extract stage, next to the wire code it drives: the pipeline hands it tag
paths and a `Window` of datetimes; epoch milliseconds stay here.

* **Bounds.** The node's bounds are inclusive; a raw query starts 1 ms before the window
  so that a node whose start bound is exclusive still returns a sample on the boundary.
  A boundary sample belongs to exactly one window: rows outside `[start, end)` are left to
  the neighbouring window. Rows outside the *query* (a negative, garbled or far-future
  timestamp) are dropped and counted (`rows_out_of_range`); they never steer continuation.
  An answer most of whose rows fall outside its query (stamps in a unit normalise/stamps.py
  does not read, another window) proves nothing about the window: it is refused
  (`refuse_mostly_outside`), never complete.
* **Buckets** (aggregated): stored at their start, wherever the node stamps them
  (`BucketStamping`, learned from the answers and shared by the engine's fetchers).
* **Types.** Text values of `number` and `boolean` tags go to their type's column
  (normalise/typed.py); those that do not parse are kept and counted (`values_not_of_type`).
* **Missing tags.** A tag asked for and left out of the answer (absent, `data: null`, or
  the answer keyed by other tags) is asked for again, on its own, up to `reasks` times,
  since nodes drop tags transiently. One that stays missing is returned in `missing`, its
  rows dropped: the caller decides (stop, or record it as missing); it is never complete.
  Present with `data: null` when asked again alone is the node's "no history": no rows,
  complete (a tag asked alone is not one a batch crowded out).
* **Continuation** (raw): `connectors.pager` says which tags may have more and from where,
  reading each answer per tag and as a whole (a node may cap the whole answer).
* **delta / filter** results depend on where a query starts (docs/node-behaviour.md): the
  query starts exactly on the window's start; the planner puts windows on a grid.
* **Size.** An answer longer than the node's `max_answer_bytes` is left unread
  (`AnswerTooLarge`) and the question asked again in halves: a batch of tags by tag (by
  path), one tag's raw window or an alarm window by time (half-open halves, so no row
  twice), down to `MIN_SPLIT`; an aggregated, delta or filter answer of one tag cannot be
  cut (it depends on where the query starts) and stops the chunk naming the setting.
  Memory then follows the cap, not the window's density; `SplitNotice` says so once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.errors import AnswerTooLarge, MalformedAnswer
from connectors.normalise.alarms import parse_alarm_history_answer
from connectors.normalise.history import HistoryPage, TagStats, assign_seq, parse_history_answer
from connectors.normalise.stamps import BucketStamping, StampError
from connectors.normalise.typed import by_configured_type
from connectors.options import AlarmFilter, HistoryOptions
from connectors.pager import CapGuess, RawPager, TagPage
from connectors.schema import ALARM_HISTORY_SCHEMA, TAG_HISTORY_ENCODED_SCHEMA, sort_key
from connectors.timewindow import Window

log = logging.getLogger("historian.fetch")

_ONE_MS = timedelta(milliseconds=1)
# Alarm event stamps below this are epoch seconds (1e11 ms is 1973; 1e11 s is year 5138).
_SECONDS_BELOW = 100_000_000_000
HISTORY_MANY = "tag.historyMany"
# The node's aggregation interval when `options.interval` is not sent (node-facts.md).
DEFAULT_INTERVAL_MS = 60_000
HISTORY_FILTER = "tag.historyFilter"
# A window is not cut below this: a tag with more than `max_answer_bytes` of samples in one
# second is not a plausible node, and a node that ignores the window stops the halving here.
MIN_SPLIT = timedelta(seconds=1)


class SplitNotice:
    """Says once (per engine: a run's unit) that answers were asked again in pieces, and
    which setting asks less often; every split after that is silent."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.splits = 0
        self._lock = threading.Lock()

    def split(self, error: AnswerTooLarge) -> None:
        with self._lock:
            self.splits += 1
            if self.splits > 1:
                return
        log.warning(
            "node %s: %s answers over %s bytes are asked again in smaller pieces (tags, then "
            "time); memory follows that cap. Raise nodes.%s.max_answer_mb to ask once, at "
            "the cost of memory (said once)",
            self.node,
            error.operation,
            f"{error.limit_bytes:,}",
            self.node,
        )


class HistoryClient(Protocol):
    """The part of `connectors.client.NodeClient` the fetchers use."""

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
class Fetched:
    """One window's rows (TAG_HISTORY_ENCODED_SCHEMA or ALARM_HISTORY_SCHEMA, sorted, `seq`
    numbered) and what it took to get them."""

    table: pa.Table
    missing: tuple[str, ...] = ()
    requests: int = 0
    bytes_received: int = 0
    continuations: int = 0
    rows_out_of_range: int = 0
    # Text values of number or boolean tags that do not parse as their type (kept as text).
    values_not_of_type: int = 0


class Part(NamedTuple):
    """One piece of a window's rows as it was asked: its members, its window, its rows."""

    members: tuple[str, ...]
    window: Window
    fetched: Fetched


@dataclass
class _Ask:
    """One request: the paths to ask (None: the filter query) and over which bounds."""

    paths: tuple[str, ...] | None
    start_ms: int
    end_ms: int

    @property
    def operation(self) -> str:
        return HISTORY_FILTER if self.paths is None else HISTORY_MANY


# Tables do not change: one empty table for every window's start, not one made per window
# (a visible share of reading a small page).
_NO_ROWS = TAG_HISTORY_ENCODED_SCHEMA.empty_table()


@dataclass
class _Window:
    """A window being fetched: its bounds in ms, what was kept, what it cost."""

    members: tuple[str, ...]
    start_ms: int
    end_ms: int
    lower_ms: int  # the first query's start: rows before it are outside every query
    label: str
    kept: list[pa.Table] = field(default_factory=list)
    kept_tags: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)
    out: Fetched = field(default_factory=lambda: Fetched(_NO_ROWS))


class HistoryFetcher:
    """Fetch tag-history windows completely (see the module docstring)."""

    def __init__(
        self,
        client: HistoryClient,
        node: str,
        options: HistoryOptions,
        *,
        filter_query: FilterQuery | None = None,
        cap: CapGuess | None = None,
        reasks: int = 3,
        notice: SplitNotice | None = None,
        stamping: BucketStamping | None = None,
        types: Mapping[str, str] | None = None,
    ) -> None:
        self.client = client
        self.node = node
        self.options = options
        self.filter_query = filter_query
        self.cap = cap or CapGuess()
        self.reasks = reasks
        self.notice = notice or SplitNotice(node)
        self.stamping = stamping or BucketStamping()
        self.types = types or {}

    def fetch(self, members: Sequence[str], window: Window, label: str = "") -> Fetched:
        """Every row of `members` in `window`, exactly once; see the module docstring."""
        parts = self.fetch_parts(members, window, label)
        if len(parts) == 1:
            return parts[0].fetched
        return joined([part.fetched for part in parts], members)

    def fetch_parts(self, members: Sequence[str], window: Window, label: str = "") -> list[Part]:
        """`fetch`'s rows in the pieces they were asked in: one part when the answer fit
        `max_answer_bytes`, else one per piece of the split (tags or time in halves), so
        that a caller can write them one at a time and never copy the window's rows whole."""
        try:
            return [Part(tuple(members), window, self._fetch_whole(members, window, label))]
        except AnswerTooLarge as exc:
            # Without its traceback: kept here, it would keep this frame and the frames
            # below it (one answer's bytes among them) alive until a cyclic collection.
            too_large = exc.with_traceback(None)
        pieces = _halves(tuple(members), window, self.options.mode == "raw")
        if not pieces:
            what = f"1 tag ({members[0]!r}) over {window.end - window.start}"
            raise too_large.cut_to(what) from None
        self.notice.split(too_large)
        # The pieces are asked by path: a group's filter cannot be asked for half its tags.
        by_paths = HistoryFetcher(
            self.client,
            self.node,
            self.options,
            cap=self.cap,
            reasks=self.reasks,
            notice=self.notice,
            stamping=self.stamping,
            types=self.types,
        )
        return [part for tags, half in pieces for part in by_paths.fetch_parts(tags, half, label)]

    def _fetch_whole(self, members: Sequence[str], window: Window, label: str) -> Fetched:
        """`fetch` in as many requests as continuation needs, each answer whole."""
        raw = self.options.mode == "raw"
        lower = window.start - _ONE_MS if raw else window.start
        state = _Window(tuple(members), window.start_ms, window.end_ms, _ms(lower), label)
        first = _Ask(None if self.filter_query else state.members, state.lower_ms, state.end_ms)
        pager = RawPager(
            state.members,
            state.end_ms,
            cap=self.cap,
            limit=self.options.limit,
            where=label,
            start_ms=state.start_ms,
        )
        self._answer(state, first, state.members, pager if raw else None, seen=None)
        while raw and pager.has_more:
            for start_ms, seen in sorted(pager.next_starts().items()):
                state.out.continuations += 1
                # 1 ms early: a node whose start bound is exclusive still returns the rest
                # of the millisecond the previous page stopped on.
                ask = _Ask(tuple(seen), start_ms - 1, state.end_ms)
                self._answer(state, ask, tuple(seen), pager, seen=(start_ms, seen))
        return self._finish(state)

    # -- one question, asked until every tag of it is answered ---------------------------

    def _answer(
        self,
        state: _Window,
        ask: _Ask,
        wanted: tuple[str, ...],
        pager: RawPager | None,
        seen: tuple[int, dict[str, int]] | None,
        first_attempt: int = 0,
    ) -> None:
        """Ask, keep what the answer holds of `wanted`, and ask again (by path) for the
        tags it left out; those still left out after `reasks` are missing for the window.

        A tag present with `data: null` is left out too (nodes drop tags so, transiently),
        unless it is asked again alone and still answered null: then the node holds no
        history for it (the spec's own `request.data` is null), which is no rows, complete.
        Still null after one re-ask with others, each such tag is asked alone.
        """
        left = wanted
        for attempt in range(first_attempt, self.reasks + 1):
            page = self._page(state, ask)
            answered = page.answered()
            if attempt and len(left) == 1 and left[0] in page.tags:
                answered.add(left[0])  # asked again, alone, and null: no history
            take = [tag for tag in left if tag in answered]
            self._keep(state, page, set(take), ask, pager, seen)
            left = tuple(tag for tag in left if tag not in answered)
            if not left:
                return
            if attempt < self.reasks:
                log.warning(
                    "%s: %d of %d tags left out of the answer (%r first) for %s; asking again "
                    "(%d of %d)",
                    ask.operation,
                    len(left),
                    len(wanted),
                    left[0],
                    state.label,
                    attempt + 1,
                    self.reasks,
                )
                if attempt and len(left) > 1:
                    left = self._alone(state, ask, left, page, pager, seen, attempt + 1)
                    if not left:
                        return
                ask = _Ask(left, ask.start_ms, ask.end_ms)
        state.missing.update(left)
        if pager is not None:
            pager.finish(left)

    def _alone(
        self,
        state: _Window,
        ask: _Ask,
        left: tuple[str, ...],
        page: HistoryPage,
        pager: RawPager | None,
        seen: tuple[int, dict[str, int]] | None,
        attempt: int,
    ) -> tuple[str, ...]:
        """Ask each tag of `left` that `page` held with `data: null` alone; the others."""
        nulls = [tag for tag in left if tag in page.tags]
        for tag in nulls:
            self._answer(
                state, _Ask((tag,), ask.start_ms, ask.end_ms), (tag,), pager, seen, attempt
            )
        return tuple(tag for tag in left if tag not in page.tags)

    def _page(self, state: _Window, ask: _Ask) -> HistoryPage:
        """One request, its answer read (a malformed one raised: see `counted`)."""
        start, end = _from_ms(ask.start_ms), _from_ms(ask.end_ms)

        def request() -> bytes:
            if ask.paths is None:
                assert self.filter_query is not None
                return self.client.tag_history_filter_bytes(
                    [self.filter_query.group],
                    start,
                    end,
                    self.options,
                    filter_regex=self.filter_query.regex,
                    recurrent=self.filter_query.recurrent,
                )
            return self.client.tag_history_many_bytes(list(ask.paths), start, end, self.options)

        def parse(body: bytes) -> HistoryPage:
            return parse_history_answer(
                body, self.node, operation=ask.operation, chunk_label=state.label, encoded=True
            )

        page = counted(request, parse, state.out)
        if self.options.mode == "aggregated":
            page = self._at_bucket_starts(page, ask, state.label)
        return page

    def _at_bucket_starts(self, page: HistoryPage, ask: _Ask, label: str) -> HistoryPage:
        """The aggregated page with each row stamped at its bucket's start, whatever the
        node stamps (`BucketStamping`); a page that cannot say is refused."""
        column = page.table.column("ts")
        ts = column.cast(pa.int64()).to_numpy()
        interval_ms = self.options.interval_ms or DEFAULT_INTERVAL_MS
        outside = int(np.count_nonzero((ts < ask.start_ms) | (ts > ask.end_ms)))
        query = Window.from_ms(ask.start_ms, ask.end_ms)
        refuse_mostly_outside(column, outside, query, ask.operation, label)
        try:
            starts = self.stamping.starts_of(ts, ask.start_ms, ask.end_ms, interval_ms)
        except StampError as exc:
            raise MalformedAnswer(ask.operation, str(exc), where=label or None) from None
        if starts is None:
            return page
        index = page.table.schema.get_field_index("ts")
        shifted = pa.array(starts, type=pa.int64()).cast(column.type)
        table = page.table.set_column(index, page.table.schema.field(index), shifted)
        return HistoryPage(table, page.tags)

    # -- what a page adds ---------------------------------------------------------------

    def _keep(
        self,
        state: _Window,
        page: HistoryPage,
        take: set[str],
        ask: _Ask,
        pager: RawPager | None,
        seen: tuple[int, dict[str, int]] | None,
    ) -> None:
        """Keep the page's rows of `take` that are new and inside the window, count those
        outside the query, and move the pager's cursors."""
        if not take:
            return
        table = page.table
        if not take.issuperset(page.tags):
            table = table.filter(pc.is_in(table.column("tag"), value_set=pa.array(sorted(take))))
        returned = {tag: _Seen.of(page.tags[tag]) for tag in take}
        ts = table.column("ts").cast(pa.int64())
        found = pc.min_max(ts).as_py()
        low, high = found["min"], found["max"]
        if low is not None and (low < state.lower_ms or high > state.end_ms):
            inside = pc.and_(pc.greater_equal(ts, state.lower_ms), pc.less_equal(ts, state.end_ms))
            outside = table.num_rows - (pc.sum(inside).as_py() or 0)
            refuse_mostly_outside(
                ts,
                outside,
                Window.from_ms(state.lower_ms, state.end_ms),
                ask.operation,
                state.label,
            )
            state.out.rows_out_of_range += outside
            table = table.filter(inside)
            returned = _tag_stats(table, take)
        fresh = returned
        if seen is not None:  # a continuation: only what the earlier pages did not hold
            table = _after_cursor(table, seen[0], seen[1])
            fresh = _tag_stats(table, take)
        if pager is not None:
            # In the answer's order, and its total of every tag: a node may cap the whole.
            pages = {
                tag: _tag_page(returned.get(tag), fresh.get(tag), state.end_ms)
                for tag in page.tags
                if tag in take
            }
            total = sum(each.rows for each in returned.values()) + sum(
                stats.rows for tag, stats in page.tags.items() if tag not in take
            )
            pager.advance(pages, operation=ask.operation, total=total)
        state.kept.append(table)
        state.kept_tags.update(take)

    def _finish(self, state: _Window) -> Fetched:
        """The kept rows (a missing tag's dropped) in `[start, end)`, sorted by (tag, ts)
        with `seq` numbered over all pages."""
        drop = state.missing & state.kept_tags  # answered once, then left out of a page
        tables = [table for table in state.kept if table.num_rows] or state.kept[:1]
        if not tables:
            table = TAG_HISTORY_ENCODED_SCHEMA.empty_table()
        elif len(tables) == 1:
            # One page: its `seq` is already right (the filters drop whole milliseconds).
            table = _by_tag_ts(_inside(tables[0], state.start_ms, state.end_ms, drop))
        else:
            combined = pa.concat_tables([t.cast(TAG_HISTORY_ENCODED_SCHEMA) for t in tables])
            table = assign_seq(_inside(combined, state.start_ms, state.end_ms, drop))
        out = state.out
        out.table, out.values_not_of_type = by_configured_type(table, self.types)
        out.missing = tuple(tag for tag in state.members if tag in state.missing)
        return out


class AlarmFetcher:
    """Fetch alarm-history windows: one request per window, events kept in `[start, end)`.

    `max_priority_here`: a maximum priority the node cannot filter (before 1.21.13),
    applied to the answer. Event stamps in epoch seconds (the element shape is not shown
    in the spec) are read as such; array events in the order `fields` (the node's
    `alarm_fields`) gives, or the answer proves.
    """

    def __init__(
        self,
        client: HistoryClient,
        node: str,
        path: str,
        filt: AlarmFilter,
        *,
        max_priority_here: int | None = None,
        notice: SplitNotice | None = None,
        fields: Sequence[str] | None = None,
    ) -> None:
        self.client = client
        self.node = node
        self.path = path
        self.filt = filt
        self.max_priority_here = max_priority_here
        self.fields = fields
        self.notice = notice or SplitNotice(node)

    def fetch(self, window: Window, label: str = "") -> Fetched:
        """The window's events, in one answer or, over `max_answer_bytes`, in halves."""
        parts = self.fetch_parts(window, label)
        if len(parts) == 1:
            return parts[0].fetched
        # Halves hold disjoint stamps, each sorted: one after the other, still sorted.
        return joined([part.fetched for part in parts], ())

    def fetch_parts(self, window: Window, label: str = "") -> list[Part]:
        """`fetch`'s events in the pieces of time they were asked in (`HistoryFetcher.fetch_parts`)."""
        try:
            return [Part((self.path,), window, self._fetch_whole(window, label))]
        except AnswerTooLarge as exc:
            # Without its traceback: kept here, it would keep this frame and the frames
            # below it (one answer's bytes among them) alive until a cyclic collection.
            too_large = exc.with_traceback(None)
        pieces = _halves((self.path,), window, True)
        if not pieces:
            raise too_large.cut_to(f"alarms over {window.end - window.start}") from None
        self.notice.split(too_large)
        return [part for _, half in pieces for part in self.fetch_parts(half, label)]

    def _fetch_whole(self, window: Window, label: str) -> Fetched:
        out = Fetched(ALARM_HISTORY_SCHEMA.empty_table())
        table = counted(
            lambda: self.client.alarm_history_bytes(self.path, window.start, window.end, self.filt),
            lambda body: parse_alarm_history_answer(
                body, self.node, fields=self.fields, chunk_label=label
            ),
            out,
        )
        table = _alarm_ms(table)
        ts = table.column("ts").cast(pa.int64())
        start_ms, end_ms = window.start_ms, window.end_ms
        in_query = pc.and_(pc.greater_equal(ts, start_ms), pc.less_equal(ts, end_ms))
        out.rows_out_of_range = table.num_rows - (pc.sum(in_query).as_py() or 0)
        refuse_mostly_outside(ts, out.rows_out_of_range, window, "alarm.history", label)
        keep = pc.and_(pc.greater_equal(ts, start_ms), pc.less(ts, end_ms))
        if self.max_priority_here is not None:
            priority = pc.fill_null(table.column("priority").cast(pa.int64()), 0)
            keep = pc.and_(keep, pc.less_equal(priority, self.max_priority_here))
        table = table.filter(keep).sort_by([("ts", "ascending"), ("path", "ascending")])
        # The natural key is (node, path, ts, status): a repeated event is one event.
        out.table = _distinct(table, ["path", "ts", "status"]).cast(ALARM_HISTORY_SCHEMA)
        return out


# -- helpers ----------------------------------------------------------------------------

T = TypeVar("T")


# Answers are read concurrently (the node's connections) but parsed one at a time in a
# process: a parse holds about three copies of its answer at its peak (the body, the data
# texts joined, their CSV translation) beside the rows it makes, and two at once stacked
# their peaks. It holds the GIL for most of its work, so little is lost (BENCHMARKS.md,
# "Flat memory").
_PARSING = threading.Lock()


def counted(request: Callable[[], bytes], parse: Callable[[bytes], T], out: Fetched) -> T:
    """`parse(request())`, the request and its bytes counted in `out`.

    Never asked again here: the client retried what was transient (a proxy's page
    included), and a malformed answer from the node is fatal (`MalformedAnswer`).
    """
    body = request()
    out.requests += 1
    out.bytes_received += len(body)
    with _PARSING:
        return parse(body)


def refuse_mostly_outside(
    ts: pa.Array | pa.ChunkedArray, outside: int, query: Window, operation: str, label: str
) -> None:
    """MalformedAnswer when most rows of an answer (`ts` in ms, `outside` of them outside
    the query) are stamped outside the query: no stray rows beside the window's, but rows
    in a unit this reading does not know, or of another window. Such an answer proves
    nothing about the window, so it is never taken as complete; a few stray rows beside
    rows of the window are dropped and counted by the caller."""
    if not outside or outside * 2 <= len(ts):
        return
    first = pc.min(ts.cast(pa.int64())).as_py()
    raise MalformedAnswer(
        operation,
        f"{outside} of {len(ts)} rows stamped outside the query "
        f"[{_iso(query.start_ms)}, {_iso(query.end_ms)}] (the earliest {first}, read as epoch "
        "ms): not epoch ms, epoch seconds or ISO 8601 stamps of this window; the answer is "
        "not taken as complete",
        where=label or None,
    )


def _iso(ms: int) -> str:
    return _from_ms(ms).isoformat().replace("+00:00", "Z")


def _halves(
    members: tuple[str, ...], window: Window, by_time: bool
) -> list[tuple[tuple[str, ...], Window]]:
    """A question in two: the tags in halves, or one tag's window in halves on a whole
    millisecond (when `by_time` and the window is longer than MIN_SPLIT); [] when it
    cannot be cut."""
    if len(members) > 1:
        middle = len(members) // 2
        return [(members[:middle], window), (members[middle:], window)]
    if not by_time or window.end - window.start <= MIN_SPLIT:
        return []
    start_ms, end_ms = window.start_ms, window.end_ms
    middle_ms = start_ms + (end_ms - start_ms) // 2
    return [
        (members, Window.from_ms(start_ms, middle_ms)),
        (members, Window.from_ms(middle_ms, end_ms)),
    ]


def joined(parts: list[Fetched], members: Sequence[str]) -> Fetched:
    """The pieces of one question as its answer: rows in (tag, ts) order (pieces are
    disjoint by tag or by time, so `seq` stays right), costs added up. The pieces' rows
    are taken out of `parts` and copied into one chunk per column a column at a time, so
    the copy a sink needs is made here, never beside a second whole copy."""
    tables = [part.table for part in parts if part.table.num_rows] or [parts[0].table]
    for part in parts:
        part.table = part.table.schema.empty_table()
    table = _one_chunk(tables)
    out = Fetched(_by_tag_ts(table) if members else table)
    missing: set[str] = set()
    for part in parts:
        missing.update(part.missing)
        out.requests += part.requests
        out.bytes_received += part.bytes_received
        out.continuations += part.continuations
        out.rows_out_of_range += part.rows_out_of_range
        out.values_not_of_type += part.values_not_of_type
    out.missing = tuple(tag for tag in members if tag in missing)
    return out


def _one_chunk(tables: list[pa.Table]) -> pa.Table:
    """The tables one after the other, one chunk per column; `tables` is emptied, so each
    column's pieces are freed as soon as that column is copied."""
    if len(tables) == 1:
        return tables.pop()
    table = pa.concat_tables(tables)
    tables.clear()
    schema, columns = table.schema, table.columns
    del table
    for index, column in enumerate(columns):
        columns[index] = column.combine_chunks()
        del column
    return pa.Table.from_arrays(columns, schema=schema)


def _ms(moment: datetime) -> int:
    return Window(moment, moment + _ONE_MS).start_ms


def _from_ms(ms: int) -> datetime:
    return Window.from_ms(ms, ms + 1).start


class _Seen(NamedTuple):
    """A tag's rows in part of a page: how many, the newest stamp and how many are on it."""

    rows: int
    newest: int
    at_newest: int

    @classmethod
    def of(cls, stats: TagStats) -> _Seen:
        if not stats.rows or stats.last_ts_ms is None:
            return cls(0, 0, 0)
        return cls(stats.rows, stats.last_ts_ms, stats.at_last_ts)


def _tag_stats(table: pa.Table, tags: set[str]) -> dict[str, _Seen]:
    """`_Seen` of each tag of `table` that is in `tags`."""
    if not table.num_rows:
        return {}
    column = table.column("tag").combine_chunks()
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    indices = column.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    names = column.dictionary.to_pylist()
    ts = table.column("ts").cast(pa.int64()).to_numpy()
    size = len(names)
    counts = np.bincount(indices, minlength=size)
    newest = np.full(size, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(newest, indices, ts)
    at_newest = np.bincount(indices[ts == newest[indices]], minlength=size)
    stats: dict[str, _Seen] = {}
    for i, name in enumerate(names):
        if not counts[i] or name not in tags:
            continue
        # A name the dictionary holds twice adds up.
        rows, last, at = stats.get(name, _Seen(0, int(newest[i]), 0))
        if int(newest[i]) > last:
            last, at = int(newest[i]), 0
        if int(newest[i]) == last:
            at += int(at_newest[i])
        stats[name] = _Seen(rows + int(counts[i]), last, at)
    return stats


def _tag_page(returned: _Seen | None, fresh: _Seen | None, end_ms: int) -> TagPage:
    """The pager's view of one tag's page: `returned` its rows inside the query, `fresh`
    those not kept before. A row on the window's end (the query's end is inclusive) means
    the node answered past the window: the tag is complete."""
    if returned is None or not returned.rows:
        return TagPage(0)
    if returned.newest >= end_ms:
        return TagPage(returned.rows, reached_end=True)
    if fresh is None or not fresh.rows:
        return TagPage(returned.rows)
    return TagPage(returned.rows, fresh_last_ms=fresh.newest, fresh_at_last=fresh.at_newest)


def _after_cursor(table: pa.Table, last_ms: int, seen_by_tag: dict[str, int]) -> pa.Table:
    """Rows of the asked tags that earlier pages did not hold: after `last_ms`, or on it
    beyond the first `seen` (a page's `seq` numbers a tag's rows on one ms in answer order)."""
    position = pc.index_in(table.column("tag"), value_set=pa.array(list(seen_by_tag)))
    seen = pc.take(pa.array(list(seen_by_tag.values()), type=pa.int64()), pc.fill_null(position, 0))
    ts = table.column("ts").cast(pa.int64())
    on_last = pc.and_(
        pc.equal(ts, last_ms), pc.greater_equal(table.column("seq").cast(pa.int64()), seen)
    )
    keep = pc.and_(pc.is_valid(position), pc.or_(pc.greater(ts, last_ms), on_last))
    return table.filter(keep)


def _inside(table: pa.Table, start_ms: int, end_ms: int, drop: set[str]) -> pa.Table:
    """Rows in `[start, end)` of tags not in `drop`, as TAG_HISTORY_ENCODED_SCHEMA."""
    ts = table.column("ts").cast(pa.int64())
    keep = pc.and_(pc.greater_equal(ts, start_ms), pc.less(ts, end_ms))
    if drop:
        dropped = pc.is_in(table.column("tag"), value_set=pa.array(sorted(drop)))
        keep = pc.and_(keep, pc.invert(dropped))
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


def _alarm_ms(table: pa.Table) -> pa.Table:
    """Event and acknowledgement stamps in epoch seconds (below 1e11) as milliseconds."""
    for name in ("ts", "ack_ts"):
        index = table.schema.get_field_index(name)
        column = table.column(index)
        ms = column.cast(pa.int64())
        small = pc.less(pc.abs(ms), _SECONDS_BELOW)
        if pc.any(small).as_py():
            scaled = pc.if_else(small, pc.multiply(ms, 1000), ms)
            table = table.set_column(index, table.schema.field(index), scaled.cast(column.type))
    return table


def _distinct(table: pa.Table, keys: list[str]) -> pa.Table:
    if table.num_rows < 2:
        return table
    index = pa.array(range(table.num_rows), type=pa.int64())
    with_index = table.select(keys).append_column("__i", index)
    first = with_index.group_by(keys, use_threads=False).aggregate([("__i", "min")])
    chosen = pc.sort_indices(first.column("__i_min"))
    rows = pc.take(first.column("__i_min"), chosen)
    return table.take(rows)
