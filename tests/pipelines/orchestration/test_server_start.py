"""A Prefect server a command starts ends with it from the first instant, and the first
start on a fresh Prefect home is quiet even when two commands make it at once.

Every process a test's command starts carries a marker in its environment (children
inherit it), so what is left behind is found by walking /proc, whoever its parent is now.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import write_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="walks /proc"),
]

HISTORIAN = str(Path(sys.executable).with_name("historian"))
MARK = "HISTORIAN_TEST_MARK"
START_S = 300  # a server starts within this on a busy machine, or the test fails
GONE_S = 60  # what a killed command started has ended within this


def marked(mark: str) -> dict[int, list[str]]:
    """Every live process whose environment holds `MARK=mark`: its pid and command line."""
    found: dict[int, list[str]] = {}
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if "\nState:\tZ" in (entry / "status").read_text():
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
    return found


def wait_until(
    what: str,
    ready: Callable[[], bool],
    within_s: float,
    running: subprocess.Popen[bytes] | None = None,
) -> None:
    """Poll `ready` (an observable event: a process, a file, an open port) until it holds,
    failing at once if the `running` command ends first."""
    deadline = time.monotonic() + within_s
    while not ready():
        if running is not None and running.poll() is not None:
            raise AssertionError(f"the command ended (code {running.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within_s:.0f} s: {what}")
        time.sleep(0.02)


def server_of(mark: str, command: int) -> tuple[int, list[str]] | None:
    """The Prefect server process among the marked ones (not the command itself)."""
    for pid, args in marked(mark).items():
        joined = " ".join(args)
        if pid != command and ("uvicorn" in joined or "server start" in joined):
            return pid, args
    return None


def listening(args: list[str]) -> bool:
    port = int(args[args.index("--port") + 1])
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def command(args: list[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A `historian` command, its stderr in `cwd/stderr.txt`; whatever of it is still
    running at the end is killed."""
    with (cwd / "stderr.txt").open("wb") as stderr:
        process = subprocess.Popen(
            [HISTORIAN, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=60)
        for pid in marked(env[MARK]):
            os.kill(pid, signal.SIGKILL)


def config(tmp_path: Path) -> Path:
    flow: dict[str, Any] = {
        "node": "n",
        "tags": {"browse": "/", "include": ["."]},
        "mode": "raw",
        "window": "30m",
        "start": "2026-11-01T00:00:00Z",
        "settle": "0s",
        "schedule": {"interval": "1h"},
    }
    return write_config(
        tmp_path, node={"simulator": {"seed": 3, "tags": 10}}, flows={"f": flow}, sinks=["lake"]
    )


def environment(tmp_path: Path) -> dict[str, str]:
    env = {**os.environ, MARK: uuid.uuid4().hex, "PREFECT_HOME": str(tmp_path / "prefect")}
    for name in ("PREFECT_API_URL", "HISTORIAN_DEBUG"):
        env.pop(name, None)
    return env


COMMANDS = {
    "run": ["run", "f", "--end", "2026-11-01T02:00:00Z", "--prefect"],  # Prefect's ephemeral server
    "serve": ["serve"],  # a `prefect server start` of its own
}
MOMENTS = ("spawned", "database", "listening")


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_killed_while_its_prefect_server_starts_leaves_no_process(
    tmp_path: Path, name: str, moment: str
) -> None:
    config(tmp_path)
    env = environment(tmp_path)
    database = tmp_path / "prefect" / "prefect.db"
    with command(COMMANDS[name], tmp_path, env) as process:
        wait_until(
            "the server process",
            lambda: server_of(env[MARK], process.pid) is not None,
            START_S,
            process,
        )
        found = server_of(env[MARK], process.pid)
        assert found is not None
        if moment == "database":
            wait_until("the server's database", database.exists, START_S, process)
        if moment == "listening":
            wait_until("the server's port", lambda: listening(found[1]), START_S, process)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
        try:
            wait_until("no process left", lambda: not marked(env[MARK]), GONE_S)
        except AssertionError:
            left = {pid: " ".join(args)[:120] for pid, args in marked(env[MARK]).items()}
            raise AssertionError(f"left after SIGKILL at {moment}: {left}") from None


def test_two_first_runs_on_a_fresh_prefect_home_are_quiet(tmp_path: Path) -> None:
    env = environment(tmp_path)
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
        config(folder)
    with (
        command(COMMANDS["run"], folders[0], env) as first,
        command(COMMANDS["run"], folders[1], env) as second,
    ):
        codes = [first.wait(timeout=START_S), second.wait(timeout=START_S)]
    for code, folder in zip(codes, folders, strict=True):
        stderr = (folder / "stderr.txt").read_text()
        assert code == 0, stderr
        assert "Traceback" not in stderr, stderr


def waiting_on(lock: Path) -> bool:
    """Whether a process waits for the flock on `lock` (a blocked entry in /proc/locks)."""
    inode = f":{lock.stat().st_ino} "
    return any(
        "->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines()
    )


def test_a_first_run_waits_for_another_setting_up_its_prefect_home(tmp_path: Path) -> None:
    """The first start on a home is one process at a time: while another holds the home's
    set-up, a run starts no server of its own; after, it runs as usual."""
    config(tmp_path)
    env = environment(tmp_path)
    lock = tmp_path / "prefect" / "historian-setup.lock"  # ephemeral.LOCK_NAME
    lock.parent.mkdir()
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with command(COMMANDS["run"], tmp_path, env) as process:
            wait_until(
                "the run waiting for the home's set-up", lambda: waiting_on(lock), START_S, process
            )
            assert server_of(env[MARK], process.pid) is None, "no server while another sets up"
            fcntl.flock(held, fcntl.LOCK_UN)
            assert process.wait(timeout=START_S) == 0, (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in (tmp_path / "stderr.txt").read_text()
