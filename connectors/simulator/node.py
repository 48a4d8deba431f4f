"""The simulated node: state and every operation of the interface, independent of HTTP.

`SimulatedNode.handle(method, resource, cmd, params, body)` answers one request as an
`Answer`; `server.py` puts it on the wire. Choices where the spec is silent are listed in
docs/node-behaviour.md.
"""

from __future__ import annotations

import base64
import io
import os
import re
import threading
import time
import zipfile
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from connectors.options import AlarmFilter, HistoryOptions
from connectors.simulator import alarms as alarm_model
from connectors.simulator import history
from connectors.simulator.config import SimConfig
from connectors.simulator.faults import Faults
from connectors.simulator.tagtree import TagSpec, build_tags

REMOTE_NODES = ("sim-remote",)
EVENT_QUEUE = 10_000


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def _json(value: Any) -> Answer:
    return Answer(body=orjson.dumps(value))


def _iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{ms % 1000:03d}Z"
    )


def parse_time(value: str | None, name: str) -> int:
    if value is None or value == "":
        raise RequestError(400, f"{name} is required")
    text = value.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise RequestError(400, f"{name} {value!r} is not ISO 8601 or epoch ms") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def parse_list(value: Any) -> list[str]:
    """A list parameter: JSON array, comma-separated string, or a single value."""
    if value is None:
        return []
    if isinstance(value, list):
        return [str(item) for item in value]
    text = str(value)
    if text.startswith("["):
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise RequestError(400, "list parameter is not a valid JSON array") from None
        if not isinstance(parsed, list):
            raise RequestError(400, "list parameter is not an array")
        return [str(item) for item in parsed]
    return [part for part in text.split(",") if part != ""]


def parse_bool(value: Any, default: bool | None = None) -> bool | None:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise RequestError(400, f"{value!r} is not a boolean")


def parse_int(value: Any, name: str, default: int | None = None) -> int | None:
    if value is None or value == "":
        return default
    try:
        return int(str(value))
    except ValueError:
        raise RequestError(400, f"{name} {value!r} is not an integer") from None


class SimulatedNode:
    """A deterministic node: tags, history, alarms, and the admin resources, in memory."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self._lock = threading.RLock()
        self._specs = build_tags(self.config.seed, self.config.tags, self.config.hostile_names)
        self._by_path = {spec.path: spec for spec in self._specs}
        self._remote: dict[str, list[TagSpec]] = {
            name: build_tags(self.config.seed + 1000 + i, self.config.tags, False)
            for i, name in enumerate(REMOTE_NODES)
        }
        self._alarms = alarm_model.build_alarms(self._specs, self.config.seed)
        self._alarm_by_path = {alarm.path: alarm for alarm in self._alarms}
        self._clock_ms: int | None = None
        self._late: dict[str, list[tuple[int, Any, int]]] = {}
        self._written: dict[str, tuple[Any, int]] = {}
        self._acks: dict[str, tuple[int, dict[str, Any]]] = {}
        self.faults = Faults()
        self.requests_served = 0
        self._cache: dict[str, Answer] = {}
        self._started = time.time()
        self._pid = os.getpid() % 30000 + 1000
        self._restarting_until = 0.0
        self._subscriptions: dict[int, dict[str, Any]] = {}
        self._next_subscription = 1
        self._init_admin()

    # -- public helpers (tests, ground truth) ---------------------------------------------

    def tag_paths(self) -> list[str]:
        return [spec.path for spec in self._specs]

    def tag_type(self, path: str) -> str:
        return self._by_path[path].type

    def set_clock(self, now_ms: int | None) -> None:
        with self._lock:
            self._clock_ms = now_ms
            self._cache.clear()

    def now_ms(self) -> int:
        return self._clock_ms if self._clock_ms is not None else int(time.time() * 1000)

    def alarm_paths(self) -> list[str]:
        return [alarm.path for alarm in self._alarms]

    def add_late_sample(self, path: str, ts_ms: int, value: Any) -> None:
        """A store-and-forward sample stamped in the past that is visible from now on."""
        with self._lock:
            self._late.setdefault(path, []).append((ts_ms, value, self.now_ms()))
            self._cache.clear()

    def _samples(self, spec: TagSpec, start_ms: int, end_ms: int) -> history.Samples:
        return history.generate(
            spec,
            start_ms,
            end_ms,
            history_start_ms=self.config.history_start_ms,
            visible_until_ms=self.now_ms(),
            late=self._late.get(spec.path, ()),
        )

    def _rows(
        self, spec: TagSpec, start_ms: int, end_ms: int, options: HistoryOptions, *, cap: bool
    ) -> list[tuple[Any, ...]]:
        mode = options.mode
        if mode == "raw":
            samples = self._samples(spec, start_ms, end_ms)
            limit = options.limit
            if cap:
                limit = min(limit or self.config.raw_cap, self.config.raw_cap)
            invalid_as_null = True if options.invalid_as_null is None else options.invalid_as_null
            return history.raw_rows(samples, invalid_as_null=invalid_as_null, limit=limit)
        deadband = float(options.deadband) if options.deadband is not None else spec.deadband
        if mode == "delta":
            return history.delta_rows(self._samples(spec, start_ms, end_ms), deadband)
        if mode == "filter":
            return history.filter_rows(self._samples(spec, start_ms, end_ms), deadband)
        interval = options.interval_ms or 60_000
        method = options.method or spec.default_method
        samples = self._samples(spec, start_ms, end_ms + interval)
        return history.aggregated_rows(samples, start_ms, end_ms, interval, method, spec.type)

    def ground_truth(
        self, path: str, start_ms: int, end_ms: int, options: HistoryOptions
    ) -> list[list[Any]]:
        """Exactly the rows the node holds for [start_ms, end_ms), uncapped."""
        spec = self._by_path[path]
        rows = self._rows(spec, start_ms, end_ms, options, cap=False)
        if options.mode == "aggregated":
            return [list(row) for row in rows]
        if options.mode == "raw" and options.limit is not None:
            rows = self._rows(
                spec,
                start_ms,
                end_ms,
                HistoryOptions(mode="raw", invalid_as_null=options.invalid_as_null),
                cap=False,
            )
        return [list(row) for row in rows if row[0] < end_ms]

    def alarm_ground_truth(
        self, start_ms: int, end_ms: int, filt: AlarmFilter | None = None, path: str = "/"
    ) -> list[dict[str, Any]]:
        query = self._alarm_query(path, filt or AlarmFilter())
        events = self._alarm_events(query, start_ms, end_ms - 1, self.config.node_name)
        return events

    # -- request dispatch ------------------------------------------------------------------

    def handle(
        self, method: str, resource: str, cmd: str, params: Mapping[str, Any], body: Any
    ) -> Answer:
        with self._lock:
            self.requests_served += 1
        if time.time() < self._restarting_until:
            return Answer(503, orjson.dumps({"error": "service restarting"}))
        key = f"{resource}.{cmd}"
        handler = self._handlers().get(key)
        if handler is None:
            return Answer(
                400 if resource in _RESOURCES else 404,
                orjson.dumps({"error": f"unknown command {cmd!r} for {resource}"}),
            )
        expected = "POST" if key in _POSTS else "GET"
        if method != expected:
            return Answer(405, orjson.dumps({"error": f"{key} needs {expected}"}))
        source = body if expected == "POST" else params
        if expected == "POST" and body is not None and not isinstance(body, dict):
            return Answer(400, orjson.dumps({"error": "body is not a JSON object"}))
        try:
            return handler(source or {})
        except RequestError as exc:
            return Answer(exc.status, orjson.dumps({"error": str(exc)}))

    def cached(self, query: str, produce: Callable[[], Answer]) -> Answer:
        """Replay mode: a history answer rendered once per query string."""
        if not self.config.cache_answers:
            return produce()
        answer = self._cache.get(query)
        if answer is None:
            answer = produce()
            if answer.status == 200:
                self._cache[query] = answer
        return answer

    def _handlers(self) -> dict[str, Callable[[Mapping[str, Any]], Answer]]:
        return {
            "alarm.get": self._alarm_get,
            "alarm.count": self._alarm_count,
            "alarm.history": self._alarm_history,
            "alarm.ack": self._alarm_ack,
            "backup.get": self._backup_get,
            "backup.export": self._backup_export,
            "backup.create": self._backup_create,
            "backup.rename": self._backup_rename,
            "backup.delete": self._backup_delete,
            "backup.import": self._backup_import,
            "backup.load": self._backup_load,
            "certificate.get": self._cert_get,
            "certificate.export": self._cert_export,
            "certificate.set": self._cert_set,
            "certificate.remove": self._cert_remove,
            "module.details": self._module_details,
            "module.getInstalled": lambda p: _json(
                sorted({m["type"] for m in self._modules.values()})
            ),
            "module.getInstances": self._module_instances,
            "module.getConfigList": self._module_config_list,
            "module.getConfigPresent": self._module_config_present,
            "module.getConfigData": self._module_config_data,
            "module.start": lambda p: self._module_run(p, "start"),
            "module.stop": lambda p: self._module_run(p, "stop"),
            "module.restart": lambda p: self._module_run(p, "restart"),
            "module.setConfigData": self._module_set_config,
            "link.get": self._link_get,
            "license.getUid": lambda p: _json({"host": "sim-host", "uid": self._uid}),
            "license.get": lambda p: _json(list(self._licenses.values())),
            "license.read": self._license_read,
            "license.add": self._license_add,
            "license.remove": self._license_remove,
            "log.browse": self._log_browse,
            "log.export": self._log_export,
            "redundancy.status": lambda p: _json(
                {"enabled": False, "standby": False, "mode": "primary"}
            ),
            "system.status": self._system_status,
            "system.errorCount": lambda p: Answer(body=b"0"),
            "system.restartService": self._restart_service,
            "tag.browse": self._tag_browse,
            "tag.read": self._tag_read,
            "tag.details": self._tag_details,
            "tag.history": self._tag_history,
            "tag.historyMany": self._tag_history_many,
            "tag.historyFilter": self._tag_history_filter,
            "tag.getViews": lambda p: _json(["default", "operations", "maintenance"]),
            "tag.write": self._tag_write,
            "tag.writeMany": self._tag_write_many,
            "tag.subscribe": self._subscribe,
            "tag.subscriptions": self._subscriptions_list,
            "tag.subscriptionEvents": self._subscription_events,
            "tag.cancelSubscription": self._cancel_subscription,
        }

    # -- tags --------------------------------------------------------------------------------

    def _specs_for(self, remote: Any) -> tuple[list[TagSpec], dict[str, TagSpec], str]:
        names = parse_list(remote) if remote else []
        if not names:
            return self._specs, self._by_path, self.config.node_name
        if "/" in names[0] and not names[0].startswith("["):
            names = [part for part in names[0].split("/") if part]
        name = names[-1]
        if name not in self._remote:
            raise RequestError(404, f"unknown remote node {name!r}")
        specs = self._remote[name]
        return specs, {s.path: s for s in specs}, name

    def _options(self, params: Mapping[str, Any]) -> HistoryOptions:
        mode = params.get("options.mode") or "delta"
        if mode not in ("raw", "filter", "delta", "aggregated"):
            raise RequestError(
                400, f"options.mode {mode!r} is not raw, filter, delta or aggregated"
            )
        method = params.get("options.method") or None
        if method is not None and method not in (
            "first",
            "last",
            "min",
            "max",
            "avg",
            "delta",
            "stddev",
        ):
            raise RequestError(400, f"options.method {method!r} is unknown")
        interval = parse_int(params.get("options.interval"), "options.interval")
        if mode == "aggregated" and (interval is None or interval <= 0):
            interval = 60_000
        limit = parse_int(params.get("options.limit"), "options.limit")
        deadband = params.get("options.deadband")
        if deadband not in (None, ""):
            try:
                deadband = float(str(deadband).rstrip("u"))
            except ValueError:
                raise RequestError(400, f"options.deadband {deadband!r} is not a number") from None
        else:
            deadband = None
        return HistoryOptions(
            mode=mode,
            method=method,
            interval_ms=interval if mode == "aggregated" else None,
            deadband=deadband,
            invalid_as_null=parse_bool(params.get("options.invalidAsNull")),
            limit=limit if limit and limit > 0 else None,
        )

    def _request_echo(
        self,
        tag: str | None,
        start: int,
        end: int,
        options: HistoryOptions,
        extra: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        echo: dict[str, Any] = {
            "mode": options.mode,
            "method": options.method or "",
            "interval": options.interval_ms,
            "deadband": options.deadband,
            "invalidAsNull": True if options.invalid_as_null is None else options.invalid_as_null,
            "limit": options.limit,
        }
        echo.update(extra or {})
        request: dict[str, Any] = {"start": start, "end": end, "options": echo, "data": None}
        if tag is not None:
            request = {"tag": tag, **request}
        return request

    def _history_body(
        self,
        specs: list[TagSpec],
        start: int,
        end: int,
        options: HistoryOptions,
        extra: Mapping[str, Any] | None = None,
    ) -> bytes:
        answer: dict[str, Any] = {}
        if end < start:
            raise RequestError(400, "end is before start")
        for spec in specs:
            rows = self._rows(spec, start, end, options, cap=True)
            answer[spec.path] = {
                "request": self._request_echo(spec.path, start, end, options, extra),
                "data": rows,
            }
        return orjson.dumps(answer)

    def _tag_history(self, params: Mapping[str, Any]) -> Answer:
        path = params.get("path")
        if not path:
            raise RequestError(400, "path is required")
        _, by_path, _ = self._specs_for(params.get("options.remoteNode"))
        spec = by_path.get(path)
        if spec is None:
            raise RequestError(404, f"tag {path!r} not found")
        start = parse_time(params.get("start"), "start")
        end = parse_time(params.get("end"), "end")
        options = self._options(params)
        rows = self._rows(spec, start, end, options, cap=True)
        return _json({"request": self._request_echo(path, start, end, options), "data": rows})

    def _tag_history_many(self, params: Mapping[str, Any]) -> Answer:
        paths = parse_list(params.get("paths"))
        if not paths:
            raise RequestError(400, "paths is required")
        _, by_path, _ = self._specs_for(params.get("options.remoteNode"))
        start = parse_time(params.get("start"), "start")
        end = parse_time(params.get("end"), "end")
        options = self._options(params)
        # Unknown tags are left out of the answer (documented choice), not an error.
        specs = [by_path[p] for p in dict.fromkeys(paths) if p in by_path]
        return Answer(body=self._history_body(specs, start, end, options))

    def _select(
        self, specs: list[TagSpec], roots: list[str], regex: str | None, recurrent: bool
    ) -> list[TagSpec]:
        pattern = re.compile(regex) if regex else None
        chosen: dict[str, TagSpec] = {}
        for root in roots or ["/"]:
            group = root if root.endswith("/") else root + "/"
            for spec in specs:
                if spec.path == root:
                    ok = True
                elif spec.path.startswith(group):
                    ok = recurrent or "/" not in spec.path[len(group) :]
                else:
                    ok = False
                if ok and (pattern is None or pattern.search(spec.path)):
                    chosen[spec.path] = spec
        return list(chosen.values())

    def _regex(self, params: Mapping[str, Any]) -> str | None:
        regex = params.get("options.filter") or None
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as exc:
                raise RequestError(400, f"options.filter is not a valid regex: {exc}") from None
        return regex

    def _tag_history_filter(self, params: Mapping[str, Any]) -> Answer:
        # Both spellings are honoured: the union of `path` and `paths` (documented choice).
        roots = list(
            dict.fromkeys(parse_list(params.get("path")) + parse_list(params.get("paths")))
        )
        if not roots:
            raise RequestError(400, "path is required")
        specs, _, _ = self._specs_for(params.get("options.remoteNode"))
        start = parse_time(params.get("start"), "start")
        end = parse_time(params.get("end"), "end")
        options = self._options(params)
        recurrent = bool(parse_bool(params.get("options.recurrent"), False))
        chosen = self._select(specs, roots, self._regex(params), recurrent)
        return Answer(
            body=self._history_body(chosen, start, end, options, {"recurrent": recurrent})
        )

    def _current(self, spec: TagSpec) -> tuple[Any, int, int]:
        written = self._written.get(spec.path)
        if written is not None:
            return written[0], 192, written[1]
        now = self.now_ms()
        samples = self._samples(spec, now - 3_600_000, now)
        if not len(samples):
            return None, 0, now
        return samples.values[-1], int(samples.quality[-1]), int(samples.ts[-1])

    def _tag_entry(self, spec: TagSpec, *, details: bool, with_id: bool = True) -> dict[str, Any]:
        value, quality, ts = self._current(spec)
        entry: dict[str, Any] = {
            "status": {"value": 1, "ts": ts},
            "data": {"value": value, "quality": quality, "ts": ts},
        }
        if not details:
            return entry
        config = {
            "description": f"{spec.name} (simulated)",
            "type": spec.type,
            "numberType": "float64" if spec.type == "number" else None,
            "format": "%.1f" if spec.type == "number" else None,
            "deadband": f"{spec.deadband}u",
            "clientAccess": "RW",
            "engUnits": spec.units,
            "default": None,
            "simulation": {"enabled": True},
            "persistency": 0,
            "views": ["default"],
            "security": {},
            "extensions": {
                "history": {
                    "enabled": True,
                    "module": "Historian",
                    "config": {
                        "mode": "raw",
                        "deadband": f"{spec.deadband}u",
                        "rangeY": [0, 250],
                        "interpolation": "linear",
                        "defaultMethod": spec.default_method,
                        "rate": [spec.period_ms, 0],
                    },
                },
                "ae": {"alarms": {}},
            },
        }
        full = {"fullPath": spec.path, "remote": None, **entry, "config": config}
        if with_id:
            full = {"id": spec.index + 1, **full}
        return full

    def _tag_browse(self, params: Mapping[str, Any]) -> Answer:
        path = params.get("path") or "/"
        recurrent = bool(parse_bool(params.get("options.recurrent"), False))
        flat = bool(parse_bool(params.get("options.flat"), False))
        hide_tags = bool(parse_bool(params.get("options.hideTags"), False))
        hide_groups = bool(parse_bool(params.get("options.hideGroups"), False))
        regex = self._regex(params)
        chosen = self._select(self._specs, [path], regex, True)
        group = path if path.endswith("/") else path + "/"
        if flat:
            items: list[str] = []
            if not hide_tags:
                items.extend(
                    spec.path for spec in chosen if recurrent or "/" not in spec.path[len(group) :]
                )
            if not hide_groups:
                groups = sorted(
                    {
                        spec.path[: len(group) + spec.path[len(group) :].index("/") + 1]
                        for spec in chosen
                        if "/" in spec.path[len(group) :]
                    }
                )
                items.extend(groups)
            return _json(items)
        tree: dict[str, Any] = {"groups": {}, "tags": {}}
        for spec in chosen:
            rest = spec.path[len(group) :].split("/")
            node = tree
            for name in rest[:-1]:
                node = node["groups"].setdefault(name, {"groups": {}, "tags": {}})
                if not recurrent:
                    break
            else:
                if not hide_tags:
                    node["tags"][rest[-1]] = {"fullPath": spec.path, "type": spec.type}
        if hide_groups:
            tree["groups"] = {}
        return _json(tree)

    def _tags_for_read(self, params: Mapping[str, Any]) -> list[TagSpec]:
        path = params.get("path")
        if not path:
            raise RequestError(400, "path is required")
        recurrent = bool(parse_bool(params.get("options.recurrent"), False))
        regex = self._regex(params)
        if path in self._by_path:
            return [self._by_path[path]]
        root = path[:-1] if path.endswith("/*") else path
        chosen = self._select(self._specs, [root], regex, recurrent)
        if not chosen:
            raise RequestError(404, f"no tag at {path!r}")
        return chosen

    def _tag_read(self, params: Mapping[str, Any]) -> Answer:
        specs = self._tags_for_read(params)
        return _json({"tags": {spec.name: self._tag_entry(spec, details=False) for spec in specs}})

    def _tag_details(self, params: Mapping[str, Any]) -> Answer:
        specs = self._tags_for_read(params)
        return _json(
            {
                "description": "simulated group",
                "_templates": [],
                "tags": {spec.name: self._tag_entry(spec, details=True) for spec in specs},
            }
        )

    def _check_write(self, path: str, value: Any) -> TagSpec:
        spec = self._by_path.get(path)
        if spec is None:
            raise RequestError(404, f"tag {path!r} not found")
        kinds = {"number": (int, float), "boolean": (bool,), "string": (str,)}[spec.type]
        if (isinstance(value, bool) and spec.type != "boolean") or not isinstance(value, kinds):
            raise RequestError(400, f"value {value!r} does not match type {spec.type} of {path!r}")
        return spec

    def _apply_write(self, spec: TagSpec, value: Any) -> None:
        ts = self.now_ms()
        self._written[spec.path] = (value, ts)
        event = {
            "type": "tag",
            "tag": spec.path,
            "data": {"value": value, "quality": 192, "ts": ts},
            "status": None,
        }
        self._publish(event)

    def _tag_write(self, body: Mapping[str, Any]) -> Answer:
        path = body.get("path")
        if not isinstance(path, str) or "value" not in body:
            raise RequestError(400, "path and value are required")
        with self._lock:
            self._apply_write(self._check_write(path, body["value"]), body["value"])
        return Answer()

    def _tag_write_many(self, body: Mapping[str, Any]) -> Answer:
        raw_paths = body.get("paths")
        values = body.get("values")
        paths = raw_paths if isinstance(raw_paths, list) else str(raw_paths or "").split(",")
        paths = [p for p in paths if p]
        if not paths or not isinstance(values, list) or len(values) != len(paths):
            raise RequestError(400, "paths and values (same length) are required")
        with self._lock:
            specs = [self._check_write(p, v) for p, v in zip(paths, values, strict=True)]
            for spec, value in zip(specs, values, strict=True):
                self._apply_write(spec, value)
        return Answer()

    # -- subscriptions ----------------------------------------------------------------------

    def _model(self) -> dict[str, Any]:
        return {
            "description": "simulated node",
            "tags": {
                spec.name: self._tag_entry(spec, details=True, with_id=False)
                for spec in self._specs[:50]
            },
        }

    def _publish(self, event: dict[str, Any]) -> None:
        for subscription in self._subscriptions.values():
            queue: deque[dict[str, Any]] = subscription["queue"]
            if len(queue) >= EVENT_QUEUE:
                queue.popleft()
                subscription["discarded"] += 1
            queue.append(event)

    def _subscribe(self, body: Mapping[str, Any]) -> Answer:
        with self._lock:
            sid = self._next_subscription
            self._next_subscription += 1
            self._subscriptions[sid] = {"data": body.get("data"), "queue": deque(), "discarded": 0}
            return _json({"id": sid, "model": self._model()})

    def _subscriptions_list(self, params: Mapping[str, Any]) -> Answer:
        with self._lock:
            return _json(
                [
                    {
                        "id": sid,
                        "data": s["data"],
                        "discardedEvents": s["discarded"],
                        "events": len(s["queue"]),
                    }
                    for sid, s in self._subscriptions.items()
                ]
            )

    def _subscription(self, value: Any) -> dict[str, Any]:
        sid = parse_int(value, "id")
        if sid is None:
            raise RequestError(400, "id is required")
        subscription = self._subscriptions.get(sid)
        if subscription is None:
            raise RequestError(404, f"no subscription {sid}")
        return subscription

    def _subscription_events(self, params: Mapping[str, Any]) -> Answer:
        with self._lock:
            subscription = self._subscription(params.get("id"))
            limit = parse_int(params.get("limit"), "limit")
            queue: deque[dict[str, Any]] = subscription["queue"]
            count = len(queue) if limit is None else min(limit, len(queue))
            events = [queue.popleft() for _ in range(count)]
            discarded = subscription["discarded"]
            subscription["discarded"] = 0
            return _json(
                {"discardedEvents": discarded, "remainingEvents": len(queue), "events": events}
            )

    def _cancel_subscription(self, body: Mapping[str, Any]) -> Answer:
        with self._lock:
            self._subscription(body.get("id"))
            del self._subscriptions[int(body["id"])]
        return Answer()

    # -- alarms ------------------------------------------------------------------------------

    def _alarm_query(self, path: str, filt: AlarmFilter) -> alarm_model.AlarmQuery:
        return alarm_model.AlarmQuery(
            path=path or "/",
            recurrent=True if filt.recurrent is None else filt.recurrent,
            regex=filt.path_regex,
            status=filt.status,
            min_priority=filt.min_priority if filt.min_priority is not None else filt.priority,
            max_priority=filt.max_priority,
        )

    def _alarm_filter(self, params: Mapping[str, Any]) -> tuple[str, AlarmFilter]:
        path = params.get("path")
        if not path:
            raise RequestError(400, "path is required")
        regex = params.get("options.filter.path") or None
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as exc:
                raise RequestError(
                    400, f"options.filter.path is not a valid regex: {exc}"
                ) from None
        try:
            filt = AlarmFilter(
                path_regex=regex,
                status=parse_int(params.get("options.filter.status"), "status"),
                priority=parse_int(params.get("options.filter.priority"), "priority"),
                min_priority=parse_int(params.get("options.filter.minPriority"), "minPriority"),
                max_priority=parse_int(params.get("options.filter.maxPriority"), "maxPriority"),
                recurrent=parse_bool(params.get("options.recurrent")),
            )
        except ValueError as exc:
            raise RequestError(400, str(exc)) from None
        return path, filt

    def _alarm_events(
        self, query: alarm_model.AlarmQuery, start: int, end: int, node: str
    ) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for alarm in self._alarms:
            if not query.matches(alarm):
                continue
            for event in alarm_model.events_between(
                alarm, start, end, node, self.config.history_start_ms
            ):
                if query.event_matches(event):
                    events.append(event)
        events.sort(key=lambda e: (e["ts"], e["path"]))
        return events

    def _alarm_history(self, params: Mapping[str, Any]) -> Answer:
        path, filt = self._alarm_filter(params)
        _, _, node = self._specs_for(params.get("options.remoteNode"))
        start = parse_time(params.get("start"), "start")
        end = parse_time(params.get("end"), "end")
        query = self._alarm_query(path, filt)
        events = self._alarm_events(query, start, min(end, self.now_ms()), node)
        request = {
            "path": path,
            "start": start,
            "end": end,
            "options": {
                "recurrent": query.recurrent,
                "filter": {
                    "path": filt.path_regex,
                    "status": filt.status,
                    "minPriority": query.min_priority,
                    "maxPriority": filt.max_priority,
                },
            },
        }
        return _json({"request": request, "data": events})

    def _alarm_state(self, alarm: alarm_model.AlarmSpec) -> dict[str, Any]:
        now = self.now_ms()
        slot = now // alarm_model.SLOT_MS
        current: dict[str, Any] | None = None
        for back in range(0, 48):
            events = [
                e
                for e in alarm_model.slot_events(alarm, slot - back, self.config.node_name)
                if e["ts"] <= now
            ]
            if events:
                current = dict(events[-1])
                break
        if current is None:
            current = alarm_model._event(alarm, now - 86_400_000, 0, self.config.node_name, None)
        ack = self._acks.get(alarm.path)
        if ack is not None and ack[0] >= current["ts"]:
            current["status"] = {3: 1, 2: 0}.get(current["status"], current["status"])
            current["ackInfo"] = ack[1]
        current.pop("origin", None)
        return current

    def _alarm_get(self, params: Mapping[str, Any]) -> Answer:
        path, filt = self._alarm_filter(params)
        query = self._alarm_query(path, filt)
        states = [self._alarm_state(a) for a in self._alarms if query.matches(a)]
        return _json([s for s in states if query.event_matches(s)])

    def _alarm_count(self, params: Mapping[str, Any]) -> Answer:
        answer = self._alarm_get(params)
        return Answer(body=str(len(orjson.loads(answer.body))).encode())

    def _alarm_ack(self, body: Mapping[str, Any]) -> Answer:
        paths = parse_list(body.get("paths"))
        if not paths:
            raise RequestError(400, "paths is required")
        unknown = [p for p in paths if p not in self._alarm_by_path]
        if unknown:
            raise RequestError(404, f"alarm {unknown[0]!r} not found")
        now = self.now_ms()
        msg = body.get("msg")
        with self._lock:
            for path in paths:
                self._acks[path] = (now, {"ts": now, "user": "api", "msg": msg or ""})
        return Answer()

    # -- admin resources ----------------------------------------------------------------------

    def _init_admin(self) -> None:
        now = self.now_ms()
        self._uid = f"SIM-{self.config.seed:04d}-UID"
        self._backups: dict[str, dict[str, Any]] = {}
        self._modules: dict[str, dict[str, Any]] = {}
        for name, kind in (
            ("Historian", "Historian"),
            ("RestApiServer", "RestApiServer"),
            ("ModbusClient", "ModbusClient"),
            ("Logger", "Logger"),
        ):
            self._modules[name] = {
                "type": kind,
                "running": True,
                "pid": 2000 + len(self._modules),
                "lastStart": _iso(now - 3_600_000),
                "lastStop": _iso(now - 7_200_000),
                "configs": {"logger": orjson.dumps(_config_doc("logger")).decode()},
            }
        self._certificates: dict[str, dict[str, Any]] = {}
        for cid, status, ctype in (
            ("own/node", "own", "inbound"),
            ("trusted/scada", "trusted", "outbound"),
            ("pending/client-7", "pending", "inbound"),
        ):
            self._certificates[cid] = {
                "id": cid,
                "sn": cid.split("/")[1],
                "c": "ES",
                "o": "Sim",
                "dn": "localhost",
                "from": now - 86_400_000,
                "to": now + 365 * 86_400_000,
                "type": ctype,
                "status": status,
            }
        self._licenses: dict[str, dict[str, Any]] = {}
        self._license_files: dict[str, str] = {}
        self._logs = {
            "Historian": [["2026-11-20", 10240], ["2026-11-21", 8192]],
            "RestApiServer": [["2026-11-21", 4096]],
        }

    def _backup_get(self, params: Mapping[str, Any]) -> Answer:
        return _json(
            {
                name: {k: v for k, v in b.items() if k != "content"}
                for name, b in self._backups.items()
            }
        )

    def _named(self, source: Mapping[str, Any], table: Mapping[str, Any], what: str) -> str:
        name = source.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(400, "name is required")
        if name not in table:
            raise RequestError(404, f"{what} {name!r} not found")
        return name

    def _snapshot(self) -> bytes:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr(
                "config.json",
                orjson.dumps(
                    {
                        "node": self.config.node_name,
                        "written": {k: v[0] for k, v in self._written.items()},
                        "modules": sorted(self._modules),
                    }
                ),
            )
        return buffer.getvalue()

    def _backup_create(self, body: Mapping[str, Any]) -> Answer:
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(400, "name is required")
        metadata = body.get("metadata") or {}
        with self._lock:
            self._backups[name] = {
                "description": (metadata.get("description") if isinstance(metadata, dict) else None)
                or "",
                "user": "api",
                "node": self.config.node_name,
                "ts": _iso(self.now_ms()),
                "versions": {"exe": "1.21.13", "bootstrap": "1.21.13"},
                "content": self._snapshot(),
            }
        return Answer()

    def _backup_rename(self, body: Mapping[str, Any]) -> Answer:
        with self._lock:
            name = self._named(body, self._backups, "backup")
            new = body.get("rename")
            if not isinstance(new, str) or not new:
                raise RequestError(400, "rename is required")
            if new in self._backups:
                raise RequestError(400, f"backup {new!r} exists")
            self._backups[new] = self._backups.pop(name)
        return Answer()

    def _backup_delete(self, body: Mapping[str, Any]) -> Answer:
        with self._lock:
            del self._backups[self._named(body, self._backups, "backup")]
        return Answer()

    def _backup_export(self, params: Mapping[str, Any]) -> Answer:
        name = self._named(params, self._backups, "backup")
        return Answer(
            body=base64.b64encode(self._backups[name]["content"]), content_type="text/plain"
        )

    def _backup_import(self, body: Mapping[str, Any]) -> Answer:
        name = body.get("name")
        data = body.get("data")
        if not isinstance(name, str) or not name or not isinstance(data, str):
            raise RequestError(400, "name and data are required")
        try:
            content = base64.b64decode(data, validate=True)
            zipfile.ZipFile(io.BytesIO(content)).testzip()
        except (ValueError, zipfile.BadZipFile):
            raise RequestError(400, "data is not a Base64 ZIP backup") from None
        with self._lock:
            self._backups[name] = {
                "description": "imported",
                "user": "api",
                "node": self.config.node_name,
                "ts": _iso(self.now_ms()),
                "versions": {"exe": "1.21.13", "bootstrap": "1.21.13"},
                "content": content,
            }
        return Answer()

    def _backup_load(self, body: Mapping[str, Any]) -> Answer:
        with self._lock:
            name = self._named(body, self._backups, "backup")
            document = orjson.loads(
                zipfile.ZipFile(io.BytesIO(self._backups[name]["content"])).read("config.json")
            )
            now = self.now_ms()
            self._written = {k: (v, now) for k, v in (document.get("written") or {}).items()}
        return _json(
            {
                "completed": True,
                "completedRollback": False,
                "rollbackSaved": f"rollback-{name}",
                "rollbackSaveFailed": False,
                "rollbackHasWarnings": False,
                "warnings": [],
                "updatedModules": sorted(self._modules),
            }
        )

    def _cert_get(self, params: Mapping[str, Any]) -> Answer:
        ctype = params.get("options.type")
        return _json([c for c in self._certificates.values() if not ctype or c["type"] == ctype])

    def _cert_id(self, source: Mapping[str, Any], prefix: str = "") -> str:
        cid = source.get(f"{prefix}id")
        if not isinstance(cid, str) or not cid:
            raise RequestError(400, "options.id is required")
        if cid not in self._certificates:
            raise RequestError(404, f"certificate {cid!r} not found")
        return cid

    def _cert_export(self, params: Mapping[str, Any]) -> Answer:
        cid = self._cert_id(params, "options.")
        pem = f"-----BEGIN CERTIFICATE-----\nSIMULATED {cid}\n-----END CERTIFICATE-----\n"
        return _json(base64.b64encode(pem.encode()).decode())

    def _cert_set(self, body: Mapping[str, Any]) -> Answer:
        options = body.get("options") or {}
        action = options.get("action")
        if action not in ("trust", "untrust"):
            raise RequestError(400, "options.action must be trust or untrust")
        with self._lock:
            cid = self._cert_id(options)
            cert = self._certificates.pop(cid)
            base = cid.split("/", 1)[1]
            status = "trusted" if action == "trust" else "pending"
            cert = {**cert, "id": f"{status}/{base}", "status": status}
            self._certificates[cert["id"]] = cert
        return Answer()

    def _cert_remove(self, body: Mapping[str, Any]) -> Answer:
        with self._lock:
            del self._certificates[self._cert_id(body.get("options") or {})]
        return Answer()

    def _module_details(self, params: Mapping[str, Any]) -> Answer:
        uptime = int(time.time() - self._started)
        modules = {}
        for name, module in self._modules.items():
            modules[name] = {
                "config": {
                    "type": module["type"],
                    "required": False,
                    "start": {"enabled": True, "delay": 0},
                    "monitor": {"enabled": True, "delay": 0},
                },
                "license": {
                    "acquired": True,
                    "period": 0,
                    "mode": "production",
                    "tagAccess": "local",
                },
                "running": module["running"],
                "mode": None,
                "lastStart": module["lastStart"],
                "lastStop": module["lastStop"],
                "pid": module["pid"] if module["running"] else 0,
                "api": {
                    "online": module["running"],
                    "info": {
                        "type": module["type"],
                        "category": ["data"],
                        "version": "1.21.13",
                        "releaseType": "stable",
                        "fileversion": "1.21.13.0",
                        "requisites": {
                            "bootstrapVersion": {"min": "1.21.0"},
                            "exeVersion": {"min": "1.21.0"},
                        },
                        "name": name,
                    },
                    "stats": {"tx": {"ok": 0, "error": 0}, "rx": {"ok": 0, "error": 0}},
                },
            }
        return _json(
            {
                "ts": _iso(self.now_ms()),
                "running": True,
                "uptime": f"{uptime}s",
                "pid": self._pid,
                "memoryUsage": {
                    "rss": "80Mb",
                    "heapTotal": "40Mb",
                    "heapUsed": "30Mb",
                    "external": "2Mb",
                    "arrayBuffers": "1Mb",
                },
                "modules": modules,
            }
        )

    def _module_instances(self, params: Mapping[str, Any]) -> Answer:
        wanted = set(parse_list(params.get("filter")))
        return _json(
            [
                n
                for n, m in self._modules.items()
                if not wanted or m["type"] in wanted or n in wanted
            ]
        )

    def _module_config_list(self, params: Mapping[str, Any]) -> Answer:
        return _json(
            {
                name: {"text": name.capitalize(), "icon": f"icon-{name}"}
                for name in ("logger", "api", "users", "tags", "views", "links")
            }
        )

    def _module_config_present(self, params: Mapping[str, Any]) -> Answer:
        name = params.get("moduleName")
        configs: dict[str, Any] = self._modules[name]["configs"] if name in self._modules else {}
        return _json(
            {c: c in configs for c in ("logger", "api", "users", "tags", "views", "links")}
        )

    def _module_name(self, source: Mapping[str, Any]) -> str:
        name = source.get("moduleName")
        if not isinstance(name, str) or not name:
            raise RequestError(400, "moduleName is required")
        if name not in self._modules:
            raise RequestError(404, f"module {name!r} not found")
        return name

    def _module_config_data(self, params: Mapping[str, Any]) -> Answer:
        config_name = params.get("configName")
        if not config_name:
            raise RequestError(400, "configName is required")
        module = self._modules[self._module_name(params)] if params.get("moduleName") else None
        configs = module["configs"] if module else {}
        if config_name not in configs:
            raise RequestError(404, f"configuration {config_name!r} not found")
        return _json(configs[config_name])

    def _module_run(self, body: Mapping[str, Any], action: str) -> Answer:
        with self._lock:
            module = self._modules[self._module_name(body)]
            now = _iso(self.now_ms())
            if action in ("stop", "restart"):
                module["running"] = False
                module["lastStop"] = now
            if action in ("start", "restart"):
                module["running"] = True
                module["lastStart"] = now
                module["pid"] += 1
        return Answer()

    def _module_set_config(self, body: Mapping[str, Any]) -> Answer:
        config_name = body.get("configName")
        data = body.get("data")
        if not isinstance(config_name, str) or not isinstance(data, str):
            raise RequestError(400, "configName and data (a JSON string) are required")
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError:
            raise RequestError(400, "data is not a JSON document") from None
        with self._lock:
            name = self._module_name(body)
            self._modules[name]["configs"][config_name] = data
            options = body.get("options") or {}
            if config_name == "tags":
                self._publish({"type": "model", "model": self._model()})
        if isinstance(options, dict) and options.get("restart"):
            self._module_run({"moduleName": name}, "restart")
        return Answer()

    def _link_get(self, params: Mapping[str, Any]) -> Answer:
        self._specs_for(params.get("options.remoteNode"))
        side = {
            "subscription": "all",
            "view": {"name": "default", "ro": True, "ae": True, "ack": False},
            "sf": {"enabled": True, "paused": False},
            "tagCount": self.config.tags,
        }
        return _json(
            {
                "nodeInfo": {"name": self.config.node_name},
                "links": {
                    "to-remote": {
                        "name": "to-remote",
                        "type": "out",
                        "online": True,
                        "local": {**side, "gzip": True},
                        "remote": {**side, "endpoint": "127.0.0.1:3800"},
                    }
                },
            }
        )

    def _license_read(self, params: Mapping[str, Any]) -> Answer:
        name = self._named(params, self._license_files, "license")
        return _json(self._license_files[name])

    def _license_add(self, body: Mapping[str, Any]) -> Answer:
        data = body.get("data")
        if not isinstance(data, str):
            raise RequestError(400, "data (a JSON string) is required")
        try:
            document = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise RequestError(400, "data is not a license document") from None
        licenses = document.get("licenses") if isinstance(document, dict) else None
        if not isinstance(licenses, list) or not licenses:
            raise RequestError(400, "license document has no licenses")
        name = f"{licenses[0].get('id', 'license')}.lic"
        with self._lock:
            self._license_files[name] = data
            self._licenses[name] = {
                "path": f"/licenses/{name}",
                "name": name,
                "error": "",
                "id": licenses[0].get("id"),
                "host": "sim-host",
                "uid": self._uid,
                "unlicensed": False,
                "nonce": 1,
                "licenses": [
                    {
                        **lic,
                        "uid": self._uid if lic.get("uid") == "*" else lic.get("uid"),
                        "error": "",
                        "modules": [{**m, "used": 0} for m in lic.get("modules", [])],
                    }
                    for lic in licenses
                ],
            }
        return Answer()

    def _license_remove(self, body: Mapping[str, Any]) -> Answer:
        with self._lock:
            name = self._named(body, self._license_files, "license")
            del self._license_files[name]
            del self._licenses[name]
        return Answer()

    def _log_browse(self, params: Mapping[str, Any]) -> Answer:
        return _json(self._logs)

    def _log_export(self, params: Mapping[str, Any]) -> Answer:
        selection = parse_list(params.get("selection"))
        if not selection:
            raise RequestError(400, "selection is required")
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            for item in selection:
                module, _, day = item.rpartition(".")
                if module not in self._logs or day not in {d for d, _ in self._logs[module]}:
                    raise RequestError(404, f"log {item!r} not found")
                archive.writestr(f"{module}/{day}.log", f"{day} {module} simulated log line\n")
        return Answer(body=base64.b64encode(buffer.getvalue()), content_type="text/plain")

    def _system_status(self, params: Mapping[str, Any]) -> Answer:
        now = self.now_ms()
        up = int(time.time() - self._started)
        return _json(
            {
                "n3": {
                    "pid": self._pid,
                    "up": up,
                    "versions": ["1.21.13"],
                    "node": self.config.node_name,
                    "tags": {"total": self.config.tags, "local": self.config.tags, "remote": 0},
                    "errors": [],
                },
                "sys": {
                    "standby": False,
                    "hostname": "sim-host",
                    "ts": now,
                    "up": up,
                    "cpu": ["Simulated CPU", 2, 2400],
                    "usage": {"cpu": [5, 100], "ram": [512, 24576], "disk": [10, 100]},
                },
            }
        )

    def _restart_service(self, body: Mapping[str, Any]) -> Answer:
        with self._lock:
            self._restarting_until = time.time() + self.config.restart_s
            self._started = time.time() + self.config.restart_s
            self._pid += 1
        return Answer()


def _config_doc(name: str) -> dict[str, Any]:
    return {
        "version": {"main": 1, "editor": 1},
        "result": ["Object", {"level": ["String", "info"], "enabled": ["Boolean", True]}],
        "editor": {"extends": {"module": name}, "modified": 0, "library": {}},
    }


_RESOURCES = {
    "alarm",
    "backup",
    "certificate",
    "module",
    "link",
    "license",
    "log",
    "redundancy",
    "system",
    "tag",
}
_POSTS = {
    "alarm.ack",
    "backup.create",
    "backup.rename",
    "backup.delete",
    "backup.import",
    "backup.load",
    "certificate.set",
    "certificate.remove",
    "module.start",
    "module.stop",
    "module.restart",
    "module.setConfigData",
    "license.add",
    "license.remove",
    "system.restartService",
    "tag.write",
    "tag.writeMany",
    "tag.subscribe",
    "tag.cancelSubscription",
}
