"""A backfill on a node's worst day: faults at 20% of requests, restarts, a lost warehouse.

The outcome is always one of two: output identical, row for row, to a fault-free run;
or a clear error with state intact, after which the next run completes it exactly.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.admin import NodeAdmin
from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.config.destinations import SinkSet
from pipelines.config.nodes import NodePool
from pipelines.core.runner import RunFailed, RunRequest
from pipelines.core.units import run_flow
from tests.fixtures import canonical, load, server_missing, write_config

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
START = NOW - timedelta(hours=2)


@pytest.fixture(scope="module")
def node() -> SimulatedNode:
    sim = SimulatedNode(SimConfig(seed=13, tags=20, raw_cap=700))
    sim.set_clock(int(NOW.timestamp() * 1000))
    return sim


@pytest.fixture(scope="module")
def server(node: SimulatedNode) -> Iterator[Any]:
    with run_server(node, http_port=0, https_port=None) as handle:
        yield handle


def flow(**extra: Any) -> dict[str, Any]:
    spec = {
        "node": "n",
        "tags": {"browse": "/", "include": ["."]},
        "mode": "raw",
        "window": "20m",
        "batch": 7,
        "start": START.isoformat(),
        "settle": "0s",
    }
    spec.update(extra)
    return spec


def node_config(url: str, **extra: Any) -> dict[str, Any]:
    return {"url": url, "retries": 8, "read_timeout": "1s", "max_connections": 2, **extra}


def run(path: Path, **kwargs: Any) -> Any:
    config = load(path)
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        return run_flow(config, "f", nodes=nodes, sinks=sinks, now=NOW, **kwargs)


def contents(path: Path) -> dict[str, list[Any]]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: canonical(sinks.get(name).read("f", "tag_history"))
            for name in config.flows["f"].sinks
        }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, server: Any) -> list[Any]:
    work = tmp_path_factory.mktemp("reference")
    path = write_config(
        work, node=node_config(server.http_url), flows={"f": flow()}, sinks=["lake"]
    )
    run(path)
    return contents(path)["lake"]


@pytest.mark.parametrize(
    "kinds",
    [
        ["500", "502", "503", "504"],
        ["429"],
        ["reset"],
        ["truncate", "nonjson"],
        ["slow"],
    ],
    ids=["5xx", "429", "reset", "truncated+nonjson", "slow"],
)
def test_faults_at_20_percent_change_nothing(
    tmp_path: Path, node: SimulatedNode, server: Any, reference: list[Any], kinds: list[str]
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url), flows={"f": flow()})
    node.faults.configure(rate=0.2, kinds=kinds, seed=len(kinds), slow_s=1.5)
    try:
        summary = run(path)
    finally:
        injected = sum(node.faults.injected[k] for k in kinds)
        node.faults.clear()
    assert injected > 0, "faults were injected"
    assert summary.chunks_done == summary.chunks_planned
    for name, rows in contents(path).items():
        assert rows == reference, name


def test_spent_retries_stop_cleanly_and_the_next_run_completes(
    tmp_path: Path, node: SimulatedNode, server: Any, reference: list[Any]
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url, retries=1), flows={"f": flow()})
    node.faults.configure(rate=0.6, kinds=["503"], seed=5, operations=["tag.historyMany"])
    try:
        with pytest.raises(RunFailed) as caught:
            run(path)
    finally:
        node.faults.clear()
    message = str(caught.value)
    assert "tag.historyMany" in message
    assert "503" in message
    assert caught.value.summary.chunks_done < caught.value.summary.chunks_planned
    run(path)
    for name, rows in contents(path).items():
        assert rows == reference, name


def test_the_node_restarting_mid_run(
    tmp_path: Path, server: Any, reference: list[Any], node: SimulatedNode
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url), flows={"f": flow()})
    config = load(path)
    restarted = []

    def restart_once(outcome: Any, summary: Any) -> None:
        if not restarted:
            restarted.append(True)
            server.restart(down_s=0.3)  # the process dies and comes back on the same port

    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        run_flow(config, "f", nodes=nodes, sinks=sinks, now=NOW, on_chunk=restart_once)
    assert restarted
    for name, rows in contents(path).items():
        assert rows == reference, name


def test_restart_service_answers_503_then_the_run_goes_on(
    tmp_path: Path, server: Any, reference: list[Any], node: SimulatedNode
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url), flows={"f": flow()})
    config = load(path)
    done = []

    def restart_service(outcome: Any, summary: Any) -> None:
        if not done:
            done.append(True)
            NodeAdmin(nodes.get("n").client).system_restart_service()

    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        run_flow(config, "f", nodes=nodes, sinks=sinks, now=NOW, on_chunk=restart_service)
    for name, rows in contents(path).items():
        assert rows == reference, name


@pytest.mark.postgres
def test_postgres_connection_lost_mid_run(
    tmp_path: Path, server: Any, reference: list[Any], pg_url: str, pg_schema: str
) -> None:
    """`pg_terminate_backend` on every connection of the sink, the flow lock's included:
    the write is tried again on a new connection, the lock taken again, the run completes."""
    import sqlalchemy as sa

    path = write_config(
        tmp_path,
        node=node_config(server.http_url),
        flows={"f": flow()},
        pg=(pg_url, pg_schema),
        sinks=["pg"],
    )
    engine = sa.create_engine(pg_url)
    mine = {"mine": f"historian {pg_schema}"}  # this test's sink names its own schema
    killed: list[int] = []
    locked: list[bool] = []

    def kill_backends(outcome: Any, summary: Any) -> None:
        with engine.begin() as conn:
            if killed:
                locked.append(
                    bool(
                        conn.execute(
                            sa.text(
                                "select count(*) from pg_locks l join pg_stat_activity a "
                                "using (pid) where l.locktype = 'advisory' and l.granted "
                                "and a.application_name = :mine"
                            ),
                            mine,
                        ).scalar()
                    )
                )
                return
            rows = conn.execute(
                sa.text(
                    # with a timeout: returns once each backend has ended (its locks
                    # released), as when a database restarts
                    "select pg_terminate_backend(pid, 30000) from pg_stat_activity "
                    "where datname = current_database() and pid <> pg_backend_pid() "
                    "and application_name = :mine"
                ),
                mine,
            ).fetchall()
        killed.append(len(rows))

    summary = run(path, on_chunk=kill_backends)
    engine.dispose()
    assert killed[0] >= 2, "the flow lock's session and a writer's"
    assert locked, "chunks were written after the cut"
    assert locked[-1], "the flow lock was taken again"
    assert summary.chunks_done == summary.chunks_planned
    assert contents(path)["pg"] == reference


@pytest.fixture(scope="module")
def pg_bindir() -> Path:
    from tests.pg_server import find_bindir

    found = find_bindir()
    if found is None:
        server_missing("no PostgreSQL binaries (initdb) on this machine")
    return found


@pytest.fixture(scope="module")
def pg_cluster(pg_bindir: Path) -> Iterator[Any]:
    """A PostgreSQL of this module's own (one initdb), removed whatever happens."""
    from tests.pg_server import throwaway_postgres

    with throwaway_postgres(pg_bindir) as pg:
        yield pg


@pytest.fixture
def own_pg(pg_cluster: Any) -> Any:
    """The module's PostgreSQL, running (a test before may have left it killed), for this
    test to kill and restart; each test writes a schema of its own in it."""
    if pg_cluster.process is None:
        pg_cluster.start()
    return pg_cluster


@pytest.fixture
def brief_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sink tries a database that went away again for 1.5 s instead of a minute."""
    import sinks.sql.warehouse

    monkeypatch.setattr(sinks.sql.warehouse, "RETRY_S", 1.5)


def pg_flow_config(tmp_path: Path, server: Any, own_pg: Any) -> Path:
    return write_config(
        tmp_path,
        node=node_config(server.http_url),
        flows={"f": flow()},
        pg=(own_pg.url, f"h_{uuid.uuid4().hex[:12]}"),
        sinks=["pg"],
    )


@pytest.mark.slow
def test_postgres_killed_and_restarted_mid_run_completes_exactly(
    tmp_path: Path, server: Any, reference: list[Any], own_pg: Any, caplog: Any
) -> None:
    path = pg_flow_config(tmp_path, server, own_pg)
    restarts: list[threading.Thread] = []

    def crash_once(outcome: Any, summary: Any) -> None:
        if summary.chunks_done >= 3 and not restarts:
            own_pg.kill()  # SIGKILL: postmaster and every backend
            restarts.append(threading.Thread(target=lambda: (time.sleep(1.0), own_pg.start())))
            restarts[0].start()

    caplog.set_level(logging.WARNING, logger="historian.sql")
    try:
        summary = run(path, on_chunk=crash_once)
    finally:
        for thread in restarts:
            thread.join()
    assert restarts, "the server was killed mid-run"
    assert summary.chunks_done == summary.chunks_planned
    assert any("trying again" in r.getMessage() for r in caplog.records)
    assert contents(path)["pg"] == reference


@pytest.mark.slow
@pytest.mark.usefixtures("brief_retries")
def test_postgres_staying_away_stops_with_one_line_and_the_next_run_completes(
    tmp_path: Path, server: Any, reference: list[Any], own_pg: Any
) -> None:
    path = pg_flow_config(tmp_path, server, own_pg)
    killed: list[bool] = []

    def crash_once(outcome: Any, summary: Any) -> None:
        if summary.chunks_done >= 3 and not killed:
            own_pg.kill()
            killed.append(True)

    with pytest.raises(RunFailed) as caught:
        run(path, on_chunk=crash_once)
    message = str(caught.value)
    assert "\n" not in message
    assert "database unavailable" in message
    assert "still after" in message, message
    first = caught.value.summary
    assert 3 <= first.chunks_done < first.chunks_planned
    own_pg.start()
    summary = run(path)
    assert summary.chunks_done <= first.chunks_planned - 3, "committed chunks stay committed"
    assert contents(path)["pg"] == reference


@pytest.mark.slow
@pytest.mark.usefixtures("brief_retries")
def test_postgres_gone_after_every_chunk_committed_leaves_the_run_complete(
    tmp_path: Path, server: Any, reference: list[Any], own_pg: Any
) -> None:
    path = pg_flow_config(tmp_path, server, own_pg)

    def crash_after_the_last(outcome: Any, summary: Any) -> None:
        if summary.chunks_done == summary.chunks_planned:
            own_pg.kill()

    summary = run(path, on_chunk=crash_after_the_last)  # no RunFailed: all is committed
    assert summary.chunks_done == summary.chunks_planned
    assert summary.watermark_after is None, "not read: the database was gone"
    own_pg.start()
    again = run(path)
    assert again.chunks_done == 0, "nothing left to do"
    assert again.watermark_after == NOW
    assert contents(path)["pg"] == reference


@pytest.mark.slow
def test_postgres_sessions_dropped_again_and_again_mid_run_and_the_run_completes_exactly(
    tmp_path: Path, server: Any, reference: list[Any], own_pg: Any
) -> None:
    """Every session of the run terminated and cut after each of five chunks, the flow
    lock's among them, each holding its locks a second after the run learned it was gone:
    the run takes its own lock again once that session has ended, and completes exactly."""
    from tests.pg_server import Sessions

    path = pg_flow_config(tmp_path, server, own_pg)
    config = load(path)
    dropped: list[int] = []
    with NodePool(config) as nodes, SinkSet(config, path.parent) as sinks:
        sessions = Sessions(sinks.get("pg").engine)

        def drop(outcome: Any, summary: Any) -> None:
            if len(dropped) < 5:
                dropped.append(sessions.drop(own_pg.url))

        summary = run_flow(config, "f", nodes=nodes, sinks=sinks, now=NOW, on_chunk=drop)
    assert len(dropped) == 5
    assert min(dropped) >= 1, "the lock's session, at least, every time"
    assert summary.chunks_done == summary.chunks_planned
    assert contents(path)["pg"] == reference


def test_an_explicit_range_rerun_after_faults_is_still_exact(
    tmp_path: Path, node: SimulatedNode, server: Any, reference: list[Any]
) -> None:
    path = write_config(tmp_path, node=node_config(server.http_url), flows={"f": flow()})
    run(path)
    node.faults.configure(rate=0.2, kinds=["reset", "503", "truncate"], seed=77)
    try:
        run(path, request=RunRequest(start=START, end=NOW))
    finally:
        node.faults.clear()
    for name, rows in contents(path).items():
        assert rows == reference, name


# A node that answers after 3 s, read with a 1 s timeout and 2 retries: three attempts.
SLOW = {"retries": 2, "read_timeout": "1s", "max_connections": 1}


def slow_answers(node: SimulatedNode, count: int) -> None:
    """The next `count` history requests answer 3 s late (past SLOW's read timeout)."""
    node.faults.configure(rate=0.0, kinds=[], slow_s=3.0)
    node.faults.fail_next("slow", count, operations=["tag.historyMany"])


def retry_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "attempt " in r.getMessage()]


def test_a_timeout_warning_names_the_flow_node_window_and_timeout(
    tmp_path: Path,
    node: SimulatedNode,
    server: Any,
    reference: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = write_config(
        tmp_path, node=node_config(server.http_url, **SLOW), flows={"f": flow()}, sinks=["lake"]
    )
    before = node.faults.injected["slow"]
    slow_answers(node, 2)
    try:
        with caplog.at_level(logging.WARNING, logger="historian"):
            summary = run(path)
    finally:
        node.faults.clear()
    assert node.faults.injected["slow"] - before == 2
    assert summary.chunks_done == summary.chunks_planned
    warnings = retry_warnings(caplog)  # a busy machine may time out more than the two
    assert len(warnings) >= 2, warnings
    first = START.strftime("%Y-%m-%dT%H:%M")
    assert warnings[0].startswith(f"flow f node n window {first}Z..")
    assert warnings[0].endswith(
        ": tag.historyMany: no answer within 1 s; attempt 1 of 3 failed, retrying in "
        + warnings[0].rsplit("retrying in ", 1)[1]
    )
    assert "attempt 2 of 3 failed" in warnings[1]
    assert contents(path)["lake"] == reference


def test_a_window_timing_out_on_every_attempt_names_the_settings_to_change(
    tmp_path: Path, node: SimulatedNode, server: Any, reference: list[Any]
) -> None:
    path = write_config(
        tmp_path, node=node_config(server.http_url, **SLOW), flows={"f": flow()}, sinks=["lake"]
    )
    slow_answers(node, 3)
    try:
        with pytest.raises(RunFailed) as caught:
            run(path)
    finally:
        node.faults.clear()
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "tag.historyMany: gave up after 3 attempts: no answer within 1 s; window "
    ), message
    assert message.endswith(
        " timed out on every attempt: raise nodes.n.read_timeout or shorten flows.f.window"
    ), message
    run(path)  # the next run completes it
    assert contents(path)["lake"] == reference


def test_window_auto_asks_in_halves_after_a_window_times_out_and_says_so_once(
    tmp_path: Path,
    node: SimulatedNode,
    server: Any,
    reference: list[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = write_config(
        tmp_path,
        node=node_config(server.http_url, **SLOW),
        flows={"f": flow(window="auto")},
        sinks=["lake"],
    )
    before = node.faults.injected["slow"]
    try:
        with caplog.at_level(logging.WARNING, logger="historian"):
            # Once planned (window: auto sizes its windows from a sample of the history).
            summary = run(path, on_plan=lambda plan: slow_answers(node, 3))
    finally:
        node.faults.clear()
    assert node.faults.injected["slow"] - before == 3
    assert summary.window_auto
    assert summary.chunks_done == summary.chunks_planned
    said = [r.getMessage() for r in caplog.records if "window: auto now asks" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("flow f node n window ")
    assert (
        ": tag.historyMany: no answer within 1 s on every attempt; window: auto now asks"
        in (said[0])
    )
    assert contents(path)["lake"] == reference


def test_a_postgres_session_terminated_while_the_run_connects_is_connected_again(
    tmp_path: Path, server: Any, reference: list[Any], own_pg: Any
) -> None:
    """The run's first session to the PostgreSQL this module started is terminated
    (`pg_terminate_backend`) while it sets up the sink's tables, held on the DDL lock this
    test takes: the run connects again and completes exactly."""
    import sqlalchemy as sa

    from tests.pg_server import waiting_session

    path = pg_flow_config(tmp_path, server, own_pg)
    schema = load(path).sinks["pg"].schema_
    outcome: list[Any] = []
    runner = threading.Thread(target=lambda: outcome.append(run_or_error(path)))
    admin = sa.create_engine(own_pg.url)
    try:
        with admin.connect() as holder:
            ddl = {"k": f"historian-ddl:{schema}"}
            holder.execute(sa.text("SELECT pg_advisory_lock(hashtext(:k))"), ddl)
            holder.commit()
            runner.start()
            victim = waiting_session(holder, f"historian {schema}", timeout_s=120)
            holder.execute(sa.text("SELECT pg_terminate_backend(:p, 30000)"), {"p": victim})
            holder.execute(sa.text("SELECT pg_advisory_unlock(hashtext(:k))"), ddl)
            holder.commit()
        runner.join(timeout=300)
    finally:
        admin.dispose()
    assert not runner.is_alive(), "the run came back"
    summary = outcome[0]
    assert not isinstance(summary, BaseException), f"the run stopped: {summary}"
    assert summary.chunks_done == summary.chunks_planned
    assert contents(path)["pg"] == reference


def run_or_error(path: Path) -> Any:
    try:
        return run(path)
    except Exception as exc:  # the test reports it as the run's outcome
        return exc
