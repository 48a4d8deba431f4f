"""SIGKILL a backfill at random points, resume it, and get exactly the uninterrupted output.

The kill comes from outside (a real SIGKILL of the `historian backfill` process), once a
number of chunks drawn from a fixed seed is committed, plus a few milliseconds so it
lands inside a later chunk's fetch or write: progress, not time, picks the moment, so a
faster sink does not finish before the kill. `bench/soak_kill.py` runs many
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
from tests.fixtures import canonical, load, write_config

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


CHUNKS = 18 * 5  # 6 h in 20-minute windows x 40 tags in batches of 8


def committed_chunks(work: Path) -> int:
    """Chunks whose marker the lake holds (both configurations write the lake)."""
    markers = work / "lake" / "_historian" / "_flows" / "f" / "markers"
    return sum(1 for _ in markers.iterdir()) if markers.exists() else 0


def kill_after(process: subprocess.Popen[bytes], work: Path, chunks: int, delay_s: float) -> bool:
    """SIGKILL once `chunks` are committed and `delay_s` more has passed; False if it ended."""
    deadline = time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline:
        if committed_chunks(work) >= chunks:
            time.sleep(delay_s)
            break
        time.sleep(0.002)
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    return True


def visible_temp_files(root: Path) -> list[Path]:
    lake = root / "lake" / "f"
    if not lake.exists():
        return []
    return [p for p in lake.rglob("*") if p.is_file() and not p.name.endswith(".parquet")]


@pytest.fixture(params=["lake+duckdb", "postgres", "delta+iceberg"])
def pg(request: pytest.FixtureRequest) -> tuple[str, str] | str | None:
    if request.param == "postgres":
        return (request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))
    if request.param == "delta+iceberg":
        return "tables"
    return None


@pytest.mark.slow
def test_sigkill_then_resume_gives_the_uninterrupted_output(
    tmp_path: Path, pg: tuple[str, str] | str | None
) -> None:
    tables = pg == "tables"  # the table formats beside the lake, instead of DuckDB
    if isinstance(pg, str):
        pg = None
    node = {"simulator": {"seed": 21, "tags": 40}}
    reference = tmp_path / "reference"
    reference.mkdir()
    write_config(reference, node=node, flows=flows(), sinks=["lake", "duck"])
    finish(backfill(reference))
    expected = contents(reference / "flows.yaml")["lake"]
    assert expected, "the reference run wrote rows"

    rng = random.Random(1234)
    kills = 0
    # The table formats commit each chunk in ~0.1 s more than the lake: one kill there.
    for attempt in range(1 if tables else 3 if pg is None else 2):
        work = tmp_path / f"killed{attempt}"
        work.mkdir()
        sinks = ["lake", "duck"] if pg is None else ["lake", "pg"]
        if tables:
            sinks = ["lake", "delta", "ice"]
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
        # The direct run joins a window's batches into one write (pipelines/coalesce.py):
        # the table formats' run is one of 18 markers, so its kill comes within them.
        upper = 15 if tables else CHUNKS * 2 // 3
        kills += kill_after(process, work, rng.randint(3, upper), rng.uniform(0, 0.05))
        process.communicate(timeout=60)
        assert not visible_temp_files(work), "no half-written file visible to readers"
        finish(backfill(work))
        got = contents(work / "flows.yaml")
        for name, rows in got.items():
            assert rows == expected, f"{name} after kill {attempt}"
    assert kills >= 1, "at least one run was killed mid-way"
