"""Soak: SIGKILL `historian backfill` at many random points, resume, compare with a clean run.

    .venv/bin/python bench/soak_kill.py --kills 20 --sinks lake,duck
    .venv/bin/python bench/soak_kill.py --kills 10 --sinks pg
    .venv/bin/python bench/soak_kill.py --kills 30 --path prefect --kill-within 15
    .venv/bin/python bench/soak_kill.py --kills 30 --path prefect --hours 1 --tags 8
        --kill-within 20 --start-share 0.5     (one command line)

Each cycle starts a backfill into a fresh directory (and, for PostgreSQL, a fresh
schema), kills it with SIGKILL after a random delay (seeded) across the clean run's
duration - sometimes several times in a row - then lets it finish, and compares every
sink row for row with the reference. `--path direct` runs the default path, in the
command's process (no flag; no Prefect server is configured in the cycle's fresh Prefect
home); `--path prefect` goes through Prefect's ephemeral server (`--prefect`), on a fresh
Prefect home per cycle, so kills land in the server's start-up and its database's first
set-up too. `--kill-within S` draws kill points from the first S seconds, where the
server starts; with `--start-share P` only that share of them, the others over the
reference's whole duration. Each kill is classed by what /proc shows at its moment: no
server process yet, the server starting (its process alive, its port not open yet), the
server answering; or, in process, before or after the first committed chunk.

Processes left: every process a cycle starts carries a marker in its environment, and
after the resume any such process still alive (after a bound for SIGTERM'd servers to
stop) counts as left behind; so does any uvicorn, prefect or historian process whose
working directory or command line lies in the soak's directory, whatever its
environment (/proc walked, no pid file trusted). `--hours` and `--tags` size the
backfill: small ones keep 30 + 30 cycles within minutes on a loaded machine. Prints
rows lost, rows duplicated and processes left per cycle (all must be 0) and a summary
line for docs/reliability.md. `--parallel N` runs N cycles side by side (each its own
directories, Prefect home and server; kill points seeded per cycle).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.config.destinations import SinkSet
from tests.fixtures import canonical, load, write_config

HISTORIAN = str(Path(sys.executable).with_name("historian"))
START = "2026-11-01T00:00:00Z"
PG_URL = os.environ.get(
    "HISTORIAN_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
NAMES = (b"uvicorn", b"prefect", b"historian")


def end_of(hours: float) -> str:
    start = datetime.fromisoformat(START.replace("Z", "+00:00"))
    return (start + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M:%SZ")


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
RESUMES = 3  # attempts at the resume before the soak stops
GONE_S = 30.0  # a server told to stop (SIGTERM) by its dead command ends within this


def backfill(cwd: Path, path: str, mark: str, end: str) -> subprocess.Popen[bytes]:
    flag = ["--prefect"] if path == "prefect" else []
    env = {**os.environ, MARK: mark, "PREFECT_HOME": str(cwd / "prefect")}
    env.pop("PREFECT_API_URL", None)
    return subprocess.Popen(
        [HISTORIAN, "backfill", "f", "--start", START, "--end", end, *flag],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _read(entry: Path, name: str) -> bytes:
    try:
        return (entry / name).read_bytes()
    except OSError:
        return b""


def _live(entry: Path) -> bool:
    try:
        return "\nState:\tZ" not in (entry / "status").read_text()
    except OSError:
        return False


def marked(mark: str) -> list[int]:
    """Live processes whose environment holds `MARK=mark` (Linux /proc)."""
    needle = f"{MARK}={mark}".encode()
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and needle in _read(entry, "environ").split(b"\0") and _live(entry)
    ]


def strays(root: Path) -> list[int]:
    """Live uvicorn, prefect or historian processes working in or naming `root`, whatever
    their environment: what the marker could miss (a process started with its own env)."""
    here = str(root).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        command = _read(entry, "cmdline")
        if not any(name in command for name in NAMES):
            continue
        try:
            cwd = os.readlink(entry / "cwd").encode()
        except OSError:
            cwd = b""
        if (cwd.startswith(here) or here in command) and _live(entry):
            found.append(int(entry.name))
    return found


def processes_left(mark: str, root: Path) -> int:
    """How many of a cycle's processes outlive it (then killed, so cycles do not add up)."""
    deadline = time.monotonic() + GONE_S
    while (left := set(marked(mark)) | set(strays(root))) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    return len(left)


def phase(mark: str, path: str, lake: Path) -> str:
    """Where the command is at this instant, by /proc and the lake: Prefect path - no
    server process yet, server starting (alive, port closed), server answering; in
    process - before or after its first committed chunk."""
    if path != "prefect":
        markers = lake / "_historian" / "_flows" / "f" / "markers"
        return "after a commit" if markers.is_dir() and any(markers.iterdir()) else "before"
    for pid in marked(mark):
        command = _read(Path("/proc") / str(pid), "cmdline").split(b"\0")
        if b"uvicorn" not in command or b"--port" not in command:
            continue
        port = int(command[command.index(b"--port") + 1])
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        except OSError:
            return "server starting"
        return "server up"
    return "no server yet"


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


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=10, help="cycles")
    parser.add_argument("--sinks", default="lake,duck")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--path", choices=["direct", "prefect"], default="direct")
    parser.add_argument("--hours", type=float, default=8.0, help="hours backfilled")
    parser.add_argument("--tags", type=int, default=40, help="simulator tags")
    parser.add_argument(
        "--kill-within",
        type=float,
        help="kill in the first S seconds (default: the reference's duration)",
    )
    parser.add_argument(
        "--start-share",
        type=float,
        default=1.0,
        help="share of kill points drawn within --kill-within (the rest: whole duration)",
    )
    parser.add_argument(
        "--max-kills", type=int, default=3, help="at most this many kills before a resume"
    )
    parser.add_argument(
        "--parallel", type=int, default=1, help="cycles run side by side (each its own dirs)"
    )
    return parser.parse_args()


def make_schema(schema: str, *, drop: bool = False) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        conn.execute(
            sa.text(f'drop schema "{schema}" cascade' if drop else f'create schema "{schema}"')
        )
    engine.dispose()


class Soak:
    """The reference, then cycles of kills and a resume, with their tallies."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.sinks = args.sinks.split(",")
        self.lock = threading.Lock()  # cycles may run side by side (--parallel)
        self.node = {"simulator": {"seed": 21, "tags": args.tags}}
        self.end = end_of(args.hours)
        self.totals: Counter[str] = Counter()
        self.phases: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.duration = 0.0
        self.expected: list[Any] = []

    def reference(self) -> None:
        reference = self.root / "reference"
        reference.mkdir()
        write_config(reference, node=self.node, flows=flows(), sinks=["lake"])
        began = time.monotonic()
        process = backfill(reference, self.args.path, uuid.uuid4().hex, self.end)
        if process.wait() != 0:
            raise SystemExit(
                process.stderr.read().decode() if process.stderr else "reference failed"
            )
        self.duration = time.monotonic() - began
        self.expected = contents(reference / "flows.yaml")["lake"]
        print(f"reference: {len(self.expected):,} rows in {self.duration:.1f} s", flush=True)

    def kill_point(self, rng: random.Random) -> float:
        within = self.args.kill_within
        if within is not None and rng.random() < self.args.start_share:
            return rng.uniform(0.02, 1.0) * within
        return rng.uniform(0.02, 1.0) * self.duration

    def kills(self, work: Path, mark: str, rng: random.Random) -> list[str]:
        """The moments (`phase`) at which this cycle's runs were killed."""
        kills: list[str] = []
        for _ in range(rng.choice([1, 1, 2, 3][: self.args.max_kills + 1])):
            process = backfill(work, self.args.path, mark, self.end)
            time.sleep(self.kill_point(rng))
            if process.poll() is None:
                moment = phase(mark, self.args.path, work / "lake")
                process.send_signal(signal.SIGKILL)
                with self.lock:
                    self.phases[moment] += 1
                kills.append(moment)
            process.wait()
        return kills

    def resume(self, work: Path, mark: str) -> None:
        """Run the backfill to its end; a failed attempt (on a loaded machine, Prefect's
        server not up within its start-up bound) is counted with its line and tried again."""
        for _ in range(RESUMES):
            process = backfill(work, self.args.path, mark, self.end)
            _, err = process.communicate()
            if process.returncode == 0:
                return
            line = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            with self.lock:
                self.totals["resumes failed"] += 1
                self.failures[line[0][:160]] += 1
        raise SystemExit(f"resume failed {RESUMES} times: {line[0]}")

    def cycle(self, cycle: int) -> None:
        work = self.root / f"cycle{cycle}"
        work.mkdir()
        schema = f"soak_{uuid.uuid4().hex[:8]}"
        if "pg" in self.sinks:
            make_schema(schema)
        write_config(
            work,
            node=self.node,
            flows=flows(),
            sinks=self.sinks,
            pg=(PG_URL, schema) if "pg" in self.sinks else None,
        )
        mark = uuid.uuid4().hex
        kills = self.kills(work, mark, random.Random(f"{self.args.seed}-{cycle}"))
        self.resume(work, mark)
        left = processes_left(mark, work)
        for name, rows in contents(work / "flows.yaml").items():
            lost, duplicated = diff(rows, self.expected)
            with self.lock:
                self.totals["lost"] += lost
                self.totals["duplicated"] += duplicated
            print(
                f"cycle {cycle:3d} sink {name:5} kills {len(kills)} lost {lost} "
                f"duplicated {duplicated} processes left {left} ({', '.join(kills)})",
                flush=True,
            )
        with self.lock:
            self.totals["left"] += left
            self.totals["kills"] += len(kills)
        shutil.rmtree(work, ignore_errors=True)
        if "pg" in self.sinks:
            make_schema(schema, drop=True)

    def summary(self) -> str:
        moments = ", ".join(f"{n} {what}" for what, n in sorted(self.phases.items()))
        return (
            f"{self.args.kills} cycles, {self.totals['kills']} SIGKILLs ({moments}) into "
            f"{self.args.sinks} ({self.args.path} path, {len(self.expected):,} rows, "
            f"reference {self.duration:.1f} s): rows lost {self.totals['lost']}, rows "
            f"duplicated {self.totals['duplicated']}, processes left {self.totals['left']}; "
            f"resumes failed and tried again {self.totals['resumes failed']}"
            + "".join(f"\n  {n} x {line}" for line, n in self.failures.items())
        )


def main() -> None:
    args = arguments()
    root = Path(tempfile.mkdtemp(prefix="soak-"))
    try:
        soak = Soak(args, root)
        soak.reference()
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            for done in [pool.submit(soak.cycle, cycle) for cycle in range(args.kills)]:
                done.result()
        print(f"\n{soak.summary()}; {time.monotonic() - began:.0f} s", flush=True)
        totals = soak.totals
        if totals["lost"] or totals["duplicated"] or totals["left"]:
            raise SystemExit(1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
