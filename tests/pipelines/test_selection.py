"""Tag selection against the simulator over loopback: names first, metadata when asked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from connectors.client import NodeClient
from connectors.errors import UnknownTag
from connectors.schema import TAG_METADATA_SCHEMA
from connectors.settings import NodeSettings
from pipelines.config import TagSelectionConfig
from pipelines.selection import resolve_tags


@pytest.fixture(scope="module")
def client(sim_server: Any) -> Iterator[NodeClient]:
    with NodeClient(NodeSettings(name="n", url=sim_server.http_url)) as node_client:
        yield node_client


def test_explicit_paths_resolve_in_the_order_given(client: NodeClient, sim_node: Any) -> None:
    paths = sim_node.tag_paths()[::-7]
    resolved = resolve_tags(client, "n", TagSelectionConfig(paths=paths), where="flows.f.tags")
    assert resolved.members == tuple(paths)
    assert resolved.filter_query is None


def test_metadata_has_one_row_per_member(client: NodeClient, sim_node: Any) -> None:
    paths = sim_node.tag_paths()[:12]
    resolved = resolve_tags(client, "n", TagSelectionConfig(paths=paths), where="flows.f.tags")
    metadata = resolved.metadata
    assert metadata.schema == TAG_METADATA_SCHEMA
    assert sorted(metadata.column("tag").to_pylist()) == sorted(paths)
    assert set(metadata.column("node").to_pylist()) == {"n"}


def test_an_unknown_path_is_a_one_line_error_naming_it(client: NodeClient, sim_node: Any) -> None:
    known = sim_node.tag_paths()[0]
    gone = known.rsplit("/", 1)[0] + "/Deleted tag"
    selection = TagSelectionConfig(paths=[known, gone, "/No/Such group/t"])
    with pytest.raises(UnknownTag) as caught:
        resolve_tags(client, "n", selection, where="flows.f.tags")
    message = str(caught.value)
    assert "\n" not in message
    assert f"flows.f.tags.paths: tag {gone!r} not found on node n (and 1 more)" in message


def test_a_group_resolves_its_tags_sorted_with_the_filter_query(
    client: NodeClient, sim_node: Any
) -> None:
    group = sim_node.tag_paths()[0].rsplit("/", 1)[0] + "/"
    resolved = resolve_tags(
        client, "n", TagSelectionConfig(group=group, recurrent=False), where="flows.f.tags"
    )
    expected = sorted(p for p in sim_node.tag_paths() if p.rsplit("/", 1)[0] + "/" == group)
    assert resolved.members == tuple(expected)
    assert resolved.filter_query is not None
    assert resolved.metadata.num_rows == len(expected)


def test_browse_keeps_what_include_and_exclude_let_through(client: NodeClient) -> None:
    selection = TagSelectionConfig(browse="/", include=["Line 1"], exclude=["Temp"])
    resolved = resolve_tags(client, "n", selection, where="flows.f.tags")
    assert resolved.members
    assert all("Line 1" in tag and "Temp" not in tag for tag in resolved.members)
    assert list(resolved.members) == sorted(resolved.members)
