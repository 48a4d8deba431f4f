"""Simulated alarms: one per five tags, whose history follows hashed state changes.

Time is cut into 30-minute slots per alarm; in about one slot of three the alarm
activates (status 3), may be acknowledged while active (3 -> 1), clears (1 -> 0, or
3 -> 2) and may be acknowledged after clearing (2 -> 0). Every change is one history
event shaped like the alarm record, plus an `origin` object the spec does not show
(kept by the extractor as unknown fields).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from connectors.simulator.tagtree import TagSpec, mix1

SLOT_MS = 30 * 60_000


@dataclass(frozen=True)
class AlarmSpec:
    path: str
    tag: str
    priority: int
    description: str
    salt: int


def build_alarms(tags: list[TagSpec], seed: int) -> list[AlarmSpec]:
    alarms = []
    for spec in tags:
        if spec.index % 5 != 0:
            continue
        alarms.append(
            AlarmSpec(
                path=f"/Alarms{spec.path} HI",
                tag=spec.path,
                priority=1 + spec.index % 4,
                description=f"{spec.name} above limit",
                salt=mix1(spec.index, seed * 31 + 11),
            )
        )
    return alarms


def _event(
    alarm: AlarmSpec, ts: int, status: int, node: str, ack: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "path": alarm.path,
        "description": alarm.description,
        "priority": alarm.priority,
        "remote": None,
        "online": 1,
        "status": status,
        "ts": ts,
        "value": status in (1, 3),
        "format": "%b",
        "type": "boolean",
        "ackInfo": ack,
        "origin": {"node": node, "source": alarm.tag},
    }


def slot_events(alarm: AlarmSpec, slot: int, node: str) -> list[dict[str, Any]]:
    h = mix1(slot, alarm.salt)
    if h % 3 != 0:
        return []
    base = slot * SLOT_MS
    active = base + (h >> 8) % (SLOT_MS // 3)
    clear = active + 60_000 + (h >> 24) % (SLOT_MS // 2)
    events = [_event(alarm, active, 3, node, None)]
    ack_user = {"ts": 0, "user": "operator", "msg": "seen"}
    if (h >> 40) % 2 == 0:
        ack_ts = active + (clear - active) // 2
        events.append(_event(alarm, ack_ts, 1, node, {**ack_user, "ts": ack_ts}))
        events.append(_event(alarm, clear, 0, node, {**ack_user, "ts": ack_ts}))
    else:
        events.append(_event(alarm, clear, 2, node, None))
        if (h >> 44) % 2 == 0:
            ack_ts = clear + 30_000
            events.append(_event(alarm, ack_ts, 0, node, {**ack_user, "ts": ack_ts}))
    return events


def events_between(
    alarm: AlarmSpec, start_ms: int, end_ms: int, node: str, history_start_ms: int
) -> list[dict[str, Any]]:
    """Events with start_ms <= ts <= end_ms (inclusive bounds, like raw history)."""
    first = max(start_ms, history_start_ms) // SLOT_MS
    last = end_ms // SLOT_MS
    out = []
    for slot in range(first, last + 1):
        for event in slot_events(alarm, slot, node):
            if max(start_ms, history_start_ms) <= event["ts"] <= end_ms:
                out.append(event)
    return out


@dataclass(frozen=True)
class AlarmQuery:
    path: str = "/"
    recurrent: bool = True
    regex: str | None = None
    status: int | None = None
    min_priority: int | None = None
    max_priority: int | None = None

    def matches(self, alarm: AlarmSpec) -> bool:
        prefix = self.path if self.path.endswith("/") else self.path + "/"
        if self.path not in ("/", "") and alarm.path != self.path:
            if not alarm.path.startswith(prefix):
                return False
            if not self.recurrent and "/" in alarm.path[len(prefix) :]:
                return False
        elif self.path in ("/", "") and not self.recurrent and alarm.path.count("/") > 1:
            return False
        if self.regex is not None and re.search(self.regex, alarm.path) is None:
            return False
        if self.min_priority is not None and alarm.priority < self.min_priority:
            return False
        return not (self.max_priority is not None and alarm.priority > self.max_priority)

    def event_matches(self, event: dict[str, Any]) -> bool:
        return self.status is None or event["status"] == self.status
