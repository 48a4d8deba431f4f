"""Answers over the node's `max_answer_bytes`: asked again in smaller pieces, rows exact.

Real simulator over loopback (requests counted by a wrapping transport), the cap set low so
that an hour of a few tags at 1 s is too much for one answer; a mock node only where no
plausible node would answer so (one that ignores the window it is asked for).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest

from connectors.client import NodeClient
from connectors.errors import AnswerTooLarge
from connectors.fetch import AlarmFetcher, FilterQuery, HistoryFetcher
from connectors.options import AlarmFilter, HistoryOptions
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
WINDOW = Window(NOW - timedelta(hours=2), NOW - timedelta(hours=1))
NEXT = Window(WINDOW.end, NOW)
RAW = HistoryOptions(mode="raw")
# One tag's hour at 1 s is ~100 KB of JSON: a cap of 40 KB splits it down to quarters.
SMALL_CAP = 40_000


class Counting(httpx.BaseTransport):
    """A real HTTP transport that counts history requests."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.history = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if "history" in request.url.params.get("cmd", ""):
            self.history += 1
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class Nodes:
    """One simulated node and two clients of it: capped low, and capped as by default."""

    def __init__(self, node: SimulatedNode, capped: NodeClient, whole: NodeClient) -> None:
        self.node = node
        self.capped = capped
        self.whole = whole

    @property
    def requests(self) -> int:
        transport = self.capped._http._transport
        assert isinstance(transport, Counting)
        return transport.history


@pytest.fixture
def nodes(request: pytest.FixtureRequest) -> Iterator[Nodes]:
    profile, cap = request.param if isinstance(request.param, tuple) else (request.param, SMALL_CAP)
    node = SimulatedNode(SimConfig(seed=5, tags=12, period_ms=1000, profile=profile))
    node.set_clock(int(NOW.timestamp() * 1000))
    with run_server(node, http_port=0, https_port=None) as server:
        low = NodeSettings(url=server.http_url, name="n", max_answer_bytes=cap)
        with (
            NodeClient(low, transport=Counting()) as capped,
            NodeClient(NodeSettings(url=server.http_url, name="n")) as whole,
        ):
            yield Nodes(node, capped, whole)


def keys(table: Any) -> list[tuple[Any, ...]]:
    """Every row as (tag, ts, seq, value), in the table's order."""
    columns = [table.column(name).cast(kind).to_pylist() for name, kind in _KEY_COLUMNS]
    return list(zip(*columns, strict=True))


_KEY_COLUMNS = (("tag", "string"), ("ts", "int64"), ("seq", "int64"), ("value", "float64"))


def split_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "max_answer_mb" in r.getMessage()]


# A node capping raw answers at 250 samples answers ~7 KB a tag: a lower cap splits those
# pages too, and continuation goes on in each piece.
@pytest.mark.parametrize(
    "nodes", ["default", ("raw-cap", 12_000), "raw-exclusive-start"], indirect=True
)
def test_a_raw_answer_over_the_cap_is_asked_again_in_pieces_with_exactly_the_same_rows(
    nodes: Nodes, caplog: pytest.LogCaptureFixture
) -> None:
    paths = nodes.node.tag_paths()[:3]
    whole = HistoryFetcher(nodes.whole, "n", RAW)
    capped = HistoryFetcher(nodes.capped, "n", RAW)
    with caplog.at_level(logging.WARNING, logger="historian.fetch"):
        for window in (WINDOW, NEXT):
            want = whole.fetch(paths, window, "3 tags")
            got = capped.fetch(paths, window, "3 tags")
            assert keys(got.table) == keys(want.table)
            assert got.table.num_rows > 3 * 3000
            assert got.requests > want.requests
    # Each window: the batch, its halves, then each tag's hour (or its pages) in pieces.
    assert nodes.requests > 2 * 3 * 3
    assert len(split_warnings(caplog)) == 1


@pytest.mark.parametrize("nodes", ["default"], indirect=True)
def test_a_group_asked_by_filter_is_split_into_its_tags(nodes: Nodes) -> None:
    paths = nodes.node.tag_paths()
    group = paths[0].rsplit("/", 1)[0] + "/"
    members = [path for path in paths if path.startswith(group)]
    query = FilterQuery(group, None, recurrent=False)
    want = HistoryFetcher(nodes.whole, "n", RAW, filter_query=query).fetch(members, WINDOW)
    got = HistoryFetcher(nodes.capped, "n", RAW, filter_query=query).fetch(members, WINDOW)
    assert got.missing == ()
    assert keys(got.table) == keys(want.table)


@pytest.mark.parametrize("nodes", ["default"], indirect=True)
def test_an_aggregated_batch_is_split_by_tags_and_one_tag_too_large_names_the_setting(
    nodes: Nodes,
) -> None:
    paths = nodes.node.tag_paths()[:6]
    options = HistoryOptions(mode="aggregated", method="avg", interval_ms=1000)
    want = HistoryFetcher(nodes.whole, "n", options).fetch(paths, WINDOW)
    fetcher = HistoryFetcher(nodes.capped, "n", options)
    with pytest.raises(AnswerTooLarge, match=r"max_answer_mb") as raised:
        fetcher.fetch(paths, WINDOW)
    # The aggregation of one tag over a window cannot be cut where it starts: refused.
    assert "1 tag" in str(raised.value)
    coarse = HistoryOptions(mode="aggregated", method="avg", interval_ms=10_000)
    want = HistoryFetcher(nodes.whole, "n", coarse).fetch(paths, WINDOW)
    got = HistoryFetcher(nodes.capped, "n", coarse).fetch(paths, WINDOW)
    assert keys(got.table) == keys(want.table)
    assert len(want.table) > 0


@pytest.mark.parametrize("nodes", ["default"], indirect=True)
def test_an_alarm_answer_over_the_cap_is_asked_again_in_halves(nodes: Nodes) -> None:
    span = Window(NOW - timedelta(days=20), NOW)
    filt = AlarmFilter(recurrent=True)
    want = AlarmFetcher(nodes.whole, "n", "/", filt).fetch(span)
    assert want.bytes_received > SMALL_CAP
    got = AlarmFetcher(nodes.capped, "n", "/", filt).fetch(span)
    assert got.table.to_pylist() == want.table.to_pylist()
    assert nodes.requests > 2


class _Deaf(httpx.BaseTransport):
    """A node that ignores the window: every answer is the same 100 KB."""

    def __init__(self) -> None:
        self.requests = 0
        rows = [[1_700_000_000_000 + i, float(i), 192] for i in range(5000)]
        self.body = orjson.dumps({"/t": {"data": rows}})

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return httpx.Response(200, content=self.body)


def test_a_node_that_ignores_the_window_stops_the_split_after_a_few_requests() -> None:
    transport = _Deaf()
    settings = NodeSettings(url="http://node.test", name="n", max_answer_bytes=SMALL_CAP)
    with NodeClient(settings, transport=transport) as client:
        fetcher = HistoryFetcher(client, "n", RAW)
        with pytest.raises(AnswerTooLarge, match=r"max_answer_mb"):
            fetcher.fetch(["/t"], WINDOW)
    # Halving an hour down to the smallest piece, depth first: one request per level.
    assert transport.requests <= 16
