"""Soak: SIGKILL `historian backfill` at many random points, resume, compare with a clean run.

    .venv/bin/python bench/soak_kill.py --kills 20 --sinks lake,duck
    .venv/bin/python bench/soak_kill.py --kills 10 --sinks pg
    .venv/bin/python bench/soak_kill.py --kills 30 --path prefect --kill-within 15

Each cycle starts a backfill into a fresh directory (and, for PostgreSQL, a fresh
schema), kills it with SIGKILL after a random delay (seeded) across the clean run's
duration — sometimes several times in a row — then lets it finish, and compares every
sink row for row with the reference. `--path direct` runs in the command's process
(`--direct`); `--path prefect` through Prefect's ephemeral server (`--prefect`), on a fresh Prefect
home per cycle, so kills land in the server's start-up and its database's first set-up
too (`--kill-within S` draws the kill points from the first S seconds, where the server
starts, instead of the reference's whole duration). Every process a cycle starts carries a marker in its environment: after the resume,
any such process still alive (after a bound for SIGTERM'd servers to stop) counts as
left behind. Prints rows lost, rows duplicated and processes left per cycle (all must be
0) and a summary line for docs/reliability.md.
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


MARK = "HISTORIAN_SOAK_MARK"
GONE_S = 30.0  # a server told to stop (SIGTERM) by its dead command ends within this


def backfill(cwd: Path, path: str, mark: str) -> subprocess.Popen[bytes]:
    direct = ["--direct"] if path == "direct" else ["--prefect"]
    env = {**os.environ, MARK: mark, "PREFECT_HOME": str(cwd / "prefect")}
    env.pop("PREFECT_API_URL", None)
    return subprocess.Popen(
        [HISTORIAN, "backfill", "f", "--start", START, "--end", END, *direct],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def marked(mark: str) -> list[int]:
    """Live processes whose environment holds `MARK=mark` (Linux /proc)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and needle in (entry / "environ").read_bytes().split(b"\0")
                and "\nState:\tZ" not in (entry / "status").read_text()
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def processes_left(mark: str) -> int:
    """How many of a cycle's processes outlive it (then killed, so cycles do not add up)."""
    deadline = time.monotonic() + GONE_S
    while (left := marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return len(left)


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
    parser.add_argument("--path", choices=["direct", "prefect"], default="direct")
    parser.add_argument(
        "--kill-within",
        type=float,
        help="kill in the first S seconds (default: the reference's duration)",
    )
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
        process = backfill(reference, args.path, uuid.uuid4().hex)
        if process.wait() != 0:
            raise SystemExit(
                process.stderr.read().decode() if process.stderr else "reference failed"
            )
        duration = time.monotonic() - began
        expected = contents(reference / "flows.yaml")["lake"]
        print(f"reference: {len(expected):,} rows in {duration:.1f} s", flush=True)
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
            mark = uuid.uuid4().hex
            for _ in range(rng.choice([1, 1, 2, 3])):
                process = backfill(work, args.path, mark)
                time.sleep(rng.uniform(0.02, 1.0) * (args.kill_within or duration))  # where to kill
                if process.poll() is None:
                    process.send_signal(signal.SIGKILL)
                    kills += 1
                process.wait()
            process = backfill(work, args.path, mark)
            if process.wait() != 0:
                raise SystemExit(
                    f"resume failed: {process.stderr.read().decode() if process.stderr else ''}"
                )
            left = processes_left(mark)
            totals["left"] += left
            for name, rows in contents(work / "flows.yaml").items():
                lost, duplicated = diff(rows, expected)
                totals["lost"] += lost
                totals["duplicated"] += duplicated
                print(
                    f"cycle {cycle:3d} sink {name:5} kills {kills} lost {lost} "
                    f"duplicated {duplicated} processes left {left}",
                    flush=True,
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
            f"\n{args.kills} cycles, {totals['kills']} SIGKILLs into {args.sinks} "
            f"({args.path} path): rows lost {totals['lost']}, rows duplicated "
            f"{totals['duplicated']}, processes left {totals['left']}"
        )
        if totals["lost"] or totals["duplicated"] or totals["left"]:
            raise SystemExit(1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
