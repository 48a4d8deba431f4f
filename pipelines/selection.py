"""Which tags a flow reads: explicit paths, a group and a regex, or browse patterns.

Patterns are matched here by RE2, in time linear in each path (`pipelines/patterns.py`).

Tags are keyed by full path everywhere. The spec keys `tag?cmd=details` (and `read`) by
tag *name*, and names repeat across groups in real plants (`/Line 1/Temp.PV`,
`/Line 2/Temp.PV`): a recursive details answer over a group can hold only one of them.
So a group or browse selection is listed with what is exact, `tag?cmd=browse` (flat; keyed
by path), and the details answer is checked against that listing: a tag the details
answer lacks (a name collision, or a node that answers details differently) is asked for
in its own group, where names are unique, so its metadata comes too. Without a usable
flat listing, the groups are walked through the tree browse (groups are keyed by name
within their parent, exact) and details are asked per group. Explicit paths are checked
per parent group the same way; one the node does not know is an error naming the config
key and the path, not a silent gap. A selection means what it says whatever the node
answered: a group without `recurrent` is its direct children (a node may recurse anyway),
a group or browse only what is under it.

The paths are read at once (msgspec, skipping the configurations); the metadata table is
built only when a flow writes it. The resolved list is not cached between runs: a cache
would still have to ask the node to refuse an unknown path and to notice a deleted tag.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import orjson
import pyarrow as pa

from connectors.errors import MalformedAnswer, NodeRequestError, UnknownTag, quoted
from connectors.fetch import FilterQuery
from connectors.normalise.details import parse_tag_details, tag_details_paths_and_types
from connectors.schema import TAG_METADATA_SCHEMA
from pipelines.config.models import TagSelectionConfig
from pipelines.patterns import compile_pattern

log = logging.getLogger("historian.selection")


class DetailsClient(Protocol):
    """What selection asks of a node (`NodeClient`): details and browse answers as sent."""

    def tag_details_bytes(
        self, path: str, *, filter_regex: str | None = None, recurrent: bool | None = None
    ) -> bytes: ...

    def tag_browse_bytes(
        self,
        path: str = "/",
        *,
        flat: bool | None = None,
        recurrent: bool | None = None,
        hide_groups: bool | None = None,
    ) -> bytes: ...


@dataclass(frozen=True)
class _Answer:
    """One details answer as received (of one group when `group` is set: names unique);
    its metadata is read only when it is wanted."""

    body: bytes
    received_ms: int
    group: str | None = None
    # Each tag's configured type (details `config.type`), read with the paths.
    types: Mapping[str, str] = field(default_factory=dict)


class ResolvedTags:
    """The tags of one run, how to fetch them, and (built on first use) their metadata.

    `explicit`: the flow named its tags (a tag the node leaves out of an answer stops the
    run); otherwise a group or browse selection resolved them.
    """

    def __init__(
        self,
        members: tuple[str, ...],
        filter_query: FilterQuery | None,
        node: str = "",
        answers: tuple[_Answer, ...] = (),
        *,
        explicit: bool = False,
    ) -> None:
        self.members = members
        self.filter_query = filter_query
        self.explicit = explicit
        self._node = node
        self._answers = answers

    def details_answers(self) -> list[tuple[bytes, str | None]]:
        """The details answers the tags came from (body, group of a non-recursive answer),
        for what else they say of a tag (`remote`, `status`: pipelines/core/holds.py)."""
        return [(answer.body, answer.group) for answer in self._answers]

    @cached_property
    def metadata(self) -> pa.Table:
        """TAG_METADATA_SCHEMA rows of the members, one per tag (the first answer's)."""
        tables = [
            parse_tag_details(answer.body, self._node, answer.received_ms, group=answer.group)
            for answer in self._answers
        ]
        metadata = pa.concat_tables(tables) if tables else TAG_METADATA_SCHEMA.empty_table()
        return _only(metadata, self.members)

    @cached_property
    def types(self) -> dict[str, str]:
        """Each member's configured type (details `config.type`) where the node says one."""
        # The first answer that names a tag says its type (as for `metadata`).
        answers = reversed(self._answers)
        types = {tag: kind for answer in answers for tag, kind in answer.types.items()}
        return {tag: types[tag] for tag in self.members if tag in types}


def _details(
    client: DetailsClient,
    path: str,
    *,
    regex: str | None = None,
    recurrent: bool,
) -> tuple[list[str], _Answer]:
    """The tag paths of one details answer, and the answer (its metadata is read later).
    Asked of one group without recursion, an entry without `fullPath` is that group's."""
    group = None if recurrent else path
    body = client.tag_details_bytes(path, filter_regex=regex, recurrent=recurrent)
    paths, types = tag_details_paths_and_types(body, group=group)
    return paths, _Answer(body, int(time.time() * 1000), group, types)


def _browse_json(body: bytes, where: str) -> Any:
    """A browse answer as JSON (a malformed one is fatal: MalformedAnswer)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise MalformedAnswer("tag.browse", "answer is not JSON", where=where) from None


def _parent(path: str) -> str:
    head = path.rstrip("/").rsplit("/", 1)[0]
    return head + "/" if head else "/"


def _as_group(path: str) -> str:
    return path if path.endswith("/") else path + "/"


def _flat_listing(client: DetailsClient, group: str, recurrent: bool) -> set[str] | None:
    """The tag paths under `group` from a flat browse, or None when the node does not give
    a flat listing this reading understands (its shape is not shown in the spec): an
    array of path strings, or of objects with `fullPath` or `path`; groups end in `/`."""
    try:
        body = client.tag_browse_bytes(group, flat=True, recurrent=recurrent, hide_groups=True)
        answer = _browse_json(body, group)
    except (NodeRequestError, MalformedAnswer):
        return None
    if not isinstance(answer, list):
        return None
    paths: set[str] = set()
    for item in answer:
        path = item
        if isinstance(item, dict):
            if item.get("type") == "group":
                continue
            path = item.get("fullPath") or item.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            return None
        if not path.endswith("/"):
            paths.add(path)
    return paths


def _tree_groups(client: DetailsClient, group: str, recurrent: bool) -> list[str]:
    """`group` and (recurrent) every group under it, from the tree browse: groups are
    keyed by name within their parent, so this listing is exact."""
    found = [group]
    if not recurrent:
        return found
    answer = _browse_json(client.tag_browse_bytes(group, recurrent=True), group)

    def walk(node: Any, prefix: str) -> None:
        groups = node.get("groups") if isinstance(node, dict) else None
        if not isinstance(groups, dict):
            return
        for name, child in groups.items():
            path = f"{prefix}{name}/"
            found.append(path)
            walk(child, path)

    walk(answer, group)
    return found


def _exact(
    client: DetailsClient, group: str, recurrent: bool, regex: str | None
) -> tuple[set[str], list[_Answer]]:
    """Every tag path under `group` and the details answers that describe them, with
    leaf names that repeat across groups resolved (see the module docstring)."""
    paths, answer = _details(client, group, regex=regex, recurrent=recurrent)
    described = _within(paths, group, recurrent)
    if len(described) < len(set(paths)):
        log.info(
            "tag.details over %s answered %d tags outside the selection (recurrent: %s): "
            "kept only what the selection means",
            group,
            len(set(paths)) - len(described),
            recurrent,
        )
    answers = [answer]
    listing = _flat_listing(client, group, recurrent)
    if listing is not None:
        listing = _within(listing, group, recurrent)
    if listing is None:
        groups = _tree_groups(client, group, recurrent)
    else:
        pattern = compile_pattern(regex) if regex is not None else None
        left_out = {p for p in listing - described if pattern is None or pattern.search(p)}
        groups = sorted({_parent(path) for path in left_out})
        if groups:
            log.warning(
                "tag.details over %s left out %d tags that browse lists (leaf names repeated "
                "across groups): asking each of %d groups on its own",
                group,
                len(left_out),
                len(groups),
            )
    tags = set(listing) if listing is not None else set(described)
    for each in groups:
        try:
            found, per_group = _details(client, each, recurrent=False)
        except UnknownTag:
            continue
        answers.append(per_group)
        tags.update(_within(found, group, recurrent) if listing is None else set(found) & listing)
    return tags, answers


def _within(paths: Iterable[str], group: str, recurrent: bool) -> set[str]:
    """The paths a selection of `group` means whatever the node answered: under `group`,
    and (not `recurrent`) its direct children only. A node may ignore `options.recurrent`
    (the spec does not say it must honour it); the meaning is enforced here."""
    depth = len(group)
    return {
        path for path in paths if path.startswith(group) and (recurrent or "/" not in path[depth:])
    }


def resolve_tags(
    client: DetailsClient, node: str, selection: TagSelectionConfig, *, where: str
) -> ResolvedTags:
    """Resolve a flow's tag selection against the node; `where` names the config key."""
    if selection.paths is not None:
        return _explicit(client, node, selection.paths, where=f"{where}.paths")
    if selection.group is not None:
        group = _as_group(selection.group)
        try:
            tags, answers = _exact(client, group, selection.recurrent, selection.regex)
        except UnknownTag:
            raise UnknownTag(
                "tag.details", f"{where}.group: group {quoted(group)} not found on node {node}"
            ) from None
        members = _matching(tags, [selection.regex] if selection.regex else [], [])
        if not members:
            raise UnknownTag(
                "tag.details", f"{where}.group: no tag matches in group {quoted(group)}"
            )
        query = FilterQuery(group=group, regex=selection.regex, recurrent=selection.recurrent)
        return ResolvedTags(members, query, node, tuple(answers))
    assert selection.browse is not None
    root = _as_group(selection.browse)
    try:
        tags, answers = _exact(client, root, True, None)
    except UnknownTag:
        raise UnknownTag(
            "tag.details", f"{where}.browse: group {quoted(root)} not found on node {node}"
        ) from None
    members = _matching(tags, selection.include, selection.exclude)
    if not members:
        raise UnknownTag(
            "tag.details", f"{where}.browse: no tag under {quoted(root)} matches include/exclude"
        )
    return ResolvedTags(members, None, node, tuple(answers))


def _explicit(client: DetailsClient, node: str, wanted: list[str], *, where: str) -> ResolvedTags:
    """Explicit paths, each checked in its parent group (asked without recursion: names
    are unique there)."""
    known: set[str] = set()
    answers = []
    for parent in sorted({_parent(path) for path in wanted}):
        try:
            paths, answer = _details(client, parent, recurrent=False)
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
    return ResolvedTags(tuple(wanted), None, node, tuple(answers), explicit=True)


def _matching(tags: Iterable[str], include: list[str], exclude: list[str]) -> tuple[str, ...]:
    """The tags (sorted) that match any `include` pattern (all when none) and no `exclude`."""
    keep = [compile_pattern(p) for p in include]
    drop = [compile_pattern(p) for p in exclude]
    return tuple(
        tag
        for tag in sorted(set(tags))
        if (not keep or any(p.search(tag) for p in keep)) and not any(p.search(tag) for p in drop)
    )


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
