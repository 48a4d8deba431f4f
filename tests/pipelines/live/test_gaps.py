"""Gaps (pure, a recorded history runner): merged, run one at a time up to the settled
time, the rest run once it settles, a failed run tried again."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from connectors.timewindow import Window
from pipelines.live import gaps
from pipelines.live.gaps import GapHealer

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class History:
    """Records the windows asked; fails the first `fail` runs."""

    def __init__(self, fail: int = 0) -> None:
        self.asked: list[Window] = []
        self.fail = fail
        self.settled = at(100)
        self.lock = threading.Lock()
        self.ran = threading.Event()

    def run(self, window: Window) -> datetime | None:
        with self.lock:
            self.asked.append(window)
            self.ran.set()
            if self.fail:
                self.fail -= 1
                raise RuntimeError("flow 'f' is already running")
        return min(window.end, self.settled)


def test_gaps_are_merged_and_run_up_to_the_settled_time_then_the_rest() -> None:
    history = History()
    healer = GapHealer(history.run, lambda: history.settled, "f")
    healer.open(Window(at(10), at(20)), "discards")
    healer.open(Window(at(15), at(120)), "a poll failed")
    healer.start()
    try:
        assert history.ran.wait(30)
        assert history.asked == [Window(at(10), at(100))]
        assert not healer.wait_idle(0.2), "the part past the settled time waits"
        history.settled = at(200)
        healer.open(Window(at(150), at(160)), "the tail restarted")
        assert healer.wait_idle(30)
        assert history.asked[1:] == [Window(at(100), at(120)), Window(at(150), at(160))]
        assert healer.take_healed() == history.asked
    finally:
        healer.close()


def test_a_failed_run_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gaps, "RETRY_S", 0.05)
    history = History(fail=2)
    healer = GapHealer(history.run, lambda: history.settled, "f")
    healer.open(Window(at(10), at(20)), "discards")
    healer.start()
    try:
        assert healer.wait_idle(30)
        assert history.asked == [Window(at(10), at(20))] * 3
        assert healer.failures == 2
    finally:
        healer.close()
