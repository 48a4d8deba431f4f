"""Gaps: windows where the tail may have lost events, re-read by history at once.

History stays the truth: a window the tail cannot vouch for (the node discarded events,
a poll failed, the subscription was lost, the tail restarted, a remote link came back, the
tag model changed) is run through the flow's own history core for exactly that window, on
a thread of its own so polling goes on, one run at a time, gaps merged. The run keeps
history's completeness rules: it ends at the node's clock minus `settle`, so the rest of
a gap waits here until it has settled, and is run then.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from connectors.errors import one_line
from connectors.timewindow import Window
from sinks.base import merge_windows

log = logging.getLogger("historian.live")

# A gap run that failed (the flow locked by a scheduled run, the node away) is tried again
# after this long.
RETRY_S = 5.0
# How far a gap reaches before it is run: up to what history may mark complete.
Settled = Callable[[], datetime]
# Runs history over a window; returns where the run ended (the window's end, or earlier
# when `now - settle` cut it), or None when it read nothing.
RunGap = Callable[[Window], datetime | None]


class GapHealer:
    """The gaps of one tail unit, and the thread that has history re-read them."""

    def __init__(self, run_gap: RunGap, settled: Settled, name: str) -> None:
        self._run_gap = run_gap
        self._settled = settled
        self._name = name
        self._pending: list[Window] = []
        self._cond = threading.Condition()
        self._closed = False
        self._running: Window | None = None
        self.healed: list[Window] = []
        self.failures = 0
        self._thread = threading.Thread(target=self._work, name=f"gaps {name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def open(self, window: Window, why: str) -> None:
        """Have history re-read `window` (merged with the gaps not yet run)."""
        if window.end <= window.start:
            return
        log.warning("%s: gap %s: %s", self._name, window, why)
        with self._cond:
            self._pending = merge_windows([*self._pending, window])
            self._cond.notify_all()

    def pending(self) -> list[Window]:
        """The gaps not yet re-read (the one running included)."""
        with self._cond:
            running = [self._running] if self._running is not None else []
            return merge_windows([*self._pending, *running])

    def take_healed(self) -> list[Window]:
        """The windows history re-read since the last call."""
        with self._cond:
            healed, self.healed = self.healed, []
            return healed

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop after the run under way (if it ends within `timeout_s`)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _next(self) -> Window | None:
        """The settled part of the earliest gap, waiting for one (None: closed)."""
        with self._cond:
            while not self._closed:
                settled = self._settled()
                ready = [w for w in self._pending if w.start < settled]
                if ready:
                    window = ready[0]
                    cut = Window(window.start, min(window.end, settled))
                    rest = [Window(cut.end, window.end)] if cut.end < window.end else []
                    self._pending = [*rest, *(w for w in self._pending if w != window)]
                    self._running = cut
                    return cut
                wait = RETRY_S
                if self._pending:  # the earliest settles in a moment
                    wait = min(wait, max(0.05, (self._pending[0].start - settled).total_seconds()))
                self._cond.wait(wait if self._pending else None)
        return None

    def _work(self) -> None:
        while (window := self._next()) is not None:
            try:
                ended = self._run_gap(window)
            except Exception as exc:  # a gap run failing must not end the tail
                self.failures += 1
                log.warning("%s: gap %s not re-read yet: %s", self._name, window, one_line(exc))
                self._retry_later(window)
                continue
            if ended is None or ended <= window.start:  # the node had not settled it yet
                self._retry_later(window)
                continue
            with self._cond:
                self._running = None
                self.healed.append(Window(window.start, min(ended, window.end)))
                if ended < window.end:  # cut at the node's `now - settle`: the rest later
                    self._pending = merge_windows([*self._pending, Window(ended, window.end)])
                self._cond.notify_all()

    def _retry_later(self, window: Window) -> None:
        with self._cond:
            self._running = None
            self._pending = merge_windows([*self._pending, window])
            self._cond.wait(RETRY_S)

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether every gap has been re-read within `timeout_s` (tests, a clean stop)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._pending and self._running is None, timeout_s
            )
