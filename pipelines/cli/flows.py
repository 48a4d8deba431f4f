"""`historian flows`: every flow of flows.yaml in one table, with how far it is; and
`historian runs`: the run log every `run` and `backfill` appends its outcome to."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.table import Table

from pipelines.cli.base import (
    DEFAULT_CONFIG,
    EXIT_USAGE,
    ConfigOption,
    UserError,
    app,
    load,
    out,
    user_errors,
)

if TYPE_CHECKING:
    from datetime import datetime

    from pipelines.config.destinations import SinkSet
    from pipelines.config.models import Config, FlowConfig
    from sinks.base import Progress


def describe_selection(flow: FlowConfig) -> str:
    """A flow's tag or alarm selection in a few words, as written in flows.yaml."""
    from pipelines.config.models import AlarmHistoryFlow

    if isinstance(flow, AlarmHistoryFlow):
        alarms = flow.alarms
        parts = [f"alarms under {alarms.path}"]
        for key in ("regex", "status", "priority", "min_priority", "max_priority"):
            value = getattr(alarms, key)
            if value is not None:
                parts.append(f"{key} {value}")
        return ", ".join(parts)
    tags = flow.tags
    if tags.paths:
        more = f" (+{len(tags.paths) - 2} more)" if len(tags.paths) > 2 else ""
        return f"{len(tags.paths)} paths: " + ", ".join(tags.paths[:2]) + more
    if tags.group:
        regex = f", regex {tags.regex}" if tags.regex else ""
        return f"group {tags.group}{regex}" + (", recurrent" if tags.recurrent else "")
    parts = [f"browse {tags.browse}"]
    if tags.include:
        parts.append("include " + " ".join(tags.include))
    if tags.exclude:
        parts.append("exclude " + " ".join(tags.exclude))
    return ", ".join(parts)


def describe_nodes(config: Config, name: str) -> str:
    """A flow's node, or its fleet as written and how many nodes that is."""
    flow = config.flows[name]
    if not flow.fleet:
        return str(flow.node)
    written = flow.node if isinstance(flow.node, str) else ", ".join(flow.node)
    count = len(config.flow_nodes(name))
    return f"{written} ({count} node{'s' * (count != 1)})"


def describe_mode(flow: FlowConfig) -> str:
    """A tag flow's mode (an aggregated one's method and interval); `-` for an alarm flow."""
    from pipelines.config.models import AlarmHistoryFlow

    if isinstance(flow, AlarmHistoryFlow):
        return "-"
    if flow.mode == "aggregated":
        from pipelines.planning import short_duration

        every = f" {short_duration(flow.interval)}" if flow.interval else ""
        return f"aggregated {flow.method or ''}{every}".replace("  ", " ")
    return flow.mode


def describe_schedule(flow: FlowConfig) -> str:
    schedule = flow.schedule
    if schedule is None:
        return "-"
    if schedule.cron:
        text = f"cron {schedule.cron}"
    elif schedule.interval is not None:
        from pipelines.planning import short_duration

        text = f"every {short_duration(schedule.interval)}"
    else:
        return "-"
    return text + (f" ({schedule.timezone})" if schedule.timezone != "UTC" else "")


def exists(config: Config, sink_name: str, base: Path) -> bool:
    """False for a local lake folder or DuckDB file that is not there yet: reading its
    progress would create it, and a listing or a plan writes nothing."""
    from pipelines.config.destinations import _local_path, _sql_url
    from pipelines.config.models import ParquetSinkConfig

    sink = config.sinks[sink_name]
    if isinstance(sink, ParquetSinkConfig):
        return "://" in sink.url or Path(_local_path(sink.url, base)).exists()
    if sink.url.startswith("duckdb:///"):
        path = _sql_url(sink.url, base)[len("duckdb:///") :]
        return path.startswith(":memory:") or Path(path).exists()
    return True


def stored_progress(
    config: Config, name: str, sinks: SinkSet, base: Path, key: str | None = None
) -> dict[str, Progress | str]:
    """Per sink of the flow: its progress (of the state key `key`: one node of a fleet
    flow; the flow's name by default), or why there is none to read (not created yet, or
    a DuckDB file another process holds, as its busy line)."""
    key = key or name
    from pipelines.cli.busy import busy_line
    from sinks.base import Progress, SinkError

    found: dict[str, Progress | str] = {}
    for sink_name in config.flows[name].sinks:
        if not exists(config, sink_name, base):
            found[sink_name] = Progress(key)
            continue
        try:
            found[sink_name] = sinks.get(sink_name).progress(key)
        except SinkError as exc:
            busy = busy_line(exc)
            if busy is None:
                raise
            found[sink_name] = busy
    return found


def lowest_watermark(config: Config, name: str, sinks: SinkSet, base: Path) -> datetime | None:
    """Where the flow's next run starts: the lowest watermark over its sinks and nodes
    (sinks that another process holds are left out); None when one has nothing yet."""
    from pipelines.state import flow_watermark, tag_members

    flow = config.flows[name]
    marks: list[datetime | None] = []
    found = [
        progress
        for _, key in config.flow_units(name)
        for progress in stored_progress(config, name, sinks, base, key).values()
    ]
    for progress in found:
        if isinstance(progress, str):
            continue
        members = tag_members(progress)
        marks.append(flow_watermark(progress, members, flow.start) if members else None)
    if not marks or any(mark is None for mark in marks):
        return None
    return min(mark for mark in marks if mark is not None)


def unreadable_line(flows: list[str]) -> str:
    """The error line of a listing whose rows show a sink's error for `flows`."""
    plural = "s" * (len(flows) != 1)
    return f"cannot read the sinks of flow{plural} {', '.join(flows)} (the rows say why)"


def sink_error_cell(exc: Exception) -> str:
    """A sink's error as a table cell: one line, long values cut, no rich markup."""
    from rich.markup import escape

    from connectors.errors import one_line

    return f"[red]{escape(one_line(exc))}[/]"


def print_selection(cfg: Config, config_path: Path, name: str) -> None:
    """What flow `name`'s selection resolves to on its nodes now: a tag path per line on
    stdout (`node<TAB>path` for a flow on several nodes), the counts on stderr."""
    from rich.markup import escape

    from pipelines.cli.base import check_flow, err
    from pipelines.config.models import AlarmHistoryFlow
    from pipelines.config.nodes import NodePool
    from pipelines.selection import resolve_tags

    check_flow(cfg, name, config_path)
    flow = cfg.flows[name]
    if isinstance(flow, AlarmHistoryFlow):
        raise UserError(f"flows.{name}: an alarm flow selects alarms, not tags", EXIT_USAGE)
    assert flow.tags is not None
    with NodePool(cfg) as nodes:
        for node in cfg.flow_nodes(name):
            resolved = resolve_tags(
                nodes.get(node).client, node, flow.tags, where=f"flows.{name}.tags"
            )
            prefix = f"{node}\t" if flow.fleet else ""
            for member in resolved.members:
                out.print(escape(prefix + member), highlight=False, soft_wrap=True)
            err.print(f"flow {name} on node {node}: {len(resolved.members)} tags", highlight=False)


@app.command("flows")
def flows_command(
    config: ConfigOption = Path(DEFAULT_CONFIG),
    tags: Annotated[
        str | None,
        typer.Option(
            "--tags", metavar="FLOW", help="The tags FLOW's selection resolves to on its nodes now."
        ),
    ] = None,
) -> None:
    """List every flow: node, kind, tag or alarm selection, mode, sinks, schedule and
    watermark (where its next run starts; `-`: nothing extracted yet). A flow whose sink
    cannot be read shows that sink's error in its row; the command then exits 1. With
    --tags FLOW: the tag paths FLOW's selection resolves to today, one per line."""
    with user_errors():
        if tags is not None:
            print_selection(load(config), config, tags)
            return
        from pipelines.config.destinations import SinkSet
        from sinks.base import SinkError

        cfg = load(config)
        table = Table(title=f"flows in {config}", title_justify="left")
        for column in ("flow", "node", "kind", "selection", "mode", "sinks", "schedule"):
            table.add_column(column)
        table.add_column("watermark")
        unreadable: list[str] = []
        with SinkSet(cfg, config.resolve().parent, patient=False) as sinks:
            for name, flow in cfg.flows.items():
                try:
                    mark = lowest_watermark(cfg, name, sinks, config.resolve().parent)
                    watermark = mark.strftime("%Y-%m-%d %H:%M:%SZ") if mark else "-"
                except SinkError as exc:
                    unreadable.append(name)
                    watermark = sink_error_cell(exc)
                table.add_row(
                    name,
                    describe_nodes(cfg, name),
                    flow.kind,
                    describe_selection(flow),
                    describe_mode(flow),
                    ", ".join(flow.sinks),
                    describe_schedule(flow),
                    watermark,
                )
        out.print(table)
        if unreadable:
            raise UserError(unreadable_line(unreadable))


# -- the run log: every run's outcome, any path, for `historian runs` ------------------------

RUNS_LOG_ENV = "HISTORIAN_RUNS_LOG"
RUNS_LOG_KEEP = 1000  # runs kept when the log is trimmed
RUNS_LOG_TRIM_BYTES = 1 << 20


def runs_log(config_path: Path) -> Path:
    """The run log: `HISTORIAN_RUNS_LOG`, else `.historian/runs.jsonl` beside flows.yaml
    (a local file whatever the sinks are: it is the command's history, not the data's)."""
    chosen = os.environ.get(RUNS_LOG_ENV)
    if chosen:
        return Path(chosen)
    return config_path.resolve().parent / ".historian" / "runs.jsonl"


def record_run(config_path: Path, entry: dict[str, object]) -> None:
    """Append one run's line (one write, so concurrent commands do not interleave); a log
    that cannot be written is a warning, never the run's failure."""
    path = runs_log(config_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as log:
            log.write(orjson.dumps(entry) + b"\n")
        if path.stat().st_size > RUNS_LOG_TRIM_BYTES:
            kept = path.read_bytes().splitlines(keepends=True)[-RUNS_LOG_KEEP:]
            partial = path.with_suffix(".tmp")
            partial.write_bytes(b"".join(kept))
            os.replace(partial, path)
    except OSError as exc:
        logging.getLogger("historian").warning("run log %s not written: %s", path, exc)


def read_runs(config_path: Path, flow: str | None, count: int) -> list[dict[str, Any]]:
    """The last `count` runs of the log (of `flow` when given), oldest first; lines that
    do not parse (a write cut by a crash) are skipped."""
    path = runs_log(config_path)
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise UserError(f"{path}: {exc.strerror}") from None
    runs = []
    for line in lines:
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict) and (flow is None or entry.get("flow") == flow):
            runs.append(entry)
    return runs[-count:] if count > 0 else []


def _when(value: object) -> str:
    text = str(value or "-")
    return text[:19].replace("T", " ") + ("Z" if len(text) > 19 else "")


def _took(entry: dict[str, Any]) -> str:
    from datetime import datetime

    try:
        seconds = (
            datetime.fromisoformat(entry["end"]) - datetime.fromisoformat(entry["start"])
        ).total_seconds()
    except (KeyError, TypeError, ValueError):
        return "-"
    return f"{seconds:,.1f}"


@app.command("runs")
def runs_command(
    flow: Annotated[str | None, typer.Argument(help="Only this flow's runs.")] = None,
    count: Annotated[int, typer.Option("-n", "--last", help="How many runs, newest last.")] = 20,
    config: ConfigOption = Path(DEFAULT_CONFIG),
) -> None:
    """List the last runs of `run` and `backfill` (any path): start, seconds, flow, node,
    rows, chunks, status (ok, failed, interrupted) and the error line."""
    from rich.markup import escape

    with user_errors():
        if count < 0:
            raise UserError("-n must not be negative", EXIT_USAGE)
        runs = read_runs(config, flow, count)
        if not runs:
            which = f" of flow {flow}" if flow else ""
            out.print(f"no runs{which} recorded yet ({runs_log(config)})", highlight=False)
            return
        table = Table(title=f"runs ({runs_log(config)})", title_justify="left")
        for column in ("start", "seconds", "flow", "node", "rows", "chunks", "status", "error"):
            justify = "right" if column in ("seconds", "rows", "chunks") else "left"
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for entry in runs:
            status = str(entry.get("status", "-"))
            colour = {"ok": "green", "failed": "red", "interrupted": "yellow"}.get(status)
            table.add_row(
                _when(entry.get("start")),
                _took(entry),
                escape(str(entry.get("flow", "-"))),
                escape(str(entry.get("node") or "-")),
                f"{int(entry.get('rows') or 0):,}",
                str(entry.get("chunks", "-")),
                f"[{colour}]{status}[/]" if colour else escape(status),
                escape(str(entry.get("error") or "")),
            )
        out.print(table)


# -- what a node holds: `historian tags` --------------------------------------------------


def _dig(obj: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _remote(remote: object) -> str:
    """The spec shows only `null` for a local tag: a remote one's link name where its
    marker names one, else `yes`."""
    if remote in (None, False, ""):
        return "-"
    name = _dig(remote, "link") or _dig(remote, "name") or _dig(remote, "node")
    if name:
        return str(name)
    return remote if isinstance(remote, str) else "yes"


def tag_rows(answer: object, path: str) -> list[tuple[str, str, str, str, str]]:
    """A `tag?cmd=details` answer as (path, type, units, history, remote) rows, sorted by
    path: the entry's `fullPath`, else its key under the group asked for."""
    tags = _dig(answer, "tags")
    if not isinstance(tags, dict):
        return []
    group = path if path.endswith("/") else path + "/"
    rows = []
    for name, entry in tags.items():
        if not isinstance(entry, dict):
            continue
        full = entry.get("fullPath") or (name if str(name).startswith("/") else group + name)
        config = entry.get("config")
        history = _dig(config, "extensions", "history", "enabled")
        units = _dig(config, "engUnits")
        rows.append(
            (
                str(full),
                str(_dig(config, "type") or "-"),
                str(units) if units not in (None, "") else "-",
                {True: "yes", False: "no"}.get(history, "-"),  # type: ignore[call-overload]
                _remote(entry.get("remote")),
            )
        )
    return sorted(rows)


@app.command("tags")
def tags_command(
    node: Annotated[str, typer.Argument(help="Node name in flows.yaml.")],
    path: Annotated[str, typer.Argument(help="A group (ending in /) or a tag path.")] = "/",
    recursive: Annotated[
        bool, typer.Option("--recursive", "-r", help="Also the tags of every group below.")
    ] = False,
    filter_rx: Annotated[
        str | None, typer.Option("--filter", help="Only tag paths this regex matches (the node's).")
    ] = None,
    config: ConfigOption = Path(DEFAULT_CONFIG),
) -> None:
    """List a node's tags under PATH: path, type, units, history enabled, remote. Reads the
    node's tag details (one request); writes nothing."""
    from rich.markup import escape

    from connectors.errors import NodeError, one_line, quoted
    from pipelines.config.names import did_you_mean
    from pipelines.config.nodes import NodePool

    with user_errors():
        cfg = load(config)
        if node not in cfg.nodes:
            known = ", ".join(cfg.nodes)
            hint = did_you_mean(node, cfg.nodes)
            message = f"{config.name}: no node named {quoted(node)} (nodes: {known}){hint}"
            raise UserError(message, EXIT_USAGE)
        with NodePool(cfg) as nodes:
            client = nodes.get(node).client
            try:
                body = client.tag_details_bytes(path, filter_regex=filter_rx, recurrent=recursive)
            except NodeError as exc:
                if exc.status != 404:
                    raise UserError(f"node {node}: {one_line(exc)}") from None
                below = "" if recursive else " (only its own tags: --recursive lists those below)"
                raise UserError(f"node {node}: no tags at {quoted(path)}{below}") from None
        try:
            rows = tag_rows(orjson.loads(body), path)
        except orjson.JSONDecodeError:
            raise UserError(f"node {node}: tag.details answered something not JSON") from None
        if not rows:
            out.print(f"no tags under {escape(path)} on node {escape(node)}", highlight=False)
            return
        table = Table(title=f"{len(rows):,} tags under {escape(path)} on node {escape(node)}")
        for column in ("path", "type", "units", "history", "remote"):
            table.add_column(column)
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        out.print(table)
