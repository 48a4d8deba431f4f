"""The `historian` command: run, backfill, state, check, simulate, serve, report.

User errors (bad config, unreachable node, refused credentials, TLS, a sink that cannot
be written, a flow already running) end with one line on stderr and a non-zero exit:
2 for configuration and usage errors, 1 for everything that failed while running.
`HISTORIAN_DEBUG=1` shows the traceback instead, for bug reports.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from connectors.errors import NodeError, one_line, quoted

if TYPE_CHECKING:  # config and runner pull in pandas and pyarrow: imported when needed
    from pipelines.config import Config
    from pipelines.nodes import NodePool
    from pipelines.runner import ChunkOutcome, Plan, RunRequest, RunSummary
    from sinks.base import ChunkRecord, Sink

app = typer.Typer(
    name="historian",
    help="Extract tag and alarm history from a data node into a Parquet lake or SQL warehouse.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
state_app = typer.Typer(help="Show or reset what each flow has extracted.", no_args_is_help=False)
app.add_typer(state_app, name="state")

out = Console(width=None if sys.stdout.isatty() else 140)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 140)

EXIT_FAILED = 1
EXIT_USAGE = 2
# pipelines.config.DEFAULT_CONFIG, spelled here so that the command starts (and a Prefect
# run starts its server) before pandas is imported; a test keeps the two equal.
DEFAULT_CONFIG = "flows.yaml"

ConfigOption = Annotated[
    Path, typer.Option("--config", "-c", help="flows.yaml to use.", envvar="HISTORIAN_CONFIG")
]
T = TypeVar("T")


class UserError(Exception):
    """A problem the user can fix; printed as one line."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        self.code = code
        super().__init__(message)


def _fail(message: str, code: int) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the project's typed errors into one line and an exit code."""
    if os.environ.get("HISTORIAN_DEBUG") == "1":
        yield
        return
    from pipelines.config import ConfigError
    from sinks.base import SinkError

    try:
        yield
    except ConfigError as exc:
        _fail(str(exc), EXIT_USAGE)
    except UserError as exc:
        _fail(str(exc), exc.code)
    except NodeError as exc:
        _fail(f"node: {one_line(exc)}", EXIT_FAILED)
    except SinkError as exc:
        _fail(f"sink: {one_line(exc)}", EXIT_FAILED)
    except KeyboardInterrupt:
        _fail("interrupted; committed chunks are kept and the next run continues", 130)
    except OSError as exc:
        _fail(one_line(exc), EXIT_FAILED)


def _setup_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    level = logging.INFO if verbose else logging.WARNING
    handler = RichHandler(console=err, show_path=False, show_time=verbose, markup=False)
    root = logging.getLogger("historian")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def _load(path: Path) -> Config:
    from pipelines.config import load_config

    return load_config(path)


def _moment(value: str | None, option: str) -> datetime | None:
    if value is None:
        return None
    from pipelines.config import parse_moment

    try:
        return parse_moment(value)
    except ValueError as exc:
        raise UserError(f"{option}: {exc}", EXIT_USAGE) from None


def _check_flow(config: Config, name: str, source: Path) -> None:
    if name not in config.flows:
        known = ", ".join(config.flows)
        raise UserError(f"{source.name}: no flow named {quoted(name)} (flows: {known})", EXIT_USAGE)


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
        disable=not err.is_terminal,
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
) -> None:
    from pipelines.config import ConfigError
    from pipelines.runner import RunFailed, RunRequest

    if config is None:
        config = _load(config_path)
    for name in names:
        _check_flow(config, name, config_path)
    if start is not None and end is not None and end <= start:
        raise UserError("--end must be after --start", EXIT_USAGE)
    request = RunRequest(start=start, end=end, backfill=backfill)
    summaries: list[RunSummary] = []
    failed: str | None = None
    with _progress() as progress:
        tasks: dict[str, TaskID] = {}

        def on_plan(plan: Plan) -> None:
            tasks[plan.flow] = progress.add_task(
                "", total=len(plan.pending), flow=plan.flow, rows=0, rate=0.0
            )

        def on_chunk(outcome: ChunkOutcome, summary: RunSummary) -> None:
            task = tasks.get(summary.flow)
            if task is None:
                task = tasks[summary.flow] = progress.add_task(
                    "", total=None, flow=summary.flow, rows=0, rate=0.0
                )
            elapsed = max(progress.tasks[task].elapsed or 0.0, 1e-9)
            progress.update(
                task, advance=outcome.chunks, rows=summary.rows, rate=summary.rows / elapsed
            )

        for name in names:
            try:
                if direct:
                    summary = _run_direct(config, config_path, name, request, on_chunk, on_plan)
                else:
                    from pipelines.flows import run_prefect

                    summary = run_prefect(
                        config_path,
                        name,
                        request,
                        on_chunk=on_chunk,
                        on_plan=on_plan,
                        config=config,
                    )
                summaries.append(summary)
            except RunFailed as exc:
                summaries.append(exc.summary)
                failed = _failure(config, name, exc.__cause__ or exc, exc.summary.chunks_done)
                break
            except ConfigError:
                raise
            except Exception as exc:
                from sinks.base import SinkError

                if isinstance(exc, NodeError | SinkError | UserError):
                    failed = _failure(config, name, exc, 0)
                    break
                raise
    _print_summaries(config, config_path, [s for s in summaries if s.chunks_done or not failed])
    if failed:
        raise UserError(failed)


def _failure(config: Config, name: str, exc: BaseException, chunks_done: int) -> str:
    """One line: which flow, which part (node or sink), what, and what was kept."""
    from sinks.base import FlowLocked, SinkError

    if isinstance(exc, FlowLocked):
        where = ""
    elif isinstance(exc, NodeError):
        where = f"node {config.flows[name].node}: "
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
    from pipelines.destinations import SinkSet
    from pipelines.nodes import NodePool
    from pipelines.runner import run_flow

    base = config_path.resolve().parent
    with NodePool(config) as nodes, SinkSet(config, base) as sinks:
        return run_flow(
            config,
            name,
            nodes=nodes,
            sinks=sinks,
            request=request,
            on_chunk=on_chunk,
            on_plan=on_plan,
        )


def _print_summaries(config: Config, config_path: Path, summaries: list[RunSummary]) -> None:

    rows = summaries
    if not rows:
        return
    table = Table(title="historian run", show_lines=False, title_justify="left")
    columns = (
        "flow",
        "rows",
        "chunks",
        "window",
        "skipped",
        "seconds",
        "rows/s",
        "tags",
        "watermark",
    )
    for column in columns:
        left = column in ("flow", "window", "watermark")
        table.add_column(column, justify="left" if left else "right")
    for s in rows:
        mark = s.watermark_after.strftime("%Y-%m-%d %H:%M:%SZ") if s.watermark_after else "-"
        table.add_row(
            s.flow,
            f"{s.rows:,}",
            f"{s.chunks_done}/{s.chunks_planned}",
            s.window_label,
            f"{s.chunks_skipped}",
            f"{s.seconds:.1f}",
            f"{s.rows_per_second:,.0f}",
            f"{s.tags}",
            mark,
        )
    out.print(table)
    for s in rows:
        for remark in s.remarks:
            out.print(f"  [yellow]{s.flow}:[/] {remark}", highlight=False, soft_wrap=True)
    base = config_path.resolve().parent
    shown: set[tuple[str, str]] = set()
    for s in rows:
        flow = config.flows.get(s.flow)
        if flow is None:
            continue
        for sink_name in flow.sinks:
            where = s.sinks.get(sink_name)
            if where and (sink_name, s.dataset) not in shown:
                shown.add((sink_name, s.dataset))
                out.print(f"  {s.flow} -> {sink_name}: {where}", highlight=False)
    hints = _read_hints(config, base, rows)
    if hints:
        out.print("Read it back:")
        for hint in hints:
            out.print(f"  {hint}", highlight=False, soft_wrap=True)


def _read_hints(config: Config, base: Path, summaries: Sequence[RunSummary]) -> list[str]:
    from pipelines.config import ParquetSinkConfig, SqlSinkConfig
    from pipelines.destinations import _local_path, _sql_url

    hints: list[str] = []
    for summary in summaries[:1]:
        name = summary.flow
        dataset = summary.dataset
        flow = config.flows.get(name)
        if flow is None:
            continue
        for sink_name in flow.sinks:
            sink = config.sinks[sink_name]
            if isinstance(sink, ParquetSinkConfig):
                root = _local_path(sink.url, base)
                with suppress(ValueError):
                    root = str(Path(root).relative_to(Path.cwd()))
                hints.append(
                    f"python -c \"import pandas as pd; print(pd.read_parquet('{root}/{dataset}'))\""
                )
            elif isinstance(sink, SqlSinkConfig) and sink.url.startswith("duckdb:///"):
                path = _sql_url(sink.url, base)[len("duckdb:///") :]
                with suppress(ValueError):
                    path = str(Path(path).relative_to(Path.cwd()))
                hints.append(
                    f"python -c \"import duckdb; duckdb.connect('{path}', read_only=True)"
                    f".sql('select tag, count(*) from {dataset} group by tag limit 5').show()\""
                )
    return hints


@app.command()
def run(
    flow: Annotated[str | None, typer.Argument(help="Flow name in flows.yaml.")] = None,
    all_flows: Annotated[bool, typer.Option("--all", help="Run every flow.")] = False,
    start: Annotated[
        str | None, typer.Option(help="Explicit start (ISO 8601 UTC, or -2d). Default: from state.")
    ] = None,
    end: Annotated[str | None, typer.Option(help="Explicit end (ISO 8601 UTC, or -1h).")] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
    direct: Annotated[
        bool, typer.Option("--direct", help="Run in this process without Prefect.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run one flow (or --all) now: incremental from its state unless --start is given."""
    _setup_logging(verbose)
    with user_errors():
        if all_flows == (flow is not None):
            raise UserError("give a FLOW name or --all", EXIT_USAGE)
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
        )


@app.command()
def backfill(
    flow: Annotated[str, typer.Argument(help="Flow name in flows.yaml.")],
    start: Annotated[str, typer.Option(help="Start (ISO 8601 UTC, or -30d).")],
    end: Annotated[
        str | None, typer.Option(help="End (ISO 8601 UTC). Default: now - settle.")
    ] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
    direct: Annotated[bool, typer.Option("--direct", help="Run without Prefect.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Extract a range; chunks already in every sink are skipped, so a killed backfill resumes."""
    _setup_logging(verbose)
    with user_errors():
        _run_flows(
            config,
            [flow],
            start=_moment(start, "--start"),
            end=_moment(end, "--end"),
            backfill=True,
            direct=direct,
        )


# -- state -----------------------------------------------------------------------------


@state_app.callback(invoke_without_command=True)
def state_show(
    ctx: typer.Context,
    flow: Annotated[str | None, typer.Option("--flow", "-f", help="Only this flow.")] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
    chunks: Annotated[int, typer.Option(help="Recent chunks to list per flow.")] = 5,
) -> None:
    """Watermarks per flow and sink, the most recent chunks with rows fetched/committed,
    windows the node left a tag out of, and progress marked complete past now - settle."""
    if ctx.invoked_subcommand is not None:
        return
    with user_errors():
        from datetime import UTC

        from pipelines.destinations import SinkSet
        from pipelines.state import flow_watermark, missing_windows, tag_members

        cfg = _load(config)
        if flow is not None:
            _check_flow(cfg, flow, config)
        names = [flow] if flow else list(cfg.flows)
        now = datetime.now(UTC)
        with SinkSet(cfg, config.resolve().parent) as sinks:
            table = Table(title="historian state", title_justify="left")
            for column in ("flow", "sink", "members", "watermark", "complete to (min..max)"):
                table.add_column(column)
            logs: list[tuple[str, str, list[ChunkRecord]]] = []
            warnings: list[str] = []
            for name in names:
                fc = cfg.flows[name]
                for sink_name in fc.sinks:
                    sink = sinks.get(sink_name)
                    progress = sink.progress(name)
                    members = tag_members(progress)
                    marks = [flow_watermark(progress, [m], fc.start) for m in members]
                    overall = flow_watermark(progress, members, fc.start) if members else None
                    ends = [m for m in marks if m is not None]
                    span = (
                        f"{min(ends):%Y-%m-%d %H:%M}Z .. {max(ends):%Y-%m-%d %H:%M}Z"
                        if ends
                        else "-"
                    )
                    table.add_row(
                        name,
                        sink_name,
                        str(len(members)),
                        f"{overall:%Y-%m-%d %H:%M:%S}Z" if overall else "-",
                        span,
                    )
                    logs.append((name, sink_name, list(sink.chunk_log(name, chunks))))
                    where = f"{name} -> {sink_name}"
                    poisoned = _poisoned_from(sink, name, fc.settle, now)
                    if poisoned is not None:
                        warnings.append(
                            f"[red]POISONED[/] {where}: marked complete past what the node "
                            f"could have had (from {poisoned:%Y-%m-%d %H:%M:%S}Z); "
                            f"repair: historian state repair {name}"
                        )
                    for tag, windows in missing_windows(progress).items():
                        shown = ", ".join(str(w) for w in windows[:3])
                        more = f" (+{len(windows) - 3} more)" if len(windows) > 3 else ""
                        warnings.append(
                            f"[yellow]MISSING[/] {where}: tag {tag!r} left out of the node's "
                            f"answers in {shown}{more}"
                        )
            out.print(table)
            for line in warnings:
                out.print(line, highlight=False, soft_wrap=True)
            mismatches = 0
            for name, sink_name, records in logs:
                if not records:
                    continue
                out.print(f"[bold]{name}[/] -> {sink_name}: last {len(records)} chunks")
                for record in records:
                    fetched = record.rows_fetched
                    committed = record.rows_committed
                    flag = "" if fetched == committed else "  [red]MISMATCH[/]"
                    mismatches += fetched != committed
                    out.print(
                        f"  {record.window}  {record.members} members"
                        f"  fetched {fetched:,}  committed {committed:,}{flag}",
                        highlight=False,
                    )
            if mismatches:
                raise UserError(f"{mismatches} chunks committed a different row count than fetched")


# Chunk records read to find progress recorded past what was settled when it was written.
_REPAIR_SCAN = 1_000_000


def _poisoned_from(sink: Sink, flow: str, settle: timedelta, now: datetime) -> datetime | None:
    """Where a flow's progress in `sink` claims more than the node could have had: chunks
    whose window ended after they were written (minus settle), or progress past now -
    settle. None when there is nothing of the kind."""
    from pipelines.state import complete_past, repair_from

    moments = [repair_from(sink.chunk_log(flow, _REPAIR_SCAN), settle)]
    if complete_past(sink.progress(flow), now - settle) is not None:
        moments.append(now - settle)
    found = [moment for moment in moments if moment is not None]
    return min(found) if found else None


@state_app.command("repair")
def state_repair(
    flow: Annotated[str, typer.Argument(help="Flow whose poisoned progress to forget.")],
    config: ConfigOption = Path(DEFAULT_CONFIG),
) -> None:
    """Forget progress marked complete past what the node could have had (a backfill to a
    future end, before ends were cut at now - settle); the next run fetches it. Data stays."""
    with user_errors():
        from datetime import UTC

        from pipelines.destinations import SinkSet

        cfg = _load(config)
        _check_flow(cfg, flow, config)
        settle = cfg.flows[flow].settle
        now = datetime.now(UTC)
        repaired = 0
        with SinkSet(cfg, config.resolve().parent) as sinks:
            for sink_name in cfg.flows[flow].sinks:
                sink = sinks.get(sink_name)
                with sink.lock(flow):
                    moment = _poisoned_from(sink, flow, settle, now)
                    if moment is None:
                        continue
                    removed = sink.forget_after(flow, moment)
                    repaired += 1
                out.print(
                    f"repaired {flow} in {sink_name}: progress after "
                    f"{moment:%Y-%m-%d %H:%M:%S}Z forgotten ({removed} entries); the next run "
                    "fetches it again",
                    highlight=False,
                )
        if not repaired:
            out.print(f"{flow}: nothing to repair", highlight=False)


@state_app.command("reset")
def state_reset(
    flow: Annotated[str, typer.Argument(help="Flow whose progress to forget.")],
    tag: Annotated[
        str | None, typer.Option("--tag", help="Only this tag (or alarm selection).")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    config: ConfigOption = Path(DEFAULT_CONFIG),
) -> None:
    """Forget a flow's (or one tag's) progress: the next run re-extracts from `start`. Data stays."""
    with user_errors():
        from pipelines.destinations import SinkSet

        cfg = _load(config)
        _check_flow(cfg, flow, config)
        what = f"tag {tag!r} of flow {flow!r}" if tag else f"flow {flow!r}"
        if not yes and not typer.confirm(
            f"Forget the progress of {what} in {', '.join(cfg.flows[flow].sinks)}?"
        ):
            raise UserError("nothing reset", EXIT_FAILED)
        removed = 0
        with SinkSet(cfg, config.resolve().parent) as sinks:
            for sink_name in cfg.flows[flow].sinks:
                sink = sinks.get(sink_name)
                with sink.lock(flow):
                    removed += sink.reset(flow, tag)
        out.print(f"reset {what}: {removed} progress entries removed")


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
            problems.append(f"{what}: {one_line(exc)}")
            err.print(f"[red]fail[/] {what}: {one_line(exc)}", highlight=False)

        from pipelines.nodes import NodePool

        with NodePool(cfg) as nodes:
            reachable = _check_nodes(cfg, nodes, fail)
            _check_flows(cfg, nodes, reachable, fail)
        _check_schedules(cfg, fail)
        _check_sinks(cfg, config.resolve().parent, fail)
        if problems:
            raise UserError(
                problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
            )


def _check_nodes(cfg: Config, nodes: NodePool, fail: Callable[[str, Exception], None]) -> set[str]:
    """Each node answers with its credentials (tag data too); shows its name and version."""
    from pipelines.nodes import describe_node

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
    by its config key), and its method is one the node's version computes."""
    from connectors.version import check_method
    from pipelines.selection import resolve_tags

    for name, flow in cfg.flows.items():
        if flow.node not in reachable:
            continue
        node = nodes.get(flow.node)
        try:
            if flow.kind == "alarm_history":
                path = flow.alarms.path if flow.alarms else "/"
                count = node.client.alarm_count(path)
                found = f"alarms under {path!r}: {count} now"
            else:
                assert flow.tags is not None
                check_method(flow.method, node.version(), where=f"flows.{name}.method")
                resolved = resolve_tags(
                    node.client, node.name, flow.tags, where=f"flows.{name}.tags"
                )
                found = f"{len(resolved.members)} tags"
            out.print(f"[green]ok[/] flow {name}: {found}", highlight=False)
        except NodeError as exc:
            fail(f"flow {name}", exc)


def _check_schedules(cfg: Config, fail: Callable[[str, Exception], None]) -> None:
    """Each schedule is one Prefect accepts (its cron parser), as `serve` will need it."""
    if not any(flow.schedule for flow in cfg.flows.values()):
        return  # no schedule: Prefect is not imported
    from pipelines.config import ConfigError
    from pipelines.schedules import check_schedule

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
    from pipelines.destinations import make_sink
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
        try:
            serve_forever(config, http_port=port, https_port=https_port or None, host=host)
        except KeyboardInterrupt:
            err.print("simulator stopped")


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
        from pipelines.flows import serve_flows
        from pipelines.prefect_server import ServerStartError

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
    """Register every scheduled flow as a deployment of a work pool on the Prefect server
    PREFECT_API_URL names; `prefect worker start --pool POOL` runs them on schedule."""
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
        from pipelines.flows import deploy_flows

        names = [n for n, f in cfg.flows.items() if f.schedule and (not flow or n in flow)]
        if not names:
            raise UserError(f"{config.name}: no flow has a schedule", EXIT_USAGE)
        deploy_flows(config, pool, names=names)
        out.print(
            f"deployed {len(names)} scheduled flows ({', '.join(names)}) to work pool {pool}; "
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
        from pipelines.coverage import RangeError
        from pipelines.destinations import SinkSet
        from pipelines.planning import parse_duration
        from pipelines.report import write_report

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
            try:
                written = write_report(
                    cfg, flow, target, sinks=sinks, start=since, end=until, bucket=size
                )
            except RangeError as exc:
                raise UserError(f"report {flow}: {exc}", EXIT_USAGE) from None
        out.print(f"report: {written}", highlight=False)


def main() -> None:
    """Console entry point."""
    from pipelines.memory import bound_memory
    from pipelines.prefect_env import configure_prefect

    bound_memory()
    configure_prefect()
    try:
        app()
    except SystemExit:
        raise
    except Exception as exc:
        from pipelines.config import ConfigError

        if not isinstance(exc, ConfigError):
            raise
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(EXIT_USAGE)


if __name__ == "__main__":
    main()
