"""Tag selection against the simulator over loopback: names first, metadata when asked."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from connectors.client import NodeClient
from connectors.errors import UnknownTag
from connectors.schema import TAG_METADATA_SCHEMA
from connectors.settings import NodeSettings
from pipelines.config.models import TagSelectionConfig
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


class _NoFlatBrowse(httpx.BaseTransport):
    """The real simulator, except that a flat browse is refused (its shape is not shown in
    the spec: a node may not give one), and the first details answer is an HTML page."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.details = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        if params.get("cmd") == "browse" and params.get("options.flat") == "true":
            return httpx.Response(400, content=b'{"error": "flat is not supported"}')
        if params.get("cmd") == "details":
            self.details += 1
            if self.details == 1:
                return httpx.Response(200, content=b"<html>proxy error</html>")
        return self.inner.handle_request(request)


@pytest.mark.parametrize("profile", ["repeated-names", "details-by-path"])
def test_without_a_flat_listing_groups_are_walked_and_no_tag_is_lost(profile: str) -> None:
    from connectors.simulator import SimConfig, SimulatedNode, run_server

    node = SimulatedNode(SimConfig(seed=3, tags=30, profile=profile))
    under = sorted(p for p in node.tag_paths() if p.startswith("/Plant A/"))
    with (
        run_server(node, http_port=0, https_port=None) as server,
        NodeClient(NodeSettings(name="n", url=server.http_url), transport=_NoFlatBrowse()) as c,
    ):
        resolved = resolve_tags(c, "n", TagSelectionConfig(group="/Plant A/"), where="flows.f.tags")
    assert list(resolved.members) == under
    assert sorted(resolved.metadata.column("tag").to_pylist()) == under


def test_an_unknown_group_is_named_by_its_config_key(client: NodeClient) -> None:
    with pytest.raises(UnknownTag) as caught:
        resolve_tags(client, "n", TagSelectionConfig(group="/Nowhere/"), where="flows.f.tags")
    assert "flows.f.tags.group: group '/Nowhere/' not found on node n" in str(caught.value)


# Python's backtracking `re` takes 2^len(path) steps on every tag path that holds no `!`.
CATASTROPHIC = "^([^!]|[^!])*!$"

_RESOLVE_UNDER_A_HOSTILE_PATTERN = """
import sys
from connectors.client import NodeClient
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.config.models import TagSelectionConfig
from pipelines.selection import resolve_tags

node = SimulatedNode(SimConfig(seed=7, tags=3000))
selection = TagSelectionConfig(browse="/", include=[sys.argv[1]], exclude=[sys.argv[1]])
with run_server(node, http_port=0, https_port=None) as server:
    with NodeClient(NodeSettings(name="n", url=server.http_url)) as client:
        try:
            resolve_tags(client, "n", selection, where="flows.f.tags")
        except Exception as exc:
            print(len(node.tag_paths()), exc)
"""


def test_a_catastrophic_pattern_over_thousands_of_tags_is_matched_in_bounded_time() -> None:
    """Include and exclude are both the hostile pattern: it matches no tag, so nothing is
    selected; the subprocess's timeout is the bound (the answer comes in seconds)."""
    done = subprocess.run(
        [sys.executable, "-c", _RESOLVE_UNDER_A_HOSTILE_PATTERN, CATASTROPHIC],
        capture_output=True,
        text=True,
        timeout=90,
        check=True,
    )
    count, message = done.stdout.strip().split(" ", 1)
    assert int(count) >= 3000
    assert message == "tag.details: flows.f.tags.browse: no tag under '/' matches include/exclude"
