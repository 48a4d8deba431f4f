"""Every sink the contract suite (tests/sinks/test_contract.py) runs over, by name.

Each entry of `SINKS` is a factory: given the test's request and tmp_path, it returns a
`SinkUnderTest` naming a *fresh, not yet created* place for the sink (a directory, a
database file, a PostgreSQL schema, a MariaDB database) and how to tell whether anything
was created there yet. The place is removed after the test by the factory's own finaliser.

To add a sink (Delta, Iceberg, ...), write one factory and register it:

    @register("delta")
    def delta(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
        root = tmp_path / "delta"
        return SinkUnderTest("sinks.tables.delta:DeltaLake", {"url": str(root)}, root.exists)

`cls` is "module:Class" and `kwargs` are its constructor's arguments: the suite builds
the sink from them in this process and in child processes (the kill test), so both must
be plain values. A server the sink needs is found (or skipped, or failed in CI) through
`tests.fixtures.server_missing`; pass `marks=(pytest.mark.postgres,)` or the like to
`register` for sinks on a server.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sinks.base import Sink


@dataclass(frozen=True)
class SinkUnderTest:
    """A fresh place for one sink: how to build the sink, and whether the place exists."""

    cls: str  # "module:Class"
    kwargs: dict[str, Any]
    created: Callable[[], bool]  # anything created at the place yet?
    # The sink keeps one writer per process and file (DuckDB): a second object over the
    # same place cannot be opened beside the first, in this process or another.
    one_process: bool = False

    def make(self) -> Sink:
        """A new, unopened sink object over this place."""
        return build(self.cls, self.kwargs)


def build(cls: str, kwargs: dict[str, Any]) -> Sink:
    module, name = cls.split(":")
    made: Sink = getattr(importlib.import_module(module), name)(**kwargs)
    return made


Factory = Callable[[pytest.FixtureRequest, Path], SinkUnderTest]
SINKS: dict[str, tuple[Factory, tuple[pytest.MarkDecorator, ...]]] = {}
# Per sink, the step every chunk's write passes through to commit ("module:attribute",
# the attribute possibly "Class.method"): a child process is stopped there, before or
# after it, and killed (`test_contract.py`, the kill at the commit step).
COMMIT_STEPS: dict[str, str] = {}


def register(
    name: str, marks: tuple[pytest.MarkDecorator, ...] = (), commit_step: str | None = None
) -> Callable[[Factory], Factory]:
    """Add a factory to `SINKS` under `name` (the test id)."""

    def add(factory: Factory) -> Factory:
        SINKS[name] = (factory, marks)
        if commit_step is not None:
            COMMIT_STEPS[name] = commit_step
        return factory

    return add


def sink_params(only: Collection[str] | None = None) -> list[Any]:
    """A parameter per registered sink (or per sink of `only`), with its marks."""
    return [
        pytest.param(name, marks=marks, id=name)
        for name, (_, marks) in SINKS.items()
        if only is None or name in only
    ]


@register("lake", commit_step="sinks.lake.journal:Journal.commit")
def lake(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
    root = tmp_path / "lake"
    return SinkUnderTest("sinks.lake.sink:ParquetLake", {"url": str(root)}, root.exists)


@register("duckdb")
def duckdb(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
    folder = tmp_path / "wh"
    return SinkUnderTest(
        "sinks.sql.warehouse:SqlWarehouse",
        {"url": f"duckdb:///{folder}/warehouse.duckdb", "schema": "historian"},
        folder.exists,
        one_process=True,
    )


def _server_schema(request: pytest.FixtureRequest, url: str, exists_sql: str) -> SinkUnderTest:
    """A schema (PostgreSQL) or database (MariaDB) name not yet in the server, dropped after."""
    import sqlalchemy as sa

    name = f"h_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(url)

    def created() -> bool:
        with engine.connect() as conn:
            return bool(conn.execute(sa.text(exists_sql), {"s": name}).scalar())

    def drop() -> None:
        with engine.begin() as conn:
            if url.startswith("postgresql"):
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
            else:
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
        engine.dispose()

    request.addfinalizer(drop)
    return SinkUnderTest("sinks.sql.warehouse:SqlWarehouse", {"url": url, "schema": name}, created)


@register("postgres", marks=(pytest.mark.postgres,))
def postgres(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
    url = request.getfixturevalue("pg_url")
    return _server_schema(request, url, "SELECT count(*) FROM pg_namespace WHERE nspname = :s")


def environment_for_children() -> dict[str, str]:
    """The environment of a child process that builds a sink (the repo on its path)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@register("mariadb", marks=(pytest.mark.mariadb,))
def mariadb(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
    url = request.getfixturevalue("mariadb_url")
    return _server_schema(
        request, url, "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = :s"
    )


@register("delta", commit_step="sinks.tables.delta:retry_conflicts")
def delta(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
    root = tmp_path / "delta"
    return SinkUnderTest("sinks.tables.delta:DeltaLake", {"url": str(root)}, root.exists)


@register("iceberg", commit_step="sinks.tables.iceberg:retry_conflicts")
def iceberg(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
    root = tmp_path / "iceberg"
    return SinkUnderTest("sinks.tables.iceberg:IcebergLake", {"url": str(root)}, root.exists)
