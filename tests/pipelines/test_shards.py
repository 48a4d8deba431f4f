"""Shards of a backfill: every planned chunk in exactly one shard (whole batches or whole
windows, contiguous), and shards run through the one core loop write exactly what the
unsharded backfill writes, resuming like it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import FlowRun, RunRequest
from pipelines.core.units import run_flow
from pipelines.planning import plan_chunks
from pipelines.shards import Shard
from sinks.base import FlowLocked
from tests.fixtures import canonical, load, write_config

START = datetime(2026, 11, 1, tzinfo=UTC)
END = START + timedelta(hours=3)
BATCHES = [tuple(f"/t{b}.{i}" for i in range(3)) for b in range(7)]


def chunks() -> list[Any]:
    return plan_chunks(
        "f", "f", "tag_history", BATCHES, Window(START, END), timedelta(minutes=20), ""
    )


def batch_major(chunk: Any) -> tuple[Any, ...]:
    """A chunk's place taken batch by batch (in the plan's batch order), window by window."""
    return (BATCHES.index(chunk.members), chunk.window.start)


@pytest.mark.parametrize("by", ["tags", "time"])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 9])
def test_every_chunk_is_in_exactly_one_shard_and_shards_are_contiguous(by: str, count: int) -> None:
    planned = chunks()
    parts = [Shard(i, count, by).select(planned) for i in range(count)]  # type: ignore[arg-type]
    ids = [c.chunk_id for part in parts for c in part]
    assert sorted(ids) == sorted(c.chunk_id for c in planned)
    assert len(ids) == len(set(ids))
    for part in parts:
        assert part == [c for c in planned if c in part], "plan order kept"
    sizes = [len(part) for part in parts]
    if by == "tags":
        # contiguous batch by batch, window by window; equal chunk counts
        seen = [c for part in parts for c in sorted(part, key=batch_major)]
        assert seen == sorted(planned, key=batch_major)
        assert max(sizes) - min(sizes) <= 1, "even split by chunk count"
        return
    order = sorted({c.window.start for c in planned})
    seen_windows: list[Any] = []
    for part in parts:
        windows = sorted({c.window.start for c in part})
        # whole windows: a window in this shard has all its chunks here
        assert all(sum(1 for c in part if c.window.start == w) == len(BATCHES) for w in windows)
        seen_windows.extend(windows)
    assert seen_windows == order, "contiguous ranges, in order"
    assert max(sizes) - min(sizes) <= len(BATCHES), "even split by windows"


def test_batches_that_divide_evenly_stay_whole_and_the_rest_are_split_by_windows() -> None:
    span = Window(START, START + timedelta(hours=3))  # 9 windows of 20 minutes
    plan = plan_chunks("f", "f", "tag_history", BATCHES[:4], span, timedelta(minutes=20), "")
    whole = [Shard(i, 2).select(plan) for i in range(2)]
    assert [sorted({c.members for c in part}) for part in whole] == [
        sorted(BATCHES[:2]),
        sorted(BATCHES[2:4]),
    ], "4 batches over 2 shards: 2 whole batches each"

    plan = plan_chunks("f", "f", "tag_history", BATCHES[:3], span, timedelta(minutes=20), "")
    first, second = [Shard(i, 2).select(plan) for i in range(2)]
    assert (len(first), len(second)) == (13, 14), "3 batches of 9 windows: 13 + 14, not 18 + 9"
    middle = BATCHES[1]
    assert {c.members for c in first} == {BATCHES[0], middle}
    assert {c.members for c in second} == {middle, BATCHES[2]}
    split = sorted(c.window.start for c in plan if c.members == middle)
    assert [c.window.start for c in first if c.members == middle] == split[:4]
    assert [c.window.start for c in second if c.members == middle] == split[4:]


def test_one_batch_is_shared_out_by_windows() -> None:
    """A selection read in one batch (a group filter, an alarm flow) still spreads."""
    plan = plan_chunks(
        "f", "f", "tag_history", BATCHES[:1], Window(START, END), timedelta(minutes=20), ""
    )
    parts = [Shard(i, 3).select(plan) for i in range(3)]
    assert [len(part) for part in parts] == [3, 3, 3]


def test_a_shard_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="shard 4 of 4 does not exist"):
        Shard(4, 4)
    with pytest.raises(ValueError, match="use tags or time"):
        Shard(0, 2, "nodes")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    node = SimulatedNode(SimConfig(seed=5, tags=18))
    node.set_clock(int((END + timedelta(days=1)).timestamp() * 1000))
    with run_server(node, http_port=0, https_port=None) as handle:
        yield handle


def config(tmp_path: Path, server: Any) -> Path:
    flow = {
        "node": "n",
        "tags": {"browse": "/", "include": ["."]},
        "mode": "raw",
        "window": "30m",
        "batch": 5,
        "start": START.isoformat(),
        "settle": "0s",
    }
    return write_config(tmp_path, node={"url": server.http_url}, flows={"f": flow}, sinks=["duck"])


def backfill(path: Path, shard: Shard | None) -> Any:
    cfg = load(path)
    request = RunRequest(start=START, end=END, backfill=True, shard=shard)
    with NodePool(cfg) as nodes, SinkSet(cfg, path.parent) as sinks:
        return run_flow(cfg, "f", nodes=nodes, sinks=sinks, request=request)


def rows(path: Path) -> list[Any]:
    cfg = load(path)
    with SinkSet(cfg, path.parent) as sinks:
        return canonical(sinks.get("duck").read("f", "tag_history"))


@pytest.mark.parametrize("by", ["tags", "time"])
def test_shards_write_what_the_whole_backfill_writes_and_a_rerun_skips_them(
    tmp_path: Path, server: Any, by: str
) -> None:
    (tmp_path / "whole").mkdir()
    (tmp_path / "shards").mkdir()
    whole = config(tmp_path / "whole", server)
    sharded = config(tmp_path / "shards", server)
    everything = backfill(whole, None)
    summaries = [backfill(sharded, Shard(i, 3, by)) for i in range(3)]  # type: ignore[arg-type]
    assert [s.shard for s in summaries] == ["1-of-3", "2-of-3", "3-of-3"]
    assert sum(s.chunks_planned for s in summaries) == everything.chunks_planned
    assert sum(s.rows for s in summaries) == everything.rows > 0
    assert rows(sharded) == rows(whole)
    again = backfill(sharded, None)  # the unsharded re-run finds every chunk committed
    assert again.chunks_done == 0
    assert again.chunks_skipped == everything.chunks_planned


def test_a_shard_locks_its_own_key(tmp_path: Path, server: Any) -> None:
    path = config(tmp_path, server)
    cfg = load(path)
    with NodePool(cfg) as nodes, SinkSet(cfg, path.parent) as sinks:
        first = FlowRun(cfg, "f", nodes=nodes, sinks=sinks, request=RunRequest(shard=Shard(0, 2)))
        same = FlowRun(cfg, "f", nodes=nodes, sinks=sinks, request=RunRequest(shard=Shard(0, 2)))
        other = FlowRun(cfg, "f", nodes=nodes, sinks=sinks, request=RunRequest(shard=Shard(1, 2)))
        assert first.lock_key == "f#1-of-2"
        with first:
            with other:
                pass  # another shard of the same backfill runs at the same time
            with pytest.raises(FlowLocked), same:
                pass


def test_a_node_slot_the_server_could_not_grant_is_retried_and_a_config_error_is_not() -> None:
    from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
    from prefect.states import Failed

    from pipelines.config.models import ConfigError
    from pipelines.orchestration.tasks import retry_if_no_slot

    busy = ConcurrencySlotAcquisitionError("Unable to acquire concurrency slots: 503")
    assert retry_if_no_slot(None, None, Failed(data=busy)) is True
    assert retry_if_no_slot(None, None, Failed(data=ConfigError("bad key"))) is False
