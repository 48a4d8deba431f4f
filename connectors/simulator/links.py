"""The node's link to its remote site: online, offline for a while, then draining.

Tags over the link (`remote` non-null in details) reach the node through it. While the
link is offline the remote side keeps their samples in its store-and-forward buffer, so
history holds none stamped since the outage began; back online, the buffer drains
oldest first over `drain_ms`, each sample arriving stamped in the past; after that
history holds every sample again. The node shows it (docs/node-behaviour.md, "Links"):
`link?cmd=get` `online` false while offline; while draining `online` true and the remote
side's `sf.backlog` (samples still buffered, a field the spec does not show) above 0;
each remote tag's `status` {value 0, ts: since} while offline and {value 1, ts: back}
after. A node of the `link_online_only` behaviour shows no `sf` at all.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from connectors.simulator.tagtree import TagSpec

LINK_NAME = "to-remote"
# The `link-outage` profile: offline this long after the node starts, for this long,
# then draining for this long (a test sets its own with `LinkState.set_outage`).
OUTAGE_AFTER_S = 60.0
OUTAGE_OFFLINE_S = 240.0
OUTAGE_DRAIN_S = 60.0
_FOREVER_MS = 1 << 62


@dataclass(frozen=True)
class Outage:
    """Offline over [start_ms, end_ms), then draining until end_ms + drain_ms."""

    start_ms: int
    end_ms: int
    drain_ms: int

    def phase(self, now_ms: int) -> str:
        """`before`, `offline`, `draining` or `over`."""
        if now_ms < self.start_ms:
            return "before"
        if now_ms < self.end_ms:
            return "offline"
        return "draining" if now_ms < self.end_ms + self.drain_ms else "over"

    def hidden(self, now_ms: int) -> tuple[int, int] | None:
        """The stamps [lo, hi) still in the buffer at `now_ms`, or None."""
        phase = self.phase(now_ms)
        if phase == "offline":
            return self.start_ms, _FOREVER_MS
        if phase != "draining":
            return None
        drained = (now_ms - self.end_ms) * (self.end_ms - self.start_ms) // self.drain_ms
        return self.start_ms + drained, self.end_ms


class LinkState:
    """The one outgoing link `to-remote`, and the outage it may go through."""

    def __init__(self, started_ms: int, *, outage: bool, online_only: bool) -> None:
        self._lock = threading.Lock()
        self.online_only = online_only
        self._outage: Outage | None = None
        if outage:
            self.set_outage(
                started_ms + int(OUTAGE_AFTER_S * 1000), OUTAGE_OFFLINE_S, OUTAGE_DRAIN_S
            )

    @property
    def outage(self) -> Outage | None:
        return self._outage

    def set_outage(self, start_ms: int, offline_s: float, drain_s: float = 0.0) -> None:
        """The link goes offline at `start_ms` for `offline_s`, then drains for `drain_s`."""
        if offline_s <= 0 or drain_s < 0:
            raise ValueError("offline_s must be positive and drain_s not negative")
        end_ms = start_ms + int(offline_s * 1000)
        with self._lock:
            self._outage = Outage(start_ms, end_ms, int(drain_s * 1000))

    def shown(self, spec: TagSpec, now_ms: int) -> TagSpec:
        """`spec` as history shows it now: a remote tag's buffered stamps hidden."""
        outage = self._outage
        if outage is None or not spec.remote_lag_ms:
            return spec
        hidden = outage.hidden(now_ms)
        return spec if hidden is None else replace(spec, hidden=hidden)

    def status(self, spec: TagSpec, now_ms: int, ts_ms: int) -> dict[str, int]:
        """A tag's `status`: 0 since the outage began while offline, else 1 (since the
        link came back, for a remote tag after an outage; else `ts_ms`)."""
        outage = self._outage
        if outage is None or not spec.remote_lag_ms:
            return {"value": 1, "ts": ts_ms}
        phase = outage.phase(now_ms)
        if phase == "offline":
            return {"value": 0, "ts": outage.start_ms}
        return {"value": 1, "ts": ts_ms if phase == "before" else outage.end_ms}

    def answer(self, node_name: str, remote: Sequence[TagSpec], now_ms: int) -> dict[str, Any]:
        """The `link?cmd=get` answer (spec: Link)."""
        outage = self._outage
        phase = outage.phase(now_ms) if outage is not None else "over"
        link: dict[str, Any] = {"name": LINK_NAME, "type": "out", "online": phase != "offline"}
        if not self.online_only:
            backlog = _backlog(outage, remote, now_ms) if outage is not None else 0
            side = {
                "subscription": "all",
                "view": {"name": "default", "ro": True, "ae": True, "ack": False},
                "sf": {"enabled": True, "paused": False},
                "tagCount": len(remote),
            }
            link["local"] = {**side, "gzip": True}
            link["remote"] = {
                **side,
                "sf": {"enabled": True, "paused": False, "backlog": backlog},
                "endpoint": "127.0.0.1:3800",
            }
        return {"nodeInfo": {"name": node_name}, "links": {LINK_NAME: link}}


def _backlog(outage: Outage, remote: Sequence[TagSpec], now_ms: int) -> int:
    """Samples still buffered (about: gaps are not left out), at least 1 while any is."""
    hidden = outage.hidden(now_ms)
    if hidden is None:
        return 0
    lo, hi = hidden[0], min(hidden[1], now_ms)
    return max(1, sum(max(0, hi - lo) // spec.period_ms for spec in remote))
