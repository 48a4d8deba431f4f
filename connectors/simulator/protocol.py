"""The request side of the simulated interface: answers, errors and parameter parsing.

Parameters come from the query string (GET, dot keys) or a JSON body (POST) and are read
leniently, the way the spec allows: list parameters as a JSON array, a comma-separated
string or a single value; times as ISO 8601 or epoch milliseconds.
"""

from __future__ import annotations

import gc
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

Params = Mapping[str, Any]
_EPOCH = re.compile(r"-?\d+")
_gc_lock = threading.Lock()
_gc_pausing = 0
_gc_was_enabled = False


class RequestError(Exception):
    """A request the node refuses: becomes `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


@dataclass
class Answer:
    """One HTTP answer before it is put on the wire."""

    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Params], Answer]


def json_answer(value: Any) -> Answer:
    """A 200 answer with `value` as JSON."""
    return Answer(body=orjson.dumps(value))


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector (not reference counting) while an answer is built.

    A history answer is millions of row tuples with no cycles among them; with the
    collector on, every answer in the making is scanned again and again. Counted across
    threads: the first one in pauses it, the last one out resumes it (if it was on).
    """
    global _gc_pausing, _gc_was_enabled
    with _gc_lock:
        if _gc_pausing == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausing += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausing -= 1
            if _gc_pausing == 0 and _gc_was_enabled:
                gc.enable()


def error_answer(status: int, message: str) -> Answer:
    """The simulator's error shape (the spec does not show one): `{"error": "..."}`."""
    return Answer(status, orjson.dumps({"error": message}))


def iso_ms(ms: int) -> str:
    """Epoch ms as the node's ISO 8601 strings (`2026-01-01T00:00:00.000Z`)."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def parse_time(value: Any, name: str, *, seconds: bool = False) -> int:
    """`start`/`end` as epoch ms: ISO 8601 (`Z`, an offset, or naive = UTC) or epoch digits,
    read as milliseconds, or as seconds on a node that reads them so (`seconds`: the spec
    does not show the unit of an epoch input)."""
    if value is None or value == "":
        raise RequestError(400, f"{name} is required")
    text = str(value).strip()
    if _EPOCH.fullmatch(text):
        return int(text) * 1000 if seconds else int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise RequestError(400, f"{name} is not ISO 8601 or epoch ms") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def parse_list(value: Any) -> list[str]:
    """A list parameter: JSON array (tried first when it starts with `[`), CSV, or one value."""
    if value is None:
        return []
    if isinstance(value, list):
        return [str(item) for item in value]
    text = str(value)
    if text.startswith("["):
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, list):
            return [str(item) for item in parsed]
    return [part for part in text.split(",") if part != ""]


def parse_bool(value: Any, default: bool = False) -> bool:
    """`true`/`false` (also 1/0, yes/no, JSON booleans); absent or empty -> `default`."""
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


def parse_optional_bool(value: Any) -> bool | None:
    """Like `parse_bool`, but absent stays None (the caller's default applies later)."""
    if value is None or value == "":
        return None
    return parse_bool(value)


def parse_int(value: Any, name: str) -> int | None:
    """An integer parameter; absent or empty -> None."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise RequestError(400, f"{name} is not an integer")
    try:
        return int(str(value))
    except ValueError:
        raise RequestError(400, f"{name} is not an integer") from None


def parse_regex(value: Any, name: str) -> re.Pattern[str] | None:
    """A regex parameter, compiled; an invalid pattern is a 400."""
    if value is None or value == "":
        return None
    try:
        return re.compile(str(value))
    except re.error as exc:
        raise RequestError(400, f"{name} is not a valid regex: {exc}") from None


def required_str(source: Params, name: str) -> str:
    """A mandatory, non-empty string parameter."""
    value = source.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError(400, f"{name} is required")
    return value


def named(source: Params, table: Mapping[str, Any], what: str, key: str = "name") -> str:
    """A mandatory name that must exist in `table` (else 404 naming `what`)."""
    name = required_str(source, key)
    if name not in table:
        raise RequestError(404, f"{what} {name!r} not found")
    return name
