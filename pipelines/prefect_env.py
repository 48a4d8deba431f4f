"""Prefect settings for a quiet, offline command line; applied before prefect is imported.

* Telemetry off (`PREFECT_SERVER_ANALYTICS_ENABLED=false`, `DO_NOT_TRACK=1`): no network
  beyond the node, the sinks and the Prefect API.
* Prefect's own loggers at WARNING; the flow-run logger (`prefect.flow_runs`) at INFO so
  that the flow's log lines reach the API (the UI shows them). Task runs log warnings and
  errors only: two tasks per chunk, and Prefect's "Finished in state Completed()" lines
  are not worth a database row each. While `historian run` drives a flow,
  `quiet_run_console()` keeps the run loggers off the terminal: the CLI prints its own
  progress, summary and one-line errors, and a failed task's traceback stays in the API's
  run log instead of flooding stderr. `historian serve` keeps them on the terminal.
* The ephemeral server's task-run recorder writes in batches. With Prefect's default
  (one event per write) the recorder lags behind a run of many chunks, and when the CLI
  exits, the server's shutdown cancels a write in progress and prints
  `task_run_recorder - Error flushing 1 events` with a traceback (reproduced: 121 one-minute
  chunks, 3 of 3 runs). Batched (100 events or 1 s), the message handler only queues, the
  periodic flush is idle at shutdown, and the final flush records the rest: 3 of 3 runs
  quiet, and every task run is recorded (243 of 243). Turning the recorder off
  (`PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED=false`) also silences it, but loses
  the task runs a later `prefect server start` on the same PREFECT_HOME would show.
  With `PREFECT_API_URL` set (a real server) the recorder settings are left alone.
* On the ephemeral server, `historian run` turns flow-run heartbeats off (`cli_run()`):
  Prefect's heartbeat thread sleeps in 1 s steps and the flow waits for it at the end,
  which added ~1 s to every run (an empty flow: 1.1 s with, 0.13 s without). Heartbeats
  let a server notice crashed runs; a throwaway server that ends with the command has
  nothing to notice. With a real server (`PREFECT_API_URL` or a profile), they stay on.

* The ephemeral server is started by `historian` itself (`start_ephemeral_server()`), not
  by Prefect's client: the same command Prefect runs (uvicorn with Prefect's app factory,
  the UI off, only the services an ephemeral server runs), on the same PREFECT_HOME
  database, stopped the same way at exit. Two things change. The command starts it as soon
  as it knows it will run a flow, so the server boots (~5 s of imports, mostly) while the
  command loads its config and imports Prefect, instead of after. And the command never
  imports `prefect.server` itself, which Prefect's client does just to launch the server
  (~2-4 s of CPU). A run then points Prefect at it for its duration (`cli_run()`). When an
  API is configured (`PREFECT_API_URL` in the environment, a profile, a test harness), no
  server is started, and one started early is stopped unused.

Every value is a default: an explicit environment variable always wins.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

QUIET_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
    "PREFECT_LOGGING_LOG_PRINTS": "false",
    "PREFECT_UI_ENABLED": "false",
    "PREFECT_CLI_COLORS": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
    # A local Dask cluster (HISTORIAN_TASK_RUNNER=dask) logs every worker at INFO.
    "DASK_LOGGING__DISTRIBUTED": "warning",
    "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "warning",
}
EPHEMERAL_ONLY = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "100",
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "1",
}
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
# What Prefect's own SubprocessASGIServer sets for an ephemeral server's process.
SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
}
STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
PORT_IN_USE = 3  # uvicorn's exit code when it cannot bind


def configure_prefect() -> None:
    """Set quiet, offline defaults (never overriding what the user set)."""
    for key, value in QUIET_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if not os.environ.get("PREFECT_API_URL"):
        for key, value in EPHEMERAL_ONLY.items():
            os.environ.setdefault(key, value)


@contextmanager
def quiet_run_console() -> Iterator[None]:
    """Keep Prefect's run loggers off the terminal for the block; the API still gets them."""
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    before = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.propagate = False
    try:
        yield
    finally:
        for logger, propagate in zip(loggers, before, strict=True):
            logger.propagate = propagate


@contextmanager
def cli_run() -> Iterator[None]:
    """Settings for one run driven by the command line (see the module docstring)."""
    with ExitStack() as stack:
        stack.enter_context(quiet_run_console())
        api = _ephemeral_api()
        if api is not None:
            stack.enter_context(_run_settings(api))
        yield


# Settings of runs on historian's ephemeral server, by the settings they were derived from.
# Deriving them (what `temporary_settings` does) validates every Prefect setting again:
# ~10 % of a small run's time, measured, so it is done once per process and base settings.
_RUN_SETTINGS: list[tuple[Any, str, Any]] = []


def _run_settings(api: str) -> AbstractContextManager[Any]:
    """Prefect's current settings with the API at `api` and flow-run heartbeats off."""
    import prefect.context
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    current = prefect.context.get_settings_context()
    known = [d for base, url, d in _RUN_SETTINGS if base is current.settings and url == api]
    if known:
        derived = known[0]
    else:
        derived = current.settings.copy_with_update(
            updates={PREFECT_API_URL: api, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
        )
        del _RUN_SETTINGS[:-3]  # a few at most: the process's settings rarely change
        _RUN_SETTINGS.append((current.settings, api, derived))
    return prefect.context.SettingsContext(profile=current.profile, settings=derived)


class EphemeralServer:
    """One throwaway Prefect API server process for this command (see the module docstring)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.ready = False
        self._lock = threading.Lock()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> None:
        """Launch the server process (returns at once; `wait()` for it to answer)."""
        with self._lock:
            if self.process is not None:
                return
            self._launch()
            atexit.register(self.stop)

    def _launch(self) -> None:
        spec = importlib.util.find_spec("prefect")  # finds the package without importing it
        if spec is None or spec.origin is None:
            raise RuntimeError("prefect is not installed")
        app_dir = os.path.dirname(os.path.dirname(spec.origin))  # site-packages
        with socket.socket() as probe:  # a free port; a race for it is retried in wait()
            probe.bind(("127.0.0.1", 0))
            self.port = int(probe.getsockname()[1])
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--app-dir",
                app_dir,
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
            env={**os.environ, **SERVER_ENV},
        )

    def wait(self) -> str:
        """Block until the server answers its health check; its API URL."""
        with self._lock:
            if self.process is None:
                self._launch()
                atexit.register(self.stop)
            if self.ready:
                return self.api_url
            timeout = float(os.environ.get(STARTUP_TIMEOUT_ENV) or 60)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                assert self.process is not None
                code = self.process.poll()
                if code == PORT_IN_USE:  # someone took the port meanwhile: another one
                    self._launch()
                    continue
                if code is not None:
                    raise RuntimeError(f"the Prefect server exited at start (code {code})")
                try:
                    with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as answer:
                        if answer.status == 200:
                            self.ready = True
                            return self.api_url
                except (urllib.error.URLError, ConnectionError, TimeoutError):
                    pass
                time.sleep(0.05)
            raise RuntimeError(
                f"the Prefect server did not start within {timeout:.0f} s ({STARTUP_TIMEOUT_ENV})"
            )

    def stop(self) -> None:
        """Terminate the server and wait for it (its services flush on the way out)."""
        with self._lock:
            process, self.process, self.ready = self.process, None, False
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_SERVER = EphemeralServer()


def start_ephemeral_server() -> None:
    """Start booting the ephemeral server now, unless `PREFECT_API_URL` names a server.

    Call it as early as the command knows it will run a flow through Prefect; `cli_run()`
    waits for it (or stops it unused when Prefect's settings name another API).
    """
    configure_prefect()
    if not os.environ.get("PREFECT_API_URL"):
        _SERVER.start()


def _ephemeral_api() -> str | None:
    """The URL of historian's ephemeral server when the run should use one, else None."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        _SERVER.stop()  # started early, but an API is configured (or ephemeral is off)
        return None
    return _SERVER.wait()
