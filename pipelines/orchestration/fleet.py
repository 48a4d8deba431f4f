"""A fleet on a Prefect work pool: sharded backfills, per-node limits, crashed-run detection.

* `historian backfill FLOW --shards N --pool P` (`submit_backfill`, `wait_for_shards`):
  one flow run of the flow's `<flow>-backfill` deployment per shard (pipelines/shards.py),
  created with Prefect's `run_deployment` and picked up by whichever worker of the pool
  is free; the command waits for all of them and reports each. Before submitting, it
  waits out the object-storage leases of shards whose last run crashed (`crashed_shards`,
  pipelines/orchestration/stale_leases.py).
* `historian deploy --pool P` (`ensure_node_limits`, `ensure_crash_detection`): a global
  concurrency limit `historian-node-<node>` per node with the node's `max_connections`
  slots, which every fetch task of every worker holds while it asks the node; and
  Prefect's documented automation that marks a flow run whose heartbeats stopped (its
  worker's machine died) Crashed, so a backfill waiting for it learns so and a re-run
  finishes that shard.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from pipelines.config.models import Config, ConfigError
from pipelines.orchestration.names import (
    SHARD_ARTIFACT_PREFIX,
    backfill_deployment,
    node_limit_name,
)
from pipelines.shards import Shard, ShardBy

CRASH_AUTOMATION = "historian: crash flow runs whose heartbeats stopped"
# Prefect's floor for flow-run heartbeats; the automation waits three of them.
HEARTBEAT_S = 30
SILENT_FOR = timedelta(seconds=3 * HEARTBEAT_S)
BACKFILL_TAG = "historian-backfill:"
BACKFILL_ID_TAG = "historian-backfill-id:"
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def flow_nodes(config: Config, flow: str, only: Sequence[str] | None = None) -> list[str]:
    """The nodes a flow reads (`only`: those of them, `--node`)."""
    return config.select_nodes(flow, only)


# -- deploy: limits and crash detection ------------------------------------------------------


def ensure_node_limits(config: Config, flows: Sequence[str] | None = None) -> dict[str, int]:
    """Create or update `historian-node-<node>` (slots = the node's `max_connections`) for
    every node the flows read; the limits as set."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
    )
    from prefect.exceptions import ObjectNotFound

    wanted: dict[str, int] = {}
    for name in flows or list(config.flows):
        for node in flow_nodes(config, name):
            wanted[node_limit_name(node)] = config.nodes[node].max_connections
    with get_client(sync_client=True) as client:
        for name, slots in wanted.items():
            try:
                current = client.read_global_concurrency_limit_by_name(name)
            except ObjectNotFound:
                client.create_global_concurrency_limit(
                    GlobalConcurrencyLimitCreate(name=name, limit=slots)
                )
                continue
            if current.limit != slots or not current.active:
                client.update_global_concurrency_limit(
                    name, GlobalConcurrencyLimitUpdate(limit=slots, active=True)
                )
    return wanted


def ensure_crash_detection() -> None:
    """Prefect's zombie-run automation (docs: "detect zombie flows"), once per server."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    try:
        cast(Any, Automation).read(name=CRASH_AUTOMATION)
        return
    except ValueError:
        pass
    automation: Any = Automation(
        name=CRASH_AUTOMATION,
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=SILENT_FOR,
        ),
        actions=[
            ChangeFlowRunState(
                name=None,
                force=False,
                state=StateType.CRASHED,
                message=f"no heartbeat for {SILENT_FOR.seconds} s: its worker is gone",
            )
        ],
    )
    automation.create()


def heartbeat_env() -> dict[str, str]:
    """What a backfill deployment's runs need to send heartbeats (`job_variables.env`)."""
    return {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}


# -- sharded backfills ---------------------------------------------------------------------


@dataclass(frozen=True)
class ShardRun:
    """One flow run of a sharded backfill: a flow, optionally one node, optionally a shard."""

    flow: str
    nodes: list[str] | None  # None: every node of the flow
    shard: Shard | None

    @property
    def label(self) -> str:
        """`raw 2-of-4`, `raw@plant_a`, `raw@plant_a 1-of-2`."""
        unit = self.flow if not self.nodes else f"{self.flow}@{','.join(self.nodes)}"
        return unit if self.shard is None else f"{unit} {self.shard.label}"

    @classmethod
    def from_parameters(cls, parameters: dict[str, Any]) -> ShardRun:
        """The shard run a flow run's parameters (`parameters`) describe."""
        nodes = parameters.get("nodes")
        return cls(
            str(parameters["flow_name"]),
            list(nodes) if nodes is not None else None,
            Shard.from_parameter(parameters.get("shard")),
        )

    def lock_keys(self, config: Config) -> list[str]:
        """What the run locks in every sink: each of its units' key, `#i-of-n` for a shard."""
        units = config.flow_units(self.flow, self.nodes)
        return [key if self.shard is None else self.shard.lock_key(key) for _, key in units]

    def parameters(self, start: datetime, end: datetime) -> dict[str, Any]:
        parameters: dict[str, Any] = {
            "flow_name": self.flow,
            "start": start.isoformat(),
            "end": end.isoformat(),
            "backfill": True,
            "shard": self.shard.as_parameter() if self.shard else None,
        }
        if self.nodes is not None:
            parameters["nodes"] = list(self.nodes)
        return parameters


def plan_shards(
    config: Config,
    flow: str,
    *,
    shards: int,
    per_node: bool,
    by: ShardBy = "tags",
    only: Sequence[str] | None = None,
) -> list[ShardRun]:
    """The flow runs of a backfill: per node (`per_node`: each run one node), each cut in
    `shards` parts; otherwise each run covers every node (`only`: those), one unit each."""
    if shards < 1:
        raise ConfigError(f"--shards {shards}: give 1 or more")
    chosen = flow_nodes(config, flow, only)
    runs = []
    targets: list[list[str] | None] = [[node] for node in chosen] if per_node else [None]
    if not per_node and only:
        targets = [list(chosen)]
    for target in targets:
        for index in range(shards):
            shard = Shard(index, shards, by) if shards > 1 else None
            runs.append(ShardRun(flow, target, shard))
    return runs


@dataclass
class Submitted:
    run: ShardRun
    flow_run_id: uuid.UUID
    submitted_at: float = field(default_factory=time.monotonic)


@dataclass
class ShardResult:
    """How one shard's flow run ended, as the Prefect API tells it."""

    run: ShardRun
    flow_run_id: uuid.UUID
    state: str
    message: str = ""
    seconds: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)
    worker: str | None = None

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"

    def line(self) -> str:
        """One line: the shard, its end, chunks, rows, time and the worker that ran it."""
        s = self.summary
        parts = [f"{self.run.label}: {self.state.lower()}"]
        if s:
            done = int(s.get("chunks_done", 0)) + int(s.get("chunks_skipped", 0))
            parts.append(f"{done}/{s.get('chunks_planned', 0)} chunks")
            parts.append(f"{int(s.get('rows', 0)):,} rows")
        parts.append(f"{self.seconds:.1f} s")
        if self.worker:
            parts.append(f"worker {self.worker}")
        line = ", ".join(parts)
        if not self.ok and self.message:
            line += f": {self.message}"
        return line


def backfill_id(flow: str, now: datetime | None = None) -> str:
    return f"{flow}-{(now or datetime.now(UTC)):%Y%m%dT%H%M%S%fZ}"


def require_work_pool(client: Any, pool: str) -> None:
    """ConfigError, one line saying how to create it, when the server has no such pool."""
    from prefect.exceptions import ObjectNotFound

    try:
        client.read_work_pool(pool)
    except ObjectNotFound:
        raise ConfigError(
            f"no work pool named {pool!r} on the Prefect server "
            f"(prefect work-pool create {pool} --type process)"
        ) from None


def submit_backfill(
    config: Config,
    flow: str,
    runs: Sequence[ShardRun],
    *,
    pool: str,
    start: datetime,
    end: datetime,
) -> list[Submitted]:
    """One flow run per shard of `<flow>-backfill` on the pool, returning at once."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    name = backfill_deployment(flow, config.flows[flow].kind)
    with get_client(sync_client=True) as client:
        require_work_pool(client, pool)
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise ConfigError(
                f"no deployment {name!r} on the Prefect server: historian deploy --pool {pool}"
            ) from None
    if deployment.work_pool_name != pool:
        raise ConfigError(
            f"deployment {name!r} is on work pool {deployment.work_pool_name!r}, not {pool!r}: "
            f"historian deploy --pool {pool}"
        )
    tags = ["historian", f"{BACKFILL_TAG}{flow}", f"{BACKFILL_ID_TAG}{backfill_id(flow)}"]
    submitted = []
    for run in runs:
        flow_run: Any = run_deployment(
            name,
            parameters=run.parameters(start, end),
            timeout=0,
            as_subflow=False,
            tags=tags,
        )
        submitted.append(Submitted(run, flow_run.id))
    return submitted


def wait_for_shards(
    submitted: Sequence[Submitted],
    *,
    poll_s: float = 2.0,
    on_result: Callable[[ShardResult], None] | None = None,
) -> list[ShardResult]:
    """Wait until every shard's flow run ended; their results in submission order.

    A run whose worker died stays Running until the crash-detection automation
    (`ensure_crash_detection`) marks it Crashed, a few heartbeats later.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    by_id = {s.flow_run_id: s for s in submitted}
    results: dict[uuid.UUID, ShardResult] = {}
    with get_client(sync_client=True) as client:
        while len(results) < len(by_id):
            waiting = [i for i in by_id if i not in results]
            flow_runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=waiting))
            )
            for flow_run in flow_runs:
                state = flow_run.state
                if state is None or state.type.value not in FINAL:
                    continue
                result = ShardResult(
                    by_id[flow_run.id].run,
                    flow_run.id,
                    state.type.value,
                    message=(state.message or "").splitlines()[0] if state.message else "",
                    seconds=float(flow_run.total_run_time.total_seconds()),
                    summary=_shard_summary(client, flow_run.id),
                )
                results[flow_run.id] = result
                if on_result is not None:
                    on_result(result)
            if len(results) < len(by_id):
                time.sleep(poll_s)
        workers = workers_of(client, list(by_id))
    ordered = [results[s.flow_run_id] for s in submitted]
    for result in ordered:
        result.worker = workers.get(result.flow_run_id)
    return ordered


def _shard_summary(client: Any, flow_run_id: uuid.UUID) -> dict[str, Any]:
    """The counts the shard's run left in its table artifact (`shard_artifact`)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    artifacts = client.read_artifacts(
        artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
    )
    for artifact in artifacts:
        if (artifact.key or "").startswith(SHARD_ARTIFACT_PREFIX) and artifact.data:
            data = artifact.data
            if isinstance(data, str):
                import orjson

                data = orjson.loads(data)
            if isinstance(data, list) and data and isinstance(data[0], dict):
                return dict(data[0])
    return {}


# The events API refuses larger pages (422 "less than or equal to 50"); the rest are paged.
EVENTS_PAGE = 50


def workers_of(client: Any, flow_run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
    """Which worker submitted each flow run (the workers' `submitted-flow-run` events)."""
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    wanted = {f"prefect.flow-run.{i}": i for i in flow_run_ids}
    page = client.read_events(
        filter=EventFilter(
            event=EventNameFilter(name=["prefect.worker.submitted-flow-run"]),
            related=EventRelatedFilter(id=list(wanted)),
        ),
        limit=EVENTS_PAGE,
    )
    found: dict[uuid.UUID, str] = {}
    while True:
        for event in page.events:
            worker = event.resource.get("prefect.resource.name") or event.resource.id
            for related in event.related:
                if related.id in wanted:
                    found.setdefault(wanted[related.id], str(worker))
        if not page.next_page or len(found) == len(wanted):
            return found
        page = client.read_events_page(page.next_page)


def crashed_shards(flow: str, *, page: int = 200, pages: int = 10) -> list[ShardRun]:
    """The shards of the flow's sharded backfills whose last run that ended, completed or
    crashed, crashed (a failed run, e.g. one that found the shard still locked, changes
    nothing): their workers died and their leases on object storage may not have lapsed
    yet (pipelines/orchestration/stale_leases.py). The newest `page * pages` runs are read."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    decided: set[str] = set()
    crashed: list[ShardRun] = []
    with get_client(sync_client=True) as client:
        for number in range(pages):
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    tags=FlowRunFilterTags(all_=[f"{BACKFILL_TAG}{flow}"])
                ),
                sort=FlowRunSort.EXPECTED_START_TIME_DESC,
                limit=page,
                offset=number * page,
            )
            for run in runs:
                state = run.state.type.value if run.state is not None else None
                if "flow_name" not in run.parameters:
                    continue  # not a run `submit_backfill` made
                shard = ShardRun.from_parameters(run.parameters)
                if shard.label in decided or state not in ("COMPLETED", "CRASHED"):
                    continue
                decided.add(shard.label)
                if state == "CRASHED":
                    crashed.append(shard)
            if len(runs) < page:
                break
    return crashed


def last_backfill(flow: str) -> list[dict[str, Any]]:
    """The flow runs of the flow's last sharded backfill (newest backfill id), as
    `historian state` lists them: label, state, start."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"{BACKFILL_TAG}{flow}"])),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=200,
        )
        if not runs:
            return []
        ids = [t for t in runs[0].tags if t.startswith(BACKFILL_ID_TAG)]
        latest = [r for r in runs if ids and ids[0] in r.tags]
        rows = []
        for flow_run in sorted(latest, key=lambda r: r.name):
            summary = _shard_summary(client, flow_run.id)
            rows.append(
                {
                    "run": flow_run.name,
                    "state": flow_run.state.type.value if flow_run.state else "?",
                    "chunks_done": summary.get("chunks_done"),
                    "chunks_skipped": summary.get("chunks_skipped"),
                    "chunks_planned": summary.get("chunks_planned"),
                    "rows": summary.get("rows"),
                }
            )
    return rows
