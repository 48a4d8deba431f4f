"""Writers in several processes on object storage (moto S3 on loopback), where no flock
exists: the lake takes turns per dataset by a conditional-PUT lease, Delta Lake commits
conditionally and re-plans a lost race, Iceberg re-plans a commit the catalog refused.
The jobs and checks are the contract suite's (tests/sinks/contract_writers.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sinks.base import SinkError
from sinks.lake_store import LakeStore
from sinks.locks import DatasetLease
from tests.sinks.contract_sinks import build
from tests.sinks.contract_writers import assert_every_scope_once, run_writers
from tests.sinks.moto_s3 import moto_process

BUCKET = "fleet"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    boto3 = pytest.importorskip("boto3")
    server, url = moto_process()
    try:
        client = boto3.client(
            "s3", endpoint_url=url, aws_access_key_id="x", aws_secret_access_key="x",
            region_name="us-east-1",
        )  # fmt: skip
        client.create_bucket(Bucket=BUCKET)
        yield url
    finally:
        server.kill()
        server.wait(timeout=10)


def fsspec_options(endpoint: str) -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": endpoint}, "key": "x", "secret": "x"}


def sink_on_s3(name: str, endpoint: str, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """(class, kwargs) of a sink of kind `name` in a fresh prefix of the bucket."""
    url = f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"
    if name == "lake":
        return "sinks.parquet:ParquetLake", {
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
        return "sinks.delta:DeltaLake", {"url": url, "storage_options": options}
    properties = {
        "s3.endpoint": endpoint,
        "s3.access-key-id": "x",
        "s3.secret-access-key": "x",
        "s3.region": "us-east-1",
    }
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    return "sinks.iceberg:IcebergLake", {"url": url, "catalog": catalog, "properties": properties}


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
    stale = DatasetLease(store, path, ttl_s=0.0)  # a holder that died: its lease lapsed
    stale.acquire(timeout_s=5)
    stale._stop.set()
    third = DatasetLease(store, path)
    third.acquire(timeout_s=5)
    third.release()
