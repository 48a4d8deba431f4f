"""The client's request shapes, error mapping and retries, through `httpx.MockTransport`.

Plus the faults only a real socket can produce (short bodies, resets, timeouts, refused
connections) against the simulator on loopback, and the rule that no secret ever
reaches a log record, a repr or an error message.
"""

from __future__ import annotations

import email.utils
import gc
import logging
import socket
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

import httpx
import orjson
import pytest

from connectors.admin import NodeAdmin
from connectors.client import NodeClient
from connectors.errors import (
    AnswerTooLarge,
    AuthenticationError,
    MalformedAnswer,
    NodeBusy,
    NodeConnectionError,
    NodeError,
    NodeRequestError,
    NodeServerError,
    NodeTimeout,
    NodeUnavailable,
    NotTheNodesAnswer,
    RateLimited,
    RetriesExhausted,
    TransientNodeError,
    UnknownTag,
)
from connectors.options import AlarmFilter, HistoryOptions
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.subscriptions import NodeSubscriptions

START = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
END = START + timedelta(hours=1)
HOSTILE = [
    "/Plant B/Pumps, Main/Flow, Rate 1",
    "/Hostile/quote ' and \" double",
    "/Usine Süd/Pompe ß/温度 2",
    "/Hostile/back\\slash and %2F percent & amp=eq+plus#hash?q",
]

Handler = Callable[[httpx.Request], httpx.Response]


class Recorder:
    """A transport that answers from a script (the last answer repeats) and keeps requests."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers) or [httpx.Response(200, content=b"0")]
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def query(self, index: int = -1) -> dict[str, str]:
        return dict(parse_qsl(self.requests[index].url.query.decode(), keep_blank_values=True))


def mock_client(recorder: Recorder, **settings: Any) -> NodeClient:
    base: dict[str, Any] = {
        "url": "http://node.test",
        "name": "mock",
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.002,
    }
    return NodeClient(NodeSettings(**{**base, **settings}), transport=httpx.MockTransport(recorder))


def json_answer(value: Any, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(status, content=orjson.dumps(value), headers=headers)


# -- request shape ---------------------------------------------------------------------------


def test_history_many_query_is_exact_dot_keys_json_array_iso_utc() -> None:
    recorder = Recorder(json_answer({}))
    options = HistoryOptions(mode="raw", limit=500, invalid_as_null=False)
    with mock_client(recorder) as client:
        client.tag_history_many_bytes(HOSTILE, START, END, options)
    request = recorder.requests[0]
    assert request.method == "GET"
    assert request.url.host == "node.test"
    assert request.url.port == 3003
    assert request.url.path == "/tag"
    assert recorder.query() == {
        "cmd": "historyMany",
        "paths": orjson.dumps(HOSTILE).decode(),
        "start": "2024-03-01T12:00:00.000Z",
        "end": "2024-03-01T13:00:00.000Z",
        "options.mode": "raw",
        "options.invalidAsNull": "false",
        "options.limit": "500",
    }
    raw_query = request.url.query.decode()
    assert raw_query.startswith("cmd=historyMany&")
    assert all(ch.isascii() and ch not in " ,\"'+#" for ch in raw_query)


def test_history_filter_sends_the_list_as_path_and_paths() -> None:
    recorder = Recorder(json_answer({}))
    with mock_client(recorder) as client:
        client.tag_history_filter_bytes(
            ["/Plant A/"], START, END, HistoryOptions(), filter_regex="Temp\\.", recurrent=True
        )
    query = recorder.query()
    assert query["path"] == query["paths"] == '["/Plant A/"]'
    assert query["options.filter"] == "Temp\\."
    assert query["options.recurrent"] == "true"


def test_alarm_history_query_carries_the_filter() -> None:
    recorder = Recorder(json_answer({"request": {}, "data": []}))
    filt = AlarmFilter(path_regex="HI$", status=3, min_priority=2, remote_node=("a/b", "c"))
    with mock_client(recorder) as client:
        client.alarm_history_bytes("/Alarms/", START, END, filt)
    assert recorder.query() == {
        "cmd": "history",
        "path": "/Alarms/",
        "start": "2024-03-01T12:00:00.000Z",
        "end": "2024-03-01T13:00:00.000Z",
        "options.filter.path": "HI$",
        "options.filter.status": "3",
        "options.filter.minPriority": "2",
        "options.remoteNode": '["a/b","c"]',
    }


def test_post_sends_a_json_body_and_cmd_in_the_query() -> None:
    recorder = Recorder(httpx.Response(200))
    with mock_client(recorder) as client:
        NodeAdmin(client).tag_write(HOSTILE[1], True)
    request = recorder.requests[0]
    assert request.method == "POST"
    assert request.url.path == "/tag"
    assert recorder.query() == {"cmd": "write"}
    assert request.headers["Content-Type"] == "application/json"
    assert orjson.loads(request.content) == {"path": HOSTILE[1], "value": True}


@pytest.mark.parametrize(
    ("call", "path", "cmd"),
    [
        (lambda c: NodeSubscriptions(c).events(4, limit=10), "/tag/", "subscriptionEvents"),
        (lambda c: NodeSubscriptions(c).cancel(4), "/tag/", "cancelSubscription"),
        (lambda c: NodeAdmin(c).log_browse(), "/log/", "browse"),
    ],
)
def test_operations_the_spec_puts_under_a_trailing_slash(
    call: Callable[[NodeClient], Any], path: str, cmd: str
) -> None:
    recorder = Recorder(json_answer({"events": []} if cmd != "browse" else {}))
    with mock_client(recorder) as client:
        call(client)
    assert recorder.requests[0].url.path == path
    assert recorder.query()["cmd"] == cmd


def test_a_base_url_path_is_kept_before_the_resource() -> None:
    recorder = Recorder(httpx.Response(200, content=b"3"))
    with mock_client(recorder, url="https://gw.test/n3/") as client:
        assert NodeAdmin(client).system_error_count() == 3
    assert str(recorder.requests[0].url) == "https://gw.test:3443/n3/system?cmd=errorCount"


# -- answer decoding -------------------------------------------------------------------------


def test_plain_number_empty_and_json_string_answers() -> None:
    config = {"version": {"main": 1}, "result": ["Object", {}]}
    recorder = Recorder(
        httpx.Response(200, content=b"12\n"),
        httpx.Response(200, content=b""),
        json_answer(orjson.dumps(config).decode()),
    )
    with mock_client(recorder) as client:
        assert client.alarm_count("/") == 12
        NodeAdmin(client).backup_create("nightly")  # an empty 200 is success
        assert NodeAdmin(client).module_get_config_data("logger", "Logger") == config


def test_base64_zip_answer_is_decoded_raw_or_json_quoted() -> None:
    import base64

    archive = b"PK\x03\x04" + b"\x00" * 20
    text = base64.b64encode(archive)
    recorder = Recorder(httpx.Response(200, content=text), json_answer(text.decode()))
    with mock_client(recorder) as client:
        assert NodeAdmin(client).backup_export("a") == archive
        assert NodeAdmin(client).log_export(["Historian.2024-01-01"]) == archive


def test_system_status_accepts_flat_dotted_keys() -> None:
    flat = {"n3.pid": 12, "n3.node": "n", "n3.tags": {"total": 3}, "sys.hostname": "h"}
    with mock_client(Recorder(json_answer(flat))) as client:
        status = client.system_status()
    assert status.n3 is not None
    assert status.n3.pid == 12
    assert status.n3.tags is not None
    assert status.n3.tags.total == 3
    assert status.sys is not None
    assert status.sys.hostname == "h"


def test_unknown_fields_are_kept() -> None:
    answer = {"enabled": True, "standby": False, "mode": "backup", "since": 5}
    with mock_client(Recorder(json_answer(answer))) as client:
        status = NodeAdmin(client).redundancy_status()
    assert status.mode == "backup"
    assert status.model_extra == {"since": 5}


@pytest.mark.parametrize(
    ("body", "call"),
    [
        (b'{"n3": {"pid": 1', lambda c: c.system_status()),
        (b'"seven"', lambda c: c.alarm_count("/")),
        (b'{"a": 1}', lambda c: c.alarm_get("/")),
        (b'[{"description": "no path"}]', lambda c: c.alarm_get("/")),
        (b'{"tags": {"/a": {"data": {"quality": "good"}}}}', lambda c: c.tag_read("/a")),
        (b"not base64!", lambda c: NodeAdmin(c).backup_export("x")),
        (b'{"Historian": [["2024-01-01"]]}', lambda c: NodeAdmin(c).log_browse()),
    ],
    ids=[
        "truncated-json",
        "string-count",
        "object-not-array",
        "missing-field",
        "wrong-type",
        "not-base64",
        "short-pair",
    ],
)
def test_a_200_that_is_not_the_expected_json_is_malformed_and_not_retried(
    body: bytes, call: Callable[[NodeClient], Any]
) -> None:
    recorder = Recorder(httpx.Response(200, content=body))
    with mock_client(recorder, retries=3) as client, pytest.raises(MalformedAnswer) as caught:
        call(client)
    assert len(recorder.requests) == 1
    assert caught.value.operation in str(caught.value)


def test_bytes_fast_path_returns_the_body_verbatim() -> None:
    body = b'{"/a": {"request": {}, "data": [[1, 2.5, 192, 0]]}}'
    with mock_client(Recorder(httpx.Response(200, content=body))) as client:
        assert client.tag_history_many_bytes(["/a"], START, END, HistoryOptions()) == body


# -- status mapping and retries --------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (429, RateLimited),
        (500, NodeBusy),
        (502, NodeUnavailable),
        (503, NodeUnavailable),
        (504, NodeUnavailable),
    ],
)
def test_transient_statuses_are_retried_then_exhausted(status: int, error: type[NodeError]) -> None:
    recorder = Recorder(json_answer({"error": "busy"}, status))
    with mock_client(recorder, retries=3) as client, pytest.raises(RetriesExhausted) as caught:
        client.tag_history_many_bytes(["/a"], START, END, HistoryOptions())
    assert len(recorder.requests) == 4
    assert caught.value.attempts == 4
    assert isinstance(caught.value.last, error)
    assert caught.value.status == status
    message = str(caught.value)
    assert message.startswith(f"tag.historyMany: HTTP {status}: gave up after 4 attempts")
    assert message.endswith("; the node says 'busy'")


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_a_transient_status_then_success_returns_the_answer(status: int) -> None:
    recorder = Recorder(
        json_answer({"error": "x"}, status),
        json_answer({"error": "x"}, status),
        httpx.Response(200, content=b"5"),
    )
    with mock_client(recorder, retries=2) as client:
        assert NodeAdmin(client).system_error_count() == 5
    assert len(recorder.requests) == 3


@pytest.mark.parametrize(
    ("status", "operation", "error"),
    [
        (400, "system.status", NodeRequestError),
        (401, "system.status", AuthenticationError),
        (403, "system.status", AuthenticationError),
        (404, "system.status", NodeRequestError),
        (404, "tag.read", UnknownTag),
        (405, "system.status", NodeRequestError),
        (501, "system.status", NodeServerError),
    ],
)
def test_fatal_statuses_are_not_retried(
    status: int, operation: str, error: type[NodeError]
) -> None:
    recorder = Recorder(json_answer({"error": "no"}, status))
    call = NodeClient.tag_read if operation == "tag.read" else NodeClient.system_status
    args = ("/x",) if operation == "tag.read" else ()
    with mock_client(recorder, retries=3) as client, pytest.raises(error) as caught:
        call(client, *args)  # type: ignore[operator]
    assert len(recorder.requests) == 1
    assert not isinstance(caught.value, TransientNodeError)
    assert str(caught.value).startswith(f"{operation}: HTTP {status}: ")


def test_500_is_fatal_when_server_errors_are_not_retried() -> None:
    recorder = Recorder(json_answer({"error": "bug"}, 500))
    with (
        mock_client(recorder, retries=3, retry_server_errors=False) as client,
        pytest.raises(NodeServerError) as caught,
    ):
        client.system_status()
    assert len(recorder.requests) == 1
    assert not isinstance(caught.value, TransientNodeError)


# What one request costs with `retries: 2`, per kind of failure: the client's decision.
CLIENT_RETRY = [
    ("503", json_answer({"error": "busy"}, 503), {}, 3, RetriesExhausted),
    ("429", json_answer({"error": "slow"}, 429), {}, 3, RetriesExhausted),
    ("500", json_answer({"error": "load"}, 500), {}, 3, RetriesExhausted),
    (
        "500-not-retried",
        json_answer({"error": "bug"}, 500),
        {"retry_server_errors": False},
        1,
        NodeServerError,
    ),
    (
        "proxy-page",
        httpx.Response(200, content=b"  <!DOCTYPE html><p>login</p>"),
        {},
        3,
        RetriesExhausted,
    ),
    ("reset", httpx.ReadError("reset"), {}, 3, RetriesExhausted),
    ("malformed", httpx.Response(200, content=b'{"n3": {"pid": 1'), {}, 1, MalformedAnswer),
    ("401", json_answer({"error": "no"}, 401), {}, 1, AuthenticationError),
    ("400", json_answer({"error": "no"}, 400), {}, 1, NodeRequestError),
    ("501", json_answer({"error": "no"}, 501), {}, 1, NodeServerError),
]


@pytest.mark.parametrize(
    ("answer", "settings", "requests", "error"),
    [row[1:] for row in CLIENT_RETRY],
    ids=[row[0] for row in CLIENT_RETRY],
)
def test_the_client_retries_exactly_the_transient_failures(
    answer: httpx.Response | Exception,
    settings: dict[str, Any],
    requests: int,
    error: type[NodeError],
) -> None:
    recorder = Recorder(answer)
    with mock_client(recorder, retries=2, **settings) as client, pytest.raises(error):
        client.system_status()
    assert len(recorder.requests) == requests


def test_html_error_page_is_a_typed_error_with_its_start() -> None:
    page = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    recorder = Recorder(httpx.Response(502, content=page, headers={"Content-Type": "text/html"}))
    with mock_client(recorder, retries=1) as client, pytest.raises(RetriesExhausted) as caught:
        client.system_status()
    assert isinstance(caught.value.last, NodeUnavailable)
    assert "502 Bad Gateway" in str(caught.value)


def test_with_no_retries_the_transient_error_itself_is_raised() -> None:
    recorder = Recorder(json_answer({}, 503))
    with mock_client(recorder, retries=0) as client, pytest.raises(NodeUnavailable):
        client.system_status()
    assert len(recorder.requests) == 1


def test_retry_after_seconds_is_waited_at_least(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder(json_answer({}, 429, **{"Retry-After": "0.2"}), json_answer([]))
    with caplog.at_level(logging.WARNING, logger="historian.client"), mock_client(recorder) as c:
        assert c.alarm_get("/") == []
    assert len(recorder.requests) == 2
    (record,) = [r for r in caplog.records if r.name == "historian.client"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "alarm.get: HTTP 429 rate limited; attempt 1 of 6 failed, retrying in 0.20s"
    )


def test_retry_after_as_an_http_date_is_read() -> None:
    moment = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    recorder = Recorder(json_answer({}, 429, **{"Retry-After": moment}))
    with mock_client(recorder, retries=0) as client, pytest.raises(RateLimited) as caught:
        client.system_status()
    assert caught.value.retry_after_s is not None
    assert 27 <= caught.value.retry_after_s <= 31


@pytest.mark.parametrize(
    ("exception", "error"),
    [
        (httpx.ConnectError("refused"), NodeConnectionError),
        (httpx.ReadError("reset"), NodeConnectionError),
        (httpx.RemoteProtocolError("incomplete body"), NodeConnectionError),
        (httpx.ReadTimeout("slow"), NodeTimeout),
        (httpx.ConnectTimeout("slow"), NodeTimeout),
        (httpx.PoolTimeout("busy"), NodeTimeout),
    ],
)
def test_transport_failures_are_transient_and_retried(
    exception: Exception, error: type[NodeError]
) -> None:
    recorder = Recorder(exception, exception, httpx.Response(200, content=b"1"))
    with mock_client(recorder, retries=2) as client:
        assert NodeAdmin(client).system_error_count() == 1
    recorder = Recorder(exception)
    with mock_client(recorder, retries=1) as client, pytest.raises(RetriesExhausted) as caught:
        NodeAdmin(client).system_error_count()
    assert isinstance(caught.value.last, error)
    assert len(recorder.requests) == 2


def test_backoff_grows_and_is_capped(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder(json_answer({}, 503))
    with (
        caplog.at_level(logging.WARNING, logger="historian.client"),
        mock_client(recorder, retries=6, backoff_base_s=0.001, backoff_max_s=0.004) as client,
        pytest.raises(RetriesExhausted),
    ):
        client.system_status()
    waits = [float(r.getMessage().rsplit(" ", 1)[1].rstrip("s")) for r in caplog.records]
    assert len(waits) == 6
    assert all(0 <= wait <= 0.004 for wait in waits)


# -- real sockets: short bodies, resets, slow answers, refused connections -------------------


@pytest.fixture(scope="module")
def faulty() -> Iterator[tuple[SimulatedNode, Any]]:
    node = SimulatedNode(SimConfig(seed=5, tags=10))
    with run_server(node, http_port=0, https_port=None) as handle:
        yield node, handle


def _sim_client(handle: Any, **settings: Any) -> NodeClient:
    base = {"url": handle.http_url, "name": "faulty", "backoff_base_s": 0.001}
    return NodeClient(NodeSettings(**{**base, **settings}))


@pytest.mark.parametrize("kind", ["truncate", "reset", "503", "429", "500"])
def test_socket_faults_are_retried_and_the_answer_is_complete(
    faulty: tuple[SimulatedNode, Any], kind: str
) -> None:
    node, handle = faulty
    paths = node.tag_paths()[:3]
    options = HistoryOptions(mode="raw")
    with _sim_client(handle) as client:
        expected = client.tag_history_many_bytes(paths, START, END, options)
        node.faults.fail_next(kind, 2)
        try:
            assert client.tag_history_many_bytes(paths, START, END, options) == expected
        finally:
            node.faults.clear()


@pytest.mark.parametrize(
    ("kind", "error"), [("truncate", NodeConnectionError), ("reset", NodeConnectionError)]
)
def test_a_short_body_is_a_connection_error_not_data(
    faulty: tuple[SimulatedNode, Any], kind: str, error: type[NodeError]
) -> None:
    node, handle = faulty
    node.faults.fail_next(kind, 1)
    try:
        with _sim_client(handle, retries=0) as client, pytest.raises(error) as caught:
            client.tag_history_many_bytes(node.tag_paths()[:3], START, END, HistoryOptions())
    finally:
        node.faults.clear()
    assert caught.value.operation == "tag.historyMany"


def test_a_web_page_in_place_of_the_answer_is_asked_again(
    faulty: tuple[SimulatedNode, Any],
) -> None:
    node, handle = faulty
    with _sim_client(handle) as client:
        expected = NodeAdmin(client).system_error_count()
        node.faults.fail_next("nonjson", 1)
        try:
            assert NodeAdmin(client).system_error_count() == expected
        finally:
            node.faults.clear()


def test_a_web_page_that_persists_exhausts_the_retries_naming_it(
    faulty: tuple[SimulatedNode, Any],
) -> None:
    node, handle = faulty
    node.faults.fail_next("nonjson", 2)
    try:
        with _sim_client(handle, retries=1) as client, pytest.raises(RetriesExhausted) as caught:
            client.system_status()
    finally:
        node.faults.clear()
    assert isinstance(caught.value.last, NotTheNodesAnswer)
    assert "<html>" in str(caught.value)


def test_a_slow_answer_is_a_timeout(faulty: tuple[SimulatedNode, Any]) -> None:
    node, handle = faulty
    node.faults.configure(rate=1.0, kinds=["slow"], slow_s=0.6)
    try:
        with (
            _sim_client(handle, retries=1, read_timeout_s=0.15) as client,
            pytest.raises(RetriesExhausted) as caught,
        ):
            client.system_status()
    finally:
        node.faults.clear()
    assert isinstance(caught.value.last, NodeTimeout)


def test_a_refused_connection_is_a_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = NodeSettings(url=f"http://127.0.0.1:{port}", retries=1, backoff_base_s=0.001)
    with NodeClient(settings) as client, pytest.raises(RetriesExhausted) as caught:
        client.system_status()
    assert isinstance(caught.value.last, NodeConnectionError)
    assert f"127.0.0.1:{port}" in str(caught.value)


# -- secrets ---------------------------------------------------------------------------------


def test_no_secret_in_logs_reprs_or_errors(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    token, wrong = "tok-SECRET-4c1d9e", "tok-WRONG-77aa01"
    node = SimulatedNode(SimConfig(seed=2, tags=10, token=token))
    errors: list[BaseException] = []
    caplog.set_level(logging.DEBUG)  # httpx and httpcore included
    with run_server(node, http_port=0, https_port=None) as handle:
        monkeypatch.setenv("NODE_TOKEN_OK", token)
        monkeypatch.setenv("NODE_TOKEN_BAD", wrong)
        good = NodeSettings(url=handle.http_url, token_env="NODE_TOKEN_OK", backoff_base_s=0.001)
        bad = NodeSettings(url=handle.http_url, token_env="NODE_TOKEN_BAD")
        with NodeClient(good) as client:
            node.faults.fail_next("503", 2)
            assert NodeAdmin(client).system_error_count() == 0  # retried past two 503s: logged
            node.faults.fail_next("502", 10)
            with pytest.raises(RetriesExhausted) as exhausted:
                NodeAdmin(client).system_error_count()
            errors.append(exhausted.value)
            texts = [repr(client), repr(client.settings), str(client.settings)]
        with NodeClient(bad) as client, pytest.raises(AuthenticationError) as refused:
            client.system_status()
        errors.append(refused.value)
    assert any("attempt 1 of 6" in r.getMessage() for r in caplog.records)
    texts += [r.getMessage() for r in caplog.records]
    texts += [str(r.args) for r in caplog.records]
    texts += [t for e in errors for t in (str(e), repr(e), str(e.__dict__))]
    for secret in (token, wrong):
        assert not any(secret in text for text in texts), secret


def test_no_password_in_repr_or_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_USER", "ops")
    monkeypatch.setenv("NODE_PASSWORD", "pw-SECRET-91")
    recorder = Recorder(json_answer({"error": "no"}, 401))
    with mock_client(recorder, username_env="NODE_USER", password_env="NODE_PASSWORD") as client:
        text = repr(client) + repr(client.settings)
        with pytest.raises(AuthenticationError) as caught:
            client.system_status()
    assert recorder.requests[0].headers["Authorization"].startswith("Basic ")
    assert "pw-SECRET-91" not in text + str(caught.value) + repr(caught.value)


def test_the_token_travels_in_the_header_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_TOKEN", "tok-HEADER-5")
    recorder = Recorder(httpx.Response(200, content=b"0"))
    with mock_client(recorder, token_env="NODE_TOKEN") as client:
        NodeAdmin(client).system_error_count()
    request = recorder.requests[0]
    assert request.headers["Authorization"] == "Bearer tok-HEADER-5"
    assert "tok-HEADER-5" not in str(request.url)


# -- the size of one answer ------------------------------------------------------------------


def test_a_history_answer_over_max_answer_bytes_stops_being_read_at_the_cap() -> None:
    """Read in pieces and dropped at the cap: memory follows the cap, not the answer, and
    the answer is not retried (the same question gets the same answer)."""
    read = 0

    def pieces() -> Iterator[bytes]:
        nonlocal read
        for _ in range(1000):
            read += 10_000
            yield b" " * 10_000

    recorder = Recorder(httpx.Response(200, content=pieces()))
    client = mock_client(recorder, max_answer_bytes=50_000)
    with pytest.raises(
        AnswerTooLarge, match=r"tag.historyMany: answer over 50,000 bytes"
    ) as raised:
        client.tag_history_many_bytes(["/t"], START, END, HistoryOptions(mode="raw"))
    assert raised.value.limit_bytes == 50_000
    assert read <= 60_000
    assert len(recorder.requests) == 1


def test_answers_within_the_cap_and_other_operations_are_read_whole() -> None:
    body = orjson.dumps({"/t": {"data": [[1, 2.0, 192]] * 5000}})
    recorder = Recorder(httpx.Response(200, content=body))
    client = mock_client(recorder, max_answer_bytes=len(body))
    assert client.tag_history_many_bytes(["/t"], START, END, HistoryOptions()) == body
    # The cap is on history answers (the ones that grow with data): a large tree is read.
    small = mock_client(Recorder(httpx.Response(200, content=body)), max_answer_bytes=1000)
    assert small.tag_browse_bytes("/") == body


def test_an_answer_is_freed_with_its_last_reference_not_at_a_cyclic_collection() -> None:
    """httpx binds a response's stream to the response: left so, every answer's bytes stay
    until the cyclic collector runs, and a chunk's answers stack up in memory."""
    answer_each_time = httpx.MockTransport(lambda request: json_answer({"/t": {"data": []}}))
    client = NodeClient(NodeSettings(url="http://node.test"), transport=answer_each_time)
    gc.disable()
    try:
        response = client.request("tag.historyMany", "GET", "tag", "historyMany", max_bytes=100)
        answer = weakref.ref(response)
        del response
        assert answer() is None
    finally:
        gc.enable()
