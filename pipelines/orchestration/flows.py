"""Prefect flows: one per kind, around the one execution core (`units.run_flow`).

A flow run reads top to bottom (`extract`): flows.yaml, then the core's run with Prefect
tasks as its submitter (`tasks.PrefectTasks`: the plan, then the fetches; the core joins,
writes and counts, as on the direct path), then what the run publishes (the coverage
report when asked, the summary artifact, a shard's counts). `historian serve` and
`historian deploy` make deployments of these flows (schedules, work pools):
`pipelines/orchestration/deployments.py`; `run_prefect` runs one now, in this process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from pipelines.orchestration.env import cli_run, configure_prefect

configure_prefect()

from prefect import Flow, flow, get_run_logger, tags  # noqa: E402

from connectors.errors import NodeError, one_line  # noqa: E402
from connectors.schema import KIND_ALARM_HISTORY, KIND_TAG_HISTORY  # noqa: E402
from pipelines.config.destinations import SinkSet  # noqa: E402
from pipelines.config.models import (  # noqa: E402
    Config,
    ConfigError,
    FlowConfig,
    load_config,
    parse_moment,
)
from pipelines.config.names import did_you_mean  # noqa: E402
from pipelines.config.nodes import NodePool  # noqa: E402
from pipelines.core.kinds import kind_of  # noqa: E402
from pipelines.core.runner import (  # noqa: E402
    Plan,
    PlanCallback,
    ProgressCallback,
    RunFailed,
    RunRequest,
    RunSummary,
)
from pipelines.core.units import run_flow, selected_nodes  # noqa: E402
from pipelines.orchestration.artifacts import shard_artifact, summary_artifact  # noqa: E402
from pipelines.orchestration.names import FLOW_NAMES  # noqa: E402
from pipelines.orchestration.tasks import PREFECT_TASKS, task_runner  # noqa: E402
from pipelines.shards import Shard  # noqa: E402
from sinks.base import SinkError  # noqa: E402

log = logging.getLogger("historian.flows")


@dataclass(frozen=True)
class FlowParameters:
    """A flow run's parameters, as Prefect gives them (JSON: text, not datetimes)."""

    flow_name: str
    config_path: str
    start: str | None = None
    end: str | None = None
    backfill: bool = False
    report_dir: str | None = None
    nodes: list[str] | None = None
    shard: dict[str, Any] | None = None

    def request(self) -> RunRequest:
        return RunRequest(
            start=parse_moment(self.start) if self.start else None,
            end=parse_moment(self.end) if self.end else None,
            backfill=self.backfill,
            nodes=tuple(self.nodes) if self.nodes is not None else None,
            shard=Shard.from_parameter(self.shard),
        )


@dataclass
class _InProcess:
    """What `run_prefect` gives a flow run in its own process beside the JSON parameters
    (flows.yaml as it read it, its progress callbacks) and takes back (the summary).
    Prefect's parameters cannot carry these; a deployment's run has none of them."""

    config_path: str
    config: Config
    on_chunk: ProgressCallback | None = None
    on_plan: PlanCallback | None = None
    summary: RunSummary | None = None


_IN_PROCESS: ContextVar[_InProcess | None] = ContextVar("historian_in_process", default=None)


def flow_config(config: Config, flow_name: str, path: Path, kind: str | None = None) -> FlowConfig:
    """The flow `flow_name` of flows.yaml (of `kind` when given), or one ConfigError line."""
    found = config.flows.get(flow_name)
    if found is None:
        raise ConfigError(
            f"{path.name}: no flow named {flow_name!r} (flows: {', '.join(config.flows)})"
            + did_you_mean(flow_name, config.flows)
        )
    if kind is not None and found.kind != kind:
        raise ConfigError(f"{path.name}: flows.{flow_name}: is a {found.kind} flow, not {kind}")
    return found


def extract(parameters: FlowParameters, kind: str) -> RunSummary:
    """The body of both flows: plan, fetch and write (the core's run, Prefect tasks
    submitting its plan and fetches), then publish."""
    caller = _IN_PROCESS.get()
    path = Path(parameters.config_path)
    known = caller is not None and caller.config_path == parameters.config_path
    config = caller.config if caller is not None and known else load_config(path)
    flow_config(config, parameters.flow_name, path, kind)
    plans: list[Plan] = []

    def on_plan(plan: Plan) -> None:
        plans.append(plan)
        done = plan.chunks_planned - len(plan.pending)
        _say(f"{plan.key}: {len(plan.pending)} chunks to fetch, {done} already complete")
        if caller is not None and caller.on_plan is not None:
            caller.on_plan(plan)

    with NodePool(config) as pool, SinkSet(config, path.parent, writing=True) as sinks:
        summary = run_flow(
            config,
            parameters.flow_name,
            nodes=pool,
            sinks=sinks,
            request=parameters.request(),
            on_plan=on_plan,
            on_chunk=caller.on_chunk if caller is not None else None,
            submit=PREFECT_TASKS,
        )
        if caller is not None:
            caller.summary = summary
        report = _write_report(config, parameters, sinks)
    _publish(summary, plans[0] if plans else None, report)
    return summary


def _write_report(config: Config, parameters: FlowParameters, sinks: SinkSet) -> Path | None:
    """The flow's coverage report, when the run was asked for one (`report_dir`)."""
    if not parameters.report_dir:
        return None
    # Imported here: the report's modules take a tenth of a second to import, which a run
    # without a report skips (not a circle: nothing there imports orchestration).
    from pipelines.report.page import write_report

    name = parameters.flow_name
    return write_report(
        config, name, Path(parameters.report_dir) / f"{name}-coverage.html", sinks=sinks
    )


def _publish(summary: RunSummary, plan: Plan | None, report: Path | None) -> None:
    """The run's artifacts (a shard's counts too) and its last line."""
    summary_artifact(summary, plan, report)
    if summary.shard is not None:
        shard_artifact(summary)
    _say(f"{summary.flow}: {summary.rows:,} rows in {summary.seconds:.1f} s")


def _say(message: str) -> None:
    """A line for the run's log in the API and for the `historian` logger (-v)."""
    log.info("%s", message)
    get_run_logger().info("%s", message)


def _flow_run_name() -> str:
    """`raw_history 2026-11-22T10:00Z`: the flow and when this run started (UTC)."""
    from prefect.runtime import flow_run

    name = flow_run.parameters.get("flow_name", "flow")
    shard = Shard.from_parameter(flow_run.parameters.get("shard"))
    if shard is not None:
        name = f"{name} {shard.label}"
    return f"{name} {datetime.now(UTC):%Y-%m-%dT%H:%MZ}"


# -- the flows: one per kind, named by the deployments that run them -------------------------


@flow(name=FLOW_NAMES[KIND_TAG_HISTORY], flow_run_name=_flow_run_name, log_prints=False)
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
    parameters = FlowParameters(
        flow_name, config_path, start, end, backfill, report_dir, nodes, shard
    )
    return extract(parameters, KIND_TAG_HISTORY).as_dict()


@flow(name=FLOW_NAMES[KIND_ALARM_HISTORY], flow_run_name=_flow_run_name, log_prints=False)
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
    """Extract one alarm_history flow of flows.yaml, as `tag_history_flow`."""
    parameters = FlowParameters(
        flow_name, config_path, start, end, backfill, report_dir, nodes, shard
    )
    return extract(parameters, KIND_ALARM_HISTORY).as_dict()


def prefect_flow_for(kind: str) -> Flow[..., dict[str, object]]:
    """The Prefect flow that runs flows.yaml flows of this kind."""
    chosen = {KIND_TAG_HISTORY: tag_history_flow, KIND_ALARM_HISTORY: alarm_history_flow}[
        kind_of(kind).name
    ]
    return cast(Flow[..., dict[str, object]], chosen)


# -- one flow run now, in this process -------------------------------------------------------


@contextmanager
def _in_process(caller: _InProcess) -> Iterator[None]:
    token = _IN_PROCESS.set(caller)
    try:
        yield
    finally:
        _IN_PROCESS.reset(token)


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
    config = config or load_config(config_path)
    kind = flow_config(config, flow_name, config_path).kind
    chosen_nodes = selected_nodes(config, flow_name, request)
    # Every node's fetches at once (each bounded by its max_connections), and its plan.
    workers = sum(config.nodes[node].max_connections + 1 for node in chosen_nodes)
    chosen = prefect_flow_for(kind).with_options(task_runner=task_runner(workers))
    resolved = str(config_path.resolve())
    caller = _InProcess(resolved, config, on_chunk, on_plan)
    parameters = FlowParameters(
        flow_name,
        resolved,
        request.start.isoformat() if request.start else None,
        request.end.isoformat() if request.end else None,
        request.backfill,
        str(report_dir.resolve()) if report_dir else None,
        list(request.nodes) if request.nodes is not None else None,
        request.shard.as_parameter() if request.shard else None,
    )
    try:
        with (
            _in_process(caller),
            cli_run(record_task_runs=record_task_runs),
            tags(*(f"node:{node}" for node in chosen_nodes)),
        ):
            chosen(**vars(parameters))
    except RunFailed:
        raise
    except (NodeError, SinkError) as exc:  # outside the core's run: a sink, the report
        summary = caller.summary or RunSummary(flow_name, flow_name, kind, ", ".join(chosen_nodes))
        summary.error = one_line(exc)
        raise RunFailed(summary.error, summary) from exc
    assert caller.summary is not None, "the flow ran without reporting a summary"
    return caller.summary
