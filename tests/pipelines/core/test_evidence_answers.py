"""Issue 27's answers that only look complete: each proven by what the node answered.

Each test runs the whole pipeline against the real simulator over loopback with the profile
that reproduces the situation, into a Parquet lake and PostgreSQL (DuckDB where no server
answers), and compares the sinks with the simulator's ground truth row for row. Each failed
before the pipeline handled it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.options import HistoryOptions
from connectors.pager import CapGuess
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.simulator.tagtree import without_history
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.engine import ChunkResult
from pipelines.core.runner import FlowRun, RunSummary, Threads
from pipelines.core.units import run_flow
from pipelines.planning import Chunk
from pipelines.state import missing_windows, tag_members
from sinks.base import merge_windows
from tests.fixtures import history_rows, load, truth_history_rows, write_config

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
SPAN = Window(NOW - timedelta(hours=2), NOW)
RAW = HistoryOptions(mode="raw")
WAREHOUSES = ["duckdb", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextmanager
def served(profile: str, **config: Any) -> Iterator[tuple[SimulatedNode, str]]:
    node = SimulatedNode(SimConfig(seed=27, profile=profile, **config))
    node.set_clock(int(NOW.timestamp() * 1000))
    with run_server(node, http_port=0, https_port=None) as server:
        yield node, server.http_url


def flow_of(tags: dict[str, Any], **extra: Any) -> dict[str, Any]:
    flow: dict[str, Any] = {
        "node": "n",
        "tags": tags,
        "mode": "raw",
        "window": "30m",
        "start": SPAN.start.isoformat(),
        "settle": "0s",
    }
    flow.update(extra)
    return flow


def configured(
    tmp_path: Path, url: str, flows: dict[str, Any], warehouse: str, request: pytest.FixtureRequest
) -> Path:
    """flows.yaml writing into a lake and the warehouse (PostgreSQL, or DuckDB)."""
    if warehouse == "postgres":
        pg = (request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))
        return write_config(tmp_path, node={"url": url}, flows=flows, pg=pg, sinks=["lake", "pg"])
    return write_config(tmp_path, node={"url": url}, flows=flows, sinks=["lake", "duck"])


def run(path: Path, flow: str) -> RunSummary:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, flow, nodes=nodes, sinks=sinks, now=NOW)


def assert_sinks_hold(path: Path, flow: str, want: list[Any]) -> None:
    """Every sink of `flow` holds exactly `want`: none missing, none extra, none twice."""
    assert want, "the truth is not empty"
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        for name in config.flows[flow].sinks:
            rows = history_rows(sinks.get(name).read(flow, "tag_history"))
            missing, extra = set(want) - set(rows), set(rows) - set(want)
            assert (len(missing), len(extra), len(rows)) == (0, 0, len(want)), name


def members_of(path: Path, flow: str) -> dict[str, tuple[list[str], list[str]]]:
    """Per sink: (tags complete over the whole span, tags recorded missing) of `flow`."""
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        out = {}
        for name in config.flows[flow].sinks:
            progress = sinks.get(name).progress(flow)
            whole = [
                tag
                for tag in tag_members(progress)
                if merge_windows(list(progress.windows_of(tag))) == [SPAN]
            ]
            out[name] = (whole, sorted(missing_windows(progress)))
        return out


# -- 2. a raw cap counted per answer ----------------------------------------------------------


@pytest.mark.parametrize("warehouse", WAREHOUSES)
def test_an_answer_capped_as_a_whole_loses_no_row_of_any_tag(
    tmp_path: Path, warehouse: str, request: pytest.FixtureRequest
) -> None:
    with served("raw-cap-per-answer", tags=30, raw_cap=1000) as (node, url):
        group = sorted(p for p in node.tag_paths() if p.startswith("/Plant B/"))
        named = node.tag_paths()[:9]
        flows = {
            "group": flow_of({"group": "/Plant B/", "recurrent": True}),
            "named": flow_of({"paths": named}, limit=400, batch=5),
        }
        path = configured(tmp_path, url, flows, warehouse, request)
        run(path, "group")
        run(path, "named")
    assert_sinks_hold(path, "group", truth_history_rows(node, group, [SPAN], RAW))
    assert_sinks_hold(path, "named", truth_history_rows(node, named, [SPAN], RAW))


# -- 6. a non-recursive group on a node whose browse always recurses --------------------------

LINE = (
    "/HO/Line 1/Temp.PV",
    "/HO/Line 1/Flow, Rate",
    "/HO/Line 1/Cell 2/Pressure",
    "/HO/Line 1/Cell 2/Sub/Level",
    "/HO/Line 10/Temp.PV",
    "/HO/Line 2/Débit",
)


@pytest.mark.parametrize("warehouse", WAREHOUSES)
def test_a_group_without_recursion_holds_its_direct_children_only(
    tmp_path: Path,
    warehouse: str,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with served("browse-always-recurses", tag_paths=LINE) as (node, url):
        flows = {"f": flow_of({"group": "/HO/Line 1/", "recurrent": False})}
        path = configured(tmp_path, url, flows, warehouse, request)
        with caplog.at_level(logging.INFO, logger="historian.selection"):
            summary = run(path, "f")
    said = [record.getMessage() for record in caplog.records]
    assert not [line for line in said if "repeated" in line], "no false diagnosis"
    assert any("2 tags outside the selection (recurrent: False)" in line for line in said)
    children = ["/HO/Line 1/Flow, Rate", "/HO/Line 1/Temp.PV"]
    assert summary.tags == 2
    assert_sinks_hold(path, "f", truth_history_rows(node, children, [SPAN], RAW))
    assert all(tags == (children, []) for tags in members_of(path, "f").values())


# -- 7. data: null for a tag without history --------------------------------------------------


@pytest.mark.parametrize("warehouse", WAREHOUSES)
def test_a_tag_without_history_is_complete_with_no_rows_not_missing(
    tmp_path: Path, warehouse: str, request: pytest.FixtureRequest
) -> None:
    with served("null-without-history", tags=24) as (node, url):
        under = sorted(p for p in node.tag_paths() if p.startswith("/Plant A/"))
        empty = [p for p in under if without_history(node.tree().by_path[p])]
        assert 0 < len(empty) < len(under)
        named = sorted(under[:4] + empty[:1])
        flows = {
            "group": flow_of({"group": "/Plant A/", "recurrent": True}),
            "named": flow_of({"paths": named}, batch=3),
        }
        path = configured(tmp_path, url, flows, warehouse, request)
        group = run(path, "group")
        run(path, "named")  # stopped, before: the named tag was "left out" on every run
    assert group.missing == {}
    assert_sinks_hold(path, "group", truth_history_rows(node, under, [SPAN], RAW))
    assert_sinks_hold(path, "named", truth_history_rows(node, named, [SPAN], RAW))
    for flow, tags in (("group", under), ("named", named)):
        assert all(got == (tags, []) for got in members_of(path, flow).values()), flow


def test_a_cap_per_answer_learned_on_another_process_comes_back_and_goes_along(
    tmp_path: Path,
) -> None:
    """A Dask worker fetches with the run's `FetchJob`: the per-answer cap it learns comes
    back with its chunk, and later jobs carry it (`CapGuess.kind`, `CapGuess.size`)."""
    with served("raw-cap-per-answer", tags=30, raw_cap=1000) as (_, url):
        flows = {"f": flow_of({"group": "/Plant B/", "recurrent": True}, window="2h")}
        path = write_config(tmp_path, node={"url": url}, flows=flows, sinks=["lake"])
        config = load(path)
        with (
            NodePool(config) as nodes,
            SinkSet(config, tmp_path) as sinks,
            FlowRun(config, "f", nodes=nodes, sinks=sinks, now=NOW) as unit,
        ):
            (chunk,) = unit.plan().pending
            before = unit.fetch_job()
            elsewhere = before.fetch(chunk)  # as a Dask worker does: its own client
            assert before.raw_answer_cap is None
            assert elsewhere.raw_answer_cap == 1000
            assert list(unit.results(Done([elsewhere])))
            cap = unit.engine.raw_cap
            assert isinstance(cap, CapGuess)
            assert (cap.kind, cap.size) == ("per answer", 1000)
            assert unit.fetch_job().raw_answer_cap == 1000, "learned there, known here"


class Done(Threads):
    """A submitter whose fetches were done elsewhere: these results."""

    def __init__(self, results: list[ChunkResult]) -> None:
        self.results = results

    def fetch(self, unit: FlowRun, chunks: Sequence[Chunk]) -> Iterator[ChunkResult]:
        return iter(self.results)
