"""Holds: windows of tags behind a link that has not delivered them yet.

A remote tag (details `remote` non-null) reaches the node over a link with
store-and-forward: while the link is offline, or back but still draining its buffer,
history lacks samples that will arrive later stamped in the past. A window read then
is not proved complete, so it is *held*: left out of the chunk's scope (its rows not
written, never marked complete) and recorded as the progress member `held:<link>:<tag>`
(`pipelines.state.held_member`), in the same atomic write as the chunk's other rows, the
way a tag the node left out is recorded missing. The tag's watermark stops at the first
held window, so the next run reads the held windows again first, whatever the look-back.
A window held longer than the flow's `hold_max` after its end is recorded missing
instead (`historian state` lists it; later runs still ask for it).

What the node shows, and how it is read (docs/node-behaviour.md, "Links"):

* `link?cmd=get`: a link is *offline* when `online` is false, *draining* when a side's
  `sf.paused` is true or a number under `sf` named like a backlog is above 0; a link that
  shows `online` and no `sf` is taken as draining for the flow's `lookback` after its
  tags' `status.ts` says it came back;
* a tag whose `status.value` is 0 is offline since `status.ts`, whatever the link says;
* the `remote` marker's shape is not shown: a string, an object, `true`. Any non-null
  marker is remote. A marker naming a link (the string, or an object's `link`, `name` or
  `node`) maps the tag to it; otherwise the tag is held while any link is unhealthy.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from connectors import models
from connectors.admin import NodeAdmin
from connectors.answers import Requester
from connectors.errors import FatalNodeError, RetriesExhausted, one_line
from connectors.schema import one_array
from connectors.timewindow import Window, iso_utc
from pipelines.config.models import TagHistoryFlow
from pipelines.core.engine import ChunkResult
from pipelines.state import missing_member
from sinks.base import held_member

log = logging.getLogger("historian.holds")

# The link of a tag whose marker names none the node lists.
ANY_LINK = "some link"
_BACKLOG_WORDS = ("backlog", "pending", "buffer", "queue")
# A details answer with no non-null `remote` marker has no remote tag: not parsed again.
_REMOTE = re.compile(rb'"remote"\s*:\s*(?!null)')


@dataclass(frozen=True)
class LinkHealth:
    """One link as `link?cmd=get` shows it."""

    name: str
    online: bool | None
    draining: str | None  # why it is taken as draining (`sf.backlog 84`), or None
    shows_sf: bool


@dataclass(frozen=True)
class TagLink:
    """A remote tag: the link its marker names (None: not known) and its status."""

    link: str | None
    online: bool | None
    status_at: datetime | None


@dataclass(frozen=True)
class Hold:
    """Why a tag's windows are held, and from when (None: every window read now)."""

    link: str
    reason: str
    since: datetime | None

    def holds(self, window: Window) -> bool:
        return self.since is None or window.end > self.since


def link_health(links: models.Links) -> dict[str, LinkHealth]:
    """The node's links by name, read tolerantly (fields may be absent)."""
    found: dict[str, LinkHealth] = {}
    for key, link in links.links.items():
        name = link.name or key
        sides = [side for side in (link.local, link.remote) if side is not None]
        sfs = [side.sf for side in sides if side.sf]
        found[name] = LinkHealth(name, link.online, _draining(sfs), bool(sfs))
    return found


def _draining(sfs: Iterable[Mapping[str, Any]]) -> str | None:
    for sf in sfs:
        if sf.get("enabled") is False:
            continue
        if sf.get("paused") is True:
            return "sf.paused"
        for key, value in sf.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and value > 0 and any(word in key.lower() for word in _BACKLOG_WORDS):
                return f"sf.{key} {value:g}"
    return None


def tag_links(bodies: Iterable[tuple[bytes, str | None]]) -> dict[str, TagLink]:
    """The remote tags of `tag?cmd=details` answers (body, group of a non-recursive
    answer), by full path."""
    found: dict[str, TagLink] = {}
    for body, group in bodies:
        if not _REMOTE.search(body):
            continue
        for name, entry in _remote_entries(body):
            path = _path(str(name), entry.get("fullPath"), group)
            found.setdefault(path, _tag_link(entry))
    return found


class _Entry(msgspec.Struct):
    """The fields of a details entry a hold needs (the rest, `config` above all, skipped
    unread: a 10,000-tag answer is decoded in a fraction of a full parse)."""

    remote: Any = None
    fullPath: Any = None  # the node's spelling
    status: Any = None


class _Details(msgspec.Struct):
    tags: dict[str, _Entry] | None = None


_DETAILS = msgspec.json.Decoder(_Details)


def _remote_entries(body: bytes) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, entry) of each remote tag of a details answer; an answer of another shape
    is read whole, and one that is not JSON gives none (the selection read it already)."""
    try:
        tags: Mapping[str, Any] = {
            name: {"remote": e.remote, "fullPath": e.fullPath, "status": e.status}
            for name, e in (_DETAILS.decode(body).tags or {}).items()
        }
    except (msgspec.DecodeError, msgspec.ValidationError):
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            return []
        whole = parsed.get("tags") if isinstance(parsed, dict) else None
        if not isinstance(whole, Mapping):
            return []
        tags = whole
    return [
        (name, entry)
        for name, entry in tags.items()
        if isinstance(entry, Mapping) and entry.get("remote") is not None
    ]


def _path(name: str, full_path: Any, group: str | None) -> str:
    if isinstance(full_path, str) and full_path:
        return full_path
    return group + name if group is not None and not name.startswith("/") else name


def _tag_link(entry: Mapping[str, Any]) -> TagLink:
    marker = entry["remote"]
    link: str | None = marker if isinstance(marker, str) and marker else None
    if isinstance(marker, Mapping):
        named = [marker.get(key) for key in ("link", "name", "node")]
        link = next((n for n in named if isinstance(n, str) and n), None)
    status = entry.get("status")
    value = status.get("value") if isinstance(status, Mapping) else None
    ts = status.get("ts") if isinstance(status, Mapping) else None
    online = None if not isinstance(value, int | bool) else bool(value)
    at = _moment(ts)
    return TagLink(link, online, at)


def _moment(ts: Any) -> datetime | None:
    if not isinstance(ts, int | float) or isinstance(ts, bool) or ts <= 0:
        return None
    try:
        return datetime.fromtimestamp(ts / 1000, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def holds_of(
    tags: Mapping[str, TagLink],
    links: Mapping[str, LinkHealth],
    *,
    now: datetime,
    lookback: timedelta,
) -> dict[str, Hold]:
    """Per remote tag whose data may still arrive, why and from when it is held."""
    unhealthy = {
        name: hold
        for name, link in links.items()
        if (hold := _link_hold(link, [t for t in tags.values() if t.link == name], now, lookback))
    }
    holds: dict[str, Hold] = {}
    for path, tag in tags.items():
        hold = _tag_hold(tag, links, unhealthy)
        if hold is not None:
            holds[path] = hold
    return holds


def _tag_hold(
    tag: TagLink, links: Mapping[str, LinkHealth], unhealthy: Mapping[str, Hold]
) -> Hold | None:
    if tag.link is not None and tag.link in unhealthy:
        return unhealthy[tag.link]
    if tag.online is False:
        since = f" since {iso_utc(tag.status_at)}" if tag.status_at else ""
        return Hold(tag.link or ANY_LINK, f"tag offline{since}", tag.status_at)
    if tag.link is not None and tag.link in links:
        return None
    if unhealthy:  # the marker names no link the node lists: any link may carry it
        name, hold = next(iter(sorted(unhealthy.items())))
        return Hold(name, hold.reason, hold.since)
    return None


def _link_hold(
    link: LinkHealth, tags: list[TagLink], now: datetime, lookback: timedelta
) -> Hold | None:
    """Why a link's tags are held, or None when the link shows it has delivered."""
    if link.online is False:
        since = [t.status_at for t in tags if t.online is False and t.status_at is not None]
        start = min(since) if since else None
        return Hold(link.name, "offline" + (f" since {iso_utc(start)}" if start else ""), start)
    if link.draining is not None:
        return Hold(link.name, f"online, still draining ({link.draining})", None)
    back = [t.status_at for t in tags if t.online and t.status_at is not None]
    if link.online and not link.shows_sf and back and now < max(back) + lookback:
        return Hold(
            link.name,
            f"back online at {iso_utc(max(back))}; the node shows no store-and-forward "
            f"state, so it is taken as draining for the look-back ({lookback})",
            None,
        )
    return None


@dataclass(frozen=True)
class HeldChunk:
    """A chunk's scope members once holds are applied, and the tags they took out."""

    members: tuple[str, ...]
    held: tuple[str, ...]
    expired: tuple[str, ...]


def apply_holds(
    members: tuple[str, ...],
    window: Window,
    holds: Mapping[str, Hold],
    *,
    now: datetime,
    hold_max: timedelta,
) -> HeldChunk | None:
    """The scope of a chunk whose members include held tags: those tags left out and
    recorded held there (missing, for a window that ended more than `hold_max` ago);
    None when no member is held in `window`."""
    taken = [m for m in members if m in holds and holds[m].holds(window)]
    if not taken:
        return None
    expired = tuple(m for m in taken if window.end + hold_max <= now)
    held = tuple(m for m in taken if m not in expired)
    gone = set(taken)
    kept = tuple(m for m in members if m not in gone)
    records = tuple(held_member(m, holds[m].link) for m in held)
    records += tuple(missing_member(m) for m in expired)
    return HeldChunk(kept + records, held, expired)


def without_tags(table: pa.Table, column: str, tags: Iterable[str]) -> pa.Table:
    """`table` without the rows of `tags` (by the tag column `column`)."""
    keys = one_array(table.column(column))
    if pa.types.is_dictionary(keys.type):
        keys = keys.dictionary_decode()
    drop = pc.is_in(keys, value_set=pa.array(list(tags), type=keys.type))
    return table.filter(pc.invert(pc.fill_null(drop, False)))


class Holds:
    """A run's holds: per remote tag, why and from when its windows are held."""

    def __init__(
        self,
        tags: Mapping[str, Hold] | None = None,
        *,
        now: datetime | None = None,
        hold_max: timedelta = timedelta(0),
    ) -> None:
        self.tags = dict(tags or {})
        self.now = now or datetime.now(UTC)
        self.hold_max = hold_max

    def reasons(self) -> dict[str, str]:
        """One reason per link (`offline since ...`), for the summary."""
        return {hold.link: hold.reason for hold in self.tags.values()}

    def take_out(self, result: ChunkResult, column: str) -> tuple[ChunkResult, tuple[str, ...]]:
        """`result` without the tags held in its window (their rows not written, their
        window recorded held, or missing past `hold_max`), and the tags held."""
        if not self.tags:
            return result, ()
        chunk = result.chunk
        out = apply_holds(
            chunk.members, chunk.window, self.tags, now=self.now, hold_max=self.hold_max
        )
        if out is None:
            return result, ()
        table = without_tags(result.table, column, out.held + out.expired)
        kept = replace(
            result,
            chunk=replace(chunk, members=out.members),
            rows=table,
            rows_fetched=table.num_rows,
            missing=result.missing + out.expired,
        )
        return kept, out.held


def read_holds(
    client: Requester,
    answers: Iterable[tuple[bytes, str | None]],
    flow: TagHistoryFlow,
    remote_node: str | tuple[str, ...] | None,
    *,
    now: datetime,
) -> tuple[Holds, str | None]:
    """The holds of a run's tags (from their details answers and `link?cmd=get`, asked
    only when some tag is remote), and a line when the links could not be read (tags'
    own status is then all there is)."""
    tags = tag_links(answers)
    if not tags:
        return Holds(), None
    note = None
    try:
        links = link_health(NodeAdmin(client).link_get(remote_node))
    except RetriesExhausted:
        raise  # the node is not answering at all: nothing else will work either
    except FatalNodeError as exc:
        links = {}
        note = f"links not read ({one_line(exc)}): remote tags held only on their own status"
        log.warning("%s", note)
    holds = holds_of(tags, links, now=now, lookback=flow.lookback)
    return Holds(holds, now=now, hold_max=flow.hold_max), note
