"""Drive one flow: resolve tags, plan what is left, fetch, write every sink, summarise.

The runner is the whole pipeline, with or without Prefect: the CLI's `--direct` path, the
Prefect flows (`pipelines/orchestration/flows.py`, whose `Submitter` only makes the plan
and the fetches tasks) and the benchmarks all call `units.run_flow`. A run, per node of
the flow (`FlowRun`, one unit; a flow on several nodes runs its units together:
pipelines/core/units.py):

1. takes the unit's lock in every sink (a second run of the same flow, or of the same
   node of a fleet flow, stops at once);
2. resolves the tag selection on the node and upserts the tag dimension;
3. computes the span: incremental (from the watermark minus look-back, up to now minus
   settle), or an explicit range (`--start/--end`);
4. plans (tag batch x window) chunks on a UTC grid and drops those every sink already
   holds (a backfill resumes at chunk granularity; the look-back span is always re-read);
5. fetches chunks concurrently (bounded) and writes each to every sink as it arrives
   (`write_all`, the one writer loop); each write replaces its scope and records the
   chunk atomically, so a retried or re-run chunk never duplicates or loses a row.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Protocol

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from connectors.client import asking_for
from connectors.facts import skew_note
from connectors.normalise.alarms import parse_alarm_history_answer
from connectors.normalise.history import parse_history_answer
from connectors.options import HistoryOptions
from connectors.schema import (
    GOOD_QUALITY,
    KIND_ALARM_HISTORY,
    KIND_TAG_HISTORY,
    KIND_TAG_METADATA,
    SCOPE_COLUMN,
    one_array,
)
from connectors.timewindow import Window, iso_utc
from connectors.version import NodeVersion, check_method
from pipelines.config.destinations import SinkSet
from pipelines.config.models import (
    AlarmHistoryFlow,
    Config,
    FlowConfig,
    TagHistoryFlow,
    flow_dataset,
    unit_key,
)
from pipelines.config.nodes import ConnectedNode, NodePool
from pipelines.core.coalesce import coalesce
from pipelines.core.engine import AlarmEngine, ChunkResult, FetchJob, HistoryEngine, retrying
from pipelines.core.holds import Holds, read_holds
from pipelines.core.kinds import kind_of
from pipelines.planning import (
    Chunk,
    density_per_hour,
    narrow_chunk,
    on_window_grid,
    plan_chunks,
    query_batches,
    short_duration,
    tags_per_query,
    whole_buckets,
    window_for_density,
)
from pipelines.selection import resolve_tags
from pipelines.shards import Shard
from pipelines.state import (
    check_same_node,
    flow_watermark,
    identity_member,
    incremental_span,
    lacking_members,
    pending_chunks,
    settled_by_clocks,
)
from sinks.base import ChunkScope, Compacts, Progress, Sink, SinkError

log = logging.getLogger("historian.runner")


class RunFailed(Exception):
    """A run stopped; what was committed stays committed and the next run continues.

    `nodes`: the nodes whose units failed (a fleet flow's other nodes completed)."""

    def __init__(self, message: str, summary: RunSummary, nodes: Sequence[str] = ()) -> None:
        self.summary = summary
        self.nodes = tuple(nodes)
        super().__init__(message)


@dataclass(frozen=True)
class RunRequest:
    """What to extract: incremental by default, or an explicit [start, end) range.

    `backfill` skips chunks every sink already holds (resume); a plain explicit range
    re-extracts everything in it (replacing, never duplicating). `shard`: only that part
    of the plan (a sharded backfill's flow run, pipelines/shards.py).
    """

    start: datetime | None = None
    end: datetime | None = None
    backfill: bool = False
    # The nodes of a fleet flow to extract (`--node`); None: every node of the flow.
    nodes: tuple[str, ...] | None = None
    shard: Shard | None = None


@dataclass
class ChunkOutcome:
    chunk_id: str
    label: str
    window: Window
    members: int
    rows_fetched: int
    rows_committed: dict[str, int]
    requests: int
    bytes_received: int
    seconds: float
    rows_per_tag: Counter[str] = field(default_factory=Counter)
    bad_quality_per_tag: Counter[str] = field(default_factory=Counter)
    # Ids of the planned chunks a joined write completed (small ones of a window join);
    # empty for a write of one chunk.
    parts: tuple[str, ...] = ()
    # Tags the node left out of its answers for this window (recorded missing, not complete).
    missing: tuple[str, ...] = ()
    rows_out_of_range: int = 0
    # Tags held for this window behind a link not yet drained (pipelines/core/holds.py).
    held: tuple[str, ...] = ()
    values_not_of_type: int = 0

    @property
    def part_ids(self) -> tuple[str, ...]:
        """Ids of the planned chunks this write completed."""
        return self.parts or (self.chunk_id,)

    @property
    def chunks(self) -> int:
        """Planned chunks this write completed."""
        return len(self.part_ids)


@dataclass
class Plan:
    flow: str
    dataset: str
    kind: str
    members: tuple[str, ...]
    span: Window | None
    window_size: timedelta
    chunks_planned: int
    pending: list[Chunk]
    watermark_before: datetime | None
    # The node planned and the key of its state (`pipelines.config.models.unit_key`).
    node: str = ""
    key: str = ""


@dataclass
class RunSummary:
    flow: str
    dataset: str
    kind: str
    node: str
    span: Window | None = None
    chunks_planned: int = 0
    chunks_skipped: int = 0
    chunks_done: int = 0
    rows: int = 0
    requests: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    tags: int = 0
    sinks: dict[str, str] = field(default_factory=dict)
    rows_per_tag: Counter[str] = field(default_factory=Counter)
    bad_quality_per_tag: Counter[str] = field(default_factory=Counter)
    watermark_before: datetime | None = None
    watermark_after: datetime | None = None
    error: str | None = None
    # Windows each tag was left out of by the node (not complete there), and rows stamped
    # outside their query (dropped).
    missing: dict[str, list[Window]] = field(default_factory=dict)
    rows_out_of_range: int = 0
    # Text values of number or boolean tags that did not parse as the tag's type (kept).
    values_not_of_type: int = 0
    # What planning changed or found, one line each (an end cut at now - settle, ...).
    notes: list[str] = field(default_factory=list)
    # The chunk window this run planned with, and whether `window: auto` chose it.
    window: timedelta | None = None
    window_auto: bool = False
    # The key of this (flow, node)'s state; a fleet flow's run summary holds one summary
    # per node in `units` (pipelines/core/units.py).
    key: str = ""
    units: list[RunSummary] = field(default_factory=list)
    # `2-of-4` for a shard of a sharded backfill.
    shard: str | None = None
    # Windows held per tag behind a link not yet drained, and why per link.
    held: dict[str, list[Window]] = field(default_factory=dict)
    holds: dict[str, str] = field(default_factory=dict)

    @property
    def window_label(self) -> str:
        """`15m`, or `2h auto` when the run sized it; `-` when nothing was planned."""
        if self.window is None:
            return "-"
        return short_duration(self.window) + (" auto" if self.window_auto else "")

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def remarks(self) -> list[str]:
        """One line per thing the user must know about this run beyond its counts."""
        lines = list(self.notes)
        if self.missing:
            first = next(iter(self.missing))
            windows = sum(len(w) for w in self.missing.values())
            lines.append(
                f"{len(self.missing)} tags were left out of the node's answers in {windows} "
                f"windows ({first!r} first): not complete there; `historian state` lists them"
            )
        if self.rows_out_of_range:
            lines.append(f"{self.rows_out_of_range} rows stamped outside their query were dropped")
        if self.held:
            windows = sum(len(w) for w in self.held.values())
            why = "; ".join(f"link {link!r} {reason}" for link, reason in self.holds.items())
            lines.append(
                f"{len(self.held)} remote tags held in {windows} windows ({why}): not complete "
                "until the link is back and drained; `historian state` lists them"
            )
        if self.values_not_of_type:
            lines.append(
                f"{self.values_not_of_type} text values are not of their tag's configured type "
                "(number or boolean): kept as text, in value_str"
            )
        return lines

    @property
    def tags_without_rows(self) -> int:
        return max(0, self.tags - len(self.rows_per_tag)) if kind_of(self.kind).by_tag else 0

    def add(self, outcome: ChunkOutcome) -> None:
        self.chunks_done += outcome.chunks
        self.rows += outcome.rows_fetched
        self.requests += outcome.requests
        self.bytes_received += outcome.bytes_received
        self.rows_per_tag.update(outcome.rows_per_tag)
        self.bad_quality_per_tag.update(outcome.bad_quality_per_tag)
        for tag in outcome.missing:
            self.missing.setdefault(tag, []).append(outcome.window)
        for tag in outcome.held:
            self.held.setdefault(tag, []).append(outcome.window)
        self.rows_out_of_range += outcome.rows_out_of_range
        self.values_not_of_type += outcome.values_not_of_type

    def as_dict(self) -> dict[str, object]:
        return {
            "flow": self.flow,
            "dataset": self.dataset,
            "kind": self.kind,
            "node": self.node,
            "span": str(self.span) if self.span else None,
            "chunks_planned": self.chunks_planned,
            "chunks_skipped": self.chunks_skipped,
            "chunks_done": self.chunks_done,
            "rows": self.rows,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.rows_per_second),
            "tags": self.tags,
            "tags_without_rows": self.tags_without_rows,
            "bad_quality_rows": sum(self.bad_quality_per_tag.values()),
            "sinks": self.sinks,
            "watermark_before": iso_utc(self.watermark_before) if self.watermark_before else None,
            "watermark_after": iso_utc(self.watermark_after) if self.watermark_after else None,
            "missing": {tag: [str(w) for w in windows] for tag, windows in self.missing.items()},
            "rows_out_of_range": self.rows_out_of_range,
            "held": {tag: [str(w) for w in windows] for tag, windows in self.held.items()},
            "holds": self.holds,
            "values_not_of_type": self.values_not_of_type,
            "notes": self.remarks,
            "window": self.window_label,
            "shard": self.shard,
            "error": self.error,
            "units": [unit.as_dict() for unit in self.units],
        }


ProgressCallback = Callable[[ChunkOutcome, "RunSummary"], None]
PlanCallback = Callable[["Plan"], None]


class Submitter(Protocol):
    """How the core hands out its work: a unit's plan, and its chunks' fetches (results
    out as they finish). What the work is (the engine, the missing-tag rule, retries) and
    what follows (joining, writing, counting) the core decides: a submitter only says where
    the work runs."""

    def plan(self, unit: FlowRun) -> Plan: ...

    def fetch(self, unit: FlowRun, chunks: Sequence[Chunk]) -> Iterator[ChunkResult]: ...


class Threads:
    """The direct path: the plan here, the fetches on the engine's bounded thread pool."""

    def plan(self, unit: FlowRun) -> Plan:
        return unit.plan()

    def fetch(self, unit: FlowRun, chunks: Sequence[Chunk]) -> Iterator[ChunkResult]:
        return unit.engine.stream(chunks)


THREADS = Threads()


def options_key(flow: FlowConfig) -> str:
    """The mode options that make two chunks different work (part of the chunk id)."""
    if isinstance(flow, AlarmHistoryFlow):
        filt = flow.alarm_filter()
        return orjson.dumps(filt.query_params(), option=orjson.OPT_SORT_KEYS).decode()
    return orjson.dumps(flow.history_options().query_params(), option=orjson.OPT_SORT_KEYS).decode()


def dataset_attrs(name: str, flow: FlowConfig) -> dict[str, object]:
    """The dataset's identity (`sinks.identity`): how its rows were extracted. Not the
    node: a dataset holds many nodes' rows, each scope names its own."""
    if isinstance(flow, AlarmHistoryFlow):
        return {"kind": KIND_ALARM_HISTORY}
    options = flow.history_options()
    return {
        "kind": KIND_TAG_HISTORY,
        "mode": options.mode,
        "method": options.method,
        "interval_ms": options.interval_ms,
        "deadband": None if options.deadband is None else str(options.deadband),
        "invalid_as_null": options.invalid_as_null,
    }


def combined_pending(
    chunks: Sequence[Chunk], progresses: Sequence[Progress], always: Window | None
) -> list[Chunk]:
    """Chunks that at least one sink still lacks, in plan order."""
    wanted: set[str] = set()
    for progress in progresses:
        wanted.update(c.chunk_id for c in pending_chunks(chunks, progress, always=always))
    return [chunk for chunk in chunks if chunk.chunk_id in wanted]


class FlowRun:
    """One run of one flow on one of its nodes (a unit: pipelines/core/units.py runs a fleet
    flow's units together); a context manager holding the unit's lock in every sink."""

    def __init__(
        self,
        config: Config,
        name: str,
        *,
        nodes: NodePool,
        sinks: SinkSet,
        request: RunRequest | None = None,
        now: datetime | None = None,
        max_in_flight: int | None = None,
        node: str | None = None,
        sink_guard: AbstractContextManager[object] | None = None,
    ) -> None:
        self.config = config
        self.name = name
        self.flow_config = config.flows[name]
        if node is None:
            fleet = config.flow_nodes(name)
            if len(fleet) != 1:
                raise ValueError(f"flow {name} runs on {len(fleet)} nodes: name the node")
            node = fleet[0]
        self.node_name = node
        self.key = unit_key(name, node, self.flow_config)
        self.kind = self.flow_config.kind
        self.dataset = flow_dataset(name, self.flow_config)
        self.request = request or RunRequest()
        self.now = now or datetime.now(UTC)
        self._began = time.monotonic()  # the node's facts are read again after it
        self._identity: tuple[str, ...] = ()  # the progress member naming the node
        self._nodes = nodes
        self._sinks = sinks
        self._stack = ExitStack()
        self._node: ConnectedNode | None = None
        self._max_in_flight = max_in_flight
        self._engine: HistoryEngine | AlarmEngine | None = None
        self._job: FetchJob | None = None
        # Held around the sink calls of `plan()`: units of a fleet plan on threads of
        # their own, and a sink's connection serves one caller at a time.
        self._sink_guard = sink_guard or nullcontext()
        self.plan_: Plan | None = None
        # Remote tags whose windows are held this run (read when the tags are resolved).
        self.holds = Holds()
        self.summary = RunSummary(self.name, self.dataset, self.kind, node, key=self.key)
        self.shard = self.request.shard
        self.summary.shard = self.shard.label if self.shard is not None else None

    # -- lifecycle -------------------------------------------------------------------

    @property
    def _node_option(self) -> str:
        """` --node N` when this unit is one node of a fleet flow (commands about it)."""
        return f" --node {self.node_name}" if self.key != self.name else ""

    @property
    def sinks(self) -> list[Sink]:
        return [self._sinks.get(name) for name in self.flow_config.sinks]

    @property
    def node(self) -> ConnectedNode:
        if self._node is None:
            self._node = self._nodes.get(self.node_name)
        return self._node

    @property
    def lock_key(self) -> str:
        """What this run locks: its unit's key, or `<key>#<i>-of-<n>` for a shard of it."""
        return self.shard.lock_key(self.key) if self.shard is not None else self.key

    def __enter__(self) -> FlowRun:
        try:
            for sink in self.sinks:
                self._stack.enter_context(sink.lock(self.lock_key))
        except BaseException:
            self._stack.close()
            raise
        self.summary.sinks = {sink.name: sink.describe() for sink in self.sinks}
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    # -- planning --------------------------------------------------------------------

    def plan(self) -> Plan:
        """Resolve the selection, write tag metadata, and work out the pending chunks;
        planned again when a failure may pass (`engine.retrying`, as a chunk's fetch).

        The node's version is read first (once per run): a method it cannot compute is
        refused before anything is written.
        """
        with asking_for(f"flow {self.name} node {self.node_name}"):
            return retrying(self._plan_once, f"planning {self.key}")

    def _plan_once(self) -> Plan:
        self.summary.notes.clear()  # a plan run again says its lines once
        facts = self.node.facts(read_after=self._began)
        members = self._select(facts.version)
        with self._sink_guard:
            progresses = [sink.progress(self.key) for sink in self.sinks]
        reset = f"historian state reset {self.name}{self._node_option}"
        check_same_node(progresses, facts.identity, self.node_name, reset)
        self._identity = (identity_member(facts.identity.key()),)
        watermark = _min_watermark(progresses, members, self.flow_config.start)
        self.summary.tags = len(members)
        self.summary.watermark_before = watermark
        span, always, size = self._span_and_window(members, watermark)
        chunks = self._chunks(members, span, size) if span is not None else []
        pending, skipped = self._pending(chunks, progresses, always)
        self.plan_ = Plan(
            self.name,
            self.dataset,
            self.kind,
            members,
            span,
            size,
            len(chunks),
            pending,
            watermark,
            node=self.node_name,
            key=self.key,
        )
        if span is not None:
            self.summary.span = span
            self.summary.window = size
            self.summary.window_auto = self.flow_config.window == "auto"
            self.summary.chunks_planned = len(chunks)
            self.summary.chunks_skipped = skipped
        return self.plan_

    def _select(self, version: NodeVersion | None) -> tuple[str, ...]:
        """The flow's members on the node (tag metadata written), and how they are
        fetched (`FetchJob`, decided here once for every submitter)."""
        flow, node = self.flow_config, self.node
        if isinstance(flow, AlarmHistoryFlow):
            path = flow.alarms.path if flow.alarms else "/"
            self._use(
                FetchJob(
                    node.settings,
                    node.name,
                    self.kind,
                    alarm_path=path,
                    alarm_filter=flow.alarm_filter(),
                    node_version=version,
                )
            )
            return (path,)
        assert flow.tags is not None
        check_method(flow.method, version, where=f"flows.{self.name}.method")
        resolved = resolve_tags(node.client, node.name, flow.tags, where=f"flows.{self.name}.tags")
        self._read_holds(flow, resolved.details_answers())
        first = self.shard is None or self.shard.writes_metadata()
        if flow.metadata and first and resolved.metadata.num_rows:
            with self._sink_guard:
                for sink in self.sinks:
                    sink.write_metadata(resolved.metadata)
        self._use(
            FetchJob(
                node.settings,
                node.name,
                self.kind,
                options=flow.history_options(),
                filter_query=resolved.filter_query,
                missing_is_fatal=resolved.explicit,
                node_version=version,
                tag_types=_typed_tags(resolved.types),
            )
        )
        return resolved.members

    def _read_holds(self, flow: TagHistoryFlow, answers: list[tuple[bytes, str | None]]) -> None:
        """Which remote tags are behind a link that has not delivered yet (holds.py)."""
        remote = flow.history_options().remote_node
        self.holds, note = read_holds(self.node.client, answers, flow, remote, now=self.now)
        self.summary.notes.extend([note] if note else [])
        self.summary.holds = self.holds.reasons()

    def _use(self, job: FetchJob) -> None:
        auto = self.flow_config.window == "auto"
        self._job = job = replace(job, flow=self.name, window_auto=auto)
        self._engine = job.engine(self.node.client, self._in_flight())

    def _span_and_window(
        self, members: Sequence[str], watermark: datetime | None
    ) -> tuple[Window | None, Window | None, timedelta]:
        """The span to plan, its look-back part (always re-read), and the window size."""
        flow = self.flow_config
        span, always = self._span(watermark)
        tags = flow if isinstance(flow, TagHistoryFlow) else None
        interval = tags.interval if tags and tags.mode == "aggregated" else None
        if span is not None and interval is not None:
            span = whole_buckets(span, interval)
        size = self._window_size(members, span, interval)
        if span is not None and tags and tags.mode in ("delta", "filter"):
            span, always = on_window_grid(span, always, size)
        return span, always, size

    @property
    def _batch(self) -> int:
        """Members asked for in one query at most (an alarm flow's one path: one)."""
        flow = self.flow_config
        return flow.batch if isinstance(flow, TagHistoryFlow) else 1

    def _one_query(self) -> bool:
        """Whether one query asks for every member (alarms, a group through historyFilter)."""
        return not kind_of(self.kind).by_tag or self._filter_mode()

    def _chunks(self, members: Sequence[str], span: Window, size: timedelta) -> list[Chunk]:
        """The span's chunks (this shard's, for a shard of a backfill)."""
        batches = query_batches(members, max_batch=self._batch, one_query=self._one_query())
        chunks = plan_chunks(
            self.key, self.dataset, self.kind, batches, span, size, options_key(self.flow_config)
        )
        return self.shard.select(chunks) if self.shard is not None else chunks

    def _pending(
        self, chunks: list[Chunk], progresses: Sequence[Progress], always: Window | None
    ) -> tuple[list[Chunk], int]:
        """The chunks to fetch and how many were skipped: all of an explicit range that is
        not a backfill (re-extracted), else those a sink still lacks, narrowed."""
        if self.request.start is not None and not self.request.backfill:
            return list(chunks), 0
        wanted = combined_pending(chunks, progresses, always)
        return self._narrowed(wanted, progresses, always), len(chunks) - len(wanted)

    def _narrowed(
        self, pending: list[Chunk], progresses: Sequence[Progress], always: Window | None
    ) -> list[Chunk]:
        """Pending chunks cut down to the tags a sink lacks (one tag reset: only it is
        fetched again); chunks in the look-back span are re-read whole."""
        if not kind_of(self.kind).by_tag:
            return pending
        lacking = lacking_members(pending, progresses)
        narrowed: list[Chunk] = []
        for chunk in pending:
            if always is not None and chunk.window.overlaps(always):
                narrowed.append(chunk)
                continue
            narrowed.extend(
                narrow_chunk(
                    chunk,
                    lacking[chunk.chunk_id],
                    max_batch=self._batch,
                    options_key=options_key(self.flow_config),
                    by_paths=self._filter_mode(),
                )
            )
        return narrowed

    def _in_flight(self) -> int:
        if self._max_in_flight is not None:
            return self._max_in_flight
        return self.config.nodes[self.node_name].max_connections

    def _span(self, watermark: datetime | None) -> tuple[Window | None, Window | None]:
        """The span to plan, and the look-back part of it that is always re-read."""
        flow = self.flow_config
        end = self._end(watermark)
        if self.request.start is not None:
            if end <= self.request.start:
                return None, None
            return Window(self.request.start, end), None
        span = incremental_span(
            history_start=flow.start,
            watermark=watermark,
            now=end,
            lookback=flow.lookback,
            settle=timedelta(0),
        )
        if span is None:
            return None, None
        # The span starts at watermark - lookback: the part before the watermark is the
        # look-back, re-read on every run even where already complete. After it only what
        # some member lacks is read (a tag's held or missing windows keep the watermark
        # back, and the other tags' complete windows are not read again).
        if watermark is None or flow.lookback <= timedelta(0) or watermark <= span.start:
            return span, None
        return span, Window(span.start, min(watermark, span.end))

    def _end(self, watermark: datetime | None) -> datetime:
        """Where this run ends: `now - settle`, or an explicit end no later than that;
        `now` is the node's own when its clock is behind ours (`settled_by_clocks`).

        Nothing past `now - settle` is ever marked complete (a future window's answer is
        empty, and a later run would skip it for good): a later explicit end is cut there,
        with one line in the summary. Progress already past it (recorded before this rule)
        is pointed out with the command that repairs it.
        """
        clock = self.node.facts().clock
        settled, skew = settled_by_clocks(self.now, self.flow_config.settle, clock, self._began)
        self.summary.notes.extend(filter(None, [skew_note(self.node_name, skew)]))
        if watermark is not None and watermark > settled:
            self.summary.notes.append(
                f"progress is marked complete up to {iso_utc(watermark)}, past now - settle: "
                f"repair it with `historian state repair {self.name}{self._node_option}`"
            )
        asked = self.request.end
        if asked is None:
            return settled
        if asked > settled:
            self.summary.notes.append(
                f"end {iso_utc(asked)} is after now - settle: cut at {iso_utc(settled)}; "
                "nothing past it is marked complete"
            )
            log.warning("flow %s: %s", self.name, self.summary.notes[-1])
            return settled
        return asked

    def _window_size(
        self, members: Sequence[str], span: Window | None, interval: timedelta | None
    ) -> timedelta:
        """The flow's window, or for `auto` the largest whose chunks carry about
        AUTO_CHUNK_ROWS rows at the density the node shows (pipelines/planning.py)."""
        flow = self.flow_config
        if isinstance(flow.window, timedelta):
            return flow.window
        if span is None:  # nothing to fetch: no chunk is planned, nothing to probe
            return timedelta(hours=1)
        if isinstance(flow, AlarmHistoryFlow):
            return window_for_density(self.probe_alarm_density(flow, span), 1)
        tags_per_batch = tags_per_query(
            len(members), max_batch=flow.batch, one_query=self._filter_mode()
        )
        if interval is not None:
            per_hour = timedelta(hours=1) / interval
        else:
            per_hour = self.probe_density(flow, members, span)
        return window_for_density(per_hour, max(1, tags_per_batch), interval=interval)

    def _filter_mode(self) -> bool:
        return isinstance(self._engine, HistoryEngine) and self._engine.filter_query is not None

    def probe_density(self, flow: TagHistoryFlow, members: Sequence[str], span: Window) -> float:
        """Samples per tag and hour: the highest that raw probes of up to 50 tags (spread
        over the selection) see at either end of the span, where a backfill's first chunks
        and an incremental run's last ones are; over an hour, or a day where the hour is
        empty; at least one per hour."""
        probe = _spread(members, 50)
        # `limit` keeps each probe's answer small (50 x 1,000 rows, however dense the day);
        # tags it cuts are measured up to their last sample, like a node's own cap.
        options = HistoryOptions(
            mode="raw", limit=1000, remote_node=flow.history_options().remote_node
        )
        rates = [1.0]
        for side in _probe_sides(span):
            for window in side:
                body = self.node.client.tag_history_many_bytes(
                    probe, window.start, window.end, options
                )
                page = parse_history_answer(body, self.node.name, chunk_label="density probe")
                seen = [(stats.rows, stats.last_ts_ms) for stats in page.tags.values()]
                if any(rows for rows, _ in seen):
                    rates.append(density_per_hour(seen, len(probe), window.start_ms, window.end_ms))
                    break
        return max(rates)

    def probe_alarm_density(self, flow: AlarmHistoryFlow, span: Window) -> float:
        """Alarm events per hour at either end of the span (as `probe_density`)."""
        path = flow.alarms.path
        rates = [1.0]
        for side in _probe_sides(span):
            for window in side:
                body = self.node.client.alarm_history_bytes(
                    path, window.start, window.end, flow.alarm_filter()
                )
                events = parse_alarm_history_answer(
                    body, self.node.name, fields=self.node.settings.alarm_fields
                ).num_rows
                if events:
                    rates.append(events / ((window.end_ms - window.start_ms) / 3_600_000))
                    break
        return max(rates)

    # -- execution -------------------------------------------------------------------

    def scope(self, chunk: Chunk) -> ChunkScope:
        return ChunkScope(
            flow=self.key,
            dataset=self.dataset,
            kind=self.kind,
            members=chunk.members + self._identity,
            window=chunk.window,
            chunk_id=chunk.chunk_id,
            attrs=dataset_attrs(self.name, self.flow_config),
            node=self.node.name,
            window_size=self.plan_.window_size if self.plan_ is not None else None,
        )

    def fetch(self, chunk: Chunk) -> ChunkResult:
        assert self._engine is not None, "plan() first"
        return self._engine.fetch_chunk(chunk)

    def write(self, result: ChunkResult) -> ChunkOutcome:
        """Write a fetched chunk to every sink; each write is atomic and idempotent."""
        return write_pieces(result, self._write_one) if result.pieces else self._write_one(result)

    def _write_one(self, result: ChunkResult) -> ChunkOutcome:
        committed: dict[str, int] = {}
        result, held = self.holds.take_out(result, SCOPE_COLUMN[self.kind])
        scope = self.scope(result.chunk)
        for sink in self.sinks:
            committed[sink.name] = sink.write(scope, result.table, result.rows_fetched)
        rows_per_tag, bad_per_tag = _tag_counts(result.table, self.kind)
        return ChunkOutcome(
            chunk_id=result.chunk.chunk_id,
            label=result.chunk.label,
            window=result.chunk.window,
            members=len(result.chunk.members),
            rows_fetched=result.rows_fetched,
            rows_committed=committed,
            requests=result.requests,
            bytes_received=result.bytes_received,
            seconds=result.seconds,
            rows_per_tag=rows_per_tag,
            bad_quality_per_tag=bad_per_tag,
            parts=tuple(chunk.chunk_id for chunk in result.parts),
            missing=result.missing,
            rows_out_of_range=result.rows_out_of_range,
            held=held,
            values_not_of_type=result.values_not_of_type,
        )

    def results(self, submit: Submitter = THREADS) -> Iterator[ChunkResult]:
        """Fetched chunks, concurrently and bounded, in completion order; the small ones
        of a window joined into one write (pipelines/core/coalesce.py). `submit`: where the
        fetches run (the engine's own thread pool by default)."""
        if self._engine is None or self.plan_ is None:
            raise RuntimeError("plan() first")
        pending = self.plan_.pending
        yield from self.joined(self._learning(submit.fetch(self, pending)), pending)

    def fetch_job(self) -> FetchJob:
        """How this unit's chunks are fetched on another process: what `plan()` decided,
        with the raw cap learned so far."""
        if self._job is None or self._engine is None:
            raise RuntimeError("plan() first")
        if isinstance(self._engine, HistoryEngine):
            cap = self._engine.raw_cap
            return replace(self._job, raw_cap=cap.known, raw_answer_cap=cap.per_answer)
        return self._job

    def _learning(self, fetched: Iterable[ChunkResult]) -> Iterator[ChunkResult]:
        """`fetched`, keeping the raw cap a chunk fetched elsewhere learned for later jobs."""
        for result in fetched:
            if result.raw_cap is not None and isinstance(self._engine, HistoryEngine):
                self._engine.raw_cap.learn(result.raw_cap, found_more=True)
            if result.raw_answer_cap is not None and isinstance(self._engine, HistoryEngine):
                self._engine.raw_cap.learn_answer(result.raw_answer_cap, found_more=True)
            yield result
            del result  # written by now: not kept while the next one is fetched

    @property
    def engine(self) -> HistoryEngine | AlarmEngine:
        """What fetches this run's chunks (set by `plan()`)."""
        if self._engine is None:
            raise RuntimeError("plan() first")
        return self._engine

    def joined(
        self, fetched: Iterable[ChunkResult], chunks: Sequence[Chunk]
    ) -> Iterator[ChunkResult]:
        """`fetched` (results of `chunks`, in any order) with the small tag-history ones of
        each window joined into one write (`pipelines/core/coalesce.py`)."""
        if not kind_of(self.kind).by_tag:
            yield from fetched
            return
        yield from coalesce(fetched, Counter(chunk.window for chunk in chunks))

    def write_depth(self) -> int:
        """Chunks written at once: what every sink of the flow allows (1 unless all say more)."""
        return min((max(1, sink.write_concurrency) for sink in self.sinks), default=1)

    def done(self, outcome: ChunkOutcome, on_chunk: ProgressCallback | None) -> None:
        """Count a written chunk (and tell `on_chunk`)."""
        self.summary.add(outcome)
        if on_chunk is not None:
            on_chunk(outcome, self.summary)

    def compact(self) -> None:
        """After the last chunk: compact small lake files of the dataset.

        Every chunk is committed by now, so a sink failing here (a database gone again,
        a full disk during compaction) is logged and leaves the run complete: the next
        run compacts. A shard does not compact: the other shards of its backfill write
        next to the files compaction would rewrite; the unit's next unsharded run compacts.
        """
        if not self.summary.chunks_done or self.shard is not None:
            return
        for sink in self.sinks:
            if not isinstance(sink, Compacts):
                continue
            try:
                sink.compact(self.dataset)
            except SinkError as exc:
                log.warning("%s: every chunk is committed; not compacted: %s", self.key, exc)

    def finish(self) -> None:
        """After the last chunk: record the new watermark (a sink failing to say is logged:
        the next run reads it anew)."""
        if self.plan_ is not None:
            try:
                progresses = [sink.progress(self.key) for sink in self.sinks]
            except SinkError as exc:
                log.warning("%s: every chunk is committed; watermark not read: %s", self.key, exc)
                return
            self.summary.watermark_after = _min_watermark(
                progresses, self.plan_.members, self.flow_config.start
            )


def write_pieces(result: ChunkResult, write: Callable[[ChunkResult], ChunkOutcome]) -> ChunkOutcome:
    """Write a chunk fetched in pieces a piece at a time, each its own write of its own
    scope (progress merges them into the chunk's window; a run stopped between two is
    fetched whole again by the next, which replaces them), each piece let go once
    written: the window's rows are never copied whole."""
    outcomes = []
    while result.pieces:
        outcomes.append(write(result.pieces.pop(0)))
    return merged(result.chunk, outcomes)


def merged(chunk: Chunk, outcomes: list[ChunkOutcome]) -> ChunkOutcome:
    """The outcome of a chunk written in pieces: theirs added up, under the chunk's id."""
    committed: Counter[str] = Counter()
    rows_per_tag: Counter[str] = Counter()
    bad_per_tag: Counter[str] = Counter()
    for outcome in outcomes:
        committed.update(outcome.rows_committed)
        rows_per_tag.update(outcome.rows_per_tag)
        bad_per_tag.update(outcome.bad_quality_per_tag)
    return ChunkOutcome(
        chunk_id=chunk.chunk_id,
        label=chunk.label,
        window=chunk.window,
        members=len(chunk.members),
        rows_fetched=sum(outcome.rows_fetched for outcome in outcomes),
        rows_committed=dict(committed),
        requests=sum(outcome.requests for outcome in outcomes),
        bytes_received=sum(outcome.bytes_received for outcome in outcomes),
        seconds=max(outcome.seconds for outcome in outcomes),
        rows_per_tag=rows_per_tag,
        bad_quality_per_tag=bad_per_tag,
        missing=tuple(dict.fromkeys(tag for o in outcomes for tag in o.missing)),
        rows_out_of_range=sum(outcome.rows_out_of_range for outcome in outcomes),
        held=tuple(dict.fromkeys(tag for o in outcomes for tag in o.held)),
        values_not_of_type=sum(outcome.values_not_of_type for outcome in outcomes),
    )


WorkItem = tuple[FlowRun, ChunkResult]


def write_all(
    items: Iterable[WorkItem], depth: int, on_chunk: ProgressCallback | None = None
) -> None:
    """Write each fetched chunk to every sink of its run, in this thread (depth 1) or up
    to `depth` at once, each still its own atomic, idempotent write.

    Why overlap: a chunk's write is mostly the database inserting into its key; with a
    second chunk under way, that work overlaps the next chunk's encoding and a second
    server process. Chunks may commit out of plan order: the progress is a set of completed
    windows per member (merged by every sink), so a later window committed before an
    earlier one leaves a gap, never a false claim, and the watermark stops at the gap.
    On a failure the writes under way finish (each commits whole or not at all) and are
    counted, then the first error is raised.
    """
    if depth <= 1:
        for run, result in items:
            outcome = run.write(result)
            del result
            run.done(outcome, on_chunk)
        return
    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="write") as pool:
        pending: dict[Future[ChunkOutcome], FlowRun] = {}

        def count(done: Iterable[Future[ChunkOutcome]]) -> list[BaseException]:
            failed = []
            for future in done:
                run = pending.pop(future)
                error = future.exception()
                if error is None:
                    run.done(future.result(), on_chunk)
                else:
                    failed.append(error)
            return failed

        def drain_to(until: int) -> None:
            while len(pending) > until:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                failed = count(done)
                if failed:
                    raise failed[0]

        try:
            for run, result in items:
                pending[pool.submit(run.write, result)] = run
                del result
                drain_to(depth - 1)
            drain_to(0)
        except BaseException:
            finished, _ = wait(list(pending))
            count(finished)
            raise


def _min_watermark(
    progresses: Sequence[Progress], members: Sequence[str], origin: datetime
) -> datetime | None:
    marks = [flow_watermark(progress, members, origin) for progress in progresses]
    if any(mark is None for mark in marks) or not marks:
        return None
    return min(mark for mark in marks if mark is not None)


def _spread(members: Sequence[str], count: int) -> list[str]:
    """Up to `count` members evenly spread over the list (batches are runs of neighbours,
    so the first `count` could all be one group's)."""
    if len(members) <= count:
        return list(members)
    return [members[i * len(members) // count] for i in range(count)]


def _probe_sides(span: Window) -> list[list[Window]]:
    """Where a density probe looks: the span's end and, when the span is longer than two
    hours, its start; at each, the hour next to it, then the day (asked only when the hour
    shows nothing)."""
    hour, day = timedelta(hours=1), timedelta(days=1)
    sides = [[Window(span.end - hour, span.end), Window(span.end - day, span.end)]]
    if span.end - span.start > 2 * hour:
        sides.append([Window(span.start, span.start + hour), Window(span.start, span.start + day)])
    return sides


def _tag_counts(table: pa.Table, kind: str) -> tuple[Counter[str], Counter[str]]:
    """Rows and bad-quality rows (quality < 192 or missing) per tag or alarm path."""
    if not table.num_rows or kind == KIND_TAG_METADATA:
        return Counter(), Counter()
    keys = one_array(table.column(SCOPE_COLUMN[kind]))
    if kind_of(kind).by_tag:
        quality = one_array(table.column("quality")).cast(pa.int32())
        bad = pc.fill_null(pc.less(quality, GOOD_QUALITY), True)
    else:
        bad = pa.repeat(False, table.num_rows)
    if pa.types.is_dictionary(keys.type) and not keys.null_count:
        return _counts_by_index(keys, bad)
    if pa.types.is_dictionary(keys.type):
        keys = keys.cast(keys.type.value_type)
    grouped = (
        pa.table({"key": keys, "bad": bad.cast(pa.int64())})
        .group_by("key")
        .aggregate([([], "count_all"), ("bad", "sum")])
    )
    names = grouped.column("key").to_pylist()
    rows = Counter(dict(zip(names, grouped.column("count_all").to_pylist(), strict=True)))
    bad_rows = Counter(
        {name: n for name, n in zip(names, grouped.column("bad_sum").to_pylist(), strict=True) if n}
    )
    return rows, bad_rows


def _counts_by_index(keys: pa.DictionaryArray, bad: pa.Array) -> tuple[Counter[str], Counter[str]]:
    """`_tag_counts` of dictionary-encoded keys: counted by index, each name read once
    (a name the dictionary holds twice adds up)."""
    indices = keys.indices.to_numpy(zero_copy_only=False)
    size = len(keys.dictionary)
    rows_at = np.bincount(indices, minlength=size).tolist()
    bad_at = np.bincount(indices[bad.to_numpy(zero_copy_only=False)], minlength=size).tolist()
    rows: Counter[str] = Counter()
    bad_rows: Counter[str] = Counter()
    for name, count, bad_count in zip(keys.dictionary.to_pylist(), rows_at, bad_at, strict=True):
        if count:
            rows[name] += count
        if bad_count:
            bad_rows[name] += bad_count
    return rows, bad_rows


def _typed_tags(types: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(tag, configured type) of the tags whose details say `number` or `boolean`: their
    values go to that type's column, whatever JSON type the node sends them as."""
    return tuple((tag, kind) for tag, kind in types.items() if kind in ("number", "boolean"))
