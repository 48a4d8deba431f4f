"""Shared fixtures: the real simulator on loopback, the real PostgreSQL and MariaDB.

Server tests skip with a reason when no server answers, except where
HISTORIAN_REQUIRE_SERVERS=1 (set by .ci/run): there a missing server is a failure.

The suite runs in several processes (pytest-xdist, `-n` in pyproject.toml): each test
file goes to one worker whole, so a module-scoped server starts once; the tests that share
the session's Prefect server (`prefect_api`) go to one worker together, so it starts once.
Each worker has its own PREFECT_HOME (below) and tmp_path; servers bind port 0 or retry,
databases and schemas have random names.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# Every test session gets a Prefect home of its own: two sessions on one machine (or a
# user's own ~/.prefect) never share a Prefect database, and no test reaches a server the
# environment names.
_PREFECT_HOME = tempfile.mkdtemp(prefix="historian-test-prefect-")
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ.pop("PREFECT_API_URL", None)
atexit.register(shutil.rmtree, _PREFECT_HOME, True)

PG_URL = os.environ.get(
    "HISTORIAN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _pg_reachable(url: str) -> str | None:
    """None when PostgreSQL answers, else the reason it does not."""
    try:
        import sqlalchemy as sa

        engine = sa.create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        engine.dispose()
    except Exception as exc:
        return f"PostgreSQL at {url.split('@')[-1]} unreachable: {type(exc).__name__}"
    return None


@pytest.fixture(scope="session")
def pg_url() -> str:
    """URL of the real PostgreSQL; skips (or fails in CI) when it does not answer."""
    from tests.fixtures import server_missing  # after the Prefect settings above

    reason = _pg_reachable(PG_URL)
    if reason is not None:
        server_missing(reason)
    return PG_URL


MARIADB_URL = os.environ.get(
    "HISTORIAN_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
)


@pytest.fixture(scope="session")
def mariadb_url() -> str:
    """URL of the real MariaDB (or MySQL); skips (or fails in CI) when it does not answer."""
    from tests.fixtures import server_missing

    try:
        import sqlalchemy as sa

        engine = sa.create_engine(MARIADB_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        engine.dispose()
    except Exception as exc:
        server_missing(f"MariaDB at {MARIADB_URL.split('@')[-1]} unreachable: {type(exc).__name__}")
    return MARIADB_URL


@pytest.fixture
def mariadb_schema(mariadb_url: str) -> Iterator[str]:
    """A fresh database name in the real MariaDB (not created: the sink creates it),
    dropped afterwards."""
    import sqlalchemy as sa

    name = f"t_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        engine = sa.create_engine(mariadb_url)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
        engine.dispose()


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:
    """A fresh, uniquely named schema in the real PostgreSQL, dropped afterwards."""
    import sqlalchemy as sa

    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(sa.text(f'create schema "{schema}"'))
    try:
        yield schema
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f'drop schema if exists "{schema}" cascade'))
        engine.dispose()


@pytest.fixture(scope="session")
def sim_node() -> Any:
    """One simulated node for the whole session (deterministic: seed 7, 60 tags)."""
    from connectors.simulator import SimConfig, SimulatedNode

    return SimulatedNode(SimConfig(seed=7, tags=60))


@pytest.fixture(scope="session")
def sim_server(sim_node: Any) -> Iterator[Any]:
    """The simulator served over real HTTP and HTTPS on ephemeral loopback ports."""
    from connectors.simulator import run_server

    with run_server(sim_node, http_port=0, https_port=0) as server:
        yield server


# The tests on the session's Prefect server (`prefect_api`). The xdist scheduler below
# sends them to one worker together, so the server starts once; it sees test ids only
# (xdist's own `xdist_group` mark does nothing with pytest 9.2: it renames
# `item._nodeid`, which pytest no longer reads), hence the list.
PREFECT_SERVER_TESTS = frozenset(
    {
        "tests/cli/test_cli.py::test_a_prefect_run_uses_the_server_prefect_api_url_names",
        "tests/cli/test_schedules.py::"
        "test_a_work_pool_deployment_fires_on_a_prefect_server_with_a_worker",
        "tests/pipelines/orchestration/test_fleet.py::test_a_sharded_backfill_on_two_workers_survives_losing_one",
    }
)


def _test_id(nodeid: str) -> str:
    """The id of a test without its parameters (`path::name`)."""
    return nodeid.split("[", 1)[0]


@pytest.fixture(scope="session")
def prefect_api(
    tmp_path_factory: pytest.TempPathFactory, pg_url: str
) -> Iterator[tuple[str, dict[str, str]]]:
    """One real `prefect server start` for the session: its API URL, and the environment of
    a client or worker that uses it. Tests that share it keep to their own work pools,
    flow names and runs. Its database is a throwaway one in the real PostgreSQL, as Prefect
    advises for a server with workers: on SQLite a busy 2-core machine made it answer 503
    ("database is locked") to the tests' own calls."""
    import sqlalchemy as sa

    from tests.prefect_server import prefect_server

    name = f"prefect_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'create database "{name}"'))
    database_url = (
        sa.make_url(pg_url)
        .set(drivername="postgresql+asyncpg", database=name)
        .render_as_string(hide_password=False)
    )
    try:
        with prefect_server(tmp_path_factory.mktemp("prefect-server"), database_url) as served:
            yield served
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'drop database if exists "{name}" with (force)'))
        admin.dispose()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test on the shared Prefect server is in PREFECT_SERVER_TESTS. Those tests,
    then the files with slow tests, run first (xdist hands out work in this order,
    `--no-loadscope-reorder`): a long unit started last would keep one worker busy after
    the others have finished."""
    unlisted = [
        item.nodeid
        for item in items
        if "prefect_api" in getattr(item, "fixturenames", ())
        and _test_id(item.nodeid) not in PREFECT_SERVER_TESTS
    ]
    if unlisted:
        raise pytest.UsageError(
            f"{unlisted[0]} uses prefect_api: add it to PREFECT_SERVER_TESTS (tests/conftest.py)"
        )
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        if _test_id(item.nodeid) in PREFECT_SERVER_TESTS:
            return 0
        return 1 if item.path in slow_files else 2

    items.sort(key=rank)  # stable: the order within a file stays


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, except that the tests on the shared Prefect server are one unit of
    work together: a test file is one unit (its module-scoped servers start once), and so
    are they (the session's Prefect server starts once)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrSharedServerScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if _test_id(nodeid) in PREFECT_SERVER_TESTS:
                return "prefect-server"
            return nodeid.split("::", 1)[0]

    return FileOrSharedServerScheduling(config, log)


@pytest.fixture
def tmp_lake(tmp_path: Path) -> Path:
    lake = tmp_path / "lake"
    lake.mkdir()
    return lake
