"""`historian plan FLOW`: what a run would do, without doing it.

It resolves the flow's tags on the node, reads each sink's progress and plans the chunks
exactly as a run does (`FlowRun.plan`), through sinks that only read: no lock, no tag
metadata, no data, no folder or file created. Estimated rows come from the same raw
density probes that size `window: auto`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from connectors.errors import quoted
from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_USAGE,
    ConfigOption,
    NodeOption,
    UserError,
    app,
    check_flow,
    load,
    moment,
    out,
    user_errors,
)
from pipelines.cli.flows import describe_selection, stored_progress

if TYPE_CHECKING:
    from connectors.schema import Rows
    from connectors.timewindow import Window
    from pipelines.config.models import Config, FlowConfig
    from pipelines.core.runner import FlowRun, Plan
    from sinks.base import Progress

# Tags shown by name, windows listed one per line.
SAMPLE_TAGS = 5
LISTED_WINDOWS = 12


class _ReadOnlySink:
    """A sink as planning sees it: its stored progress, and nothing written."""

    write_concurrency = 1

    def __init__(self, name: str, progress: Progress) -> None:
        self.name = name
        self._progress = progress

    def progress(self, flow: str) -> Progress:
        return self._progress

    def write_metadata(self, rows: Rows) -> int:
        return 0  # a plan writes nothing

    def describe(self) -> str:
        return self.name


class _PlanSinks:
    """What `FlowRun` asks of a SinkSet: sinks by name (read-only ones here)."""

    def __init__(self, sinks: dict[str, _ReadOnlySink]) -> None:
        self._sinks = sinks

    def get(self, name: str) -> _ReadOnlySink:
        return self._sinks[name]


def _time(value: datetime) -> str:
    from connectors.timewindow import iso_utc

    return iso_utc(value)


def _estimate(run: FlowRun, plan: Plan) -> tuple[float, str]:
    """Rows the pending chunks would bring, and how that was worked out."""
    from pipelines.config.models import AlarmHistoryFlow

    hours = sum(
        (chunk.window.end - chunk.window.start) / timedelta(hours=1) * len(chunk.members)
        for chunk in plan.pending
    )
    flow = run.flow_config
    if plan.span is None or not plan.pending:
        return 0.0, "nothing to fetch"
    if isinstance(flow, AlarmHistoryFlow):
        # The probe a run sizes its windows with.
        per_hour = run.probe_alarm_density(flow, plan.span)
        return per_hour * hours, f"about {per_hour:,.1f} alarm events per hour, probed"
    if flow.mode == "aggregated" and flow.interval is not None:
        per_hour = timedelta(hours=1) / flow.interval
        return per_hour * hours, f"{per_hour:,.0f} rows per tag and hour ({flow.method})"
    per_hour = run.probe_density(flow, plan.members, plan.span)
    how = f"about {per_hour:,.0f} samples per tag and hour, probed at both ends of the span"
    if flow.mode != "raw":
        how += f" (raw; {flow.mode} returns fewer)"
    return per_hour * hours, how


@app.command()
def plan(
    flow: Annotated[str, typer.Argument(help="Flow name in flows.yaml.")],
    start: Annotated[
        str | None,
        typer.Option(help="Plan a backfill from here (ISO 8601 or -30d). Default: from state."),
    ] = None,
    end: Annotated[
        str | None, typer.Option(help="Until (ISO 8601 or relative, -1h). Default: now - settle.")
    ] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
    node: NodeOption = None,
) -> None:
    """Dry run: the tags resolved, the windows, batches and chunks a run (or, with
    --start, a backfill) would fetch, the chunks already done and the rows to expect;
    for a flow on several nodes, per node (--node: only those). Writes nothing."""
    with user_errors():
        from pipelines.config.nodes import NodePool
        from pipelines.core.runner import FlowRun, RunRequest

        cfg = load(config)
        check_flow(cfg, flow, config)
        since, until = moment(start, "--start"), moment(end, "--end")
        if since is not None and until is not None and until <= since:
            raise UserError("--end must be after --start", EXIT_USAGE)
        base = config.resolve().parent
        units = cfg.flow_units(flow, node)
        stored: dict[str, dict[str, _ReadOnlySink]] = {}
        from pipelines.config.destinations import SinkSet

        with SinkSet(cfg, base, patient=False) as opened:
            for _, key in units:
                stored[key] = {}
                for sink_name, found in stored_progress(cfg, flow, opened, base, key).items():
                    if isinstance(found, str):
                        raise UserError(f"plan {key}: sink {sink_name}: {found}")
                    stored[key][sink_name] = _ReadOnlySink(sink_name, found)
        request = RunRequest(start=since, end=until, backfill=since is not None)
        with NodePool(cfg) as nodes:
            for node_name, key in units:
                sinks = _PlanSinks(stored[key])
                run = FlowRun(cfg, flow, nodes=nodes, sinks=sinks, request=request, node=node_name)  # type: ignore[arg-type]
                planned = run.plan()
                rows, how = _estimate(run, planned)
                notes = list(run.summary.notes)
                _print_plan(cfg, flow, run, planned, rows, how, notes, backfill=since is not None)


def _print_plan(
    cfg: Config,
    flow: str,
    run: FlowRun,
    planned: Plan,
    rows: float,
    how: str,
    notes: list[str],
    *,
    backfill: bool,
) -> None:
    """One unit's plan: the command it stands for, the members, the watermark, the span,
    the chunks to fetch and the rows to expect, then the first windows and the notes."""
    from pipelines.core.kinds import kind_of

    fc = cfg.flows[flow]
    only = f" --node {run.node_name}" if fc.fleet else ""
    doing = f"historian backfill {flow}{only}" if backfill else f"historian run {flow}{only}"
    out.print(f"plan of {run.key}: what `{doing}` would do; nothing was written", highlight=False)
    kind = kind_of(fc.kind)
    noun = "tags" if kind.by_tag else kind.selection_noun
    sample = ", ".join(quoted(m) for m in planned.members[:SAMPLE_TAGS])
    more = (
        f" (+{len(planned.members) - SAMPLE_TAGS} more)"
        if len(planned.members) > SAMPLE_TAGS
        else ""
    )
    out.print(
        f"  {noun}: {len(planned.members)} on node {run.node_name} ({describe_selection(fc)}): "
        f"{sample}{more}",
        highlight=False,
        soft_wrap=True,
    )
    mark = planned.watermark_before
    out.print(
        f"  watermark: {_time(mark) if mark else '- (nothing extracted yet: from start)'}",
        highlight=False,
    )
    if planned.span is None:
        out.print("  span: nothing to fetch (up to date)", highlight=False)
        return
    _print_span(fc, planned, planned.span)
    out.print(
        f"  chunks: {planned.chunks_planned} planned, {run.summary.chunks_skipped} already done "
        f"in every sink, {len(planned.pending)} to fetch",
        highlight=False,
    )
    out.print(f"  estimated rows: ~{rows:,.0f} ({how})", highlight=False)
    _print_windows(planned, alarms=not kind.by_tag)
    for note in notes:
        out.print(f"  note: {note}", highlight=False, soft_wrap=True)


def _print_span(fc: FlowConfig, planned: Plan, span: Window) -> None:
    """The span, its window size and how many windows (and tag batches in each)."""
    from pipelines.config.models import AlarmHistoryFlow
    from pipelines.planning import plan_windows, short_duration

    windows = len(plan_windows(span, planned.window_size))
    size = short_duration(planned.window_size) + (" auto" if fc.window == "auto" else "")
    batches = planned.chunks_planned // max(1, windows)
    per_window = (
        ""
        if isinstance(fc, AlarmHistoryFlow)
        else f" x {batches} batch{'es' if batches != 1 else ''} (up to {fc.batch} tags each)"
    )
    out.print(
        f"  span: [{_time(span.start)}, {_time(span.end)}), window {size}: "
        f"{windows} window{'s' if windows != 1 else ''}{per_window}",
        highlight=False,
    )


def _print_windows(planned: Plan, *, alarms: bool) -> None:
    """The first windows still to fetch, a line each: their chunks (and tags)."""
    by_window: dict[Window, list[int]] = {}
    for chunk in planned.pending:
        by_window.setdefault(chunk.window, []).append(len(chunk.members))
    listed = sorted(by_window.items())
    for window, members in listed[:LISTED_WINDOWS]:
        tags = "" if alarms else f", {sum(members)} tag{'s' if sum(members) != 1 else ''}"
        out.print(
            f"    {window}  {len(members)} chunk{'s' if len(members) != 1 else ''}{tags}",
            highlight=False,
        )
    if len(listed) > LISTED_WINDOWS:
        out.print(f"    ... {len(listed) - LISTED_WINDOWS} more windows", highlight=False)
