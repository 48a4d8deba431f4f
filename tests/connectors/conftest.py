"""A simulated node per test module, served on loopback, and a client of it.

Module-scoped: the tests of a module write tags, create backups and subscribe, and no
other module sees their traces. A module that needs another node defines its own `node`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from connectors.admin import NodeAdmin
from connectors.client import NodeClient
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    return SimulatedNode(SimConfig(seed=11, tags=40, hostile_names=True, restart_s=0.3))


@pytest.fixture(scope="module")
def server(node: SimulatedNode) -> Iterator[Any]:
    with run_server(node, http_port=0, https_port=0) as handle:
        yield handle


@pytest.fixture
def client(server: Any, node: SimulatedNode) -> Iterator[NodeClient]:
    node.faults.clear()
    settings = NodeSettings(url=server.http_url, name="sim", backoff_base_s=0.01)
    with NodeClient(settings) as node_client:
        yield node_client


@pytest.fixture
def admin(client: NodeClient) -> NodeAdmin:
    return NodeAdmin(client)


@pytest.fixture
def number_tag(node: SimulatedNode) -> str:
    """A number tag of the node, not one of the hostile names (for readable failures)."""
    return next(
        path
        for path in node.tag_paths()
        if node.tag_type(path) == "number" and not path.startswith("/Hostile/")
    )
