"""Connect the nodes a config names: a real node by URL, or the built-in simulator.

A `simulator:` node is started in-process on a free loopback port for as long as the
command runs, so the embedded default needs nothing else on the machine. Prefect Secret
blocks named in flows.yaml are read here, and the client gets their values: the
connectors do not depend on the orchestrator.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from connectors.client import NodeClient
from connectors.errors import quoted
from connectors.facts import NodeFacts, read_facts
from connectors.proxy import describe_proxy
from connectors.settings import NodeSettings, SecretText, SettingsError
from connectors.version import NodeVersion
from pipelines.config.models import Config, NodeConfig

log = logging.getLogger("historian.nodes")


@dataclass
class ConnectedNode:
    name: str
    client: NodeClient
    settings: NodeSettings
    simulated: bool
    _facts: NodeFacts | None = field(default=None, init=False, repr=False)
    _read_at: float = field(default=0.0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def facts(self, *, read_after: float | None = None) -> NodeFacts:
        """Who the node is, its version and its clock (`connectors.facts.read_facts`), read
        once per connection, and again when the reading is older than `read_after` (a
        `time.monotonic()`: a run reads what can change once per run). What the node does
        not say stays unknown, and what depends on it takes the reading every node
        understands. A node that does not answer at all (`RetriesExhausted`) stops the
        caller here."""
        with self._lock:
            stale = read_after is not None and self._read_at < read_after
            if self._facts is None or stale:
                self._read_at = time.monotonic()
                url = None if self.simulated else self.settings.url
                self._facts = read_facts(self.client, self.name, url or "")
            return self._facts

    def version(self) -> NodeVersion | None:
        """The node's version from `system?cmd=status` (`n3.versions`), read with its facts."""
        return self.facts().version


def node_settings(name: str, node: NodeConfig, url: str | None = None) -> NodeSettings:
    """Client settings of a configured node (`url` overrides, for a started simulator),
    with the values of its Secret blocks read now."""
    target = url or node.url
    assert target is not None
    return NodeSettings(
        name=name,
        url=target,
        verify=node.verify,
        ca_bundle=node.ca_bundle,
        token_env=node.token_env,
        username_env=node.username_env,
        password_env=node.password_env,
        token=secret_block(name, node.token_block) if node.token_block else None,
        password=secret_block(name, node.password_block) if node.password_block else None,
        connect_timeout_s=node.connect_timeout.total_seconds(),
        read_timeout_s=node.read_timeout.total_seconds(),
        request_deadline_s=(
            node.request_deadline.total_seconds() if node.request_deadline is not None else None
        ),
        max_connections=node.max_connections,
        retries=node.retries,
        proxy=node.proxy,
        max_answer_bytes=node.max_answer_mb << 20,
        alarm_fields=tuple(node.alarm_fields) if node.alarm_fields is not None else None,
    )


def secret_block(node: str, block: str) -> SecretText:
    """The value of a Prefect Secret block; a one-line SettingsError naming the node and
    the block (never its value) when it cannot be read or is empty."""
    try:
        from prefect.blocks.system import Secret

        loaded: Any = Secret.load(block)  # sync here: no event loop runs in this thread
        value = loaded.get()
    except Exception as exc:
        raise SettingsError(
            f"node {node}: Prefect Secret block {quoted(block)} cannot be read "
            f"({type(exc).__name__})"
        ) from None
    if not isinstance(value, str) or not value:
        raise SettingsError(f"node {node}: Prefect Secret block {quoted(block)} is empty")
    return SecretText(value)


class NodePool:
    """Connected nodes by name, opened on first use, closed together."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._nodes: dict[str, ConnectedNode] = {}
        self._stack = ExitStack()

    def get(self, name: str) -> ConnectedNode:
        if name not in self._nodes:
            self._nodes[name] = self._connect(name, self.config.nodes[name])
        return self._nodes[name]

    def _connect(self, name: str, node: NodeConfig) -> ConnectedNode:
        url = None
        if node.simulator is not None:
            from connectors.simulator import SimConfig, SimulatedNode, run_server

            simulated = SimulatedNode(
                SimConfig(
                    seed=node.simulator.seed,
                    tags=node.simulator.tags,
                    raw_cap=node.simulator.raw_cap,
                    profile=str(node.simulator.profile),
                )
            )
            server = self._stack.enter_context(run_server(simulated, http_port=0, https_port=None))
            url = server.http_url
        settings = node_settings(name, node, url)
        client = self._stack.enter_context(NodeClient(settings))
        return ConnectedNode(name, client, settings, node.simulator is not None)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> NodePool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def describe_node(node: ConnectedNode) -> str:
    where: Any = "built-in simulator" if node.simulated else node.settings.url
    via = describe_proxy(node.settings.proxy_url())
    return f"{node.name} ({where}{', ' + via if via else ''})"
