"""One tailed (flow, node): its subscription polled into windows, committed, its gaps healed.

The tail writes the newest part of the flow's own dataset through the sink contract
(`Sink.write`: each commit's scope replaced, once, with its record) under the flow's
progress key, but every tag it writes is `held` with the reason `live`
(`ChunkScope.held`): rows in place, no window complete. The history run that later
covers those windows replaces them and proves them, so the dataset ends as a backfill
would leave it. The tail holds a lock of its own (`<key>~live`): a second tail of the
unit is refused, and the unit's scheduled runs (and this tail's gap runs) keep theirs.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType

import pyarrow as pa
import pyarrow.compute as pc

from connectors.normalise.events import EventsPage
from connectors.subscriptions import NodeSubscriptions
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.models import (
    Config,
    LiveConfig,
    TagHistoryFlow,
    flow_dataset,
    unit_key,
)
from pipelines.config.nodes import ConnectedNode, NodePool
from pipelines.core.runner import RunRequest, dataset_attrs, options_key
from pipelines.core.units import run_flow
from pipelines.live.coverage import Coverage
from pipelines.live.gaps import GapHealer
from pipelines.live.subscription import LiveSubscription
from pipelines.live.windows import Batch, WindowBuffer
from pipelines.planning import chunk_id
from pipelines.selection import resolve_tags
from pipelines.state import check_same_node, identity_member
from sinks.base import ChunkScope, Compacts, Sink, SinkError, merge_windows

log = logging.getLogger("historian.live")

LIVE = "live"  # the reason the ledger gives for a tail's rows (held, not complete)
LIVE_CHUNK = "live-"  # the tail's chunk ids start so (how a restart finds its last commit)
# Commits between two compactions of the dataset's small files (each commit adds some).
COMPACT_EVERY = 120
# Commits between two readings of the unit's progress (a scheduled run may have proved
# windows since; the tail's own gap runs are read at once).
COVERAGE_EVERY = 12


def live_lock_key(key: str) -> str:
    """The lock a tail of unit `key` holds (not the unit's: its history runs go on)."""
    return f"{key}~live"


def live_settings(flow: TagHistoryFlow) -> LiveConfig:
    """The flow's `live:`, or for a flow without one the defaults, `late_within` kept
    inside its `settle` (the tail writes only what history has not reached yet)."""
    if flow.live is not None:
        return flow.live
    return LiveConfig(late_within=min(LiveConfig().late_within, flow.settle))


@dataclass
class UnitCommit:
    """What one commit of a unit wrote, and what happened since the one before."""

    windows: list[Window] = field(default_factory=list)
    rows: int = 0
    events: int = 0
    discarded: int = 0
    gaps_opened: list[Window] = field(default_factory=list)
    gaps_healed: list[Window] = field(default_factory=list)
    newest: datetime | None = None


class LiveUnit:
    """The tail of one (flow, node); a context manager holding its lock and subscription."""

    def __init__(
        self,
        config: Config,
        name: str,
        node: str,
        *,
        nodes: NodePool,
        sinks: SinkSet,
        gap_sinks: SinkSet,
        run: str,
    ) -> None:
        flow = config.flows[name]
        assert isinstance(flow, TagHistoryFlow)
        self.config, self.name, self.flow, self.node_name = config, name, flow, node
        self.live = live_settings(flow)
        self.key = unit_key(name, node, flow)
        self.dataset = flow_dataset(name, flow)
        self._nodes, self._sinks, self._gap_sinks, self._run = nodes, sinks, gap_sinks, run
        self.buffer = WindowBuffer(self.live.commit_every, self.live.late_within)
        self.healer = GapHealer(self._run_gap, self._settled, self.key)
        self.coverage = Coverage()  # what history proved: the tail never writes there
        self._stack = ExitStack()
        self._types: dict[str, str] = {}
        self._identity: tuple[str, ...] = ()
        self._offline: dict[str, datetime] = {}  # remote tag -> when its link went offline
        self._since = UnitCommit()
        self._commits = 0
        self._since_read = 0  # commits since the unit's progress was last read
        self._last_ok = datetime.now(UTC)
        self._clock = (0, 0.0)  # the node's sys.ts (ms) and time.monotonic() then
        self._newest_ms: int | None = None  # the newest sample's time the node sent
        self._lost_since: datetime | None = None  # events may be lost from here on
        self._lost_why = ""
        self.subscription: LiveSubscription | None = None
        self.stale_cancelled = 0

    # -- lifecycle -------------------------------------------------------------------

    @property
    def node(self) -> ConnectedNode:
        return self._nodes.get(self.node_name)

    @property
    def sinks(self) -> list[Sink]:
        return [self._sinks.get(name) for name in self.flow.sinks]

    def __enter__(self) -> LiveUnit:
        try:
            self._open()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _open(self) -> None:
        for sink in self.sinks:
            self._stack.enter_context(sink.lock(live_lock_key(self.key)))
        facts = self.node.facts()
        if facts.clock is not None:
            self._clock = (facts.clock.node_ms, facts.clock.read_monotonic)
        reset = f"historian state reset {self.name}"
        progresses = [s.progress(self.key) for s in self.sinks]
        check_same_node(progresses, facts.identity, self.node_name, reset)
        self.coverage.update(p.completed for p in progresses)
        self._identity = (identity_member(facts.identity.key()),)
        self._resolve()
        self._stack.callback(self.healer.close)
        self.healer.start()
        subscription = LiveSubscription(
            NodeSubscriptions(self.node.client), self.key, self.node_name, self._run,
            self.live.poll_limit,
        )  # fmt: skip
        self.stale_cancelled = subscription.open()
        self.subscription = subscription
        self._stack.callback(subscription.cancel)  # first on the way out
        # The subscription's events start when the node made it: a restart's gap reaches
        # to the node's clock read after that, not before (a second of samples was lost
        # between the two when the selection took that long to resolve).
        self._last_ok = self.node_now()
        last = self._last_commit_end()
        if last is not None or self.stale_cancelled:
            since = (last or self._last_ok) - self.live.late_within
            self._gap(Window(since, self._last_ok), "the tail restarted")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.close()

    def _resolve(self) -> None:
        """The flow's tags on the node, by its own selection (again on a `model` event)."""
        where = f"flows.{self.name}.tags"
        resolved = resolve_tags(self.node.client, self.node.name, self.flow.tags, where=where)
        types = resolved.types
        self._types = {tag: types.get(tag, "") for tag in resolved.members}

    def _last_commit_end(self) -> datetime | None:
        """Where the last tail commit of this unit ended (the earliest over the sinks)."""
        ends: list[datetime] = []
        for sink in self.sinks:
            tail = [
                r for r in sink.chunk_log(self.key, limit=500) if r.chunk_id.startswith(LIVE_CHUNK)
            ]
            if tail:
                ends.append(max(r.window.end for r in tail))
        return min(ends) if ends else None

    # -- the node's clock and gaps ----------------------------------------------------

    def node_now(self) -> datetime:
        """The node's clock now (it stamps the samples): its reading at the start moved on
        by ours, or the newest sample it sent when that is later."""
        node_ms, read = self._clock
        if not node_ms:
            estimate = datetime.now(UTC)
        else:
            elapsed = timedelta(seconds=time.monotonic() - read)
            estimate = datetime.fromtimestamp(node_ms / 1000, UTC) + elapsed
        if self._newest_ms is None:
            return estimate
        return max(estimate, datetime.fromtimestamp(self._newest_ms / 1000, UTC))

    def _settled(self) -> datetime:
        return self.node_now() - self.flow.settle

    def _gap(self, window: Window, why: str) -> None:
        """Give `window` to history: the tail drops and no longer writes it."""
        whole = self.buffer.fence(window)
        self._since.gaps_opened.append(whole)
        self.healer.open(whole, why)

    def _run_gap(self, window: Window) -> datetime | None:
        """History over exactly `window`, through the core (this node only). Returns how
        far the run proved the window: to its end, or to the start of the first window
        it held (a link still draining has not delivered that yet), so the healer runs
        the rest again instead of taking it as re-read."""
        request = RunRequest(start=window.start, end=window.end, nodes=(self.node_name,))
        summary = run_flow(
            self.config, self.name, nodes=self._nodes, sinks=self._gap_sinks, request=request
        )
        if summary.span is None:
            return None
        held = [w.start for windows in summary.held.values() for w in windows]
        return min([summary.span.end, *held])

    # -- polling ---------------------------------------------------------------------

    def poll(self, stop: threading.Event | None = None) -> None:
        """Drain the subscription into the windows; open the gaps it shows. A gap of a
        failed poll, a lost subscription or discarded events reaches from `late_within`
        before the last good poll to the node's clock at the next good one."""
        assert self.subscription is not None, "enter the unit first"
        invalid_as_null = self.flow.invalid_as_null is not False  # the node's default: on
        poll = self.subscription.poll(
            self.node.name, self._types, invalid_as_null=invalid_as_null, stop=stop
        )
        if poll.lost:
            self._lost(poll.lost)
            return
        for page in poll.pages:
            self._take(page)
        if poll.discarded:
            self._since.discarded += poll.discarded
            self._lost(f"the node discarded {poll.discarded} events")
        now = self.node_now()
        if self._lost_since is not None:
            self._gap(Window(self._lost_since, now), self._lost_why)
            self._lost_since = None
        self._last_ok = now

    def _lost(self, why: str) -> None:
        if self._lost_since is None:
            self._lost_since = self._last_ok - self.live.late_within
            self._lost_why = why

    def _take(self, page: EventsPage) -> None:
        """One answer's samples into the windows; its link changes and model changes."""
        rows = page.rows
        if rows.num_rows:
            newest = int(pc.max(rows.column("ts").cast(pa.int64())).as_py())
            self._newest_ms = max(self._newest_ms or 0, newest)
            self._add(rows)
        for tag, ts, value in zip(
            *(page.statuses.column(c).to_pylist() for c in ("tag", "ts", "value")), strict=True
        ):
            self._status(tag, ts, value)
        if page.models:  # the tag model changed: the selection again, and a gap
            self._resolve()
            since = self._last_ok - self.live.late_within
            self._gap(Window(since, self.node_now()), "the tag model changed")

    def _status(self, tag: str, ts: datetime | None, value: int | None) -> None:
        """A remote tag's link going offline, and coming back: a gap over the outage
        (from the tag's newest sample written when the offline event was not seen)."""
        now = self.node_now()
        if value == 0:
            self._offline.setdefault(tag, ts or now)
        elif value == 1:
            went = self._offline.pop(tag, None) or self._last_seen(tag)
            self._gap(Window(went - self.live.late_within, now), "a remote link came back online")

    def _last_seen(self, tag: str) -> datetime:
        newest = self.buffer.newest_of(tag)
        if newest is None:
            return self._last_ok
        return min(self._last_ok, datetime.fromtimestamp(newest / 1000, UTC))

    def _add(self, rows: pa.Table) -> None:
        """The flow's tags' rows into the windows; late ones' windows to history."""
        ours = rows.filter(pc.is_in(rows.column("tag"), value_set=pa.array(list(self._types))))
        self._since.events += ours.num_rows
        ours = self.coverage.drop(ours)  # history proved them: it has them
        for window in merge_windows(self.buffer.add(ours)):
            self._since.gaps_opened.append(window)
            self.healer.open(window, "late samples past the tail's windows")

    # -- committing ------------------------------------------------------------------

    def commit(self) -> UnitCommit:
        """Write every window that received rows since the last commit, to every sink;
        then make sure the node still lists the subscription as ours."""
        done, self._since = self._since, UnitCommit()
        done.gaps_healed = self.healer.take_healed()
        self._since_read += 1
        if done.gaps_healed or self._since_read >= COVERAGE_EVERY:
            self.coverage.update(s.progress(self.key).completed for s in self.sinks)
            self._since_read = 0
        for taken in self.buffer.take():
            for window, rows in self.coverage.clip(taken.window, taken.rows):
                batch = Batch(window, rows)
                scope = self.scope(batch, clipped=window != taken.window)
                for sink in self.sinks:
                    sink.write(scope, batch.rows, batch.rows.num_rows)
                done.windows.append(batch.window)
                done.rows += batch.rows.num_rows
                newest = pc.max(batch.rows.column("ts")).as_py()
                done.newest = newest if done.newest is None else max(done.newest, newest)
        self.buffer.forget_old()
        if self.subscription is not None and (why := self.subscription.verify()) is not None:
            self._lost(why)  # the gap opens at the next good poll
        self._commits += 1 if done.windows else 0
        if done.windows and self._commits % COMPACT_EVERY == 0:
            self.compact()
        return done

    def scope(self, batch: Batch, *, clipped: bool = False) -> ChunkScope:
        """A commit's scope: the tags of its rows, held `live`, in its windows (a window
        clipped to what history has not proved names its first tag in its id: tags of
        other coverage may share the clipped window)."""
        tags = _tags(batch.rows)
        named = (LIVE, tags[0]) if clipped else (LIVE,)
        ident = chunk_id(self.key, self.dataset, named, batch.window, options_key(self.flow))
        return ChunkScope(
            flow=self.key,
            dataset=self.dataset,
            kind=self.flow.kind,
            members=tags + self._identity,
            window=batch.window,
            chunk_id=LIVE_CHUNK + ident,
            attrs=dataset_attrs(self.name, self.flow),
            node=self.node.name,
            window_size=self.live.commit_every,
            held=dict.fromkeys(tags, LIVE),
        )

    def compact(self) -> None:
        """Merge the small files the commits left (a sink failing to is logged)."""
        for sink in self.sinks:
            if isinstance(sink, Compacts):
                try:
                    sink.compact(self.dataset)
                except SinkError as exc:
                    log.warning("%s: not compacted: %s", self.key, exc)


def _tags(rows: pa.Table) -> tuple[str, ...]:
    """The tags of a commit's rows, sorted: its scope's members."""
    return tuple(sorted(str(tag) for tag in pc.unique(rows.column("tag")).to_pylist()))
