"""`historian tail FLOW`: a flow's live tail in this process, one line per commit, until
Ctrl-C or SIGTERM (exit 130 or 143, the subscription cancelled first) or `--duration`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_USAGE,
    ConfigOption,
    NodeOption,
    UserError,
    app,
    check_flow,
    current_flow,
    json_progress,
    load,
    log_format,
    out,
    user_errors,
)

if TYPE_CHECKING:
    from pipelines.live.tail import TailCommit, TailSummary


def commit_line(commit: TailCommit) -> str:
    """One line of a commit: what was written, how far behind the node, gaps."""
    lag = "" if commit.lag_s is None else f", {commit.lag_s:.1f} s behind the node"
    line = f"{commit.key}: committed {commit.rows} rows in {len(commit.windows)} windows{lag}"
    if commit.discarded:
        line += f"; the node discarded {commit.discarded} events"
    if commit.gaps_opened:
        line += f"; {len(commit.gaps_opened)} gaps for history"
    if commit.gaps_healed:
        line += f"; {len(commit.gaps_healed)} gaps re-read by history"
    return line


def _print_commit(commit: TailCommit) -> None:
    line = commit_line(commit)
    if log_format.get() == "json":
        json_progress(
            commit.key,
            line,
            {
                "rows": commit.rows,
                "windows": len(commit.windows),
                "events": commit.events,
                "discarded": commit.discarded,
                "lag_s": commit.lag_s,
                "gaps_opened": [str(w) for w in commit.gaps_opened],
                "gaps_healed": [str(w) for w in commit.gaps_healed],
                "gaps_pending": [str(w) for w in commit.gaps_pending],
            },
        )
    else:
        out.print(line, highlight=False, soft_wrap=True)


def _end_line(summary: TailSummary) -> str:
    pending = f", {len(summary.gaps_pending)} gaps left to history" if summary.gaps_pending else ""
    return (
        f"{summary.flow}: tail ended after {summary.seconds:.0f} s: {summary.commits} commits, "
        f"{summary.rows} rows, {len(summary.gaps_healed)} gaps re-read{pending}"
    )


@app.command()
def tail(
    flow: Annotated[str, typer.Argument(help="Flow name in flows.yaml (a tag flow).")],
    node: NodeOption = None,
    duration: Annotated[
        str | None, typer.Option("--duration", help="Stop after this long (e.g. 90s, 1h).")
    ] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
) -> None:
    """Stream a flow's tag changes to its sinks until Ctrl-C (history stays the truth)."""
    with user_errors():
        cfg = load(config)
        check_flow(cfg, flow, config)
        length = None
        if duration is not None:
            from pipelines.planning import parse_duration

            try:
                length = parse_duration(duration)
            except ValueError as exc:
                raise UserError(f"--duration: {exc}", EXIT_USAGE) from None
        from pipelines.live.tail import tail_flow

        current_flow.set(flow)
        summary = tail_flow(
            cfg,
            flow,
            nodes=node,
            stop=threading.Event(),
            duration=length,
            on_commit=_print_commit,
            base=config.resolve().parent,
        )
        out.print(_end_line(summary), highlight=False, soft_wrap=True)
