"""`historian serve` and `historian deploy`: the flows as Prefect deployments, served
by this process on their schedules, or registered on a work pool whose workers run them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_USAGE,
    ConfigOption,
    Interrupted,
    UserError,
    app,
    check_flow,
    interrupts,
    load,
    out,
    user_errors,
)

if TYPE_CHECKING:
    from pipelines.config.models import FlowConfig


@app.command()
def serve(
    config: ConfigOption = Path(DEFAULT_CONFIG),
    flow: Annotated[list[str] | None, typer.Option("--flow", help="Only these flows.")] = None,
) -> None:
    """Register every scheduled flow as a Prefect deployment and run them on schedule, and
    tail every flow with `live:` until stopped (docs/live-tail.md)."""
    with user_errors():
        cfg = load(config)
        for name in flow or []:
            check_flow(cfg, name, config)
        idle = [name for name in flow or [] if not _served(cfg.flows[name])]
        if idle:
            raise UserError(
                f"{config.name}: flows.{idle[0]}: has no schedule or live: to serve", EXIT_USAGE
            )
        scheduled = [n for n, f in cfg.flows.items() if _served(f) and (not flow or n in flow)]
        if not scheduled:
            raise UserError(f"{config.name}: no flow has a schedule or live:", EXIT_USAGE)
        from pipelines.orchestration.deployments import serve_flows
        from pipelines.orchestration.server import ServerStartError

        try:
            serve_flows(
                config,
                names=scheduled,
                announce=lambda line: out.print(line, highlight=False, soft_wrap=True),
            )
        except ServerStartError as exc:
            raise UserError(str(exc)) from None
        if interrupts.signum is not None:  # the runner took the signal and returned
            raise Interrupted(interrupts.signum)
        out.print("stopped", highlight=False)


def _served(flow: FlowConfig) -> bool:
    """A flow serve runs: on a schedule, or tailed (`live:`), or both."""
    return flow.schedule is not None or getattr(flow, "live", None) is not None


@app.command()
def deploy(
    pool: Annotated[str, typer.Option("--pool", help="Prefect work pool whose workers run them.")],
    config: ConfigOption = Path(DEFAULT_CONFIG),
    flow: Annotated[list[str] | None, typer.Option("--flow", help="Only these flows.")] = None,
) -> None:
    """Register the flows as deployments of a work pool on the Prefect server PREFECT_API_URL
    names (scheduled ones with their schedule, every one as <flow>-backfill for sharded
    backfills), and a concurrency limit per node; `prefect worker start --pool POOL` runs them."""
    with user_errors():
        cfg = load(config)
        for name in flow or []:
            check_flow(cfg, name, config)
        if not os.environ.get("PREFECT_API_URL"):
            from prefect.settings import get_current_settings

            if not get_current_settings().api.url:
                raise UserError(
                    "deploy needs a Prefect server that outlives it: set PREFECT_API_URL "
                    "(e.g. to a `prefect server start`)",
                    EXIT_USAGE,
                )
        from pipelines.orchestration.deployments import deploy_flows

        names = [n for n in cfg.flows if not flow or n in flow]
        deploy_flows(config, pool, names=names)
        scheduled = [n for n in names if cfg.flows[n].schedule]
        out.print(
            f"deployed {len(names)} flows ({', '.join(names)}; scheduled: "
            f"{', '.join(scheduled) or 'none'}) to work pool {pool}; "
            f"workers run them: prefect worker start --pool {pool}",
            highlight=False,
            soft_wrap=True,
        )
