"""A crashed shard's lease is waited out before the backfill runs that shard again: the
wait is bounded, polls, stops as soon as every lease was taken, and touches only the
locks of object-storage sinks (a moto S3 server on loopback)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.config.destinations import SinkSet
from pipelines.config.models import Config
from pipelines.orchestration.fleet import ShardRun
from pipelines.orchestration.stale_leases import (
    LeaseProbe,
    lease_probes,
    uses_leases,
    wait_for_leases,
)
from pipelines.shards import Shard
from sinks.base import FlowLocked
from sinks.store.layout import LOCKS_DIR, STATE_DIR, key_name
from sinks.store.locks import LEASE_TTL_S, Lease
from sinks.store.objects import LakeStore
from tests.fixtures import load
from tests.sinks.moto_s3 import fsspec_options, moto_bucket

BUCKET = "fleet20"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def held_until(clock: FakeClock, free_at: float, what: str) -> LeaseProbe:
    def take() -> None:
        if clock.now < free_at:
            raise FlowLocked(f"{what} is already running")

    return LeaseProbe(what, take)


def test_the_wait_ends_when_the_lease_lapses_and_says_why_once() -> None:
    clock = FakeClock()
    said: list[list[str]] = []
    still = wait_for_leases(
        [held_until(clock, 25.0, "a"), held_until(clock, 0.0, "b")],
        timeout_s=130.0,
        poll_s=2.0,
        clock=clock,
        sleep=clock.sleep,
        on_wait=said.append,
    )
    assert still == []
    assert said == [["a"]], "one line, naming only what is held"
    assert 25.0 <= clock.now <= 27.0, "polled, and stopped at the first free probe"


def test_a_lease_that_never_lapses_is_waited_for_no_longer_than_the_bound() -> None:
    clock = FakeClock()
    still = wait_for_leases(
        [held_until(clock, float("inf"), "alive")],
        timeout_s=130.0,
        poll_s=3.0,
        clock=clock,
        sleep=clock.sleep,
    )
    assert still == ["alive"]
    assert clock.now == 130.0


def test_nothing_held_is_no_wait() -> None:
    clock = FakeClock()
    said: list[list[str]] = []
    assert wait_for_leases([], timeout_s=130.0, clock=clock, sleep=clock.sleep) == []
    free = held_until(clock, 0.0, "x")
    assert (
        wait_for_leases([free], timeout_s=9, clock=clock, sleep=clock.sleep, on_wait=said.append)
        == []
    )
    assert clock.slept == []
    assert said == []


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    pytest.importorskip("boto3")
    with moto_bucket(BUCKET) as url:
        yield url


def s3_config(tmp_path: Path, endpoint: str) -> tuple[Config, str]:
    """A fleet flow on two nodes into an S3 lake and a DuckDB warehouse; the lake's URL."""
    url = f"s3://{BUCKET}/lake-{uuid.uuid4().hex[:8]}"
    document = {
        "nodes": {
            "plant_a": {"simulator": {"seed": 1, "tags": 10}},
            "plant_b": {"simulator": {"seed": 2, "tags": 10}},
        },
        "sinks": {
            "lake": {"type": "parquet", "url": url, "storage_options": fsspec_options(endpoint)},
            "duck": {"type": "sql", "url": "duckdb:///warehouse.duckdb"},
        },
        "flows": {
            "f": {
                "node": ["plant_a", "plant_b"],
                "tags": {"browse": "/", "include": ["."]},
                "start": "-1h",
                "sinks": ["lake", "duck"],
            }
        },
    }
    path = tmp_path / "flows.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return load(path), url


def crashed_lease(url: str, endpoint: str, key: str, ttl_s: float) -> Lease:
    """The lease a run SIGKILLed while holding `key` leaves: there, no longer renewed."""
    store = LakeStore(url, fsspec_options(endpoint))
    lease = Lease(
        store, store.path(STATE_DIR, LOCKS_DIR, f"{key_name(key)}.lease.json"), key, ttl_s
    )
    lease.acquire()
    lease._stop.set()  # its holder is gone: nobody renews it, nobody deletes it
    assert lease._thread is not None
    lease._thread.join(timeout=5)
    return lease


def test_a_shard_runs_lock_keys_come_back_from_its_flow_run_parameters(
    tmp_path: Path, endpoint: str
) -> None:
    from datetime import UTC, datetime

    config, _ = s3_config(tmp_path, endpoint)
    at = datetime(2026, 11, 1, tzinfo=UTC)
    per_node = ShardRun("f", ["plant_b"], Shard(1, 4))
    assert ShardRun.from_parameters(per_node.parameters(at, at)) == per_node
    assert per_node.lock_keys(config) == ["f@plant_b#2-of-4"]
    every_node = ShardRun.from_parameters(ShardRun("f", None, Shard(0, 2)).parameters(at, at))
    assert every_node.lock_keys(config) == ["f@plant_a#1-of-2", "f@plant_b#1-of-2"]
    assert ShardRun("f", None, None).lock_keys(config) == ["f@plant_a", "f@plant_b"]


def test_only_lakes_on_object_storage_hold_leases(tmp_path: Path, endpoint: str) -> None:
    config, _ = s3_config(tmp_path, endpoint)
    assert uses_leases(config.sinks["lake"])
    assert not uses_leases(config.sinks["duck"])
    with SinkSet(config, tmp_path) as sinks:
        probes = lease_probes(config, sinks, "f", ["f@plant_a#1-of-2"])
    assert [probe.what for probe in probes] == ["f@plant_a#1-of-2 in sink lake"]


def test_a_crashed_runs_lease_on_s3_is_waited_out_and_a_live_one_is_not_taken(
    tmp_path: Path, endpoint: str
) -> None:
    config, url = s3_config(tmp_path, endpoint)
    crashed = crashed_lease(url, endpoint, "f@plant_a#1-of-2", ttl_s=1.5)
    alive = Lease(
        LakeStore(url, fsspec_options(endpoint)),
        LakeStore(url, fsspec_options(endpoint)).path(
            STATE_DIR, LOCKS_DIR, f"{key_name('f@plant_b#1-of-2')}.lease.json"
        ),
        "f@plant_b#1-of-2",
        ttl_s=1.5,
    )
    alive.acquire()  # renewed every 0.4 s: never lapses
    try:
        with SinkSet(config, tmp_path) as sinks:
            lake = sinks.get("lake")
            with pytest.raises(FlowLocked), lake.lock("f@plant_a#1-of-2"):
                pass  # as the re-run would find it: "already running"
            said: list[list[str]] = []
            probes = lease_probes(config, sinks, "f", ["f@plant_a#1-of-2", "f@plant_b#1-of-2"])
            still = wait_for_leases(probes, timeout_s=6.0, poll_s=0.25, on_wait=said.append)
            assert said == [["f@plant_a#1-of-2 in sink lake", "f@plant_b#1-of-2 in sink lake"]]
            assert still == ["f@plant_b#1-of-2 in sink lake"], "a live holder keeps its lease"
            with lake.lock("f@plant_a#1-of-2"):
                pass  # the crashed shard's re-run takes its lock
            assert crashed.store.read_bytes(crashed.path) is None, "the probe left no lease"
    finally:
        alive.release()


def test_the_backfill_waits_out_only_the_crashed_shards_it_is_about_to_run(
    tmp_path: Path,
    endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import pipelines.orchestration.fleet
    from pipelines.cli.fleet import wait_out_crashed_leases

    config, url = s3_config(tmp_path, endpoint)
    path = tmp_path / "flows.yaml"
    runs = pipelines.orchestration.fleet.plan_shards(config, "f", shards=2, per_node=False)
    crashed_lease(url, endpoint, "f@plant_a#1-of-3", ttl_s=60.0)  # of another split: not ours
    monkeypatch.setattr(
        pipelines.orchestration.fleet,
        "crashed_shards",
        lambda flow: [ShardRun("f", None, Shard(0, 3))],
    )
    wait_out_crashed_leases(config, path, "f", runs)
    assert capsys.readouterr().out == "", "no shard about to run is held"

    crashed_lease(url, endpoint, "f@plant_a#1-of-2", ttl_s=1.5)
    monkeypatch.setattr(
        pipelines.orchestration.fleet,
        "crashed_shards",
        lambda flow: [ShardRun("f", None, Shard(0, 2))],
    )
    wait_out_crashed_leases(config, path, "f", runs)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "f@plant_a#1-of-2 in sink lake: held by a run Prefect reports crashed; "
        f"waiting up to {LEASE_TTL_S + 10:.0f} s"
    )
    with SinkSet(config, tmp_path) as sinks, sinks.get("lake").lock("f@plant_a#1-of-2"):
        pass  # the re-run of that shard takes its lock


@pytest.mark.slow
def test_the_crashed_shards_are_those_whose_last_ended_run_crashed(tmp_path: Path) -> None:
    """Against a real `prefect server start`: flow runs tagged as three backfills of `f`.
    Shard 1 crashed, then completed; shard 2 completed, crashed, then failed (its re-run
    found the lease): only shard 2 is named."""
    from datetime import UTC, datetime

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Completed, Crashed, Failed

    from pipelines.orchestration.fleet import BACKFILL_ID_TAG, BACKFILL_TAG, crashed_shards
    from tests.prefect_server import prefect_server

    @flow(name="tag-history")
    def tag_history(flow_name: str, shard: dict[str, Any] | None = None) -> None:
        """Stands for pipelines.orchestration.flows.tag_history_flow: only its runs' records are used."""

    at = datetime(2026, 11, 1, tzinfo=UTC)
    first, second = (ShardRun("f", ["plant_a"], Shard(i, 2)) for i in range(2))
    with prefect_server(tmp_path) as (api, _), temporary_settings({PREFECT_API_URL: api}):
        with get_client(sync_client=True) as client:
            backfills: list[tuple[str, list[tuple[ShardRun, Any]]]] = [
                ("f-1", [(first, Crashed()), (second, Completed())]),
                ("f-2", [(first, Completed()), (second, Crashed())]),
                ("f-3", [(second, Failed())]),
            ]
            for backfill, shard_states in backfills:
                for run, state in shard_states:
                    client.create_flow_run(
                        tag_history,
                        parameters=run.parameters(at, at),
                        tags=["historian", f"{BACKFILL_TAG}f", f"{BACKFILL_ID_TAG}{backfill}"],
                        state=state,
                    )
        assert crashed_shards("f") == [second]
        assert crashed_shards("f", page=1) == [second], "read page by page"
        assert crashed_shards("g") == []
