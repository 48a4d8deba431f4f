"""Query-string encoding exactly as the node documents it.

GET parameters go in the query string with dot keys for nested options
(`options.filter.path`); list parameters are JSON arrays (a comma can occur inside a tag
path, so the comma-separated form is unsafe); times are ISO 8601 UTC with `Z`. Every key
and value is percent-encoded (only RFC 3986 unreserved characters stay as they are), so
no tag path can change the meaning of a URL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from connectors.timewindow import iso_utc

_SAFE = "-._~"
# What `encode_query` writes, and httpx leaves as it is: unreserved characters, escapes,
# the separators; and a resource of letters only.
_ENCODED = re.compile(r"(?:[A-Za-z0-9\-._~=&]|%[0-9A-Fa-f]{2})*")
_RESOURCE = re.compile(r"[A-Za-z]+")


def list_param(values: Iterable[str]) -> str:
    """A list parameter in its JSON-array form."""
    return orjson.dumps(list(values)).decode()


def encode_value(value: object) -> str:
    """One parameter value as the node reads it (before percent-encoding)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value.isoformat()} has no timezone; use UTC")
        return iso_utc(value)
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, Mapping):
        return orjson.dumps(value).decode()
    if isinstance(value, bytes | bytearray):
        raise TypeError("bytes are not a query parameter value; decode them first")
    if isinstance(value, Sequence | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return orjson.dumps([_json_item(item) for item in items]).decode()
    return str(value)


def _json_item(item: object) -> object:
    """A list element as JSON: strings, numbers, booleans and null as is, else its text."""
    if item is None or isinstance(item, str | int | float | bool):
        return item
    if isinstance(item, datetime):
        return encode_value(item)
    return str(item)


def encode_query(params: Mapping[str, object]) -> str:
    """`k=v&...` with every key and value percent-encoded; None values are left out."""
    parts = []
    for key, value in params.items():
        if value is None:
            continue
        parts.append(f"{quote(key, safe=_SAFE)}={quote(encode_value(value), safe=_SAFE)}")
    return "&".join(parts)


def encoded_query_length(params: Mapping[str, object]) -> int:
    """Length of the encoded query: what the planner keeps under a safe URL size."""
    return len(encode_query(params))


def on_base(base: httpx.URL, resource: str, query: str) -> httpx.URL:
    """`base`/`resource`?`query`, the URL httpx would parse from that text, without
    parsing it: httpx checks and re-quotes a URL in Python, character by character, and a
    history query's paths are thousands (about 1.7 ms a request, more than the rest of a
    small chunk's request). Only for what `encode_query` writes (checked by one regular
    expression in C) and where httpx keeps its parts as named tuples; parsed otherwise."""
    reference: Any = getattr(base, "_uri_reference", None)
    if (
        hasattr(reference, "_replace")
        and _RESOURCE.fullmatch(resource)
        and _ENCODED.fullmatch(query)
        and not base.query
    ):
        url = httpx.URL(base)
        path = f"{reference.path.removesuffix('/')}/{resource}"
        url._uri_reference = reference._replace(path=path, query=query)
        return url
    return httpx.URL(f"{str(base).removesuffix('/')}/{resource}?{query}")
