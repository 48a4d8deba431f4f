"""A local Prefect server for `historian serve` when no `PREFECT_API_URL` is configured.

Schedules fire only where a server runs its scheduler service, which Prefect's throwaway
ephemeral server does not. So `serve` starts Prefect's own server, the documented way
(`prefect server start`), as a child process on a free loopback port, waits for its health
check and points this process's Prefect settings at it. It uses Prefect's PREFECT_HOME
(its database, like any `prefect server start`), so the runs stay visible to a later
server on the same home. Its log goes to `PREFECT_HOME/historian-server.log`. It ends with
the command, even a killed one (`pipelines/orchestration/children.py`).
"""

from __future__ import annotations

import os
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from pipelines.orchestration.children import Child

# A full server (migrations, services, the UI's files) starts slower than an ephemeral one:
# its own bound, generous for a busy machine.
STARTUP_TIMEOUT_ENV = "HISTORIAN_PREFECT_SERVER_STARTUP_SECONDS"
STARTUP_TIMEOUT_S = 240.0
LOG_NAME = "historian-server.log"


class ServerStartError(RuntimeError):
    """The local Prefect server did not come up (one line, with where its log is)."""


class ServerExited(ServerStartError):
    """The server process ended while starting (a port taken meanwhile, among others)."""


def free_port() -> int:
    """A port free on loopback now (a race for it is retried by `local_server`)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def prefect_home() -> Path:
    """Prefect's home folder as Prefect's settings resolve it (PREFECT_HOME or ~/.prefect)."""
    from prefect.settings import get_current_settings

    return Path(get_current_settings().home).expanduser()


def healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    lines = [line for line in lines if line]
    return lines[-1][:200] if lines else ""


def _start(log_path: Path, timeout: float, extra_env: Mapping[str, str]) -> tuple[Child, str]:
    """Start `prefect server start` and wait until it answers; the child and its API URL."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "true",
        "PREFECT_SERVER_UI_ENABLED": "true",
        "PREFECT_SERVER_LOGGING_LEVEL": os.environ.get("PREFECT_SERVER_LOGGING_LEVEL", "WARNING"),
        **extra_env,
        # The server's own clients (UI, services) talk to itself.
        "PREFECT_UI_API_URL": api_url,
    }
    env.pop("PREFECT_API_URL", None)
    with log_path.open("ab") as log:
        child = Child(
            [
                sys.executable,
                "-m",
                "prefect",
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env=env,
            stdout=log.fileno(),
            stderr=log.fileno(),
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            code = child.stop()
            raise ServerExited(
                f"the local Prefect server exited at start (code {code}): "
                f"{_last_line(log_path) or 'no output'} (log: {log_path})"
            )
        if healthy(api_url):
            return child, api_url
        time.sleep(0.2)
    child.stop()
    raise ServerStartError(
        f"the local Prefect server did not answer within {timeout:.0f} s "
        f"({STARTUP_TIMEOUT_ENV}; log: {log_path})"
    )


@contextmanager
def local_server(
    log_path: Path | None = None, env: Mapping[str, str] | None = None
) -> Iterator[str]:
    """A Prefect server of our own for the block; its API URL. Stopped on the way out.

    Its output goes to `log_path` (default: a log in Prefect's home); `env` adds to or
    overrides its environment (another home, a database, a log level).
    """
    if log_path is None:
        home = prefect_home()
        home.mkdir(parents=True, exist_ok=True)
        log_path = home / LOG_NAME
    from pipelines.orchestration.ephemeral import first_setup

    timeout = float(os.environ.get(STARTUP_TIMEOUT_ENV) or STARTUP_TIMEOUT_S)
    home = Path((env or {}).get("PREFECT_HOME") or prefect_home()).expanduser()
    attempts = 3  # another process may take the free port before the server binds it
    with first_setup(home):  # its database's migrations, one server at a time
        for attempt in range(attempts):
            try:
                child, api_url = _start(log_path, timeout, env or {})
                break
            except ServerExited:
                if attempt == attempts - 1:
                    raise
    with child:
        yield api_url


@contextmanager
def api_for_schedules() -> Iterator[tuple[str, bool]]:
    """The Prefect API whose scheduler fires `serve`'s schedules, and whether it is ours.

    With an API configured (`PREFECT_API_URL`, or a Prefect profile), that one. Otherwise a
    local server for the block; this process's settings and environment point at it, so
    the flow runs `serve` starts (subprocesses) report to it too.
    """
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    configured = get_current_settings().api.url
    if configured:
        yield str(configured), False
        return
    with local_server() as api_url:
        before = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = api_url
        try:
            with temporary_settings(updates={PREFECT_API_URL: api_url}):
                yield api_url, True
        finally:
            if before is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = before
