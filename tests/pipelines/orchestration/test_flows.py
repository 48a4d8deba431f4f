"""Prefect flows end to end against the simulator, on one throwaway Prefect server.

Same rows as the direct path in every sink, incremental re-runs, task retries for
transient failures only, errors out as their own type with a quiet console, run names,
the summary artifact, the coverage report, the per-node concurrency limit, schedules.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.orchestration.env import configure_prefect

configure_prefect()

from connectors.errors import MalformedAnswer, RetriesExhausted  # noqa: E402
from connectors.simulator import SimConfig, SimulatedNode, run_server  # noqa: E402
from connectors.timewindow import Window  # noqa: E402
from pipelines.config.destinations import SinkSet  # noqa: E402
from pipelines.config.nodes import NodePool  # noqa: E402
from pipelines.core.runner import ChunkOutcome, Plan, RunFailed, RunRequest  # noqa: E402
from pipelines.core.units import run_flow  # noqa: E402
from pipelines.orchestration.deployments import build_deployments, deploy_flows  # noqa: E402
from pipelines.orchestration.flows import run_prefect  # noqa: E402
from pipelines.orchestration.names import artifact_key  # noqa: E402
from tests.fixtures import canonical, load, write_config  # noqa: E402

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
START = NOW - timedelta(hours=1)


@pytest.fixture(scope="module", autouse=True)
def prefect_server() -> Iterator[None]:
    """One throwaway Prefect server with its own database for the whole module."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    sim = SimulatedNode(SimConfig(seed=17, tags=20))
    sim.set_clock(int(NOW.timestamp() * 1000))
    return sim


@pytest.fixture(scope="module")
def server(node: SimulatedNode) -> Iterator[Any]:
    with run_server(node, http_port=0, https_port=None) as handle:
        yield handle


def flows(**extra: Any) -> dict[str, Any]:
    return {
        "f": {
            "node": "n",
            "tags": {"browse": "/", "include": ["."]},
            "mode": "raw",
            "window": "15m",
            "batch": 6,
            "start": START.isoformat(),
            "settle": "0s",
            "schedule": {"cron": "5 * * * *", "timezone": "Europe/Madrid"},
            **extra,
        },
        "alarms": {
            "node": "n",
            "kind": "alarm_history",
            "window": "6h",
            "start": (NOW - timedelta(days=1)).isoformat(),
            "settle": "0s",
            "schedule": {"interval": "1h"},
        },
        "once": {"node": "n", "tags": {"paths": ["/Plant A/Line 1/Temp. 000"]}, "start": "-1h"},
    }


def contents(path: Path, flow: str, kind: str) -> dict[str, list[Any]]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: canonical(sinks.get(name).read(flow, kind), kind)
            for name in config.flows[flow].sinks
        }


def test_a_prefect_run_writes_what_the_direct_run_writes(
    tmp_path: Path, server: Any, pg_url: str, pg_schema: str
) -> None:
    request = RunRequest(start=START, end=NOW)
    (tmp_path / "direct").mkdir()
    direct = write_config(
        tmp_path / "direct", node={"url": server.http_url}, flows=flows(), sinks=["lake", "duck"]
    )
    config = load(direct)
    direct_writes: list[ChunkOutcome] = []
    with NodePool(config) as nodes, SinkSet(config, direct.parent) as sinks:
        run_flow(
            config,
            "f",
            nodes=nodes,
            sinks=sinks,
            request=request,
            on_chunk=lambda o, s: direct_writes.append(o),
        )
    expected = contents(direct, "f", "tag_history")["lake"]
    assert expected

    (tmp_path / "prefect").mkdir()
    via_prefect = write_config(
        tmp_path / "prefect",
        node={"url": server.http_url},
        flows=flows(),
        pg=(pg_url, pg_schema),
        sinks=["lake", "duck", "pg"],
    )
    plans: list[Plan] = []
    writes: list[ChunkOutcome] = []  # each write as it commits, in whatever order
    summary = run_prefect(
        via_prefect, "f", request, on_plan=plans.append, on_chunk=lambda o, s: writes.append(o)
    )
    planned = {chunk.chunk_id: chunk.window for chunk in plans[0].pending}
    assert summary.chunks_done == summary.chunks_planned == len(planned)
    assert sorted(p for o in writes for p in o.part_ids) == sorted(planned), "each chunk once"
    assert summary.rows == len(expected) == sum(o.rows_fetched for o in writes)
    # Every chunk here is small, so each window's chunks go as one write once its last one
    # is in, whatever order the tasks finish in: the writes the direct run made.
    assert joined_writes(writes) == joined_writes(direct_writes)
    assert len(writes) == len(set(planned.values())) < len(planned)
    for name, rows in contents(via_prefect, "f", "tag_history").items():
        assert rows == expected, name

    # Incremental: a second run over the same state fetches nothing new and duplicates nothing.
    again = run_prefect(via_prefect, "f", RunRequest(end=NOW))
    assert again.rows == 0
    for name, rows in contents(via_prefect, "f", "tag_history").items():
        assert rows == expected, name

    alarms = run_prefect(via_prefect, "alarms", RunRequest(start=NOW - timedelta(days=1), end=NOW))
    assert alarms.rows > 0
    assert {len(rows) for rows in contents(via_prefect, "alarms", "alarm_history").values()} == {
        alarms.rows
    }


def joined_writes(writes: list[ChunkOutcome]) -> list[tuple[Window, list[str]]]:
    """Each write's window and the planned chunks it completed, in a fixed order."""
    return sorted((o.window, sorted(o.part_ids)) for o in writes)


def test_fetched_rows_do_not_outlive_their_write(tmp_path: Path, server: Any) -> None:
    """Prefect's engine keeps a task's return value in reference cycles until the garbage
    collector's next pass: rows handed back that way would outlive their write and add up
    in memory. With the collector off, none is left once the run has written them."""
    import gc

    from pipelines.core.engine import ChunkResult

    path = write_config(tmp_path, node={"url": server.http_url}, flows=flows(), sinks=["lake"])
    gc.collect()
    gc.disable()
    try:
        summary = run_prefect(path, "f", RunRequest(start=START, end=NOW))
        alive = sum(1 for thing in gc.get_objects() if isinstance(thing, ChunkResult))
    finally:
        gc.enable()
    assert summary.chunks_done >= 4
    assert alive == 0


def test_a_transient_failure_is_retried_by_the_task(
    tmp_path: Path, server: Any, node: SimulatedNode
) -> None:
    path = write_config(
        tmp_path, node={"url": server.http_url, "retries": 0}, flows=flows(), sinks=["lake"]
    )
    node.faults.fail_next("503", count=1, operations=["tag.historyMany"])
    try:
        summary = run_prefect(path, "f", RunRequest(start=START, end=START + timedelta(minutes=15)))
    finally:
        injected = node.faults.injected["503"]
        node.faults.clear()
    assert injected >= 1
    assert summary.chunks_done == summary.chunks_planned


@pytest.mark.parametrize(
    ("fault", "client_retries", "error", "requests"),
    [
        # The node's own answer malformed: fatal, asked once, by no layer again.
        ("cutjson", 3, MalformedAnswer, 1),
        # The client already retried (1 + 1 attempts): the task must not multiply them.
        ("503", 1, RetriesExhausted, 2),
    ],
)
def test_fatal_and_exhausted_errors_fail_once_as_themselves_and_quietly(
    tmp_path: Path,
    server: Any,
    node: SimulatedNode,
    capfd: pytest.CaptureFixture[str],
    fault: str,
    client_retries: int,
    error: type[Exception],
    requests: int,
) -> None:
    path = write_config(
        tmp_path,
        node={"url": server.http_url, "retries": client_retries},
        flows=flows(batch=50),  # one chunk: the count of requests is exact
        sinks=["lake"],
    )
    before = node.faults.injected[fault]
    node.faults.fail_next(fault, count=50, operations=["tag.historyMany"])
    try:
        with pytest.raises(RunFailed) as failed:
            run_prefect(path, "f", RunRequest(start=START, end=START + timedelta(minutes=15)))
    finally:
        injected = node.faults.injected[fault] - before
        node.faults.clear()
    assert type(failed.value.__cause__) is error
    assert injected == requests, "a chunk that cannot succeed is not re-run by Prefect"
    assert failed.value.summary.chunks_done == 0
    assert failed.value.summary.error
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert "Task run" not in err, err


def test_a_run_is_named_summarised_reported_and_holds_the_node_limit(
    tmp_path: Path, server: Any, node: SimulatedNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    import prefect.concurrency.sync as prefect_concurrency
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name="historian-node-n", limit=2)
        )
    held: list[str] = []
    real = prefect_concurrency.concurrency

    def recording(names: str, *args: Any, **kwargs: Any) -> Any:
        held.append(names)
        return real(names, *args, **kwargs)

    monkeypatch.setattr(prefect_concurrency, "concurrency", recording)
    path = write_config(tmp_path, node={"url": server.http_url}, flows=flows(), sinks=["lake"])
    reports = tmp_path / "reports"
    summary = run_prefect(
        path, "f", RunRequest(start=START, end=START + timedelta(minutes=30)), report_dir=reports
    )
    # the plan's requests under one slot, then each fetch under its own
    assert held == ["historian-node-n"] * (1 + summary.chunks_done)

    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name("historian-node-n")
        runs = client.read_flow_runs()
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[artifact_key("f")]))
        )
    assert limit.active_slots == 0, "every slot is given back"
    assert any(re.fullmatch(r"f \d{4}-\d\d-\d\dT\d\d:\d\dZ", run.name) for run in runs)
    # Fetch task runs, named by their (first) chunks, cover every chunk once (the server
    # records them as events arrive).
    latest = max(runs, key=lambda run: run.created or NOW)
    task_name = re.compile(r"fetch \d tags? /.+ \[20\S+Z, \+15m\)(?: and (\d+) more chunks)?")

    def chunks_named(names: list[str]) -> int:
        found = [task_name.fullmatch(n) for n in names]
        return sum(1 + int(m.group(1) or 0) for m in found if m)

    names = recorded_task_runs(
        latest.id, lambda names: chunks_named(names) >= summary.chunks_planned
    )
    others = [name for name in names if not task_name.fullmatch(name)]
    assert len(others) == 1, names
    assert others[0].startswith("plan"), names
    assert chunks_named(names) == summary.chunks_done == summary.chunks_planned, names
    markdown = str(max(artifacts, key=lambda artifact: artifact.created or NOW).data)
    assert f"rows: {summary.rows:,}" in markdown
    busiest, count = summary.rows_per_tag.most_common(1)[0]
    assert f"| {busiest} | {count:,} |" in markdown

    page = (reports / "f-coverage.html").read_text(encoding="utf-8")
    tags = {row[1] for row in contents(path, "f", "tag_history")["lake"]}
    assert len(tags) == summary.tags == len(node.tag_paths())
    for tag in tags:
        assert html.escape(tag) in page


def test_small_chunks_are_fetched_a_few_to_a_task(tmp_path: Path, server: Any) -> None:
    """80 chunks of a few hundred rows: fewer fetch task runs than chunks, every chunk in
    exactly one of them, and every row written."""
    from prefect.client.orchestration import get_client

    path = write_config(
        tmp_path, node={"url": server.http_url}, flows=flows(batch=1), sinks=["lake"]
    )
    summary = run_prefect(path, "f", RunRequest(start=START, end=NOW))
    assert summary.chunks_done == summary.chunks_planned == 80
    with get_client(sync_client=True) as client:
        latest = max(client.read_flow_runs(), key=lambda run: run.created or NOW)
    grouped = re.compile(r"fetch 1 tag /.+ \[20\S+Z, \+15m\)(?: and (\d+) more chunks)?")

    def fetches(names: list[str]) -> list[int]:
        found = [grouped.fullmatch(name) for name in names]
        return [1 + int(m.group(1) or 0) for m in found if m]

    names = recorded_task_runs(latest.id, lambda names: sum(fetches(names)) >= 80)
    assert sum(fetches(names)) == 80, names
    assert len(fetches(names)) < 40, names
    assert len(contents(path, "f", "tag_history")["lake"]) == summary.rows > 0


def test_a_fetch_task_takes_chunks_by_the_rows_and_seconds_seen() -> None:
    from pipelines.orchestration.tasks import GROUP_ROWS, GROUP_SECONDS, ChunkGroups

    groups = ChunkGroups(connections=2)
    assert groups.size(remaining=100) == 1  # nothing seen yet
    groups.chunks, groups.rows, groups.seconds = 4, 4 * 400, 4 * 0.01
    assert groups.size(remaining=100) == 50  # half each: both connections kept busy
    groups.chunks, groups.rows, groups.seconds = 4, 4 * 400, 4 * GROUP_SECONDS / 20
    assert groups.size(remaining=100) == 20  # a second's worth
    groups.chunks, groups.rows, groups.seconds = 2, 2 * GROUP_ROWS, 2 * 0.01
    assert groups.size(remaining=100) == 1  # large chunks go one to a task
    groups.chunks, groups.rows, groups.seconds = 2, 20, 2 * GROUP_SECONDS
    assert groups.size(remaining=100) == 1  # slow ones too
    dask = ChunkGroups(connections=0)  # a task's rows all come back at its end
    dask.chunks, dask.rows, dask.seconds = 4, 4 * 400, 4 * 0.01
    assert dask.size(remaining=100) == 1


def test_a_handover_holds_back_a_task_until_the_run_takes_its_chunks() -> None:
    import threading

    from pipelines.orchestration.tasks import Handover

    def result(n: int) -> Any:
        class Result:
            chunk = type("C", (), {"chunk_id": f"c{n}"})()

        return Result()

    arrived: list[Any] = []
    handover = Handover(arrived.append, room=2)
    assert handover.put(result(1))
    assert handover.put(result(2))
    third: list[bool] = []
    putter = threading.Thread(target=lambda: third.append(handover.put(result(3))))
    putter.start()
    putter.join(timeout=0.5)
    assert putter.is_alive()
    assert len(arrived) == 2
    handover.taken()
    putter.join(timeout=5)
    assert third == [True]
    assert len(arrived) == 3
    fourth: list[bool] = []
    putter = threading.Thread(target=lambda: fourth.append(handover.put(result(4))))
    putter.start()
    handover.close()  # the run stopped reading: the task stops instead of waiting
    putter.join(timeout=5)
    assert fourth == [False]
    assert len(arrived) == 3


def recorded_task_runs(
    flow_run_id: Any, complete: Callable[[list[str]], bool], within_s: float = 30
) -> list[str]:
    """Names of a flow run's task runs, once those the server has recorded are `complete`."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + within_s
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
        names = sorted(run.name for run in runs)
        if complete(names) or time.monotonic() > deadline:
            return names
        time.sleep(0.2)


def test_deployments_carry_the_schedules_of_flows_yaml(tmp_path: Path, server: Any) -> None:
    path = write_config(tmp_path, node={"url": server.http_url}, flows=flows(), sinks=["lake"])
    deployments = {d.name: d for d in build_deployments(path)}
    assert set(deployments) == {"f", "alarms"}, "flows without a schedule are not deployed"
    cron = deployments["f"].schedules[0].schedule
    assert cron.cron == "5 * * * *"
    assert cron.timezone == "Europe/Madrid"
    interval = deployments["alarms"].schedules[0].schedule
    assert interval.interval == timedelta(hours=1)
    assert deployments["f"].parameters == {"flow_name": "f", "config_path": str(path.resolve())}
    assert deployments["f"].flow_name == "tag-history"
    assert deployments["alarms"].flow_name == "alarm-history"
    assert build_deployments(path, names=["alarms"])[0].name == "alarms"


def test_flows_deploy_to_a_process_work_pool_by_module_path(tmp_path: Path, server: Any) -> None:
    from prefect.automations import Automation
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    from pipelines.orchestration.fleet import CRASH_AUTOMATION

    path = write_config(tmp_path, node={"url": server.http_url}, flows=flows(), sinks=["lake"])
    with get_client(sync_client=True) as client:
        client.create_work_pool(
            WorkPoolCreate(
                name="historian",
                type="process",
                base_job_template=ProcessWorker.get_default_base_job_template(),
            )
        )
    # two scheduled flows, and every flow's backfill deployment (the shards' runs)
    assert len(deploy_flows(path, "historian")) == 2 + 3
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("tag-history/f")
        backfill = client.read_deployment_by_name("tag-history/once-backfill")
        limit = client.read_global_concurrency_limit_by_name("historian-node-n")
    assert deployment.work_pool_name == "historian"
    assert deployment.entrypoint == "pipelines.orchestration.flows.tag_history_flow"
    assert deployment.parameters == {"flow_name": "f", "config_path": str(path.resolve())}
    assert deployment.schedules[0].schedule.cron == "5 * * * *"
    assert backfill.work_pool_name == "historian"
    assert backfill.schedules == []
    assert backfill.global_concurrency_limit is None
    assert backfill.job_variables == {"env": {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}}
    assert limit.limit == load(path).nodes["n"].max_connections
    assert Automation.read(name=CRASH_AUTOMATION).actions[0].state.value == "CRASHED"

    # a changed max_connections updates the limit; deploying again makes no second automation
    changed = write_config(
        tmp_path, node={"url": server.http_url, "max_connections": 3}, flows=flows(), sinks=["lake"]
    )
    deploy_flows(changed, "historian")
    with get_client(sync_client=True) as client:
        assert client.read_global_concurrency_limit_by_name("historian-node-n").limit == 3
        automations = client.read_automations_by_name(CRASH_AUTOMATION)
    assert len(automations) == 1


@pytest.mark.parametrize("module", ["pipelines.flows", "pipelines.orchestration.flows"])
def test_a_work_pool_loads_the_flows_by_either_module_path(module: str) -> None:
    """Deployments registered before the sub-packages name `pipelines.flows`."""
    from prefect.flows import load_flow_from_entrypoint

    from pipelines.orchestration import flows as current

    for name, flow in [
        ("tag_history_flow", current.tag_history_flow),
        ("alarm_history_flow", current.alarm_history_flow),
    ]:
        assert load_flow_from_entrypoint(f"{module}.{name}") is flow


@pytest.mark.slow
@pytest.mark.parametrize("path", ["threads", "prefect", "dask"])
def test_every_path_extracts_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The direct path's threads, Prefect tasks and Dask workers submit the core's work
    only: on an old node that loses tags for good, each writes the node's truth for the
    group's other tags and records the lost ones missing, runs a chunk again after a
    failure that may pass (client retries off), and applies the alarm maximum the node
    cannot filter."""
    from connectors.options import AlarmFilter, HistoryOptions
    from tests.fixtures import alarm_rows, history_rows, truth_alarm_rows, truth_history_rows

    if path == "dask":
        pytest.importorskip("prefect_dask", reason="pip install -e '.[dask]'")
        monkeypatch.setenv("HISTORIAN_TASK_RUNNER", "dask")
    old = SimulatedNode(SimConfig(seed=31, tags=21, profile="lost-tags+node-1.21.5"))
    old.set_clock(int(NOW.timestamp() * 1000))
    lost = {p for p in old.tag_paths() if old.tree().by_path[p].index % 7 == 3}
    group = {
        "node": "n",
        "tags": {"group": "/", "regex": ".", "recurrent": True},
        "mode": "raw",
        "window": "15m",
        "start": START.isoformat(),
        "settle": "0s",
    }
    alarms = {**flows()["alarms"], "alarms": {"path": "/", "min_priority": 2, "max_priority": 3}}
    del alarms["schedule"]
    day = Window(NOW - timedelta(days=1), NOW)
    with run_server(old, http_port=0, https_port=None) as handle:
        config_path = write_config(
            tmp_path,
            node={"url": handle.http_url, "retries": 0, "max_connections": 1},
            flows={"g": group, "alarms": alarms},
            sinks=["lake"],
        )
        old.faults.fail_next("503", operations=["tag.historyFilter"])
        summary = _run(path, config_path, "g", RunRequest(start=START, end=NOW))
        _run(path, config_path, "alarms", RunRequest(start=day.start, end=day.end))
    assert old.faults.injected["503"] == 1
    assert summary.chunks_done == summary.chunks_planned == 4
    assert lost
    assert set(summary.missing) == lost
    kept = [tag for tag in old.tag_paths() if tag not in lost]
    want = truth_history_rows(old, kept, [Window(START, NOW)], HistoryOptions(mode="raw"))
    config = load(config_path)
    with SinkSet(config, tmp_path) as sinks:
        lake = sinks.get("lake")
        assert history_rows(lake.read("g", "tag_history")) == want
        got_alarms = alarm_rows(lake.read("alarms", "alarm_history"))
    assert got_alarms == truth_alarm_rows(old, day, AlarmFilter(min_priority=2, max_priority=3))


def _run(path: str, config_path: Path, name: str, request: RunRequest) -> Any:
    """The flow through the direct path's threads, or through Prefect (threads or Dask)."""
    if path != "threads":
        return run_prefect(config_path, name, request)
    config = load(config_path)
    with NodePool(config) as nodes, SinkSet(config, config_path.parent) as sinks:
        return run_flow(config, name, nodes=nodes, sinks=sinks, request=request)


def test_the_token_can_come_from_a_prefect_secret_block(tmp_path: Path) -> None:
    from prefect.blocks.system import Secret

    secret = "bl0ck-t0ken-value"
    Secret(value=secret).save("historian-test-node-token", overwrite=True)
    sim = SimulatedNode(SimConfig(seed=2, tags=10, token=secret))
    sim.set_clock(int(NOW.timestamp() * 1000))
    with run_server(sim, http_port=0, https_port=None) as handle:
        path = write_config(
            tmp_path,
            node={"url": handle.http_url, "token_block": "historian-test-node-token"},
            flows={"f": flows()["f"]},
            sinks=["lake"],
        )
        summary = run_prefect(path, "f", RunRequest(start=START, end=START + timedelta(minutes=15)))
    assert summary.rows > 0
    for file in tmp_path.rglob("*"):
        if file.is_file():
            assert secret.encode() not in file.read_bytes(), file


def test_a_fleet_flow_runs_every_node_through_prefect_as_the_direct_path_does(
    tmp_path: Path, server: Any
) -> None:
    from prefect.client.orchestration import get_client

    from connectors.simulator.tagtree import tag_paths
    from tests.pipelines.core.test_many_nodes import SAME_PATHS

    # A second site with the same tag paths and other data (sinks keep nodes apart).
    paths = tag_paths(20) if SAME_PATHS else [p.replace("/", "/m ", 1) for p in tag_paths(20)]
    other = SimulatedNode(SimConfig(seed=18, tags=20, tag_paths=tuple(paths)))
    other.set_clock(int(NOW.timestamp() * 1000))
    request = RunRequest(start=START, end=START + timedelta(minutes=30))
    with run_server(other, http_port=0, https_port=None) as second:
        configs = {}
        for how in ("direct", "prefect"):
            (tmp_path / how).mkdir()
            path = write_config(
                tmp_path / how,
                node={"url": server.http_url},
                flows={"fleet": {**flows()["f"], "node": ["n", "m"]}},
                sinks=["lake", "duck"],
            )
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
            document["nodes"]["m"] = {"url": second.http_url}
            path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
            configs[how] = path
        config = load(configs["direct"])
        with NodePool(config) as nodes, SinkSet(config, configs["direct"].parent) as sinks:
            run_flow(config, "fleet", nodes=nodes, sinks=sinks, request=request)
        summary = run_prefect(configs["prefect"], "fleet", request)
        only_m = run_prefect(configs["prefect"], "fleet", replace(request, nodes=("m",)))
    assert [unit.key for unit in summary.units] == ["fleet@m", "fleet@n"]
    assert all(unit.rows and unit.error is None for unit in summary.units)
    assert [unit.key for unit in only_m.units] == ["fleet@m"]
    assert only_m.units[0].chunks_done == only_m.units[0].chunks_planned > 0  # re-extracted
    expected = contents(configs["direct"], "fleet", "tag_history")
    assert {row[0] for row in expected["lake"]} == {"n", "m"}
    assert contents(configs["prefect"], "fleet", "tag_history") == expected
    assert summary.rows == len(expected["lake"])
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
    fleet_runs = [run for run in runs if run.parameters.get("flow_name") == "fleet"]
    assert {tuple(sorted(run.tags)) for run in fleet_runs} == {
        ("node:m", "node:n"),
        ("node:m",),
    }
    assert sorted(run.parameters.get("nodes") or ["all"] for run in fleet_runs) == [
        ["all"],
        ["m"],
    ]
    deployment = build_deployments(_scheduled(configs["prefect"]))[0]
    assert {"node:n", "node:m"} <= set(deployment.tags)


def _scheduled(path: Path) -> Path:
    """The flows.yaml at `path` with a schedule on every flow."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    for flow in document["flows"].values():
        flow["schedule"] = {"interval": "1h"}
    path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
    return path
