"""Soak: SIGKILL `historian backfill` at many random points, resume, compare with a clean run.

    .venv/bin/python bench/soak_kill.py --kills 20 --sinks lake,duck
    .venv/bin/python bench/soak_kill.py --kills 10 --sinks pg

Each cycle starts a backfill into a fresh directory (and, for PostgreSQL, a fresh
schema), kills it with SIGKILL after a random delay (seeded) across the clean run's
duration — sometimes several times in a row — then lets it finish, and compares every
sink row for row with the reference. Prints rows lost and rows duplicated per cycle
(both must be 0) and a summary line for RELIABILITY.md.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.config.destinations import SinkSet
from tests.fixtures import canonical, load, write_config

HISTORIAN = str(Path(sys.executable).with_name("historian"))
START, END = "2026-11-01T00:00:00Z", "2026-11-01T08:00:00Z"
PG_URL = os.environ.get(
    "HISTORIAN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


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
    return subprocess.Popen(
        [HISTORIAN, "backfill", "f", "--start", START, "--end", END, "--direct"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def contents(path: Path) -> dict[str, list[Any]]:
    config = load(path)
    with SinkSet(config, path.parent) as sinks:
        return {
            name: canonical(sinks.get(name).read("f", "tag_history"))
            for name in config.flows["f"].sinks
        }


def diff(got: list[Any], want: list[Any]) -> tuple[int, int]:
    have, need = Counter(got), Counter(want)
    lost = sum((need - have).values())
    duplicated = sum((have - need).values())
    return lost, duplicated


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--sinks", default="lake,duck")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    sinks = args.sinks.split(",")
    rng = random.Random(args.seed)
    node = {"simulator": {"seed": 21, "tags": 40}}
    root = Path(tempfile.mkdtemp(prefix="soak-"))
    try:
        reference = root / "reference"
        reference.mkdir()
        write_config(reference, node=node, flows=flows(), sinks=["lake"])
        began = time.monotonic()
        process = backfill(reference)
        if process.wait() != 0:
            raise SystemExit(
                process.stderr.read().decode() if process.stderr else "reference failed"
            )
        duration = time.monotonic() - began
        expected = contents(reference / "flows.yaml")["lake"]
        print(f"reference: {len(expected):,} rows in {duration:.1f} s")
        totals = Counter()
        for cycle in range(args.kills):
            work = root / f"cycle{cycle}"
            work.mkdir()
            schema = f"soak_{uuid.uuid4().hex[:8]}"
            if "pg" in sinks:
                import sqlalchemy as sa

                engine = sa.create_engine(PG_URL)
                with engine.begin() as conn:
                    conn.execute(sa.text(f'create schema "{schema}"'))
                engine.dispose()
            write_config(
                work,
                node=node,
                flows=flows(),
                sinks=sinks,
                pg=(PG_URL, schema) if "pg" in sinks else None,
            )
            kills = 0
            for _ in range(rng.choice([1, 1, 2, 3])):
                process = backfill(work)
                time.sleep(rng.uniform(0.1, 1.0) * duration)
                if process.poll() is None:
                    process.send_signal(signal.SIGKILL)
                    kills += 1
                process.wait()
            process = backfill(work)
            if process.wait() != 0:
                raise SystemExit(
                    f"resume failed: {process.stderr.read().decode() if process.stderr else ''}"
                )
            for name, rows in contents(work / "flows.yaml").items():
                lost, duplicated = diff(rows, expected)
                totals["lost"] += lost
                totals["duplicated"] += duplicated
                print(
                    f"cycle {cycle:3d} sink {name:5} kills {kills} lost {lost} duplicated {duplicated}"
                )
            totals["kills"] += kills
            shutil.rmtree(work, ignore_errors=True)
            if "pg" in sinks:
                import sqlalchemy as sa

                engine = sa.create_engine(PG_URL)
                with engine.begin() as conn:
                    conn.execute(sa.text(f'drop schema "{schema}" cascade'))
                engine.dispose()
        print(
            f"\n{args.kills} cycles, {totals['kills']} SIGKILLs into {args.sinks}: "
            f"rows lost {totals['lost']}, rows duplicated {totals['duplicated']}"
        )
        if totals["lost"] or totals["duplicated"]:
            raise SystemExit(1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
