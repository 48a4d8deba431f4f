"""flows.yaml -> validated, typed configuration, before anything runs.

Every problem becomes one `ConfigError` line naming the file, the key path and what is
wrong (`flows.yaml: flows.hourly.mode: 'rwa' is not one of raw, filter, delta,
aggregated`). `${VAR}` references are resolved from the environment while loading;
secrets themselves are never in the file: nodes name the *environment variables* that
hold them, and the client reads them when it connects.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from connectors.errors import one_line, quoted
from connectors.normalise.positions import check_alarm_fields
from connectors.options import METHODS, MODES, AlarmFilter, HistoryOptions
from connectors.proxy import check_proxy_setting
from connectors.settings import (
    DEFAULT_MAX_ANSWER_MB,
    NodeSettings,
    check_credentials,
    check_node_url,
)
from pipelines.config.file import DocumentError, load_document
from pipelines.config.names import did_you_mean, keys_at
from pipelines.planning import parse_duration

DEFAULT_CONFIG = "flows.yaml"
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_RELATIVE = re.compile(r"^(?:now)?\s*-\s*(.+)$")
# Durations in flows.yaml: whole milliseconds (the node's unit and the planner's grid), at
# most a century (so `now - settle` or a window on the UTC grid stays inside the calendar).
_ONE_MS = timedelta(milliseconds=1)
MAX_DURATION = timedelta(days=36_525)
# History is stamped in epoch milliseconds: nothing is earlier than the epoch.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)


class ConfigError(Exception):
    """A flows.yaml problem, as one line: `file: key.path: what is wrong`."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _duration(value: object) -> timedelta:
    """A flows.yaml duration: whole milliseconds, at most MAX_DURATION."""
    if isinstance(value, timedelta):
        duration = value
    elif isinstance(value, str | int | float):
        duration = parse_duration(value)
    else:
        raise ValueError(f"{quoted(value)} is not a duration like 15m, 1h or 1d")
    if duration % _ONE_MS:
        raise ValueError(f"{quoted(value)} is not a whole number of milliseconds")
    if duration > MAX_DURATION:
        raise ValueError(f"{quoted(value)} is longer than {MAX_DURATION.days:,} days")
    return duration


_NOT_A_TIME = "is not a time (ISO 8601 like 2024-01-01T00:00:00Z, or -7d)"


def parse_moment(value: object, *, now: datetime | None = None) -> datetime:
    """An absolute ISO 8601 time (UTC when no offset), `now`, or `-2d` / `now-2d` (relative),
    in UTC, not before 1970 (history is stamped in epoch milliseconds)."""
    now = now or datetime.now(UTC)
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
    elif not isinstance(value, str):
        raise ValueError(f"{quoted(value)} {_NOT_A_TIME}")
    else:
        moment = _moment_of_text(value, now)
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00:00-02:00 is in year 10000 in UTC
        raise ValueError(f"{quoted(value)} is past the end of the calendar") from None
    if moment < EARLIEST:
        raise ValueError(f"{quoted(value)} is before 1970-01-01T00:00:00Z")
    return moment


def _moment_of_text(value: str, now: datetime) -> datetime:
    text = value.strip()
    if text == "now":
        return now
    relative = _RELATIVE.match(text)
    if relative and not text[:1].isdigit():
        ago = parse_duration(relative.group(1).strip())
        if ago > now - EARLIEST:
            raise ValueError(f"{quoted(value)} is before 1970-01-01T00:00:00Z")
        return now - ago
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{quoted(value)} {_NOT_A_TIME}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class SimulatorNode(_Strict):
    """Start the built-in simulator in-process on a free loopback port (the demo node)."""

    seed: int = 7
    tags: int = Field(default=200, ge=10, le=100_000)
    raw_cap: int = Field(default=10_000, ge=1)
    # How the simulated node reads what the spec leaves open (docs/simulator.md):
    # a profile name, `a+b`, or a list of names.
    profile: str | list[str] = "default"

    @field_validator("profile")
    @classmethod
    def _profile(cls, value: str | list[str]) -> str:
        from connectors.simulator.profiles import behaviours_of

        text = value if isinstance(value, str) else "+".join(value)
        behaviours_of(text)  # ValueError names an unknown profile
        return text


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def _checked(check: Callable[[str], None]) -> AfterValidator:
    """A validator running `check` (which raises ValueError) on a text value."""

    def validate(value: str) -> str:
        check(value)
        return value

    return AfterValidator(validate)


NodeUrl = Annotated[str, _checked(check_node_url)]
Regex = Annotated[str, _checked(lambda text: _check_regex(text))]
# A pattern we match ourselves (tag selections): RE2, linear in the text (pipelines/patterns.py).
OurPattern = Annotated[str, _checked(lambda text: _check_ours(text))]


def _alarm_fields(fields: list[str]) -> list[str]:
    return list(check_alarm_fields(fields))


class NodeConfig(_Strict):
    """`nodes.<name>`: the client's `NodeSettings` in flows.yaml's units (durations for
    seconds, Secret block names for values), with its defaults and credential rules."""

    url: NodeUrl | None = None
    simulator: SimulatorNode | None = None
    verify: bool = NodeSettings.verify
    ca_bundle: str | None = None
    token_env: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    token_block: str | None = None
    password_block: str | None = None
    connect_timeout: timedelta = _seconds(NodeSettings.connect_timeout_s)
    read_timeout: timedelta = _seconds(NodeSettings.read_timeout_s)
    # The whole request; None: connect_timeout + 2 x read_timeout (NodeSettings.deadline_s).
    request_deadline: timedelta | None = None
    max_connections: int = Field(default=NodeSettings.max_connections, ge=1, le=64)
    retries: int = Field(default=NodeSettings.retries, ge=0, le=50)
    # One history answer is read up to this many MB; a longer one is asked again in pieces.
    max_answer_mb: int = Field(default=DEFAULT_MAX_ANSWER_MB, ge=1, le=4096)
    # Unset: the environment's proxy variables; `direct`; or a proxy URL (connectors/proxy.py).
    proxy: Annotated[str, _checked(check_proxy_setting)] | None = None
    # Alarm events as arrays: the field at each position (connectors/normalise/positions.py).
    alarm_fields: Annotated[list[str], AfterValidator(_alarm_fields)] | None = None

    _durations = field_validator(
        "connect_timeout", "read_timeout", "request_deadline", mode="before"
    )(_duration)

    @field_validator("connect_timeout", "read_timeout", "request_deadline")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be more than 0s")
        return value

    @model_validator(mode="after")
    def _one_target(self) -> NodeConfig:
        if (self.url is None) == (self.simulator is None):
            raise ValueError("give exactly one of url or simulator")
        if self.simulator is not None and self.proxy is not None:
            raise ValueError("proxy is for a node given by url (the simulator is on loopback)")
        check_credentials(
            token_env=self.token_env,
            token=self.token_block,
            username_env=self.username_env,
            password_env=self.password_env,
            password=self.password_block,
        )
        return self


class ParquetSinkConfig(_Strict):
    type: Literal["parquet"]
    url: str
    partition: Literal["auto", "date", "month", "year", "none"] = "auto"
    target_file_rows: int = Field(default=1_000_000, ge=1000)
    compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"
    storage_options: dict[str, Any] = Field(default_factory=dict)


class SqlSinkConfig(_Strict):
    type: Literal["sql"]
    url: str
    schema_: str | None = Field(default=None, alias="schema")
    # DuckDB: how long a run waits for another process writing the same file.
    busy_wait: timedelta = timedelta(0)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    _durations = field_validator("busy_wait", mode="before")(_duration)

    @model_validator(mode="after")
    def _busy_wait_is_for_duckdb(self) -> SqlSinkConfig:
        if self.busy_wait > timedelta(0) and not self.url.startswith("duckdb:"):
            raise ValueError("busy_wait is for DuckDB files (a server takes many writers)")
        return self

    @field_validator("schema_")
    @classmethod
    def _schema(cls, value: str | None) -> str | None:
        if value is not None and not re.match(NAME_PATTERN, value):
            raise ValueError(f"{quoted(value)} is not a plain SQL name (letters, digits, _)")
        return value


class DeltaSinkConfig(_Strict):
    type: Literal["delta"]
    url: str
    # delta-rs object_store options (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... via ${VAR}).
    storage_options: dict[str, str] = Field(default_factory=dict)
    target_file_size: int | None = Field(default=None, ge=1_000_000)


class IcebergSinkConfig(_Strict):
    type: Literal["iceberg"]
    url: str
    # SQLAlchemy URL of the SQL catalog; default: an SQLite file beside a local warehouse.
    catalog: str | None = None
    namespace: str = "historian"
    # pyiceberg FileIO properties (s3.endpoint, s3.access-key-id, ... via ${VAR}).
    properties: dict[str, str] = Field(default_factory=dict)

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not re.match(NAME_PATTERN, value):
            raise ValueError(f"{quoted(value)} is not a plain name (letters, digits, _)")
        return value

    @model_validator(mode="after")
    def _catalog_for_object_storage(self) -> IcebergSinkConfig:
        if self.catalog is None and "://" in self.url and not self.url.startswith("file://"):
            raise ValueError(
                "catalog is required for a warehouse on object storage (an SQLAlchemy URL)"
            )
        return self


SinkConfig = Annotated[
    ParquetSinkConfig | SqlSinkConfig | DeltaSinkConfig | IcebergSinkConfig,
    Field(discriminator="type"),
]
SINK_TYPES = ("parquet", "sql", "delta", "iceberg")


class TagSelectionConfig(_Strict):
    """Exactly one way to select tags: explicit paths, a group + regex, or browsing."""

    paths: list[str] | None = None
    group: str | None = None
    regex: OurPattern | None = None
    recurrent: bool = True
    browse: str | None = None
    include: list[OurPattern] = Field(default_factory=list)
    exclude: list[OurPattern] = Field(default_factory=list)

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            if not value:
                raise ValueError("paths is empty")
            for path in value:
                if not path.startswith("/"):
                    raise ValueError(f"tag path {quoted(path)} does not start with /")
            if len(set(value)) != len(value):
                raise ValueError("paths lists a tag twice")
        return value

    @model_validator(mode="after")
    def _one_way(self) -> TagSelectionConfig:
        ways = [self.paths is not None, self.group is not None, self.browse is not None]
        if sum(ways) != 1:
            raise ValueError("give exactly one of paths, group (+ regex) or browse")
        if self.regex is not None and self.group is None:
            raise ValueError("regex needs group")
        if (self.include or self.exclude) and self.browse is None:
            raise ValueError("include/exclude need browse")
        return self


class AlarmSelectionConfig(_Strict):
    path: str = "/"
    regex: Regex | None = None
    status: int | None = Field(default=None, ge=0, le=3)
    priority: int | None = Field(default=None, ge=1, le=4)
    min_priority: int | None = Field(default=None, ge=1, le=4)
    max_priority: int | None = Field(default=None, ge=1, le=4)
    recurrent: bool | None = True


class ScheduleConfig(_Strict):
    """When `historian serve` runs the flow. The time zone is checked here (the IANA
    database); the cron expression by Prefect's own parser in `historian check` and before
    `serve` starts (pipelines/orchestration/schedules.py), so that loading a config never imports Prefect."""

    cron: str | None = None
    interval: timedelta | None = None
    timezone: str = "UTC"

    _durations = field_validator("interval", mode="before")(_duration)

    @field_validator("interval")
    @classmethod
    def _positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value < timedelta(seconds=1):
            raise ValueError("must be at least 1s")
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        if not _is_time_zone(value):
            raise ValueError(
                f"{quoted(value)} is not a time zone of the IANA database (like Europe/Paris)"
            )
        return value

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None and len(value.split()) not in (5, 6):
            raise ValueError(f"{quoted(value)} is not a cron expression of 5 fields")
        return value

    @model_validator(mode="after")
    def _one(self) -> ScheduleConfig:
        if (self.cron is None) == (self.interval is None):
            raise ValueError("give exactly one of cron or interval")
        return self


def _is_time_zone(name: str) -> bool:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if not name or name != name.strip() or name.startswith("/") or ".." in name:
        return False  # ZoneInfo would read a file by that path
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


class _FlowBase(_Strict):
    """What a flow has whatever its kind: where it reads, how it plans, where it writes."""

    # One node name, or a fleet: a list of names and/or fnmatch patterns over `nodes:`
    # (`plant_*`), expanded by `Config.flow_nodes`.
    node: str | list[str]
    remote_node: str | list[str] | None = None
    window: timedelta | Literal["auto"] = "auto"
    start: datetime
    lookback: timedelta = timedelta(0)
    settle: timedelta = timedelta(minutes=1)
    sinks: list[str] = Field(min_length=1)
    dataset: str | None = None
    schedule: ScheduleConfig | None = None

    _durations = field_validator("lookback", "settle", mode="before")(_duration)

    @field_validator("window", mode="before")
    @classmethod
    def _window(cls, value: object) -> object:
        return value if value == "auto" else _duration(value)

    @field_validator("window")
    @classmethod
    def _window_at_least_1s(cls, value: timedelta | str) -> timedelta | str:
        if isinstance(value, timedelta) and value < timedelta(seconds=1):
            raise ValueError("must be at least 1s")
        return value

    @field_validator("start", mode="before")
    @classmethod
    def _start(cls, value: object) -> datetime:
        return parse_moment(value)

    @field_validator("node")
    @classmethod
    def _node(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if not names:
            raise ValueError("node is an empty list")
        if any(not name.strip() for name in names):
            raise ValueError("a node name is empty")
        return value

    @field_validator("sinks")
    @classmethod
    def _sinks(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("lists a sink twice")
        return value

    @field_validator("dataset")
    @classmethod
    def _dataset(cls, value: str | None) -> str | None:
        if value is not None and not re.match(NAME_PATTERN, value):
            raise ValueError(f"{quoted(value)} is not a plain name (letters, digits, _; max 63)")
        return value

    @property
    def fleet(self) -> bool:
        """Whether `node:` may stand for several nodes (a list or a pattern): its state is
        then kept per node (`unit_key`), so a node joining the fleet renames nothing."""
        return not isinstance(self.node, str) or _is_pattern(self.node)

    def _remote(self) -> str | tuple[str, ...] | None:
        """`remote_node` as the client's query options take it."""
        return tuple(self.remote_node) if isinstance(self.remote_node, list) else self.remote_node


class LiveConfig(_Strict):
    """`live:` of a tag flow: `historian tail` streams its tags' changes to its sinks
    (pipelines/live), beside the scheduled history that stays the truth."""

    # How often the events received are committed (each commit one write per sink).
    commit_every: timedelta = timedelta(seconds=5)
    # Events asked for in one poll (`subscriptionEvents` `limit`); a poll drains the
    # queue while the node says more remain.
    poll_limit: int = Field(default=10_000, ge=1, le=1_000_000)
    # How often the node's queue is polled between commits.
    poll_every: timedelta = timedelta(seconds=1)
    # How far behind the newest event a late event is still written by the tail (its
    # window committed again); an older one opens a gap that history re-reads.
    late_within: timedelta = timedelta(seconds=30)

    _durations = field_validator("commit_every", "poll_every", "late_within", mode="before")(
        _duration
    )

    @field_validator("commit_every", "poll_every")
    @classmethod
    def _at_least_100ms(cls, value: timedelta) -> timedelta:
        if value < timedelta(milliseconds=100):
            raise ValueError("must be at least 100ms")
        return value


class TagHistoryFlow(_FlowBase):
    """`kind: tag_history` (the default): the samples of the selected tags, in one of the
    node's history modes."""

    kind: Literal["tag_history"] = "tag_history"
    tags: TagSelectionConfig
    mode: str = "raw"
    method: str | None = None
    interval: timedelta | None = None
    deadband: float | str | None = None
    invalid_as_null: bool | None = None
    limit: int | None = Field(default=None, ge=1)
    batch: int = Field(default=200, ge=1, le=10_000)
    metadata: bool = True
    # How long after its end a window of a tag behind a link still offline or draining
    # stays held (pipelines/core/holds.py) before it is recorded missing.
    hold_max: timedelta = timedelta(hours=6)
    # `historian tail` may stream this flow (`live: {commit_every: 5s}`); raw mode only.
    live: LiveConfig | None = None

    _interval = field_validator("interval", mode="before")(_duration)
    _hold_max = field_validator("hold_max", mode="before")(_duration)

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: object) -> object:
        if value is None:  # `tags:` with nothing under it
            raise ValueError("is required")
        return value

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        if value not in MODES:
            raise ValueError(f"{quoted(value)} is not one of {', '.join(MODES)}")
        return value

    @field_validator("method")
    @classmethod
    def _method(cls, value: str | None) -> str | None:
        if value is not None and value not in METHODS:
            raise ValueError(f"{quoted(value)} is not one of {', '.join(METHODS)}")
        return value

    @model_validator(mode="after")
    def _mode_options(self) -> TagHistoryFlow:
        """The keys that only one mode takes (docs/configuration.md, "Flows")."""
        aggregated = self.mode == "aggregated"
        if aggregated and (self.interval is None or self.interval < _ONE_MS):
            raise ValueError("mode aggregated needs interval (e.g. 15m)")
        if self.interval is not None and not aggregated:
            raise ValueError("interval is only for mode aggregated")
        if self.limit is not None and self.mode != "raw":
            raise ValueError("limit is only for mode raw")
        if self.live is not None and self.mode != "raw":
            raise ValueError("live is only for mode raw (events are raw samples)")
        if self.live is not None and self.live.late_within > self.settle:
            # The tail writes windows history has not yet reached (`now - settle`) only.
            raise ValueError("live.late_within must not be longer than settle")
        if isinstance(self.window, timedelta) and self.interval and self.window % self.interval:
            raise ValueError("window must be a multiple of interval")
        return self

    def history_options(self) -> HistoryOptions:
        return HistoryOptions(
            mode=self.mode,  # type: ignore[arg-type]
            method=self.method,  # type: ignore[arg-type]
            interval_ms=int(self.interval.total_seconds() * 1000) if self.interval else None,
            deadband=self.deadband,
            invalid_as_null=self.invalid_as_null,
            limit=self.limit,
            remote_node=self._remote(),
        )


class AlarmHistoryFlow(_FlowBase):
    """`kind: alarm_history`: the events of the alarms under one path, each window whole."""

    kind: Literal["alarm_history"]
    alarms: AlarmSelectionConfig = Field(default_factory=AlarmSelectionConfig)

    @model_validator(mode="before")
    @classmethod
    def _not_live(cls, value: object) -> object:
        if isinstance(value, dict) and "live" in value:
            raise ValueError("live: only tag_history flows can be tailed")
        return value

    @field_validator("alarms", mode="before")
    @classmethod
    def _alarms(cls, value: object) -> object:
        return {} if value is None else value  # `alarms:` with nothing under it: the default

    def alarm_filter(self) -> AlarmFilter:
        alarms = self.alarms
        return AlarmFilter(
            path_regex=alarms.regex,
            status=alarms.status,
            priority=alarms.priority,
            min_priority=alarms.min_priority,
            max_priority=alarms.max_priority,
            recurrent=alarms.recurrent,
            remote_node=self._remote(),
        )


FLOW_MODELS: dict[str, type[TagHistoryFlow | AlarmHistoryFlow]] = {
    "tag_history": TagHistoryFlow,
    "alarm_history": AlarmHistoryFlow,
}
# The branch names pydantic puts in an error's location, per top-level key.
_UNION_TAGS: dict[str, tuple[str, ...]] = {"sinks": SINK_TYPES, "flows": tuple(FLOW_MODELS)}


def _kind_tag(value: object) -> str | None:
    """Which flow model validates a flows.yaml entry: its `kind` (tag_history when unset);
    None for an entry that is not a mapping."""
    if isinstance(value, Mapping):
        kind = value.get("kind", "tag_history")
        return kind if isinstance(kind, str) else "<not a kind>"
    return getattr(value, "kind", None)


# `flows.<name>`: one model per kind, chosen by `kind:`, so a key of the other kind is an
# unknown key of this one (`_message` says which kind it belongs to).
FlowConfig = Annotated[
    Annotated[TagHistoryFlow, Tag("tag_history")]
    | Annotated[AlarmHistoryFlow, Tag("alarm_history")],
    Discriminator(_kind_tag),
]


def _is_pattern(name: str) -> bool:
    return any(ch in name for ch in "*?[")


def expand_nodes(node: str | list[str], known: Iterable[str]) -> list[str]:
    """A flow's `node:` (a name, a pattern, or a list of both) as the node names it
    means: sorted, each once. ValueError names an unknown name or a pattern that matches
    nothing."""
    names = list(known)
    found: set[str] = set()
    for entry in [node] if isinstance(node, str) else node:
        if _is_pattern(entry):
            matched = [name for name in names if fnmatchcase(name, entry)]
            if not matched:
                raise ValueError(
                    f"pattern {quoted(entry)} matches no node (nodes: {_names(names)})"
                )
            found.update(matched)
        elif entry in names:
            found.add(entry)
        else:
            hint = did_you_mean(entry, names)
            raise ValueError(f"unknown node {quoted(entry)} (nodes: {_names(names)}){hint}")
    return sorted(found)


def unit_key(flow: str, node: str, flow_config: FlowConfig) -> str:
    """The key of one (flow, node)'s state and lock in every sink: the flow's name when
    its `node:` is one plain name (state written before fleets stays valid), else
    `flow@node`."""
    return f"{flow}@{node}" if flow_config.fleet else flow


def _merged(defaults: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """`entry` over `defaults`; mappings in both (`simulator:`) merged the same way."""
    merged = dict(defaults)
    for key, value in entry.items():
        below = merged.get(key)
        both = isinstance(below, Mapping) and isinstance(value, Mapping)
        merged[key] = _merged(below, value) if both else value  # type: ignore[arg-type]
    return merged


class Config(_Strict):
    # Keys every `nodes:` entry gets unless it sets them itself (100 sites, one template).
    node_defaults: dict[str, Any] = Field(default_factory=dict)
    nodes: dict[str, NodeConfig] = Field(min_length=1)
    sinks: dict[str, SinkConfig] = Field(min_length=1)
    flows: dict[str, FlowConfig] = Field(min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _apply_node_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("node_defaults"):
            return data
        defaults, nodes = data["node_defaults"], data.get("nodes")
        if not isinstance(defaults, dict):
            raise _KeyedError(("node_defaults",), "must be a mapping of node keys")
        for key in defaults:
            if key not in NodeConfig.model_fields:
                hint = did_you_mean(str(key), NodeConfig.model_fields)
                raise _KeyedError(("node_defaults", str(key)), "unknown key" + hint)
        if not isinstance(nodes, dict):
            return data
        entries = {
            name: _merged(defaults, entry) if isinstance(entry, dict) else entry
            for name, entry in nodes.items()
        }
        return {**data, "nodes": entries}

    def flow_nodes(self, flow: str) -> list[str]:
        """The nodes a flow extracts from: its `node:` expanded, sorted, each once."""
        return expand_nodes(self.flows[flow].node, self.nodes)

    def select_nodes(self, flow: str, only: Sequence[str] | None = None) -> list[str]:
        """The flow's nodes, or those of them `only` names (`--node`); a name that is not
        one of the flow's is a one-line ConfigError."""
        known = self.flow_nodes(flow)
        if not only:
            return known
        for node in only:
            if node not in known:
                # A node of another flow is no typo; a name of no node may be one.
                hint = "" if node in self.nodes else did_you_mean(node, known)
                raise ConfigError(
                    f"--node: {quoted(node)} is not a node of flow {quoted(flow)} "
                    f"(its nodes: {_names(known)}){hint}"
                )
        return sorted(set(only))

    def flow_units(self, flow: str, only: Sequence[str] | None = None) -> list[tuple[str, str]]:
        """(node, state key) of each selected node of the flow (`select_nodes`, `unit_key`)."""
        fc = self.flows[flow]
        return [(node, unit_key(flow, node, fc)) for node in self.select_nodes(flow, only)]

    @model_validator(mode="after")
    def _references(self) -> Config:
        datasets: dict[tuple[str, str], str] = {}
        for name, flow in self.flows.items():
            if not re.match(NAME_PATTERN, name):
                raise _KeyedError(("flows", name), "flow names are letters, digits and _")
            try:
                expand_nodes(flow.node, self.nodes)
            except ValueError as exc:
                raise _KeyedError(("flows", name, "node"), str(exc)) from None
            for sink in flow.sinks:
                if sink not in self.sinks:
                    raise _KeyedError(
                        ("flows", name, "sinks"),
                        f"unknown sink {quoted(sink)} (sinks: {_names(self.sinks)})"
                        + did_you_mean(sink, self.sinks),
                    )
                key = (sink, flow.dataset or name)
                if key in datasets:
                    raise _KeyedError(
                        ("flows", name, "dataset"),
                        f"dataset {quoted(key[1])} in sink {quoted(sink)} is already written by flow "
                        f"{quoted(datasets[key])}",
                    )
                datasets[key] = name
        return self


class _KeyedError(ValueError):
    """A cross-reference error that knows its own key path."""

    def __init__(self, loc: Sequence[str | int], message: str) -> None:
        self.loc = tuple(loc)
        super().__init__(message)


def _check_regex(pattern: str) -> None:
    """A pattern the node matches (sent on the wire): its syntax only."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regex {quoted(pattern)}: {exc}") from None


def _check_ours(pattern: str) -> None:
    from pipelines.patterns import compile_pattern

    compile_pattern(pattern)


def _resolve_env(value: Any, loc: tuple[str | int, ...], env: Mapping[str, str]) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise _KeyedError(loc, f"environment variable {name} is not set")
            return env[name]

        return _ENV_REF.sub(substitute, value)
    if isinstance(value, dict):
        return {key: _resolve_env(item, (*loc, str(key)), env) for key, item in value.items()}
    if isinstance(value, list):
        return [_resolve_env(item, (*loc, index), env) for index, item in enumerate(value)]
    return value


def _names(names: Iterable[str], shown: int = 10) -> str:
    """Names for an error message: the first `shown`, each cut when long."""
    listed = list(names)
    text = ", ".join(name if len(name) <= 40 else quoted(name, 40) for name in listed[:shown])
    return text + (f", ... ({len(listed):,} in all)" if len(listed) > shown else "")


def _format_loc(loc: Sequence[object]) -> str:
    """A key path as the user reads it: `flows.f.tags.exclude[0]`."""
    kept = [part for part in loc if not str(part).startswith("function-")]
    parts = [str(part) if len(str(part)) <= 40 else quoted(part, 40) for part in kept]
    # pydantic names the branch of a discriminated union (a sink's type, a flow's kind)
    # after the entry's name: not a key the user wrote.
    if len(parts) > 2 and parts[2] in _UNION_TAGS.get(parts[0], ()):
        del parts[2], kept[2]
    text = ""
    for part, raw in zip(parts, kept, strict=True):
        text += f"[{part}]" if isinstance(raw, int) else f".{part}" if text else part
    return text


def _other_kind(loc: Sequence[object]) -> str | None:
    """For a key that a flow's kind does not take (`flows.<name>.<kind>.<key>`): the
    other kind of flow that takes it, if one does."""
    if len(loc) != 4 or loc[0] != "flows" or loc[2] not in FLOW_MODELS:
        return None
    others = (kind for kind, model in FLOW_MODELS.items() if kind != loc[2])
    return next((kind for kind in others if loc[3] in FLOW_MODELS[kind].model_fields), None)


def _message(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    loc = tuple(error.get("loc", ()))
    ctx = error.get("ctx") or {}
    value = error.get("input")
    if kind == "extra_forbidden":
        other = _other_kind(loc)
        if other:
            return f"belongs to {other} flows; this flow's kind is {loc[2]}"
        return "unknown key" + did_you_mean(str(loc[-1]), keys_at(Config, loc[:-1]))
    if kind == "missing":
        return "is required"
    if kind == "literal_error" and isinstance(value, str | int):
        return f"{quoted(value)} is not one of {ctx.get('expected', '')}"
    if kind == "union_tag_not_found" and loc[:1] == ("flows",):
        return "must be a mapping of flow keys (node, kind, start, sinks, ...)"
    if kind == "union_tag_invalid":
        return f"type must be {', '.join(SINK_TYPES[:-1])} or {SINK_TYPES[-1]}"
    if kind == "union_tag_not_found":
        return f"type is required ({', '.join(SINK_TYPES[:-1])} or {SINK_TYPES[-1]})"
    text = str(error.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        text = text.removeprefix(prefix)
    return text


def _problem(error: Mapping[str, Any]) -> tuple[Sequence[object], str]:
    """Where in the file a validation error is, and what is wrong there."""
    loc = tuple(error["loc"])
    inner = (error.get("ctx") or {}).get("error")
    if isinstance(inner, _KeyedError):
        return inner.loc, str(inner)
    if error.get("type") == "union_tag_invalid" and loc[:1] == ("flows",):
        kind = error["input"].get("kind")
        return (*loc, "kind"), f"{quoted(kind)} is not one of {', '.join(FLOW_MODELS)}"
    return loc, _message(error)


def _first(errors: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The error to name: a key of the other kind of flow first (it explains the rest, a
    missing `tags:` among them), else pydantic's first."""
    for error in errors:
        if error.get("type") == "extra_forbidden" and _other_kind(error["loc"]):
            return error
    return errors[0]


def parse_config(
    data: object, *, source: str = DEFAULT_CONFIG, env: Mapping[str, str] | None = None
) -> Config:
    """Validate an already-loaded YAML document; one-line ConfigError on any problem."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the file must hold a mapping with nodes, sinks and flows")
    environment = os.environ if env is None else env
    try:
        resolved = _resolve_env(data, (), environment)
        return Config.model_validate(resolved)
    except _KeyedError as exc:
        raise ConfigError(f"{source}: {_format_loc(exc.loc)}: {exc}") from None
    except ValidationError as exc:
        loc, message = _problem(_first(exc.errors()))
        where = _format_loc(loc)
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        prefix = f"{source}: {where}: " if where else f"{source}: "
        raise ConfigError(prefix + message + more) from None


def load_config(path: str | Path = DEFAULT_CONFIG, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate flows.yaml; every problem is a one-line ConfigError.

    The document is bounded (size, depth, aliases) and checked for duplicate keys before
    it is built (`pipelines/config/file.py`), and its top-level keys before `${VAR}`
    references are resolved, so a hostile file fails in bounded time and memory.
    """
    file = Path(path)
    source = file.name if file.parent == Path() else str(file)
    source = source if len(source) <= 200 else quoted(source, 200)
    data = _document(_text(file, source), source)
    return parse_config(data, source=source, env=env)


def _text(file: Path, source: str) -> str:
    """The file's text; a file that is missing, unreadable or not UTF-8 is a ConfigError."""
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{source}: no such file (`historian init` writes a starter one)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start:,})") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from None


def _document(text: str, source: str) -> object:
    """The YAML document, bounded (`load_document`); every problem is a ConfigError."""
    try:
        return load_document(text, top_keys=set(Config.model_fields))
    except DocumentError as exc:
        line = f"line {exc.line}" if exc.line is not None else ""
        where = f"{exc.where} ({line})" if exc.where and line else exc.where or line
        raise ConfigError(f"{source}: {where}: {exc}" if where else f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{source}: {where}YAML syntax error: {problem}") from None
    except (ValueError, OverflowError) as exc:  # a value YAML cannot build (a 5,000-digit int)
        raise ConfigError(f"{source}: a value cannot be read: {one_line(exc)}") from None


def flow_dataset(name: str, flow: FlowConfig) -> str:
    return flow.dataset or name
