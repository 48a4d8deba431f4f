"""Every request has a total deadline: a node that trickles its answer cannot hold a run.

Against a raw socket server on loopback (tests/hostile_node.py) that sends each byte well
within the read timeout, so only the deadline on the whole request can end it.
"""

from __future__ import annotations

import ssl

import pytest
import trustme

from connectors.client import NodeClient
from connectors.errors import NodeTimeout, RetriesExhausted
from connectors.settings import NodeSettings
from tests.hostile_node import trickling_node


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def settings(url: str, **extra: object) -> NodeSettings:
    values: dict[str, object] = {
        "url": url,
        "read_timeout_s": 2.0,
        "request_deadline_s": 0.8,
        "retries": 0,
        "backoff_base_s": 0.01,
    }
    values.update(extra)
    return NodeSettings(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("stage", ["head", "body"])
def test_a_trickled_answer_ends_at_the_request_deadline(stage: str) -> None:
    with (
        trickling_node(stage=stage, interval_s=0.1) as node,  # type: ignore[arg-type]
        NodeClient(settings(node.url)) as client,
        pytest.raises(NodeTimeout) as caught,
    ):
        client.system_status()
    assert str(caught.value) == (
        "system.status: no complete answer within the request deadline (0.8 s)"
    )


def test_a_trickle_over_tls_ends_at_the_deadline_too(
    server_tls: ssl.SSLContext, ca_file: str
) -> None:
    with (
        trickling_node(tls=server_tls, interval_s=0.1) as node,
        NodeClient(settings(node.url, ca_bundle=ca_file)) as client,
        pytest.raises(NodeTimeout, match="request deadline"),
    ):
        client.tag_get_views()


def test_each_attempt_has_its_own_deadline_then_the_retries_are_spent() -> None:
    with (
        trickling_node(interval_s=0.1) as node,
        NodeClient(settings(node.url, retries=2)) as client,
        pytest.raises(RetriesExhausted) as caught,
    ):
        client.system_status()
    assert node.requests == 3
    assert isinstance(caught.value.last, NodeTimeout)
    assert "gave up after 3 attempts: no complete answer within the request deadline" in str(
        caught.value
    )


def test_a_slow_but_complete_answer_inside_the_deadline_is_read() -> None:
    with (
        trickling_node(body=b"[]", interval_s=0.05) as node,
        NodeClient(settings(node.url, request_deadline_s=5.0)) as client,
    ):
        assert client.tag_get_views() == []


def test_the_deadline_is_derived_from_the_timeouts_unless_given() -> None:
    derived = NodeSettings(url="http://node:3003", connect_timeout_s=5, read_timeout_s=60)
    assert derived.deadline_s == 125
    assert NodeSettings(url="http://node:3003", request_deadline_s=7).deadline_s == 7
