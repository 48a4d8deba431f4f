"""Prefect flows: one per kind, around the one execution core (`runner.run_flow`).

A flow run reads top to bottom (`extract`): load flows.yaml, open the node and the sinks,
and call `run_flow`, the same loop the direct path runs (lock, plan, fetch, join, write,
count, watermark). Prefect only decides how the work is submitted:

* the plan is a `plan` task, and the pending chunks `fetch` tasks on the flow's task
  runner, one chunk each, or several small ones (`ChunkGroups`: an hourly run's hundred
  chunks of a few hundred rows are a few tasks), at most the node's `max_connections` at
  once (`_fetch_in_tasks`); the run's own loop joins, writes and counts what they
  fetched, as in the direct path (on threads each chunk's rows reach it through a
  `Handover` as soon as they are in, not as the task's return value);
* retries: a fetch task is retried when the engine says a chunk retry may help
  (`pipelines.core.engine.chunk_retry_may_help`; docs/architecture.md, "Retries");
* concurrency across runs: when a Prefect global concurrency limit named
  `historian-node-<node>` exists, every fetch holds one of its slots
  (`prefect gcl create historian-node-demo --limit 4`); without one, nothing is asked of
  the API per chunk;
* a markdown artifact summarises the run. `historian serve` and `historian deploy` make
  deployments of these flows (schedules, work pools): `pipelines/orchestration/deployments.py`.

Task runners: threads by default; `HISTORIAN_TASK_RUNNER=dask` runs fetch tasks on a Dask
cluster (`pip install -e '.[dask]'`, docs/scaling.md). On threads a fetch task gets the
run itself (its engine, connection pool and what it learned about the node's raw-answer
cap); on Dask it gets a picklable `FetchJob` and builds a client for the chunk.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from pipelines.orchestration.env import cli_run, configure_prefect

configure_prefect()

from prefect import Flow, flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.futures import PrefectFuture  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from connectors.client import NodeClient  # noqa: E402
from connectors.errors import NodeError, one_line  # noqa: E402
from connectors.options import AlarmFilter, HistoryOptions  # noqa: E402
from connectors.schema import KIND_ALARM_HISTORY, KIND_TAG_HISTORY  # noqa: E402
from connectors.settings import NodeSettings  # noqa: E402
from pipelines.config.destinations import SinkSet  # noqa: E402
from pipelines.config.models import Config, ConfigError, load_config, parse_moment  # noqa: E402
from pipelines.config.nodes import NodePool  # noqa: E402
from pipelines.core.engine import (  # noqa: E402
    CHUNK_RETRIES,
    CHUNK_RETRY_DELAY_S,
    AlarmEngine,
    ChunkResult,
    FilterQuery,
    HistoryEngine,
    chunk_retry_may_help,
)
from pipelines.core.runner import (  # noqa: E402
    ChunkOutcome,
    FlowRun,
    Plan,
    RunFailed,
    RunRequest,
    RunSummary,
    run_flow,
)
from pipelines.orchestration.fleet import NODE_LIMIT_PREFIX, SHARD_ARTIFACT_PREFIX  # noqa: E402
from pipelines.planning import Chunk  # noqa: E402
from pipelines.shards import Shard  # noqa: E402
from sinks.base import SinkError  # noqa: E402

log = logging.getLogger("historian.flows")

ProgressCallback = Callable[[ChunkOutcome, RunSummary], None]
PlanCallback = Callable[[Plan], None]

TASK_RUNNER_ENV = "HISTORIAN_TASK_RUNNER"
DASK_ADDRESS_ENV = "HISTORIAN_DASK_ADDRESS"
RETRIES = CHUNK_RETRIES
SLOT_LEASE_S = 60
RETRY_DELAY_S = CHUNK_RETRY_DELAY_S


@dataclass(frozen=True)
class FetchJob:
    """What a fetch task on another process (Dask) needs to fetch a chunk: picklable."""

    settings: NodeSettings
    node: str
    kind: str
    options: HistoryOptions | None = None
    filter_query: FilterQuery | None = None
    alarm_path: str | None = None
    alarm_filter: AlarmFilter | None = None

    def fetch(self, chunk: Chunk) -> ChunkResult:
        """The chunk, through a client of this process, closed after it."""
        client = NodeClient(self.settings)
        try:
            engine: HistoryEngine | AlarmEngine
            if self.kind == KIND_ALARM_HISTORY:
                assert self.alarm_path is not None
                assert self.alarm_filter is not None
                engine = AlarmEngine(client, self.node, self.alarm_path, self.alarm_filter)
            else:
                assert self.options is not None
                engine = HistoryEngine(
                    client, self.node, self.options, filter_query=self.filter_query
                )
            return engine.fetch_chunk(chunk)
        finally:
            client.close()


def _fetch_job(run: FlowRun) -> FetchJob:
    node, engine = run.node, run.engine
    if isinstance(engine, AlarmEngine):
        return FetchJob(
            node.settings, node.name, run.kind, alarm_path=engine.path, alarm_filter=engine.filt
        )
    return FetchJob(
        node.settings,
        node.name,
        run.kind,
        options=engine.options,
        filter_query=engine.filter_query,
    )


def _retry_if_transient(task_: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: the engine's decision, `chunk_retry_may_help`; or a
    node slot the Prefect server could not grant just then (a busy server answers 503)."""
    from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError

    try:
        state.result()
    except ConcurrencySlotAcquisitionError:
        return True
    except BaseException as exc:
        return chunk_retry_may_help(exc)
    return False


def _fetch_name(parameters: dict[str, Any]) -> str:
    chunks: Sequence[Chunk] = parameters["chunks"]
    more = f" and {len(chunks) - 1} more chunks" if len(chunks) > 1 else ""
    return f"fetch {chunks[0].label}{more}"


# Prefect calls a run-name function with the task's parameters when it takes `parameters`.
_FETCH_NAME = cast(Any, _fetch_name)


def _flow_run_name() -> str:
    """`raw_history 2026-11-22T10:00Z`: the flow and when this run started (UTC)."""
    from prefect.runtime import flow_run

    name = flow_run.parameters.get("flow_name", "flow")
    shard = Shard.from_parameter(flow_run.parameters.get("shard"))
    if shard is not None:
        name = f"{name} {shard.label}"
    return f"{name} {datetime.now(UTC):%Y-%m-%dT%H:%MZ}"


# -- tasks -----------------------------------------------------------------------------


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
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=_retry_if_transient,
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
    retries=RETRIES,
    retry_delay_seconds=RETRY_DELAY_S,
    retry_condition_fn=_retry_if_transient,
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

    Why: Prefect's task engine keeps a task's return value in reference cycles (engine,
    transaction, state) that only the garbage collector's next full pass frees, so rows
    returned through Prefect outlived their write and raised the run's peak memory
    (BENCHMARKS.md, "Prefect's cost"). And a task of several chunks hands each over as it
    comes, so the run writes it while the task fetches the next; at most `room` chunks
    wait for the run at once (a task hands its next one over when the run has taken one),
    so fetching never runs ahead of writing by more than the direct path's in-flight
    chunks."""

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
# (each task run costs ~10 ms of the engine's CPU in the run's process and about as much of
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


def _fetch_in_tasks(run: FlowRun, chunks: Sequence[Chunk]) -> Iterator[ChunkResult]:
    """The run's chunks as `fetch` tasks (one chunk each, or a few small ones:
    `ChunkGroups`), at most `max_connections` under way, yielded as they are fetched (the
    core's `Fetcher`). After a failure, or when the run stops reading, tasks not started
    are cancelled and running ones end before the node closes."""
    in_process = _runs_in_process()
    source: FlowRun | FetchJob = run if in_process else _fetch_job(run)
    arrived: queue.SimpleQueue[ChunkResult | PrefectFuture[list[ChunkResult] | None]]
    arrived = queue.SimpleQueue()
    bound = run.config.nodes[run.node_name].max_connections
    handover = Handover(arrived.put, room=bound) if in_process else None
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
            returned = item.result()  # the task's own exception once its retries are spent
            del item
            for result in returned or ():
                groups.saw(result)
                yield result
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


# The caller of a flow run in this process (none for runs of a deployment).
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
    nodes: list[str] | None = None,
    shard: Shard | None = None,
) -> RunSummary:
    """The body of both flows: the core's `run_flow` with tasks for the plan and fetches,
    then the report (when asked) and the summary artifact."""
    caller = _CALLER.get() or _Caller()
    config = caller.config if caller.config_path == config_path else None
    config = config or load_config(Path(config_path))
    _check_kind(config, flow_name, kind, Path(config_path))
    plans: list[Plan] = []

    def on_plan(plan: Plan) -> None:
        plans.append(plan)
        done = plan.chunks_planned - len(plan.pending)
        _say(f"{plan.key}: {len(plan.pending)} chunks to fetch, {done} already complete")
        if caller.on_plan is not None:
            caller.on_plan(plan)

    request = RunRequest(
        start=_moment(start),
        end=_moment(end),
        backfill=backfill,
        nodes=tuple(nodes) if nodes is not None else None,
        shard=shard,
    )
    with (
        NodePool(config) as pool,
        SinkSet(config, Path(config_path).parent, writing=True) as sinks,
    ):
        try:
            summary = run_flow(
                config,
                flow_name,
                nodes=pool,
                sinks=sinks,
                request=request,
                on_plan=on_plan,
                on_chunk=caller.on_chunk,
                fetch=_fetch_in_tasks,
                plan=plan_run,
            )
        except RunFailed as failed:
            caller.summary = failed.summary
            raise
        caller.summary = summary
        if report_dir:
            caller.report = _write_report(config, flow_name, Path(report_dir), sinks)
    _summary_artifact(summary, plans[0] if plans else None, caller.report)
    if shard is not None:
        _shard_artifact(summary)
    _say(f"{flow_name}: {summary.rows:,} rows in {summary.seconds:.1f} s")
    return summary


def _check_kind(config: Config, flow_name: str, kind: str, path: Path) -> None:
    flow_config = config.flows.get(flow_name)
    if flow_config is None:
        raise ConfigError(
            f"{path.name}: no flow named {flow_name!r} (flows: {', '.join(config.flows)})"
        )
    if flow_config.kind != kind:
        raise ConfigError(
            f"{path.name}: flows.{flow_name}: is a {flow_config.kind} flow, not {kind}"
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
    from pipelines.report.page import write_report

    return write_report(config, flow_name, directory / f"{flow_name}-coverage.html", sinks=sinks)


def _summary_artifact(summary: RunSummary, plan: Plan | None, report: Path | None) -> None:
    """A markdown artifact: totals, span, watermarks, and rows per tag with the gaps."""
    create_markdown_artifact(
        markdown=summary_markdown(summary, plan.members if plan else (), report),
        key=artifact_key(summary.flow),
        description=f"{summary.flow}: what this run extracted",
    )


def _shard_artifact(summary: RunSummary) -> None:
    """A one-row table a sharded backfill reads back (`pipelines.orchestration.fleet.wait_for_shards`)."""
    from prefect.artifacts import create_table_artifact

    counts = {
        key: summary.as_dict()[key]
        for key in ("shard", "chunks_planned", "chunks_skipped", "chunks_done", "rows")
    }
    slug = artifact_key(summary.flow).removeprefix("historian-")
    create_table_artifact(
        table=[counts],
        key=f"{SHARD_ARTIFACT_PREFIX}{slug}"[:100],
        description=f"{summary.flow} shard {summary.shard}: chunks and rows",
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


# -- the flows -------------------------------------------------------------------------------


@flow(name="tag-history", flow_run_name=_flow_run_name, log_prints=False)
def tag_history_flow(
    flow_name: str,
    config_path: str,
    start: str | None = None,
    end: str | None = None,
    backfill: bool = False,
    report_dir: str | None = None,
    nodes: list[str] | None = None,
    shard: dict[str, Any] | None = None,
) -> dict[str, object]:
    """Extract one tag_history flow of flows.yaml (incremental unless start is given);
    `nodes`: only these nodes of a fleet flow (None: all of them); `shard`: one part of a
    sharded backfill (pipelines/shards.py)."""
    summary = extract(
        flow_name,
        config_path,
        start,
        end,
        backfill,
        kind=KIND_TAG_HISTORY,
        report_dir=report_dir,
        nodes=nodes,
        shard=Shard.from_parameter(shard),
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
    nodes: list[str] | None = None,
    shard: dict[str, Any] | None = None,
) -> dict[str, object]:
    """Extract one alarm_history flow of flows.yaml (incremental unless start is given);
    `nodes`: only these nodes of a fleet flow (None: all of them); `shard`: one part of a
    sharded backfill (pipelines/shards.py)."""
    summary = extract(
        flow_name,
        config_path,
        start,
        end,
        backfill,
        kind=KIND_ALARM_HISTORY,
        report_dir=report_dir,
        nodes=nodes,
        shard=Shard.from_parameter(shard),
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


def run_prefect(
    config_path: Path,
    flow_name: str,
    request: RunRequest,
    *,
    on_chunk: ProgressCallback | None = None,
    on_plan: PlanCallback | None = None,
    report_dir: Path | None = None,
    config: Config | None = None,
    record_task_runs: bool = True,
) -> RunSummary:
    """Run one flow through Prefect now (what `historian run` does by default).

    Like `run_flow`: node and sink errors come out as `RunFailed` carrying the partial
    summary, with the original error (its own type, not a Prefect wrapper) as `__cause__`;
    configuration errors come out as they are. `on_chunk(outcome, summary)` is called
    after each chunk is written. `config`: flows.yaml as the caller read it (read here
    when None). `record_task_runs=False`: a Prefect ephemeral server this starts records
    no task runs (`pipelines/orchestration/env.py` says why the command line asks for that).
    """
    if config is None:
        config = load_config(config_path)
    if flow_name not in config.flows:
        raise ConfigError(
            f"{config_path.name}: no flow named {flow_name!r} (flows: {', '.join(config.flows)})"
        )
    flow_config = config.flows[flow_name]
    from pipelines.core.units import selected_nodes

    chosen_nodes = selected_nodes(config, flow_name, request)
    # Every node's fetches at once (each bounded by its max_connections), and its plan.
    workers = sum(config.nodes[node].max_connections + 1 for node in chosen_nodes)
    chosen = prefect_flow_for(flow_config.kind).with_options(task_runner=task_runner(workers))
    resolved = str(config_path.resolve())
    caller = _Caller(on_chunk=on_chunk, on_plan=on_plan, config_path=resolved, config=config)
    try:
        from prefect import tags

        with (
            _calling(caller),
            cli_run(record_task_runs=record_task_runs),
            tags(*(f"node:{node}" for node in chosen_nodes)),
        ):
            chosen(
                flow_name=flow_name,
                config_path=resolved,
                start=request.start.isoformat() if request.start else None,
                end=request.end.isoformat() if request.end else None,
                backfill=request.backfill,
                report_dir=str(report_dir.resolve()) if report_dir else None,
                shard=request.shard.as_parameter() if request.shard else None,
                nodes=list(request.nodes) if request.nodes is not None else None,
            )
    except RunFailed:
        raise
    except (NodeError, SinkError) as exc:
        summary = caller.summary or RunSummary(
            flow_name, flow_name, flow_config.kind, ", ".join(chosen_nodes)
        )
        summary.error = one_line(exc)
        raise RunFailed(summary.error, summary) from exc
    assert caller.summary is not None, "the flow ran without reporting a summary"
    return caller.summary
