"""The table `run`, `backfill` and `run --all` end with: a row and a status per flow,
where the data went, and commands that read it back as printed."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from pipelines.cli.base import out

if TYPE_CHECKING:
    from pipelines.config.models import Config
    from pipelines.core.runner import RunSummary


@dataclass
class FlowOutcome:
    """One flow of a command: its summary (None when it failed before planning) and the
    one-line reason it failed, if it did."""

    flow: str
    summary: RunSummary | None
    failure: str | None = None


def print_outcomes(
    config: Config, config_path: Path, outcomes: Sequence[FlowOutcome], *, title: str
) -> None:
    """The summary table (with a status column when a flow failed or several ran), then
    remarks, destinations, the failures' reasons and how to read the data back."""
    if not outcomes:
        return
    with_status = len(outcomes) > 1 or any(
        o.failure or (o.summary and o.summary.units) for o in outcomes
    )
    out.print(_table(outcomes, title, with_status=with_status))
    summaries = [o.summary for o in outcomes if o.summary is not None]
    _print_remarks(outcomes, summaries)
    _print_destinations(config, summaries)
    base = config_path.resolve().parent
    hints = read_hints(config, base, [s for s in summaries if s.chunks_done or s.chunks_skipped])
    if hints:
        out.print("Read it back:")
        for hint in hints:
            out.print(f"  {hint}", highlight=False, soft_wrap=True)


def _print_remarks(outcomes: Sequence[FlowOutcome], summaries: Sequence[RunSummary]) -> None:
    """What each run must tell beyond its counts, then which flows failed and why (one
    flow's reason is the command's error line itself)."""
    for s in summaries:
        for remark in s.remarks:
            out.print(f"  [yellow]{s.flow}:[/] {remark}", highlight=False, soft_wrap=True)
    if len(outcomes) > 1:
        for outcome in outcomes:
            if outcome.failure:
                out.print(f"  [red]failed[/] {outcome.failure}", highlight=False, soft_wrap=True)


def _print_destinations(config: Config, summaries: Sequence[RunSummary]) -> None:
    """Where each flow that committed something wrote it: a line per (sink, dataset)."""
    shown: set[tuple[str, str]] = set()
    for s in summaries:
        flow = config.flows.get(s.flow)
        if flow is None or not s.chunks_done:
            continue
        for sink_name in flow.sinks:
            where = s.sinks.get(sink_name)
            if where and (sink_name, s.dataset) not in shown:
                shown.add((sink_name, s.dataset))
                out.print(f"  {s.flow} -> {sink_name}: {where}", highlight=False)


def _table(outcomes: Sequence[FlowOutcome], title: str, *, with_status: bool) -> Table:
    """A row per flow (and per node under a fleet flow's), with a status when asked."""
    table = Table(title=title, show_lines=False, title_justify="left")
    columns = ["flow", "rows", "chunks", "window", "skipped", "seconds", "rows/s", "tags"]
    columns += ["watermark"] + (["status"] if with_status else [])
    for column in columns:
        left = column in ("flow", "window", "watermark", "status")
        table.add_column(column, justify="left" if left else "right")
    for outcome in outcomes:
        s = outcome.summary
        status = _status(not outcome.failure) if with_status else []
        if s is None:
            table.add_row(outcome.flow, *(["-"] * 8), *status)
            continue
        table.add_row(s.flow, *_cells(s), *status)
        for unit in s.units:  # a fleet flow: one row per node under its totals
            failed = _status(not unit.error) if with_status else []
            table.add_row(f"  {unit.key}", *_cells(unit), *failed)
    return table


def _status(ok: bool) -> list[str]:
    """The status cell."""
    return ["[green]ok[/]" if ok else "[red]failed[/]"]


def _cells(s: RunSummary) -> list[str]:
    """A summary's cells after the flow's: rows, chunks, window, ..., watermark."""
    mark = s.watermark_after.strftime("%Y-%m-%d %H:%M:%SZ") if s.watermark_after else "-"
    return [
        f"{s.rows:,}",
        f"{s.chunks_done}/{s.chunks_planned}",
        s.window_label,
        f"{s.chunks_skipped}",
        f"{s.seconds:.1f}",
        f"{s.rows_per_second:,.0f}",
        f"{s.tags}",
        mark,
    ]


def _relative(path: str) -> str:
    with suppress(ValueError):
        return str(Path(path).relative_to(Path.cwd()))
    return path


def _literal(text: str) -> str:
    """A Python string literal in double quotes (so the shell line needs no escapes)."""
    return json.dumps(text, ensure_ascii=False)


def python_command(code: str) -> str:
    """`<this interpreter> -c '<code>'`, quoted for a POSIX shell: the interpreter that
    runs `historian` has pandas and duckdb, a bare `python` may not."""
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}"


def read_hints(config: Config, base: Path, summaries: Sequence[RunSummary]) -> list[str]:
    """Commands that print the first flow's data from its lake and DuckDB sinks."""
    from pipelines.config.destinations import _local_path, _sql_url
    from pipelines.config.models import ParquetSinkConfig, SqlSinkConfig
    from pipelines.core.kinds import kind_of

    hints: list[str] = []
    for summary in summaries[:1]:
        dataset = summary.dataset
        flow = config.flows.get(summary.flow)
        if flow is None:
            continue
        key = kind_of(summary.kind).member_column  # alarm tables are keyed by path
        for sink_name in flow.sinks:
            sink = config.sinks[sink_name]
            if isinstance(sink, ParquetSinkConfig):
                root = _relative(_local_path(sink.url, base))
                hints.append(
                    python_command(
                        "import pandas as pd; print(pd.read_parquet("
                        f"{_literal(root + '/' + dataset)}))"
                    )
                )
            elif isinstance(sink, SqlSinkConfig) and sink.url.startswith("duckdb:///"):
                path = _relative(_sql_url(sink.url, base)[len("duckdb:///") :])
                table = f"{sink.schema_}.{dataset}" if sink.schema_ else dataset
                hints.append(
                    python_command(
                        f"import duckdb; duckdb.connect({_literal(path)}, read_only=True).sql("
                        f'"select {key}, count(*) from {table} group by {key} '
                        'order by 2 desc limit 5").show()'
                    )
                )
    return hints
