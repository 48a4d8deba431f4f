"""`historian run` and `historian backfill`: one or more flows extracted in this process
(or, with a Prefect server configured or `--prefect`, as Prefect flow runs it starts), a
progress bar per (flow, node), then the summary; `backfill --shards/--per-node --pool`
hands the range to pipelines/cli/fleet.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
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
from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_USAGE,
    ConfigOption,
    NodeOption,
    UserError,
    VerboseOption,
    app,
    check_flow,
    current_flow,
    err,
    interrupts,
    json_progress,
    load,
    log_chunk,
    log_format,
    moment,
    setup_logging,
    user_errors,
)
from pipelines.cli.summary import FlowOutcome, print_outcomes

if TYPE_CHECKING:  # config and runner pull in pandas and pyarrow: imported when needed
    from pipelines.config.models import Config
    from pipelines.core.runner import ChunkOutcome, Plan, RunRequest, RunSummary

TIMES = "ISO 8601, UTC unless an offset is given; or relative: -2d, now-90m"

DirectOption = Annotated[
    bool,
    typer.Option(
        "--direct",
        help="Run in this process, without Prefect, even where a Prefect server is configured.",
    ),
]
PrefectOption = Annotated[
    bool,
    typer.Option(
        "--prefect",
        help="Run as a Prefect flow run: on the configured Prefect server (PREFECT_API_URL "
        "or the active Prefect profile), else on a temporary one. Default: in this process "
        "unless a server is configured.",
    ),
]


def in_process(direct: bool, prefect: bool) -> bool:
    """Whether the flows run in this process (the default) or as Prefect flow runs: the
    latter with --prefect, or when a Prefect server is configured, where a run belongs in
    its history and UI. Decided without importing Prefect."""
    if direct and prefect:
        raise UserError("give --direct or --prefect, not both", EXIT_USAGE)
    if direct or prefect:
        return direct
    from pipelines.orchestration.env import prefect_server_configured

    return not prefect_server_configured()


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
    """Run the flows one after another with a progress bar each, print one summary of
    them all, and fail (one line) if any did."""
    from pipelines.core.runner import RunRequest

    if config is None:
        config = load(config_path)
    for name in names:
        check_flow(config, name, config_path)
        config.select_nodes(name, nodes)  # a --node that is not the flow's: one line, exit 2
    if start is not None and end is not None and end <= start:
        raise UserError("--end must be after --start", EXIT_USAGE)
    request = RunRequest(
        start=start, end=end, backfill=backfill, nodes=tuple(nodes) if nodes else None
    )
    ticker = _ticker()
    with _progress() as progress:
        bars = _Bars(progress, ticker)
        # Every flow runs, whatever an earlier one did: one summary says which failed.
        outcomes = [
            _recorded(config, config_path, name, request, bars, direct=direct) for name in names
        ]
    title = "historian backfill" if backfill else "historian run"
    print_outcomes(config, config_path, outcomes, title=title)
    _raise_failures(outcomes)


def _raise_failures(outcomes: list[FlowOutcome]) -> None:
    """The command's one error line: the reason when its only flow failed, else which
    flows failed (their reasons are printed under the summary)."""
    failed = [o for o in outcomes if o.failure]
    if len(failed) == 1 and len(outcomes) == 1:
        raise UserError(failed[0].failure or "")
    if failed:
        raise UserError(
            f"{len(failed)} of {len(outcomes)} flows failed: "
            + ", ".join(o.flow for o in failed)
            + " (reasons above)"
        )


class _Bars:
    """One progress bar per (flow, node): a fleet flow's nodes advance apart. On a
    terminal only; under --log-format json a `_Ticker` says the same in log lines."""

    def __init__(self, progress: Progress, ticker: _Ticker | None) -> None:
        self._progress = progress
        self._ticker = ticker
        self._tasks: dict[str, TaskID] = {}
        # (flow, key) -> rows and chunks committed so far: what an interrupted run kept.
        self._done: dict[tuple[str, str], tuple[int, int]] = {}

    def done(self, flow: str) -> tuple[int, int]:
        """Rows and chunks the flow's units committed so far."""
        counts = [count for (name, _), count in self._done.items() if name == flow]
        return sum(rows for rows, _ in counts), sum(chunks for _, chunks in counts)

    def on_plan(self, plan: Plan) -> None:
        key = plan.key or plan.flow
        self._tasks[key] = self._progress.add_task(
            "", total=len(plan.pending), flow=key, rows=0, rate=0.0
        )
        if self._ticker is not None:
            self._ticker.on_plan(key, len(plan.pending))

    def on_chunk(self, outcome: ChunkOutcome, summary: RunSummary) -> None:
        key = summary.key or summary.flow
        task = self._tasks.get(key)
        if task is None:
            task = self._tasks[key] = self._progress.add_task(
                "", total=None, flow=key, rows=0, rate=0.0
            )
        elapsed = max(self._progress.tasks[task].elapsed or 0.0, 1e-9)
        self._progress.update(
            task, advance=outcome.chunks, rows=summary.rows, rate=summary.rows / elapsed
        )
        # Counted before the line says so: an interrupt that follows the line records it.
        self._done[(summary.flow, key)] = (summary.rows, summary.chunks_done)
        log_chunk(outcome, summary)
        if self._ticker is not None:
            self._ticker.on_chunk(key, outcome.chunks, summary.rows)


# Under --log-format json, a progress line per (flow, node) at most this often.
PROGRESS_EVERY_ENV = "HISTORIAN_PROGRESS_EVERY_S"
PROGRESS_EVERY_S = 10.0


@dataclass
class _Count:
    planned: int | None
    started: float
    said: float
    done: int = 0


class _Ticker:
    """What the bars show, as a JSON log line per (flow, node) every `every_s` seconds
    (at a committed chunk) and at its last chunk: a scheduler's log shows a long run move."""

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self._counts: dict[str, _Count] = {}

    def on_plan(self, key: str, planned: int) -> None:
        now = time.monotonic()
        self._counts[key] = _Count(planned, now, now)

    def on_chunk(self, key: str, chunks: int, rows: int) -> None:
        now = time.monotonic()
        count = self._counts.setdefault(key, _Count(None, now, now))
        count.done += chunks
        if now - count.said < self._every_s and count.done != count.planned:
            return
        count.said = now
        elapsed = max(now - count.started, 1e-9)
        rate = rows / elapsed
        left = None if count.planned is None else max(count.planned - count.done, 0)
        eta = None if left is None or not count.done else round(elapsed / count.done * left, 1)
        of = f" of {count.planned}" if count.planned is not None else ""
        until = f", ETA {eta:.0f} s" if eta is not None else ""
        json_progress(
            key,
            f"{key}: {count.done}{of} chunks, {rows:,} rows, {rate:,.0f} rows/s{until}",
            {
                "chunks_done": count.done,
                "chunks_planned": count.planned,
                "rows": rows,
                "rows_per_s": round(rate, 1),
                "eta_s": eta,
            },
        )


def _ticker() -> _Ticker | None:
    """The JSON progress lines, under --log-format json only."""
    if log_format.get() != "json":
        return None
    value = os.environ.get(PROGRESS_EVERY_ENV) or str(PROGRESS_EVERY_S)
    try:
        every_s = float(value)
    except ValueError:
        message = f"{PROGRESS_EVERY_ENV}: {value!r} is not a number of seconds"
        raise UserError(message, EXIT_USAGE) from None
    return _Ticker(every_s)


def _recorded(
    config: Config,
    config_path: Path,
    name: str,
    request: RunRequest,
    bars: _Bars,
    *,
    direct: bool,
) -> FlowOutcome:
    """`_run_one`, its outcome appended to the run log (`historian runs`), an interrupted
    or crashed run's too, with what its committed chunks held."""
    from pipelines.cli.flows import record_run

    started = datetime.now(UTC)
    entry: dict[str, object] = {
        "start": started.isoformat(),
        "flow": name,
        "command": "backfill" if request.backfill else "run",
        "path": "in process" if direct else "prefect",
    }
    written = threading.Lock()  # one record, from this thread or an interrupt's timer

    def record(**outcome: object) -> None:
        if written.acquire(blocking=False):
            record_run(config_path, {**entry, **outcome, "end": datetime.now(UTC).isoformat()})

    def interrupted(error: str = "interrupted") -> None:
        rows, chunks = bars.done(name)
        status = "interrupted" if error == "interrupted" else "failed"
        record(node=None, rows=rows, chunks=chunks, status=status, error=error)

    try:
        with interrupts.last_words(interrupted):
            outcome = _run_one(config, config_path, name, request, bars, direct=direct)
    except KeyboardInterrupt:
        interrupted()
        raise
    except BaseException as exc:
        interrupted(one_line(exc))
        raise
    summary = outcome.summary
    record(
        node=summary.node if summary else None,
        rows=summary.rows if summary else 0,
        chunks=summary.chunks_done if summary else 0,
        status="failed" if outcome.failure else "ok",
        error=outcome.failure,
    )
    return outcome


def _run_one(
    config: Config,
    config_path: Path,
    name: str,
    request: RunRequest,
    bars: _Bars,
    *,
    direct: bool,
) -> FlowOutcome:
    """One flow, in this process or as a Prefect flow run: its outcome, with the reason
    when it failed in a way the user can act on (anything else propagates)."""
    from pipelines.config.models import ConfigError
    from pipelines.core.runner import RunFailed

    token = current_flow.set(name)
    try:
        if direct:
            summary = _run_direct(config, config_path, name, request, bars.on_chunk, bars.on_plan)
        else:
            from pipelines.orchestration.flows import run_prefect

            summary = run_prefect(
                config_path,
                name,
                request,
                on_chunk=bars.on_chunk,
                on_plan=bars.on_plan,
                config=config,
                record_task_runs=False,
            )
        return FlowOutcome(name, summary)
    except RunFailed as exc:
        _raise_settings_error(name, exc.__cause__)
        reason = _failure(config, name, exc, exc.summary.chunks_done)
        return FlowOutcome(name, exc.summary, reason)
    except ConfigError:
        raise
    except Exception as exc:
        from sinks.base import SinkError

        if not isinstance(exc, NodeError | SinkError | UserError):
            raise
        _raise_settings_error(name, exc)
        return FlowOutcome(name, None, _failure(config, name, exc, 0))
    finally:
        current_flow.reset(token)


def _raise_settings_error(name: str, exc: BaseException | None) -> None:
    """A node's settings that cannot work (a credential's environment variable not set)
    are a configuration error: exit 2, one line, its message once (it names the node)."""
    from connectors.settings import SettingsError

    if isinstance(exc, SettingsError):
        raise UserError(f"flow {name}: {exc.message}", EXIT_USAGE) from None


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
    direct: DirectOption = False,
    prefect: PrefectOption = False,
    node: NodeOption = None,
    verbose: VerboseOption = False,
) -> None:
    """Run one flow (or --all) now: incremental from its state unless --start is given."""
    setup_logging(verbose)
    with user_errors():
        if all_flows == (flow is not None):
            raise UserError("give a FLOW name or --all", EXIT_USAGE)
        if all_flows and node:
            raise UserError("--node needs a FLOW name (not --all)", EXIT_USAGE)
        here = in_process(direct, prefect)
        cfg = load(config)
        names = list(cfg.flows) if all_flows else [flow or ""]
        _run_flows(
            config,
            names,
            start=moment(start, "--start"),
            end=moment(end, "--end"),
            backfill=False,
            direct=here,
            config=cfg,  # read once: a flows.yaml may name 10,000 tags
            nodes=node,
        )


@app.command()
def backfill(
    flow: Annotated[str, typer.Argument(help="Flow name in flows.yaml.")],
    start: Annotated[str, typer.Option(help=f"Start ({TIMES}).")],
    end: Annotated[str | None, typer.Option(help=f"End ({TIMES}). Default: now - settle.")] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
    direct: DirectOption = False,
    prefect: PrefectOption = False,
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
    setup_logging(verbose)
    with user_errors():
        here = in_process(direct, prefect)
        if shards is not None or per_node or pool is not None:
            from pipelines.cli.fleet import sharded_backfill

            begin = moment(start, "--start")
            assert begin is not None  # --start is required
            sharded_backfill(
                config,
                flow,
                start=begin,
                end=moment(end, "--end"),
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
            start=moment(start, "--start"),
            end=moment(end, "--end"),
            backfill=True,
            direct=here,
            nodes=node,
        )
