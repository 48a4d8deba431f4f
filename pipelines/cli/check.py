"""`historian check`: the config, every node, every flow's selection, every schedule and
every sink probed, one `ok` or `fail` line each; nothing is written."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from connectors.errors import NodeError, one_line
from pipelines.cli.base import (
    DEFAULT_CONFIG,
    ConfigOption,
    UserError,
    app,
    err,
    load,
    out,
    user_errors,
)

if TYPE_CHECKING:  # config pulls in pandas and pyarrow: imported when needed
    from connectors.facts import NodeFacts
    from pipelines.config.models import Config, FlowConfig, TagHistoryFlow
    from pipelines.config.nodes import ConnectedNode, NodePool


@app.command()
def check(
    config: ConfigOption = Path(DEFAULT_CONFIG),
) -> None:
    """Config valid, every node reachable (and its version), every flow's tags found, every
    sink writable; writes nothing."""
    with user_errors():
        cfg = load(config)
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
            selections = _Selections()
            reachable = _check_nodes(cfg, nodes, fail, selections)
            _check_flows(cfg, nodes, reachable, fail, selections)
        _check_schedules(cfg, fail)
        _check_sinks(cfg, config.resolve().parent, fail)
        if problems:
            # Each reason is on its `fail` line above; the error line only counts them.
            failed = len(problems)
            raise UserError(
                f"{failed} check{'s' if failed > 1 else ''} failed: " + ", ".join(problems)
            )


class _Selections:
    """Each tag flow's selection resolved once per node for the whole check: the node's
    probes and the flow's own check both need it (a failure is not kept: asked again, it
    is reported by the flow check)."""

    def __init__(self) -> None:
        self._members: dict[tuple[str, str], Sequence[str]] = {}

    def members(self, name: str, flow: TagHistoryFlow, node: ConnectedNode) -> Sequence[str]:
        from pipelines.selection import resolve_tags

        key = (name, node.name)
        if key not in self._members:
            assert flow.tags is not None
            where = f"flows.{name}.tags"
            self._members[key] = resolve_tags(
                node.client, node.name, flow.tags, where=where
            ).members
        return self._members[key]


def _check_nodes(
    cfg: Config,
    nodes: NodePool,
    fail: Callable[[str, Exception], None],
    selections: _Selections,
) -> set[str]:
    """Each node answers with its credentials; shows what the pipeline knows of it (its
    facts: identity, version, clock, the readings learned). A probe the extraction does
    not need (`tag?cmd=getViews`) is a warning: the flows are still checked."""
    from pipelines.config.nodes import describe_node

    reachable: set[str] = set()
    for name in cfg.nodes:
        try:
            node = nodes.get(name)
            node.client.system_status()  # answers, and accepts the credentials
            facts = _with_readings(cfg, node, node.facts(), selections)
        except NodeError as exc:
            fail(f"node {name}", exc)
            continue
        reachable.add(name)
        version = facts.version
        shown = f"version {version}" if version is not None else "version unknown"
        if version is not None and version.text and version.text != str(version):
            shown += f" ({version.text!r})"
        out.print(
            f"[green]ok[/] node {describe_node(node)} answers {facts.identity.name or ''}, {shown}",
            highlight=False,
        )
        for line in facts.lines():
            out.print(f"     {line}", highlight=False, soft_wrap=True)
        _check_views(node)
    return reachable


def _with_readings(
    cfg: Config, node: ConnectedNode, facts: NodeFacts, selections: _Selections
) -> NodeFacts:
    """`facts` with the readings probed on one of the node's flow tags (connectors/
    probes.py), at the node's own time; as they were when no flow names a tag there."""
    from dataclasses import asdict, replace

    from connectors.probes import probe_readings

    tag = _probe_tag(cfg, node, selections)
    if tag is None:
        return facts
    now = facts.clock.node_time if facts.clock is not None else datetime.now(UTC)
    return replace(facts, **asdict(probe_readings(node.client, tag, now)))


def _probe_tag(cfg: Config, node: ConnectedNode, selections: _Selections) -> str | None:
    """The first tag a tag flow on `node` names or selects (None: no such flow)."""
    from pipelines.config.models import TagHistoryFlow

    for name, flow in cfg.flows.items():
        if not isinstance(flow, TagHistoryFlow) or node.name not in cfg.flow_nodes(name):
            continue
        assert flow.tags is not None
        if flow.tags.paths:
            return flow.tags.paths[0]
        try:
            members = selections.members(name, flow, node)
        except NodeError:
            continue  # the flow checks below say why
        if members:
            return members[0]
    return None


def _check_views(node: ConnectedNode) -> None:
    """`tag?cmd=getViews`: a warning when refused, since extraction never asks it."""
    try:
        node.client.tag_get_views()
    except NodeError as exc:
        out.print(
            f"[yellow]warn[/] node {node.name}: {one_line(exc)} (not needed to extract: "
            "the flows are checked below)",
            highlight=False,
            soft_wrap=True,
        )


def _check_flows(
    cfg: Config,
    nodes: NodePool,
    reachable: set[str],
    fail: Callable[[str, Exception], None],
    selections: _Selections,
) -> None:
    """Each flow's tag selection resolves on its node (an unknown path or group is named
    by its config key), and its method is one the node's version computes; a fleet
    flow's on every node."""
    for name, flow in cfg.flows.items():
        fleet = cfg.flow_nodes(name)
        for node_name in fleet:
            if node_name in reachable:
                what = f"flow {name}" + (f" on node {node_name}" if flow.fleet else "")
                _check_flow_on(name, flow, nodes.get(node_name), what, fail, selections)


def _check_flow_on(
    name: str,
    flow: FlowConfig,
    node: ConnectedNode,
    what: str,
    fail: Callable[[str, Exception], None],
    selections: _Selections,
) -> None:
    """One flow's selection and method on one of its nodes: an ok line, or `fail`."""
    from connectors.version import check_method
    from pipelines.config.models import AlarmHistoryFlow

    try:
        if isinstance(flow, AlarmHistoryFlow):
            path = flow.alarms.path if flow.alarms else "/"
            count = node.client.alarm_count(path)
            found = f"alarms under {path!r}: {count} now"
        else:
            assert flow.tags is not None
            check_method(flow.method, node.version(), where=f"flows.{name}.method")
            found = f"{len(selections.members(name, flow, node))} tags"
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
    from sinks.base import Probes, SinkError

    for name, sink_config in cfg.sinks.items():
        try:
            sink = make_sink(name, sink_config, base, patient=False)
            found = sink.probe() if isinstance(sink, Probes) else "not checked before a run"
            out.print(f"[green]ok[/] sink {name}: {sink.describe()}: {found}", highlight=False)
        except SinkError as exc:
            fail(f"sink {name}", exc)
