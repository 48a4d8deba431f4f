"""Options of history and alarm queries, as typed values rather than loose dicts.

The client turns these into the spec's dot-notation query parameters
(`options.mode`, `options.filter.path`, ...); the simulator parses the same names back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["raw", "filter", "delta", "aggregated"]
Method = Literal["first", "last", "min", "max", "avg", "delta", "stddev"]
MODES: tuple[str, ...] = ("raw", "filter", "delta", "aggregated")
METHODS: tuple[str, ...] = ("first", "last", "min", "max", "avg", "delta", "stddev")


@dataclass(frozen=True)
class HistoryOptions:
    """Shared history options of `tag?cmd=history|historyMany|historyFilter` (spec: Tag)."""

    mode: Mode = "raw"
    method: Method | None = None
    interval_ms: int | None = None
    deadband: float | str | None = None
    invalid_as_null: bool | None = None
    limit: int | None = None
    remote_node: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.method is not None and self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.mode == "aggregated" and (self.interval_ms is None or self.interval_ms <= 0):
            raise ValueError("aggregated mode needs a positive interval_ms")
        if self.limit is not None and self.limit <= 0:
            raise ValueError("limit must be positive")

    def query_params(self) -> dict[str, str]:
        """The options as spec query parameters (values as the node reads them)."""
        params: dict[str, str] = {"options.mode": self.mode}
        if self.method is not None:
            params["options.method"] = self.method
        if self.interval_ms is not None:
            params["options.interval"] = str(self.interval_ms)
        if self.deadband is not None:
            params["options.deadband"] = str(self.deadband)
        if self.invalid_as_null is not None:
            params["options.invalidAsNull"] = "true" if self.invalid_as_null else "false"
        if self.limit is not None:
            params["options.limit"] = str(self.limit)
        if self.remote_node is not None:
            params["options.remoteNode"] = _remote_node_param(self.remote_node)
        return params


@dataclass(frozen=True)
class AlarmFilter:
    """Filters of `alarm?cmd=get|count|history` (spec: Alarm)."""

    path_regex: str | None = None
    status: int | None = None
    priority: int | None = None
    min_priority: int | None = None
    max_priority: int | None = None
    recurrent: bool | None = None
    remote_node: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.status is not None and not 0 <= self.status <= 3:
            raise ValueError(f"alarm status {self.status} is not in 0..3")
        for name in ("priority", "min_priority", "max_priority"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= 4:
                raise ValueError(f"alarm {name} {value} is not in 1..4")

    def query_params(self) -> dict[str, str]:
        params: dict[str, str] = {}
        if self.recurrent is not None:
            params["options.recurrent"] = "true" if self.recurrent else "false"
        if self.path_regex is not None:
            params["options.filter.path"] = self.path_regex
        if self.status is not None:
            params["options.filter.status"] = str(self.status)
        if self.priority is not None:
            params["options.filter.priority"] = str(self.priority)
        if self.min_priority is not None:
            params["options.filter.minPriority"] = str(self.min_priority)
        if self.max_priority is not None:
            params["options.filter.maxPriority"] = str(self.max_priority)
        if self.remote_node is not None:
            params["options.remoteNode"] = _remote_node_param(self.remote_node)
        return params


def _remote_node_param(remote: str | tuple[str, ...]) -> str:
    """A single node as is; several as a JSON array (names may hold slashes or commas)."""
    if isinstance(remote, str):
        return remote
    import orjson

    return orjson.dumps(list(remote)).decode()
