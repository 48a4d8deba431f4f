"""One tailed (flow, node) against the real simulator on loopback and real sinks: the
rows it commits are history's rows, never complete, replaced by history to a backfill;
every way of losing events opens a gap that history heals."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunRequest
from pipelines.core.units import run_flow
from tests.fixtures import canonical
from tests.pipelines.live.live_node import FLOW, Tailed, read, tailed

HEAL_S = 120  # a gap's history run, on a busy machine


def history_into(tailed: Tailed, window: Window, base: Path) -> None:
    """The flow's history over `window`, through the core, into the sinks under `base`."""
    with NodePool(tailed.config) as nodes, SinkSet(tailed.config, base, writing=True) as sinks:
        run_flow(
            tailed.config,
            FLOW,
            nodes=nodes,
            sinks=sinks,
            request=RunRequest(start=window.start, end=window.end),
        )


def without_extra(frame: pd.DataFrame) -> list[tuple[object, ...]]:
    """Rows without `extra`: an event has no such element (pipelines/live/rows.py)."""
    return canonical(frame.drop(columns=["extra"]))


def test_a_tail_commits_the_rows_history_writes_for_the_same_samples_never_complete(
    tmp_path: Path,
) -> None:
    with tailed(tmp_path / "t") as t, t.unit() as unit:
        now = t.now_ms() // 1000 * 1000
        span = Window.from_ms(now - 40_000, now - 10_000)
        published = t.publish(span.start_ms, span.end_ms)
        unit.poll()
        commit = unit.commit()
        assert commit.rows == published > 0
        for name in ("lake", "duck"):
            sink = unit.sinks[[s.name for s in unit.sinks].index(name)]
            progress = sink.progress(unit.key)
            assert all(progress.windows_of(tag) == [] for tag in t.tags), name
        tail_rows = {name: read(t.config, t.path.parent, name) for name in ("lake", "duck")}
        history_into(t, span, tmp_path / "backfill")
        backfill = read(t.config, tmp_path / "backfill", "lake")
        assert len(backfill) == published
        for name, rows in tail_rows.items():
            assert without_extra(rows) == without_extra(backfill), name
        # The history run over the same span: the sinks end as a backfill, row for row.
        history_into(t, span, t.path.parent)
        for name in ("lake", "duck"):
            assert canonical(read(t.config, t.path.parent, name)) == canonical(backfill), name
