"""Simulated alarms: one per five tags, whose history follows hashed state changes.

Time is cut into 30-minute slots per alarm; in about one slot of three the alarm
activates (status 3), may be acknowledged while active (3 -> 1), clears (1 -> 0, or
3 -> 2) and may be acknowledged after clearing (2 -> 0). Every change is one history
event shaped like the alarm record, plus an `origin` object the spec does not show
(kept by the extractor as unknown fields). Acknowledgements through `alarm?cmd=ack` are
kept as events too, so they show in the state and in the history.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from connectors.options import AlarmFilter
from connectors.simulator.history import iso_of_ms
from connectors.simulator.protocol import (
    Answer,
    Handler,
    Params,
    RequestError,
    json_answer,
    parse_int,
    parse_list,
    parse_optional_bool,
    parse_regex,
    parse_time,
    required_str,
)
from connectors.simulator.tagtree import TagSpec, mix, mix1

if TYPE_CHECKING:
    from connectors.simulator.node import SimulatedNode

SLOT_MS = 30 * 60_000
ACKED = {3: 1, 2: 0}  # what `alarm?cmd=ack` makes of an unacknowledged status
# History events as positional arrays (the spec does not show `data` elements), per behaviour.
_FIELDS = ("value", "description", "ackInfo")
ARRAY_ORDERS = {
    "alarm_arrays": ("ts", "path", "status", "priority", *_FIELDS, "origin"),
    "alarm_arrays_swapped": ("ts", "path", "priority", "status", *_FIELDS, "origin"),
    "alarm_arrays_online": ("ts", "path", "online", "status", "priority", *_FIELDS),
}


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


def alarm_event(
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


def slot_events(
    alarm: AlarmSpec, slot: int, node: str, h: int | None = None
) -> list[dict[str, Any]]:
    """The events of one 30-minute slot (none in two slots of three); `h` its hash."""
    if h is None:
        h = mix1(slot, alarm.salt)
    if h % 3 != 0:
        return []
    base = slot * SLOT_MS
    active = base + (h >> 8) % (SLOT_MS // 3)
    clear = active + 60_000 + (h >> 24) % (SLOT_MS // 2)
    events = [alarm_event(alarm, active, 3, node, None)]
    ack_user = {"ts": 0, "user": "operator", "msg": "seen"}
    if (h >> 40) % 2 == 0:
        ack_ts = active + (clear - active) // 2
        events.append(alarm_event(alarm, ack_ts, 1, node, {**ack_user, "ts": ack_ts}))
        events.append(alarm_event(alarm, clear, 0, node, {**ack_user, "ts": ack_ts}))
    else:
        events.append(alarm_event(alarm, clear, 2, node, None))
        if (h >> 44) % 2 == 0:
            ack_ts = clear + 30_000
            events.append(alarm_event(alarm, ack_ts, 0, node, {**ack_user, "ts": ack_ts}))
    return events


def events_between(
    alarm: AlarmSpec, start_ms: int, end_ms: int, node: str, history_start_ms: int
) -> list[dict[str, Any]]:
    """Events with start_ms <= ts <= end_ms (inclusive bounds, like raw history)."""
    lower = max(start_ms, history_start_ms)
    if end_ms < lower:
        return []
    slots = np.arange(lower // SLOT_MS, end_ms // SLOT_MS + 1, dtype=np.int64)
    hashes = mix(slots, alarm.salt)
    busy = (hashes % np.uint64(3)) == 0
    out = []
    for slot, h in zip(slots[busy].tolist(), hashes[busy].tolist(), strict=True):
        for event in slot_events(alarm, slot, node, h):
            if lower <= event["ts"] <= end_ms:
                out.append(event)
    return out


@dataclass(frozen=True)
class AlarmQuery:
    """Which alarms (path, recurrent, regex, priorities) and events (status) to return."""

    path: str = "/"
    recurrent: bool = True
    pattern: re.Pattern[str] | None = None
    status: int | None = None
    min_priority: int | None = None
    max_priority: int | None = None

    @classmethod
    def of(cls, path: str, filt: AlarmFilter) -> AlarmQuery:
        """From the typed filter; `priority` is an alias of `minPriority` (spec: Versioning)."""
        return cls(
            path=path or "/",
            recurrent=True if filt.recurrent is None else filt.recurrent,
            pattern=re.compile(filt.path_regex) if filt.path_regex else None,
            status=filt.status,
            min_priority=filt.min_priority if filt.min_priority is not None else filt.priority,
            max_priority=filt.max_priority,
        )

    def matches(self, alarm: AlarmSpec) -> bool:
        if not _under(alarm.path, self.path, self.recurrent):
            return False
        if self.pattern is not None and self.pattern.search(alarm.path) is None:
            return False
        if self.min_priority is not None and alarm.priority < self.min_priority:
            return False
        return not (self.max_priority is not None and alarm.priority > self.max_priority)

    def event_matches(self, event: dict[str, Any]) -> bool:
        return self.status is None or event["status"] == self.status

    def echo(self, filt: AlarmFilter) -> dict[str, Any]:
        """`request.options` of the history answer (spec: Alarm history response)."""
        return {
            "recurrent": self.recurrent,
            "filter": {
                "path": filt.path_regex,
                "status": filt.status,
                "minPriority": self.min_priority,
                "maxPriority": self.max_priority,
            },
        }


def _under(path: str, root: str, recurrent: bool) -> bool:
    if root in ("", "/"):
        return recurrent or path.count("/") == 1
    if path == root:
        return True
    group = root if root.endswith("/") else root + "/"
    if not path.startswith(group):
        return False
    return recurrent or "/" not in path[len(group) :]


def alarm_in_seconds(event: dict[str, Any], *, to_ms: bool = False) -> dict[str, Any]:
    """An event stamped in whole epoch seconds (`epoch_seconds` behaviour): `ts` and the
    acknowledgement's `ts` in seconds, or (`to_ms`) those seconds as milliseconds."""
    scale = 1000 if to_ms else 1
    out = {**event, "ts": event["ts"] // 1000 * scale}
    ack = event.get("ackInfo")
    if isinstance(ack, dict) and isinstance(ack.get("ts"), int):
        out["ackInfo"] = {**ack, "ts": ack["ts"] // 1000 * scale}
    return out


def alarm_in_iso(event: dict[str, Any]) -> dict[str, Any]:
    """An event stamped in ISO 8601 text (`rows_iso` behaviour): `ts` and the
    acknowledgement's `ts`."""
    out = {**event, "ts": iso_of_ms(event["ts"])}
    ack = event.get("ackInfo")
    if isinstance(ack, dict) and isinstance(ack.get("ts"), int):
        out["ackInfo"] = {**ack, "ts": iso_of_ms(ack["ts"])}
    return out


def parse_alarm_query(
    params: Params, *, knows_min_max: bool = True
) -> tuple[str, AlarmFilter, AlarmQuery]:
    """`path` (mandatory, node-facts) and the `options.*` filters of alarm get/count/history.

    A node before 1.21.13 (`knows_min_max` False) ignores `minPriority` and `maxPriority`,
    as an older node ignores any parameter it does not know; `priority` is its minimum.
    """
    path = required_str(params, "path")
    parse_regex(params.get("options.filter.path"), "options.filter.path")
    min_max = ("options.filter.minPriority", "options.filter.maxPriority")
    if not knows_min_max:
        params = {key: value for key, value in params.items() if key not in min_max}
    try:
        filt = AlarmFilter(
            path_regex=params.get("options.filter.path") or None,
            status=parse_int(params.get("options.filter.status"), "options.filter.status"),
            priority=parse_int(params.get("options.filter.priority"), "options.filter.priority"),
            min_priority=parse_int(params.get(min_max[0]), min_max[0]),
            max_priority=parse_int(params.get(min_max[1]), min_max[1]),
            recurrent=parse_optional_bool(params.get("options.recurrent")),
        )
    except ValueError as exc:
        raise RequestError(400, str(exc)) from None
    return path, filt, AlarmQuery.of(path, filt)


class AlarmService:
    """The `alarm` resource: current states, counts, history and acknowledgement."""

    def __init__(self, node: SimulatedNode, alarms: list[AlarmSpec]) -> None:
        self._node = node
        self.alarms = alarms
        self.by_path = {alarm.path: alarm for alarm in alarms}
        self._lock = threading.Lock()
        self._ack_events: dict[str, list[dict[str, Any]]] = {}

    def handlers(self) -> dict[str, Handler]:
        return {
            "alarm.get": self.get,
            "alarm.count": self.count,
            "alarm.history": self.history,
            "alarm.ack": self.ack,
        }

    def events(
        self, query: AlarmQuery, start_ms: int, last_ms: int, node_name: str
    ) -> list[dict[str, Any]]:
        """History events with start_ms <= ts <= last_ms (and ts <= now), in ts order."""
        last_ms = min(last_ms, self._node.now_ms())
        history_start = self._node.config.history_start_ms
        out: list[dict[str, Any]] = []
        with self._lock:
            acks = {path: list(events) for path, events in self._ack_events.items()}
        for alarm in self.alarms:
            if not query.matches(alarm):
                continue
            found = events_between(alarm, start_ms, last_ms, node_name, history_start)
            found += [e for e in acks.get(alarm.path, ()) if start_ms <= e["ts"] <= last_ms]
            out.extend(e for e in found if query.event_matches(e))
        out.sort(key=lambda e: (e["ts"], e["path"], e["status"]))
        return out

    def state(self, alarm: AlarmSpec) -> dict[str, Any]:
        """The alarm record now: its latest event (hashed or acknowledged), without origin."""
        now = self._node.now_ms()
        node_name = self._node.config.node_name
        slot = now // SLOT_MS
        current: dict[str, Any] | None = None
        for back in range(48):
            visible = [e for e in slot_events(alarm, slot - back, node_name) if e["ts"] <= now]
            if visible:
                current = visible[-1]
                break
        with self._lock:
            acked = [e for e in self._ack_events.get(alarm.path, ()) if e["ts"] <= now]
        if acked and (current is None or acked[-1]["ts"] >= current["ts"]):
            current = acked[-1]
        if current is None:
            current = alarm_event(alarm, (slot - 48) * SLOT_MS, 0, node_name, None)
        record = dict(current)
        record.pop("origin", None)
        return record

    def _query(self, params: Params) -> tuple[str, AlarmFilter, AlarmQuery]:
        old = self._node.behaves("version_1_21_5") or self._node.behaves("version_1_21_12")
        return parse_alarm_query(params, knows_min_max=not old)

    def get(self, params: Params) -> Answer:
        _, _, query = self._query(params)
        states = [self.state(alarm) for alarm in self.alarms if query.matches(alarm)]
        return json_answer([s for s in states if query.event_matches(s)])

    def count(self, params: Params) -> Answer:
        _, _, query = self._query(params)
        states = [self.state(alarm) for alarm in self.alarms if query.matches(alarm)]
        return Answer(body=str(sum(query.event_matches(s) for s in states)).encode())

    def history(self, params: Params) -> Answer:
        """Inclusive at both ends (like raw history), never past now."""
        path, filt, query = self._query(params)
        tree = self._node.tree(params.get("options.remoteNode"))
        seconds = self._node.behaves("epoch_seconds")
        start = parse_time(params.get("start"), "start", seconds=seconds)
        end = parse_time(params.get("end"), "end", seconds=seconds)
        if end < start:
            raise RequestError(400, "end is before start")
        events = self.events(query, start, end, tree.node_name)
        if seconds:
            events = [alarm_in_seconds(event) for event in events]
        elif self._node.behaves("rows_iso"):
            events = [alarm_in_iso(event) for event in events]
        request = {"path": path, "start": start, "end": end, "options": query.echo(filt)}
        return json_answer({"request": request, "data": self._shaped(events)})

    def _shaped(self, events: list[dict[str, Any]]) -> list[Any]:
        """Events as objects, or as arrays in the order of this node's `alarm_arrays*`."""
        for behaviour, order in ARRAY_ORDERS.items():
            if self._node.behaves(behaviour):
                return [[event.get(name) for name in order] for event in events]
        return events

    def ack(self, body: Params) -> Answer:
        """3 (active, unacked) -> 1 and 2 (cleared, unacked) -> 0; others are unchanged."""
        paths = parse_list(body.get("paths"))
        if not paths:
            raise RequestError(400, "paths is required")
        for path in paths:
            if path not in self.by_path:
                raise RequestError(404, f"alarm {path!r} not found")
        msg = body.get("msg")
        now = self._node.now_ms()
        info = {"ts": now, "user": "api", "msg": msg if isinstance(msg, str) else ""}
        for path in dict.fromkeys(paths):
            alarm = self.by_path[path]
            status = self.state(alarm)["status"]
            if status not in ACKED:
                continue
            event = alarm_event(alarm, now, ACKED[status], self._node.config.node_name, info)
            with self._lock:
                self._ack_events.setdefault(path, []).append(event)
        return Answer()
