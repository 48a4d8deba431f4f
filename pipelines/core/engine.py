"""Fetch planned chunks from the node, concurrently and bounded, as frames ready to write.

One chunk is (tag batch x half-open window). The fetching itself (asking, asking again
for tags left out, continuing capped raw answers, keeping exactly `[start, end)`) is
`connectors.fetch`, next to the wire code; this module decides what a chunk's outcome
means for the pipeline:

* a tag the node keeps leaving out of its answers stops the run with one line naming the
  tag and the chunk when the flow names it explicitly (`missing_is_fatal`); a tag that a
  group or browse selection resolved is left out of the chunk's scope instead, so it is
  never marked complete for that window, and recorded as missing there
  (`pipelines.state.missing_member`, shown by `historian state`);
* rows stamped outside the query are counted (`rows_out_of_range`) for the summary;
* whether a failed chunk is worth re-running whole (`chunk_retry_may_help`): the one
  retry decision above the client's per request (docs/architecture.md, "Retries"), and
  the re-runs themselves (`fetch_chunk`), wherever the chunk is fetched;
* how a unit's chunks are fetched (`FetchJob`): decided once when the unit is planned, so
  the run's own threads, Prefect tasks and Dask workers build the same engine.

Memory stays bounded: `stream` keeps at most `max_in_flight` chunks fetching and at most
`max_in_flight + 1` held between the start of a fetch and the writer's return for the
next (the one being written included), and yields each chunk's rows as soon as they are
complete. `HELD` counts the chunks this process holds, fetching or fetched, until their
rows are gone: what a run's memory follows (tests/pipelines/core/test_memory_bound.py).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial
from itertools import pairwise
from typing import TypeVar

import pandas as pd
import pyarrow as pa
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_fixed,
)

from connectors.client import NodeClient, asking_for
from connectors.errors import NodeTimeout, RetriesExhausted, TransientNodeError, UnknownTag
from connectors.fetch import (
    HISTORY_FILTER,
    HISTORY_MANY,
    AlarmFetcher,
    Fetched,
    FilterQuery,
    HistoryClient,
    HistoryFetcher,
    SplitNotice,
)
from connectors.normalise.history import history_table
from connectors.normalise.stamps import BucketStamping
from connectors.options import AlarmFilter, HistoryOptions
from connectors.pager import CapGuess
from connectors.schema import frame_from_table
from connectors.settings import NodeSettings
from connectors.timewindow import Window
from connectors.version import NodeVersion, adapt_alarm_filter
from pipelines.planning import Chunk, short_duration, sub_chunk, window_text
from pipelines.state import missing_member
from sinks.base import SinkUnavailable

log = logging.getLogger("historian.engine")

T = TypeVar("T")

__all__ = [
    "CHUNK_RETRIES",
    "CHUNK_RETRY_DELAY_S",
    "FETCHING",
    "HELD",
    "AlarmEngine",
    "ChunkResult",
    "FetchJob",
    "FilterQuery",
    "Gauge",
    "HistoryClient",
    "HistoryEngine",
    "chunk_retry_may_help",
    "stream_bounded",
]

# A failed chunk is re-run whole at most this often (safe: writes replace their scope).
CHUNK_RETRIES = 2
CHUNK_RETRY_DELAY_S = 2.0


class Gauge:
    """How many of something are held at once, and the most seen (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.peak = 0

    def up(self) -> None:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)

    def down(self) -> None:
        with self._lock:
            self.now -= 1

    def reset_peak(self) -> None:
        """From here on, `peak` is the most seen from now."""
        with self._lock:
            self.peak = self.now


# Chunks this process holds: from the start of a chunk's fetch until its fetched result
# is gone (written and dropped, wherever it went), or its fetch failed; `FETCHING`: those
# of them still being fetched.
HELD = Gauge()
FETCHING = Gauge()


def held(fetch: Callable[[], ChunkResult]) -> ChunkResult:
    """`fetch()`, counted in `HELD` from now until its result is collected."""
    HELD.up()
    FETCHING.up()
    try:
        result = fetch()
    except BaseException:
        HELD.down()
        raise
    finally:
        FETCHING.down()
    weakref.finalize(result, HELD.down)
    return result


def chunk_retry_may_help(error: BaseException) -> bool:
    """Is re-running a failed chunk worth it? Only when its failure may pass: a transient
    node error that reached the chunk un-retried (the client's `retries: 0`), or a sink
    that is unreachable for now. Never a fatal node error: `RetriesExhausted` is one (the
    client already asked again; a chunk retry would multiply the attempts), and so is a
    malformed answer (the node would answer alike)."""
    return isinstance(error, TransientNodeError | SinkUnavailable)


def retrying(
    call: Callable[[], T],
    what: str,
    *,
    retries: int = CHUNK_RETRIES,
    delay_s: float | None = None,
) -> T:
    """`call()`, run again up to `retries` times after `delay_s` (CHUNK_RETRY_DELAY_S)
    when its failure may pass (`chunk_retry_may_help`); the last failure is raised. `what`
    names it in the log."""
    pause = CHUNK_RETRY_DELAY_S if delay_s is None else delay_s

    def say(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        log.warning("%s failed (%s): run again in %.0f s", what, error, pause)

    runs = Retrying(
        stop=stop_after_attempt(retries + 1),
        wait=wait_fixed(pause),
        retry=retry_if_exception(chunk_retry_may_help),
        before_sleep=say,
        reraise=True,
    )
    return runs(call)


# `window: auto` cuts a window's requests no finer than this when they keep timing out.
MIN_PIECE = timedelta(minutes=1)


class WindowTimeouts:
    """What a unit does when one window's requests outlast the client's retries by timing
    out (`outlasted`): under `window: auto`, where a window can be cut by time (raw history,
    alarms), every window is asked in pieces half as long from then on, said once; otherwise
    the failure names the settings to change. It also names what the unit's requests are
    for in the client's retry warnings (`asking`)."""

    def __init__(self, flow: str, node: str, *, halves: bool = False) -> None:
        self.flow = flow
        self.node = node
        self.halves = halves
        self.pieces = 1
        self._lock = threading.Lock()

    def asking(self, window: Window) -> str:
        """`flow f node n window 2026-11-30T10:00Z..11:00Z`."""
        flow = f"flow {self.flow} " if self.flow else ""
        return f"{flow}node {self.node} window {window_text(window)}"

    def outlasted(
        self, error: RetriesExhausted, window: Window, pieces: int
    ) -> RetriesExhausted | None:
        """None when the window is worth asking again in more pieces (`self.pieces`, now
        more than `pieces`); else the failure to raise, naming what to change when the
        node kept not answering in time."""
        last = error.last
        if not isinstance(last, NodeTimeout) or last.setting == "connect_timeout":
            return error
        with self._lock:
            if self.pieces > pieces:  # another chunk's timeouts cut the windows already
                return None
            piece = (window.end - window.start) / (2 * pieces)
            if self.halves and piece >= MIN_PIECE:
                self.pieces = 2 * pieces
                if pieces == 1:
                    log.warning(
                        "%s: %s: %s on every attempt; window: auto now asks every window in "
                        "pieces of %s (said once)",
                        self.asking(window),
                        last.operation,
                        last.message,
                        short_duration(piece),
                    )
                return None
        flow = f" or shorten flows.{self.flow}.window" if self.flow else ""
        return error.advised(
            f"window {window_text(window)} timed out on every attempt: raise "
            f"nodes.{self.node}.{last.setting}{flow}"
        )

    def fetch(self, chunk: Chunk, fetch_in: Callable[[Chunk, int], ChunkResult]) -> ChunkResult:
        """`fetch_in(chunk, pieces)`, re-run when its failure may pass (`retrying`), and
        asked again in more pieces while `outlasted` says so."""
        with asking_for(self.asking(chunk.window)):
            while True:
                pieces = self.pieces
                try:
                    return retrying(partial(fetch_in, chunk, pieces), f"fetching {chunk.label}")
                except RetriesExhausted as exc:
                    failure = self.outlasted(exc, chunk.window, pieces)
                    if failure is exc:
                        raise
                    if failure is not None:
                        raise failure from None


def pieces_of(window: Window, pieces: int) -> list[Window]:
    """`window` in `pieces` half-open pieces on whole milliseconds, in order."""
    start_ms, end_ms = window.start_ms, window.end_ms
    cuts = [start_ms + (end_ms - start_ms) * i // pieces for i in range(pieces + 1)]
    return [Window.from_ms(a, b) for a, b in pairwise(cuts) if b > a]


@dataclass
class ChunkResult:
    """A chunk's rows and what it cost to get them.

    `rows` is the fetched Arrow table until something asks for `frame`: the small chunks
    of an hourly run are joined (pipelines/core/coalesce.py) as tables, and only the joined
    write becomes a DataFrame (a DataFrame per chunk and back cost more than parsing it).
    """

    chunk: Chunk
    rows: pd.DataFrame | pa.Table
    rows_fetched: int
    requests: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    continuations: int = 0
    # The planned chunks a joined result holds (pipelines/core/coalesce.py); empty for one chunk.
    parts: tuple[Chunk, ...] = ()
    # Tags the node left out of every answer for this window (not in `chunk.members`).
    missing: tuple[str, ...] = ()
    # Rows stamped outside the query (negative, garbled), dropped.
    rows_out_of_range: int = 0
    # Text values of number or boolean tags that do not parse as the tag's type (kept).
    values_not_of_type: int = 0
    # The node's raw cap as the fetcher knew it after this chunk (a chunk fetched on
    # another process tells the run what it learned); `raw_answer_cap`: per answer.
    raw_cap: int | None = None
    raw_answer_cap: int | None = None
    # A chunk fetched in pieces (an answer over `max_answer_bytes`, a window cut after
    # timeouts): each piece's rows as a result of its own (`planning.sub_chunk`), written
    # one at a time and let go (`FlowRun.write`); `rows` is then empty.
    pieces: list[ChunkResult] = field(default_factory=list)

    @property
    def chunks(self) -> int:
        """Planned chunks this result completes."""
        return len(self.parts) or 1

    @property
    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame with Arrow-backed dtypes (made once, on first use)."""
        if self.pieces:
            return frame_from_table(self.table)
        if isinstance(self.rows, pa.Table):
            self.rows = frame_from_table(self.rows)
        return self.rows

    @property
    def table(self) -> pa.Table:
        """The rows as an Arrow table (a chunk fetched in pieces: theirs, one after the
        other; the writer takes the pieces instead)."""
        if self.pieces:
            return pa.concat_tables([piece.table for piece in self.pieces])
        if isinstance(self.rows, pa.Table):
            return self.rows
        return pa.Table.from_pandas(self.rows, preserve_index=False)


class HistoryEngine:
    """Fetch tag-history chunks through `connectors.fetch.HistoryFetcher`."""

    def __init__(
        self,
        client: HistoryClient,
        node: str,
        options: HistoryOptions,
        *,
        filter_query: FilterQuery | None = None,
        raw_cap: CapGuess | None = None,
        max_in_flight: int = 4,
        missing_is_fatal: bool = True,
        notice: SplitNotice | None = None,
        types: Mapping[str, str] | None = None,
        timeouts: WindowTimeouts | None = None,
    ) -> None:
        self.client = client
        self.node = node
        self.options = options
        self.timeouts = timeouts or WindowTimeouts("", node)
        self.filter_query = filter_query
        self.max_in_flight = max(1, max_in_flight)
        self.missing_is_fatal = missing_is_fatal
        # What the run learns of the node's raw cap, shared by all its chunks.
        self.raw_cap = raw_cap or CapGuess()
        # Where the node stamps aggregated buckets, learned from its answers (a node fact).
        self.stamping = BucketStamping()
        # Answers asked again in pieces are said once for the engine (a unit of a run).
        notice = notice or SplitNotice(node)

        def fetcher(query: FilterQuery | None) -> HistoryFetcher:
            return HistoryFetcher(
                client,
                node,
                options,
                filter_query=query,
                cap=self.raw_cap,
                notice=notice,
                stamping=self.stamping,
                types=types,
            )

        self.fetcher = fetcher(filter_query)
        # Chunks cut down to some tags of a group (`Chunk.by_paths`) are asked by path.
        self.path_fetcher = fetcher(None) if filter_query is not None else self.fetcher

    def fetch_chunk(self, chunk: Chunk) -> ChunkResult:
        """All rows of the chunk's tags in its window, exactly once each; the chunk is
        fetched again when its failure may pass (`WindowTimeouts.fetch`); counted in `HELD`."""
        return held(lambda: self.timeouts.fetch(chunk, self._fetch_once))

    def _fetch_once(self, chunk: Chunk, pieces: int = 1) -> ChunkResult:
        began = time.perf_counter()
        fetcher = self.path_fetcher if chunk.by_paths else self.fetcher
        parts = [
            part
            for window in pieces_of(chunk.window, pieces)
            for part in fetcher.fetch_parts(chunk.members, window, chunk.label)
        ]
        missing = {tag for part in parts for tag in part.fetched.missing}
        if missing:
            self._say_missing(chunk, tuple(tag for tag in chunk.members if tag in missing))
        if len(parts) == 1:
            result = self._piece(chunk, parts[0].fetched, began)
        else:
            result = in_pieces(
                chunk,
                [self._piece(sub_chunk(chunk, *part[:2]), part.fetched, began) for part in parts],
            )
            del parts
        result.raw_cap = self.raw_cap.known
        result.raw_answer_cap = self.raw_cap.per_answer
        return result

    def _piece(self, chunk: Chunk, fetched: Fetched, began: float) -> ChunkResult:
        """The result of one part's rows; a tag the node left out is recorded missing."""
        done = _without(chunk, fetched.missing) if fetched.missing else chunk
        table = history_table(fetched.table)
        fetched.table = table.schema.empty_table()  # the part's rows live on in the result only
        return _result(done, fetched, table, began, rows_fetched=table.num_rows)

    def _say_missing(self, chunk: Chunk, missing: tuple[str, ...]) -> None:
        """For explicitly named tags, UnknownTag naming the first tag left out and the
        chunk; else a warning: those tags are recorded as missing for the window."""
        operation = HISTORY_FILTER if self.filter_query is not None else HISTORY_MANY
        asked = self.fetcher.reasks + 1
        if self.missing_is_fatal:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise UnknownTag(
                operation,
                f"tag {missing[0]!r} left out of the node's answers for {chunk.label}, "
                f"asked {asked} times{more}; nothing of this chunk was written",
            )
        log.warning(
            "%s: %d tags left out of the node's answers for %s (asked %d times), %r first: "
            "recorded as missing for that window, not complete",
            operation,
            len(missing),
            chunk.label,
            asked,
            missing[0],
        )

    def stream(self, chunks: Iterable[Chunk]) -> Iterator[ChunkResult]:
        """Fetch chunks concurrently, at most `max_in_flight` at once; yield as they finish."""
        yield from stream_bounded(self.fetch_chunk, chunks, self.max_in_flight)


class AlarmEngine:
    """Fetch alarm-history chunks: one request per window, rows kept in `[start, end)`.

    The filter is sent as the node's version understands it (`connectors.version`): an
    older or unknown version gets `priority` as the minimum and the maximum applied here.
    """

    def __init__(
        self,
        client: HistoryClient,
        node: str,
        path: str,
        filt: AlarmFilter,
        *,
        node_version: NodeVersion | None = None,
        max_in_flight: int = 2,
        notice: SplitNotice | None = None,
        fields: Sequence[str] | None = None,
        timeouts: WindowTimeouts | None = None,
    ) -> None:
        self.client = client
        self.node = node
        self.path = path
        self.timeouts = timeouts or WindowTimeouts("", node)
        self.filt = filt
        self.max_in_flight = max(1, max_in_flight)
        adapted = adapt_alarm_filter(filt, node_version)
        self.fetcher = AlarmFetcher(
            client,
            node,
            path,
            adapted.sent,
            max_priority_here=adapted.max_priority_here,
            notice=notice,
            fields=fields,
        )

    def fetch_chunk(self, chunk: Chunk) -> ChunkResult:
        """The window's alarm events; fetched again when its failure may pass."""
        return held(lambda: self.timeouts.fetch(chunk, self._fetch_once))

    def _fetch_once(self, chunk: Chunk, pieces: int = 1) -> ChunkResult:
        began = time.perf_counter()
        parts = [
            part
            for window in pieces_of(chunk.window, pieces)
            for part in self.fetcher.fetch_parts(window, chunk.label)
        ]
        if len(parts) == 1:
            return _result(chunk, parts[0].fetched, parts[0].fetched.table, began)
        results = [
            _result(
                sub_chunk(chunk, chunk.members, part.window),
                part.fetched,
                part.fetched.table,
                began,
            )
            for part in parts
        ]
        del parts
        return in_pieces(chunk, results)

    def stream(self, chunks: Iterable[Chunk]) -> Iterator[ChunkResult]:
        yield from stream_bounded(self.fetch_chunk, chunks, self.max_in_flight)


@dataclass(frozen=True)
class FetchJob:
    """How a unit's chunks are fetched, decided once when it is planned: picklable, so a
    fetch on another process (a Dask worker) builds the very engine the run's own threads
    use, with the missing-tag rule, the node's version and the raw cap learned so far."""

    settings: NodeSettings
    node: str
    kind: str
    options: HistoryOptions | None = None
    filter_query: FilterQuery | None = None
    missing_is_fatal: bool = True
    raw_cap: int | None = None
    raw_answer_cap: int | None = None
    alarm_path: str | None = None
    alarm_filter: AlarmFilter | None = None
    node_version: NodeVersion | None = None
    # (tag, configured type) of tags whose details say `number` or `boolean`.
    tag_types: tuple[tuple[str, str], ...] = ()
    # The flow, named in warnings and advice, and whether `window: auto` sized its windows
    # (which may then be asked in pieces when they keep timing out: `WindowTimeouts`).
    flow: str = ""
    window_auto: bool = False

    def engine(
        self,
        client: HistoryClient,
        max_in_flight: int,
        raw_cap: CapGuess | None = None,
        notice: SplitNotice | None = None,
    ) -> HistoryEngine | AlarmEngine:
        """The engine of this job over `client` (`raw_cap`: the run's shared guess; a new
        one starting from `self.raw_cap` when None; `notice`: who says answers were split,
        a new one when None)."""
        by_time = self.alarm_filter is not None or (
            self.options is not None and self.options.mode == "raw"
        )
        timeouts = WindowTimeouts(self.flow, self.node, halves=self.window_auto and by_time)
        if self.alarm_filter is not None:
            assert self.alarm_path is not None
            return AlarmEngine(
                client,
                self.node,
                self.alarm_path,
                self.alarm_filter,
                node_version=self.node_version,
                max_in_flight=max_in_flight,
                notice=notice,
                fields=self.settings.alarm_fields,
                timeouts=timeouts,
            )
        assert self.options is not None
        return HistoryEngine(
            client,
            self.node,
            self.options,
            filter_query=self.filter_query,
            raw_cap=raw_cap or CapGuess(known=self.raw_cap, per_answer=self.raw_answer_cap),
            max_in_flight=max_in_flight,
            missing_is_fatal=self.missing_is_fatal,
            notice=notice,
            types=dict(self.tag_types),
            timeouts=timeouts,
        )

    def fetch(self, chunk: Chunk) -> ChunkResult:
        """The chunk, through a client of this process, closed after it (a split said once
        per node in this process: a Prefect task or a Dask worker fetches many chunks)."""
        client = NodeClient(self.settings)
        try:
            return self.engine(client, 1, notice=_process_notice(self.node)).fetch_chunk(chunk)
        finally:
            client.close()


_NOTICES: dict[str, SplitNotice] = {}
_NOTICES_LOCK = threading.Lock()


def _process_notice(node: str) -> SplitNotice:
    """The one `SplitNotice` of `node` in this process."""
    with _NOTICES_LOCK:
        return _NOTICES.setdefault(node, SplitNotice(node))


def _without(chunk: Chunk, missing: tuple[str, ...]) -> Chunk:
    """The chunk whose scope leaves `missing` out, recorded as missing there."""
    gone = set(missing)
    present = tuple(member for member in chunk.members if member not in gone)
    return replace(chunk, members=present + tuple(missing_member(tag) for tag in missing))


def in_pieces(chunk: Chunk, pieces: list[ChunkResult]) -> ChunkResult:
    """One result for a chunk fetched in pieces: theirs, kept apart, costs added up."""
    return ChunkResult(
        chunk=chunk,
        rows=pieces[0].table.schema.empty_table(),
        rows_fetched=sum(piece.rows_fetched for piece in pieces),
        requests=sum(piece.requests for piece in pieces),
        bytes_received=sum(piece.bytes_received for piece in pieces),
        seconds=max(piece.seconds for piece in pieces),
        continuations=sum(piece.continuations for piece in pieces),
        missing=tuple(dict.fromkeys(tag for piece in pieces for tag in piece.missing)),
        rows_out_of_range=sum(piece.rows_out_of_range for piece in pieces),
        values_not_of_type=sum(piece.values_not_of_type for piece in pieces),
        pieces=pieces,
    )


def _result(
    chunk: Chunk,
    fetched: Fetched,
    rows: pa.Table,
    began: float,
    *,
    rows_fetched: int | None = None,
) -> ChunkResult:
    """A chunk's result from what the fetcher got (`began`: perf_counter at the start)."""
    return ChunkResult(
        chunk=chunk,
        rows=rows,
        rows_fetched=fetched.table.num_rows if rows_fetched is None else rows_fetched,
        requests=fetched.requests,
        bytes_received=fetched.bytes_received,
        seconds=time.perf_counter() - began,
        continuations=fetched.continuations,
        missing=fetched.missing,
        rows_out_of_range=fetched.rows_out_of_range,
        values_not_of_type=fetched.values_not_of_type,
    )


def stream_bounded(
    fetch: Callable[[Chunk], ChunkResult], chunks: Iterable[Chunk], max_in_flight: int
) -> Iterator[ChunkResult]:
    """Run `fetch` over chunks in a thread pool, never more than `max_in_flight` fetching
    and `max_in_flight + 1` held (fetching, fetched and waiting, or yielded and not yet
    done with: the caller comes back for the next when it is), so fetching runs ahead of
    the writer by the fetches alone; no reference to a result is kept once it is yielded.

    The first failure cancels what has not started and is raised after running fetches end;
    results already yielded stay yielded (the caller has written them).
    """
    iterator = iter(chunks)
    bound = max_in_flight + 1
    with ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="fetch") as pool:
        in_flight: set[Future[ChunkResult]] = set()
        ready: deque[Future[ChunkResult]] = deque()

        def refill() -> None:
            while len(in_flight) < max_in_flight and len(in_flight) + len(ready) < bound:
                chunk = next(iterator, None)
                if chunk is None:
                    return
                in_flight.add(pool.submit(fetch, chunk))

        try:
            refill()
            while in_flight or ready:
                if not ready:
                    done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    in_flight.difference_update(done)
                    ready.extend(done)
                    del done
                # Refill before handing a result out: fetching goes on while the caller
                # writes it (the result handed out counts among the `bound` held).
                refill()
                result = ready.popleft().result()
                yield result
                del result
        finally:
            for future in in_flight:
                future.cancel()
