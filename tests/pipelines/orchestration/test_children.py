"""Child processes end with the command that started them: stopped in order, killed after
a grace period when they ignore SIGTERM, and ended by the kernel when the parent is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.orchestration.children import Child

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)",
]


def gone(pid: int, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return True
        if "\nState:\tZ" in status:
            return True
        time.sleep(0.05)
    return False


def test_leaving_the_block_stops_the_child() -> None:
    with Child(SLEEPER) as child:
        assert child.alive()
    assert not child.alive()
    assert child.process.returncode == -signal.SIGTERM


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    child = Child(STUBBORN, grace=0.5, stdout=subprocess.PIPE)
    assert child.process.stdout is not None
    assert child.process.stdout.readline().strip() == b"ready"
    began = time.monotonic()
    assert child.stop() == -signal.SIGKILL
    assert time.monotonic() - began < 10


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_parent_takes_its_child_along() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pipelines.orchestration.children import Child; "
            f"c = Child({SLEEPER!r}); print(c.pid, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert not gone(pid, within_s=0.2), "the child runs while its parent does"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        assert gone(pid), "the kernel ended the child with its parent"
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_process_started_by_a_library_ends_when_the_command_is_killed() -> None:
    """Prefect's ephemeral server is started by Prefect's client, not through `Child`: the
    watchdog of `end_with_this_process` ends it when the command dies by SIGKILL."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; from pipelines.orchestration.children import end_with_this_process; "
            f"p = subprocess.Popen({SLEEPER!r}, start_new_session=True); "
            "end_with_this_process(p.pid); print(p.pid, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert not gone(pid, within_s=0.5), "the process runs while the command does"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        assert gone(pid), "the watchdog ended the process with the command"
    finally:
        if parent.poll() is None:
            parent.kill()
