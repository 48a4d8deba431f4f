"""Child processes that end with the command that started them.

`historian serve` starts a Prefect server; the guide's rule is that whatever a command
starts ends with it, even when the command is killed. A normal exit, Ctrl-C and SIGTERM
stop the child through `Child.stop()` (the caller's `with` block). A SIGKILL leaves no
chance to run any code, so on Linux the child asks the kernel to send it SIGTERM when its
parent dies (`prctl(PR_SET_PDEATHSIG)`), set between fork and exec.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import TracebackType

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> Callable[[], None] | None:
    """A pre-exec hook that makes the child receive SIGTERM when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    parent = os.getpid()

    def hook() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


class Child:
    """One child process, stopped (SIGTERM, then SIGKILL after `grace` s) on `stop()`,
    on leaving its `with` block, and by the kernel when this process dies."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        grace: float = 10.0,
        stdout: int | None = None,
        stderr: int | None = None,
    ) -> None:
        self.args = list(args)
        self.grace = grace
        # A session of its own: Ctrl-C in the terminal reaches this process only, which
        # then stops the child in order (the child does not die first, mid-run).
        self.process = subprocess.Popen(
            self.args,
            env=dict(env) if env is not None else None,
            stdout=stdout,
            stderr=stderr,
            preexec_fn=die_with_parent(),
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int | None:
        """Terminate the child and wait for it; its exit code (None if it was not ours)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=self.grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# The watchdog's program: on SIGTERM (the kernel's, when the command dies) it ends the
# watched process, if that pid is still the process it was given (same start time).
_WATCHDOG = """
import os, signal, sys
pid, started, parent = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
def same():
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19] == started
    except (OSError, IndexError):
        return False
def end(*_):
    if same():
        os.kill(pid, signal.SIGTERM)
    os._exit(0)
signal.signal(signal.SIGTERM, end)
if os.getppid() != parent:
    end()
while True:
    signal.pause()
"""


def start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), which tells a process
    from a later one given the same pid; None when there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def end_with_this_process(pid: int) -> Child | None:
    """Make a process this one did not start itself (Prefect's ephemeral server, started by
    Prefect's client) end when this process dies, even by SIGKILL: a small watchdog child
    gets the kernel's SIGTERM at our death and passes it on. The watchdog is left running
    (a normal exit ends it the same way, after the watched process has stopped). None where
    /proc is missing (not Linux)."""
    started = start_time(pid)
    if started is None:
        return None
    return Child(
        [sys.executable, "-S", "-c", _WATCHDOG, str(pid), started, str(os.getpid())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, parents before their children (Linux /proc; empty
    elsewhere), whatever session or process group each is in."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop(0)
        try:
            tasks = list(Path(f"/proc/{current}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.append(child)
                    todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def end_descendants(grace_s: float = 1.0) -> None:
    """SIGTERM every process below this one, then SIGKILL what still runs after `grace_s`:
    what an interrupted command started (Prefect's servers, a served flow run's process)
    ends with it, even when the command cannot wait for them in order."""
    pids = descendants(os.getpid())
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # no event to wait on for a process that is not our child
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def end_flow_runs(flow_run_ids: Collection[str], grace_s: float) -> None:
    """SIGTERM the processes below this one that run these Prefect flow runs (a runner's
    subprocesses name theirs in `PREFECT__FLOW_RUN_ID`) and wait up to `grace_s` for them
    to end: `serve` lets its tails stop their own way before Prefect's runner, unwinding,
    kills its subprocesses outright."""
    wanted = {f"PREFECT__FLOW_RUN_ID={run_id}".encode() for run_id in flow_run_ids}
    ours = []
    for pid in descendants(os.getpid()):
        try:
            environ = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if environ & wanted:
            ours.append(pid)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_alive(pid) for pid in ours) and time.monotonic() < deadline:
        time.sleep(0.05)  # no event to wait on for a process that is not our child
