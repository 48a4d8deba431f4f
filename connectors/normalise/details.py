"""Tag details answers -> TAG_METADATA_SCHEMA rows, and the tag paths alone.

The spec keys `tag?cmd=details` by tag name; a row's tag is its `fullPath` (pipelines/
selection.py explains why names alone cannot key a run's tags).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from connectors.errors import MalformedAnswer
from connectors.normalise.common import (
    gc_paused,
    json_text,
    load_json,
    text_of,
)
from connectors.schema import (
    TAG_METADATA_SCHEMA,
    TS_TYPE,
)


def _dig(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]... or None when any level is missing or not an object."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _bool_or_none(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _entry_path(name: str, full_path: Any, group: str | None) -> Any:
    """A details entry's tag path: its `fullPath`; without one, the key when it is a path,
    else the key as a name in `group` (a group's own details: names are unique there)."""
    if full_path:
        return full_path
    if group is not None and not name.startswith("/"):
        return group + name
    return name


def parse_tag_details(
    body_or_obj: bytes | str | Mapping[str, Any],
    node: str,
    updated_at_ms: int,
    *,
    group: str | None = None,
) -> pa.Table:
    """A `tag?cmd=details` answer as TAG_METADATA_SCHEMA rows, one per tag (by fullPath).

    `tags` is keyed by tag name (or path, on some nodes); the row's tag is `fullPath`
    (without one: see `_entry_path`; `group` names the group a non-recursive answer is of).
    `config` keeps the whole tag configuration as JSON text (sorted keys). Built column by
    column with the collector paused: a run that names 10,000 tags reads 10,000 entries.
    """
    operation = "tag.details"
    with gc_paused():
        if isinstance(body_or_obj, bytes | str):
            answer: Any = load_json(body_or_obj, operation, "")
        else:
            answer = body_or_obj
        if not isinstance(answer, Mapping):
            raise MalformedAnswer(operation, "answer is not an object", where="tag details")
        tags = answer.get("tags")
        if tags is None:
            tags = {}
        if not isinstance(tags, Mapping):
            raise MalformedAnswer(operation, "tags is not an object", where="tag details")
        return _details_table(tags, node, updated_at_ms, group)


def _details_table(
    tags: Mapping[str, Any], node: str, updated_at_ms: int, group: str | None = None
) -> pa.Table:
    """TAG_METADATA_SCHEMA columns of the `tags` object of a details answer."""
    operation = "tag.details"
    columns: list[list[Any]] = [[] for _ in range(len(TAG_METADATA_SCHEMA) - 2)]
    (path_c, descr_c, type_c, number_c, units_c, format_c, deadband_c, access_c) = columns[:8]
    (enabled_c, mode_c, hist_deadband_c, views_c, config_c) = columns[8:]
    for name, entry in tags.items():
        if not isinstance(entry, Mapping):
            raise MalformedAnswer(operation, "a tag entry is not an object", where=f"tag {name!r}")
        path = _entry_path(name, entry.get("fullPath"), group)
        if not isinstance(path, str):
            raise MalformedAnswer(operation, "fullPath is not a string", where=f"tag {name!r}")
        path_c.append(path)
        config = entry.get("config")
        if not isinstance(config, Mapping):
            for column in columns[1:12]:
                column.append(None)
            config_c.append(json_text(config) if config else None)
            continue
        descr_c.append(text_of(config.get("description")))
        type_c.append(text_of(config.get("type")))
        number_c.append(text_of(config.get("numberType")))
        units_c.append(text_of(config.get("engUnits")))
        format_c.append(text_of(config.get("format")))
        deadband_c.append(text_of(config.get("deadband")))
        access_c.append(text_of(config.get("clientAccess")))
        history = _dig(config, "extensions", "history")
        enabled_c.append(_bool_or_none(_dig(history, "enabled")))
        mode_c.append(text_of(_dig(history, "config", "mode")))
        hist_deadband_c.append(text_of(_dig(history, "config", "deadband")))
        views_c.append(json_text(config.get("views")))
        config_c.append(json_text(config) if config else None)
    n = len(path_c)
    arrays = [pa.array([node] * n, type=pa.string())]
    fields = list(TAG_METADATA_SCHEMA)[1:-1]
    arrays.extend(
        pa.array(values, type=field.type) for field, values in zip(fields, columns, strict=True)
    )
    arrays.append(pa.array(np.full(n, updated_at_ms, dtype=np.int64)).cast(TS_TYPE))
    return pa.Table.from_arrays(arrays, schema=TAG_METADATA_SCHEMA)


class _DetailsEntry(msgspec.Struct, rename={"full_path": "fullPath"}):
    full_path: Any = None


class _DetailsConfig(msgspec.Struct):
    type: Any = None


class _TypedEntry(msgspec.Struct, rename={"full_path": "fullPath"}):
    full_path: Any = None
    config: _DetailsConfig | None = None


class _TypedAnswer(msgspec.Struct):
    tags: dict[str, _TypedEntry] | None = None


_TYPED_DECODER = msgspec.json.Decoder(_TypedAnswer)


class _DetailsAnswer(msgspec.Struct):
    tags: dict[str, _DetailsEntry] | None = None


_DETAILS_DECODER = msgspec.json.Decoder(_DetailsAnswer)


def tag_details_paths(body: bytes | str, *, group: str | None = None) -> list[str]:
    """The tag paths of a `tag?cmd=details` answer, as `parse_tag_details` names them.

    Reads the paths only (configurations are skipped, not built): resolving a run's
    10,000 tags needs their names, not their metadata, unless metadata is written.
    """
    operation = "tag.details"
    try:
        answer = _DETAILS_DECODER.decode(body)
    except msgspec.ValidationError:
        parse_tag_details(body, "", 0)  # says what is wrong, the way the full reading does
        raise MalformedAnswer(operation, "unexpected shape", where="tag details") from None
    except msgspec.DecodeError as exc:
        load_json(body, operation, "")  # not JSON: reported as such
        raise MalformedAnswer(operation, f"answer is not JSON ({exc})", body=body) from None
    paths: list[str] = []
    for name, entry in (answer.tags or {}).items():
        path = _entry_path(name, entry.full_path, group)
        if not isinstance(path, str):
            raise MalformedAnswer(operation, "fullPath is not a string", where=f"tag {name!r}")
        paths.append(path)
    return paths


def tag_details_paths_and_types(
    body: bytes | str, *, group: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """`tag_details_paths`, and each tag's configured type (`config.type`, text) where the
    answer says one, read in the same pass: the fetcher puts values in the column of their
    tag's type (normalise/typed.py) without building the metadata. An answer whose
    configurations are not objects gives its paths and no types."""
    try:
        answer = _TYPED_DECODER.decode(body)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return tag_details_paths(body, group=group), {}
    paths: list[str] = []
    types: dict[str, str] = {}
    for name, entry in (answer.tags or {}).items():
        path = _entry_path(name, entry.full_path, group)
        if not isinstance(path, str):
            raise MalformedAnswer("tag.details", "fullPath is not a string", where=f"tag {name!r}")
        paths.append(path)
        kind = entry.config.type if entry.config is not None else None
        if isinstance(kind, str):
            types[path] = kind
    return paths, types
