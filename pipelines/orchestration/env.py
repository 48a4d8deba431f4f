"""Prefect settings for a quiet, offline command line; applied before prefect is imported.

* Telemetry off (`PREFECT_SERVER_ANALYTICS_ENABLED=false`, `DO_NOT_TRACK=1`): no network
  beyond the node, the sinks and the Prefect API.
* Prefect's own loggers at WARNING; the flow-run logger (`prefect.flow_runs`) at INFO so
  that the flow's log lines reach the API (the UI shows them). Task runs log warnings and
  errors only: a task per chunk, and Prefect's "Finished in state Completed()" lines
  are not worth a database row each. While `historian run` drives a flow,
  `quiet_run_console()` keeps the run loggers off the terminal: the CLI prints its own
  progress, summary and one-line errors, and a failed task's traceback stays in the API's
  run log instead of flooding stderr. `historian serve` keeps them on the terminal.
* The ephemeral server's task-run recorder writes in batches (100 events or 1 s): with
  Prefect's default (one event per write) it lagged behind a run of many chunks. For the
  command line's one-off runs (`cli_run(record_task_runs=False)`) the ephemeral server
  starts without the recorder: the server stops when the command exits, and its shutdown
  cancels a recorder write in flight, which Prefect logs as `task_run_recorder - Error
  flushing N events` with a 60-line traceback on the user's terminal (batching made it
  rare, not gone: 1 of 5 CI runs in Prefect 3.9.1, a test of a quiet run failed on it).
  The flow run, its logs and its summary artifact are still recorded; the per-chunk task
  runs are not (nothing of this tool reads them; `historian run` prints its own
  progress). Library callers of `run_prefect` keep the recorder. An explicit
  `PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED` is kept; with `PREFECT_API_URL` set
  (a real server) the recorder settings are left alone.
* `historian run` turns flow-run heartbeats off (`cli_run()`), on any server: Prefect's
  heartbeat thread (on by default, every 180 s) sleeps in 1 s steps and the synchronous
  flow-run machinery joins it when the run ends, so every run ended on the next whole second
  after its start (an empty flow: 1.1 s with, 0.13 s without; a run of 1.1 s took 2.0 s).
  Heartbeats serve an automation that marks a run Crashed when its process vanishes
  unseen (`pipelines/orchestration/fleet.py`, for runs on work-pool workers); a one-off command's run
  is its terminal's foreground process. An explicit `PREFECT_FLOWS_HEARTBEAT_FREQUENCY`
  (environment or Prefect profile) is kept. Scheduled runs (`historian serve`) and
  work-pool runs keep Prefect's heartbeats.
* `historian run` and `backfill` run in this process, without Prefect, unless a Prefect
  server is configured (`prefect_server_configured()`: `PREFECT_API_URL`, or the active
  Prefect profile naming one), which is read without importing Prefect (a second and a
  half): then each flow is a flow run on that server. `--prefect` asks for a flow run
  anyway; without a configured server it goes to Prefect's own ephemeral server, which Prefect's client starts on first use and stops at exit
  (`PREFECT_SERVER_ALLOW_EPHEMERAL_MODE`, Prefect's default); `historian serve` starts a
  full local server instead (`pipelines/orchestration/server.py`), because schedules need the
  scheduler the ephemeral server does not run.

Every value is a default: an explicit environment variable always wins.
"""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from pipelines.orchestration.children import end_with_this_process

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
RECORDER_SETTING = "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED"


def prefect_server_configured() -> bool:
    """Whether Prefect would send a flow run to a server the user configured: a non-empty
    `PREFECT_API_URL` in the environment or in the active profile of Prefect's profiles
    file (`PREFECT_PROFILES_PATH`, else `PREFECT_HOME/profiles.toml`; the active one is
    `PREFECT_PROFILE`, else the file's `active`). Read here without importing Prefect; a
    test holds it to what Prefect's own settings say."""
    if "PREFECT_API_URL" in os.environ:
        return bool(os.environ["PREFECT_API_URL"])
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        profiles = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return False  # no profiles file: Prefect's defaults name no server
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active")
    profile = profiles.get("profiles", {}).get(active, {}) if isinstance(active, str) else {}
    return isinstance(profile, dict) and bool(profile.get("PREFECT_API_URL"))


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
def cli_run(*, record_task_runs: bool = True) -> Iterator[None]:
    """Settings for one run driven by the command line (see the module docstring)."""
    with ExitStack() as stack:
        stack.enter_context(quiet_run_console())
        if _on_ephemeral_server():
            _ephemeral_server_ends_with_us(record_task_runs)
        if not _user_set(*HEARTBEAT_SETTINGS):
            from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

            stack.enter_context(
                temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
            )
        yield


HEARTBEAT_SETTINGS = ("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", "PREFECT_RUNNER_HEARTBEAT_FREQUENCY")


def _user_set(*names: str) -> bool:
    """Whether the user set any of these Prefect settings, in the environment or the
    active profile (then it is theirs, not ours to change)."""
    if any(name in os.environ for name in names):
        return True
    from prefect.context import get_settings_context

    profile = get_settings_context().profile
    return any(setting.name in names for setting in profile.settings)


def _ephemeral_server_ends_with_us(record_task_runs: bool) -> None:
    """Start Prefect's ephemeral server now, as its client would on first use (the same
    instance: Prefect keeps one per process), ending with this process from its first
    instant, even on SIGKILL, which leaves Prefect's own `atexit` no chance to stop it
    (`pipelines/orchestration/ephemeral.py`); the first start on a home one at a time."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import (
        PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED,
        get_current_settings,
        temporary_settings,
    )

    from pipelines.orchestration.ephemeral import BoundEphemeralServer, first_setup

    server: SubprocessASGIServer = BoundEphemeralServer()
    with ExitStack() as stack:
        if not record_task_runs and not _user_set(RECORDER_SETTING):
            # The server takes the settings set now (Prefect passes them to its process).
            stack.enter_context(
                temporary_settings(
                    updates={PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED: False}
                )
            )
        if not server.running:
            stack.enter_context(first_setup(Path(get_current_settings().home).expanduser()))
        server.start()
    process = server.server_process
    if process is None or isinstance(server, BoundEphemeralServer):
        return
    # Started earlier by Prefect's client itself: a watchdog ends it with us from now on.
    if getattr(server, "_historian_watchdog", None) is None:
        server._historian_watchdog = end_with_this_process(process.pid)  # type: ignore[attr-defined]


def _on_ephemeral_server() -> bool:
    """Whether a run now goes to Prefect's ephemeral server (no API configured)."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    return not settings.api.url and bool(settings.server.ephemeral.enabled)
