"""`tail_flow`: a flow's live tail until stopped, what `historian tail` and `serve` run.

Polls each unit's subscription every `live.poll_every`, commits every
`live.commit_every`, and ends when `stop` is set or `duration` has passed: a last commit,
then each subscription cancelled, its gap runs stopped, its locks released.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.models import Config, ConfigError, LiveConfig, TagHistoryFlow
from pipelines.config.nodes import NodePool
from pipelines.live.unit import LiveUnit, UnitCommit, live_settings


@dataclass(frozen=True)
class TailCommit:
    """One commit of one unit: the windows written, the rows in them, and since the
    commit before, the events kept, the events the node discarded and the gaps."""

    flow: str
    node: str
    key: str
    windows: tuple[Window, ...]
    rows: int  # rows written: a window written again (late samples) counts again
    events: int  # samples of the flow's tags received
    discarded: int
    gaps_opened: tuple[Window, ...]
    gaps_healed: tuple[Window, ...]
    gaps_pending: tuple[Window, ...]
    # Seconds from the newest committed sample's node time to the commit (None: no rows).
    lag_s: float | None
    at: datetime


@dataclass
class TailSummary:
    """A tail from start to stop."""

    flow: str
    nodes: tuple[str, ...]
    run: str
    commits: int = 0
    rows: int = 0
    events: int = 0
    discarded: int = 0
    stale_cancelled: int = 0
    gaps_opened: list[Window] = field(default_factory=list)
    gaps_healed: list[Window] = field(default_factory=list)
    gaps_pending: list[Window] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, commit: TailCommit) -> None:
        self.commits += 1 if commit.windows else 0
        self.rows += commit.rows
        self.events += commit.events
        self.discarded += commit.discarded
        self.gaps_opened.extend(commit.gaps_opened)
        self.gaps_healed.extend(commit.gaps_healed)


def live_flow(config: Config, name: str) -> TagHistoryFlow:
    """The flow, if it can be tailed (a tag flow in raw mode); else a ConfigError line."""
    flow = config.flows.get(name)
    if not isinstance(flow, TagHistoryFlow):
        raise ConfigError(f"flows.{name}: only tag_history flows can be tailed")
    if flow.mode != "raw":
        raise ConfigError(f"flows.{name}.mode: a tail writes raw samples, not mode {flow.mode}")
    return flow


def tail_flow(
    cfg: Config,
    flow: str,
    *,
    nodes: Sequence[str] | None = None,
    stop: threading.Event,
    duration: timedelta | None = None,
    on_commit: Callable[[TailCommit], None] | None = None,
    base: Path | None = None,
) -> TailSummary:
    """Tail `flow` on its nodes (or those of them named) until `stop` is set or `duration`
    has passed; `on_commit` hears each commit; `base`: where relative sink paths start
    (the folder of flows.yaml; default the working directory)."""
    live = live_settings(live_flow(cfg, flow))
    chosen = cfg.select_nodes(flow, nodes)
    summary = TailSummary(flow, tuple(chosen), uuid.uuid4().hex[:12])
    began = time.monotonic()
    ends = None if duration is None else began + duration.total_seconds()
    folder = base or Path.cwd()
    with ExitStack() as stack:
        pool = stack.enter_context(NodePool(cfg))
        sinks = stack.enter_context(SinkSet(cfg, folder, writing=True))
        gap_sinks = stack.enter_context(SinkSet(cfg, folder, writing=True))
        units = [
            stack.enter_context(
                LiveUnit(
                    cfg, flow, node, nodes=pool, sinks=sinks, gap_sinks=gap_sinks, run=summary.run
                )
            )
            for node in chosen
        ]
        summary.stale_cancelled = sum(unit.stale_cancelled for unit in units)
        _loop(units, live, stop, ends, summary, on_commit)
        summary.gaps_pending = [w for unit in units for w in unit.healer.pending()]
    summary.seconds = time.monotonic() - began
    return summary


def _loop(
    units: list[LiveUnit],
    live: LiveConfig,
    stop: threading.Event,
    ends: float | None,
    summary: TailSummary,
    on_commit: Callable[[TailCommit], None] | None,
) -> None:
    """Poll and commit until stopped; a last commit of what was polled."""
    every = live.commit_every.total_seconds()
    next_commit = time.monotonic() + every
    while not stop.is_set() and (ends is None or time.monotonic() < ends):
        for unit in units:
            unit.poll(stop)
        if time.monotonic() >= next_commit:
            next_commit += every
            _commit(units, summary, on_commit)
        left = [live.poll_every.total_seconds(), max(0.0, next_commit - time.monotonic())]
        if ends is not None:
            left.append(max(0.0, ends - time.monotonic()))
        stop.wait(min(left))
    _commit(units, summary, on_commit)


def _commit(
    units: list[LiveUnit], summary: TailSummary, on_commit: Callable[[TailCommit], None] | None
) -> None:
    for unit in units:
        done = unit.commit()
        commit = _described(unit, done)
        summary.add(commit)
        if on_commit is not None and (done.windows or done.gaps_opened or done.gaps_healed):
            on_commit(commit)


def _described(unit: LiveUnit, done: UnitCommit) -> TailCommit:
    at = datetime.now(UTC)
    lag = None if done.newest is None else (unit.node_now() - done.newest).total_seconds()
    return TailCommit(
        flow=unit.name,
        node=unit.node_name,
        key=unit.key,
        windows=tuple(done.windows),
        rows=done.rows,
        events=done.events,
        discarded=done.discarded,
        gaps_opened=tuple(done.gaps_opened),
        gaps_healed=tuple(done.gaps_healed),
        gaps_pending=tuple(unit.healer.pending()),
        lag_s=lag,
        at=at,
    )
