"""SIGKILL a backfill at random points, resume it, and get exactly the uninterrupted output.

The kill comes from outside (a real SIGKILL of the `historian backfill` process), at
delays drawn from a fixed seed across the run's duration. `bench/soak_kill.py` runs many
more kill points; CI runs these few.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pipelines.destinations import SinkSet
from tests.pipeline_helpers import canonical, load, write_config

HISTORIAN = str(Path(sys.executable).with_name("historian"))
START, END = "2026-11-01T00:00:00Z", "2026-11-01T06:00:00Z"


def flows() -> dict[str, Any]:
    return {
        "f": {
            "node": "n",
            "tags": {"browse": "/", "include": ["."]},
            "mode": "raw",
            "window": "20m",
            "batch": 8,
            "start": START,
            "settle": "0s",
        }
    }


def backfill(cwd: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ}
    env.pop("HISTORIAN_DEBUG", None)
    return subprocess.Popen(
        [HISTORIAN, "backfill", "f", "--start", START, "--end", END, "--direct"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finish(process: subprocess.Popen[bytes]) -> None:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, (out + err).decode(errors="replace")


def contents(path: Path) -> dict[str, list[Any]]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: canonical(sinks.get(name).read("f", "tag_history"))
            for name in config.flows["f"].sinks
        }


def visible_temp_files(root: Path) -> list[Path]:
    lake = root / "lake" / "f"
    if not lake.exists():
        return []
    return [p for p in lake.rglob("*") if p.is_file() and not p.name.endswith(".parquet")]


@pytest.fixture(params=["lake+duckdb", "postgres"])
def pg(request: pytest.FixtureRequest) -> tuple[str, str] | None:
    if request.param == "postgres":
        return (request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))
    return None


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_output(
    tmp_path: Path, pg: tuple[str, str] | None
) -> None:
    node = {"simulator": {"seed": 21, "tags": 40}}
    reference = tmp_path / "reference"
    reference.mkdir()
    write_config(reference, node=node, flows=flows(), sinks=["lake", "duck"])
    began = time.monotonic()
    finish(backfill(reference))
    duration = time.monotonic() - began
    expected = contents(reference / "flows.yaml")["lake"]
    assert expected, "the reference run wrote rows"

    rng = random.Random(1234)
    kills = 0
    for attempt in range(3 if pg is None else 2):
        work = tmp_path / f"killed{attempt}"
        work.mkdir()
        sinks = ["lake", "duck"] if pg is None else ["lake", "pg"]
        schema_pg = None if pg is None else (pg[0], f"{pg[1]}")
        write_config(work, node=node, flows=flows(), sinks=sinks, pg=schema_pg)
        if pg is not None and attempt:
            # One schema per attempt: the fixture's schema is reused after a reset.
            from sinks.sql import SqlWarehouse

            warehouse = SqlWarehouse(pg[0], schema=pg[1])
            warehouse.open()
            warehouse.reset("f")
            warehouse.close()
            import sqlalchemy as sa

            engine = sa.create_engine(pg[0])
            with engine.begin() as conn:
                # The dataset is a view over its narrow rows table (sinks/sql_tables.py).
                conn.execute(sa.text(f'drop view if exists "{pg[1]}"."f"'))
                conn.execute(sa.text(f'drop table if exists "{pg[1]}"."historian_rows_f"'))
            engine.dispose()
        process = backfill(work)
        time.sleep(rng.uniform(0.45, 0.9) * duration)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.communicate(timeout=60)
        assert not visible_temp_files(work), "no half-written file visible to readers"
        finish(backfill(work))
        got = contents(work / "flows.yaml")
        for name, rows in got.items():
            assert rows == expected, f"{name} after kill {attempt}"
    assert kills >= 1, "at least one run was killed mid-way"
