"""Run summaries count rows and bad-quality rows per tag (null quality counts as bad);
auto windows keep every chunk under the row target, so a run killed again and again
still commits chunks between the kills."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from connectors.schema import TAG_HISTORY_SCHEMA
from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.engine import ChunkResult
from pipelines.core.runner import (
    ChunkOutcome,
    FlowRun,
    RunRequest,
    RunSummary,
    Threads,
    _tag_counts,
)
from pipelines.core.units import run_flow
from pipelines.planning import AUTO_CHUNK_ROWS, Chunk
from tests.fixtures import load, write_config

END = datetime(2026, 11, 20, tzinfo=UTC)


def test_rows_and_bad_quality_are_counted_per_tag() -> None:
    samples = [("/a", 192), ("/a", 0), ("/b", None), ("/b", 192), ("/c", 200)]
    rows = [
        {
            "node": "n",
            "tag": tag,
            "ts": i,
            "seq": 0,
            "value": 1.0,
            "value_bool": None,
            "value_str": None,
            "quality": quality,
            "extra": 0,
        }
        for i, (tag, quality) in enumerate(samples)
    ]
    per_tag, bad = _tag_counts(pa.Table.from_pylist(rows, schema=TAG_HISTORY_SCHEMA), "tag_history")
    assert per_tag == {"/a": 2, "/b": 2, "/c": 1}
    assert bad == {"/a": 1, "/b": 1}


def test_dictionary_encoded_tags_are_counted_like_strings() -> None:
    samples = [("/b", 192), ("/a", 0), ("/b", None), ("/a", 192), ("/c", 200)]
    rows = [
        {
            "node": "n",
            "tag": tag,
            "ts": i,
            "seq": 0,
            "value": 1.0,
            "value_bool": None,
            "value_str": None,
            "quality": quality,
            "extra": 0,
        }
        for i, (tag, quality) in enumerate(samples)
    ]
    table = pa.Table.from_pylist(rows, schema=TAG_HISTORY_SCHEMA)
    # "/a" twice in the dictionary, "/zz" without rows: neither shows in the counts.
    tag = pa.DictionaryArray.from_arrays(
        pa.array([0, 1, 0, 3, 2], type=pa.int32()), pa.array(["/b", "/a", "/c", "/a", "/zz"])
    )
    encoded = table.set_column(1, pa.field("tag", tag.type, nullable=False), tag)
    assert _tag_counts(encoded, "tag_history") == _tag_counts(table, "tag_history")
    per_tag, bad = _tag_counts(encoded, "tag_history")
    assert per_tag == {"/a": 2, "/b": 2, "/c": 1}
    assert bad == {"/a": 1, "/b": 1}
    # A joined write: chunks whose dictionaries differ count as one.
    other = pa.DictionaryArray.from_arrays(
        pa.array([1, 2, 0], type=pa.int32()), pa.array(["/c", "/b", "/a"])
    )
    tail = table.slice(2).set_column(1, pa.field("tag", other.type, nullable=False), other)
    joined = pa.concat_tables([encoded.slice(0, 2), tail])
    assert joined.column("tag").num_chunks == 2
    assert _tag_counts(joined, "tag_history") == (per_tag, bad)


def auto_flow(hours: int) -> dict[str, Any]:
    return {
        "node": "n",
        "tags": {"browse": "/", "include": ["."]},
        "mode": "raw",
        "window": "auto",
        "start": (END - timedelta(hours=hours)).isoformat(),
        "settle": "0s",
    }


def capping_node(clock: datetime = END) -> SimulatedNode:
    """Ten tags at 1 Hz on a node that caps raw answers at 300 samples per tag, unsaid."""
    node = SimulatedNode(SimConfig(seed=3, tags=10, raw_cap=300, period_ms=1000))
    node.set_clock(int(clock.timestamp() * 1000))
    return node


def test_auto_windows_keep_each_chunk_under_the_row_target_on_a_capping_node(
    tmp_path: Path,
) -> None:
    # Sized from the capped probe alone (300 samples per tag and hour), the window was a
    # day: the 12 hours below were one chunk of 432,000 rows, so no kill left a commit.
    outcomes: list[ChunkOutcome] = []

    def record(outcome: ChunkOutcome, summary: RunSummary) -> None:
        outcomes.append(outcome)

    with run_server(capping_node(), http_port=0, https_port=None) as handle:
        path = write_config(
            tmp_path, node={"url": handle.http_url}, flows={"f": auto_flow(12)}, sinks=["lake"]
        )
        config = load(path)
        with NodePool(config) as nodes, SinkSet(config, tmp_path) as sinks:
            summary = run_flow(
                config,
                "f",
                nodes=nodes,
                sinks=sinks,
                request=RunRequest(start=END - timedelta(hours=12), end=END),
                on_chunk=record,
                now=END,
            )
    assert summary.rows > 400_000
    assert summary.window_label == "2h auto"
    assert len(outcomes) == 6
    assert max(outcome.rows_fetched for outcome in outcomes) <= AUTO_CHUNK_ROWS


def test_a_span_ending_where_the_node_has_no_data_yet_is_sized_by_the_data_before_it(
    tmp_path: Path,
) -> None:
    # The node's clock is two hours behind the span's end: the last hour holds nothing, so
    # the probe looks at the day before it instead of guessing one sample per hour.
    with run_server(capping_node(END - timedelta(hours=2)), https_port=None) as handle:
        path = write_config(
            tmp_path, node={"url": handle.http_url}, flows={"f": auto_flow(48)}, sinks=["lake"]
        )
        config = load(path)
        with (
            NodePool(config) as nodes,
            SinkSet(config, tmp_path) as sinks,
            FlowRun(config, "f", nodes=nodes, sinks=sinks, now=END) as run,
        ):
            plan = run.plan()
    assert plan.window_size == timedelta(hours=2)


class Fetched(Threads):
    """A submitter whose fetches were done elsewhere: these results."""

    def __init__(self, results: list[ChunkResult]) -> None:
        self.results = results

    def fetch(self, unit: FlowRun, chunks: Sequence[Chunk]) -> Iterator[ChunkResult]:
        return iter(self.results)


def test_a_fetch_job_for_another_process_carries_what_the_run_decided(tmp_path: Path) -> None:
    """A Dask worker fetches with the run's `FetchJob`: a group's lost tags are recorded
    missing there too (not fatal), an old node's alarm filter is adapted to its version,
    and the raw cap learned so far goes along; a cap learned there comes back."""
    from pipelines.core.engine import AlarmEngine

    node = SimulatedNode(
        SimConfig(seed=3, tags=14, raw_cap=300, period_ms=1000, profile="lost-tags+node-1.21.5")
    )
    node.set_clock(int(END.timestamp() * 1000))
    flows = {
        "g": {**auto_flow(1), "tags": {"group": "/", "regex": ".", "recurrent": True}},
        "a": {
            "node": "n",
            "kind": "alarm_history",
            "alarms": {"path": "/", "min_priority": 2, "max_priority": 3},
            "window": "6h",
            "start": (END - timedelta(days=1)).isoformat(),
            "settle": "0s",
        },
    }
    flows["g"]["window"] = "1h"
    request = RunRequest(start=END - timedelta(hours=1), end=END)
    with run_server(node, http_port=0, https_port=None) as handle:
        path = write_config(tmp_path, node={"url": handle.http_url}, flows=flows, sinks=["lake"])
        config = load(path)
        with NodePool(config) as nodes, SinkSet(config, tmp_path) as sinks:
            with FlowRun(config, "g", nodes=nodes, sinks=sinks, request=request, now=END) as run:
                (chunk,) = run.plan().pending
                before = run.fetch_job()
                elsewhere = before.fetch(chunk)  # as a Dask worker does: its own client
                assert before.raw_cap is None
                assert elsewhere.missing, "a lost tag of a group is recorded, not fatal"
                assert list(run.results(Fetched([elsewhere])))
                assert run.fetch_job().raw_cap == 300, "learned there, known here"
            with FlowRun(config, "a", nodes=nodes, sinks=sinks, now=END) as alarms:
                alarms.plan()
                job = alarms.fetch_job()
                engine = job.engine(alarms.node.client, 1)
    assert job.node_version is not None
    assert (job.node_version.minor, job.node_version.patch) == (21, 5)
    assert isinstance(engine, AlarmEngine)
    assert engine.fetcher.max_priority_here == 3, "the old node's maximum applied here"
