"""Prefect flows: one per kind, thin wrappers around the runner (`pipelines/runner.py`).

A flow run reads top to bottom: load flows.yaml, open the node and the sinks, take the
flow's lock (`FlowRun`), a `plan` task, then **chunks** tasks on the task runner, each
fetching a group of pending chunks and writing them to every sink, then a summary artifact.

* Few task runs: each costs Prefect's engine ~10 ms of CPU in the flow's process (its
  states become events sent to the API), which was +20-30 % of a fast backfill with one
  task per chunk. The first task takes one chunk; later ones as many as make about a
  second of work (`_GroupSizer`), and the small chunks of a window in a group are joined
  into one write, as in the direct path (`FlowRun.joined`). A task writes in one of the
  run's write slots, so the sinks see as many writers as in the direct path (one; two when
  every sink is PostgreSQL, each write its own transaction); fetches go on meanwhile. Each
  write is counted as it commits, once (`_Tally`), so a group that fails half-way reports
  what it committed.
* Concurrency per node: at most `max_connections` chunks tasks at once, each holding at
  most one chunk's rows (fetching, waiting for a write slot, or writing), so memory stays
  bounded whatever the number of chunks. Why not one more, as the direct path holds: the
  Prefect process starts ~90 MB larger, and a third chunk in flight took its peak past
  400 MB on 82 M rows (401 -> 374 MB with two, CPU and throughput unchanged within noise).
  When a Prefect global concurrency limit named `historian-node-<node>` exists,
  every fetch also holds one of its slots, which bounds the node's load across concurrent
  runs, deployments and machines (`prefect gcl create historian-node-demo --limit 4`).
  Without one, nothing is asked of the API per chunk.
* Retries: a task re-runs its whole group, which is safe because writes replace their scope
  and are idempotent. Only failures that may pass are retried (`TransientNodeError` that
  reached the task un-retried, `SinkUnavailable`); never configuration, credentials, TLS,
  malformed answers, and never `RetriesExhausted`: the client already retried that error
  with backoff, and stacking both layers would multiply attempts (docs/architecture.md).
* Task runners: threads by default; `HISTORIAN_TASK_RUNNER=dask` runs fetches on a Dask
  cluster (`pip install -e '.[dask]'`, docs/scaling.md). The sinks live in the flow's
  process, so there a chunk is a **fetch** task on the cluster and a **write** task in the
  flow's thread. Fetch tasks take only picklable inputs, so a Dask worker rebuilds the
  engine from them; in the flow's own process they use the run's engine, which shares its
  connection pool and what it learned about the node's raw-answer cap.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from pipelines.prefect_env import cli_run, configure_prefect

configure_prefect()

from prefect import Flow, flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.futures import PrefectFuture  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from connectors.client import NodeClient  # noqa: E402
from connectors.errors import NodeError, TransientNodeError, one_line  # noqa: E402
from connectors.options import AlarmFilter, HistoryOptions  # noqa: E402
from connectors.schema import KIND_ALARM_HISTORY, KIND_TAG_HISTORY  # noqa: E402
from connectors.settings import NodeSettings  # noqa: E402
from pipelines.config import Config, ConfigError, load_config, parse_moment  # noqa: E402
from pipelines.destinations import SinkSet  # noqa: E402
from pipelines.engine import AlarmEngine, ChunkResult, FilterQuery, HistoryEngine  # noqa: E402
from pipelines.memory import release_memory  # noqa: E402
from pipelines.nodes import NodePool  # noqa: E402
from pipelines.planning import Chunk  # noqa: E402
from pipelines.runner import (  # noqa: E402
    ChunkOutcome,
    FlowRun,
    Plan,
    RunFailed,
    RunRequest,
    RunSummary,
)
from sinks.base import SinkError, SinkUnavailable  # noqa: E402

log = logging.getLogger("historian.flows")

ProgressCallback = Callable[[ChunkOutcome, RunSummary], None]
PlanCallback = Callable[[Plan], None]

TASK_RUNNER_ENV = "HISTORIAN_TASK_RUNNER"
DASK_ADDRESS_ENV = "HISTORIAN_DASK_ADDRESS"
NODE_LIMIT_PREFIX = "historian-node-"
RETRIES = 2
RETRY_DELAY_S = 2
# Errors a chunk retry may cure. RetriesExhausted is not one: the client retried it already.
RETRIABLE: tuple[type[Exception], ...] = (TransientNodeError, SinkUnavailable)


# -- what tasks get ------------------------------------------------------------------------


@dataclass(frozen=True)
class FetchJob:
    """Everything a fetch task needs, picklable, so it runs on threads or Dask workers."""

    run_id: str
    settings: NodeSettings
    node: str
    kind: str
    options: HistoryOptions | None = None
    filter_query: FilterQuery | None = None
    alarm_path: str | None = None
    alarm_filter: AlarmFilter | None = None
    node_limit: str | None = None


# Runs in progress in this process, by run id. Tasks get the id, not the run: a run holds
# open connections and locks, which must not be copied into task parameters.
_LIVE: dict[str, FlowRun] = {}


@dataclass(frozen=True)
class _Gates:
    """What keeps a run's chunk tasks in step: fetch slots and write slots (as many as every
    sink of the flow takes at once: `FlowRun.write_depth`, 1 unless all are PostgreSQL), and
    `record`, which counts each write as it commits (`_Tally`)."""

    fetching: threading.BoundedSemaphore
    writing: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(1)
    )
    record: Callable[[ChunkOutcome], None] = field(default=lambda outcome: None)


class _Tally:
    """Counts committed writes into the run's summary once each, from any task's thread.

    A group task counts each write as it commits, so a group that fails half-way still
    counts what it committed. A retried group writes its chunks again (idempotent); a
    write whose chunks were all counted already is not counted again (a retry that joins
    them differently with new ones is, so the summary may then count a chunk twice; the
    data never holds it twice).
    """

    def __init__(self, run: FlowRun, caller: _Caller) -> None:
        self._run = run
        self._caller = caller
        self._lock = threading.Lock()
        self._counted: set[str] = set()

    def __call__(self, outcome: ChunkOutcome) -> None:
        with self._lock:
            parts = outcome.part_ids
            if self._counted.issuperset(parts):
                return
            self._counted.update(parts)
            _count(self._run, outcome, self._caller)


_GATES: dict[str, _Gates] = {}
# Engines rebuilt in processes without the run (Dask workers), one per run and process.
_REMOTE: dict[str, tuple[HistoryEngine | AlarmEngine, NodeClient]] = {}
_REMOTE_LOCK = threading.Lock()


def _fetch_engine(job: FetchJob) -> HistoryEngine | AlarmEngine | FlowRun:
    """The run itself when it lives in this process, else an engine built from the job."""
    run = _LIVE.get(job.run_id)
    if run is not None:
        return run
    with _REMOTE_LOCK:
        known = _REMOTE.get(job.run_id)
        if known is not None:
            return known[0]
        if len(_REMOTE) >= 8:  # a long-lived worker serves many runs; keep a few
            for _, stale in _REMOTE.values():
                stale.close()
            _REMOTE.clear()
        client = NodeClient(job.settings)
        engine: HistoryEngine | AlarmEngine
        if job.kind == KIND_ALARM_HISTORY:
            assert job.alarm_path is not None
            assert job.alarm_filter is not None
            engine = AlarmEngine(client, job.node, job.alarm_path, job.alarm_filter)
        else:
            assert job.options is not None
            engine = HistoryEngine(client, job.node, job.options, filter_query=job.filter_query)
        _REMOTE[job.run_id] = (engine, client)
        return engine


def _retry_if_transient(task_: Any, task_run: Any, state: Any) -> bool:
    """Retry a chunk only when its failure may pass (see the module docstring)."""
    try:
        state.result()
    except RETRIABLE:
        return True
    except BaseException:
        return False
    return False


def _chunks_name(parameters: dict[str, Any]) -> str:
    """`chunk <label>` for one chunk, `3 chunks <first label> ...` for a group."""
    chunks = parameters["chunks"]
    if len(chunks) == 1:
        return f"chunk {chunks[0].label}"
    return f"{len(chunks)} chunks {chunks[0].label} ..."


def _fetch_name(parameters: dict[str, Any]) -> str:
    return f"fetch {parameters['chunk'].label}"


def _write_name(parameters: dict[str, Any]) -> str:
    return f"write {parameters['result'].chunk.label}"


# Prefect calls a run-name function with the task's parameters when it takes `parameters`.
_CHUNKS_NAME = cast(Any, _chunks_name)
_FETCH_NAME = cast(Any, _fetch_name)
_WRITE_NAME = cast(Any, _write_name)


def _flow_run_name() -> str:
    """`raw_history 2026-11-22T10:00Z`: the flow and when this run started (UTC)."""
    from prefect.runtime import flow_run

    name = flow_run.parameters.get("flow_name", "flow")
    return f"{name} {datetime.now(UTC):%Y-%m-%dT%H:%MZ}"


# -- tasks -----------------------------------------------------------------------------


@task(name="plan", cache_policy=NO_CACHE)
def plan_run(run_id: str) -> Plan:
    """Resolve the tags, write metadata and list the chunks still to fetch."""
    return _LIVE[run_id].plan()


@task(
    name="fetch",
    task_run_name=_FETCH_NAME,
    cache_policy=NO_CACHE,
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=_retry_if_transient,
)
def fetch_chunk(job: FetchJob, chunk: Chunk) -> ChunkResult:
    """One chunk's rows from the node (network only; runs on the task runner)."""
    return _fetch(job, chunk)


def _fetch(job: FetchJob, chunk: Chunk) -> ChunkResult:
    source = _fetch_engine(job)
    if job.node_limit is None:
        return source.fetch(chunk) if isinstance(source, FlowRun) else source.fetch_chunk(chunk)
    from prefect.concurrency.sync import concurrency

    with concurrency(job.node_limit, occupy=1, strict=False):
        return source.fetch(chunk) if isinstance(source, FlowRun) else source.fetch_chunk(chunk)


@task(
    name="chunks",
    task_run_name=_CHUNKS_NAME,
    cache_policy=NO_CACHE,
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=_retry_if_transient,
)
def extract_chunks(job: FetchJob, chunks: tuple[Chunk, ...]) -> None:
    """Fetch a group of chunks one after another and write them to every sink, the small
    ones of a window joined into one write, as the direct path does.

    Runs on a thread of the flow's process (the run and its sinks live there). Fetches
    take one of the run's fetch slots, writes one of its write slots: as many of each as
    in the direct path. Each write is counted as it commits.
    """
    gates = _GATES[job.run_id]
    run = _LIVE[job.run_id]

    def fetched() -> Iterator[ChunkResult]:
        for chunk in chunks:
            with gates.fetching:
                result = _fetch(job, chunk)
            yield result

    for result in run.joined(fetched(), chunks):
        with gates.writing:
            outcome = run.write(result)
        del result  # written: its pages go back to the system, as in the direct path
        release_memory()
        gates.record(outcome)


@task(
    name="write",
    task_run_name=_WRITE_NAME,
    cache_policy=NO_CACHE,
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=_retry_if_transient,
)
def write_chunk(run_id: str, result: ChunkResult) -> ChunkOutcome:
    """Replace the chunk's scope in every sink and record it complete (idempotent)."""
    outcome = _LIVE[run_id].write(result)
    del result
    release_memory()
    return outcome


# -- the flow body -----------------------------------------------------------------------


@dataclass
class _Caller:
    """What `run_prefect` wants back from a flow run in its own process."""

    on_chunk: ProgressCallback | None = None
    on_plan: PlanCallback | None = None
    summary: RunSummary | None = None
    report: Path | None = field(default=None)
    # flows.yaml as the caller loaded it, so the flow body does not parse it again
    config_path: str | None = None
    config: Config | None = None


_CALLER: ContextVar[_Caller | None] = ContextVar("historian_prefect_caller", default=None)


def _say(message: str) -> None:
    """A line for the run's log in the API and for the `historian` logger (-v)."""
    log.info("%s", message)
    get_run_logger().info("%s", message)


def _moment(value: str | None) -> datetime | None:
    return parse_moment(value) if value else None


def extract(
    flow_name: str,
    config_path: str,
    start: str | None,
    end: str | None,
    backfill: bool,
    *,
    kind: str,
    report_dir: str | None = None,
) -> RunSummary:
    """The body of both flows: plan, fetch as tasks, write as tasks, summarise."""
    path = Path(config_path)
    caller = _CALLER.get() or _Caller()
    if caller.config is not None and caller.config_path == config_path:
        config = caller.config
    else:
        config = load_config(path)
    flow_config = config.flows.get(flow_name)
    if flow_config is None:
        raise ConfigError(
            f"{path.name}: no flow named {flow_name!r} (flows: {', '.join(config.flows)})"
        )
    if flow_config.kind != kind:
        raise ConfigError(
            f"{path.name}: flows.{flow_name}: is a {flow_config.kind} flow, not {kind}"
        )
    request = RunRequest(start=_moment(start), end=_moment(end), backfill=backfill)
    workers = config.nodes[flow_config.node].max_connections
    run_id = uuid.uuid4().hex
    with NodePool(config) as nodes, SinkSet(config, path.resolve().parent) as sinks:
        run = FlowRun(config, flow_name, nodes=nodes, sinks=sinks, request=request)
        caller.summary = run.summary
        _LIVE[run_id] = run
        _GATES[run_id] = _Gates(
            threading.BoundedSemaphore(workers),
            threading.BoundedSemaphore(run.write_depth()),
            _Tally(run, caller),
        )
        began = time.perf_counter()
        try:
            with run:
                plan = plan_run(run_id)
                _say(
                    f"{flow_name}: {len(plan.pending)} chunks to fetch, "
                    f"{plan.chunks_planned - len(plan.pending)} already complete"
                )
                if caller.on_plan is not None:
                    caller.on_plan(plan)
                _fetch_and_write(run, run_id, plan, workers, caller)
                run.finish()
        except Exception as exc:
            run.summary.error = one_line(exc)
            raise
        finally:
            run.summary.seconds = time.perf_counter() - began
            _LIVE.pop(run_id, None)
            _GATES.pop(run_id, None)
        summary = run.summary
        report = None
        if report_dir:
            report = _write_report(config, flow_name, Path(report_dir), sinks)
            caller.report = report
    _summary_artifact(summary, plan, report)
    _say(f"{flow_name}: {summary.rows:,} rows in {summary.seconds:.1f} s")
    return summary


def _fetch_and_write(run: FlowRun, run_id: str, plan: Plan, workers: int, caller: _Caller) -> None:
    """Submit the pending chunks, a bounded number of tasks at a time, until all have ended.

    On the thread pool a task takes a group of chunks (fetch and write each; `_GroupSizer`
    says how many) and counts its writes itself. On another task runner (Dask) a chunk is
    a fetch task there and a write task here, in the flow's thread, as fetches complete.
    """
    job = _fetch_job(run, run_id)
    in_process = _runs_in_process()
    done: queue.SimpleQueue[PrefectFuture[Any]] = queue.SimpleQueue()
    # In process: `workers` tasks, each holding one chunk's rows at most (module doc).
    # On Dask, twice the fetches (the writes are here).
    bound = workers if in_process else 2 * workers
    pending = plan.pending
    taken = 0  # pending[:taken] are submitted
    sizer = _GroupSizer()
    outstanding: dict[PrefectFuture[Any], tuple[float, int]] = {}
    try:
        while True:
            while len(outstanding) < bound and taken < len(pending):
                future: PrefectFuture[Any]
                size = sizer.next_size(len(pending) - taken, bound) if in_process else 1
                group = tuple(pending[taken : taken + size])
                taken += size
                if in_process:
                    future = extract_chunks.submit(job, group)
                else:
                    future = fetch_chunk.submit(job, group[0])
                outstanding[future] = (time.perf_counter(), len(group))
                future.add_done_callback(done.put)
            if not outstanding:
                return
            finished = done.get()
            submitted, chunks = outstanding.pop(finished)
            # Raises the task's own exception once its retries are spent.
            if in_process:
                finished.result()  # its writes were counted as they committed
                sizer.observe(time.perf_counter() - submitted, chunks)
            else:
                outcome = write_chunk(run_id, cast(ChunkResult, finished.result()))
                _count(run, outcome, caller)
    except BaseException:
        # Tasks under way end first; in process, they count what they commit meanwhile.
        _abandon(set(outstanding))
        raise


class _GroupSizer:
    """How many chunks the next task takes, so that Prefect's cost per task run (~10 ms of
    the flow process's CPU, and the events it sends) stays a small share of the work.

    Why: with one task per chunk that cost was +20-30 % on a backfill of 240 chunks of
    ~340k rows (each ~0.1 s of work) and most of an hourly run of 100 small chunks. A task
    takes enough chunks for about `target_s` of work, measured on the tasks that ended
    (one chunk each until the first ends), never more than `most`, and never so many that
    the last chunks cannot spread over every slot.
    """

    def __init__(self, target_s: float = 1.0, most: int = 32) -> None:
        self.target_s = target_s
        self.most = most
        self._seconds = 0.0
        self._chunks = 0

    def observe(self, seconds: float, chunks: int) -> None:
        self._seconds += seconds
        self._chunks += chunks

    def next_size(self, remaining: int, slots: int) -> int:
        if not self._chunks:
            return 1
        per_chunk = max(self._seconds / self._chunks, 1e-3)
        size = max(1, min(self.most, int(self.target_s / per_chunk)))
        return max(1, min(size, -(-remaining // max(1, slots))))


def _runs_in_process() -> bool:
    """Whether this flow run's tasks run on threads of this process (the run lives here)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return context is not None and isinstance(context.task_runner, ThreadPoolTaskRunner)


def _count(run: FlowRun, outcome: ChunkOutcome, caller: _Caller) -> None:
    run.summary.add(outcome)
    if caller.on_chunk is not None:
        caller.on_chunk(outcome, run.summary)


def _abandon(futures: set[PrefectFuture[Any]]) -> None:
    """After a failure: cancel chunks not started, let running ones end before the node
    connection and the sinks close (a fetch whose write never started is fetched again by
    the next run)."""
    for future in futures:
        wrapped = getattr(future, "wrapped_future", None)
        if wrapped is not None:
            wrapped.cancel()
    for future in futures:
        wrapped = getattr(future, "wrapped_future", None)
        if wrapped is None or not wrapped.cancelled():
            future.wait()


def _fetch_job(run: FlowRun, run_id: str) -> FetchJob:
    node = run.node
    engine = run._engine  # set by plan(); read only to describe the work to remote workers
    limit = _node_limit(node.name)
    if isinstance(engine, AlarmEngine):
        return FetchJob(
            run_id,
            node.settings,
            node.name,
            run.kind,
            alarm_path=engine.path,
            alarm_filter=engine.filt,
            node_limit=limit,
        )
    assert isinstance(engine, HistoryEngine)
    return FetchJob(
        run_id,
        node.settings,
        node.name,
        run.kind,
        options=engine.options,
        filter_query=engine.filter_query,
        node_limit=limit,
    )


def _node_limit(node: str) -> str | None:
    """`historian-node-<node>` when that global concurrency limit exists (one API call)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    name = f"{NODE_LIMIT_PREFIX}{node}"
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None
    return name


def _write_report(config: Config, flow_name: str, directory: Path, sinks: SinkSet) -> Path:
    from pipelines.report import write_report

    return write_report(config, flow_name, directory / f"{flow_name}-coverage.html", sinks=sinks)


def _summary_artifact(summary: RunSummary, plan: Plan, report: Path | None) -> None:
    """A markdown artifact: totals, span, watermarks, and rows per tag with the gaps."""
    create_markdown_artifact(
        markdown=summary_markdown(summary, plan.members, report),
        key=artifact_key(summary.flow),
        description=f"{summary.flow}: what this run extracted",
    )


def artifact_key(flow_name: str) -> str:
    """Artifact keys are lowercase letters, digits and dashes."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in flow_name.lower()).strip("-")
    return f"historian-{slug[:80]}"


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def summary_markdown(
    summary: RunSummary,
    members: tuple[str, ...] | list[str],
    report: Path | None = None,
    *,
    limit: int = 50,
) -> str:
    """The run in a few lines and one table (busiest tags first, then tags without rows)."""
    bad_total = sum(summary.bad_quality_per_tag.values())
    without = [m for m in members if m not in summary.rows_per_tag] if summary.chunks_done else []
    lines = [
        f"### {_cell(summary.flow)} ({summary.kind}, node {_cell(summary.node)})",
        "",
        f"* span: {summary.span or 'nothing to fetch'}",
        f"* rows: {summary.rows:,} in {summary.seconds:.1f} s "
        f"({summary.rows_per_second:,.0f} rows/s, {summary.requests:,} requests)",
        f"* chunks: {summary.chunks_done} written, {summary.chunks_skipped} already complete",
        f"* members: {summary.tags}, without rows in this run: {len(without)}",
        f"* bad-quality rows (quality < 192): {bad_total:,}",
        f"* watermark: {summary.watermark_before} -> {summary.watermark_after}",
    ]
    if report is not None:
        lines.append(f"* coverage report: `{report}`")
    lines += ["", "| member | rows | bad quality |", "|---|---:|---:|"]
    for member, rows in summary.rows_per_tag.most_common(limit):
        bad = summary.bad_quality_per_tag.get(member, 0)
        lines.append(f"| {_cell(member)} | {rows:,} | {bad:,} |")
    for member in without[:limit]:
        lines.append(f"| {_cell(member)} | 0 (gap) | 0 |")
    hidden = max(0, len(summary.rows_per_tag) - limit) + max(0, len(without) - limit)
    if hidden:
        lines.append(f"| ... {hidden} more | | |")
    return "\n".join(lines)


def task_runner(workers: int) -> Any:
    """Threads (default) or Dask (`HISTORIAN_TASK_RUNNER=dask`) for `workers` fetches.

    Threads: `workers` + 1 chunk tasks, fetching, holding fetched rows for a writer, or
    writing (one, or two into PostgreSQL).
    """
    choice = os.environ.get(TASK_RUNNER_ENV, "threads").strip().lower()
    if choice in ("", "threads", "thread"):
        return ThreadPoolTaskRunner(max_workers=workers + 1)
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


# -- the flows -------------------------------------------------------------------------------


@flow(name="tag-history", flow_run_name=_flow_run_name, log_prints=False)
def tag_history_flow(
    flow_name: str,
    config_path: str,
    start: str | None = None,
    end: str | None = None,
    backfill: bool = False,
    report_dir: str | None = None,
) -> dict[str, object]:
    """Extract one tag_history flow of flows.yaml (incremental unless start is given)."""
    summary = extract(
        flow_name, config_path, start, end, backfill, kind=KIND_TAG_HISTORY, report_dir=report_dir
    )
    return summary.as_dict()


@flow(name="alarm-history", flow_run_name=_flow_run_name, log_prints=False)
def alarm_history_flow(
    flow_name: str,
    config_path: str,
    start: str | None = None,
    end: str | None = None,
    backfill: bool = False,
    report_dir: str | None = None,
) -> dict[str, object]:
    """Extract one alarm_history flow of flows.yaml (incremental unless start is given)."""
    summary = extract(
        flow_name, config_path, start, end, backfill, kind=KIND_ALARM_HISTORY, report_dir=report_dir
    )
    return summary.as_dict()


def prefect_flow_for(kind: str) -> Flow[..., dict[str, object]]:
    """The Prefect flow that runs flows.yaml flows of this kind."""
    chosen = (
        alarm_history_flow if kind in (KIND_ALARM_HISTORY, "alarm_history") else tag_history_flow
    )
    return cast(Flow[..., dict[str, object]], chosen)


@contextmanager
def _calling(caller: _Caller) -> Iterator[None]:
    token = _CALLER.set(caller)
    try:
        yield
    finally:
        _CALLER.reset(token)


# Flows with their task runner, by kind and width. `with_options` builds the flow's
# parameter schema again; each run gets its own copy of the task runner anyway.
_CONFIGURED: dict[tuple[str, int, str, str], Flow[..., dict[str, object]]] = {}


def _configured_flow(kind: str, workers: int) -> Flow[..., dict[str, object]]:
    key = (kind, workers, os.environ.get(TASK_RUNNER_ENV, ""), os.environ.get(DASK_ADDRESS_ENV, ""))
    chosen = _CONFIGURED.get(key)
    if chosen is None:
        chosen = prefect_flow_for(kind).with_options(task_runner=task_runner(workers))
        _CONFIGURED[key] = chosen
    return chosen


def run_prefect(
    config_path: Path,
    flow_name: str,
    request: RunRequest,
    *,
    on_chunk: ProgressCallback | None = None,
    on_plan: PlanCallback | None = None,
    report_dir: Path | None = None,
    config: Config | None = None,
) -> RunSummary:
    """Run one flow through Prefect now (what `historian run` does by default).

    Like `run_flow`: node and sink errors come out as `RunFailed` carrying the partial
    summary, with the original error (its own type, not a Prefect wrapper) as `__cause__`;
    configuration errors come out as they are. `on_chunk(outcome, summary)` is called in
    this thread after each chunk is written. `config`: flows.yaml as the caller read it
    (read here when None).
    """
    if config is None:
        config = load_config(config_path)
    if flow_name not in config.flows:
        raise ConfigError(
            f"{config_path.name}: no flow named {flow_name!r} (flows: {', '.join(config.flows)})"
        )
    flow_config = config.flows[flow_name]
    workers = config.nodes[flow_config.node].max_connections
    chosen = _configured_flow(flow_config.kind, workers)
    resolved = str(config_path.resolve())
    caller = _Caller(on_chunk=on_chunk, on_plan=on_plan, config_path=resolved, config=config)
    try:
        with _calling(caller), cli_run():
            chosen(
                flow_name=flow_name,
                config_path=resolved,
                start=request.start.isoformat() if request.start else None,
                end=request.end.isoformat() if request.end else None,
                backfill=request.backfill,
                report_dir=str(report_dir.resolve()) if report_dir else None,
            )
    except (NodeError, SinkError) as exc:
        summary = caller.summary or RunSummary(
            flow_name, flow_name, flow_config.kind, flow_config.node
        )
        summary.error = one_line(exc)
        raise RunFailed(summary.error, summary) from exc
    assert caller.summary is not None, "the flow ran without reporting a summary"
    return caller.summary


# -- deployments -------------------------------------------------------------------------------


def build_deployments(
    config_path: Path, names: list[str] | None = None, *, by_module: bool = False
) -> list[Any]:
    """One deployment per flow with a schedule: its cron or interval, timezone, parameters.

    `by_module` names the flow by import path (`pipelines.flows.tag_history_flow`) instead of
    by file, so a worker of a process work pool with this package installed can load it.
    """
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
    from prefect.types.entrypoint import EntrypointType

    from pipelines.schedules import check_schedules, prefect_schedule

    config = load_config(config_path)
    check_schedules(config, names, source=config_path.name)  # one line naming the key
    entrypoint = EntrypointType.MODULE_PATH if by_module else EntrypointType.FILE_PATH
    deployments = []
    for name, flow_config in config.flows.items():
        schedule = flow_config.schedule
        if schedule is None or (names and name not in names):
            continue
        deployments.append(
            prefect_flow_for(flow_config.kind).to_deployment(
                name=name,
                schedules=[prefect_schedule(schedule)],
                parameters={"flow_name": name, "config_path": str(config_path.resolve())},
                tags=["historian", flow_config.kind, f"node:{flow_config.node}"],
                # A run due while the last one still runs is cancelled (it would stop at
                # the flow's lock anyway); the next one catches up from the watermark.
                concurrency_limit=ConcurrencyLimitConfig(
                    limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
                ),
                description=f"historian flow {name} ({flow_config.kind}, node {flow_config.node})",
                entrypoint_type=entrypoint,
            )
        )
    return deployments


def deploy_flows(
    config_path: Path, work_pool: str, *, names: list[str] | None = None
) -> list[uuid.UUID]:
    """Register the scheduled flows as deployments of a work pool (docs/scaling.md).

    Unlike `serve_flows`, nothing keeps running here: workers of the pool
    (`prefect worker start --pool <name>`) pick the runs up wherever this package and
    flows.yaml are installed at the same path.
    """
    from prefect import deploy
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    deployments = build_deployments(config_path, names, by_module=True)
    if not deployments:
        raise ConfigError(f"{config_path.name}: no flow has a schedule")
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(work_pool)
        except ObjectNotFound:
            raise ConfigError(
                f"no work pool named {work_pool!r} on the Prefect server "
                f"(prefect work-pool create {work_pool} --type process)"
            ) from None
    ids = deploy(
        *deployments,
        work_pool_name=work_pool,
        build=False,
        push=False,
        print_next_steps_message=False,
    )
    return cast(list[uuid.UUID], ids)


def serve_flows(
    config_path: Path,
    *,
    names: list[str] | None = None,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Register every scheduled flow as a deployment and run them on schedule (blocks).

    The schedules fire on the configured Prefect API, or on a local Prefect server started
    for the command and stopped with it (`pipelines/prefect_server.py`): Prefect's ephemeral
    server runs no scheduler. `announce` gets one line saying where the UI and API are.
    Ctrl-C and SIGTERM stop the runner (Prefect pauses the schedules), then the server.
    """
    from prefect import serve

    from pipelines.prefect_server import api_for_schedules

    deployments = build_deployments(config_path, names)
    if not deployments:
        raise ConfigError(f"{config_path.name}: no flow has a schedule")
    with api_for_schedules() as (api_url, ours):
        if announce is not None:
            announce(serving_line(api_url, ours, [d.name for d in deployments]))
        serve(*deployments, print_starting_message=False)


def serving_line(api_url: str, ours: bool, names: list[str]) -> str:
    """`historian serve`'s one line: what it serves and where the Prefect UI and API are."""
    what = f"serving {len(names)} scheduled flows ({', '.join(names)})"
    if not ours:
        return f"{what} on the Prefect API at {api_url}; Ctrl-C stops"
    ui = api_url.removesuffix("/api")
    return (
        f"{what} on a local Prefect server: UI {ui}, API {api_url} "
        f"(PREFECT_API_URL={api_url} prefect flow-run ls); Ctrl-C stops both"
    )
