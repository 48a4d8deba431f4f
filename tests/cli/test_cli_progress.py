"""A run shows its progress where a person or a log collector reads it: bars on a
terminal (a pseudo-terminal here), nothing on a pipe, JSON progress lines under
--log-format json."""

from __future__ import annotations

import errno
import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from tests.cli.test_cli import HISTORIAN, historian, small_flow
from tests.fixtures import write_config

END = (datetime.now(UTC) - timedelta(hours=1)).replace(minute=0, second=0, microsecond=0)
START = END - timedelta(hours=2)
BACKFILL = ["backfill", "f", "--start", START.isoformat(), "--end", END.isoformat()]
CHUNKS = 4  # two hours in windows of 30 minutes, one batch of tags


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with run_server(SimulatedNode(SimConfig(seed=13, tags=12)), https_port=None) as handle:
        yield handle.http_url


def project(tmp_path: Path, sim_url: str) -> None:
    flow = small_flow(window="30m", start=START.isoformat())
    write_config(tmp_path, node={"url": sim_url}, flows={"f": flow}, sinks=["lake"])


def on_a_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """The command with its stderr on a pseudo-terminal: its exit code and what the
    terminal received."""
    controller, terminal = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160"}
    env.pop("HISTORIAN_DEBUG", None)
    process = subprocess.Popen(
        [HISTORIAN, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=terminal
    )
    os.close(terminal)
    received = bytearray()
    while True:
        try:
            part = os.read(controller, 65536)
        except OSError as exc:  # EIO: the terminal's last writer has gone
            if exc.errno != errno.EIO:
                raise
            break
        if not part:
            break
        received += part
    os.close(controller)
    return process.wait(timeout=300), received.decode(errors="replace")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pseudo-terminal")
def test_a_run_on_a_terminal_shows_a_progress_bar_and_on_a_pipe_none(
    tmp_path: Path, sim_url: str
) -> None:
    project(tmp_path, sim_url)
    code, screen = on_a_terminal(BACKFILL, tmp_path)
    assert code == 0, screen
    assert "rows/s" in screen, screen
    assert f"{CHUNKS}/{CHUNKS}" in screen, "chunks done of planned"
    assert "━" in screen, "the bar"
    piped = historian(*BACKFILL, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == "", "nothing but the summary on a pipe"


def progress_lines(stderr: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stderr.splitlines()]
    return [line for line in lines if "progress" in line]


def test_json_logs_carry_progress_lines_every_n_seconds_and_at_the_end(
    tmp_path: Path, sim_url: str
) -> None:
    project(tmp_path, sim_url)
    every = historian(
        "--log-format", "json", *BACKFILL, cwd=tmp_path, env={"HISTORIAN_PROGRESS_EVERY_S": "0"}
    )
    assert every.returncode == 0, every.stderr
    lines = progress_lines(every.stderr)
    assert [line["progress"]["chunks_done"] for line in lines] == list(range(1, CHUNKS + 1))
    last = lines[-1]
    assert last["flow"] == "f"
    assert last["level"] == "INFO"
    assert last["progress"]["chunks_planned"] == CHUNKS
    assert last["progress"]["rows"] > 0
    assert last["progress"]["eta_s"] == 0
    assert last["message"].startswith(f"f: {CHUNKS} of {CHUNKS} chunks, ")
    # The default period (10 s) is longer than this run: its last chunk's line only.
    (tmp_path / "lake").rename(tmp_path / "lake-before")
    quiet = historian("--log-format", "json", *BACKFILL, cwd=tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert [line["progress"]["chunks_done"] for line in progress_lines(quiet.stderr)] == [CHUNKS]


def test_a_progress_period_that_is_not_a_number_is_one_line(tmp_path: Path, sim_url: str) -> None:
    project(tmp_path, sim_url)
    result = historian(
        *BACKFILL, "--direct", cwd=tmp_path, env={"HISTORIAN_PROGRESS_EVERY_S": "often"}
    )
    # Read only under --log-format json: a text run ignores it.
    assert result.returncode == 0, result.stderr
    failed = historian(
        "--log-format",
        "json",
        *BACKFILL,
        cwd=tmp_path,
        env={"HISTORIAN_PROGRESS_EVERY_S": "often"},
    )
    assert failed.returncode == 2
    (line,) = failed.stderr.splitlines()
    assert "HISTORIAN_PROGRESS_EVERY_S: 'often' is not a number of seconds" in line
