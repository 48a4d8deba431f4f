"""Deployments of the flows: `historian serve` (a runner firing the schedules) and
`historian deploy --pool` (work-pool deployments, with the backfill deployments that
sharded backfills submit their shards to).

The flows themselves are `pipelines/orchestration/flows.py`; a deployment names them by file (serve)
or by module path (`pipelines.orchestration.flows.tag_history_flow`, work pools), so that a worker
with this package installed loads the same flow.
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from pipelines.config.models import ConfigError, load_config
from pipelines.orchestration.children import end_flow_runs
from pipelines.orchestration.fleet import (
    ensure_crash_detection,
    ensure_node_limits,
    heartbeat_env,
    require_work_pool,
)
from pipelines.orchestration.flows import prefect_flow_for
from pipelines.orchestration.names import BACKFILL_SUFFIX
from pipelines.orchestration.schedules import check_schedules, prefect_schedule
from pipelines.orchestration.server import api_for_schedules


def build_deployments(
    config_path: Path,
    names: list[str] | None = None,
    *,
    by_module: bool = False,
    backfills: bool = False,
) -> list[Any]:
    """One deployment per flow with a schedule: its cron or interval, timezone, parameters.

    `by_module` names the flow by import path (`pipelines.orchestration.flows.tag_history_flow`)
    instead of by file, so a worker of a process work pool with this package installed can
    load it. `backfills`: also `<flow>-backfill` for every flow (scheduled or not), without
    a schedule or a run limit: the deployment a sharded backfill submits its shards to.
    """
    from prefect.types.entrypoint import EntrypointType

    config = load_config(config_path)
    check_schedules(config, names, source=config_path.name)  # one line naming the key
    entrypoint = EntrypointType.MODULE_PATH if by_module else EntrypointType.FILE_PATH
    deployments = []
    for name, flow_config in config.flows.items():
        if names and name not in names:
            continue
        # One deployment per flow: each of its runs covers every node (one unit each).
        common: dict[str, Any] = {
            "parameters": {"flow_name": name, "config_path": str(config_path.resolve())},
            "entrypoint_type": entrypoint,
        }
        fleet = config.flow_nodes(name)
        tags = ["historian", flow_config.kind, *(f"node:{node}" for node in fleet)]
        flow = prefect_flow_for(flow_config.kind)
        if backfills:
            deployments.append(
                flow.to_deployment(
                    name=f"{name}{BACKFILL_SUFFIX}",
                    tags=[*tags, "backfill"],
                    # heartbeats: a run whose worker dies is marked Crashed (fleet.py)
                    job_variables={"env": heartbeat_env()},
                    description=f"historian backfill of flow {name} (sharded: historian "
                    f"backfill {name} --shards N --pool POOL)",
                    **common,
                )
            )
        if getattr(flow_config, "live", None) is not None:
            deployments.append(_tail_deployment(name, tags, common))
        if flow_config.schedule is not None:
            deployments.append(
                flow.to_deployment(
                    name=name,
                    schedules=[prefect_schedule(flow_config.schedule)],
                    tags=tags,
                    concurrency_limit=_one_run_at_a_time(),
                    description=f"historian flow {name} ({flow_config.kind}, "
                    f"node{'s' if len(fleet) > 1 else ''} {', '.join(fleet)})",
                    **common,
                )
            )
    return deployments


def _tail_deployment(name: str, tags: list[str], common: dict[str, Any]) -> Any:
    """`<flow>-tail`: the flow's live tail, a run that lasts until it is cancelled
    (`pipelines/orchestration/live.py`); no schedule: serve starts one run of it."""
    from pipelines.orchestration.live import TAIL_SUFFIX, tail_flow_run

    parameters = {key: common["parameters"][key] for key in ("flow_name", "config_path")}
    return tail_flow_run.to_deployment(
        name=f"{name}{TAIL_SUFFIX}",
        tags=[*tags, "tail"],
        description=f"historian live tail of flow {name} (runs until cancelled)",
        parameters=parameters,
        entrypoint_type=common["entrypoint_type"],
    )


def is_tail(deployment: Any) -> bool:
    """A tail's deployment (`_tail_deployment`), which serve starts a run of itself."""
    from pipelines.orchestration.live import TAIL_FLOW

    return bool(deployment.flow_name == TAIL_FLOW)


def _one_run_at_a_time() -> Any:
    """A run due while the last one still runs is cancelled (it would stop at the flow's
    lock anyway); the next one catches up from the watermark."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    return ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW)


def deploy_flows(
    config_path: Path, work_pool: str, *, names: list[str] | None = None
) -> list[uuid.UUID]:
    """Register the flows as deployments of a work pool (docs/scaling.md): the scheduled
    ones with their schedules, and every flow's `<flow>-backfill` for sharded backfills;
    then the per-node concurrency limits and the crashed-run detection
    (`pipelines/orchestration/fleet.py`).

    Unlike `serve_flows`, nothing keeps running here: workers of the pool
    (`prefect worker start --pool <name>`) pick the runs up wherever this package and
    flows.yaml are installed at the same path.
    """
    from prefect import deploy
    from prefect.client.orchestration import get_client

    deployments = build_deployments(config_path, names, by_module=True, backfills=True)
    if not deployments:
        raise ConfigError(f"{config_path.name}: no flow to deploy")
    with get_client(sync_client=True) as client:
        require_work_pool(client, work_pool)
    ids = deploy(
        *deployments,
        work_pool_name=work_pool,
        build=False,
        push=False,
        print_next_steps_message=False,
    )
    config = load_config(config_path)
    ensure_node_limits(config, names)
    ensure_crash_detection()
    return cast(list[uuid.UUID], ids)


def serve_flows(
    config_path: Path,
    *,
    names: list[str] | None = None,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Register every scheduled flow as a deployment and run them on schedule, and every
    flow with `live:` as a tail deployment with one run that lasts until serve stops
    (blocks).

    The schedules fire on the configured Prefect API, or on a local Prefect server started
    for the command and stopped with it (`pipelines/orchestration/server.py`): Prefect's ephemeral
    server runs no scheduler. `announce` gets one line saying where the UI and API are.
    Ctrl-C and SIGTERM come out as the caller's signal handlers make them (the runner
    stops, Prefect pauses the schedules, then the server stops): Prefect's `serve` would
    swallow them and its runner take SIGTERM over, so the runner is started here.
    """
    import asyncio

    from prefect.runner import Runner

    deployments = build_deployments(config_path, names)
    if not deployments:
        raise ConfigError(f"{config_path.name}: no flow has a schedule or live:")
    tail_runs: list[str] = []
    ours_on_sigterm = _tails_first(signal.SIGTERM, tail_runs)

    class _Runner(Runner):
        def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
            if callable(ours_on_sigterm):
                ours_on_sigterm(signal.SIGTERM, None)
            else:
                super().handle_sigterm(*args, **kwargs)

    with api_for_schedules() as (api_url, ours):
        if announce is not None:
            announce(serving_line(api_url, ours, deployments))
        runner = _Runner(pause_on_shutdown=True, query_seconds=_poll_s())
        tails = [cast(uuid.UUID, runner.add_deployment(d)) for d in deployments if is_tail(d)]
        for deployment in deployments:
            if not is_tail(deployment):
                runner.add_deployment(deployment)
        tail_runs.extend(_start_tails(tails))
        with _on_sigint(_tails_first(signal.SIGINT, tail_runs)):
            asyncio.run(_run_quietly(runner.start()))


# How long serve waits, at a signal, for its tails to commit and cancel their
# subscriptions before the runner unwinds (and kills what is left).
TAIL_STOP_S = 1.5


def _tails_first(signum: int, tail_runs: list[str]) -> Any:
    """The signal's handler as it was, preceded by stopping the tails' runs: Prefect's
    runner, unwinding, kills its subprocesses outright, which would leave each tail's
    subscription filling on the node."""
    before = signal.getsignal(signum)
    if not callable(before):
        return before

    def handler(number: int, frame: Any) -> None:
        if tail_runs:
            end_flow_runs(tail_runs, TAIL_STOP_S)
            tail_runs.clear()  # once: a second signal goes straight through
        before(number, frame)

    return handler


@contextmanager
def _on_sigint(handler: Any) -> Iterator[None]:
    if not callable(handler) or threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _poll_s() -> float:
    """How often serve's runner asks the API for runs due: a tail starts, and a schedule
    fires, within this of its time; at most 2 s (Prefect's default, 10 s, delayed a
    tail's first commit), less when Prefect's settings ask for less."""
    from prefect.settings import get_current_settings

    return min(float(get_current_settings().runner.poll_frequency), 2.0)


def _start_tails(deployment_ids: list[uuid.UUID]) -> list[str]:
    """One run of each tail deployment, due now: the runner starts it with the schedules.
    A run it stops (serve ending) is cancelled; the next serve starts a new one, whose
    tail finds the stale subscription by its `data` and history re-reads the gap."""
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    with get_client(sync_client=True) as client:
        return [
            str(client.create_flow_run_from_deployment(deployment_id, state=Scheduled()).id)
            for deployment_id in deployment_ids
        ]


async def _run_quietly(runner: Coroutine[Any, Any, None]) -> None:
    """The runner, on a loop that does not print the cancellations of its stop (a signal
    cancels every task; one of its control channel's callbacks reported that as a
    traceback on the user's terminal): anything else is reported as asyncio does."""
    import asyncio

    def report(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not isinstance(context.get("exception"), asyncio.CancelledError):
            loop.default_exception_handler(context)

    asyncio.get_running_loop().set_exception_handler(report)
    await runner


def serving_line(api_url: str, ours: bool, deployments: list[Any]) -> str:
    """`historian serve`'s one line: what it serves and where the Prefect UI and API are."""
    scheduled = [d.name for d in deployments if not is_tail(d)]
    tails = [d.name.removesuffix("-tail") for d in deployments if is_tail(d)]
    parts = [f"{len(scheduled)} scheduled flows ({', '.join(scheduled)})"] if scheduled else []
    if tails:
        parts.append(f"{len(tails)} live tails ({', '.join(tails)})")
    what = f"serving {' and '.join(parts)}"
    if not ours:
        return f"{what} on the Prefect API at {api_url}; Ctrl-C stops"
    ui = api_url.removesuffix("/api")
    return (
        f"{what} on a local Prefect server: UI {ui}, API {api_url} "
        f"(PREFECT_API_URL={api_url} prefect flow-run ls); Ctrl-C stops both"
    )
