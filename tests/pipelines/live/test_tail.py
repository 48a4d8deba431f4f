"""`tail_flow`, what `historian tail` and `serve` call: commits heard as they land, and a
stop that ends it with its subscription cancelled."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pipelines.config.models import ConfigError
from pipelines.live import TailCommit, TailSummary, tail_flow
from tests.pipelines.live.live_node import FLOW, tailed

READY_S = 120


def test_a_tail_reports_each_commit_and_cancels_its_subscription_when_stopped(
    tmp_path: Path,
) -> None:
    with tailed(tmp_path / "t") as t:
        stop, committed = threading.Event(), threading.Event()
        commits: list[TailCommit] = []
        ended: list[TailSummary] = []

        def heard(commit: TailCommit) -> None:
            commits.append(commit)
            if commit.rows:
                committed.set()

        def tail() -> None:
            ended.append(tail_flow(t.config, FLOW, stop=stop, on_commit=heard, base=t.path.parent))

        runner = threading.Thread(target=tail)
        runner.start()
        try:
            deadline = time.monotonic() + READY_S
            while not t.subscriptions():
                assert runner.is_alive(), "ended before it subscribed"
                assert time.monotonic() < deadline, "never subscribed"
                stop.wait(0.05)
            t.advance(5_000)
            assert committed.wait(READY_S), commits
        finally:
            stop.set()
            runner.join(READY_S)
        (summary,) = ended
        assert summary.rows == sum(c.rows for c in commits) > 0
        assert all(c.key == FLOW and c.node == "n" for c in commits)
        assert t.subscriptions() == [], "cancelled on the way out"


def test_only_a_raw_tag_flow_can_be_tailed(tmp_path: Path) -> None:
    with tailed(tmp_path / "t") as t:
        aggregated = t.config.flows[FLOW].model_copy(update={"mode": "delta"})
        config = t.config.model_copy(update={"flows": {FLOW: aggregated}})
        with pytest.raises(ConfigError, match=r"flows\.live\.mode: a tail writes raw samples"):
            tail_flow(config, FLOW, stop=threading.Event())
