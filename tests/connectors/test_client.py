"""The node client against the real simulator over loopback HTTP and HTTPS: every operation.

Values are checked, not just statuses: history equals the simulator's ground truth, a
written value reads back, a backup survives export and import, a write shows up as a
subscription event. Request shapes and retries under faults are in test_client_faults.py.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from connectors import models
from connectors.client import NodeClient
from connectors.errors import (
    AuthenticationError,
    NodeRequestError,
    TLSVerificationError,
    UnknownTag,
)
from connectors.normalise import parse_history_answer
from connectors.options import AlarmFilter, HistoryOptions
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import to_ms

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
END = START + timedelta(minutes=20)


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    """A node of this module only (tests here write tags, create backups, ...)."""
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


def _of_type(node: SimulatedNode, kind: str, *, plain: bool = True) -> str:
    """A tag of a type; `plain` avoids the hostile names (for readable failures)."""
    return next(
        path
        for path in node.tag_paths()
        if node.tag_type(path) == kind and (not plain or not path.startswith("/Hostile/"))
    )


# -- system, redundancy, links, views --------------------------------------------------------


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


def test_error_count_and_redundancy(client: NodeClient) -> None:
    assert client.system_error_count() == 0
    redundancy = client.redundancy_status()
    assert redundancy == models.RedundancyStatus(enabled=False, standby=False, mode="primary")


def test_restart_service_answers_503_until_back_and_the_client_waits_it_out(
    server: Any,
) -> None:
    # 19 waits of uniform(0, <=0.1 s): about 0.95 s in all, far above the 0.3 s restart.
    settings = NodeSettings(
        url=server.http_url, name="sim", retries=20, backoff_base_s=0.05, backoff_max_s=0.1
    )
    with NodeClient(settings) as client:
        pid_before = client.system_status().n3.pid  # type: ignore[union-attr]
        client.system_restart_service()
        status = client.system_status()  # 503s while restarting are retried
    assert status.n3 is not None
    assert status.n3.pid != pid_before


def test_link_get(client: NodeClient) -> None:
    links = client.link_get()
    assert links.node_info is not None
    assert links.node_info.name == "sim-node"
    link = links.links["to-remote"]
    assert link.type == "out"
    assert link.online is True
    assert link.remote is not None
    assert link.remote.endpoint == "127.0.0.1:3800"
    assert link.local is not None
    assert link.local.gzip is True


def test_tag_get_views(client: NodeClient) -> None:
    assert client.tag_get_views() == ["default", "operations", "maintenance"]


# -- tags: browse, read, details, write, history ---------------------------------------------


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


def test_write_then_read_gives_the_value(client: NodeClient, node: SimulatedNode) -> None:
    number = _of_type(node, "number")
    client.tag_write(number, 42.5)
    entry = next(iter(client.tag_read(number).tags.values()))
    assert entry.data is not None
    assert entry.data.value == 42.5
    assert entry.data.quality == 192


def test_write_many_then_read(client: NodeClient, node: SimulatedNode) -> None:
    numbers = [p for p in node.tag_paths() if node.tag_type(p) == "number" and "," not in p][:2]
    client.tag_write_many({numbers[0]: 1.25, numbers[1]: -3.5})
    got = [next(iter(client.tag_read(p).tags.values())).data.value for p in numbers]  # type: ignore[union-attr]
    assert got == [1.25, -3.5]


def test_write_many_refuses_a_path_holding_a_comma(client: NodeClient) -> None:
    with pytest.raises(ValueError, match="comma"):
        client.tag_write_many({"/Hostile/comma, separated, name": 1.0})


def test_write_of_the_wrong_type_is_a_request_error(
    client: NodeClient, node: SimulatedNode
) -> None:
    with pytest.raises(NodeRequestError) as caught:
        client.tag_write(_of_type(node, "number"), "not a number")
    assert caught.value.status == 400
    assert caught.value.operation == "tag.write"


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


def test_history_of_one_tag_echoes_the_request(client: NodeClient, node: SimulatedNode) -> None:
    path = _of_type(node, "number")
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


# -- subscriptions ---------------------------------------------------------------------------


def test_subscription_collects_the_event_of_a_write(
    client: NodeClient, node: SimulatedNode
) -> None:
    number = _of_type(node, "number")
    subscription = client.tag_subscribe({"owner": "test"})
    assert isinstance(subscription.id, int)
    assert subscription.model
    try:
        listed = {record.id: record for record in client.tag_subscriptions()}
        assert listed[subscription.id].data == {"owner": "test"}
        client.tag_write(number, 7.0)
        client.tag_write(number, 8.0)
        first = client.tag_subscription_events(subscription.id, limit=1)
        assert first.remaining_events == 1
        rest = client.tag_subscription_events(subscription.id)
        events = [*first.events, *rest.events]
        assert all(isinstance(event, models.TagEvent) for event in events)
        assert [(e.tag, e.data.value) for e in events] == [(number, 7.0), (number, 8.0)]  # type: ignore[union-attr]
    finally:
        client.tag_cancel_subscription(subscription.id)
    assert subscription.id not in {record.id for record in client.tag_subscriptions()}


def test_model_change_is_a_model_event(client: NodeClient) -> None:
    subscription = client.tag_subscribe()
    try:
        document = {"version": {"main": 1}, "result": ["Object", {}], "editor": {}}
        client.module_set_config_data("Historian", "tags", document)
        events = client.tag_subscription_events(subscription.id).events
        assert any(isinstance(event, models.ModelEvent) and event.model for event in events)
    finally:
        client.tag_cancel_subscription(subscription.id)


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


def test_alarm_ack_moves_unacknowledged_alarms() -> None:
    node = SimulatedNode(SimConfig(seed=11, tags=40))
    node.set_clock(to_ms(START + timedelta(hours=12)))  # a moment with unacknowledged alarms
    with (
        run_server(node, http_port=0, https_port=None) as handle,
        NodeClient(NodeSettings(url=handle.http_url)) as client,
    ):
        unacked = [a for a in client.alarm_get("/") if a.status in (2, 3)]
        assert unacked
        alarm = unacked[0]
        same_status = sum(a.status == alarm.status for a in unacked)
        client.alarm_ack([alarm.path], msg="seen by test")
        after = next(a for a in client.alarm_get("/") if a.path == alarm.path)
        assert client.alarm_count("/", AlarmFilter(status=alarm.status)) == same_status - 1
    assert after.status == {3: 1, 2: 0}[alarm.status]  # type: ignore[index]
    assert isinstance(after.ack_info, models.AckInfo)
    assert after.ack_info.msg == "seen by test"


# -- backups ---------------------------------------------------------------------------------


def test_backup_create_export_import_load_round_trip(
    client: NodeClient, node: SimulatedNode
) -> None:
    number = _of_type(node, "number")
    client.tag_write(number, 11.0)
    client.backup_create("before", description="test backup")
    backups = client.backup_get()
    assert backups["before"].description == "test backup"
    assert {"exe", "bootstrap"} <= set(backups["before"].versions)

    archive = client.backup_export("before")
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        assert opened.testzip() is None
        assert opened.namelist()

    client.backup_import("copy", archive)
    client.backup_rename("copy", "copy-renamed")
    assert {"before", "copy-renamed"} <= set(client.backup_get())
    client.tag_write(number, 99.0)
    loaded = client.backup_load("copy-renamed")
    assert loaded.completed is True
    entry = next(iter(client.tag_read(number).tags.values()))
    assert entry.data is not None
    assert entry.data.value == 11.0

    client.backup_delete("before")
    client.backup_delete("copy-renamed")
    assert not {"before", "copy-renamed"} & set(client.backup_get())


def test_export_of_a_missing_backup_is_a_request_error(client: NodeClient) -> None:
    with pytest.raises(NodeRequestError) as caught:
        client.backup_export("no such backup")
    assert caught.value.status == 404
    assert "backup.export" in str(caught.value)


# -- certificates ----------------------------------------------------------------------------


def test_certificates_list_export_trust_remove(client: NodeClient) -> None:
    certificates = {c.id: c for c in client.certificate_get()}
    assert certificates["own/node"].status == "own"
    assert certificates["own/node"].from_ is not None
    inbound = client.certificate_get(cert_type="inbound")
    assert inbound
    assert all(c.type == "inbound" for c in inbound)

    pem = client.certificate_export("own/node", cert_type="inbound")
    assert pem.startswith(b"-----BEGIN CERTIFICATE-----")

    pending = next(c for c in certificates.values() if c.id.startswith("pending/"))
    client.certificate_set(pending.id, "trust", cert_type=pending.type)
    trusted_id = "trusted/" + pending.id.split("/", 1)[1]
    after = {c.id: c for c in client.certificate_get()}
    assert pending.id not in after
    assert after[trusted_id].status == "trusted"
    client.certificate_remove(trusted_id)
    assert trusted_id not in {c.id for c in client.certificate_get()}


def test_certificate_set_refuses_an_unknown_action(client: NodeClient) -> None:
    with pytest.raises(ValueError, match="trust"):
        client.certificate_set("own/node", "revoke")


# -- modules ---------------------------------------------------------------------------------


def test_module_details_installed_instances(client: NodeClient) -> None:
    details = client.module_details()
    assert details.running is True
    assert details.uptime is not None
    assert details.uptime.endswith("s")
    assert set(details.modules) >= {"Historian", "RestApiServer"}
    assert details.modules["Historian"].api["info"]["name"] == "Historian"
    assert "Historian" in client.module_get_installed()
    assert client.module_get_instances(["Historian"]) == ["Historian"]
    assert set(client.module_get_instances()) == set(details.modules)


def test_module_config_set_then_get(client: NodeClient) -> None:
    listing = client.module_get_config_list()
    assert listing["logger"].text
    document = {
        "version": {"main": 1, "editor": 1},
        "result": ["Object", {"level": ["String", "debug"]}],
        "editor": {"extends": {"module": "logger"}, "modified": 1, "library": {}},
    }
    client.module_set_config_data("Logger", "views", document)
    assert client.module_get_config_present("Logger")["views"] is True
    assert client.module_get_config_data("views", module_name="Logger") == document


def test_module_stop_start_restart(client: NodeClient) -> None:
    def entry() -> models.ModuleEntry:
        return client.module_details().modules["ModbusClient"]

    client.module_stop("ModbusClient")
    assert entry().running is False
    client.module_start("ModbusClient")
    started = entry()
    assert started.running is True
    client.module_restart("ModbusClient")
    assert entry().running is True
    assert entry().pid != started.pid


# -- licenses and logs -----------------------------------------------------------------------


def test_license_add_read_list_remove(client: NodeClient) -> None:
    uid = client.license_get_uid()
    assert uid.uid
    assert uid.host
    document = {
        "version": 1,
        "created": "2024-01-01T00:00:00.000Z",
        "signature": "ab12",
        "licenses": [
            {
                "version": 1,
                "host": uid.host,
                "uid": "*",
                "expires": "2030-01-01T00:00:00.000Z",
                "type": "production",
                "supportExpires": 1_900_000_000_000,
                "nonce": 1,
                "id": "LIC-TEST",
                "modules": [{"type": "Historian", "tagAccess": "local", "count": 1}],
            }
        ],
    }
    client.license_add(document)
    files = client.license_get()
    added = next(f for f in files if any(lic.id == "LIC-TEST" for lic in f.licenses))
    assert added.licenses[0].uid == uid.uid  # "*" became the node's uid
    assert added.licenses[0].modules[0].type == "Historian"
    assert client.license_read(added.name) == document
    client.license_remove(added.name)
    assert added.name not in {f.name for f in client.license_get()}


def test_log_browse_and_export(client: NodeClient) -> None:
    logs = client.log_browse()
    module, days = next(iter(logs.items()))
    day, size = days[0]
    assert len(day) == 10
    assert isinstance(size, int)
    archive = client.log_export([f"{module}.{day}"])
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        assert len(opened.namelist()) == 1


# -- transport: HTTPS and credentials --------------------------------------------------------


def test_https_with_the_nodes_ca_bundle(server: Any) -> None:
    settings = NodeSettings(url=server.https_url, name="tls", ca_bundle=server.ca_pem_path)
    with NodeClient(settings) as client:
        assert client.system_error_count() == 0


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


def test_https_with_verification_off_works_and_warns_once(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings = NodeSettings(url=server.https_url, name="insecure-test-node", verify=False)
    with caplog.at_level("WARNING", logger="historian.client"):
        for _ in range(2):
            with NodeClient(settings) as client:
                assert client.system_error_count() == 0
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
        assert client.system_error_count() == 0


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
            assert client.system_error_count() == 0
        monkeypatch.setenv("TEST_NODE_PASSWORD", "wrong")
        with NodeClient(settings) as client, pytest.raises(AuthenticationError):
            client.system_error_count()
