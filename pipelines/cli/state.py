"""`historian state`, `state reset` and `state repair`: what each flow holds, in plain
words, and forgetting some of it so that the next run fetches it again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from connectors.errors import quoted
from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_FAILED,
    EXIT_USAGE,
    ConfigOption,
    NodeOption,
    UserError,
    check_flow,
    load,
    out,
    state_app,
    user_errors,
)

if TYPE_CHECKING:
    from pipelines.config.destinations import SinkSet
    from pipelines.config.models import Config, FlowConfig
    from sinks.base import ChunkRecord, Progress, Sink

# Chunk records read to find progress recorded past what was settled when it was written.
_REPAIR_SCAN = 1_000_000

LEGEND = (
    "complete up to: every {noun} is extracted from the flow's start up to this time (the "
    "watermark; the next run continues there). per {noun}: the {noun} furthest behind .. "
    "furthest ahead."
)


def _time(moment: datetime | None, seconds: bool = False) -> str:
    if moment is None:
        return "-"
    return moment.strftime("%Y-%m-%d %H:%M:%SZ" if seconds else "%Y-%m-%d %H:%MZ")


def _noun(config: Config, flow: str) -> str:
    from pipelines.core.kinds import kind_of

    return kind_of(config.flows[flow].kind).selection_noun


def _open(sinks: SinkSet, name: str) -> tuple[Sink | None, str | None]:
    """The sink, or (None, the one-line reason) when another process holds its DuckDB file:
    `state` shows the other sinks rather than failing."""
    from pipelines.cli.busy import busy_line
    from sinks.base import SinkError

    try:
        return sinks.get(name), None
    except SinkError as exc:
        busy = busy_line(exc)
        if busy is None:
            raise
        return None, busy


@state_app.callback(invoke_without_command=True)
def state_show(
    ctx: typer.Context,
    flow: Annotated[str | None, typer.Option("--flow", "-f", help="Only this flow.")] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
    chunks: Annotated[int, typer.Option(help="Recent chunks to list per flow and sink.")] = 5,
    node: NodeOption = None,
) -> None:
    """How far each flow is extracted in each sink, its most recent chunks (oldest window
    first, with rows fetched and committed and when), windows the node left a tag out of,
    and progress marked complete past now - settle. A flow on several nodes has a line
    per node (`flow@node`); --node shows only those. Works while a run writes: a DuckDB
    warehouse held by the run is shown as busy, the other sinks as usual; a sink that
    cannot be read shows its error in its rows (the command then exits 1)."""
    if ctx.invoked_subcommand is not None:
        return
    with user_errors():
        from pipelines.cli.flows import unreadable_line
        from pipelines.config.destinations import SinkSet

        cfg = load(config)
        if flow is not None:
            check_flow(cfg, flow, config)
        elif node:
            raise UserError("--node needs --flow", EXIT_USAGE)
        names = [flow] if flow else list(cfg.flows)
        units = [(name, key) for name in names for _, key in cfg.flow_units(name, node)]
        shown = [(name, key, sink) for name, key in units for sink in cfg.flows[name].sinks]
        with SinkSet(cfg, config.resolve().parent, patient=False) as sinks:
            view = _StateView(cfg, sinks, chunks)
            for name, key, sink_name in shown:
                view.add(name, key, sink_name)
            out.print(view.table)
            out.print(LEGEND.format(noun="tag"), highlight=False, soft_wrap=True)
            for line in view.warnings:
                out.print(line, highlight=False, soft_wrap=True)
            mismatches = _print_logs(cfg, view.logs)
            from pipelines.cli.fleet import print_last_backfills

            print_last_backfills(names)
            if view.unreadable:
                raise UserError(unreadable_line(list(dict.fromkeys(view.unreadable))))
            if mismatches:
                raise UserError(f"{mismatches} chunks committed a different row count than fetched")


class _StateView:
    """The rows, chunk logs and warnings of `historian state`, a (flow, sink) at a time; a
    sink's error is that row's, and the flow is remembered as unreadable."""

    def __init__(self, cfg: Config, sinks: SinkSet, chunks: int) -> None:
        self.cfg = cfg
        self.sinks = sinks
        self.chunks = chunks
        self.now = datetime.now(UTC)
        self.table = Table(title="historian state", title_justify="left")
        for column in ("flow", "sink", "tags", "complete up to", "per tag (behind .. ahead)"):
            self.table.add_column(column)
        self.logs: list[tuple[str, str, list[ChunkRecord]]] = []
        self.warnings: list[str] = []
        self.unreadable: list[str] = []

    def add(self, name: str, key: str, sink_name: str) -> None:
        from pipelines.cli.flows import sink_error_cell
        from sinks.base import SinkError

        try:
            sink, busy = _open(self.sinks, sink_name)
            if sink is not None:
                self._add_read(name, key, sink_name, sink)
                return
            cell = f"[yellow]{busy}[/]"
        except SinkError as exc:
            self.unreadable.append(name)
            cell = sink_error_cell(exc)
        self.table.add_row(key, sink_name, "-", "-", cell)

    def _add_read(self, name: str, key: str, sink_name: str, sink: Sink) -> None:
        fc = self.cfg.flows[name]
        progress = sink.progress(key)
        records = sorted(sink.chunk_log(key, self.chunks), key=lambda r: r.window.start)
        self.warnings += _warnings(
            sink,
            key,
            progress,
            fc.settle,
            where=f"{key} -> {sink_name}",
            repair=_command_args(name, key),
            now=self.now,
        )
        self.table.add_row(key, sink_name, *_progress_cells(fc, progress))
        self.logs.append((key, sink_name, records))


def _progress_cells(fc: FlowConfig, progress: Progress) -> tuple[str, str, str]:
    """A state row's tags (or alarm selections), complete up to, and the span per tag."""
    from pipelines.core.kinds import kind_of
    from pipelines.state import flow_watermark, stored_watermark, tag_members

    members = tag_members(progress)
    marks = [flow_watermark(progress, [m], fc.start) for m in members]
    overall = stored_watermark(progress, fc.start)
    ends = [m for m in marks if m is not None]
    span = f"{_time(min(ends))} .. {_time(max(ends))}" if ends else "-"
    count = str(len(members))
    kind = kind_of(fc.kind)
    if not kind.by_tag:
        count = f"{len(members)} {kind.selection_noun}" + ("s" * (len(members) != 1))
    return count, _time(overall, True), span


def _warnings(
    sink: Sink,
    key: str,
    progress: Progress,
    settle: timedelta,
    *,
    where: str,
    repair: str,
    now: datetime,
) -> list[str]:
    """A line for progress marked complete past what the node could have had (with the
    `state repair` arguments that forget it), one per tag the node left out of some
    windows, and one per tag held behind a link (pipelines/core/holds.py)."""
    from pipelines.state import held_windows, missing_windows

    lines: list[str] = []
    poisoned = poisoned_from(sink, key, settle, now)
    if poisoned is not None:
        lines.append(
            f"[red]POISONED[/] {where}: marked complete past what the node "
            f"could have had (from {_time(poisoned, True)}); "
            f"repair: historian state repair {repair}"
        )
    for tag, windows in missing_windows(progress).items():
        shown = ", ".join(str(w) for w in windows[:3])
        more = f" (+{len(windows) - 3} more)" if len(windows) > 3 else ""
        lines.append(
            f"[yellow]MISSING[/] {where}: tag {tag!r} left out of the node's "
            f"answers in {shown}{more}"
        )
    for tag, (link, windows) in held_windows(progress).items():
        shown = ", ".join(str(w) for w in windows[:3])
        more = f" (+{len(windows) - 3} more)" if len(windows) > 3 else ""
        lines.append(
            f"[yellow]HELD[/] {where}: tag {tag!r} behind link {link!r} (held since "
            f"{_time(windows[0].start, True)}; not complete until the link is back and "
            f"drained, missing after hold_max) in {shown}{more}"
        )
    return lines


def _print_logs(cfg: Config, logs: list[tuple[str, str, list[ChunkRecord]]]) -> int:
    """The chunks committed last per (flow or flow@node, sink); returns the mismatches."""
    mismatches = 0
    for key, sink_name, records in logs:
        if not records:
            continue
        noun = _noun(cfg, key.split("@", 1)[0])
        out.print(
            f"[bold]{key}[/] -> {sink_name}: the {len(records)} chunks committed last, "
            "oldest window first"
        )
        for record in records:
            fetched = record.rows_fetched
            committed = record.rows_committed
            flag = "" if fetched == committed else "  [red]MISMATCH[/]"
            mismatches += fetched != committed
            plural = "s" if record.members != 1 else ""
            out.print(
                f"  {record.window}  {record.members} {noun}{plural}"
                f"  {fetched:,} rows fetched, {committed:,} committed"
                f"  at {_time(record.committed_at, True)}{flag}",
                highlight=False,
            )
    return mismatches


def poisoned_from(sink: Sink, flow: str, settle: timedelta, now: datetime) -> datetime | None:
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
    node: NodeOption = None,
) -> None:
    """Forget progress marked complete past what the node could have had (a backfill to a
    future end, before ends were cut at now - settle); the next run fetches it. Data stays."""
    with user_errors():
        from pipelines.config.destinations import SinkSet

        cfg = load(config)
        check_flow(cfg, flow, config)
        settle = cfg.flows[flow].settle
        now = datetime.now(UTC)
        repaired = 0
        with SinkSet(cfg, config.resolve().parent, patient=False) as sinks:
            for (_, key), sink_name in product(cfg.flow_units(flow, node), cfg.flows[flow].sinks):
                sink = sinks.get(sink_name)
                with sink.lock(key):
                    moment = poisoned_from(sink, key, settle, now)
                    if moment is None:
                        continue
                    removed = sink.forget_after(key, moment)
                    repaired += 1
                out.print(
                    f"repaired {key} in {sink_name}: progress after "
                    f"{_time(moment, True)} forgotten ({removed} entries); the next run "
                    "fetches it again",
                    highlight=False,
                )
        if not repaired:
            out.print(f"{flow}: nothing to repair", highlight=False)


def _known_members(cfg: Config, flow: str, keys: list[str], sinks: SinkSet) -> set[str]:
    """The tags (or alarm selection) a flow has extracted in any of its sinks (under the
    state keys `keys`), and the paths it names explicitly."""
    from pipelines.config.models import AlarmHistoryFlow
    from pipelines.state import tag_members

    fc = cfg.flows[flow]
    known: set[str] = set()
    if isinstance(fc, AlarmHistoryFlow):
        known.add(fc.alarms.path)
    elif fc.tags.paths:
        known.update(fc.tags.paths)
    for key, sink_name in product(keys, fc.sinks):
        known.update(tag_members(sinks.get(sink_name).progress(key)))
    return known


def _command_args(flow: str, key: str) -> str:
    """`flow`, or `flow --node N` for one node of a fleet flow (key `flow@N`)."""
    return flow if key == flow else f"{flow} --node {key.split('@', 1)[1]}"


@state_app.command("reset")
def state_reset(
    flow: Annotated[str, typer.Argument(help="Flow whose progress to forget.")],
    tag: Annotated[
        str | None,
        typer.Option("--tag", help="Only this tag (full path) or alarm selection (its path)."),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    config: ConfigOption = Path(DEFAULT_CONFIG),
    node: NodeOption = None,
) -> None:
    """Forget a flow's (or one tag's) progress: the next run or backfill extracts it again
    from `start` (with --tag: that tag only; with --node: on that node only, for a flow on
    several nodes). The data stays until it is re-extracted."""
    with user_errors():
        from pipelines.config.destinations import SinkSet
        from pipelines.state import held_members, missing_member

        cfg = load(config)
        check_flow(cfg, flow, config)
        keys = [key for _, key in cfg.flow_units(flow, node)]
        what = f"tag {tag!r} of flow {flow!r}" if tag else f"flow {flow!r}"
        if node:
            what += f" on node{'s' * (len(keys) > 1)} {', '.join(sorted(set(node)))}"
        with SinkSet(cfg, config.resolve().parent, patient=False) as sinks:
            if tag is not None and tag not in _known_members(cfg, flow, keys, sinks):
                raise UserError(
                    f"--tag: {quoted(tag)} is not a tag of flow {quoted(flow)} "
                    "(give its full path, as `historian state` and the data show it)",
                    EXIT_USAGE,
                )
            if not yes and not typer.confirm(
                f"Forget the progress of {what} in {', '.join(cfg.flows[flow].sinks)}?"
            ):
                raise UserError("nothing reset", EXIT_FAILED)
            removed = 0
            for key, sink_name in product(keys, cfg.flows[flow].sinks):
                sink = sinks.get(sink_name)
                with sink.lock(key):
                    removed += sink.reset(key, tag)
                    if tag is not None:
                        sink.reset(key, missing_member(tag))
                        for member in held_members(sink.progress(key), tag):
                            sink.reset(key, member)
        out.print(f"reset {what}: {removed} progress entries removed", highlight=False)
