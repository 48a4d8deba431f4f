"""Writers in several processes on object storage (moto S3 on loopback), where no flock
exists: the lake takes turns per dataset by a conditional-PUT lease, Delta Lake commits
conditionally and re-plans a lost race, Iceberg re-plans a commit the catalog refused.
The jobs and checks are the contract suite's (tests/sinks/contract_writers.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from sinks.base import FlowLocked, SinkError
from sinks.lake.sink import ParquetLake
from sinks.store.locks import DatasetLease, Lease
from sinks.store.objects import LakeStore
from tests.sinks.contract_sinks import build
from tests.sinks.contract_writers import assert_every_scope_once, run_writers
from tests.sinks.moto_s3 import fsspec_options, moto_bucket
from tests.sinks.sql.sql_frames import history, hours, scope
from tests.sinks.test_contract import assert_holds

BUCKET = "fleet"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    pytest.importorskip("boto3")
    with moto_bucket(BUCKET) as url:
        yield url


def sink_on_s3(name: str, endpoint: str, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """(class, kwargs) of a sink of kind `name` in a fresh prefix of the bucket."""
    url = f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"
    if name == "lake":
        return "sinks.lake.sink:ParquetLake", {
            "url": url,
            "storage_options": fsspec_options(endpoint),
        }
    if name == "delta":
        options = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }
        return "sinks.tables.delta:DeltaLake", {"url": url, "storage_options": options}
    properties = {
        "s3.endpoint": endpoint,
        "s3.access-key-id": "x",
        "s3.secret-access-key": "x",
        "s3.region": "us-east-1",
    }
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    return "sinks.tables.iceberg:IcebergLake", {
        "url": url,
        "catalog": catalog,
        "properties": properties,
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lake", "delta", "iceberg"])
def test_writers_in_several_processes_on_s3_commit_every_scope_exactly_once(
    endpoint: str, tmp_path: Path, name: str
) -> None:
    cls, kwargs = sink_on_s3(name, endpoint, tmp_path)
    run_writers(cls, kwargs)
    sink = build(cls, kwargs)
    sink.open()
    try:
        assert_every_scope_once(sink)
    finally:
        sink.close()


def test_the_dataset_lease_is_one_writer_at_a_time_and_taken_over_when_expired(
    endpoint: str,
) -> None:
    store = LakeStore(f"s3://{BUCKET}/lease-{uuid.uuid4().hex[:8]}", fsspec_options(endpoint))
    path = store.path("_historian", "hist", "write.lease")
    first = DatasetLease(store, path)
    first.acquire(timeout_s=5)
    second = DatasetLease(store, path)
    with pytest.raises(SinkError, match=r"no turn to write in 1 s: s3://.*write\.lease is held"):
        second.acquire(timeout_s=1)
    first.release()
    second.acquire(timeout_s=5)  # free again once released
    second.release()
    stale = DatasetLease(store, path, ttl_s=0.0)  # a holder that stalled: its lease lapsed
    stale.acquire(timeout_s=5)
    third = DatasetLease(store, path)
    third.acquire(timeout_s=5)  # taken over
    stale.release()  # the stalled holder wakes up: the lease in place is not its own
    fourth = DatasetLease(store, path)
    with pytest.raises(SinkError, match="is held by another writer"):
        fourth.acquire(timeout_s=1)
    third.release()
    fourth.acquire(timeout_s=5)
    fourth.release()


def test_of_two_takers_of_one_lapsed_lease_exactly_one_gets_it(
    endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both have read the lapsed lease and its ETag when the first one takes it over (the
    interleaving forced here): the second one's takeover is conditional on the ETag it
    read, so it is refused and the second finds the first one's live lease."""
    url = f"s3://{BUCKET}/race-{uuid.uuid4().hex[:8]}"
    store = LakeStore(url, fsspec_options(endpoint))
    assert store.conditional
    path = store.path("_historian", "_locks", "f.lease.json")
    dead = Lease(store, path, "f", ttl_s=0.0)  # a holder killed: its lease lapsed at once
    dead.acquire()
    dead._stop.set()
    first = Lease(store, path, "f")
    second = Lease(LakeStore(url, fsspec_options(endpoint)), path, "f")
    refused: list[str | None] = []
    real_replace = second.store.replace_if

    def first_acts_then_replace(target: str, data: bytes, etag: str) -> str | None:
        first.acquire()  # between the second's read of the lapsed lease and its write
        refused.append(real_replace(target, data, etag))
        return refused[-1]

    monkeypatch.setattr(second.store, "replace_if", first_acts_then_replace)
    try:
        with pytest.raises(FlowLocked, match="already running"):
            second.acquire()
        assert refused == [None], "the second takeover was refused"
        assert store.read_json(path)["owner"] == first.owner
    finally:
        first.release()
    assert store.read_bytes(path) is None


def test_a_holder_that_stalled_past_its_lease_leaves_its_successors_alone(endpoint: str) -> None:
    store = LakeStore(f"s3://{BUCKET}/stall-{uuid.uuid4().hex[:8]}", fsspec_options(endpoint))
    path = store.path("_historian", "hist", "write.lease")
    stalled = DatasetLease(store, path, ttl_s=0.0)
    stalled.acquire(timeout_s=5)
    stalled._stop.set()  # the holder stalls: nothing renews its lease, which lapses
    assert stalled._thread is not None
    stalled._thread.join(timeout=5)
    successor = DatasetLease(store, path)
    successor.acquire(timeout_s=5)  # took the lapsed lease over
    # The stalled holder wakes up: its renewal, conditional on the lease it wrote, is
    # refused, so it stops renewing; its release is conditional too.
    stalled._stop.clear()
    stalled._hold()
    try:
        stalled._thread.join(timeout=5)
        assert not stalled._thread.is_alive(), "the renewal gave up the lost lease"
        assert stalled._etag is None
    finally:
        stalled.release()
    assert store.read_json(path)["owner"] == successor.owner
    successor.release()
    assert store.read_bytes(path) is None


def test_a_long_lived_process_sees_what_other_processes_wrote_since_it_last_looked(
    endpoint: str,
) -> None:
    """`historian serve`, a worker or a reader keeps its lake open across runs: another
    process's files in a partition it listed before are read, not missed or reported
    missing (fsspec's listings cache once kept the old listing)."""
    url = f"s3://{BUCKET}/cache-{uuid.uuid4().hex[:8]}"
    here = ParquetLake(url, name="here", storage_options=fsspec_options(endpoint))
    # Another process: its own filesystem object, not this one's cached instance.
    there = ParquetLake(
        url, name="there", storage_options={**fsspec_options(endpoint), "skip_instance_cache": True}
    )
    here.open()
    there.open()
    try:
        first = history(["a"], hours(0, 1), step_s=900)
        here.write(scope(["a"], hours(0, 1)), first, len(first))
        assert_holds(here, "hist", "tag_history", first)  # lists the partition
        second = history(["b"], hours(0, 1), step_s=900)
        there.write(scope(["b"], hours(0, 1)), second, len(second))
        both = pd.concat([first, second], ignore_index=True)
        assert_holds(here, "hist", "tag_history", both)
        third = history(["c"], hours(0, 1), step_s=900)
        here.write(scope(["c"], hours(0, 1)), third, len(third))
        assert_holds(there, "hist", "tag_history", pd.concat([both, third], ignore_index=True))
    finally:
        here.close()
        there.close()
