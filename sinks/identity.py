"""A dataset's identity: the settings every chunk written to it must share.

A dataset holds one kind of rows extracted one way (mode, method, interval, deadband...):
rows extracted otherwise never land silently beside them. The node is not part of it - a
dataset holds many nodes, and `node` is a column of its rows - but datasets written by
earlier versions recorded it among their attrs: it is ignored when comparing, so they
keep working and take other nodes' rows.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

# Attrs recorded by earlier versions that no longer make a dataset's identity.
NOT_IDENTITY = frozenset({"node"})


def json_value(value: object) -> object:
    """A value as it reads back from JSON (stored attrs are compared that way)."""
    return orjson.loads(orjson.dumps(value, default=str))


def identity(attrs: Mapping[str, object]) -> dict[str, object]:
    """The attrs that make a dataset's identity, as they read back from JSON, sorted."""
    return {
        key: json_value(value) for key, value in sorted(attrs.items()) if key not in NOT_IDENTITY
    }


def differences(
    stored_kind: object, stored: Mapping[str, object], kind: str, wanted: Mapping[str, object]
) -> list[str]:
    """How a write (`kind`, attrs `wanted`) differs from a dataset's stored facts, in words
    ("mode: stored 'raw', now 'interpolated'"); empty when it agrees."""
    found = []
    if stored_kind != kind:
        found.append(f"kind: stored {stored_kind!r}, now {kind!r}")
    before, now = identity(stored), identity(wanted)
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            found.append(f"{key}: stored {before.get(key)!r}, now {now.get(key)!r}")
    return found
