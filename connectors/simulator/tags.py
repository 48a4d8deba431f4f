"""The `tag` resource: browse, read, details, the three history commands, views, writes.

History answers are rendered straight from the deterministic generator (`history.py`):
`{tag path: {"request": echo, "data": rows}}`. Unknown tags in `historyMany` and
`historyFilter` are left out of the answer; `history` of an unknown tag is a 404.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from connectors.options import METHODS, MODES, HistoryOptions, Method
from connectors.simulator.history import wire_rows
from connectors.simulator.protocol import (
    Answer,
    Handler,
    Params,
    RequestError,
    gc_paused,
    json_answer,
    parse_bool,
    parse_int,
    parse_list,
    parse_optional_bool,
    parse_regex,
    parse_time,
    required_str,
)
from connectors.simulator.tagtree import TagSpec, TagTree, mix1, without_history

if TYPE_CHECKING:
    from connectors.simulator.node import SimulatedNode

DEFAULT_INTERVAL_MS = 60_000
VIEWS = ("default", "operations", "maintenance")
_WRITE_TYPES: dict[str, tuple[type, ...]] = {
    "number": (int, float),
    "boolean": (bool,),
    "string": (str,),
}


def parse_history_options(params: Params, *, new_methods: bool = True) -> HistoryOptions:
    """The shared history options; mode defaults to `delta` (spec), interval to 60 s.

    A node before 1.21.10 (`new_methods` False) does not know `stddev` and `delta`: like an
    older node with any option value it does not know, it ignores the method and answers
    the tag's default one.
    """
    mode = params.get("options.mode") or "delta"
    if mode not in MODES:
        raise RequestError(400, f"options.mode {mode!r} is not one of {', '.join(MODES)}")
    method = _method(params, new_methods)
    interval = _positive(params, "options.interval")
    limit = parse_int(params.get("options.limit"), "options.limit")
    if limit is not None and limit < 0:
        raise RequestError(400, "options.limit must not be negative")
    return HistoryOptions(
        mode=mode,  # type: ignore[arg-type]  # checked against MODES above
        method=method,
        interval_ms=(interval or DEFAULT_INTERVAL_MS) if mode == "aggregated" else None,
        deadband=_deadband(params),
        invalid_as_null=parse_optional_bool(params.get("options.invalidAsNull")),
        limit=limit or None,
    )


def _method(params: Params, new_methods: bool) -> Method | None:
    method = params.get("options.method") or None
    if method is not None and method not in METHODS:
        raise RequestError(400, f"options.method {method!r} is not one of {', '.join(METHODS)}")
    if not new_methods and method in ("stddev", "delta"):
        return None
    return method  # type: ignore[return-value]  # checked against METHODS above


def _positive(params: Params, name: str) -> int | None:
    value = parse_int(params.get(name), name)
    if value is not None and value <= 0:
        raise RequestError(400, f"{name} must be positive")
    return value


def _deadband(params: Params) -> float | None:
    """`options.deadband` as a number; the `u` suffix a tag's configured deadband carries
    (spec: config.deadband) is read past."""
    raw = params.get("options.deadband")
    if raw in (None, ""):
        return None
    try:
        return float(str(raw).strip().rstrip("u"))
    except ValueError:
        raise RequestError(400, "options.deadband is not a number") from None


def request_echo(
    tag: str,
    start: int,
    end: int,
    options: HistoryOptions,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The `request` object of a history answer (spec: Tag history response)."""
    echo: dict[str, Any] = {
        "mode": options.mode,
        "method": options.method or "",
        "interval": options.interval_ms,
        "deadband": options.deadband,
        "invalidAsNull": True if options.invalid_as_null is None else options.invalid_as_null,
        "limit": options.limit,
    }
    echo.update(extra or {})
    return {"tag": tag, "start": start, "end": end, "options": echo, "data": None}


# Stamps of the rows the `garbled_timestamps` behaviour adds: before the epoch, in 1913
# (the request started there), and in 2200.
GARBLED_MS = (-1, -1_795_046_400_000, 7_258_118_400_000)


class TagService:
    """Tag operations of one node; current values written through the API live here."""

    def __init__(self, node: SimulatedNode) -> None:
        self._node = node
        self._lock = threading.Lock()
        self._written: dict[str, tuple[Any, int]] = {}
        # (node, tag, start, end, options) asked once: `flaky_tags` answers them the next time.
        self._asked: set[tuple[Any, ...]] = set()

    def handlers(self) -> dict[str, Handler]:
        return {
            "tag.browse": self.browse,
            "tag.read": self.read,
            "tag.details": self.details,
            "tag.history": _paused(self.history),
            "tag.historyMany": _paused(self.history_many),
            "tag.historyFilter": _paused(self.history_filter),
            "tag.getViews": lambda _: json_answer(list(VIEWS)),
            "tag.write": self.write,
            "tag.writeMany": self.write_many,
        }

    # -- written values (backups hold and restore them) ------------------------------------

    def written_values(self) -> dict[str, Any]:
        with self._lock:
            return {path: value for path, (value, _) in self._written.items()}

    def restore_values(self, values: Mapping[str, Any], ts: int) -> None:
        with self._lock:
            self._written = {
                path: (value, ts) for path, value in values.items() if path in self._local.by_path
            }
        self._node.forget_answers()  # replayed details hold current values

    @property
    def _local(self) -> TagTree:
        return self._node.tree()

    # -- history ---------------------------------------------------------------------------

    def _window(self, params: Params) -> tuple[int, int]:
        seconds = self._node.behaves("epoch_seconds")
        start = parse_time(params.get("start"), "start", seconds=seconds)
        end = parse_time(params.get("end"), "end", seconds=seconds)
        if end < start:
            raise RequestError(400, "end is before start")
        return start, end

    def _options(self, params: Params) -> HistoryOptions:
        old = self._node.behaves("version_1_21_5")
        return parse_history_options(params, new_methods=not old)

    def _render(
        self,
        tree: TagTree,
        specs: list[TagSpec],
        start: int,
        end: int,
        options: HistoryOptions,
        extra: Mapping[str, Any] | None = None,
    ) -> bytes:
        """`{path: {request, data}}`, shaped by the node's profile: tags left out (absent,
        `data: null` or keyed by name) and rows stamped outside the query added."""
        node = self._node
        garbled = node.behaves("garbled_timestamps") and options.mode != "aggregated"
        # `raw_cap_per_answer`: the caps count the whole answer, its tags in order.
        room = self._answer_cap(options)
        answer: dict[str, Any] = {}
        for spec in specs:
            rows: list[Any] = []
            if room is None or room > 0:
                rows = node.history_rows(tree, spec, start, end, options, capped=True)
            if room is not None:
                rows = rows[:room]
                room -= len(rows)
            if garbled and spec.index % 5 == 2:
                rows.append(_garbled_row(spec, start, node.row_width()))
            rows = self._wire(spec, rows, options)
            data: list[Any] | None = None if self._without_history(spec) else rows
            entry = {"request": request_echo(spec.path, start, end, options, extra), "data": data}
            if not self._leaves_out(tree, spec, start, end, options):
                answer[spec.path] = entry
            elif node.behaves("dropped_as_null"):
                answer[spec.path] = {**entry, "data": None}
            elif node.behaves("dropped_as_name"):
                answer[spec.name] = entry
        return orjson.dumps(answer)

    def _answer_cap(self, options: HistoryOptions) -> int | None:
        """Samples a whole raw answer may hold (`raw_cap_per_answer`: limit and the node's
        own cap count the answer, not each tag); None: only per-tag caps."""
        if options.mode != "raw" or not self._node.behaves("raw_cap_per_answer"):
            return None
        caps = [cap for cap in (options.limit, self._node.config.node_raw_cap()) if cap]
        return min(caps) if caps else None

    def _without_history(self, spec: TagSpec) -> bool:
        """`null_without_history`: this tag has no history; its answers hold `data: null`."""
        return self._node.behaves("null_without_history") and without_history(spec)

    def _recurrent(self, params: Params) -> bool:
        """`options.recurrent` (default false); always true on `browse_always_recurses`."""
        if self._node.behaves("browse_always_recurses"):
            return True
        return parse_bool(params.get("options.recurrent"), False)

    def _leaves_out(
        self, tree: TagTree, spec: TagSpec, start: int, end: int, options: HistoryOptions
    ) -> bool:
        """Whether this answer leaves `spec` out: always (`loses_tags`, every seventh tag),
        or (`flaky_tags`, a quarter of the tags) the first time this question is asked."""
        node = self._node
        if node.behaves("loses_tags") and spec.index % 7 == 3:
            return True
        if not node.behaves("flaky_tags") or mix1(spec.index, 4242) % 4:
            return False
        asked = (tree.node_name, spec.path, start, end, options)
        with self._lock:
            first = asked not in self._asked
            self._asked.add(asked)
        return first

    def history(self, params: Params) -> Answer:
        path = required_str(params, "path")
        tree = self._node.tree(params.get("options.remoteNode"))
        spec = tree.get(path)
        if spec is None:
            raise RequestError(404, f"tag {path!r} not found")
        start, end = self._window(params)
        options = self._options(params)
        rows = self._node.history_rows(tree, spec, start, end, options, capped=True)
        rows = self._wire(spec, rows, options)
        data = None if self._without_history(spec) else rows
        return json_answer({"request": request_echo(path, start, end, options), "data": data})

    def _wire(
        self, spec: TagSpec, rows: list[tuple[Any, ...]], options: HistoryOptions
    ) -> list[tuple[Any, ...]]:
        """The rows as this node's profile writes them (`history.wire_rows`)."""
        aggregated = options.mode == "aggregated"
        return wire_rows(
            rows,
            self._node.config.behaviours,
            number_tag=spec.type == "number",
            bucket_ms=(options.interval_ms or 60_000) if aggregated else None,
        )

    def history_many(self, params: Params) -> Answer:
        paths = parse_list(params.get("paths"))
        if not paths:
            raise RequestError(400, "paths is required")
        tree = self._node.tree(params.get("options.remoteNode"))
        start, end = self._window(params)
        options = self._options(params)
        specs = [spec for p in dict.fromkeys(paths) if (spec := tree.get(p)) is not None]
        return Answer(body=self._render(tree, specs, start, end, options))

    def history_filter(self, params: Params) -> Answer:
        """Honours both `path` and `paths` (their union): the spec names both. A node of the
        `filter_path_only` or `filter_paths_only` profile reads only the one name."""
        names: tuple[str, ...] = ("path", "paths")
        if self._node.behaves("filter_path_only"):
            names = ("path",)
        elif self._node.behaves("filter_paths_only"):
            names = ("paths",)
        roots = list(dict.fromkeys(item for name in names for item in parse_list(params.get(name))))
        if not roots:
            raise RequestError(400, f"{' or '.join(names)} is required")
        tree = self._node.tree(params.get("options.remoteNode"))
        start, end = self._window(params)
        options = self._options(params)
        pattern = parse_regex(params.get("options.filter"), "options.filter")
        recurrent = parse_bool(params.get("options.recurrent"), False)
        specs = tree.select(roots, pattern, self._recurrent(params))
        body = self._render(tree, specs, start, end, options, {"recurrent": recurrent})
        return Answer(body=body)

    # -- browse, read, details ---------------------------------------------------------------

    def current(
        self, spec: TagSpec, found: Mapping[str, tuple[Any, int, int]] | None = None
    ) -> tuple[Any, int, int]:
        """(value, quality, ts) now: the last write, else the last visible sample (from
        `found`, the `last_samples` of many tags, when it holds the tag's)."""
        with self._lock:
            written = self._written.get(spec.path)
        if written is not None:
            return written[0], 192, written[1]
        if found is not None and spec.path in found:
            return found[spec.path]
        return self._node.last_sample(spec)

    def entry(
        self,
        spec: TagSpec,
        *,
        details: bool,
        with_id: bool = True,
        found: Mapping[str, tuple[Any, int, int]] | None = None,
    ) -> dict[str, Any]:
        """A tag read entry, or (details) a tag details entry (spec: Tag)."""
        value, quality, ts = self.current(spec, found)
        entry: dict[str, Any] = {
            "status": self._node.link.status(spec, self._node.now_ms(), ts),
            "data": {"value": value, "quality": quality, "ts": ts},
        }
        if not details:
            return entry
        remote = {"link": "to-remote", "lag_ms": spec.remote_lag_ms} if spec.remote_lag_ms else None
        full: dict[str, Any] = {"fullPath": spec.path, "remote": remote, **entry}
        full["config"] = _tag_config(spec)
        return {"id": spec.index + 1, **full} if with_id else full

    def model(self, limit: int | None = 50) -> dict[str, Any]:
        """The tag model of the first `limit` tags (None: all): `subscribe` answers the
        first 50, a `model` event holds them all."""
        specs = self._local.specs[:limit]
        found = self._node.last_samples(specs)
        return {
            "description": "simulated node",
            "tags": {
                spec.name: self.entry(spec, details=True, with_id=False, found=found)
                for spec in specs
            },
        }

    def browse(self, params: Params) -> Answer:
        path = required_str(params, "path")
        recurrent = self._recurrent(params)
        flat = parse_bool(params.get("options.flat"), False)
        hide_tags = parse_bool(params.get("options.hideTags"), False)
        hide_groups = parse_bool(params.get("options.hideGroups"), False)
        pattern = parse_regex(params.get("options.filter"), "options.filter")
        group = path if path.endswith("/") else path + "/"
        chosen = self._local.select([group], pattern, True)
        if flat:
            return json_answer(_flat_listing(chosen, group, recurrent, hide_tags, hide_groups))
        tree: dict[str, Any] = {"groups": {}, "tags": {}}
        for spec in chosen:
            names = spec.path[len(group) :].split("/")
            node = tree
            for depth, name in enumerate(names[:-1]):
                node = node["groups"].setdefault(name, {"groups": {}, "tags": {}})
                if not recurrent and depth == 0:
                    break
            else:
                if not hide_tags:
                    node["tags"][names[-1]] = {"fullPath": spec.path, "type": spec.type}
        if hide_groups:
            tree["groups"] = {}
        return json_answer(tree)

    def _read_selection(self, params: Params) -> list[TagSpec]:
        path = required_str(params, "path")
        exact = self._local.get(path)
        if exact is not None:
            return [exact]
        recurrent = self._recurrent(params)
        pattern = parse_regex(params.get("options.filter"), "options.filter")
        root = path[:-1] if path.endswith("/*") else path
        chosen = self._local.select([root], pattern, recurrent)
        if not chosen:
            raise RequestError(404, f"no tag at {path!r}")
        return chosen

    def _key(self, spec: TagSpec) -> str:
        """The key of a tag in details and read answers: its name (spec), so a name that
        repeats across groups keeps only the last of them; its path (`details_by_path`)."""
        return spec.path if self._node.behaves("details_by_path") else spec.name

    def read(self, params: Params) -> Answer:
        specs = self._read_selection(params)
        return json_answer({"tags": {self._key(s): self.entry(s, details=False) for s in specs}})

    def details(self, params: Params) -> Answer:
        specs = self._read_selection(params)
        return json_answer(
            {
                "description": "simulated group",
                "_templates": [],
                "tags": {self._key(s): self.entry(s, details=True) for s in specs},
            }
        )

    # -- writes ----------------------------------------------------------------------------

    def _checked(self, path: Any, value: Any) -> TagSpec:
        if not isinstance(path, str) or not path:
            raise RequestError(400, "path is required")
        spec = self._local.get(path)
        if spec is None:
            raise RequestError(404, f"tag {path!r} not found")
        kinds = _WRITE_TYPES[spec.type]
        if (isinstance(value, bool) and spec.type != "boolean") or not isinstance(value, kinds):
            raise RequestError(400, f"value does not match type {spec.type} of tag {path!r}")
        return spec

    def _apply(self, writes: list[tuple[TagSpec, Any]]) -> None:
        ts = self._node.now_ms()
        with self._lock:
            for spec, value in writes:
                self._written[spec.path] = (value, ts)
        self._node.forget_answers()  # replayed details hold current values
        for spec, value in writes:
            self._node.subscriptions.publish_tag(spec.path, value, 192, ts)

    def write(self, body: Params) -> Answer:
        if "value" not in body:
            raise RequestError(400, "value is required")
        self._apply([(self._checked(body.get("path"), body["value"]), body["value"])])
        return Answer()

    def write_many(self, body: Params) -> Answer:
        """`paths` is a comma-separated string (spec); a JSON array is accepted too."""
        raw = body.get("paths")
        paths = [str(p) for p in raw] if isinstance(raw, list) else parse_list(raw)
        values = body.get("values")
        if not paths or not isinstance(values, list) or len(values) != len(paths):
            raise RequestError(400, "paths and values (of the same length) are required")
        writes = [(self._checked(p, v), v) for p, v in zip(paths, values, strict=True)]
        self._apply(writes)
        return Answer()


def _paused(handler: Handler) -> Handler:
    """`handler` with the cyclic collector paused while it builds its answer."""

    def paused(params: Params) -> Answer:
        with gc_paused():
            return handler(params)

    return paused


def _garbled_row(spec: TagSpec, start: int, width: int) -> tuple[Any, ...]:
    """A row stamped outside any query (`garbled_timestamps`): which stamp depends on the
    tag and the query start, so answers differ but a re-asked question gets the same one."""
    ts = GARBLED_MS[(spec.index + start // 1000) % len(GARBLED_MS)]
    return (ts, None, 0, 0)[:width]


def _flat_listing(
    chosen: list[TagSpec], group: str, recurrent: bool, hide_tags: bool, hide_groups: bool
) -> list[str]:
    items: list[str] = []
    if not hide_tags:
        items.extend(s.path for s in chosen if recurrent or "/" not in s.path[len(group) :])
    if not hide_groups:
        groups = {
            group + s.path[len(group) :].split("/", 1)[0] + "/"
            for s in chosen
            if "/" in s.path[len(group) :]
        }
        items.extend(sorted(groups))
    return items


def _tag_config(spec: TagSpec) -> dict[str, Any]:
    """The configuration block of tag details (spec: Tag details response)."""
    number = spec.type == "number"
    return {
        "description": f"{spec.name} (simulated)",
        "type": spec.type,
        "numberType": "float64" if number else None,
        "format": "%.1f" if number else None,
        "deadband": f"{spec.deadband}u",
        "clientAccess": "RW",
        "engUnits": spec.units,
        "default": None,
        "simulation": {"enabled": True},
        "persistency": 0,
        "views": ["default"],
        "security": {},
        "extensions": {
            "scaling": {"enabled": False, "raw": [0, 100], "eu": [0, 100], "clamp": [False, False]},
            "source": {"enabled": True, "type": "simulation", "module": "Simulator", "config": {}},
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
            "ae": {"alarms": {}, "quality_alarms": {}},
        },
    }
