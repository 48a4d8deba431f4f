"""Which tags a flow reads: explicit paths, a group and a regex, or browse patterns.

All three ask the node's `tag?cmd=details` once per run, which both resolves the tag list
(the planner needs it: progress is kept per tag) and yields the tag metadata that becomes
the warehouse's tag dimension. Explicit paths the node does not know are an error naming
the path, not a silent gap. The paths are read at once (msgspec, skipping the
configurations); the metadata table is built only when a flow writes it.

The resolved list is not cached between runs: with the node answering from memory, 10,000
paths in 6 groups resolve in ~0.1 s, and a cache would still have to ask the node to
refuse an unknown path and to notice a deleted tag.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

import httpx
import pyarrow as pa

from connectors.errors import UnknownTag, quoted
from connectors.normalise import parse_tag_details, tag_details_paths
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
class _Answer:
    """One details answer as received; its metadata is read only when it is wanted."""

    body: bytes
    received_ms: int


class ResolvedTags:
    """The tags of one run, how to fetch them, and (built on first use) their metadata."""

    def __init__(
        self,
        members: tuple[str, ...],
        filter_query: FilterQuery | None,
        node: str = "",
        answers: tuple[_Answer, ...] = (),
    ) -> None:
        self.members = members
        self.filter_query = filter_query
        self._node = node
        self._answers = answers

    @cached_property
    def metadata(self) -> pa.Table:
        """TAG_METADATA_SCHEMA rows of the members, one per tag, in answer order."""
        tables = [
            parse_tag_details(answer.body, self._node, answer.received_ms)
            for answer in self._answers
        ]
        metadata = pa.concat_tables(tables) if tables else TAG_METADATA_SCHEMA.empty_table()
        return _only(metadata, self.members)


def _details(
    client: DetailsClient, path: str, *, regex: str | None, recurrent: bool
) -> tuple[list[str], _Answer]:
    """The tag paths of one details answer, and the answer (its metadata is read later)."""
    params: dict[str, Any] = {"path": path, "options.recurrent": recurrent}
    if regex is not None:
        params["options.filter"] = regex
    response = client.request("tag.details", "GET", "tag", "details", params=params)
    body = response.content
    return tag_details_paths(body), _Answer(body, int(time.time() * 1000))


def _parent(path: str) -> str:
    head = path.rstrip("/").rsplit("/", 1)[0]
    return head + "/" if head else "/"


def resolve_tags(
    client: DetailsClient, node: str, selection: TagSelectionConfig, *, where: str
) -> ResolvedTags:
    """Resolve a flow's tag selection against the node; `where` names the config key."""
    if selection.paths is not None:
        wanted = list(selection.paths)
        known: set[str] = set()
        answers = []
        for parent in sorted({_parent(path) for path in wanted}):
            try:
                paths, answer = _details(client, parent, regex=None, recurrent=False)
            except UnknownTag:
                continue  # the group does not exist: its paths are reported missing below
            known.update(paths)
            answers.append(answer)
        missing = [path for path in wanted if path not in known]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise UnknownTag(
                "tag.details", f"{where}: tag {quoted(missing[0])} not found on node {node}{more}"
            )
        return ResolvedTags(tuple(wanted), None, node, tuple(answers))
    if selection.group is not None:
        group = selection.group if selection.group.endswith("/") else selection.group + "/"
        paths, answer = _details(
            client, group, regex=selection.regex, recurrent=selection.recurrent
        )
        members = tuple(sorted(set(paths)))
        if selection.regex is not None:
            pattern = re.compile(selection.regex)
            members = tuple(tag for tag in members if pattern.search(tag))
        if not members:
            raise UnknownTag("tag.details", f"{where}: no tag matches in group {quoted(group)}")
        query = FilterQuery(group=group, regex=selection.regex, recurrent=selection.recurrent)
        return ResolvedTags(members, query, node, (answer,))
    assert selection.browse is not None
    paths, answer = _details(client, selection.browse, regex=None, recurrent=True)
    include = [re.compile(p) for p in selection.include]
    exclude = [re.compile(p) for p in selection.exclude]
    members = tuple(
        tag
        for tag in sorted(set(paths))
        if (not include or any(p.search(tag) for p in include))
        and not any(p.search(tag) for p in exclude)
    )
    if not members:
        raise UnknownTag(
            "tag.details",
            f"{where}: no tag under {quoted(selection.browse)} matches include/exclude",
        )
    return ResolvedTags(members, None, node, (answer,))


def _only(metadata: pa.Table, members: tuple[str, ...]) -> pa.Table:
    """The rows of `members`, the first of each when a node lists a tag twice."""
    tags = metadata.column("tag").to_pylist()
    wanted = set(members)
    seen: set[str] = set()
    keep = []
    for tag in tags:
        keep.append(tag in wanted and tag not in seen)
        seen.add(tag)
    return metadata.filter(pa.array(keep, type=pa.bool_()))
