"""One tailed (flow, node) against the real simulator on loopback (its live feed: every
history sample an event once the node's clock passes it) and real sinks: the rows it
commits are history's rows, never complete, replaced by history to a backfill; each way
of losing events opens a gap that history heals at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from connectors.subscriptions import NodeSubscriptions
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunRequest
from pipelines.core.units import run_flow
from pipelines.live.subscription import LiveSubscription, subscription_data
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


def rows_in(frame: pd.DataFrame, window: Window) -> pd.DataFrame:
    stamps = pd.to_datetime(frame["ts"].astype("int64"), unit="ms", utc=True)
    return frame[(stamps >= window.start) & (stamps < window.end)]


def sink_names(t: Tailed) -> list[str]:
    return list(t.config.flows[FLOW].sinks)


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


def test_a_tail_commits_the_rows_history_writes_for_the_same_samples_never_complete(
    tmp_path: Path, pg_url: str, pg_schema: str
) -> None:
    with tailed(tmp_path / "t", pg=(pg_url, pg_schema)) as t, t.unit() as unit:
        start = t.now_ms()
        t.advance(30_000)
        unit.poll()
        commit = unit.commit()
        span = Window.from_ms(start + 1, start + 30_001)  # the feed's (start, start + 30 s]
        assert commit.rows == t.samples(span.start_ms, span.end_ms) > 0
        for sink in unit.sinks:
            progress = sink.progress(unit.key)
            assert all(progress.windows_of(tag) == [] for tag in t.tags), sink.name
        tail_rows = {name: read(t.config, t.path.parent, name) for name in sink_names(t)}
        t.advance(3_000)  # the span settles
        history_into(t, span, tmp_path / "backfill")
        backfill = read(t.config, tmp_path / "backfill", "lake")
        assert len(backfill) == commit.rows
        for name, rows in tail_rows.items():
            assert without_extra(rows) == without_extra(backfill), name
        # The history run over the same span: the sinks end as a backfill, row for row.
        history_into(t, span, t.path.parent)
        for name in sink_names(t):
            assert canonical(read(t.config, t.path.parent, name)) == canonical(backfill), name


def test_discarded_events_open_a_gap_that_history_heals_at_once(tmp_path: Path) -> None:
    with tailed(tmp_path / "t", profile="events-queue-small") as t, t.unit() as unit:
        opened = unit.node_now()
        t.advance(200_000)  # 10 tags x 200 samples: twice the queue
        unit.poll()
        commit = unit.commit()
        assert commit.discarded >= 800  # the queue holds 1,000 of the 2,000 events
        (gap,) = commit.gaps_opened
        assert gap.start <= opened - unit.live.late_within
        assert gap.end >= opened + pd.Timedelta(seconds=199)
        t.advance(10_000)  # the node's clock moves on: the gap settles
        unit.poll()
        unit.commit()
        assert_healed(t, unit, gap, tmp_path)


def test_a_stale_subscription_is_cancelled_and_the_restart_is_a_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[datetime] = []  # the node's clock (as the unit reads it) once subscribed
    opened = LiveSubscription.open

    def slow_open(self: LiveSubscription) -> int:
        """The node's clock moves on 3 s while the unit opens (a slow selection, a
        loaded machine), as the unit's own clock does; then it subscribes."""
        unit = unit_of[0]
        if unit._run == "second":
            now = t.advance(3_000)
            unit._clock = (now, time.monotonic())
        cancelled = opened(self)
        made.append(unit.node_now())
        return cancelled

    unit_of: list[LiveUnit] = []
    monkeypatch.setattr(LiveSubscription, "open", slow_open)
    monkeypatch.setattr(LiveUnit, "_resolve", _noting(unit_of, LiveUnit._resolve))
    with tailed(tmp_path / "t") as t:
        with t.unit(run="first") as first:
            t.advance(5_000)
            first.poll()
            committed = first.commit()
            assert committed.rows > 0
            last_end = committed.windows[-1].end
            assert first.subscription is not None
            first.subscription.id = None  # killed: nothing cancels its subscription
        with NodePool(t.config) as pool:
            subscriptions = NodeSubscriptions(pool.get("n").client)
            first_data = subscription_data(FLOW, "n", "first")
            assert [r.data for r in subscriptions.records()] == [first_data]
            with t.unit(run="second") as second:
                assert second.stale_cancelled == 1
                listed = [r.data for r in subscriptions.records()]
                assert listed == [subscription_data(FLOW, "n", "second")]
                (gap,) = second.healer.pending()
                assert gap.start <= last_end - second.live.late_within
                # Events start when the node made the subscription: the gap reaches it.
                assert gap.end >= made[-1], (gap, made[-1])
                t.advance(10_000)
                second.poll()
                second.commit()
                assert_healed(t, second, Window(gap.start, last_end), tmp_path)


def _noting(
    units: list[LiveUnit], resolve: Callable[[LiveUnit], None]
) -> Callable[[LiveUnit], None]:
    """`LiveUnit._resolve` that first notes its unit (opened before its subscription)."""

    def noted(self: LiveUnit) -> None:
        units[:] = [self]
        resolve(self)

    return noted


def test_a_subscription_the_node_no_longer_lists_is_made_again_and_healed(
    tmp_path: Path,
) -> None:
    with tailed(tmp_path / "t") as t, t.unit() as unit:
        assert unit.subscription is not None
        t.advance(5_000)
        unit.poll()
        gone = unit.subscription.id
        t.node.subscriptions.cancel({"id": gone})
        t.advance(5_000)  # what the node queues meanwhile is lost
        unit.poll()
        assert unit.subscription.id not in (None, gone)
        assert [r["id"] for r in t.subscriptions()] == [unit.subscription.id]
        t.advance(5_000)
        unit.poll()
        commit = unit.commit()
        (gap,) = commit.gaps_opened
        t.advance(5_000)
        unit.poll()
        assert_healed(t, unit, gap, tmp_path)


def test_late_samples_are_written_in_their_windows_or_left_to_history(
    tmp_path: Path,
) -> None:
    with tailed(tmp_path / "t") as t, t.unit() as unit:
        start = t.now_ms()
        t.advance(30_000)
        unit.poll()
        unit.commit()
        tag = t.tags[0]
        # Store-and-forward: samples of committed windows arrive after newer ones, one
        # within `late_within` of the newest, one before it.
        recent, old = start + 28_507, start + 3_007
        for ts, value in ((recent, 1234.5), (old, 6789.5)):
            t.node.add_late_sample(tag, ts, value)
        t.advance(1_000)
        unit.poll()
        commit = unit.commit()
        assert recent // 1000 * 1000 in [w.start_ms for w in commit.windows]
        assert [w.start_ms for w in commit.gaps_opened] == [old // 1000 * 1000]
        t.advance(3_000)  # the late window settles
        unit.poll()
        assert unit.healer.wait_idle(HEAL_S), unit.healer.pending()
        span = Window.from_ms(start + 1, start + 31_001)
        history_into(t, span, tmp_path / "truth")
        truth = read(t.config, tmp_path / "truth", "lake")
        for sink in unit.sinks:
            held = rows_in(read(t.config, t.path.parent, sink.name), span)
            assert without_extra(held) == without_extra(truth), sink.name


def test_a_model_event_resolves_the_selection_again_and_opens_a_gap(tmp_path: Path) -> None:
    selection = {"browse": "/Plant A/", "include": ["/Line 1/"]}
    with tailed(tmp_path / "t", tags=selection) as t, t.unit() as unit:
        start = t.advance(3_000)
        unit.poll()
        kept, removed = "/Plant A/Line 1/Temp. 000", "/Plant A/Line 1/Pressure 006"
        assert unit.commit().rows == t.samples(start - 2_999, start + 1, [kept, removed])
        gone_at = t.now_ms()
        t.node.remove_tag(removed)
        t.advance(3_000)
        unit.poll()
        after = unit.commit()
        assert after.gaps_opened, "the model changed: history re-reads the recent past"
        t.advance(3_000)
        unit.poll()
        at = t.now_ms()
        assert unit.commit().rows == t.samples(at - 2_999, at + 1, [kept]), "the tag left is out"
        assert unit.healer.wait_idle(HEAL_S), unit.healer.pending()
        later = rows_in(
            read(t.config, t.path.parent, "lake"), Window.from_ms(gone_at + 1, t.now_ms() + 1)
        )
        assert removed not in set(later["tag"])


def test_a_remote_link_that_went_offline_and_came_back_is_a_gap_history_heals(
    tmp_path: Path,
) -> None:
    remote = "/Plant B/Pumps, Main/Temp. 004"  # behind the link, 120 s of lag
    local = "/Plant A/Line 1/Temp. 000"
    with tailed(tmp_path / "t", tags={"paths": [local, remote]}) as t, t.unit() as unit:
        t.tags = [local, remote]
        t.advance(130_000)
        unit.poll()
        assert unit.commit().gaps_opened == []
        # A millisecond on: the node's queue was filled up to now, and a change at that
        # instant would fall before the next fill (a node sends it, this one skips it).
        went = t.now_ms() + 1
        t.node.link.set_outage(went, offline_s=20, drain_s=5)
        t.advance(10_000)
        unit.poll()
        t.advance(40_000)  # back online and drained
        unit.poll()
        commit = unit.commit()
        back = [g for g in commit.gaps_opened if g.start <= Window.from_ms(went, went + 1).start]
        assert back, commit.gaps_opened
        assert back[0].start_ms <= went - 2_000, "from the offline event, late_within before"
        t.advance(5_000)
        unit.poll()
        assert_healed(t, unit, back[0], tmp_path)


def test_an_id_the_restarted_node_gave_another_subscription_is_found_and_healed(
    tmp_path: Path,
) -> None:
    with tailed(tmp_path / "t", profile="subscription-ids-reused") as t, t.unit() as unit:
        assert unit.subscription is not None
        t.advance(5_000)
        unit.poll()
        ours = unit.subscription.id
        t.node.subscriptions.restart()  # our subscription is gone...
        t.node.subscriptions.subscribe({"data": {"someone": "else"}})  # ...its id another's
        t.advance(5_000)
        unit.poll()  # answered: another's queue
        unit.commit()
        assert unit.subscription.id not in (None, ours)
        t.advance(5_000)
        unit.poll()
        (gap,) = unit.commit().gaps_opened
        t.advance(5_000)
        unit.poll()
        assert_healed(t, unit, gap, tmp_path)
