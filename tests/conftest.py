"""Shared fixtures: the real simulator on loopback, the real PostgreSQL and MariaDB.

Server tests skip with a reason when no server answers, except where
HISTORIAN_REQUIRE_SERVERS=1 (set by .ci/run): there a missing server is a failure.
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


@pytest.fixture
def tmp_lake(tmp_path: Path) -> Path:
    lake = tmp_path / "lake"
    lake.mkdir()
    return lake
