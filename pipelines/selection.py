"""Which tags a flow reads: explicit paths, a group and a regex, or browse patterns.

All three ask the node's `tag?cmd=details` once per run, which both resolves the tag list
(the planner needs it: progress is kept per tag) and yields the tag metadata that becomes
the warehouse's tag dimension. Explicit paths the node does not know are an error naming
the path, not a silent gap.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import pyarrow as pa

from connectors.errors import UnknownTag
from connectors.normalise import parse_tag_details
from connectors.schema import TAG_METADATA_SCHEMA
from pipelines.config import TagSelectionConfig
from pipelines.engine import FilterQuery


class DetailsClient(Protocol):
    def request(
        self,
        operation: str,
        method: str,
        resource: str,
        cmd: str,
        params: Mapping[str, Any] | None = None,
        body: object | None = None,
    ) -> httpx.Response: ...


@dataclass(frozen=True)
class ResolvedTags:
    """The tags of one run, their metadata, and how to fetch them."""

    members: tuple[str, ...]
    metadata: pa.Table
    filter_query: FilterQuery | None


def _details(
    client: DetailsClient, node: str, path: str, *, regex: str | None, recurrent: bool
) -> pa.Table:
    params: dict[str, Any] = {"path": path, "options.recurrent": recurrent}
    if regex is not None:
        params["options.filter"] = regex
    response = client.request("tag.details", "GET", "tag", "details", params=params)
    return parse_tag_details(response.content, node, int(time.time() * 1000))


def _parent(path: str) -> str:
    head = path.rstrip("/").rsplit("/", 1)[0]
    return head + "/" if head else "/"


def resolve_tags(
    client: DetailsClient, node: str, selection: TagSelectionConfig, *, where: str
) -> ResolvedTags:
    """Resolve a flow's tag selection against the node; `where` names the config key."""
    if selection.paths is not None:
        wanted = list(selection.paths)
        tables = []
        for parent in sorted({_parent(path) for path in wanted}):
            try:
                tables.append(_details(client, node, parent, regex=None, recurrent=False))
            except UnknownTag:
                continue  # the group does not exist: its paths are reported missing below
        metadata = pa.concat_tables(tables) if tables else TAG_METADATA_SCHEMA.empty_table()
        known = set(metadata.column("tag").to_pylist())
        missing = [path for path in wanted if path not in known]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise UnknownTag(
                "tag.details", f"{where}: tag {missing[0]!r} not found on node {node}{more}"
            )
        metadata = _only(metadata, wanted)
        return ResolvedTags(tuple(wanted), metadata, None)
    if selection.group is not None:
        group = selection.group if selection.group.endswith("/") else selection.group + "/"
        metadata = _details(
            client, node, group, regex=selection.regex, recurrent=selection.recurrent
        )
        members = _sorted_members(metadata)
        if selection.regex is not None:
            pattern = re.compile(selection.regex)
            members = tuple(tag for tag in members if pattern.search(tag))
        if not members:
            raise UnknownTag("tag.details", f"{where}: no tag matches in group {group!r}")
        query = FilterQuery(group=group, regex=selection.regex, recurrent=selection.recurrent)
        return ResolvedTags(members, _only(metadata, members), query)
    assert selection.browse is not None
    metadata = _details(client, node, selection.browse, regex=None, recurrent=True)
    include = [re.compile(p) for p in selection.include]
    exclude = [re.compile(p) for p in selection.exclude]
    members = tuple(
        tag
        for tag in _sorted_members(metadata)
        if (not include or any(p.search(tag) for p in include))
        and not any(p.search(tag) for p in exclude)
    )
    if not members:
        raise UnknownTag(
            "tag.details", f"{where}: no tag under {selection.browse!r} matches include/exclude"
        )
    return ResolvedTags(members, _only(metadata, members), None)


def _sorted_members(metadata: pa.Table) -> tuple[str, ...]:
    return tuple(sorted(set(metadata.column("tag").to_pylist())))


def _only(metadata: pa.Table, members: tuple[str, ...] | list[str]) -> pa.Table:
    wanted = set(members)
    mask = [tag in wanted for tag in metadata.column("tag").to_pylist()]
    table = metadata.filter(pa.array(mask, type=pa.bool_()))
    # One row per tag even when a node lists a tag twice.
    seen: set[str] = set()
    keep = []
    for tag in table.column("tag").to_pylist():
        keep.append(tag not in seen)
        seen.add(tag)
    return table.filter(pa.array(keep, type=pa.bool_()))
