"""Prefect flows: one per kind, built from flows.yaml, thin wrappers around the runner.

* `tag_history_flow` / `alarm_history_flow`: plan, then chunk **fetch** tasks submitted to
  the task runner (threads by default, at most the node's `max_connections` at once: the
  per-node concurrency limit; Dask with `HISTORIAN_TASK_RUNNER=dask`), and a chunk
  **write** task in the flow's process as each fetch completes (sinks are written from
  one place, in order of completion, at most 2 x workers chunks in memory).
* Fetch tasks get only picklable inputs (node settings, options, the chunk), so they run
  the same on threads or on Dask workers; write tasks are idempotent, so Prefect's
  retries (transient errors only) can never duplicate a row.
* The flow ends with a summary artifact: rows per tag, tags without rows, bad-quality
  counts, throughput, span and watermarks.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from pipelines.prefect_env import configure_prefect

configure_prefect()

from prefect import flow, get_run_logger, task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402
from prefect.task_runners import ThreadPoolTaskRunner  # noqa: E402

from connectors.client import NodeClient  # noqa: E402
from connectors.errors import RetriesExhausted, TransientNodeError  # noqa: E402
from connectors.options import AlarmFilter, HistoryOptions  # noqa: E402
from connectors.schema import KIND_ALARM_HISTORY  # noqa: E402
from connectors.settings import NodeSettings  # noqa: E402
from pipelines.config import load_config, parse_moment  # noqa: E402
from pipelines.destinations import SinkSet  # noqa: E402
from pipelines.engine import AlarmEngine, ChunkResult, FilterQuery, HistoryEngine  # noqa: E402
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
from sinks.base import SinkUnavailable  # noqa: E402

ProgressCallback = Callable[[ChunkOutcome, RunSummary], None]


@dataclass(frozen=True)
class FetchSpec:
    """Everything a fetch task needs, picklable (threads or Dask workers alike)."""

    settings: NodeSettings
    node: str
    kind: str
    options: HistoryOptions | None
    filter_query: FilterQuery | None
    alarm_path: str | None
    alarm_filter: AlarmFilter | None


_clients: dict[NodeSettings, NodeClient] = {}
_clients_lock = threading.Lock()


def _client(settings: NodeSettings) -> NodeClient:
    """One pooled client per node and process (a Dask worker keeps its own)."""
    with _clients_lock:
        client = _clients.get(settings)
        if client is None:
            client = _clients[settings] = NodeClient(settings)
        return client


def _transient(task_: Any, task_run: Any, state: Any) -> bool:
    """Retry a chunk only when the failure may pass: never config, auth, TLS or shape errors."""
    try:
        state.result()
    except (TransientNodeError, RetriesExhausted, SinkUnavailable):
        return True
    except Exception:
        return False
    return False


@task(
    name="fetch",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_transient,
)
def fetch_chunk(spec: FetchSpec, chunk: Chunk) -> ChunkResult:
    client = _client(spec.settings)
    if spec.kind == KIND_ALARM_HISTORY:
        assert spec.alarm_path is not None and spec.alarm_filter is not None
        return AlarmEngine(client, spec.node, spec.alarm_path, spec.alarm_filter).fetch_chunk(chunk)
    assert spec.options is not None
    engine = HistoryEngine(client, spec.node, spec.options, filter_query=spec.filter_query)
    return engine.fetch_chunk(chunk)


# The runs in progress in this process, by flow name. Tasks get the name, not the run:
# task parameters are kept by Prefect, and a run holds open connections.
_RUNS: dict[str, FlowRun] = {}


@task(
    name="write",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_transient,
)
def write_chunk(flow_name: str, result: ChunkResult) -> ChunkOutcome:
    return _RUNS[flow_name].write(result)


@task(name="plan", cache_policy=NO_CACHE)
def plan_run(flow_name: str) -> Any:
    return _RUNS[flow_name].plan()


class _Hooks:
    """Per-process hooks of the CLI: the progress callback and the last summary."""

    on_chunk: ProgressCallback | None = None
    summary: RunSummary | None = None


def _fetch_spec(run: FlowRun) -> FetchSpec:
    engine = run._engine
    node = run.node
    if isinstance(engine, AlarmEngine):
        return FetchSpec(node.settings, node.name, run.kind, None, None, engine.path, engine.filt)
    assert isinstance(engine, HistoryEngine)
    return FetchSpec(
        node.settings, node.name, run.kind, engine.options, engine.filter_query, None, None
    )


def _moment(value: str | None) -> datetime | None:
    return parse_moment(value) if value else None


def _run(
    flow_name: str, config_path: str, start: str | None, end: str | None, backfill: bool
) -> RunSummary:
    logger = get_run_logger()
    path = Path(config_path)
    config = load_config(path)
    request = RunRequest(start=_moment(start), end=_moment(end), backfill=backfill)
    workers = config.nodes[config.flows[flow_name].node].max_connections
    with NodePool(config) as nodes, SinkSet(config, path.resolve().parent) as sinks:
        run = FlowRun(config, flow_name, nodes=nodes, sinks=sinks, request=request)
        _Hooks.summary = run.summary
        _RUNS[flow_name] = run
        try:
            summary = _execute(run, flow_name, workers)
        finally:
            _RUNS.pop(flow_name, None)
    _artifact(summary)
    logger.info("%s: %d rows in %.1f s", flow_name, summary.rows, summary.seconds)
    return summary


def _execute(run: FlowRun, flow_name: str, workers: int) -> RunSummary:
    logger = get_run_logger()
    with run:
        plan = cast(Plan, plan_run(flow_name))
        logger.info(
            "%s: %d chunks to fetch (%d already done)",
            flow_name,
            len(plan.pending),
            plan.chunks_planned - len(plan.pending),
        )
        spec = _fetch_spec(run)
        pending: deque[Any] = deque()
        began = datetime.now()

        def drain_one() -> None:
            result = pending.popleft().result()
            outcome = write_chunk.with_options(task_run_name=f"write {result.chunk.label}")(
                flow_name, result
            )
            run.summary.add(outcome)
            if _Hooks.on_chunk is not None:
                _Hooks.on_chunk(outcome, run.summary)

        for chunk in plan.pending:
            pending.append(
                fetch_chunk.with_options(task_run_name=f"fetch {chunk.label}").submit(spec, chunk)
            )
            if len(pending) >= 2 * workers:
                drain_one()
        while pending:
            drain_one()
        run.finish()
        run.summary.seconds = (datetime.now() - began).total_seconds()
    return run.summary


def _artifact(summary: RunSummary) -> None:
    lines = [
        f"### {summary.flow} ({summary.kind})",
        "",
        f"* span: {summary.span}",
        f"* rows: {summary.rows:,} in {summary.seconds:.1f} s ({summary.rows_per_second:,.0f} rows/s)",
        f"* chunks: {summary.chunks_done} done, {summary.chunks_skipped} already complete",
        f"* tags: {summary.tags}, without rows in this run: {summary.tags_without_rows}",
        f"* bad-quality rows: {sum(summary.bad_quality_per_tag.values()):,}",
        f"* watermark: {summary.watermark_before} -> {summary.watermark_after}",
        "",
        "| tag | rows | bad quality |",
        "|---|---:|---:|",
    ]
    for tag, rows in summary.rows_per_tag.most_common(50):
        cell = tag.replace("|", "\\|")
        lines.append(f"| {cell} | {rows:,} | {summary.bad_quality_per_tag.get(tag, 0):,} |")
    key = "".join(ch if ch.isalnum() else "-" for ch in summary.flow.lower())[:60] + "-summary"
    create_markdown_artifact(
        markdown="\n".join(lines), key=key, description=f"{summary.flow} run summary"
    )


def _task_runner(workers: int) -> Any:
    if os.environ.get("HISTORIAN_TASK_RUNNER", "threads") == "dask":
        try:
            from prefect_dask import DaskTaskRunner  # type: ignore[attr-defined]
        except ImportError as exc:
            raise RuntimeError(
                "HISTORIAN_TASK_RUNNER=dask needs prefect-dask: pip install -e '.[dask]'"
            ) from exc
        address = os.environ.get("HISTORIAN_DASK_ADDRESS")
        if address:
            return DaskTaskRunner(address=address)
        return DaskTaskRunner(
            cluster_kwargs={
                "n_workers": workers,
                "threads_per_worker": 1,
                "processes": True,
                "dashboard_address": None,
            }
        )
    return ThreadPoolTaskRunner(max_workers=workers)


@flow(name="tag-history", flow_run_name="{flow_name}", validate_parameters=False, log_prints=False)
def tag_history_flow(
    flow_name: str,
    config_path: str,
    start: str | None = None,
    end: str | None = None,
    backfill: bool = False,
) -> dict[str, object]:
    """Extract one tag-history flow of flows.yaml."""
    return _run(flow_name, config_path, start, end, backfill).as_dict()


@flow(
    name="alarm-history", flow_run_name="{flow_name}", validate_parameters=False, log_prints=False
)
def alarm_history_flow(
    flow_name: str,
    config_path: str,
    start: str | None = None,
    end: str | None = None,
    backfill: bool = False,
) -> dict[str, object]:
    """Extract one alarm-history flow of flows.yaml."""
    return _run(flow_name, config_path, start, end, backfill).as_dict()


def prefect_flow_for(kind: str) -> Any:
    return alarm_history_flow if kind == "alarm_history" else tag_history_flow


def run_prefect(
    config_path: Path,
    flow_name: str,
    request: RunRequest,
    *,
    on_chunk: ProgressCallback | None = None,
) -> RunSummary:
    """Run one flow through Prefect now (what `historian run` does by default).

    Node and sink errors come out as `RunFailed` with the partial summary, the original
    error as its cause, exactly like the direct path.
    """
    from connectors.errors import NodeError
    from sinks.base import SinkError

    config = load_config(config_path)
    flow_config = config.flows[flow_name]
    workers = config.nodes[flow_config.node].max_connections
    chosen = prefect_flow_for(flow_config.kind).with_options(task_runner=_task_runner(workers))
    _Hooks.on_chunk = on_chunk
    _Hooks.summary = None
    try:
        chosen(
            flow_name=flow_name,
            config_path=str(config_path.resolve()),
            start=request.start.isoformat() if request.start else None,
            end=request.end.isoformat() if request.end else None,
            backfill=request.backfill,
        )
    except (NodeError, SinkError) as exc:
        summary = _Hooks.summary or RunSummary(flow_name, flow_name, "", flow_config.node)
        summary.error = " ".join(str(exc).split())
        raise RunFailed(summary.error, summary) from exc
    finally:
        _Hooks.on_chunk = None
    final = _Hooks.summary
    assert final is not None
    return final


def build_deployments(config_path: Path, names: list[str] | None = None) -> list[Any]:
    """One deployment per scheduled flow, with its cron or interval and parameters."""
    config = load_config(config_path)
    deployments = []
    for name, flow_config in config.flows.items():
        if flow_config.schedule is None or (names and name not in names):
            continue
        schedule = flow_config.schedule
        kwargs: dict[str, Any] = {
            "name": name,
            "parameters": {"flow_name": name, "config_path": str(config_path.resolve())},
            "tags": ["historian", flow_config.kind],
            "description": f"historian flow {name} ({flow_config.kind}, node {flow_config.node})",
        }
        if schedule.cron is not None:
            kwargs["cron"] = schedule.cron
        else:
            assert schedule.interval is not None
            kwargs["interval"] = schedule.interval
        if schedule.timezone and schedule.cron is not None:
            from prefect.schedules import Cron

            kwargs.pop("cron")
            kwargs["schedules"] = [Cron(schedule.cron, timezone=schedule.timezone)]
        deployments.append(prefect_flow_for(flow_config.kind).to_deployment(**kwargs))
    return deployments


def serve_flows(config_path: Path, *, names: list[str] | None = None) -> None:
    """Register every scheduled flow as a deployment and run them on schedule (blocks)."""
    from prefect import serve

    serve(*build_deployments(config_path, names))
