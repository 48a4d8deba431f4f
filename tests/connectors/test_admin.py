"""Administration of a node against the real simulator over loopback: every operation.

Values are checked, not just statuses: a written value reads back, a backup survives
export and import, a certificate trusted moves, a module stopped reports it, a license
added reads back. Request shapes and answer decoding are in test_client_faults.py.
"""

from __future__ import annotations

import io
import zipfile
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from connectors import models
from connectors.admin import NodeAdmin
from connectors.client import NodeClient
from connectors.errors import NodeRequestError
from connectors.options import AlarmFilter
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import to_ms

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def test_error_count_and_redundancy(admin: NodeAdmin) -> None:
    assert admin.system_error_count() == 0
    redundancy = admin.redundancy_status()
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
        NodeAdmin(client).system_restart_service()
        status = client.system_status()  # 503s while restarting are retried
    assert status.n3 is not None
    assert status.n3.pid != pid_before


def test_link_get(admin: NodeAdmin) -> None:
    links = admin.link_get()
    assert links.node_info is not None
    assert links.node_info.name == "sim-node"
    link = links.links["to-remote"]
    assert link.type == "out"
    assert link.online is True
    assert link.remote is not None
    assert link.remote.endpoint == "127.0.0.1:3800"
    assert link.local is not None
    assert link.local.gzip is True


def test_write_then_read_gives_the_value(
    client: NodeClient, admin: NodeAdmin, number_tag: str
) -> None:
    number = number_tag
    admin.tag_write(number, 42.5)
    entry = next(iter(client.tag_read(number).tags.values()))
    assert entry.data is not None
    assert entry.data.value == 42.5
    assert entry.data.quality == 192


def test_write_many_then_read(client: NodeClient, admin: NodeAdmin, node: SimulatedNode) -> None:
    numbers = [p for p in node.tag_paths() if node.tag_type(p) == "number" and "," not in p][:2]
    admin.tag_write_many({numbers[0]: 1.25, numbers[1]: -3.5})
    got = [next(iter(client.tag_read(p).tags.values())).data.value for p in numbers]  # type: ignore[union-attr]
    assert got == [1.25, -3.5]


def test_write_many_refuses_a_path_holding_a_comma(admin: NodeAdmin) -> None:
    with pytest.raises(ValueError, match="comma"):
        admin.tag_write_many({"/Hostile/comma, separated, name": 1.0})


def test_write_of_the_wrong_type_is_a_request_error(admin: NodeAdmin, number_tag: str) -> None:
    with pytest.raises(NodeRequestError) as caught:
        admin.tag_write(number_tag, "not a number")
    assert caught.value.status == 400
    assert caught.value.operation == "tag.write"


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
        NodeAdmin(client).alarm_ack([alarm.path], msg="seen by test")
        after = next(a for a in client.alarm_get("/") if a.path == alarm.path)
        assert client.alarm_count("/", AlarmFilter(status=alarm.status)) == same_status - 1
    assert after.status == {3: 1, 2: 0}[alarm.status]  # type: ignore[index]
    assert isinstance(after.ack_info, models.AckInfo)
    assert after.ack_info.msg == "seen by test"


def test_backup_create_export_import_load_round_trip(
    client: NodeClient, admin: NodeAdmin, number_tag: str
) -> None:
    number = number_tag
    admin.tag_write(number, 11.0)
    admin.backup_create("before", description="test backup")
    backups = admin.backup_get()
    assert backups["before"].description == "test backup"
    assert {"exe", "bootstrap"} <= set(backups["before"].versions)

    archive = admin.backup_export("before")
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        assert opened.testzip() is None
        assert opened.namelist()

    admin.backup_import("copy", archive)
    admin.backup_rename("copy", "copy-renamed")
    assert {"before", "copy-renamed"} <= set(admin.backup_get())
    admin.tag_write(number, 99.0)
    loaded = admin.backup_load("copy-renamed")
    assert loaded.completed is True
    entry = next(iter(client.tag_read(number).tags.values()))
    assert entry.data is not None
    assert entry.data.value == 11.0

    admin.backup_delete("before")
    admin.backup_delete("copy-renamed")
    assert not {"before", "copy-renamed"} & set(admin.backup_get())


def test_export_of_a_missing_backup_is_a_request_error(admin: NodeAdmin) -> None:
    with pytest.raises(NodeRequestError) as caught:
        admin.backup_export("no such backup")
    assert caught.value.status == 404
    assert "backup.export" in str(caught.value)


def test_certificates_list_export_trust_remove(admin: NodeAdmin) -> None:
    certificates = {c.id: c for c in admin.certificate_get()}
    assert certificates["own/node"].status == "own"
    assert certificates["own/node"].from_ is not None
    inbound = admin.certificate_get(cert_type="inbound")
    assert inbound
    assert all(c.type == "inbound" for c in inbound)

    pem = admin.certificate_export("own/node", cert_type="inbound")
    assert pem.startswith(b"-----BEGIN CERTIFICATE-----")

    pending = next(c for c in certificates.values() if c.id.startswith("pending/"))
    admin.certificate_set(pending.id, "trust", cert_type=pending.type)
    trusted_id = "trusted/" + pending.id.split("/", 1)[1]
    after = {c.id: c for c in admin.certificate_get()}
    assert pending.id not in after
    assert after[trusted_id].status == "trusted"
    admin.certificate_remove(trusted_id)
    assert trusted_id not in {c.id for c in admin.certificate_get()}


def test_certificate_set_refuses_an_unknown_action(admin: NodeAdmin) -> None:
    with pytest.raises(ValueError, match="trust"):
        admin.certificate_set("own/node", "revoke")


def test_module_details_installed_instances(admin: NodeAdmin) -> None:
    details = admin.module_details()
    assert details.running is True
    assert details.uptime is not None
    assert details.uptime.endswith("s")
    assert set(details.modules) >= {"Historian", "RestApiServer"}
    assert details.modules["Historian"].api["info"]["name"] == "Historian"
    assert "Historian" in admin.module_get_installed()
    assert admin.module_get_instances(["Historian"]) == ["Historian"]
    assert set(admin.module_get_instances()) == set(details.modules)


def test_module_config_set_then_get(admin: NodeAdmin) -> None:
    listing = admin.module_get_config_list()
    assert listing["logger"].text
    document = {
        "version": {"main": 1, "editor": 1},
        "result": ["Object", {"level": ["String", "debug"]}],
        "editor": {"extends": {"module": "logger"}, "modified": 1, "library": {}},
    }
    admin.module_set_config_data("Logger", "views", document)
    assert admin.module_get_config_present("Logger")["views"] is True
    assert admin.module_get_config_data("views", module_name="Logger") == document


def test_module_stop_start_restart(admin: NodeAdmin) -> None:
    def entry() -> models.ModuleEntry:
        return admin.module_details().modules["ModbusClient"]

    admin.module_stop("ModbusClient")
    assert entry().running is False
    admin.module_start("ModbusClient")
    started = entry()
    assert started.running is True
    admin.module_restart("ModbusClient")
    assert entry().running is True
    assert entry().pid != started.pid


def test_license_add_read_list_remove(admin: NodeAdmin) -> None:
    uid = admin.license_get_uid()
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
    admin.license_add(document)
    files = admin.license_get()
    added = next(f for f in files if any(lic.id == "LIC-TEST" for lic in f.licenses))
    assert added.licenses[0].uid == uid.uid  # "*" became the node's uid
    assert added.licenses[0].modules[0].type == "Historian"
    assert admin.license_read(added.name) == document
    admin.license_remove(added.name)
    assert added.name not in {f.name for f in admin.license_get()}


def test_log_browse_and_export(admin: NodeAdmin) -> None:
    logs = admin.log_browse()
    module, days = next(iter(logs.items()))
    day, size = days[0]
    assert len(day) == 10
    assert isinstance(size, int)
    archive = admin.log_export([f"{module}.{day}"])
    with zipfile.ZipFile(io.BytesIO(archive)) as opened:
        assert len(opened.namelist()) == 1
