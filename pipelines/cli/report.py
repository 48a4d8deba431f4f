"""`historian report FLOW`: a flow's coverage and value trend as one HTML page
(pipelines/report/ draws it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_USAGE,
    ConfigOption,
    UserError,
    app,
    check_flow,
    err,
    load,
    moment,
    naming_flow,
    out,
    user_errors,
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

        cfg = load(config)
        check_flow(cfg, flow, config)
        since, until = moment(start, "--start"), moment(end, "--end")
        if since is not None and until is not None and until <= since:
            raise UserError("--end must be after --start", EXIT_USAGE)
        try:
            size = parse_duration(bucket) if bucket is not None else None
        except ValueError as exc:
            raise UserError(f"--bucket: {exc}", EXIT_USAGE) from None
        target = out_path or Path(f"{flow}-report.html")
        with SinkSet(cfg, config.resolve().parent, patient=False) as sinks, naming_flow(flow):
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
