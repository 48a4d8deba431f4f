"""One window fetched whole, against simulated nodes that differ from the default reading.

Real simulator over loopback (requests recorded by a wrapping transport); a mock node only
where no plausible node would answer so (a node that ignores `start`).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import pytest

from connectors.client import NodeClient
from connectors.fetch import FilterQuery, HistoryFetcher
from connectors.options import HistoryOptions
from connectors.pager import CapGuess, ContinuationStuck
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window, iso_utc

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
WINDOW = Window(NOW - timedelta(hours=2), NOW - timedelta(hours=1))


class Recording(httpx.BaseTransport):
    """A real HTTP transport that remembers every request's URL."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.urls: list[httpx.URL] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(request.url)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def node_client(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[SimulatedNode, NodeClient, Recording]]:
    profile, raw_cap = request.param
    node = SimulatedNode(SimConfig(seed=9, tags=20, raw_cap=raw_cap, profile=profile))
    node.set_clock(int(NOW.timestamp() * 1000))
    recording = Recording()
    with (
        run_server(node, http_port=0, https_port=None) as server,
        NodeClient(NodeSettings(url=server.http_url, name="n"), transport=recording) as client,
    ):
        yield node, client, recording


def truth(node: SimulatedNode, paths: list[str], options: HistoryOptions) -> list[tuple[Any, ...]]:
    rows = []
    for path in paths:
        for row in node.ground_truth(path, WINDOW.start_ms, WINDOW.end_ms, options):
            rows.append((path, row[0]))
    return sorted(rows)


def fetched_keys(table: Any) -> list[tuple[Any, ...]]:
    tags = table.column("tag").cast("string").to_pylist()
    stamps = table.column("ts").cast("int64").to_pylist()
    return sorted(zip(tags, stamps, strict=True))


@pytest.mark.parametrize("node_client", [("flaky-tags", 10_000)], indirect=True)
def test_tags_left_out_once_are_asked_again_and_arrive(node_client: Any) -> None:
    node, client, recording = node_client
    paths = node.tag_paths()
    raw = HistoryOptions(mode="raw")
    got = HistoryFetcher(client, "n", raw).fetch(paths, WINDOW, "20 tags")
    assert got.missing == ()
    assert fetched_keys(got.table) == truth(node, paths, raw)
    # (A continuation may follow: the run's first answer may have been cut as a whole.)
    assert got.requests - got.continuations == 2, "one answer, one question for what it left out"
    asked_again = orjson.loads(recording.urls[1].params["paths"])
    assert 0 < len(asked_again) < len(paths)


@pytest.mark.parametrize("node_client", [("lost-tags", 10_000)], indirect=True)
def test_tags_that_stay_missing_are_returned_as_missing_without_rows(node_client: Any) -> None:
    node, client, _ = node_client
    paths = node.tag_paths()
    lost = [p for p in paths if node.tree().by_path[p].index % 7 == 3]
    raw = HistoryOptions(mode="raw")
    got = HistoryFetcher(client, "n", raw, reasks=2).fetch(paths, WINDOW, "20 tags")
    assert list(got.missing) == lost
    assert fetched_keys(got.table) == truth(node, [p for p in paths if p not in lost], raw)
    assert got.requests == 3


@pytest.mark.parametrize("node_client", [("garbled-timestamps+raw-cap", 10_000)], indirect=True)
def test_stamps_outside_the_query_never_steer_continuation(node_client: Any) -> None:
    node, client, recording = node_client
    paths = node.tag_paths()
    raw = HistoryOptions(mode="raw")
    got = HistoryFetcher(client, "n", raw).fetch(paths, WINDOW, "20 tags")
    assert got.continuations > 0, "the node's cap of 250 is below what the window holds"
    assert fetched_keys(got.table) == truth(node, paths, raw)
    assert got.rows_out_of_range >= 4, "a garbled row per page of every fifth tag, counted"
    earliest = iso_utc(WINDOW.start - timedelta(milliseconds=1))
    starts = [url.params["start"] for url in recording.urls]
    assert min(starts) == earliest, "no request starts before the window (1913, 1969...)"
    assert max(url.params["end"] for url in recording.urls) == iso_utc(WINDOW.end)


@pytest.mark.parametrize(
    "node_client",
    [("raw-exclusive-start+raw-cap", 10_000), ("raw-uncapped", 10_000), ("rows-2", 300)],
    indirect=True,
)
def test_capped_answers_of_any_reading_continue_to_exactly_the_truth(node_client: Any) -> None:
    node, client, _ = node_client
    paths = node.tag_paths()
    for options in (HistoryOptions(mode="raw"), HistoryOptions(mode="raw", limit=120)):
        got = HistoryFetcher(client, "n", options).fetch(paths, WINDOW, "20 tags")
        assert fetched_keys(got.table) == truth(node, paths, options)


@pytest.mark.parametrize("node_client", [("filter-paths-only", 10_000)], indirect=True)
def test_a_group_fetched_through_history_filter_keeps_only_the_members(node_client: Any) -> None:
    node, client, _ = node_client
    group = "/Plant A/Line 1/"
    members = [p for p in node.tag_paths() if p.startswith(group)][:2]
    raw = HistoryOptions(mode="raw")
    query = FilterQuery(group=group, regex=None, recurrent=True)
    got = HistoryFetcher(client, "n", raw, filter_query=query).fetch(members, WINDOW, "2 tags")
    assert fetched_keys(got.table) == truth(node, members, raw)


def test_a_node_that_ignores_start_is_stopped_by_the_loop_guard_naming_history_many() -> None:
    stamp = WINDOW.start_ms + 1000

    def handler(request: httpx.Request) -> httpx.Response:
        rows = [[stamp + i, float(i), 192, 0] for i in range(3)]  # the same 3 rows, always
        paths = orjson.loads(request.url.params.get("paths") or request.url.params["path"])
        return httpx.Response(200, content=orjson.dumps({p: {"data": rows} for p in paths}))

    settings = NodeSettings(url="http://node.test", name="n")
    with NodeClient(settings, transport=httpx.MockTransport(handler)) as client:
        fetcher = HistoryFetcher(
            client,
            "n",
            HistoryOptions(mode="raw", limit=3),
            filter_query=FilterQuery(group="/g/", regex=None, recurrent=False),
        )
        with pytest.raises(ContinuationStuck) as caught:
            fetcher.fetch(["/g/a"], WINDOW, "1 tag /g/a")
    message = str(caught.value)
    assert message.startswith("tag.historyMany: ")
    assert "'/g/a' in 1 tag /g/a" in message


@pytest.mark.parametrize("node_client", [("raw-cap-per-answer", 1000)], indirect=True)
def test_an_answer_capped_as_a_whole_continues_every_tag_it_cut_and_learns_the_cap(
    node_client: Any,
) -> None:
    node, client, _ = node_client
    paths = node.tag_paths()
    cap = CapGuess()
    got = HistoryFetcher(client, "n", HistoryOptions(mode="raw"), cap=cap).fetch(
        paths, WINDOW, "20 tags"
    )
    assert fetched_keys(got.table) == truth(node, paths, HistoryOptions(mode="raw"))
    assert (cap.kind, cap.size) == ("per answer", 1000)
    limited = HistoryOptions(mode="raw", limit=300)
    got = HistoryFetcher(client, "n", limited).fetch(paths, WINDOW, "20 tags")
    assert fetched_keys(got.table) == truth(node, paths, limited)


@pytest.mark.parametrize("node_client", [("null-without-history", 10_000)], indirect=True)
def test_a_tag_answered_null_again_when_asked_alone_has_no_data_and_is_not_missing(
    node_client: Any,
) -> None:
    node, client, recording = node_client
    paths = node.tag_paths()
    empty = [p for p in paths if node.tree().by_path[p].index % 5 == 4]
    got = HistoryFetcher(client, "n", HistoryOptions(mode="raw")).fetch(paths, WINDOW, "20 tags")
    assert got.missing == ()
    assert fetched_keys(got.table) == truth(node, paths, HistoryOptions(mode="raw"))
    assert not {tag for tag, _ in fetched_keys(got.table)} & set(empty)
    asked = [orjson.loads(url.params["paths"]) for url in recording.urls]
    assert asked[1] == empty, "asked again together: a node may drop tags transiently"
    alone = [paths for paths in asked[2:] if set(paths) & set(empty)]
    assert sorted(alone) == sorted([tag] for tag in empty), "then each alone, once"


@pytest.mark.parametrize("node_client", [("flaky-tags-null", 10_000)], indirect=True)
def test_a_tag_answered_null_once_then_with_rows_keeps_its_rows(node_client: Any) -> None:
    node, client, _ = node_client
    paths = node.tag_paths()
    got = HistoryFetcher(client, "n", HistoryOptions(mode="raw")).fetch(paths, WINDOW, "20 tags")
    assert got.missing == ()
    assert fetched_keys(got.table) == truth(node, paths, HistoryOptions(mode="raw"))
