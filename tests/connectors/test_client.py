"""The node client against the real simulator over loopback HTTP and HTTPS: every reading
operation (administration: test_admin.py; subscriptions: test_subscriptions.py).

Values are checked, not just statuses: history equals the simulator's ground truth, alarms
agree with their count. Request shapes and retries under faults are in
test_client_faults.py.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest

from connectors import models
from connectors.admin import NodeAdmin
from connectors.client import NodeClient, _no_tls
from connectors.errors import (
    AuthenticationError,
    TLSVerificationError,
    UnknownTag,
)
from connectors.normalise.history import parse_history_answer
from connectors.options import AlarmFilter, HistoryOptions
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import to_ms

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
END = START + timedelta(minutes=20)


# -- system, views -------------------------------------------------------------------------


def test_system_status_is_typed(client: NodeClient) -> None:
    status = client.system_status()
    assert status.n3 is not None
    assert status.sys is not None
    assert status.n3.node == "sim-node"
    assert status.n3.tags is not None
    assert status.n3.tags.total == 40
    assert status.sys.hostname == "sim-host"
    assert isinstance(status.sys.ts, int)
    assert status.sys.ts > 1_600_000_000_000


def test_tag_get_views(client: NodeClient) -> None:
    assert client.tag_get_views() == ["default", "operations", "maintenance"]


# -- tags: browse, read, details, history --------------------------------------------------


def test_tag_browse_object_and_flat(client: NodeClient) -> None:
    tree = client.tag_browse("/")
    assert isinstance(tree, models.TagBrowse)
    assert {"Plant A", "Plant B", "Hostile"} <= set(tree.groups)
    flat = client.tag_browse("/", flat=True)
    assert isinstance(flat, list)
    assert "/Plant A/" in flat


def test_tag_details_of_a_hostile_path_names_it_exactly(
    client: NodeClient, node: SimulatedNode
) -> None:
    hostile = [p for p in node.tag_paths() if p.startswith("/Hostile/")]
    assert hostile
    for path in hostile:
        details = client.tag_details(path)
        assert [entry.full_path for entry in details.tags.values()] == [path]


def test_details_and_browse_bytes_are_the_answers_as_sent(client: NodeClient) -> None:
    details = client.tag_details("/Plant A/", recurrent=True)
    raw = orjson.loads(client.tag_details_bytes("/Plant A/", recurrent=True))
    # The two answers are two requests apart: a tag's live value and status may move.
    live = {"tags": {"__all__": {"data", "status"}}}
    assert models.TagDetails.model_validate(raw).model_dump(exclude=live) == details.model_dump(
        exclude=live
    )
    flat = client.tag_browse_bytes("/Plant A/", flat=True, recurrent=True, hide_groups=True)
    assert orjson.loads(flat) == client.tag_browse(
        "/Plant A/", flat=True, recurrent=True, hide_groups=True
    )


def test_history_of_an_unknown_tag_is_unknown_tag(client: NodeClient) -> None:
    with pytest.raises(UnknownTag) as caught:
        client.tag_history("/No/Such/Tag", START, END)
    assert "tag.history" in str(caught.value)
    assert "HTTP 404" in str(caught.value)


@pytest.mark.parametrize(
    "options",
    [
        HistoryOptions(mode="raw"),
        HistoryOptions(mode="raw", invalid_as_null=False),
        HistoryOptions(mode="delta"),
        HistoryOptions(mode="filter", deadband=0.5),
        HistoryOptions(mode="aggregated", method="avg", interval_ms=300_000),
    ],
    ids=["raw", "raw-invalid-kept", "delta", "filter", "aggregated-avg"],
)
def test_history_many_equals_ground_truth_for_every_path(
    client: NodeClient, node: SimulatedNode, options: HistoryOptions
) -> None:
    paths = node.tag_paths()  # includes quotes, commas, %2F, emoji, 1000-char names
    many = client.tag_history_many(paths, START, END, options)
    assert set(many) == set(paths)
    for path in paths:
        expected = node.ground_truth(path, to_ms(START), to_ms(END), options)
        got = [row for row in many[path].data if row[0] < to_ms(END)]
        assert got == expected, path


def test_history_of_one_tag_echoes_the_request(
    client: NodeClient, node: SimulatedNode, number_tag: str
) -> None:
    path = number_tag
    options = HistoryOptions(mode="raw", limit=5)
    history = client.tag_history(path, START, END, options)
    assert history.request is not None
    assert history.request.tag == path
    assert len(history.data) == 5
    truth = node.ground_truth(path, to_ms(START), to_ms(END), HistoryOptions(mode="raw"))
    assert history.data == truth[:5]


def test_history_many_bytes_normalise_to_the_ground_truth(
    client: NodeClient, node: SimulatedNode
) -> None:
    paths = [p for p in node.tag_paths() if node.tag_type(p) == "number"][:5]
    options = HistoryOptions(mode="raw")
    body = client.tag_history_many_bytes(paths, START, END, options)
    decoded = orjson.loads(body)
    for path in paths:
        expected = node.ground_truth(path, to_ms(START), to_ms(END), options)
        assert [row for row in decoded[path]["data"] if row[0] < to_ms(END)] == expected
    page = parse_history_answer(body, "sim")
    assert set(page.table.column("tag").to_pylist()) == set(paths)


def test_history_filter_by_regex_equals_ground_truth(
    client: NodeClient, node: SimulatedNode
) -> None:
    options = HistoryOptions(mode="raw")
    result = client.tag_history_filter(
        ["/Plant A/"], START, END, options, filter_regex="Line 1", recurrent=True
    )
    wanted = [p for p in node.tag_paths() if p.startswith("/Plant A/") and "Line 1" in p]
    assert wanted
    assert set(result) == set(wanted)
    for path in wanted:
        expected = node.ground_truth(path, to_ms(START), to_ms(END), options)
        assert [row for row in result[path].data if row[0] < to_ms(END)] == expected
    raw = client.tag_history_filter_bytes(
        ["/Plant A/"], START, END, options, filter_regex="Line 1", recurrent=True
    )
    assert set(orjson.loads(raw)) == set(wanted)


def test_more_threads_than_connections_never_hang_or_lose_a_request(
    server: Any, node: SimulatedNode
) -> None:
    """Regression: httpcore#1110 hung or broke ~1 in 3 of these rounds before the client
    bounded in-flight requests itself (no retries here, so nothing hides a failure)."""
    paths = node.tag_paths()[:12]
    options = HistoryOptions(mode="raw")
    expected = {path: node.ground_truth(path, to_ms(START), to_ms(END), options) for path in paths}
    settings = NodeSettings(
        url=server.http_url, name="pool", max_connections=2, retries=0, read_timeout_s=5
    )

    def fetch(path: str) -> list[Any]:
        body = shared.tag_history_many_bytes([path], START, END, options)
        return [row for row in orjson.loads(body)[path]["data"] if row[0] < to_ms(END)]

    with NodeClient(settings) as shared, ThreadPoolExecutor(6) as pool:
        for _ in range(15):
            assert dict(zip(paths, pool.map(fetch, paths), strict=True)) == expected


# -- alarms ----------------------------------------------------------------------------------


def test_alarm_get_and_count_agree(client: NodeClient, node: SimulatedNode) -> None:
    alarms = client.alarm_get("/")
    assert sorted(a.path for a in alarms) == sorted(node.alarm_paths())
    assert client.alarm_count("/") == len(alarms)
    high = client.alarm_get("/", AlarmFilter(min_priority=3))
    assert all(a.priority is not None and a.priority >= 3 for a in high)
    assert client.alarm_count("/", AlarmFilter(min_priority=3)) == len(high)


def test_alarm_history_equals_ground_truth(client: NodeClient, node: SimulatedNode) -> None:
    start, end = START - timedelta(days=3), START
    history = client.alarm_history("/", start, end)
    assert history.request is not None
    assert history.request.path == "/"
    got = [event for event in history.data if event["ts"] < to_ms(end)]
    assert got == node.alarm_ground_truth(to_ms(start), to_ms(end))
    assert got, "the window should hold alarm events"
    raw = client.alarm_history_bytes("/", start, end, AlarmFilter(min_priority=1))
    assert [e for e in orjson.loads(raw)["data"] if e["ts"] < to_ms(end)] == got


# -- transport: HTTPS and credentials --------------------------------------------------------


def test_https_with_the_nodes_ca_bundle(server: Any) -> None:
    settings = NodeSettings(url=server.https_url, name="tls", ca_bundle=server.ca_pem_path)
    with NodeClient(settings) as client:
        assert NodeAdmin(client).system_error_count() == 0


def test_https_without_the_ca_is_a_tls_error_naming_ca_bundle(
    server: Any, node: SimulatedNode
) -> None:
    served = node.requests_served
    with (
        NodeClient(NodeSettings(url=server.https_url, name="tls")) as client,
        pytest.raises(TLSVerificationError, match="ca_bundle"),
    ):
        client.system_status()
    assert node.requests_served == served  # refused before any request, and not retried


def _pool_context(client: NodeClient) -> ssl.SSLContext:
    """The TLS context the client's connection pool would open connections with (httpx's
    pool, which `connectors.deadline` already reaches into)."""
    return client._http._transport._pool._ssl_context  # type: ignore[attr-defined,no-any-return]


def test_a_plain_http_client_loads_no_ca_and_fails_any_tls_handshake(server: Any) -> None:
    """A plain-HTTP node loads no CAs (a one-off run's ~50-90 ms): the context its pool
    holds trusts no certificate, so a TLS handshake fails rather than passing unverified;
    an HTTPS node's still loads the system's CAs."""
    settings = NodeSettings(url=server.http_url, name="plain")
    assert not _no_tls(settings, "https://proxy:3129")
    assert not _no_tls(NodeSettings(url=server.http_url, name="off", verify=False), None)
    with (
        NodeClient(settings) as client,
        NodeClient(NodeSettings(url=server.https_url, name="tls")) as tls,
    ):
        context = _pool_context(client)
        assert context.get_ca_certs() == []
        assert context.verify_mode == ssl.CERT_REQUIRED
        assert context.check_hostname
        assert _pool_context(tls).get_ca_certs(), "an HTTPS node checks against the CAs"
        assert NodeAdmin(client).system_error_count() == 0
    url = httpx.URL(server.https_url)
    with (
        socket.create_connection((url.host, url.port), timeout=5) as raw,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        context.wrap_socket(raw, server_hostname=url.host)


def test_https_with_verification_off_works_and_warns_once(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings = NodeSettings(url=server.https_url, name="insecure-test-node", verify=False)
    with caplog.at_level("WARNING", logger="historian.client"):
        for _ in range(2):
            with NodeClient(settings) as client:
                assert NodeAdmin(client).system_error_count() == 0
    warnings = [r for r in caplog.records if "verification is OFF" in r.getMessage()]
    assert len(warnings) == 1


@pytest.fixture(scope="module")
def secured() -> Iterator[tuple[SimulatedNode, Any]]:
    node = SimulatedNode(SimConfig(seed=3, tags=10, token="tok-right-7f3a"))
    with run_server(node, http_port=0, https_port=None) as handle:
        yield node, handle


def test_bearer_token_from_the_environment_is_accepted(
    secured: tuple[SimulatedNode, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, handle = secured
    monkeypatch.setenv("TEST_NODE_TOKEN", "tok-right-7f3a")
    settings = NodeSettings(url=handle.http_url, token_env="TEST_NODE_TOKEN")
    with NodeClient(settings) as client:
        assert NodeAdmin(client).system_error_count() == 0


def test_wrong_token_is_an_authentication_error_and_not_retried(
    secured: tuple[SimulatedNode, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    node, handle = secured
    monkeypatch.setenv("TEST_NODE_TOKEN", "tok-wrong-0000")
    settings = NodeSettings(url=handle.http_url, token_env="TEST_NODE_TOKEN", retries=3)
    served = node.requests_served
    with NodeClient(settings) as client, pytest.raises(AuthenticationError) as caught:
        client.system_status()
    assert caught.value.status == 401
    assert node.requests_served - served <= 1  # one request (counted or refused early)
    assert "tok-wrong-0000" not in str(caught.value)


def test_basic_credentials_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    node = SimulatedNode(SimConfig(seed=3, tags=10, username="ops", password="pw-9x!"))
    monkeypatch.setenv("TEST_NODE_USER", "ops")
    monkeypatch.setenv("TEST_NODE_PASSWORD", "pw-9x!")
    with run_server(node, http_port=0, https_port=None) as handle:
        settings = NodeSettings(
            url=handle.http_url, username_env="TEST_NODE_USER", password_env="TEST_NODE_PASSWORD"
        )
        with NodeClient(settings) as client:
            assert NodeAdmin(client).system_error_count() == 0
        monkeypatch.setenv("TEST_NODE_PASSWORD", "wrong")
        with NodeClient(settings) as client, pytest.raises(AuthenticationError):
            NodeAdmin(client).system_error_count()
