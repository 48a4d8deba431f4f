"""The simulator over real loopback HTTP/HTTPS with raw httpx: history, auth, TLS, faults.

Read-only tests use the session `sim_server` (its clock may be frozen by other tests, so
windows here lie in 2025, well in the past either way). Tests that change state or
inject faults use their own node.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.simulator.protocol import Answer, iso_ms

START = 1_750_000_000_000  # 2025-06-15T15:06:40Z
END = START + 3_600_000
NOW = 1_780_000_000_000


def history_params(**extra: Any) -> dict[str, Any]:
    return {"start": str(START), "end": str(END), **extra}


@pytest.fixture(scope="module")
def client(sim_server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim_server.http_url, timeout=10) as c:
        yield c


@pytest.fixture(scope="module")
def capped() -> Iterator[tuple[SimulatedNode, httpx.Client]]:
    """A node with a small raw cap (50 samples per tag per answer) and a frozen clock."""
    node = SimulatedNode(SimConfig(seed=3, tags=20, raw_cap=50))
    node.set_clock(NOW)
    with run_server(node, https_port=None) as server, httpx.Client(base_url=server.http_url) as c:
        yield node, c


def rows_of(answer: httpx.Response) -> dict[str, list[list[Any]]]:
    assert answer.status_code == 200, answer.text
    return {path: entry["data"] for path, entry in answer.json().items()}


# -- history over the wire --------------------------------------------------------------------


def test_history_many_raw_matches_ground_truth(
    client: httpx.Client, sim_node: SimulatedNode
) -> None:
    paths = sim_node.tag_paths()[:6]
    params = history_params(cmd="historyMany", paths=orjson.dumps(paths).decode())
    params["options.mode"] = "raw"
    answer = rows_of(client.get("/tag", params=params))
    assert list(answer) == paths
    for path in paths:
        truth = sim_node.ground_truth(path, START, END, HistoryOptions(mode="raw"))
        assert [row for row in answer[path] if row[0] < END] == truth


def test_history_answer_echoes_the_request(client: httpx.Client, sim_node: SimulatedNode) -> None:
    path = sim_node.tag_paths()[0]
    answer = client.get("/tag/", params=history_params(cmd="history", path=path))
    body = answer.json()
    assert body["request"] == {
        "tag": path,
        "start": START,
        "end": END,
        "options": {
            "mode": "delta",
            "method": "",
            "interval": None,
            "deadband": None,
            "invalidAsNull": True,
            "limit": None,
        },
        "data": None,
    }
    truth = sim_node.ground_truth(path, START, END, HistoryOptions(mode="delta"))
    assert [row for row in body["data"] if row[0] < END] == truth


def test_raw_bounds_are_inclusive_at_both_ends(
    client: httpx.Client, sim_node: SimulatedNode
) -> None:
    path = sim_node.tag_paths()[0]
    stamps = [row[0] for row in sim_node.ground_truth(path, START, END, HistoryOptions(mode="raw"))]
    first, last = stamps[3], stamps[-3]
    params = {"cmd": "history", "path": path, "start": str(first), "end": str(last)}
    data = client.get("/tag", params={**params, "options.mode": "raw"}).json()["data"]
    assert data[0][0] == first
    assert data[-1][0] == last


def test_start_and_end_accept_iso_with_z_or_offset_and_epoch_ms(
    client: httpx.Client, sim_node: SimulatedNode
) -> None:
    path = sim_node.tag_paths()[1]
    forms = [
        (str(START), str(END)),
        ("2025-06-15T15:06:40Z", "2025-06-15T16:06:40.000Z"),
        ("2025-06-15T17:06:40+02:00", "2025-06-15T18:06:40+02:00"),
    ]
    answers = [
        client.get("/tag", params={"cmd": "history", "path": path, "start": s, "end": e}).json()
        for s, e in forms
    ]
    assert answers[0] == answers[1] == answers[2]


@pytest.mark.parametrize("form", ["json", "csv", "single"])
def test_list_parameters_as_json_array_csv_or_single_value(
    client: httpx.Client, sim_node: SimulatedNode, form: str
) -> None:
    paths = [p for p in sim_node.tag_paths() if "," not in p][:3]
    value = {"json": orjson.dumps(paths).decode(), "csv": ",".join(paths), "single": paths[0]}[form]
    answer = rows_of(client.get("/tag", params=history_params(cmd="historyMany", paths=value)))
    assert list(answer) == (paths[:1] if form == "single" else paths)


def test_paths_with_commas_need_the_json_array_form(
    client: httpx.Client, sim_node: SimulatedNode
) -> None:
    comma = next(p for p in sim_node.tag_paths() if "," in p)
    answer = rows_of(
        client.get(
            "/tag", params=history_params(cmd="historyMany", paths=orjson.dumps([comma]).decode())
        )
    )
    assert list(answer) == [comma]


def test_raw_answers_are_capped_by_limit_and_by_the_node(
    capped: tuple[SimulatedNode, httpx.Client],
) -> None:
    node, c = capped
    path = node.tag_paths()[0]
    truth = node.ground_truth(path, NOW - 3_600_000, NOW, HistoryOptions(mode="raw"))
    assert len(truth) > 100
    base = {"cmd": "history", "path": path, "start": str(NOW - 3_600_000), "end": str(NOW)}
    for limit, expected in ((None, 50), ("20", 20), ("100", 50)):
        params = {**base, "options.mode": "raw"}
        if limit is not None:
            params["options.limit"] = limit
        data = c.get("/tag", params=params).json()["data"]
        assert data == truth[:expected]


def test_limit_does_not_cap_other_modes(capped: tuple[SimulatedNode, httpx.Client]) -> None:
    node, c = capped
    path = next(p for p in node.tag_paths() if node.tag_type(p) == "number")
    params = {
        "cmd": "history",
        "path": path,
        "start": str(NOW - 24 * 3_600_000),
        "end": str(NOW),
        "options.mode": "aggregated",
        "options.interval": "600000",
        "options.limit": "5",
    }
    assert len(c.get("/tag", params=params).json()["data"]) == 144


@pytest.mark.parametrize("method", ["first", "last", "min", "max", "avg", "delta", "stddev"])
def test_aggregated_buckets_match_ground_truth(
    client: httpx.Client, sim_node: SimulatedNode, method: str
) -> None:
    paths = sim_node.tag_paths()[:8]
    params = history_params(cmd="historyMany", paths=orjson.dumps(paths).decode())
    params.update(
        {"options.mode": "aggregated", "options.method": method, "options.interval": "300000"}
    )
    answer = rows_of(client.get("/tag", params=params))
    options = HistoryOptions(mode="aggregated", method=method, interval_ms=300_000)  # type: ignore[arg-type]
    for path in paths:
        assert answer[path] == sim_node.ground_truth(path, START, END, options)
        assert [row[0] for row in answer[path]] == list(range(START, END, 300_000))


@pytest.mark.parametrize("mode", ["delta", "filter"])
def test_deadband_option_reaches_delta_and_filter(
    client: httpx.Client, sim_node: SimulatedNode, mode: str
) -> None:
    path = next(p for p in sim_node.tag_paths() if sim_node.tag_type(p) == "number")
    counts = []
    for deadband in ("0", "5", "50u"):
        params = history_params(cmd="history", path=path)
        params.update({"options.mode": mode, "options.deadband": deadband})
        data = client.get("/tag", params=params).json()["data"]
        truth = sim_node.ground_truth(
            path,
            START,
            END,
            HistoryOptions(mode=mode, deadband=float(deadband.rstrip("u"))),  # type: ignore[arg-type]
        )
        assert [row for row in data if row[0] < END] == truth
        counts.append(len(data))
    assert counts[0] > counts[1] > counts[2]


def test_history_filter_honours_path_and_paths_as_a_union(
    client: httpx.Client, sim_node: SimulatedNode
) -> None:
    line1 = sorted(p for p in sim_node.tag_paths() if p.startswith("/Plant A/Line 1/"))
    line2 = sorted(p for p in sim_node.tag_paths() if p.startswith("/Plant A/Line 2/"))
    base = history_params(cmd="historyFilter")
    only_path = rows_of(client.get("/tag", params={**base, "path": '["/Plant A/Line 1"]'}))
    only_paths = rows_of(client.get("/tag", params={**base, "paths": '["/Plant A/Line 2/"]'}))
    both = rows_of(
        client.get("/tag", params={**base, "path": "/Plant A/Line 1", "paths": "/Plant A/Line 2"})
    )
    assert sorted(only_path) == line1
    assert sorted(only_paths) == line2
    assert sorted(both) == sorted(line1 + line2)


def test_history_filter_regex_and_recurrent(client: httpx.Client, sim_node: SimulatedNode) -> None:
    base = history_params(cmd="historyFilter", path="/Plant A")
    assert rows_of(client.get("/tag", params=base)) == {}
    everything = rows_of(client.get("/tag", params={**base, "options.recurrent": "true"}))
    assert sorted(everything) == sorted(
        p for p in sim_node.tag_paths() if p.startswith("/Plant A/")
    )
    temps = rows_of(
        client.get(
            "/tag", params={**base, "options.recurrent": "true", "options.filter": r"Temp\. \d+$"}
        )
    )
    assert temps
    assert sorted(temps) == sorted(p for p in everything if "Temp." in p)
    answer = client.get("/tag", params={**base, "options.recurrent": "true"}).json()
    assert all(entry["request"]["options"]["recurrent"] is True for entry in answer.values())


def test_unknown_tags_are_404_alone_and_left_out_of_many(
    client: httpx.Client, sim_node: SimulatedNode
) -> None:
    known = sim_node.tag_paths()[0]
    single = client.get("/tag", params=history_params(cmd="history", path="/No/Such tag"))
    assert single.status_code == 404
    assert "error" in single.json()
    many = client.get(
        "/tag",
        params=history_params(cmd="historyMany", paths=orjson.dumps([known, "/No/Such"]).decode()),
    )
    assert list(rows_of(many)) == [known]


def test_remote_node_answers_and_an_unknown_one_is_404(
    client: httpx.Client, sim_node: SimulatedNode
) -> None:
    path = sim_node.tag_paths()[0]
    params = history_params(cmd="history", path=path, **{"options.mode": "raw"})
    local = client.get("/tag", params=params).json()["data"]
    remote = client.get("/tag", params={**params, "options.remoteNode": "sim-remote"}).json()[
        "data"
    ]
    truth = sim_node.ground_truth(
        path, START, END, HistoryOptions(mode="raw", remote_node="sim-remote")
    )
    assert [row for row in remote if row[0] < END] == truth
    assert remote != local
    routed = client.get("/tag", params={**params, "options.remoteNode": "sim-node/sim-remote"})
    assert routed.json()["data"] == remote
    assert (
        client.get("/tag", params={**params, "options.remoteNode": "elsewhere"}).status_code == 404
    )


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"cmd": "history", "start": "0", "end": "1"}, 400),  # no path
        ({"cmd": "historyMany", "paths": "/a", "start": "0"}, 400),  # no end
        ({"cmd": "historyMany", "paths": "/a", "start": "yesterday", "end": "1"}, 400),
        ({"cmd": "historyMany", "paths": "/a", "start": "5", "end": "1"}, 400),
        ({"cmd": "historyMany", "paths": "/a", "start": "0", "end": "1", "options.mode": "x"}, 400),
        (
            {"cmd": "historyMany", "paths": "/a", "start": "0", "end": "1", "options.limit": "ten"},
            400,
        ),
        (
            {"cmd": "historyFilter", "path": "/", "start": "0", "end": "1", "options.filter": "("},
            400,
        ),
        ({"cmd": "nonsense"}, 400),
        ({"cmd": "write"}, 405),
    ],
)
def test_invalid_requests_are_refused_with_an_error_body(
    client: httpx.Client, params: dict[str, str], status: int
) -> None:
    answer = client.get("/tag", params=params)
    assert answer.status_code == status
    assert isinstance(answer.json()["error"], str)


def test_unknown_resource_is_404(client: httpx.Client) -> None:
    assert client.get("/nothing", params={"cmd": "get"}).status_code == 404


def test_replay_mode_serves_the_same_bytes_until_history_changes() -> None:
    node = SimulatedNode(SimConfig(seed=4, tags=10, cache_answers=True))
    node.set_clock(NOW)
    path = node.tag_paths()[0]
    params = {
        "cmd": "history",
        "path": path,
        "start": str(NOW - 600_000),
        "end": str(NOW),
        "options.mode": "raw",
    }
    with run_server(node, https_port=None) as server, httpx.Client(base_url=server.http_url) as c:
        first = c.get("/tag", params=params).content
        assert c.get("/tag", params=params).content == first
        node.add_late_sample(path, NOW - 300_000 + 1, 99.5)
        assert [NOW - 300_000 + 1, 99.5, 192, 0] in c.get("/tag", params=params).json()["data"]


def test_replay_mode_serves_details_once_until_a_write_changes_a_value() -> None:
    node = SimulatedNode(SimConfig(seed=4, tags=10, cache_answers=True))
    path = next(p for p in node.tag_paths() if node.tag_type(p) == "number")
    group = path.rsplit("/", 1)[0] + "/"
    params = {"cmd": "details", "path": group}
    with run_server(node, https_port=None) as server, httpx.Client(base_url=server.http_url) as c:
        first = c.get("/tag", params=params).content
        assert node.cache_stats()[0] == 1
        assert c.get("/tag", params=params).content == first
        c.post("/tag", params={"cmd": "write"}, json={"path": path, "value": 12.5})
        entry = c.get("/tag", params=params).json()["tags"][path.rsplit("/", 1)[1]]
    assert entry["data"]["value"] == 12.5


def test_replay_mode_serves_one_question_spelled_two_ways_from_one_render() -> None:
    node = SimulatedNode(SimConfig(seed=4, tags=10, cache_answers=True))
    node.set_clock(NOW)
    paths = node.tag_paths()[:2]
    spellings = [
        {"paths": orjson.dumps(paths).decode(), "start": str(NOW - 600_000), "end": str(NOW)},
        {
            "paths": '["' + '", "'.join(paths) + '"]',
            "start": iso_ms(NOW - 600_000).replace(".000Z", "Z"),
            "end": iso_ms(NOW),
        },
    ]
    with run_server(node, https_port=None) as server, httpx.Client(base_url=server.http_url) as c:
        bodies = [
            c.get("/tag", params={"cmd": "historyMany", "options.mode": "raw", **query}).content
            for query in spellings
        ]
        other = {**spellings[0], "end": str(NOW - 1)}
        c.get("/tag", params={"cmd": "historyMany", "options.mode": "raw", **other})
    assert bodies[0] == bodies[1]
    assert node.cache_stats()[0] == 2  # the two spellings once, the other question once


def test_replay_mode_keeps_each_answer_once_while_they_fit_its_byte_limit() -> None:
    node = SimulatedNode(SimConfig(seed=4, tags=10, cache_answers=True, cache_limit_bytes=250))
    renders: list[str] = []

    def produce(key: str, size: int) -> Callable[[], Answer]:
        def render() -> Answer:
            renders.append(key)
            return Answer(body=key.encode() * size)

        return render

    first = node.cached("a", produce("a", 100))
    assert node.cached("a", produce("a", 100)).body is first.body  # the same bytes, no copy
    node.cached("b", produce("b", 100))
    assert node.cache_stats() == (2, 200)
    node.cached("c", produce("c", 100))  # does not fit: served, not kept; a and b stay
    node.cached("c", produce("c", 100))
    node.cached("a", produce("a", 100))
    assert node.cached("error", lambda: Answer(404, b"{}")).status == 404
    assert renders == ["a", "b", "c", "c"]
    assert node.cache_stats() == (2, 200)
    node.set_clock(NOW)
    assert node.cache_stats() == (0, 0)


def test_replay_mode_can_keep_answers_compressed() -> None:
    node = SimulatedNode(SimConfig(seed=4, tags=10, cache_answers=True, cache_compress=True))
    node.set_clock(NOW)
    params = {
        "paths": orjson.dumps(node.tag_paths()).decode(),
        "start": str(NOW - 3_600_000),
        "end": str(NOW),
        "options.mode": "raw",
    }
    fresh = node.handle("GET", "tag", "historyMany", params, None).body
    render = partial(node.handle, "GET", "tag", "historyMany", params, None)
    assert node.cached("q", render).body == fresh
    assert node.cached("q", lambda: Answer(500)).body == fresh  # replayed from memory
    answers, held = node.cache_stats()
    assert answers == 1
    assert held < len(fresh) / 3


def test_hostile_tag_names_round_trip_through_the_query_string() -> None:
    node = SimulatedNode(SimConfig(seed=2, tags=12, hostile_names=True))
    node.set_clock(NOW)
    hostile = [p for p in node.tag_paths() if p.startswith("/Hostile/")]
    params = {
        "cmd": "historyMany",
        "paths": orjson.dumps(hostile).decode(),
        "start": str(NOW - 600_000),
        "end": str(NOW),
        "options.mode": "raw",
    }
    with run_server(node, https_port=None) as server, httpx.Client(base_url=server.http_url) as c:
        answer = rows_of(c.get("/tag", params=params))
        assert sorted(answer) == sorted(hostile)
        read = c.get("/tag", params={"cmd": "read", "path": hostile[2]}).json()
        assert list(read["tags"]) == [hostile[2].rsplit("/", 1)[1]]


# -- authentication and TLS ----------------------------------------------------------------


@pytest.fixture(scope="module")
def guarded() -> Iterator[Any]:
    node = SimulatedNode(
        SimConfig(seed=8, tags=10, token="s3cret-token", username="ops", password="pw")
    )
    with run_server(node) as server:
        yield server


def test_auth_bearer_token_or_basic_is_required(guarded: Any) -> None:
    url = f"{guarded.http_url}/tag?cmd=getViews"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url, auth=("ops", "nope")).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer s3cret-token"}).json() == [
        "default",
        "operations",
        "maintenance",
    ]
    assert httpx.get(url, auth=("ops", "pw")).status_code == 200
    assert "s3cret" not in repr(guarded.node.config)


def test_https_works_with_the_ca_and_fails_without_it(sim_server: Any) -> None:
    url = f"{sim_server.https_url}/redundancy?cmd=status"
    assert sim_server.https_url.startswith("https://127.0.0.1:")
    with httpx.Client(verify=ssl.create_default_context(cafile=sim_server.ca_pem_path)) as c:
        assert c.get(url).json() == {"enabled": False, "standby": False, "mode": "primary"}
    with pytest.raises(httpx.ConnectError), httpx.Client() as c:
        c.get(url)


def test_keep_alive_serves_many_requests_on_one_connection(sim_server: Any) -> None:
    with httpx.Client(base_url=sim_server.http_url) as c:
        answers = [c.get("/system", params={"cmd": "errorCount"}) for _ in range(20)]
    assert all(a.text == "0" and a.headers["content-length"] == "1" for a in answers)


# -- faults ----------------------------------------------------------------------------------


@pytest.fixture
def faulty() -> Iterator[tuple[SimulatedNode, httpx.Client]]:
    node = SimulatedNode(SimConfig(seed=6, tags=10))
    node.set_clock(NOW)
    with (
        run_server(node, https_port=None) as server,
        httpx.Client(base_url=server.http_url, timeout=httpx.Timeout(2.0, read=0.5)) as c,
    ):
        yield node, c


def history_many(node: SimulatedNode) -> dict[str, str]:
    return {
        "cmd": "historyMany",
        "paths": orjson.dumps(node.tag_paths()[:3]).decode(),
        "start": str(NOW - 3_600_000),
        "end": str(NOW),
        "options.mode": "raw",
    }


@pytest.mark.parametrize("status", ["500", "502", "503", "504"])
def test_fail_next_injects_an_error_status_once(
    faulty: tuple[SimulatedNode, httpx.Client], status: str
) -> None:
    node, c = faulty
    node.faults.fail_next(status)
    assert c.get("/tag", params=history_many(node)).status_code == int(status)
    assert c.get("/tag", params=history_many(node)).status_code == 200
    assert node.faults.injected[status] == 1


def test_429_carries_retry_after(faulty: tuple[SimulatedNode, httpx.Client]) -> None:
    node, c = faulty
    node.faults.configure(rate=0.0, kinds=[], retry_after_s=0.25)
    node.faults.fail_next("429")
    answer = c.get("/tag", params=history_many(node))
    assert answer.status_code == 429
    assert answer.headers["Retry-After"] == "0.25"


def test_reset_breaks_the_connection(faulty: tuple[SimulatedNode, httpx.Client]) -> None:
    node, c = faulty
    node.faults.fail_next("reset")
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        c.get("/tag", params=history_many(node))
    assert c.get("/tag", params=history_many(node)).status_code == 200


def test_truncate_sends_half_the_body(faulty: tuple[SimulatedNode, httpx.Client]) -> None:
    node, c = faulty
    node.faults.fail_next("truncate")
    with pytest.raises(httpx.RemoteProtocolError):
        c.get("/tag", params=history_many(node))
    assert node.faults.injected["truncate"] == 1


def test_nonjson_answers_200_with_html(faulty: tuple[SimulatedNode, httpx.Client]) -> None:
    node, c = faulty
    node.faults.fail_next("nonjson")
    answer = c.get("/tag", params=history_many(node))
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/html"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(answer.content)


def test_slow_answers_after_the_client_gave_up(faulty: tuple[SimulatedNode, httpx.Client]) -> None:
    node, c = faulty
    node.faults.configure(rate=0.0, kinds=[], slow_s=1.0)
    node.faults.fail_next("slow")
    with pytest.raises(httpx.ReadTimeout):
        c.get("/tag", params=history_many(node))


def test_fault_sequence_is_fixed_by_the_seed_and_limited_to_operations(
    faulty: tuple[SimulatedNode, httpx.Client],
) -> None:
    node, c = faulty
    kinds = ["500", "503", "429", "nonjson"]

    def statuses() -> list[int]:
        node.faults.configure(rate=0.5, kinds=kinds, seed=42, operations=["tag.historyMany"])
        out = [c.get("/tag", params=history_many(node)).status_code for _ in range(30)]
        assert c.get("/tag", params={"cmd": "getViews"}).status_code == 200
        return out

    first, second = statuses(), statuses()
    assert first == second
    assert {200, 500, 503, 429} <= set(first)
    node.faults.clear()
    assert all(c.get("/tag", params=history_many(node)).status_code == 200 for _ in range(5))


def test_unknown_fault_kind_is_refused() -> None:
    node = SimulatedNode(SimConfig(tags=10))
    with pytest.raises(ValueError, match="unknown fault"):
        node.faults.configure(rate=1.0, kinds=["teapot"])


# -- restarts ---------------------------------------------------------------------------------


def test_restart_service_answers_503_then_returns_with_state_kept() -> None:
    node = SimulatedNode(SimConfig(seed=12, tags=10, restart_s=0.3))
    path = next(p for p in node.tag_paths() if node.tag_type(p) == "number")
    with run_server(node, https_port=None) as server, httpx.Client(base_url=server.http_url) as c:
        assert (
            c.post("/tag", params={"cmd": "write"}, json={"path": path, "value": 42.5}).status_code
            == 200
        )
        before = c.get("/system", params={"cmd": "status"}).json()["n3"]
        assert c.post("/system", params={"cmd": "restartService"}).status_code == 200
        assert c.get("/system", params={"cmd": "status"}).status_code == 503
        for _ in range(100):
            answer = c.get("/system", params={"cmd": "status"})
            if answer.status_code == 200:
                break
            time.sleep(0.05)
        after = answer.json()["n3"]
        assert after["pid"] != before["pid"]
        assert after["up"] <= 1
        value = c.get("/tag", params={"cmd": "read", "path": path}).json()["tags"]
        assert next(iter(value.values()))["data"]["value"] == 42.5


def test_server_restart_keeps_ports_and_state() -> None:
    node = SimulatedNode(SimConfig(seed=12, tags=10))
    path = next(p for p in node.tag_paths() if node.tag_type(p) == "number")
    with run_server(node, https_port=None) as server:
        url = server.http_url
        httpx.post(f"{url}/tag", params={"cmd": "write"}, json={"path": path, "value": 7})
        server.restart()
        assert server.http_url == url
        read = httpx.get(f"{url}/tag", params={"cmd": "read", "path": path}).json()
        assert next(iter(read["tags"].values()))["data"]["value"] == 7
        assert node.requests_served == 2


def test_simulate_command_serves_one_regular_period_and_refuses_a_bad_one() -> None:
    historian = str(Path(sys.executable).with_name("historian"))
    bad = subprocess.run(
        [historian, "simulate", "--period-ms", "0", "--https-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert "--period-ms must be between 1 and 86400000" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [historian, "simulate", "--port", str(port), "--https-port", "0", "--tags", "20"]
    process = subprocess.Popen(
        [*command, "--period-ms", "2500", "--replay"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                details = httpx.get(
                    f"http://127.0.0.1:{port}/tag",
                    params={"cmd": "details", "path": "/Plant A/Line 1/*"},
                    timeout=1,
                )
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.2)
        rates = {
            tuple(tag["config"]["extensions"]["history"]["config"]["rate"])
            for tag in details.json()["tags"].values()
        }
        assert rates == {(2500, 0)}
    finally:
        process.terminate()
        process.wait(timeout=10)
