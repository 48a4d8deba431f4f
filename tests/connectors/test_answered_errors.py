"""The node's error inside an answer (`{"error": "..."}`), at 200 and at any other status.

A node built on a web framework may answer an error with 200; read as an answer, it was a
tag named `error` holding a string, or a details answer without the tag (a false "tag not
found"). It is the node's error, named as such, and asked again (bounded) like any
transient answer. Pure readings first, then `MockTransport`, then the simulator's
`errors-in-200` profile over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest

from connectors.client import NodeClient
from connectors.errors import (
    NodeAnsweredError,
    NodeRequestError,
    RetriesExhausted,
    UnknownTag,
)
from connectors.failures import ERROR_BODY_MAX_BYTES, ERROR_SEARCHED_BYTES, node_error_of
from connectors.options import HistoryOptions
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server

START = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
END = START + timedelta(minutes=30)

ERROR_BODIES = {
    "string": ({"error": "database locked"}, "database locked"),
    "object with message": ({"error": {"message": "no route", "code": 7}}, "no route"),
    "flag and message": ({"error": True, "message": "invalid token"}, "invalid token"),
    "with status code": ({"error": "Not Found", "statusCode": 404}, "Not Found"),
}
NOT_ERRORS = {
    "a tag named error": {"error": {"request": {}, "data": [[1, 2.5, 192, 0]]}},
    "a tag named error, no data": {"error": None},
    "an empty error": {"error": ""},
    "an answer beside it": {"error": "x", "data": []},
    "a license list": [{"error": "", "id": "a"}],
    "an alarm history": {"request": {"path": "/"}, "data": [{"path": "/error"}]},
}


@pytest.mark.parametrize(("body", "said"), ERROR_BODIES.values(), ids=ERROR_BODIES.keys())
def test_an_error_envelope_is_the_nodes_error(body: Any, said: str) -> None:
    assert node_error_of(orjson.dumps(body)) == said


@pytest.mark.parametrize("body", NOT_ERRORS.values(), ids=NOT_ERRORS.keys())
def test_an_answer_that_merely_mentions_error_is_an_answer(body: Any) -> None:
    assert node_error_of(orjson.dumps(body)) is None


def test_a_long_answer_is_never_read_as_an_error() -> None:
    body = b'{"error": "' + b"x" * ERROR_BODY_MAX_BYTES + b'"}'
    assert node_error_of(body) is None


def test_a_longer_error_counts_only_when_error_is_its_first_key() -> None:
    stack = "at handler (/app/server.js:12:5) " * 300  # about 10 KB
    first = orjson.dumps({"error": "boom", "stack": stack})
    later = orjson.dumps({"statusCode": 500, "stack": stack, "error": "boom"})
    assert len(later) > ERROR_SEARCHED_BYTES
    assert node_error_of(first) == "boom"
    assert node_error_of(later) is None


class Script:
    """A transport answering from a list (the last answer repeats), counting requests."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = answers
        self.asked = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked += 1
        return self.answers[min(self.asked, len(self.answers)) - 1]


def client_of(script: Script, retries: int = 3) -> NodeClient:
    settings = NodeSettings(
        url="http://node.test", name="ho", retries=retries, backoff_base_s=0.001
    )
    return NodeClient(settings, transport=httpx.MockTransport(script))


def answer(value: Any, status: int = 200) -> httpx.Response:
    return httpx.Response(status, content=orjson.dumps(value))


def test_a_200_holding_the_nodes_error_is_asked_again_and_the_answer_used() -> None:
    good = {"/a": {"request": {}, "data": [[1, 2.5, 192, 0]]}}
    script = Script(answer({"error": "busy"}), answer({"error": "busy"}), answer(good))
    with client_of(script) as client:
        body = client.tag_history_many_bytes(["/a"], START, END, HistoryOptions())
    assert orjson.loads(body) == good
    assert script.asked == 3


def test_a_200_error_that_persists_is_named_as_the_nodes_error_in_one_line() -> None:
    script = Script(answer({"error": "SQLITE_BUSY: database is locked\n  at Statement"}))
    with client_of(script, retries=2) as client, pytest.raises(RetriesExhausted) as caught:
        client.tag_details("/Plant/x")
    assert script.asked == 3
    assert isinstance(caught.value.last, NodeAnsweredError)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("tag.details: gave up after 3 attempts: the node answered an error")
    assert "'SQLITE_BUSY: database is locked\\n  at Statement'" in message
    assert "not found" not in message


def test_a_long_error_is_cut_as_errors_quote_values() -> None:
    script = Script(answer({"error": "E" * 5000}))
    with client_of(script, retries=0) as client, pytest.raises(NodeAnsweredError) as caught:
        client.system_status()
    assert "(5,000 characters)" in str(caught.value)
    assert len(str(caught.value)) < 300


@pytest.mark.parametrize(
    ("status", "operation", "error"),
    [(400, "alarm.history", NodeRequestError), (404, "tag.history", UnknownTag)],
)
def test_an_error_body_at_another_status_is_named_as_the_nodes(
    status: int, operation: str, error: type[Exception]
) -> None:
    script = Script(answer({"error": "end is before start"}, status))
    resource, cmd = operation.split(".")
    with client_of(script) as client, pytest.raises(error) as caught:
        client.request(operation, "GET", resource, cmd, {"path": "/a"})
    assert script.asked == 1, "a refusal is not asked again"
    message = str(caught.value)
    assert message.startswith(f"{operation}: HTTP {status}: ")
    assert message.endswith("; the node says 'end is before start'")


@pytest.fixture
def express_node() -> Iterator[tuple[SimulatedNode, str]]:
    node = SimulatedNode(SimConfig(seed=5, tags=10, profile="errors-in-200"))
    node.set_clock(int(END.timestamp() * 1000) + 3_600_000)
    with run_server(node, http_port=0, https_port=None) as server:
        yield node, server.http_url


def sim_client(url: str, retries: int = 3) -> NodeClient:
    return NodeClient(NodeSettings(url=url, name="ho", retries=retries, backoff_base_s=0.001))


def test_every_answer_of_a_node_that_errs_in_200_once_is_read(
    express_node: tuple[SimulatedNode, str],
) -> None:
    node, url = express_node
    paths = node.tag_paths()[:3]
    with sim_client(url) as client:
        history = client.tag_history_many(paths, START, END, HistoryOptions(mode="raw"))
        details = client.tag_details("/", recurrent=True)
    assert sorted(history) == sorted(paths)
    assert sum(len(entry.data or []) for entry in history.values()) > 0
    assert len(details.tags) == len(node.tag_paths())


def test_a_node_erring_in_200_is_named_not_misread_as_a_missing_tag(
    express_node: tuple[SimulatedNode, str],
) -> None:
    _, url = express_node
    with sim_client(url, retries=1) as client, pytest.raises(RetriesExhausted) as caught:
        client.tag_history("/No such/tag", START, END)
    message = str(caught.value)
    assert "the node answered an error" in message
    assert "/No such/tag" in message


def test_a_replaying_node_never_replays_an_error_as_the_answer() -> None:
    node = SimulatedNode(SimConfig(seed=5, tags=10, profile="errors-in-200", cache_answers=True))
    node.set_clock(int(END.timestamp() * 1000))
    query = {"cmd": "history", "path": node.tag_paths()[0], "start": "2026-11-20T10:00:00Z"}
    query["end"] = "2026-11-20T10:10:00Z"
    with run_server(node, http_port=0, https_port=None) as server:
        asked = [httpx.get(f"{server.http_url}/tag", params=query).json() for _ in range(3)]
    assert "error" in asked[0]
    assert asked[1] == asked[2]
    assert "error" not in asked[1]
