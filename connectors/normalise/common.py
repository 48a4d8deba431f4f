"""What the three readings of answers share: the collector paused around bulk parsing,
JSON that fails as `MalformedAnswer`, where an error points (tag, chunk), and values as
error messages and text columns show them.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from connectors.errors import MalformedAnswer

INT16_MIN, INT16_MAX = -32768, 32767
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector (not reference counting) around bulk parsing."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def where_of(subject: str | None, chunk_label: str) -> str | None:
    if subject is None:
        return chunk_label or None
    return subject + (f" in {chunk_label}" if chunk_label else "")


def load_json(body: bytes | str, operation: str, chunk_label: str) -> Any:
    """orjson.loads that reports a non-JSON or truncated body as MalformedAnswer."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedAnswer(
            operation,
            f"answer is not JSON ({exc.msg})",
            where=where_of(None, chunk_label),
            body=body,
        ) from None


def json_type(item: Any) -> str:
    """The JSON type of a parsed item with its article, for messages: "an array"."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    return names.get(type(item), "null" if item is None else "a number")


def short_text(item: Any) -> str:
    """A value for an error message; never raises (integers beyond 64 bits included)."""
    try:
        text = orjson.dumps(item).decode() if item is not None else "null"
    except TypeError:
        text = repr(item)
    return text if len(text) <= 40 else text[:37] + "..."


def json_text(value: Any) -> str | None:
    """JSON text with sorted keys (stable across runs), or None for null."""
    if value is None:
        return None
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def text_of(value: Any) -> str | None:
    """Strings as they are, other values as JSON text."""
    if value is None or isinstance(value, str):
        return value
    return json_text(value)
