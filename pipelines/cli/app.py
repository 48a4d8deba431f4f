"""The `historian` command: run, backfill, check, simulate, serve, report here; state,
flows, plan and init in the `cli_*` modules, which register themselves on the same app.

User errors (bad config, unreachable node, refused credentials, TLS, a sink that cannot
be written, a flow already running) end with one line on stderr and a non-zero exit:
2 for configuration and usage errors, 1 for everything that failed while running.
`HISTORIAN_DEBUG=1` shows the traceback instead, for bug reports.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from connectors.errors import NodeError, one_line

if TYPE_CHECKING:  # config and runner pull in pandas and pyarrow: imported when needed
    from pipelines.config.models import Config, FlowConfig
    from pipelines.config.nodes import ConnectedNode, NodePool
    from pipelines.core.runner import ChunkOutcome, Plan, RunRequest, RunSummary

from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_FAILED,
    EXIT_USAGE,
    ConfigOption,
    NodeOption,
    UserError,
    VerboseOption,
    app,
    current_flow,
    err,
    log_chunk,
    log_format,
    out,
    user_errors,
)
from pipelines.cli.base import check_flow as _check_flow
from pipelines.cli.base import load as _load
from pipelines.cli.base import moment as _moment
from pipelines.cli.base import setup_logging as _setup_logging
from pipelines.cli.summary import FlowOutcome, print_outcomes

__all__ = ["DEFAULT_CONFIG", "EXIT_FAILED", "EXIT_USAGE", "UserError", "app", "main"]

TIMES = "ISO 8601, UTC unless an offset is given; or relative: -2d, now-90m"


# -- run / backfill --------------------------------------------------------------------


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.fields[flow]}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rows]:>12,} rows"),
        TextColumn("{task.fields[rate]:>10,.0f} rows/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=False,
        # JSON log lines share stderr: no bar between them.
        disable=not err.is_terminal or log_format.get() == "json",
    )


def _run_flows(
    config_path: Path,
    names: list[str],
    *,
    start: datetime | None,
    end: datetime | None,
    backfill: bool,
    direct: bool,
    config: Config | None = None,
    nodes: list[str] | None = None,
) -> None:
    from pipelines.config.models import ConfigError
    from pipelines.core.runner import RunFailed, RunRequest

    if config is None:
        config = _load(config_path)
    for name in names:
        _check_flow(config, name, config_path)
        config.select_nodes(name, nodes)  # a --node that is not the flow's: one line, exit 2
    if start is not None and end is not None and end <= start:
        raise UserError("--end must be after --start", EXIT_USAGE)
    request = RunRequest(
        start=start, end=end, backfill=backfill, nodes=tuple(nodes) if nodes else None
    )
    outcomes: list[FlowOutcome] = []
    with _progress() as progress:
        tasks: dict[str, TaskID] = {}

        # One bar per (flow, node): a fleet flow's nodes advance apart.
        def on_plan(plan: Plan) -> None:
            key = plan.key or plan.flow
            tasks[key] = progress.add_task("", total=len(plan.pending), flow=key, rows=0, rate=0.0)

        def on_chunk(outcome: ChunkOutcome, summary: RunSummary) -> None:
            key = summary.key or summary.flow
            task = tasks.get(key)
            if task is None:
                task = tasks[key] = progress.add_task("", total=None, flow=key, rows=0, rate=0.0)
            elapsed = max(progress.tasks[task].elapsed or 0.0, 1e-9)
            progress.update(
                task, advance=outcome.chunks, rows=summary.rows, rate=summary.rows / elapsed
            )
            log_chunk(outcome, summary)

        # Every flow runs, whatever an earlier one did: one summary says which failed.
        for name in names:
            token = current_flow.set(name)
            try:
                if direct:
                    summary = _run_direct(config, config_path, name, request, on_chunk, on_plan)
                else:
                    from pipelines.orchestration.flows import run_prefect

                    summary = run_prefect(
                        config_path,
                        name,
                        request,
                        on_chunk=on_chunk,
                        on_plan=on_plan,
                        config=config,
                        record_task_runs=False,
                    )
                outcomes.append(FlowOutcome(name, summary))
            except RunFailed as exc:
                reason = _failure(config, name, exc, exc.summary.chunks_done)
                outcomes.append(FlowOutcome(name, exc.summary, reason))
            except ConfigError:
                raise
            except Exception as exc:
                from sinks.base import SinkError

                if not isinstance(exc, NodeError | SinkError | UserError):
                    raise
                outcomes.append(FlowOutcome(name, None, _failure(config, name, exc, 0)))
            finally:
                current_flow.reset(token)
    title = "historian backfill" if backfill else "historian run"
    print_outcomes(config, config_path, outcomes, title=title)
    failed = [o for o in outcomes if o.failure]
    if len(failed) == 1 and len(outcomes) == 1:
        raise UserError(failed[0].failure or "")
    if failed:
        raise UserError(
            f"{len(failed)} of {len(outcomes)} flows failed: "
            + ", ".join(o.flow for o in failed)
            + " (reasons above)"
        )


def _failure(config: Config, name: str, failed: BaseException, chunks_done: int) -> str:
    """One line: which flow, which part (node or sink), what, and what was kept."""
    from pipelines.cli.busy import busy_line
    from pipelines.core.runner import RunFailed
    from sinks.base import FlowLocked, SinkError

    exc = failed.__cause__ or failed if isinstance(failed, RunFailed) else failed
    busy = busy_line(exc)
    if busy is not None:
        return f"flow {name}: {busy}"
    nodes = failed.nodes if isinstance(failed, RunFailed) else ()
    if config.flows[name].fleet and isinstance(failed, RunFailed):
        exc, where = failed, ""  # its message names each failed node
    elif isinstance(exc, FlowLocked):
        where = ""
    elif isinstance(exc, NodeError):
        where = f"node {nodes[0] if nodes else config.flows[name].node}: "
    elif isinstance(exc, SinkError):
        where = "sink: "
    else:
        where = ""
    kept = (
        f" ({chunks_done} chunks committed; the next run continues from there)"
        if chunks_done
        else ""
    )
    return f"flow {name}: {where}{one_line(exc)}{kept}"


def _run_direct(
    config: Config,
    config_path: Path,
    name: str,
    request: RunRequest,
    on_chunk: Callable[[ChunkOutcome, RunSummary], None],
    on_plan: Callable[[Plan], None],
) -> RunSummary:
    from pipelines.config.destinations import SinkSet
    from pipelines.config.nodes import NodePool
    from pipelines.core.units import run_flow

    base = config_path.resolve().parent
    with NodePool(config) as nodes, SinkSet(config, base, writing=True) as sinks:
        return run_flow(
            config,
            name,
            nodes=nodes,
            sinks=sinks,
            request=request,
            on_chunk=on_chunk,
            on_plan=on_plan,
        )


@app.command()
def run(
    flow: Annotated[str | None, typer.Argument(help="Flow name in flows.yaml.")] = None,
    all_flows: Annotated[bool, typer.Option("--all", help="Run every flow.")] = False,
    start: Annotated[
        str | None, typer.Option(help=f"Explicit start ({TIMES}). Default: from state.")
    ] = None,
    end: Annotated[
        str | None, typer.Option(help=f"Explicit end ({TIMES}). Default: now - settle.")
    ] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
    direct: Annotated[
        bool, typer.Option("--direct", help="Run in this process without Prefect.")
    ] = False,
    node: NodeOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run one flow (or --all) now: incremental from its state unless --start is given."""
    _setup_logging(verbose)
    with user_errors():
        if all_flows == (flow is not None):
            raise UserError("give a FLOW name or --all", EXIT_USAGE)
        if all_flows and node:
            raise UserError("--node needs a FLOW name (not --all)", EXIT_USAGE)
        cfg = _load(config)
        names = list(cfg.flows) if all_flows else [flow or ""]
        _run_flows(
            config,
            names,
            start=_moment(start, "--start"),
            end=_moment(end, "--end"),
            backfill=False,
            direct=direct,
            config=cfg,  # read once: a flows.yaml may name 10,000 tags
            nodes=node,
        )


@app.command()
def backfill(
    flow: Annotated[str, typer.Argument(help="Flow name in flows.yaml.")],
    start: Annotated[str, typer.Option(help=f"Start ({TIMES}).")],
    end: Annotated[str | None, typer.Option(help=f"End ({TIMES}). Default: now - settle.")] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
    direct: Annotated[bool, typer.Option("--direct", help="Run without Prefect.")] = False,
    node: NodeOption = None,
    shards: Annotated[
        int | None,
        typer.Option("--shards", help="Split into N flow runs on a work pool (needs --pool)."),
    ] = None,
    per_node: Annotated[
        bool, typer.Option("--per-node", help="One flow run per node (needs --pool).")
    ] = False,
    pool: Annotated[
        str | None, typer.Option("--pool", help="Prefect work pool the shards run on.")
    ] = None,
    by: Annotated[
        str, typer.Option("--by", help="Shard by tag batches (tags) or by time windows (time).")
    ] = "tags",
    verbose: VerboseOption = False,
) -> None:
    """Extract a range; chunks already in every sink are skipped, so a killed backfill resumes.
    With --shards N (and/or --per-node) --pool P: as flow runs on a Prefect work pool."""
    _setup_logging(verbose)
    with user_errors():
        if shards is not None or per_node or pool is not None:
            from pipelines.cli.fleet import sharded_backfill

            begin = _moment(start, "--start")
            assert begin is not None  # --start is required
            sharded_backfill(
                config,
                flow,
                start=begin,
                end=_moment(end, "--end"),
                shards=1 if shards is None else shards,
                per_node=per_node,
                pool=pool,
                by=by,
                nodes=node,
            )
            return
        _run_flows(
            config,
            [flow],
            start=_moment(start, "--start"),
            end=_moment(end, "--end"),
            backfill=True,
            direct=direct,
            nodes=node,
        )


# -- check -----------------------------------------------------------------------------


@app.command()
def check(
    config: ConfigOption = Path(DEFAULT_CONFIG),
) -> None:
    """Config valid, every node reachable (and its version), every flow's tags found, every
    sink writable; writes nothing."""
    with user_errors():
        cfg = _load(config)
        out.print(
            f"[green]ok[/] {config}: {len(cfg.flows)} flows, {len(cfg.nodes)} nodes, "
            f"{len(cfg.sinks)} sinks",
            highlight=False,
        )
        problems: list[str] = []

        def fail(what: str, exc: Exception) -> None:
            problems.append(what)
            err.print(f"[red]fail[/] {what}: {one_line(exc)}", highlight=False, soft_wrap=True)

        from pipelines.config.nodes import NodePool

        with NodePool(cfg) as nodes:
            reachable = _check_nodes(cfg, nodes, fail)
            _check_flows(cfg, nodes, reachable, fail)
        _check_schedules(cfg, fail)
        _check_sinks(cfg, config.resolve().parent, fail)
        if problems:
            # Each reason is on its `fail` line above; the error line only counts them.
            failed = len(problems)
            raise UserError(
                f"{failed} check{'s' if failed > 1 else ''} failed: " + ", ".join(problems)
            )


def _check_nodes(cfg: Config, nodes: NodePool, fail: Callable[[str, Exception], None]) -> set[str]:
    """Each node answers with its credentials (tag data too); shows its name and version."""
    from pipelines.config.nodes import describe_node

    reachable: set[str] = set()
    for name in cfg.nodes:
        try:
            node = nodes.get(name)
            status = node.client.system_status()
            node_name = getattr(getattr(status, "n3", None), "node", None) or ""
            # A history-permission check: credentials accepted for tag data too.
            node.client.tag_get_views()
            version = node.version()
            shown = f"version {version}" if version is not None else "version unknown"
            if version is not None and version.text and version.text != str(version):
                shown += f" ({version.text!r})"
            out.print(
                f"[green]ok[/] node {describe_node(node)} answers {node_name}, {shown}",
                highlight=False,
            )
            reachable.add(name)
        except NodeError as exc:
            fail(f"node {name}", exc)
    return reachable


def _check_flows(
    cfg: Config, nodes: NodePool, reachable: set[str], fail: Callable[[str, Exception], None]
) -> None:
    """Each flow's tag selection resolves on its node (an unknown path or group is named
    by its config key), and its method is one the node's version computes; a fleet
    flow's on every node."""
    for name, flow in cfg.flows.items():
        fleet = cfg.flow_nodes(name)
        for node_name in fleet:
            if node_name in reachable:
                what = f"flow {name}" + (f" on node {node_name}" if flow.fleet else "")
                _check_flow_on(name, flow, nodes.get(node_name), what, fail)


def _check_flow_on(
    name: str,
    flow: FlowConfig,
    node: ConnectedNode,
    what: str,
    fail: Callable[[str, Exception], None],
) -> None:
    """One flow's selection and method on one of its nodes: an ok line, or `fail`."""
    from connectors.version import check_method
    from pipelines.selection import resolve_tags

    try:
        if flow.kind == "alarm_history":
            path = flow.alarms.path if flow.alarms else "/"
            count = node.client.alarm_count(path)
            found = f"alarms under {path!r}: {count} now"
        else:
            assert flow.tags is not None
            check_method(flow.method, node.version(), where=f"flows.{name}.method")
            resolved = resolve_tags(node.client, node.name, flow.tags, where=f"flows.{name}.tags")
            found = f"{len(resolved.members)} tags"
        out.print(f"[green]ok[/] {what}: {found}", highlight=False)
    except NodeError as exc:
        fail(what, exc)


def _check_schedules(cfg: Config, fail: Callable[[str, Exception], None]) -> None:
    """Each schedule is one Prefect accepts (its cron parser), as `serve` will need it."""
    if not any(flow.schedule for flow in cfg.flows.values()):
        return  # no schedule: Prefect is not imported
    from pipelines.config.models import ConfigError
    from pipelines.orchestration.schedules import check_schedule

    for name, flow in cfg.flows.items():
        if flow.schedule is None:
            continue
        try:
            checked = check_schedule(name, flow.schedule)
            out.print(f"[green]ok[/] schedule {name}: {checked.text}", highlight=False)
        except ConfigError as exc:
            fail(f"schedule {name}", exc)


def _check_sinks(cfg: Config, base: Path, fail: Callable[[str, Exception], None]) -> None:
    """Each sink could be written: found without creating a schema, table or folder."""
    from pipelines.config.destinations import make_sink
    from sinks.base import SinkError

    for name, sink_config in cfg.sinks.items():
        try:
            sink = make_sink(name, sink_config, base)
            found = sink.probe()
            out.print(f"[green]ok[/] sink {name}: {sink.describe()}: {found}", highlight=False)
        except SinkError as exc:
            fail(f"sink {name}", exc)


# -- simulate / serve / report ------------------------------------------------------------


@app.command()
def simulate(
    port: Annotated[int, typer.Option(help="HTTP port.")] = 3003,
    https_port: Annotated[int, typer.Option(help="HTTPS port (0 = off).")] = 3443,
    token: Annotated[
        str | None,
        typer.Option(help="Require this bearer token.", envvar="HISTORIAN_SIM_TOKEN"),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the deterministic data.")] = 7,
    tags: Annotated[int, typer.Option(help="Number of tags (10..100000).")] = 200,
    raw_cap: Annotated[int, typer.Option(help="Server-side cap of raw samples per tag.")] = 10_000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    replay: Annotated[
        bool, typer.Option("--replay", help="Serve repeated history queries from memory.")
    ] = False,
    replay_limit_mb: Annotated[
        int, typer.Option(help="Memory for replayed answers, MB (then no more are kept).")
    ] = 8192,
    replay_compress: Annotated[
        bool, typer.Option("--replay-compress", help="Keep replayed answers zstd-compressed.")
    ] = False,
    period_ms: Annotated[
        int | None,
        typer.Option(help="Sample every tag every N ms on a regular grid (default: mixed)."),
    ] = None,
    profile: Annotated[
        str,
        typer.Option(
            help="How the node reads what the spec leaves open: a profile, a+b, or `list`."
        ),
    ] = "default",
) -> None:
    """Serve the built-in node simulator (the whole REST interface) until Ctrl-C."""
    with user_errors():
        from connectors.simulator import SimConfig, serve_forever
        from connectors.simulator.config import MAX_PERIOD_MS
        from connectors.simulator.profiles import BEHAVIOURS, PROFILES, behaviours_of
        from connectors.simulator.server import PortInUse

        if profile == "list":
            for name, behaviours in PROFILES.items():
                out.print(f"{name}: {', '.join(sorted(behaviours)) or '-'}", highlight=False)
            for name, what in BEHAVIOURS.items():
                out.print(f"  {name}: {what}", highlight=False, soft_wrap=True)
            return
        try:
            behaviours_of(profile)
        except ValueError as exc:
            raise UserError(f"--profile: {exc}", EXIT_USAGE) from None

        if not 10 <= tags <= 100_000:
            raise UserError("--tags must be between 10 and 100000", EXIT_USAGE)
        if period_ms is not None and not 1 <= period_ms <= MAX_PERIOD_MS:
            raise UserError(f"--period-ms must be between 1 and {MAX_PERIOD_MS}", EXIT_USAGE)
        if replay_limit_mb < 0:
            raise UserError("--replay-limit-mb must not be negative", EXIT_USAGE)
        config = SimConfig(
            seed=seed,
            tags=tags,
            token=token,
            raw_cap=raw_cap,
            cache_answers=replay,
            cache_limit_bytes=replay_limit_mb << 20,
            cache_compress=replay_compress,
            period_ms=period_ms,
            profile=profile,
        )
        err.print(
            f"simulator: http://{host}:{port}"
            + (f" (profile {profile})" if profile != "default" else "")
            + (f" and https://{host}:{https_port}" if https_port else "")
            + (" (bearer token required)" if token else ""),
            highlight=False,
        )
        # `kill` stops it as cleanly as Ctrl-C: the servers close and the CA file goes.
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            serve_forever(config, http_port=port, https_port=https_port or None, host=host)
        except PortInUse as exc:
            option = "--port" if exc.port == port else "--https-port"
            raise UserError(f"{option}: {exc.strerror}; choose another port") from None
        except KeyboardInterrupt:
            err.print("simulator stopped")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.command()
def serve(
    config: ConfigOption = Path(DEFAULT_CONFIG),
    flow: Annotated[list[str] | None, typer.Option("--flow", help="Only these flows.")] = None,
) -> None:
    """Register every scheduled flow as a Prefect deployment and run them on schedule."""
    with user_errors():
        cfg = _load(config)
        for name in flow or []:
            _check_flow(cfg, name, config)
        unscheduled = [name for name in flow or [] if cfg.flows[name].schedule is None]
        if unscheduled:
            raise UserError(
                f"{config.name}: flows.{unscheduled[0]}: has no schedule to serve", EXIT_USAGE
            )
        scheduled = [n for n, f in cfg.flows.items() if f.schedule and (not flow or n in flow)]
        if not scheduled:
            raise UserError(f"{config.name}: no flow has a schedule", EXIT_USAGE)
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
        out.print("stopped", highlight=False)


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
        cfg = _load(config)
        for name in flow or []:
            _check_flow(cfg, name, config)
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


@app.command()
def report(
    flow: Annotated[str, typer.Argument(help="Flow whose data to draw.")],
    out_path: Annotated[Path | None, typer.Option("--out", help="HTML file to write.")] = None,
    start: Annotated[
        str | None,
        typer.Option(
            help="From (ISO 8601, UTC unless an offset is given, or -7d). Default: the first row or extracted window."
        ),
    ] = None,
    end: Annotated[
        str | None,
        typer.Option(
            help="Until, exclusive (ISO 8601 or -1h). Default: the last row or extracted window."
        ),
    ] = None,
    bucket: Annotated[
        str | None,
        typer.Option(help="Bucket size (15m, 1h, 1d). Default: about 100 buckets over the range."),
    ] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
) -> None:
    """Coverage and value trend per tag (alarm counts by priority and status) as one HTML page."""
    with user_errors():
        from pipelines.cli.busy import first_open_sink
        from pipelines.config.destinations import SinkSet
        from pipelines.planning import parse_duration
        from pipelines.report.coverage import RangeError
        from pipelines.report.page import write_report

        cfg = _load(config)
        _check_flow(cfg, flow, config)
        since, until = _moment(start, "--start"), _moment(end, "--end")
        if since is not None and until is not None and until <= since:
            raise UserError("--end must be after --start", EXIT_USAGE)
        try:
            size = parse_duration(bucket) if bucket is not None else None
        except ValueError as exc:
            raise UserError(f"--bucket: {exc}", EXIT_USAGE) from None
        target = out_path or Path(f"{flow}-report.html")
        with SinkSet(cfg, config.resolve().parent) as sinks:
            # A DuckDB file a run holds cannot be read: the flow's next sink is.
            source, busy = first_open_sink(sinks, cfg.flows[flow].sinks)
            for line in busy:
                err.print(f"{line}; reading sink {source} instead", highlight=False)
            try:
                written = write_report(
                    cfg,
                    flow,
                    target,
                    sinks=sinks,
                    start=since,
                    end=until,
                    bucket=size,
                    sink_name=source,
                )
            except RangeError as exc:
                raise UserError(f"report {flow}: {exc}", EXIT_USAGE) from None
        out.print(f"report: {written}", highlight=False)


# Commands in modules of their own register themselves on `app` when imported (here, so
# that `--help` lists them after the commands above).
from pipelines.cli import flows, init, plan, state  # noqa: E402, F401


def main() -> None:
    """Console entry point."""
    from pipelines.core.memory import bound_memory, skip_collection_at_exit
    from pipelines.orchestration.env import configure_prefect

    bound_memory()
    configure_prefect()
    try:
        app()
    except SystemExit:
        raise
    except Exception as exc:
        from pipelines.config.models import ConfigError

        if not isinstance(exc, ConfigError):
            raise
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(EXIT_USAGE)
    finally:
        skip_collection_at_exit()


if __name__ == "__main__":
    main()
