"""`historian verify FLOW`: every committed chunk checked against what its sinks still hold.

Progress says what was committed; a file removed or cut short by hand, rows deleted or a
table dropped after the commit leave progress claiming rows that are gone, and the next
run skips them. Each sink checks its own chunks (`sinks.base.Verifies`: the lake by
footers, a warehouse by one COUNT per dataset, Delta and Iceberg by their logs' files
and rows per window); `--repair` moves unreadable files aside
and forgets the damaged chunks, so the next run fetches exactly those again.
"""

from __future__ import annotations

from datetime import UTC, datetime
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
    load,
    moment,
    out,
    user_errors,
)

if TYPE_CHECKING:
    from connectors.timewindow import Window
    from pipelines.config.destinations import SinkSet
    from sinks.base import Verified

# Bounds of an open --start or --end (a Window is finite).
_FIRST = datetime(1970, 1, 1, tzinfo=UTC)
_LAST = datetime(9999, 1, 1, tzinfo=UTC)


@app.command()
def verify(
    flow: Annotated[str, typer.Argument(help="Flow whose committed chunks to check.")],
    config: ConfigOption = Path(DEFAULT_CONFIG),
    node: NodeOption = None,
    start: Annotated[
        str | None, typer.Option(help="Only chunks ending after this (ISO 8601 or -7d).")
    ] = None,
    end: Annotated[
        str | None, typer.Option(help="Only chunks starting before this (ISO 8601 or -1h).")
    ] = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Move unreadable files aside (to _quarantine/ beside the dataset, never "
            "deleted) and forget the damaged chunks: the next run fetches exactly them again.",
        ),
    ] = False,
) -> None:
    """Check every committed chunk of a flow against what each sink holds: files present
    and readable, rows as recorded. Prints each damage with its file or table and window
    and exits 1; exits 0 with one line when all is there (or, with --repair, when every
    damage found was repaired)."""
    with user_errors():
        from pipelines.config.destinations import SinkSet

        cfg = load(config)
        check_flow(cfg, flow, config)
        window = _window(start, end)
        damaged = repaired = checked = 0
        unchecked: list[str] = []
        with SinkSet(cfg, config.resolve().parent, patient=False) as sinks:
            for node_name, key in cfg.flow_units(flow, node):
                for sink_name in cfg.flows[flow].sinks:
                    found = _verify(sinks, sink_name, key, node_name, window, repair)
                    if found is None:
                        unchecked.append(sink_name)
                        continue
                    _print(found, key, sink_name)
                    checked += found.chunks
                    damaged += len(found.damages)
                    repaired += found.forgotten
        _conclude(flow, checked, damaged, repaired, repair)
        if unchecked:
            names = ", ".join(dict.fromkeys(unchecked))
            raise UserError(f"not verified: sink {names} cannot check its chunks yet")


def _window(start: str | None, end: str | None) -> Window | None:
    """The chunks to check: those overlapping [--start, --end); None: all."""
    from connectors.timewindow import Window

    since, until = moment(start, "--start"), moment(end, "--end")
    if since is None and until is None:
        return None
    if since is not None and until is not None and until <= since:
        raise UserError("--end must be after --start", EXIT_USAGE)
    return Window(since or _FIRST, until or _LAST)


def _verify(
    sinks: SinkSet, sink_name: str, key: str, node: str, window: Window | None, repair: bool
) -> Verified | None:
    """One sink's check of one unit (flow, node), None when the sink cannot check; under
    the unit's lock when repairing, so no run of it writes meanwhile."""
    from sinks.base import Verifies

    sink = sinks.get(sink_name)
    if not isinstance(sink, Verifies):
        return None
    if not repair:
        return sink.verify(key, node, window)
    with sink.lock(key):
        return sink.verify(key, node, window, repair=True)


def _print(found: Verified, key: str, sink_name: str) -> None:
    for damage in found.damages:
        count = len(damage.chunks)
        out.print(
            f"DAMAGED {key} -> {sink_name}: {damage.where} {damage.window}: {damage.problem} "
            f"({count} chunk{'s' * (count != 1)})",
            highlight=False,
            soft_wrap=True,
        )
    for source, target in found.quarantined:
        out.print(f"moved {source} to {target}", highlight=False, soft_wrap=True)
    if found.forgotten:
        out.print(
            f"forgot {found.forgotten} chunks of {key} in {sink_name}: the next run fetches "
            "them again",
            highlight=False,
            soft_wrap=True,
        )


def _conclude(flow: str, checked: int, damaged: int, repaired: int, repair: bool) -> None:
    """The summary line; exit 1 while damage stays unrepaired."""
    if not damaged:
        held = "every one holds its rows" if checked else "nothing committed to check"
        out.print(f"verified {checked:,} chunks of {flow}: {held}")
        return
    if repair:
        out.print(
            f"repaired {damaged} damages in {checked:,} chunks of {flow}: {repaired} chunks "
            f"forgotten; run `historian run {flow}` (or backfill) to fetch them again",
            highlight=False,
        )
        return
    raise UserError(
        f"{damaged} damages in {checked:,} committed chunks of {flow} (above); "
        f"`historian verify {flow} --repair` forgets them so that the next run fetches them again"
    )
