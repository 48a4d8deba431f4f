"""Readings of the spec's open points, probed on one node for `historian check`.

A run learns these from the answers it gets (`normalise.stamps`, `pager.CapGuess`,
`pipelines/selection.py`) and refuses what it cannot read; `check` asks a few small
questions of its own so that a user sees, before a run, how the node reads them: the unit
of its row stamps, where it stamps an aggregated bucket, whether browse honours
`recurrent`, and whether details are keyed by name or path. Each probe that cannot tell
(no samples lately, an answer of another shape) leaves its reading unknown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from connectors.client import NodeClient
from connectors.errors import NodeError, one_line
from connectors.normalise.stamps import (
    SECONDS_BELOW,
    BucketStamping,
    StampError,
    ms_of_integers,
    stamps_of_values,
)
from connectors.options import HistoryOptions

log = logging.getLogger("historian.nodes")

# The aggregated probe: ten one-minute buckets an hour back (settled on any node).
_BUCKET = timedelta(minutes=1)
_BUCKETS = 10


@dataclass(frozen=True)
class Readings:
    """What the probes found; None: the node's answers did not tell."""

    timestamp_unit: str | None = None
    bucket_stamping: str | None = None
    browse_recurrent: bool | None = None
    details_keyed_by: str | None = None


def probe_readings(client: NodeClient, tag: str, now: datetime) -> Readings:
    """Ask `tag`'s last hour raw and ten one-minute buckets of it, its group's details and
    the root's browse without recursion (four small requests); a probe the node refuses
    is logged and left unknown."""
    return Readings(
        timestamp_unit=_safely(_stamp_unit, client, tag, now),
        bucket_stamping=_safely(_bucket_stamping, client, tag, now),
        browse_recurrent=_safely(_browse_recurrent, client, tag, now),
        details_keyed_by=_safely(_details_keys, client, tag, now),
    )


def _safely(probe: Any, client: NodeClient, tag: str, now: datetime) -> Any:
    try:
        return probe(client, tag, now)
    except (NodeError, StampError, ValueError, orjson.JSONDecodeError) as exc:
        log.info("probe %s not read (%s)", probe.__name__.strip("_"), one_line(exc))
        return None


def _rows(
    client: NodeClient, tag: str, start: datetime, end: datetime, how: HistoryOptions
) -> list[Any]:
    """The rows the node answers for `tag` alone ([] when it answers none)."""
    answer = orjson.loads(client.tag_history_many_bytes([tag], start, end, how))
    entry = answer.get(tag) if isinstance(answer, dict) else None
    data = entry.get("data") if isinstance(entry, dict) else None
    return [row for row in data if isinstance(row, list) and row] if isinstance(data, list) else []


def _stamp_unit(client: NodeClient, tag: str, now: datetime) -> str | None:
    """The unit of the node's row stamps, as its raw answer for `tag` shows it."""
    rows = _rows(client, tag, now - timedelta(hours=1), now, HistoryOptions(mode="raw", limit=20))
    return describe_unit([row[0] for row in rows]) if rows else None


def describe_unit(stamps: list[Any]) -> str | None:
    """How a list of row stamps is written, in words (None: not one kind)."""
    if all(isinstance(s, str) for s in stamps):
        return "ISO 8601 text"
    if not all(isinstance(s, int | float) and not isinstance(s, bool) for s in stamps):
        return None
    values = np.abs(np.asarray(stamps, dtype=np.float64))
    if values.max() < SECONDS_BELOW:
        whole = all(float(s).is_integer() for s in stamps)
        return "epoch seconds" if whole else "epoch seconds with a fraction"
    if values.max() < SECONDS_BELOW * 1000:
        return "epoch milliseconds"
    return "an unknown unit (beyond epoch milliseconds): answers refused"


def _bucket_stamping(client: NodeClient, tag: str, now: datetime) -> str | None:
    """Where the node stamps a bucket, from ten one-minute buckets of `tag` an hour back."""
    start = datetime.fromtimestamp((int(now.timestamp()) // 60 * 60) - 3600, tz=now.tzinfo)
    end = start + _BUCKET * _BUCKETS
    how = HistoryOptions(mode="aggregated", method="last", interval_ms=60_000)
    rows = _rows(client, tag, start, end, how)
    stamps = stamps_of_values([row[0] for row in rows]) if rows else None
    if stamps is None:
        return None
    ms = ms_of_integers(stamps) if pa.types.is_int64(stamps.type) else stamps
    learned = BucketStamping()
    start_ms = int(start.timestamp() * 1000)
    learned.starts_of(ms.to_numpy(), start_ms, int(end.timestamp() * 1000), 60_000)
    return None if learned.at_end is None else learned.describe()


def _browse_recurrent(client: NodeClient, tag: str, now: datetime) -> bool | None:
    """Whether a browse without `recurrent` keeps to a group's children: the group above
    `tag`'s own, browsed with and without it (None: it holds nothing deeper to tell)."""
    parts = tag.split("/")
    base = "/".join(parts[:-2]) + "/" if len(parts) > 3 else "/"
    deep = _deeper(client.tag_browse_bytes(base, flat=True, recurrent=True), base)
    if not deep:
        return None
    return not _deeper(client.tag_browse_bytes(base, flat=True, recurrent=False), base)


def _deeper(body: bytes, base: str) -> bool | None:
    """Whether a flat listing under `base` holds paths below its children (None: no
    listing)."""
    listing = orjson.loads(body)
    if not isinstance(listing, list):
        return None
    paths = [p for p in map(_path_of, listing) if p is not None and p.startswith(base)]
    return any(p[len(base) :].rstrip("/").count("/") > 0 for p in paths)


def _path_of(item: Any) -> str | None:
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        found = item.get("fullPath", item.get("path"))
        return found if isinstance(found, str) else None
    return None


def _details_keys(client: NodeClient, tag: str, now: datetime) -> str | None:
    """Whether details of `tag`'s group are keyed by the tag's name or its full path."""
    group = tag.rsplit("/", 1)[0] + "/"
    answer = orjson.loads(client.tag_details_bytes(group, recurrent=False))
    tags = answer.get("tags") if isinstance(answer, dict) else None
    if not isinstance(tags, dict):
        return None
    if tag in tags:
        return "full path"
    if tag.rsplit("/", 1)[1] in tags:
        return "tag name (paths read from fullPath)"
    return None
