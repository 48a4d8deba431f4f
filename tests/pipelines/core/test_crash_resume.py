"""SIGKILL a backfill at random points, resume it, and get exactly the uninterrupted output.

The kill comes from outside (a real SIGKILL of the `historian backfill` process), once a
given number of writes is committed (early, middle or late in the run), plus a few
milliseconds drawn from a fixed seed so it lands inside a later write's fetch or commit:
progress, not time, picks the moment, so a faster sink does not finish before the kill.
The uninterrupted output is made once and compared with every configuration's.
`bench/soak_kill.py` runs many more kill points; CI runs these few.
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

from pipelines.config.destinations import SinkSet
from tests.fixtures import canonical, load, write_config
from tests.sinks.contract_ledger import assert_ledger_holds

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


# 6 h in 20-minute windows x 40 tags in batches of 8: 90 chunks, which the direct run
# joins into one write (one marker) per window (pipelines/core/coalesce.py).
WRITES = 18
NODE = {"simulator": {"seed": 21, "tags": 40}}


def committed_chunks(work: Path) -> int:
    """Writes whose marker the lake holds (every configuration writes the lake)."""
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


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The uninterrupted output, once for every configuration (the same node and flow)."""
    reference = tmp_path_factory.mktemp("reference")
    write_config(reference, node=NODE, flows=flows(), sinks=["lake"])
    finish(backfill(reference))
    rows = contents(reference / "flows.yaml")["lake"]
    assert rows, "the reference run wrote rows"
    return rows


# Each configuration is killed once, at its own point of the run (early, middle, late),
# a few milliseconds drawn from a fixed seed after that many of the WRITES committed.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("sinks", "kill_after_writes"),
    [(["lake", "duck"], 3), (["lake", "pg"], 9), (["lake", "delta", "ice"], 14)],
    ids=["lake+duckdb", "postgres", "delta+iceberg"],
)
def test_sigkill_then_resume_gives_the_uninterrupted_output(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    expected: list[Any],
    sinks: list[str],
    kill_after_writes: int,
) -> None:
    pg = None
    if "pg" in sinks:
        pg = (request.getfixturevalue("pg_url"), request.getfixturevalue("pg_schema"))
    write_config(tmp_path, node=NODE, flows=flows(), sinks=sinks, pg=pg)
    process = backfill(tmp_path)
    delay_s = random.Random(1234 + kill_after_writes).uniform(0, 0.05)
    assert kill_after(process, tmp_path, kill_after_writes, delay_s), "the run was killed mid-way"
    process.communicate(timeout=60)
    assert not visible_temp_files(tmp_path), "no half-written file visible to readers"
    finish(backfill(tmp_path))
    got = contents(tmp_path / "flows.yaml")
    assert set(got) == set(sinks)
    for name, rows in got.items():
        assert rows == expected, name
    # The completeness ledger survived the kill too: a row per tag and window, each
    # saying what the sink holds there (tests/sinks/contract_ledger.py).
    with SinkSet(load(tmp_path / "flows.yaml"), tmp_path) as opened:
        for name in sinks:
            ledger = assert_ledger_holds(opened.get(name), "f")
            assert len(ledger) == 40 * WRITES, name
            assert set(ledger["status"]) == {"complete"}, name
