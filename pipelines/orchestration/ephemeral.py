"""Prefect's ephemeral server for a one-off command: it ends with the command from its
first instant, and the first set-up of a Prefect home is made by one command at a time.

* Prefect's client starts the ephemeral server with a plain `subprocess.Popen`. A watchdog
  attached after `start()` returned left a command killed during the start (12 s on a
  busy machine) with the server running under init. `BoundEphemeralServer` starts the same
  process with the kernel's parent-death signal set between fork and exec
  (`children.die_with_parent`), so there is no instant at which it can outlive us.
* Two servers that create one Prefect database at once race through its migrations (a
  `duplicate column name` traceback, `Application startup failed`, on the user's terminal).
  `first_setup(home)` makes that set-up one process at a time, under a lock file in the
  home; once a home is set up for this Prefect version and database, starts do not wait.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import prefect
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import get_current_settings

from pipelines.orchestration.children import die_with_parent

LOCK_NAME = "historian-setup.lock"


class BoundEphemeralServer(SubprocessASGIServer):
    """Prefect's ephemeral server (the one instance Prefect's client uses: it keeps one per
    port), whose process receives SIGTERM when the thread that started it dies."""

    def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
        # Prefect 3.9's command and environment (SubprocessASGIServer._run_uvicorn_command),
        # with the parent-death hook the original cannot take.
        server_env = {
            "PREFECT_UI_ENABLED": "0",
            "PREFECT__SERVER_EPHEMERAL": "1",
            "PREFECT__SERVER_FINAL": "1",
        }
        return subprocess.Popen(
            args=[
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                str(prefect.__module_path__.parent),
                "--factory",
                "prefect.server.api.server:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "error",
                "--lifespan",
                "on",
            ],
            env={
                **os.environ,
                **server_env,
                **get_current_settings().to_environment_variables(exclude_unset=True),
            },
            preexec_fn=die_with_parent(),
            # Not in the terminal's process group: Ctrl-C reaches the command, which ends
            # its run (marking it in this server) and then stops the server, in order.
            start_new_session=True,
        )


def _setup_marker(home: Path) -> Path:
    """The file that says this home's database was set up by this Prefect version."""
    url = get_current_settings().server.database.connection_url
    database = url.get_secret_value() if url is not None else ""
    key = hashlib.sha256(f"{prefect.__version__}\0{database}".encode()).hexdigest()[:16]
    return home / f"historian-setup-{key}.done"


@contextmanager
def first_setup(home: Path) -> Iterator[None]:
    """Hold the block alone among the processes on `home` until one such block has once
    completed there for this Prefect version and database; after that, at once."""
    marker = _setup_marker(home)
    if marker.exists():
        yield
        return
    home.mkdir(parents=True, exist_ok=True)
    with (home / LOCK_NAME).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or we die
        yield
        marker.touch()
