"""`historian backfill FLOW --shards N --pool P` (and `--per-node`): a backfill as
independent flow runs on a Prefect work pool, waited for and reported one line each
(pipelines/orchestration/fleet.py does the Prefect part)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.cli.base import EXIT_FAILED, EXIT_USAGE, UserError, check_flow, load, out
from pipelines.config.destinations import SinkSet
from pipelines.config.models import Config
from sinks.base import SinkError

if TYPE_CHECKING:
    from pipelines.orchestration.fleet import ShardResult, ShardRun

# Lease expiries are the holders' wall clocks: allow for machines a little apart.
LEASE_SKEW_S = 10.0


def sharded_backfill(
    config_path: Path,
    flow: str,
    *,
    start: datetime,
    end: datetime | None,
    shards: int,
    per_node: bool,
    pool: str | None,
    by: str,
    nodes: list[str] | None = None,
) -> None:
    """Submit the shards, wait for every one, print a line each and a total; a failed
    shard (named) makes the command fail: re-running it runs only what is left."""
    work_pool = _checked_pool(pool, by)
    config = load(config_path)
    check_flow(config, flow, config_path)
    from pipelines.orchestration.fleet import plan_shards, submit_backfill, wait_for_shards

    settled = datetime.now(UTC) - config.flows[flow].settle
    end = min(end, settled) if end is not None else settled  # one end for every shard
    if end <= start:
        raise UserError(
            f"--start {start.isoformat()} is not before the end {end.isoformat()}", EXIT_USAGE
        )
    runs = plan_shards(config, flow, shards=shards, per_node=per_node, by=by, only=nodes)  # type: ignore[arg-type]
    wait_out_crashed_leases(config, config_path, flow, runs)
    submitted = submit_backfill(config, flow, runs, pool=work_pool, start=start, end=end)
    out.print(
        f"submitted {len(submitted)} flow runs of {flow} to work pool {work_pool}; waiting",
        highlight=False,
        soft_wrap=True,
    )
    print_shard_results(wait_for_shards(submitted))


def _checked_pool(pool: str | None, by: str) -> str:
    """The work pool, once the options and a Prefect server to submit to are there."""
    if pool is None:
        raise UserError(
            "--shards and --per-node need --pool NAME (a Prefect work pool)", EXIT_USAGE
        )
    if by not in ("tags", "time"):
        raise UserError(f"--by {by!r}: use tags or time", EXIT_USAGE)
    if not os.environ.get("PREFECT_API_URL"):
        from prefect.settings import get_current_settings

        if not get_current_settings().api.url:
            raise UserError(
                "a sharded backfill runs on a work pool's Prefect server: set PREFECT_API_URL",
                EXIT_USAGE,
            )
    return pool


def print_shard_results(results: Sequence[ShardResult]) -> None:
    """A line per shard run and a total; fails (naming them) when some did not complete."""
    for result in results:
        out.print(result.line(), highlight=False, soft_wrap=True)
    failed = [r for r in results if not r.ok]
    rows = sum(int(r.summary.get("rows", 0) or 0) for r in results)
    chunks = sum(int(r.summary.get("chunks_done", 0) or 0) for r in results)
    out.print(
        f"total: {len(results) - len(failed)}/{len(results)} shards completed, "
        f"{chunks:,} chunks, {rows:,} rows",
        highlight=False,
        soft_wrap=True,
    )
    if failed:
        names = ", ".join(f"{r.run.label} ({r.state.lower()})" for r in failed)
        raise UserError(
            f"{len(failed)} shards did not complete: {names}; run the same backfill again "
            "to finish them (committed chunks are skipped)",
            EXIT_FAILED,
        )


def wait_out_crashed_leases(
    config: Config, config_path: Path, flow: str, runs: Sequence[ShardRun]
) -> None:
    """Before submitting: for the shards about to run whose last run Prefect reports
    Crashed, wait (bounded, one line says why) until their leases on object storage lapse
    (pipelines/orchestration/stale_leases.py), so the re-run does not find them still "running"."""
    from pipelines.orchestration.fleet import crashed_shards
    from pipelines.orchestration.stale_leases import lease_probes, uses_leases, wait_for_leases
    from sinks.store.locks import LEASE_TTL_S

    if not any(uses_leases(config.sinks[name]) for name in config.flows[flow].sinks):
        return
    wanted = {key for run in runs for key in run.lock_keys(config)}
    keys = sorted(
        {key for run in crashed_shards(flow) for key in run.lock_keys(config) if key in wanted}
    )
    if not keys:
        return
    timeout_s = LEASE_TTL_S + LEASE_SKEW_S

    def say(held: list[str]) -> None:
        out.print(
            f"{', '.join(held)}: held by a run Prefect reports crashed; waiting up to "
            f"{timeout_s:.0f} s for the lease to lapse (a killed run's lease outlives it by up "
            f"to {LEASE_TTL_S:.0f} s)",
            highlight=False,
            soft_wrap=True,
        )

    try:
        with SinkSet(config, config_path.resolve().parent) as sinks:
            probes = lease_probes(config, sinks, flow, keys)
            still = wait_for_leases(probes, timeout_s=timeout_s, on_wait=say)
    except SinkError as exc:
        out.print(f"leases of crashed shards not checked: {exc}", highlight=False, soft_wrap=True)
        return
    if still:
        out.print(
            f"still held after {timeout_s:.0f} s: {', '.join(still)}; a live run holds it "
            "(not dead after all), and the shard will report it is already running",
            highlight=False,
            soft_wrap=True,
        )


def print_last_backfills(flows: list[str]) -> None:
    """Under `historian state` (with PREFECT_API_URL): each flow's last sharded backfill,
    a line per shard run: its state and committed chunks of those planned. An API that
    does not answer is one line, not a failure: the sinks' state above stands alone."""
    if not os.environ.get("PREFECT_API_URL"):
        return
    from pipelines.orchestration.fleet import last_backfill

    for flow in flows:
        try:
            runs = last_backfill(flow)
        except Exception as exc:  # the API is optional here: say so and go on
            out.print(f"{flow}: shard runs not read from the Prefect API ({exc})", highlight=False)
            return
        if not runs:
            continue
        out.print(f"[bold]{flow}[/]: the last sharded backfill's {len(runs)} flow runs")
        for run in runs:
            planned = run["chunks_planned"]
            done = (run["chunks_done"] or 0) + (run["chunks_skipped"] or 0)
            chunks = f"{done}/{planned} chunks" if planned is not None else "chunks unknown"
            rows = f", {run['rows']:,} rows" if run["rows"] is not None else ""
            out.print(f"  {run['run']}: {run['state'].lower()}, {chunks}{rows}", highlight=False)
