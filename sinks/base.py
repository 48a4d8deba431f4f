"""The sink protocol: what the pipeline asks of a destination, and nothing more.

A chunk is the unit of work and of idempotency: (dataset, the tags or alarm paths it
covers, a half-open window). Writing a chunk *replaces* whatever the sink held for that
scope, and records the chunk as complete in the same atomic step (the warehouse: one
transaction; the lake: the progress marker lands only after the data files are in place).
A re-run or retried chunk therefore never duplicates and never loses a row.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import chain
from typing import Protocol, runtime_checkable
from urllib.parse import quote, unquote

import pandas as pd
import pyarrow as pa

from connectors.schema import Rows
from connectors.timewindow import Window


class SinkError(Exception):
    """A sink cannot do what was asked: unreachable, not writable, inconsistent."""


class SinkUnavailable(SinkError):
    """The sink is unreachable for now (server restarting, connection lost): retry later."""


class FlowLocked(SinkError):
    """Another run of the same flow holds the flow's lock."""


class CountMismatch(SinkError):
    """Rows committed differ from rows fetched for a chunk: never a statistic, always an error."""


# How a one-line error names the command that repairs damaged data (`historian verify`);
# `{flow}` is filled in where the flow is known.
REPAIR_HINT = "`historian verify {flow} --repair` moves it aside and the next run fetches it again"


class UnreadableFile(SinkError):
    """A data file of the sink cannot be read (truncated, not Parquet): named, with the
    command that repairs it, instead of a reader's bare "magic bytes not found"."""

    def __init__(self, path: str, reason: str, flow: str = "FLOW", shown: str = "") -> None:
        """`path` as the user knows it; `shown`: how the message names it (the path in
        the sink and the sink's root apart, so that an error line's cut of long values
        keeps the file's name)."""
        self.path = path
        self.reason = reason
        self.shown = shown or path
        hint = REPAIR_HINT.format(flow=flow)
        super().__init__(f"data file {self.shown} cannot be read ({reason}); {hint}")

    def for_flow(self, flow: str) -> UnreadableFile:
        """The same error naming the flow in its repair command."""
        return UnreadableFile(self.path, self.reason, flow, self.shown)


# A chunk's scope may carry, beside its tags, members that record something about them,
# written in the same atomic step as its rows (`pipelines/state.py` writes them, the ledger
# reads them): a tag the node left out (`missing:<tag>`), a tag held behind a link not yet
# drained (`held:<link, percent-encoded>:<tag>`), the node the chunk came from
# (`node:<identity>`). Tag paths start with `/`, so none of these is ever a tag.
MISSING_PREFIX = "missing:"
HELD_PREFIX = "held:"
IDENTITY_PREFIX = "node:"
RECORD_PREFIXES = (MISSING_PREFIX, HELD_PREFIX, IDENTITY_PREFIX)


def held_member(tag: str, link: str) -> str:
    """The member recording `tag` held behind `link`."""
    return f"{HELD_PREFIX}{quote(link, safe='')}:{tag}"


def held_of(member: str) -> tuple[str, str] | None:
    """(link, tag) of a member recording a held tag; None for any other member."""
    if not member.startswith(HELD_PREFIX):
        return None
    link, _, tag = member[len(HELD_PREFIX) :].partition(":")
    return unquote(link), tag


@dataclass(frozen=True)
class ChunkScope:
    """What one write covers: `node`'s rows of `members` inside `window`. `members` are
    tag paths (history) or alarm paths (alarms).

    A dataset holds rows of many nodes (the same tag paths on every site): a write
    replaces only its node's rows, and other nodes' rows with the same paths and times
    stay. For alarm history the scope is the node's whole alarm path selection, named by
    `members` holding the single selection key (the flow's alarm path), and the node's
    rows of any path inside the window are replaced.

    `flow` is the progress key the chunk is recorded under: the flow's name, or
    `flow@node` for a flow over several nodes (any text; sinks encode it where it
    becomes a file name or an identifier).
    """

    flow: str
    dataset: str
    kind: str
    members: tuple[str, ...]
    window: Window
    chunk_id: str
    attrs: Mapping[str, object] = field(default_factory=dict)
    # Required, by keyword: the node whose rows the scope covers.
    node: str = field(kw_only=True)
    # The flow's chunk size (`window` may be clipped at the span's ends): a lake with
    # `partition: auto` sizes a new dataset's partitions to it.
    window_size: timedelta | None = None
    # Members written but not proven complete (member -> why, e.g. a link still
    # draining, or `live`: rows of a live tail): the ledger records them `held` with the
    # reason (`sinks.ledger`), and progress does not count them (`completed_members`).
    held: Mapping[str, str] = field(default_factory=dict, kw_only=True)

    @property
    def completed_members(self) -> tuple[str, ...]:
        """The members whose window this write proves complete: what progress records.
        A held member's rows are replaced like any other's, and a later write that proves
        them complete (a history run over the window) records them."""
        if not self.held:
            return self.members
        return tuple(member for member in self.members if member not in self.held)


@dataclass(frozen=True)
class ChunkRecord:
    """One committed chunk, as kept in a sink's progress log."""

    flow: str
    chunk_id: str
    window: Window
    members: int
    rows_fetched: int
    rows_committed: int
    committed_at: datetime


@dataclass
class Progress:
    """Completed coverage of a flow: per member, merged, sorted half-open windows.

    Members with the same windows may share one list (`SharedWindows`): never change a
    list in place.
    """

    flow: str
    completed: dict[str, list[Window]] = field(default_factory=dict)

    def windows_of(self, member: str) -> list[Window]:
        return self.completed.get(member, [])


@runtime_checkable
class Sink(Protocol):
    """What every run asks of a destination: open, lock, write chunks, read and edit
    progress (`historian state`, `reset`, `repair` on any sink), describe, close.

    Everything else a sink may do is a capability beside it (`Compacts`, `Probes`,
    `Reads`, `ReadsCoverage`, `ReadsLedger`, `Verifies`): callers ask `isinstance(sink,
    Capability)`, never for a sink's class.
    """

    name: str
    # How many chunk writes the runner may run at once on this sink (each its own atomic
    # write with a disjoint scope); 1 where writes would only queue behind one another.
    write_concurrency: int

    def open(self) -> None:
        """Create or migrate whatever the sink needs; fail early if it is unreachable."""

    def lock(self, flow: str) -> AbstractContextManager[None]:
        """Hold a lock key (`flow`, `flow@node`, a shard's `flow@node#2-of-4`: any text) for
        the duration of a run; FlowLocked if someone else has it. Other keys' writers may
        write other scopes of the same dataset at the same time."""

    def write(self, scope: ChunkScope, rows: Rows, rows_fetched: int) -> int:
        """Replace the scope's rows by `rows` and record the chunk complete, atomically.

        `rows` in the kind's columns (`connectors.schema`): the Arrow table a run fetched
        (what the runner passes: no DataFrame made and taken apart again per write), or a
        DataFrame of the same columns. Returns rows committed; raises CountMismatch when it
        differs from `rows_fetched`."""

    def write_metadata(self, rows: Rows) -> int:
        """Upsert tag metadata (the tag dimension) keyed by (node, tag): an Arrow table of
        the kind's columns (what a run passes) or a DataFrame of them; the last row of a
        repeated key wins."""

    def progress(self, flow: str) -> Progress:
        """Merged completed windows per member for a progress key (`ChunkScope.flow`)."""

    def chunk_log(self, flow: str, limit: int = 100) -> list[ChunkRecord]:
        """The most recent committed chunks of a flow, newest first."""

    def flows(self) -> list[str]:
        """Flows that have progress in this sink."""

    def reset(self, flow: str, member: str | None = None) -> int:
        """Forget progress of a flow (or one member of it); data stays. Returns entries removed."""

    def forget_after(self, flow: str, moment: datetime) -> int:
        """Forget a flow's progress after `moment` (chunks ending after it may be forgotten
        whole); data stays, and the next run fetches it again. Returns entries removed."""

    def describe(self) -> str:
        """Where the data went, in one line, without secrets."""

    def close(self) -> None:
        """Release connections and locks."""


@runtime_checkable
class Compacts(Protocol):
    """A sink that keeps files worth merging after a run (the lake, Delta, Iceberg)."""

    def compact(self, dataset: str) -> int:
        """Merge a dataset's small files (every chunk of the run committed by then).

        Returns how many files were merged away; 0 where there was nothing to merge.
        Safe to call at any time, and again.
        """


@runtime_checkable
class Probes(Protocol):
    """A sink that can tell, before `open()`, whether it could be written (`historian check`)."""

    def probe(self) -> str:
        """Without creating anything: raise SinkError with a one-line reason when the sink
        could not be written; else say what was found, in a line."""


@runtime_checkable
class Reads(Protocol):
    """A sink that gives back what it holds (reports of sinks without a coverage reader,
    tests, benchmarks)."""

    def read(self, dataset: str, kind: str) -> pd.DataFrame:
        """Everything the sink holds for a dataset, with the kind's column types."""


class Buckets(Protocol):
    """Time buckets a coverage reader groups rows into: `bucket_ms` wide from `start_ms`."""

    @property
    def start_ms(self) -> int: ...

    @property
    def bucket_ms(self) -> int: ...


class CoverageReader(Protocol):
    """One dataset, reduced where its rows live to groups per (series, bucket)
    (`sinks.coverage`: the columns of the groups, and how rows are reduced)."""

    def span(self) -> Window | None:
        """First and last row time (end exclusive), or None when the dataset is empty."""

    def partials(self, window: Window, buckets: Buckets) -> Iterator[pa.Table]:
        """Partial groups of the rows in `window`; a (series, bucket) may come in several."""


@runtime_checkable
class ReadsCoverage(Protocol):
    """A sink that aggregates a dataset without loading it whole (the lake file by file,
    a SQL warehouse in one GROUP BY)."""

    def coverage_reader(self, dataset: str, kind: str) -> CoverageReader:
        """A reader of the dataset's groups (nothing read until asked)."""


@dataclass(frozen=True)
class Damage:
    """Committed chunks a sink no longer holds as recorded: where (a file, a table), the
    span of their windows, what is wrong, and which chunks it costs."""

    where: str
    window: Window
    problem: str
    chunks: tuple[str, ...]
    unreadable: bool = False  # a file no reader can open (quarantined by a repair)


@dataclass
class Verified:
    """What `Verifies.verify` found (and, repairing, did)."""

    chunks: int = 0  # committed chunks checked
    damages: list[Damage] = field(default_factory=list)
    quarantined: list[tuple[str, str]] = field(default_factory=list)  # (file, moved to)
    forgotten: int = 0  # chunks forgotten: the next run fetches them again


@runtime_checkable
class Verifies(Protocol):
    """A sink that can check its committed chunks against what it still holds
    (`historian verify`): data removed, truncated or dropped after the commit."""

    def verify(
        self, flow: str, node: str, window: Window | None = None, *, repair: bool = False
    ) -> Verified:
        """Check every chunk of progress key `flow` (windows overlapping `window`) whose
        rows are `node`'s; `repair`: move unreadable files aside (never delete them) and
        forget the damaged chunks, so the next run fetches exactly them again."""


@runtime_checkable
class ReadsLedger(Protocol):
    """A sink that keeps the completeness ledger beside its datasets (`sinks.ledger`):
    written with each chunk's rows, read without scanning them."""

    def read_ledger(self, dataset: str) -> pa.Table:
        """Every ledger row of a dataset (`sinks.ledger.LEDGER_SCHEMA`)."""


def iter_merged(windows: list[Window]) -> Iterator[Window]:
    """Merge overlapping or touching windows; input in any order."""
    current: Window | None = None
    for window in sorted(windows):
        if current is None:
            current = window
        elif window.start <= current.end:
            if window.end > current.end:
                current = Window(current.start, window.end)
        else:
            yield current
            current = window
    if current is not None:
        yield current


def merge_windows(windows: list[Window]) -> list[Window]:
    """Sorted, disjoint, non-touching windows covering exactly the union of the input."""
    return list(iter_merged(windows))


def merge_ms(windows: Iterable[Sequence[int]]) -> list[list[int]]:
    """`merge_windows` on [start_ms, end_ms] pairs: sorted, disjoint, non-touching."""
    merged: list[list[int]] = []
    for start, end in sorted((int(s), int(e)) for s, e in windows):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


class SharedWindows:
    """Builds members' completed windows so that members with the same windows share one
    list (and one Window per distinct window).

    A flow's thousands of tags mostly have the same progress: merging is then done once
    per distinct list, and `pipelines.state` computes a watermark or a coverage once per
    list (by its identity) instead of once per tag. The lists must not change in place.
    """

    def __init__(self) -> None:
        self._windows: dict[tuple[int, int], Window] = {}
        self._lists: dict[tuple[int, ...], list[Window]] = {}
        self._merged: dict[tuple[int, ...], list[list[int]]] = {}
        self._by_windows: dict[tuple[Window, ...], list[Window]] = {}

    def merged_ms(self, windows: Sequence[Sequence[int]]) -> list[list[int]]:
        """`merge_ms` of these [start_ms, end_ms] pairs, one shared list per distinct input."""
        key = tuple(chain.from_iterable(windows))
        found = self._merged.get(key)
        if found is None:
            found = self._merged[key] = merge_ms(windows)
        return found

    def from_ms(self, merged: Sequence[Sequence[int]]) -> list[Window]:
        """The shared Window list of these merged [start_ms, end_ms] pairs."""
        key = tuple(chain.from_iterable(merged))
        found = self._lists.get(key)
        if found is None:
            pairs = range(0, len(key), 2)
            found = self._lists[key] = [self._window(int(key[i]), int(key[i + 1])) for i in pairs]
        return found

    def merged(self, windows: list[Window]) -> list[Window]:
        """`merge_windows` of these windows, one shared list per distinct result."""
        merged = merge_windows(windows)
        return self._by_windows.setdefault(tuple(merged), merged)

    def _window(self, start_ms: int, end_ms: int) -> Window:
        found = self._windows.get((start_ms, end_ms))
        if found is None:
            found = self._windows[(start_ms, end_ms)] = Window.from_ms(start_ms, end_ms)
        return found
