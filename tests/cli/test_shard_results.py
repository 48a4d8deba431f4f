"""What a sharded backfill prints once its flow runs ended: a line per shard, a total, and
one error naming the shards that did not complete."""

from __future__ import annotations

import uuid

import pytest

from pipelines.cli.base import EXIT_FAILED, UserError, out
from pipelines.cli.fleet import print_shard_results
from pipelines.orchestration.fleet import ShardResult, ShardRun
from pipelines.shards import Shard


def result(index: int, state: str, **summary: int) -> ShardResult:
    run = ShardRun("f", None, Shard(index, 2, "tags"))
    return ShardResult(run, uuid.uuid4(), state, message="killed", seconds=3.0, summary=summary)


def test_completed_shards_print_a_line_each_and_a_total() -> None:
    done = result(0, "COMPLETED", chunks_done=3, chunks_skipped=1, chunks_planned=4, rows=1500)
    other = result(1, "COMPLETED", chunks_done=2, chunks_planned=2, rows=500)
    with out.capture() as captured:
        print_shard_results([done, other])
    lines = captured.get().splitlines()
    assert lines[0] == done.line()
    assert lines[1] == other.line()
    assert lines[2] == "total: 2/2 shards completed, 5 chunks, 2,000 rows"


def test_a_shard_that_did_not_complete_fails_the_command_by_name() -> None:
    done = result(0, "COMPLETED", chunks_done=3, chunks_planned=3, rows=900)
    crashed = result(1, "CRASHED")
    with out.capture() as captured, pytest.raises(UserError) as caught:
        print_shard_results([done, crashed])
    assert captured.get().splitlines()[2] == "total: 1/2 shards completed, 3 chunks, 900 rows"
    assert caught.value.code == EXIT_FAILED
    assert str(caught.value) == (
        f"1 shards did not complete: {crashed.run.label} (crashed); run the same backfill "
        "again to finish them (committed chunks are skipped)"
    )
