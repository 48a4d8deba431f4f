"""The simulator's stateful resources over loopback HTTP with raw httpx: writes,
subscriptions, alarms, backups, certificates, modules, licenses, logs, system.

Each test changes state, so the module has its own node (not the session one).
"""

from __future__ import annotations

import base64
import io
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from connectors.options import AlarmFilter
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.simulator.subscriptions import Subscriptions

NOW = 1_780_000_000_000
HOUR = 3_600_000


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    sim = SimulatedNode(SimConfig(seed=21, tags=30))
    sim.set_clock(NOW)
    return sim


@pytest.fixture(scope="module")
def c(node: SimulatedNode) -> Iterator[httpx.Client]:
    with (
        run_server(node, https_port=None) as server,
        httpx.Client(base_url=server.http_url) as client,
    ):
        yield client


def post(c: httpx.Client, resource: str, cmd: str, body: Any = None) -> httpx.Response:
    return c.post(f"/{resource}", params={"cmd": cmd}, json=body)


def get(c: httpx.Client, resource: str, cmd: str, **params: Any) -> Any:
    answer = c.get(f"/{resource}", params={"cmd": cmd, **params})
    assert answer.status_code == 200, answer.text
    return answer.json()


def typed(node: SimulatedNode, kind: str, n: int = 0) -> str:
    return [p for p in node.tag_paths() if node.tag_type(p) == kind and "," not in p][n]


def read_value(c: httpx.Client, path: str) -> Any:
    tags = get(c, "tag", "read", path=path)["tags"]
    return tags[path.rsplit("/", 1)[1]]["data"]


# -- tags: write, read, subscriptions ---------------------------------------------------------


def test_write_then_read_returns_the_value(c: httpx.Client, node: SimulatedNode) -> None:
    number, flag, text = typed(node, "number"), typed(node, "boolean"), typed(node, "string")
    for path, value in ((number, 12.25), (flag, True), (text, 'Wartung, "jetzt"')):
        assert post(c, "tag", "write", {"path": path, "value": value}).status_code == 200
        assert read_value(c, path) == {"value": value, "quality": 192, "ts": NOW}


@pytest.mark.parametrize(
    ("kind", "value"), [("number", "12"), ("number", True), ("boolean", 1), ("string", 3.5)]
)
def test_write_of_the_wrong_type_is_refused(
    c: httpx.Client, node: SimulatedNode, kind: str, value: Any
) -> None:
    path = typed(node, kind, 1)
    before = read_value(c, path)
    answer = post(c, "tag", "write", {"path": path, "value": value})
    assert answer.status_code == 400
    assert read_value(c, path) == before


def test_write_many_takes_a_comma_string_or_a_json_array(
    c: httpx.Client, node: SimulatedNode
) -> None:
    a, b = typed(node, "number", 2), typed(node, "number", 3)
    assert (
        post(c, "tag", "writeMany", {"paths": f"{a},{b}", "values": [1.5, 2.5]}).status_code == 200
    )
    assert (read_value(c, a)["value"], read_value(c, b)["value"]) == (1.5, 2.5)
    assert post(c, "tag", "writeMany", {"paths": [a, b], "values": [3, 4]}).status_code == 200
    assert (read_value(c, a)["value"], read_value(c, b)["value"]) == (3, 4)
    assert post(c, "tag", "writeMany", {"paths": f"{a},{b}", "values": [1]}).status_code == 400
    assert post(c, "tag", "writeMany", {"paths": f"{a},/nope", "values": [1, 2]}).status_code == 404
    assert read_value(c, a)["value"] == 3  # nothing of a refused writeMany is applied


def test_subscription_collects_write_events_with_limit_and_remaining(
    c: httpx.Client, node: SimulatedNode
) -> None:
    created = post(c, "tag", "subscribe", {"data": {"who": "test"}}).json()
    sid = created["id"]
    assert created["model"]["tags"]
    path = typed(node, "number", 4)
    for value in (1.0, 2.0, 3.0):
        post(c, "tag", "write", {"path": path, "value": value})
    listed = {s["id"]: s for s in get(c, "tag", "subscriptions")}
    assert listed[sid] == {"id": sid, "data": {"who": "test"}, "discardedEvents": 0, "events": 3}
    first = get(c, "tag/", "subscriptionEvents", id=sid, limit=2)
    assert first["remainingEvents"] == 1
    assert [e["data"]["value"] for e in first["events"]] == [1.0, 2.0]
    assert first["events"][0] == {
        "type": "tag",
        "tag": path,
        "data": {"value": 1.0, "quality": 192, "ts": NOW},
        "status": None,
    }
    rest = get(c, "tag/", "subscriptionEvents", id=sid)
    assert ([e["data"]["value"] for e in rest["events"]], rest["remainingEvents"]) == ([3.0], 0)
    assert post(c, "tag/", "cancelSubscription", {"id": sid}).status_code == 200
    assert c.get("/tag/", params={"cmd": "subscriptionEvents", "id": sid}).status_code == 404


def test_tags_configuration_change_is_a_model_event(c: httpx.Client) -> None:
    sid = post(c, "tag", "subscribe").json()["id"]
    document = orjson.dumps(
        {"version": {"main": 1}, "result": ["Object", {}], "editor": {}}
    ).decode()
    body = {"moduleName": "Historian", "configName": "tags", "data": document}
    assert post(c, "module", "setConfigData", body).status_code == 200
    events = get(c, "tag/", "subscriptionEvents", id=sid)["events"]
    assert [e["type"] for e in events] == ["model"]
    assert events[0]["model"]["tags"]
    assert get(c, "module", "getConfigData", moduleName="Historian", configName="tags") == document


def test_full_subscription_queue_discards_the_oldest_and_counts_them() -> None:
    subscriptions = Subscriptions(lambda: {"tags": {}}, capacity=3)
    sid = orjson.loads(subscriptions.subscribe({}).body)["id"]
    for n in range(5):
        subscriptions.publish_tag("/a", n, 192, n)
    answer = orjson.loads(subscriptions.events({"id": str(sid)}).body)
    assert answer["discardedEvents"] == 2
    assert [e["data"]["value"] for e in answer["events"]] == [2, 3, 4]
    assert orjson.loads(subscriptions.events({"id": str(sid)}).body)["discardedEvents"] == 0


def test_browse_read_and_details_shapes(c: httpx.Client, node: SimulatedNode) -> None:
    tree = get(c, "tag", "browse", path="/", **{"options.recurrent": "true"})
    line = tree["groups"]["Plant A"]["groups"]["Line 1"]["tags"]
    assert all(entry["fullPath"].startswith("/Plant A/Line 1/") for entry in line.values())
    flat = get(c, "tag", "browse", path="/Plant A/Line 1", **{"options.flat": "true"})
    assert sorted(flat) == sorted(p for p in node.tag_paths() if p.startswith("/Plant A/Line 1/"))
    details = get(c, "tag", "details", path="/Plant A/Line 1/*")
    entry = next(iter(details["tags"].values()))
    assert entry["config"]["extensions"]["history"]["config"]["defaultMethod"] in ("avg", "last")
    assert entry["fullPath"] in node.tag_paths()
    assert c.get("/tag", params={"cmd": "read", "path": "/No/where"}).status_code == 404


# -- alarms ------------------------------------------------------------------------------------


def find_clock(node: SimulatedNode, c: httpx.Client, status: int) -> tuple[int, dict[str, Any]]:
    """A moment when some alarm has `status` (the clock is moved in 10-minute steps)."""
    for step in range(200):
        node.set_clock(NOW + step * 600_000)
        found = get(c, "alarm", "get", path="/", **{"options.filter.status": status})
        if found:
            return NOW + step * 600_000, found[0]
    pytest.fail(f"no alarm reached status {status}")


@pytest.mark.parametrize(("before", "after"), [(3, 1), (2, 0)])
def test_ack_moves_unacknowledged_alarms_and_records_who_and_why(
    c: httpx.Client, node: SimulatedNode, before: int, after: int
) -> None:
    try:
        now, alarm = find_clock(node, c, before)
        body = {"paths": [alarm["path"]], "msg": "checked on site"}
        assert post(c, "alarm", "ack", body).status_code == 200
        state = get(c, "alarm", "get", path=alarm["path"])
        assert state[0]["status"] == after
        assert state[0]["ackInfo"] == {"ts": now, "user": "api", "msg": "checked on site"}
        history = get(
            c, "alarm", "history", path=alarm["path"], start=str(now - HOUR), end=str(now)
        )
        assert history["data"][-1]["status"] == after
        assert history["data"][-1]["ts"] == now
        truth = node.alarm_ground_truth(now - HOUR, now + 1, path=alarm["path"])
        assert history["data"] == truth
    finally:
        node.set_clock(NOW)


def test_ack_of_an_unknown_alarm_is_404(c: httpx.Client) -> None:
    assert post(c, "alarm", "ack", {"paths": ["/Alarms/none"]}).status_code == 404


def test_alarm_filters_and_count(c: httpx.Client, node: SimulatedNode) -> None:
    everything = get(c, "alarm", "get", path="/")
    assert len(everything) == len(node.alarm_paths()) == 6
    high = get(c, "alarm", "get", path="/", **{"options.filter.minPriority": 3})
    assert {a["path"] for a in high} == {a["path"] for a in everything if a["priority"] >= 3}
    alias = get(c, "alarm", "get", path="/", **{"options.filter.priority": 3})
    assert alias == high
    low = get(c, "alarm", "get", path="/", **{"options.filter.maxPriority": 2})
    assert {a["priority"] for a in low} <= {1, 2}
    regex = get(c, "alarm", "get", path="/", **{"options.filter.path": "Line 1"})
    assert regex
    assert all("Line 1" in a["path"] for a in regex)
    assert get(c, "alarm", "count", path="/", **{"options.filter.minPriority": 3}) == len(high)
    assert c.get("/alarm", params={"cmd": "get"}).status_code == 400


def test_alarm_history_matches_ground_truth_with_filters(
    c: httpx.Client, node: SimulatedNode
) -> None:
    start, end = NOW - 12 * HOUR, NOW - 2 * HOUR
    params = {"options.filter.minPriority": "2", "options.filter.status": "3"}
    answer = get(c, "alarm", "history", path="/", start=str(start), end=str(end - 1), **params)
    truth = node.alarm_ground_truth(start, end, AlarmFilter(min_priority=2, status=3))
    assert answer["data"] == truth
    assert truth
    assert all(e["status"] == 3 and e["priority"] >= 2 and "origin" in e for e in truth)
    assert answer["request"]["options"]["filter"] == {
        "path": None,
        "status": 3,
        "minPriority": 2,
        "maxPriority": None,
    }


# -- backups ------------------------------------------------------------------------------------


def test_backup_round_trip_restores_written_values(c: httpx.Client, node: SimulatedNode) -> None:
    path = typed(node, "number", 5)
    post(c, "tag", "write", {"path": path, "value": 100.0})
    body = {"name": "before-change", "metadata": {"description": "nightly"}}
    assert post(c, "backup", "create", body).status_code == 200
    listed = get(c, "backup", "get")["before-change"]
    assert (listed["description"], listed["node"]) == ("nightly", "sim-node")
    assert {"exe", "bootstrap"} <= set(listed["versions"])
    exported = c.get("/backup", params={"cmd": "export", "name": "before-change"}).text
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(exported))) as archive:
        assert orjson.loads(archive.read("config.json"))["written"][path] == 100.0
    post(c, "tag", "write", {"path": path, "value": -1.0})
    assert post(c, "backup", "import", {"name": "copy", "data": exported}).status_code == 200
    assert post(c, "backup", "rename", {"name": "copy", "rename": "restored"}).status_code == 200
    loaded = post(c, "backup", "load", {"name": "restored"}).json()
    assert loaded["completed"] is True
    assert read_value(c, path)["value"] == 100.0
    assert set(get(c, "backup", "get")) >= {"before-change", "restored"}
    assert post(c, "backup", "delete", {"name": "restored"}).status_code == 200
    assert c.get("/backup", params={"cmd": "export", "name": "restored"}).status_code == 404
    assert post(c, "backup", "import", {"name": "bad", "data": "bm90IGEgemlw"}).status_code == 400


# -- certificates, modules, licenses, logs, links, system ---------------------------------------


def test_certificate_trust_untrust_and_remove(c: httpx.Client) -> None:
    def ids() -> dict[str, str]:
        return {cert["id"]: cert["status"] for cert in get(c, "certificate", "get")}

    assert ids()["pending/client-7"] == "pending"
    options = {
        "moduleName": "bootstrap",
        "type": "inbound",
        "id": "pending/client-7",
        "action": "trust",
    }
    assert post(c, "certificate", "set", {"options": options}).status_code == 200
    assert ids()["trusted/client-7"] == "trusted"
    assert "pending/client-7" not in ids()
    options = {**options, "id": "trusted/client-7", "action": "untrust"}
    assert post(c, "certificate", "set", {"options": options}).status_code == 200
    assert ids()["pending/client-7"] == "pending"
    exported = get(c, "certificate", "export", **{"options.id": "pending/client-7"})
    assert base64.b64decode(exported).startswith(b"-----BEGIN CERTIFICATE-----")
    assert (
        post(c, "certificate", "remove", {"options": {"id": "pending/client-7"}}).status_code == 200
    )
    assert "pending/client-7" not in ids()
    inbound = get(c, "certificate", "get", **{"options.type": "links_inbound"})
    assert [cert["type"] for cert in inbound] == ["links_inbound"]


def test_module_stop_start_restart_change_pid_and_times(
    c: httpx.Client, node: SimulatedNode
) -> None:
    def module() -> Any:
        return get(c, "module", "details")["modules"]["ModbusClient"]

    before = module()
    node.set_clock(NOW + 60_000)
    try:
        assert post(c, "module", "stop", {"moduleName": "ModbusClient"}).status_code == 200
        stopped = module()
        assert (stopped["running"], stopped["pid"]) == (False, 0)
        assert stopped["lastStop"] == "2026-05-28T20:27:40.000Z"
        post(c, "module", "start", {"moduleName": "ModbusClient"})
        started = module()
        assert started["running"] is True
        assert started["pid"] != before["pid"]
        post(c, "module", "restart", {"moduleName": "ModbusClient"})
        assert module()["pid"] == started["pid"] + 1
    finally:
        node.set_clock(NOW)
    assert post(c, "module", "stop", {"moduleName": "Nope"}).status_code == 404
    assert "ModbusClient" in get(c, "module", "getInstances", filter='["ModbusClient"]')
    assert get(c, "module", "getInstalled") == sorted(get(c, "module", "getInstalled"))
    assert get(c, "module", "getConfigPresent", moduleName="Historian")["logger"] is True
    assert "logger" in get(c, "module", "getConfigList")


def test_license_add_read_remove(c: httpx.Client) -> None:
    uid = get(c, "license", "getUid")["uid"]
    document = orjson.dumps(
        {
            "version": 1,
            "created": "2026-01-01T00:00:00.000Z",
            "signature": "ab12",
            "licenses": [
                {
                    "version": 1,
                    "host": "*",
                    "uid": "*",
                    "expires": "2099-01-01T00:00:00.000Z",
                    "type": "production",
                    "supportExpires": "2099-01-01T00:00:00.000Z",
                    "nonce": 7,
                    "id": "extra-1",
                    "modules": [{"type": "Historian", "tagAccess": "local", "count": 10}],
                }
            ],
        }
    ).decode()
    assert post(c, "license", "add", {"data": document}).status_code == 200
    added = {lic["name"]: lic for lic in get(c, "license", "get")}["extra-1.lic"]
    assert added["licenses"][0]["uid"] == uid
    assert added["licenses"][0]["supportExpires"] == 4_070_908_800_000
    assert added["licenses"][0]["modules"][0]["used"] == 0
    assert get(c, "license", "read", name="extra-1.lic") == document
    assert post(c, "license", "remove", {"name": "extra-1.lic"}).status_code == 200
    assert c.get("/license", params={"cmd": "read", "name": "extra-1.lic"}).status_code == 404
    assert post(c, "license", "add", {"data": "{}"}).status_code == 400


def test_log_browse_and_export(c: httpx.Client) -> None:
    logs = get(c, "log/", "browse")
    day, size = logs["Historian"][-1]
    assert day == "2026-05-28"
    exported = c.get("/log/", params={"cmd": "export", "selection": f'["Historian.{day}"]'})
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(exported.text))) as archive:
        [name] = archive.namelist()
        assert len(archive.read(name)) == size
    missing = c.get("/log", params={"cmd": "export", "selection": "Historian.1999-01-01"})
    assert missing.status_code == 404


def test_links_redundancy_and_system(c: httpx.Client, node: SimulatedNode) -> None:
    links = get(c, "link", "get")
    assert links["nodeInfo"]["name"] == "sim-node"
    assert links["links"]["to-remote"]["remote"]["endpoint"] == "127.0.0.1:3800"
    assert (
        get(c, "link", "get", **{"options.remoteNode": "sim-remote"})["nodeInfo"]["name"]
        == "sim-remote"
    )
    status = get(c, "system", "status")
    assert status["n3"]["tags"]["total"] == 30
    assert status["n3"]["node"] == "sim-node"
    assert status["sys"]["ts"] == NOW
    assert get(c, "system", "errorCount") == 0
    assert get(c, "redundancy", "status")["mode"] == "primary"
    assert c.get("/system", params={"cmd": "restartService"}).status_code == 405


def test_the_simulator_counts_requests_in_flight_and_their_peak() -> None:
    import threading

    sim = SimulatedNode(SimConfig(seed=22, tags=10))
    sim.faults.configure(rate=1.0, kinds=["slow"], slow_s=0.5, operations=["tag.browse"])
    with run_server(sim, https_port=None) as server:

        def ask() -> None:
            httpx.get(f"{server.http_url}/tag", params={"cmd": "browse", "path": "/"}, timeout=10)

        askers = [threading.Thread(target=ask) for _ in range(3)]
        for asker in askers:
            asker.start()
        for asker in askers:
            asker.join()
        sim.faults.clear()
        stats = httpx.get(f"{server.http_url}/system", params={"cmd": "status"}).json()
    requests = stats["simulator"]["requests"]
    assert requests["peakInFlight"] == 3, "three slow answers overlapped"
    assert requests["inFlight"] == 1  # the status request itself
    assert requests["served"] == 4
    sim.reset_peak()
    assert sim.peak_in_flight == 0
