"""One tailed (flow, node) against the real simulator on loopback and real sinks: the
rows it commits are history's rows, never complete, replaced by history to a backfill;
every way of losing events opens a gap that history heals."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from connectors.subscriptions import NodeSubscriptions
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunRequest
from pipelines.core.units import run_flow
from pipelines.live.subscription import subscription_data
from pipelines.live.unit import LiveUnit
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


def rows_in(frame: pd.DataFrame, window: Window) -> pd.DataFrame:
    stamps = pd.to_datetime(frame["ts"].astype("int64"), unit="ms", utc=True)
    return frame[(stamps >= window.start) & (stamps < window.end)]


def assert_healed(t: Tailed, unit: LiveUnit, gap: Window, tmp_path: Path) -> None:
    """History re-read `gap`: the sinks hold exactly its rows there, complete."""
    assert unit.healer.wait_idle(HEAL_S), f"gaps not healed: {unit.healer.pending()}"
    history_into(t, gap, tmp_path / "truth")
    truth = rows_in(read(t.config, tmp_path / "truth", "lake"), gap)
    assert len(truth)
    for sink in unit.sinks:
        held = rows_in(read(t.config, t.path.parent, sink.name), gap)
        assert canonical(held) == canonical(truth), sink.name
        for tag in t.tags:
            covered = sink.progress(unit.key).windows_of(tag)
            assert any(w.start <= gap.start and gap.end <= w.end for w in covered), (tag, covered)


def test_discarded_events_open_a_gap_that_history_heals_at_once(tmp_path: Path) -> None:
    with tailed(tmp_path / "t") as t, t.unit() as unit:
        opened = unit.node_now()
        # The flow's samples since shortly before the tail opened, then more events than
        # the node's queue holds: the oldest (the flow's) are discarded.
        published = t.publish(int(opened.timestamp() * 1000) - 2_000, t.now_ms())
        filler = t.node.tag_paths()[-1]
        for index in range(10_050):
            t.node.subscriptions.publish_tag(filler, float(index), 192, t.now_ms())
        unit.poll()
        commit = unit.commit()
        assert commit.discarded >= published > 0
        assert commit.rows == 0, "what survived the queue is not the flow's"
        (gap,) = commit.gaps_opened
        assert gap.start <= opened - unit.live.late_within
        assert_healed(t, unit, gap, tmp_path)


def test_a_stale_subscription_is_cancelled_and_the_restart_is_a_gap(tmp_path: Path) -> None:
    with tailed(tmp_path / "t") as t:
        with t.unit(run="first") as first:
            now = t.now_ms() // 1000 * 1000
            t.publish(now - 6_000, now - 3_000)
            first.poll()
            committed = first.commit()
            assert committed.rows > 0
            last_end = committed.windows[-1].end
            assert first.subscription is not None
            first.subscription.id = None  # killed: nothing cancels its subscription
        with NodePool(t.config) as pool:
            subscriptions = NodeSubscriptions(pool.get("n").client)
            left = [
                r
                for r in subscriptions.records()
                if r.data == subscription_data(FLOW, "n", "first")
            ]
            assert len(left) == 1
            with t.unit(run="second") as second:
                assert second.stale_cancelled == 1
                listed = [r.data for r in subscriptions.records()]
                assert listed == [subscription_data(FLOW, "n", "second")]
                gap = second.healer.pending()[0]
                assert gap.start <= last_end - second.live.late_within
                assert_healed(t, second, Window(gap.start, last_end), tmp_path)


def test_a_subscription_the_node_no_longer_lists_is_made_again_and_healed(
    tmp_path: Path,
) -> None:
    with tailed(tmp_path / "t") as t, t.unit() as unit:
        assert unit.subscription is not None
        gone = unit.subscription.id
        t.node.subscriptions.cancel({"id": gone})
        opened = unit.node_now()
        t.publish(int(opened.timestamp() * 1000) - 2_000, t.now_ms())
        unit.poll()
        assert unit.subscription.id not in (None, gone)
        assert [r["id"] for r in t.subscriptions()] == [unit.subscription.id]
        commit = unit.commit()
        (gap,) = commit.gaps_opened
        assert_healed(t, unit, gap, tmp_path)


def test_late_samples_are_written_in_their_windows_or_left_to_history(
    tmp_path: Path,
) -> None:
    with tailed(tmp_path / "t") as t, t.unit() as unit:
        now = t.now_ms() // 1000 * 1000
        span = Window.from_ms(now - 30_000, now - 10_000)
        t.publish(span.start_ms, span.end_ms)
        unit.poll()
        unit.commit()
        tag = t.tags[0]
        # Store-and-forward: a sample of a committed window arrives after newer ones.
        recent, old = span.end_ms - 1_500 + 7, span.start_ms + 3_000 + 7
        for ts, value in ((recent, 1234.5), (old, 6789.5)):
            t.node.add_late_sample(tag, ts, value)
            t.node.subscriptions.publish_tag(tag, value, 192, ts)
        unit.poll()
        commit = unit.commit()
        assert [w.start_ms for w in commit.windows] == [recent // 1000 * 1000]
        assert [w.start_ms for w in commit.gaps_opened] == [old // 1000 * 1000]
        assert unit.healer.wait_idle(HEAL_S)
        history_into(t, span, tmp_path / "truth")
        truth = read(t.config, tmp_path / "truth", "lake")
        for sink in unit.sinks:
            held = rows_in(read(t.config, t.path.parent, sink.name), span)
            assert without_extra(held) == without_extra(truth), sink.name
