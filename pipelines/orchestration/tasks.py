"""Prefect as a submitter of the core's work (`pipelines.core.runner.Submitter`): a unit's
plan as a `plan` task, its pending chunks as `fetch` tasks on the flow run's task runner.

* one chunk a task, or several small ones (`ChunkGroups`: an hourly run's hundred chunks
  of a few hundred rows are a few tasks), at most the node's `max_connections` at once;
  the core joins, writes and counts what they fetched, as on the direct path (on threads
  each chunk's rows reach it through a `Handover` as soon as they are in, not as the
  task's return value);
* retries: none of a failed plan or chunk here: the core runs them again when that may
  help, wherever they run (`pipelines.core.engine.retrying`; docs/architecture.md,
  "Retries"); a task runs again only for a node slot the server could not grant;
* concurrency across runs: when a Prefect global concurrency limit named
  `historian-node-<node>` exists, every plan and fetch holds one of its slots
  (`prefect gcl create historian-node-demo --limit 4`); without one, nothing is asked of
  the API per chunk.

Task runners: threads by default; `HISTORIAN_TASK_RUNNER=dask` runs fetch tasks on a Dask
cluster (`pip install -e '.[dask]'`, docs/scaling.md). On threads a fetch task gets the
unit itself (its engine and connection pool); on Dask it gets the unit's picklable
`FetchJob` (what the core decided: missing-tag rule, node version, raw cap learned) and
builds the same engine over a client for the chunk.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, cast

from pipelines.orchestration.env import configure_prefect

configure_prefect()

from prefect import task  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.futures import PrefectFuture  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from pipelines.config.models import ConfigError  # noqa: E402
from pipelines.core.engine import ChunkResult, FetchJob  # noqa: E402
from pipelines.core.runner import FlowRun, Plan  # noqa: E402
from pipelines.orchestration.names import node_limit_name  # noqa: E402
from pipelines.planning import Chunk  # noqa: E402

TASK_RUNNER_ENV = "HISTORIAN_TASK_RUNNER"
DASK_ADDRESS_ENV = "HISTORIAN_DASK_ADDRESS"
SLOT_LEASE_S = 60
# A node slot the Prefect server could not grant is asked for again (the task runs again).
SLOT_RETRIES = 2
SLOT_RETRY_DELAY_S = 2.0


def retry_if_no_slot(task_: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: a node slot the Prefect server could not grant just then
    (a busy server answers 503). A failed plan or fetch is never re-run here: the core
    already ran it again when that may help (`pipelines.core.engine.retrying`)."""
    from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError

    try:
        state.result()
    except ConcurrencySlotAcquisitionError:
        return True
    except BaseException:
        return False
    return False


def _fetch_name(parameters: dict[str, Any]) -> str:
    chunks: Sequence[Chunk] = parameters["chunks"]
    more = f" and {len(chunks) - 1} more chunks" if len(chunks) > 1 else ""
    return f"fetch {chunks[0].label}{more}"


# Prefect calls a run-name function with the task's parameters when it takes `parameters`.
_FETCH_NAME = cast(Any, _fetch_name)


def _holding(node_limit: str | None) -> Any:
    """One slot of the node's global concurrency limit while asking the node (waiting for
    it when every slot is taken by runs on any worker); nothing without a limit."""
    if node_limit is None:
        return nullcontext()
    from prefect.concurrency.sync import concurrency

    # A worker that dies holding a slot gives it back when the lease lapses (the least
    # Prefect allows); a live one renews it for as long as the request lasts.
    return concurrency(node_limit, occupy=1, strict=False, lease_duration=SLOT_LEASE_S)


@task(
    name="plan",
    cache_policy=NO_CACHE,
    retries=SLOT_RETRIES,
    retry_delay_seconds=SLOT_RETRY_DELAY_S,
    retry_condition_fn=retry_if_no_slot,
)
def plan_run(run: FlowRun) -> Plan:
    """Resolve the tags, write metadata and list the chunks still to fetch (asking the
    node one request at a time, under one slot of its limit)."""
    with _holding(_node_limit(run.node.name)):
        return run.plan()


@task(
    name="fetch",
    task_run_name=_FETCH_NAME,
    cache_policy=NO_CACHE,
    retries=SLOT_RETRIES,
    retry_delay_seconds=SLOT_RETRY_DELAY_S,
    retry_condition_fn=retry_if_no_slot,
)
def fetch_chunks(
    source: FlowRun | FetchJob,
    chunks: Sequence[Chunk],
    node_limit: str | None,
    handover: Handover | None,
) -> list[ChunkResult] | None:
    """A group of chunks' rows from the node, one request at a time (network and parsing
    only; writes stay in the run).

    With a `handover` (tasks on threads of the run's process) each chunk's rows go there
    as soon as they are in, and the task returns None; a retry skips the chunks already
    handed over. Otherwise (Dask) they are the task's return value."""
    results = []
    for chunk in chunks:
        if handover is not None and handover.delivered(chunk):
            continue
        with _holding(node_limit):
            result = source.fetch(chunk)
        if handover is None:
            results.append(result)
        elif not handover.put(result):
            return None  # the run stopped reading: the rest is fetched by the next run
        del result
    return None if handover is not None else results


class Handover:
    """Fetched rows passed from fetch tasks to the run in the same process, beside Prefect.

    Why: Prefect's task-run machinery keeps a task's return value in reference cycles (its
    run state, transaction, result) that only the garbage collector's next full pass frees, so rows
    returned through Prefect outlived their write and raised the run's peak memory
    (BENCHMARKS.md, "Prefect's cost"). And a task of several chunks hands each over as it
    comes, so the run writes it while the task fetches the next; at most `room` chunks
    wait for the run at once, the one it writes included (a task hands its next one over
    when the run has taken one), so fetching never runs ahead of writing by more than the
    direct path's in-flight chunks."""

    def __init__(self, deliver: Callable[[ChunkResult], None], room: int) -> None:
        self._deliver = deliver
        self._delivered: set[str] = set()
        self._lock = threading.Lock()
        self._room = threading.Semaphore(room)
        self._closed = threading.Event()

    def put(self, result: ChunkResult) -> bool:
        """Hand a chunk over (waiting for room); False when the run no longer reads."""
        while not self._room.acquire(timeout=0.1):
            if self._closed.is_set():
                return False
        with self._lock:
            self._delivered.add(result.chunk.chunk_id)
        self._deliver(result)
        return True

    def taken(self) -> None:
        """The run is done with a chunk handed over: room for the next."""
        self._room.release()

    def close(self) -> None:
        """The run reads no more: tasks waiting for room stop."""
        self._closed.set()

    def delivered(self, chunk: Chunk) -> bool:
        with self._lock:
            return chunk.chunk_id in self._delivered


# A task fetches several chunks: up to about this many rows and seconds of fetching in all
# (each task run costs ~10 ms of Prefect's CPU in the run's process and about as much of
# the server's, as much as fetching a chunk of a few thousand rows). Its chunks reach the
# run one by one as they come (`Handover`), so a group holds no more rows in memory than
# single-chunk tasks would.
GROUP_ROWS = 1_000_000
GROUP_SECONDS = 1.0


@dataclass
class ChunkGroups:
    """How many chunks the next fetch task takes: one until chunks have been seen, then as
    many as fit GROUP_ROWS and GROUP_SECONDS at the rows and seconds per chunk seen so far,
    never so many that a connection would be left idle; always one without `connections`
    (Dask)."""

    connections: int
    chunks: int = 0
    rows: int = 0
    seconds: float = 0.0

    def saw(self, result: ChunkResult) -> None:
        self.chunks += 1
        self.rows += result.rows_fetched
        self.seconds += result.seconds

    def size(self, remaining: int) -> int:
        if not self.chunks or remaining <= 0 or self.connections <= 0:
            return 1
        by_rows = GROUP_ROWS * self.chunks // max(1, self.rows)
        by_time = int(GROUP_SECONDS * self.chunks / max(self.seconds, 1e-6))
        spread = -(-remaining // max(1, self.connections))
        return max(1, min(by_rows, by_time, spread))


class PrefectTasks:
    """The core's `Submitter` in a Prefect flow run: the plan and the fetches as tasks."""

    def plan(self, unit: FlowRun) -> Plan:
        return plan_run(unit)

    def fetch(self, unit: FlowRun, chunks: Sequence[Chunk]) -> Iterator[ChunkResult]:
        return _fetch_in_tasks(unit, chunks)


PREFECT_TASKS = PrefectTasks()


def _fetch_in_tasks(run: FlowRun, chunks: Sequence[Chunk]) -> Iterator[ChunkResult]:
    """The run's chunks as `fetch` tasks (one chunk each, or a few small ones:
    `ChunkGroups`), at most `max_connections` under way, yielded as they are fetched. After a failure, or when the run stops reading, tasks not started
    are cancelled and running ones end before the node closes."""
    in_process = _runs_in_process()
    source: FlowRun | FetchJob = run if in_process else run.fetch_job()
    arrived: queue.SimpleQueue[ChunkResult | PrefectFuture[list[ChunkResult] | None]]
    arrived = queue.SimpleQueue()
    bound = run.config.nodes[run.node_name].max_connections
    # One chunk waits for the run, the one it writes: with a fetched chunk at most in each
    # task, the run holds `max_connections + 1`, as the direct path (engine.stream_bounded).
    handover = Handover(arrived.put, room=1) if in_process else None
    limit = _node_limit(run.node.name)
    # On Dask a task's rows are its return value, all of them at once: one chunk a task.
    groups = ChunkGroups(bound if in_process else 0)
    outstanding: set[PrefectFuture[list[ChunkResult] | None]] = set()
    todo = list(chunks)
    taken = 0
    try:
        while True:
            while len(outstanding) < bound and taken < len(todo):
                group = todo[taken : taken + groups.size(len(todo) - taken)]
                taken += len(group)
                future = fetch_chunks.submit(source, group, limit, handover)
                future.add_done_callback(arrived.put)
                outstanding.add(future)
            if not outstanding:
                return
            item = arrived.get()
            if isinstance(item, ChunkResult):
                groups.saw(item)
                yield item
                del item
                assert handover is not None
                handover.taken()
                continue
            outstanding.discard(item)
            returned = item.result()  # the task's own exception (the core re-ran the chunk already)
            del item
            for result in returned or ():
                groups.saw(result)
                yield result
                del result
            del returned
    finally:
        if handover is not None:
            handover.close()
        _abandon(outstanding)


def _runs_in_process() -> bool:
    """Whether this flow run's tasks run on threads of this process (the run lives here)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return context is not None and isinstance(context.task_runner, ThreadPoolTaskRunner)


def _abandon(futures: set[PrefectFuture[list[ChunkResult] | None]]) -> None:
    """Cancel fetches not started; wait for running ones (their rows are dropped and
    fetched again by the next run)."""
    for future in futures:
        wrapped = getattr(future, "wrapped_future", None)
        if wrapped is not None:
            wrapped.cancel()
    for future in futures:
        wrapped = getattr(future, "wrapped_future", None)
        if wrapped is None or not wrapped.cancelled():
            future.wait()


def _node_limit(node: str) -> str | None:
    """`historian-node-<node>` when that global concurrency limit exists (one API call)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    name = node_limit_name(node)
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None
    return name


def task_runner(workers: int) -> Any:
    """Threads (default) or Dask (`HISTORIAN_TASK_RUNNER=dask`) for `workers` fetches.

    Threads: `workers` fetch tasks at once (`_fetch_in_tasks` submits no more), and the
    plan task.
    """
    choice = os.environ.get(TASK_RUNNER_ENV, "threads").strip().lower()
    if choice in ("", "threads", "thread"):
        return ThreadPoolTaskRunner(max_workers=workers)
    if choice != "dask":
        raise ConfigError(f"{TASK_RUNNER_ENV}={choice!r}: use threads or dask")
    try:
        from prefect_dask import DaskTaskRunner  # type: ignore[attr-defined]
    except ImportError:
        raise ConfigError(
            f"{TASK_RUNNER_ENV}=dask needs prefect-dask: pip install -e '.[dask]'"
        ) from None
    address = os.environ.get(DASK_ADDRESS_ENV)
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": workers,
            "threads_per_worker": 1,
            "processes": True,
            "dashboard_address": ":0",  # any free port: 8787 may be taken
        }
    )
