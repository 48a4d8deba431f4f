"""Waiting out a crashed shard's lease before the backfill runs that shard again.

On an object-storage lake a flow's lock is a lease (sinks/store/locks.py) that outlives a killed
holder by up to its time to live (`LEASE_TTL_S`). Prefect's crash automation reports a run
whose worker machine died after 90 s without heartbeats (pipelines/orchestration/fleet.py), later than
that; but a worker that lives reports its flow-run process Crashed as soon as it exits (the
kernel's OOM killer, a SIGKILL), and a re-run submitted then would find that shard "already
running". So `historian backfill --shards` first takes and releases, in each object-storage
sink of the flow, the lock of every shard whose last run crashed, polling until each is
granted (its lease lapsed, then is taken over and deleted) or the time to live has passed.
Every other lock (a lock file's flock, an advisory lock, DuckDB's file lock) ends with
its holder's process: there is nothing to wait for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from pipelines.config.destinations import SinkSet
from pipelines.config.models import (
    Config,
    DeltaSinkConfig,
    IcebergSinkConfig,
    ParquetSinkConfig,
    SinkConfig,
)
from sinks.base import FlowLocked, Sink
from sinks.store.objects import on_object_storage


@dataclass(frozen=True)
class LeaseProbe:
    """One lock key in one sink: `take` acquires and releases it, FlowLocked while held."""

    what: str
    take: Callable[[], None]

    def held(self) -> bool:
        try:
            self.take()
        except FlowLocked:
            return True
        return False


def uses_leases(sink: SinkConfig) -> bool:
    """Whether the sink's flow locks are leases: a lake (Parquet, Delta, Iceberg) on
    object storage, i.e. at a URL whose scheme is not a local file system's."""
    if not isinstance(sink, ParquetSinkConfig | DeltaSinkConfig | IcebergSinkConfig):
        return False
    return on_object_storage(sink.url)


def lease_probes(
    config: Config, sinks: SinkSet, flow: str, keys: Sequence[str]
) -> list[LeaseProbe]:
    """A probe per lock key per object-storage sink of the flow (none for other sinks)."""
    probes: list[LeaseProbe] = []
    for name in config.flows[flow].sinks:
        if not uses_leases(config.sinks[name]):
            continue
        sink = sinks.get(name)
        probes.extend(
            LeaseProbe(f"{key} in sink {name}", partial(_take, sink, key)) for key in keys
        )
    return probes


def _take(sink: Sink, key: str) -> None:
    with sink.lock(key):
        pass


def wait_for_leases(
    probes: Sequence[LeaseProbe],
    *,
    timeout_s: float,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_wait: Callable[[list[str]], None] | None = None,
) -> list[str]:
    """Probe until no lock is held or `timeout_s` passed; what is still held (empty: all
    granted). Each granted lock is probed no more. `on_wait`: called once, with what is
    held, when the first round finds any (before the first wait)."""
    deadline = clock() + timeout_s
    pending = list(probes)
    first = True
    while True:
        pending = [probe for probe in pending if probe.held()]
        if first and pending and on_wait is not None:
            on_wait([probe.what for probe in pending])
        first = False
        left = deadline - clock()
        if not pending or left <= 0:
            return [probe.what for probe in pending]
        sleep(min(poll_s, left))
