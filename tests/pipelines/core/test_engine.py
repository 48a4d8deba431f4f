"""The engine against the real simulator over loopback: row for row its ground truth."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from connectors.client import NodeClient
from connectors.errors import (
    AuthenticationError,
    MalformedAnswer,
    NodeBusy,
    NodeTimeout,
    NotTheNodesAnswer,
    RetriesExhausted,
    UnknownTag,
)
from connectors.options import AlarmFilter, HistoryOptions
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.core.engine import (
    AlarmEngine,
    FetchJob,
    FilterQuery,
    HistoryEngine,
    chunk_retry_may_help,
)
from pipelines.planning import Chunk, plan_chunks
from sinks.base import CountMismatch, SinkError, SinkUnavailable

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
NODE = "sim"


@pytest.fixture(scope="module")
def capped() -> Iterator[tuple[SimulatedNode, NodeClient]]:
    """A node whose own raw cap (500) is far below what a window holds."""
    node = SimulatedNode(SimConfig(seed=11, tags=30, raw_cap=500))
    node.set_clock(int(NOW.timestamp() * 1000))
    with (
        run_server(node, http_port=0, https_port=None) as server,
        NodeClient(NodeSettings(url=server.http_url, name="capped")) as client,
    ):
        yield node, client


@pytest.fixture(scope="module")
def node_client(sim_node: SimulatedNode, sim_server: Any) -> Iterator[NodeClient]:
    sim_node.set_clock(int(NOW.timestamp() * 1000))
    with NodeClient(NodeSettings(url=sim_server.http_url, name="sim")) as client:
        yield client


def chunks_for(members: list[str], span: Window, size: timedelta, batch: int = 10) -> list[Chunk]:
    batches = [tuple(members[i : i + batch]) for i in range(0, len(members), batch)]
    return plan_chunks("f", "d", "tag_history", batches, span, size, "k")


def truth_frame(
    node: SimulatedNode, tags: list[str], span: Window, options: HistoryOptions
) -> pd.DataFrame:
    rows = []
    for tag in tags:
        for row in node.ground_truth(tag, span.start_ms, span.end_ms, options):
            padded = list(row) + [None] * (4 - len(row))
            rows.append((tag, int(padded[0]), padded[1], padded[2], padded[3]))
    return pd.DataFrame(rows, columns=["tag", "ts", "raw_value", "quality", "extra"])


def engine_frame(results: list[Any]) -> pd.DataFrame:
    frames = [r.frame for r in results if len(r.frame)]
    frame = pd.concat(frames, ignore_index=True)
    values = []
    for number, flag, text in zip(
        frame["value"], frame["value_bool"], frame["value_str"], strict=True
    ):
        if (
            flag is not pd.NA
            and flag is not None
            and not (isinstance(flag, float) and math.isnan(flag))
        ):
            values.append(bool(flag))
        elif text is not pd.NA and text is not None and isinstance(text, str):
            values.append(text)
        elif number is pd.NA or number is None:
            values.append(None)
        else:
            values.append(float(number))
    return pd.DataFrame(
        {
            "tag": frame["tag"].astype(str),
            "ts": epoch_ms(frame["ts"]),
            "raw_value": values,
            "quality": [None if q is pd.NA else int(q) for q in frame["quality"]],
            "extra": [None if e is pd.NA else int(e) for e in frame["extra"]],
        }
    )


def epoch_ms(column: pd.Series) -> list[int]:
    return pa.array(column.array).cast(pa.int64()).to_pylist()


def assert_same_rows(got: pd.DataFrame, want: pd.DataFrame) -> None:
    def canonical(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
        out = []
        for tag, ts, value, quality, extra in frame.itertuples(index=False):
            if isinstance(value, bool) or value is None or isinstance(value, str):
                v: Any = value
            else:
                v = round(float(value), 9)
            out.append(
                (
                    tag,
                    ts,
                    repr(v),
                    None if quality is None else int(quality),
                    None if extra is None else int(extra),
                )
            )
        return sorted(out)

    got_rows, want_rows = canonical(got), canonical(want)
    assert len(got_rows) == len(want_rows)
    assert got_rows == want_rows


def test_raw_continues_past_the_nodes_own_cap(capped: tuple[SimulatedNode, NodeClient]) -> None:
    node, client = capped
    tags = node.tag_paths()[:6]
    span = Window(NOW - timedelta(hours=6), NOW - timedelta(hours=2))
    engine = HistoryEngine(client, NODE, HistoryOptions(mode="raw"), max_in_flight=2)
    results = list(engine.stream(chunks_for(tags, span, timedelta(hours=2), batch=3)))
    assert any(r.continuations for r in results), "the window holds more than the cap"
    assert_same_rows(
        engine_frame(results), truth_frame(node, tags, span, HistoryOptions(mode="raw"))
    )


def test_raw_with_a_limit_above_the_cap_still_gets_everything(
    capped: tuple[SimulatedNode, NodeClient],
) -> None:
    node, client = capped
    tags = node.tag_paths()[6:9]
    span = Window(NOW - timedelta(hours=3), NOW - timedelta(hours=1))
    options = HistoryOptions(mode="raw", limit=2000)
    engine = HistoryEngine(client, NODE, options)
    results = list(engine.stream(chunks_for(tags, span, timedelta(hours=1))))
    assert_same_rows(
        engine_frame(results), truth_frame(node, tags, span, HistoryOptions(mode="raw"))
    )


def test_raw_with_a_small_limit_pages_through(
    node_client: NodeClient, sim_node: SimulatedNode
) -> None:
    tags = sim_node.tag_paths()[:5]
    span = Window(NOW - timedelta(hours=2), NOW - timedelta(hours=1))
    engine = HistoryEngine(node_client, NODE, HistoryOptions(mode="raw", limit=37))
    results = list(engine.stream(chunks_for(tags, span, timedelta(minutes=30))))
    assert sum(r.continuations for r in results) > 5
    assert_same_rows(
        engine_frame(results), truth_frame(sim_node, tags, span, HistoryOptions(mode="raw"))
    )


def test_a_sample_on_a_window_boundary_appears_once(
    node_client: NodeClient, sim_node: SimulatedNode
) -> None:
    tags = sim_node.tag_paths()[:12]
    span = Window(NOW - timedelta(hours=1), NOW)
    # Windows of 1 minute: grid-aligned tags have samples exactly on every boundary.
    engine = HistoryEngine(node_client, NODE, HistoryOptions(mode="raw"), max_in_flight=4)
    results = list(engine.stream(chunks_for(tags, span, timedelta(minutes=1), batch=12)))
    got = engine_frame(results)
    boundaries = {int((span.start + timedelta(minutes=m)).timestamp() * 1000) for m in range(60)}
    assert got["ts"].isin(boundaries).any(), "some sample sits exactly on a boundary"
    assert_same_rows(got, truth_frame(sim_node, tags, span, HistoryOptions(mode="raw")))


@pytest.mark.parametrize("mode", ["delta", "filter"])
def test_delta_and_filter_per_window(
    node_client: NodeClient, sim_node: SimulatedNode, mode: str
) -> None:
    tags = [t for t in sim_node.tag_paths() if sim_node.tag_type(t) == "number"][:6]
    window = Window(NOW - timedelta(hours=2), NOW - timedelta(hours=1))
    options = HistoryOptions(mode=mode, deadband=0.5)  # type: ignore[arg-type]
    engine = HistoryEngine(node_client, NODE, options)
    results = list(engine.stream(chunks_for(tags, window, timedelta(hours=1))))
    assert_same_rows(engine_frame(results), truth_frame(sim_node, tags, window, options))


@pytest.mark.parametrize("method", ["first", "last", "min", "max", "avg", "delta", "stddev"])
def test_aggregated_each_method(
    node_client: NodeClient, sim_node: SimulatedNode, method: str
) -> None:
    tags = sim_node.tag_paths()[:8]
    span = Window(NOW - timedelta(hours=6), NOW - timedelta(hours=2))
    options = HistoryOptions(mode="aggregated", method=method, interval_ms=15 * 60_000)  # type: ignore[arg-type]
    engine = HistoryEngine(node_client, NODE, options)
    results = list(engine.stream(chunks_for(tags, span, timedelta(hours=1), batch=4)))
    got = engine_frame(results)
    assert set(got["ts"] % (15 * 60_000)) == {0}, "buckets land on :00, :15, :30, :45"
    assert_same_rows(got, truth_frame(sim_node, tags, span, options))


def test_history_filter_selection_matches_history_many(
    node_client: NodeClient, sim_node: SimulatedNode
) -> None:
    tags = sorted(sim_node.tag_paths())
    group = "/" + tags[0].strip("/").split("/")[0] + "/"
    members = sorted(t for t in tags if t.startswith(group))
    span = Window(NOW - timedelta(minutes=30), NOW)
    options = HistoryOptions(mode="raw")
    engine = HistoryEngine(
        node_client,
        NODE,
        options,
        filter_query=FilterQuery(group=group, regex=None, recurrent=True),
    )
    results = list(
        engine.stream(chunks_for(members, span, timedelta(minutes=15), batch=len(members)))
    )
    assert_same_rows(engine_frame(results), truth_frame(sim_node, members, span, options))


def test_alarm_history_matches_ground_truth(
    node_client: NodeClient, sim_node: SimulatedNode
) -> None:
    span = Window(NOW - timedelta(days=2), NOW)
    chunks = plan_chunks("a", "a", "alarm_history", [("/",)], span, timedelta(hours=6), "k")
    engine = AlarmEngine(node_client, NODE, "/", AlarmFilter(recurrent=True))
    frames = [r.frame for r in engine.stream(chunks)]
    got = pd.concat(frames, ignore_index=True)
    truth = sim_node.alarm_ground_truth(
        span.start_ms, span.end_ms, AlarmFilter(recurrent=True), path="/"
    )
    assert len(truth) > 0
    got_keys = sorted(zip(got["path"], epoch_ms(got["ts"]), got["status"].astype(int), strict=True))
    want_keys = sorted({(a["path"], int(a["ts"]), int(a["status"])) for a in truth})
    assert got_keys == want_keys


def test_alarm_history_filters_are_applied(
    node_client: NodeClient, sim_node: SimulatedNode
) -> None:
    span = Window(NOW - timedelta(days=2), NOW)
    chunks = plan_chunks("a", "a", "alarm_history", [("/",)], span, timedelta(days=1), "k")
    filt = AlarmFilter(min_priority=3, recurrent=True)
    got = pd.concat([r.frame for r in AlarmEngine(node_client, NODE, "/", filt).stream(chunks)])
    truth = sim_node.alarm_ground_truth(span.start_ms, span.end_ms, filt, path="/")
    assert len(got) == len(truth)
    assert (got["priority"].astype(int) >= 3).all()


class _OneAnswer:
    """A node that answers every history request with the same body."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def tag_history_many_bytes(self, *args: Any, **kwargs: Any) -> bytes:
        return self.body

    def tag_history_filter_bytes(self, *args: Any, **kwargs: Any) -> bytes:
        return self.body

    def alarm_history_bytes(self, *args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("not used")


def test_one_answer_out_of_order_comes_out_by_tag_and_time_with_seq_in_answer_order() -> None:
    import orjson

    t0 = int(NOW.timestamp() * 1000)
    answer = {
        "/b": {
            "request": {},
            "data": [[t0 + 20, 1.0, 192], [t0 + 10, 2.0, 192], [t0 + 20, 3.0, 0]],
        },
        "/a": {"request": {}, "data": [[t0 + 5, 4.0, 192], [t0 + 5, 5.0, 192], [t0 + 1, 6.0, 192]]},
    }
    engine = HistoryEngine(_OneAnswer(orjson.dumps(answer)), NODE, HistoryOptions(mode="raw"))
    span = Window(NOW, NOW + timedelta(hours=1))
    (chunk,) = chunks_for(["/a", "/b"], span, timedelta(hours=1))
    frame = engine.fetch_chunk(chunk).frame
    got = list(zip(frame["tag"], epoch_ms(frame["ts"]), frame["seq"], frame["value"], strict=True))
    assert got == [
        ("/a", t0 + 1, 0, 6.0),
        ("/a", t0 + 5, 0, 4.0),
        ("/a", t0 + 5, 1, 5.0),
        ("/b", t0 + 10, 0, 2.0),
        ("/b", t0 + 20, 0, 1.0),
        ("/b", t0 + 20, 1, 3.0),
    ]


def test_rows_of_tags_the_chunk_did_not_ask_for_are_dropped() -> None:
    import orjson

    t0 = int(NOW.timestamp() * 1000)
    answer = {
        "/a": {"request": {}, "data": [[t0 + 1, 1.0, 192], [t0 + 3_600_000, 9.0, 192]]},
        "/zz": {"request": {}, "data": [[t0 + 2, 2.0, 192]]},
    }
    engine = HistoryEngine(_OneAnswer(orjson.dumps(answer)), NODE, HistoryOptions(mode="raw"))
    (chunk,) = chunks_for(["/a"], Window(NOW, NOW + timedelta(hours=1)), timedelta(hours=1))
    result = engine.fetch_chunk(chunk)
    assert list(zip(result.frame["tag"], result.frame["value"], strict=True)) == [("/a", 1.0)]
    assert result.rows_fetched == 1


# What a chunk re-run is for: only failures that may pass and that no layer below retried.
CHUNK_RETRY = [
    (NodeTimeout("tag.historyMany", "no answer"), True),  # client `retries: 0`
    (NotTheNodesAnswer("tag.historyMany", "a web page"), True),
    (NodeBusy("tag.historyMany", "server error", status=500), True),
    (SinkUnavailable("the server is starting up"), True),
    (RetriesExhausted(NodeTimeout("tag.historyMany", "no answer"), 6), False),
    (MalformedAnswer("tag.historyMany", "answer is not JSON"), False),
    (UnknownTag("tag.historyMany", "tag '/a' left out"), False),
    (AuthenticationError("tag.historyMany", "credentials refused", status=401), False),
    (SinkError("the sink's own retries are spent"), False),
    (CountMismatch("3 rows committed, 4 fetched"), False),
    (ValueError("a bug"), False),
]


@pytest.mark.parametrize(
    ("error", "re_run"), CHUNK_RETRY, ids=[type(e).__name__ for e, _ in CHUNK_RETRY]
)
def test_a_chunk_is_re_run_only_when_its_failure_may_pass(
    error: BaseException, re_run: bool
) -> None:
    assert chunk_retry_may_help(error) is re_run


class _FailingFirst(_OneAnswer):
    """A node whose first `failures` history answers are `error`, then `body`."""

    def __init__(self, body: bytes, error: Exception, failures: int) -> None:
        super().__init__(body)
        self.error = error
        self.failures = failures
        self.asked = 0

    def tag_history_many_bytes(self, *args: Any, **kwargs: Any) -> bytes:
        self.asked += 1
        if self.asked <= self.failures:
            raise self.error
        return self.body


@pytest.mark.parametrize(
    ("error", "failures", "outcome", "asked"),
    [
        (NodeTimeout("tag.historyMany", "no answer"), 1, None, 2),
        (NodeTimeout("tag.historyMany", "no answer"), 5, NodeTimeout, 3),  # 2 re-runs at most
        (MalformedAnswer("tag.historyMany", "answer is not JSON"), 1, MalformedAnswer, 1),
    ],
)
def test_the_engine_itself_fetches_a_chunk_again_when_its_failure_may_pass(
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
    failures: int,
    outcome: type[Exception] | None,
    asked: int,
) -> None:
    """Whoever submits the chunk (threads, a Prefect task, a Dask worker) calls
    `fetch_chunk`, so every path re-runs a chunk alike."""
    import orjson

    monkeypatch.setattr("pipelines.core.engine.CHUNK_RETRY_DELAY_S", 0.0)
    t0 = int(NOW.timestamp() * 1000)
    body = orjson.dumps({"/a": {"request": {}, "data": [[t0 + 1, 1.0, 192]]}})
    node = _FailingFirst(body, error, failures)
    engine = HistoryEngine(node, NODE, HistoryOptions(mode="raw"))
    (chunk,) = chunks_for(["/a"], Window(NOW, NOW + timedelta(hours=1)), timedelta(hours=1))
    if outcome is None:
        assert engine.fetch_chunk(chunk).rows_fetched == 1
    else:
        with pytest.raises(outcome):
            engine.fetch_chunk(chunk)
    assert node.asked == asked


def _split_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "smaller pieces" in r.getMessage()]


def test_answers_over_max_answer_bytes_are_split_and_said_once_on_every_path(
    sim_node: SimulatedNode, sim_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Threads (one engine per unit) and Prefect tasks or Dask workers (`FetchJob.fetch`,
    an engine per chunk): the rows of the ground truth, and one warning each."""
    sim_node.set_clock(int(NOW.timestamp() * 1000))
    members = sim_node.tag_paths()[:8]
    span = Window(NOW - timedelta(hours=4), NOW - timedelta(hours=1))
    chunks = chunks_for(members, span, timedelta(hours=1), batch=4)
    options = HistoryOptions(mode="raw")
    want = truth_frame(sim_node, members, span, options)
    for name in ("threads-split", "tasks-split"):
        settings = NodeSettings(url=sim_server.http_url, name=name, max_answer_bytes=30_000)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="historian.fetch"):
            if name == "threads-split":
                with NodeClient(settings) as client:
                    results = list(HistoryEngine(client, name, options).stream(chunks))
            else:
                job = FetchJob(settings, name, "tag_history", options=options)
                results = [job.fetch(chunk) for chunk in chunks]
        assert_same_rows(engine_frame(results), want)
        assert sum(result.requests for result in results) > len(chunks)
        assert len(_split_lines(caplog)) == 1, name
