"""Ctrl-C and SIGTERM end every command on every path within 5 s: exit 130 or 143, one
line, no process left, the chunks committed before kept (the next run continues).

Real signals to a real `historian` subprocess: Ctrl-C is SIGINT to its process group, as
a terminal sends it. Each signal goes at an observed moment: a chunk committed (the -v
line) and the next history request held by the node (`held_node`), so the command is
waiting on the node, the slowest place to be interrupted in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import pandas as pd
import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from tests.cli.held_node import HeldNode, held_node
from tests.cli.test_cli import HISTORIAN, small_flow
from tests.fixtures import write_config

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="walks /proc")

LINE = "error: interrupted; committed chunks are kept and the next run continues"
BOUND_S = 5.0  # from the signal to the command's exit
READY_S = 300  # for a Prefect server to start and a run to reach the node, on a busy machine
MARK = "HISTORIAN_TEST_MARK"
END = (datetime.now(UTC) - timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
START = END - timedelta(hours=2)
WINDOW = timedelta(minutes=30)
# The node answers the first window whole, then holds: its chunk commits, the next waits.
FIRST_WINDOW_END = START + WINDOW


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with run_server(SimulatedNode(SimConfig(seed=21, tags=12)), https_port=None) as handle:
        yield handle.http_url


def marked(mark: str) -> list[str]:
    """Every live process whose environment holds `MARK=mark` (children inherit it,
    wherever they are reparented): their command lines."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or needle not in (entry / "environ").read_bytes():
                continue
            if "\nState:\tZ" not in (entry / "status").read_text():
                found.append((entry / "cmdline").read_bytes().decode().replace("\0", " "))
        except OSError:
            continue
    return found


class Command:
    """A `historian` command in a process group of its own, its stderr read line by line
    (events for the lines a test waits on), its stdout kept."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.mark = env[MARK]
        self.process = subprocess.Popen(
            [HISTORIAN, *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own group: "Ctrl-C" below reaches only it
        )
        self.stderr: list[str] = []
        self.stdout: list[str] = []
        self.committed = threading.Event()
        assert self.process.stderr is not None
        assert self.process.stdout is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stderr, True), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stdout, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], is_err: bool) -> None:
        for line in stream:
            (self.stderr if is_err else self.stdout).append(line.rstrip("\n"))
            if "committed" in line:
                self.committed.set()

    def wait_for(self, what: str, event: threading.Event) -> None:
        deadline = time.monotonic() + READY_S
        while not event.wait(0.2):
            if self.process.poll() is not None:
                raise AssertionError(f"ended before {what}: {self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {READY_S} s: {what}: {self.output()}")

    def interrupt(self, signum: int) -> float:
        """Send the signal (SIGINT to the group, as Ctrl-C does); seconds to the exit."""
        sent = time.monotonic()
        if signum == signal.SIGINT:
            os.killpg(self.process.pid, signal.SIGINT)
        else:
            self.process.send_signal(signum)
        try:
            self.process.wait(timeout=60)
        finally:
            for reader in self._readers:
                reader.join(10)
        return time.monotonic() - sent

    def output(self) -> str:
        return "\n".join(self.stdout + self.stderr)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


@contextmanager
def command(args: list[str], cwd: Path, env: dict[str, str]) -> Iterator[Command]:
    started = Command(args, cwd, env)
    try:
        yield started
    finally:
        started.kill()
        for pid in _pids(env[MARK]):
            os.kill(pid, signal.SIGKILL)


def _pids(mark: str) -> list[int]:
    needle = f"{MARK}={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def environment(tmp_path: Path) -> dict[str, str]:
    env = {
        **os.environ,
        MARK: uuid.uuid4().hex,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "COLUMNS": "200",
    }
    for name in ("PREFECT_API_URL", "HISTORIAN_DEBUG"):
        env.pop(name, None)
    return env


def assert_interrupted(run: Command, signum: int, took_s: float) -> None:
    output = run.output()
    assert run.process.returncode == 128 + signum, output
    assert took_s < BOUND_S, f"{took_s:.1f} s: {output}"
    assert "Traceback" not in output, output
    errors = [line for line in run.stderr if line.startswith("error:")]
    assert errors == [LINE], output
    left = marked(run.mark)
    assert not left, f"left running: {left}"


def lake_rows(tmp_path: Path) -> pd.DataFrame:
    return pd.read_parquet(tmp_path / "lake" / "f")


def flow_config(tmp_path: Path, node: HeldNode, **extra: Any) -> None:
    minutes = WINDOW // timedelta(minutes=1)
    flow = small_flow(window=f"{minutes}m", start=START.isoformat(), **extra)
    write_config(
        tmp_path, node={"url": node.url, "max_connections": 1}, flows={"f": flow}, sinks=["lake"]
    )


RUNS = {
    "default": ["backfill", "f", "--start", START.isoformat(), "--end", END.isoformat(), "-v"],
    "prefect": [
        "backfill",
        "f",
        "--start",
        START.isoformat(),
        "--end",
        END.isoformat(),
        "-v",
        "--prefect",
    ],
}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("path", sorted(RUNS))
def test_an_interrupted_run_ends_in_bounded_time_keeps_its_chunks_and_the_next_continues(
    tmp_path: Path, sim_url: str, path: str, signum: int
) -> None:
    if path == "prefect":
        pytest.importorskip("prefect")
    env = environment(tmp_path)
    with held_node(sim_url, until=FIRST_WINDOW_END) as node:
        flow_config(tmp_path, node)
        with command(RUNS[path], tmp_path, env) as run:
            run.wait_for("a chunk committed", run.committed)
            run.wait_for("a history request held by the node", node.held)
            took = run.interrupt(signum)
        assert_interrupted(run, signum, took)
        kept = lake_rows(tmp_path)
        assert len(kept) > 0, "the chunk committed before the signal is kept"
        node.release.set()
        again = subprocess.run(
            [HISTORIAN, *RUNS["default"]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert again.returncode == 0, again.stderr
    rows = lake_rows(tmp_path)
    assert len(rows) > len(kept)
    assert not rows.duplicated(["tag", "ts", "seq"]).any(), "the committed chunk not fetched twice"


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_serve_interrupted_during_a_scheduled_run_ends_with_its_server_and_run(
    tmp_path: Path, sim_url: str, signum: int
) -> None:
    """`historian serve` runs a local Prefect server and each scheduled run in a process
    of its own: a signal while a run waits on the node ends all of them, within the bound."""
    env = environment(tmp_path)
    with held_node(sim_url, answer=1) as node:
        flow_config(tmp_path, node, schedule={"interval": "4s"})
        with command(["serve"], tmp_path, env) as serve:
            serve.wait_for("a scheduled run waiting on the node", node.held)
            took = serve.interrupt(signum)
        assert_interrupted(serve, signum, took)


CATCHES_AND_LOGS = """
import logging, sys, threading
from pipelines.cli.base import Interrupted, interrupts
logging.getLogger("prefect").addHandler(logging.StreamHandler(sys.stderr))
interrupts.install()
try:
    print("ready", flush=True)
    threading.Event().wait(60)
except Interrupted:
    # What Prefect's runner does with an interrupt that reaches a flow run's start.
    logging.getLogger("prefect.runner.flow_run_executor").error("could not start", exc_info=True)
    logging.getLogger("historian.runner").warning("our own line stays")
    interrupts.finish()
"""


def test_what_a_library_logs_of_the_interrupt_stays_off_the_terminal(tmp_path: Path) -> None:
    """Prefect catches the `Interrupted` that reaches a served run's start and logs it with
    its traceback (CI, test_serve_fires_a_fleet_flow...): after the signal, the libraries'
    records are dropped, the command's own are not, and the one line ends it."""
    probe = subprocess.Popen(
        [sys.executable, "-c", CATCHES_AND_LOGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert probe.stdout is not None
    assert probe.stdout.readline() == "ready\n"
    probe.send_signal(signal.SIGINT)
    _, stderr = probe.communicate(timeout=30)
    assert probe.returncode == 130, stderr
    assert LINE in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert "could not start" not in stderr, stderr
    assert "our own line stays" in stderr, stderr
