"""Prefect settings for a quiet, offline command line; applied before prefect is imported.

* Telemetry off (`PREFECT_SERVER_ANALYTICS_ENABLED=false`, `DO_NOT_TRACK=1`): no network.
* Prefect's own loggers at WARNING; the flow's log lines (logger `historian`) stay.
* The throwaway ephemeral server's task-run recorder is turned off: at shutdown it
  printed `task_run_recorder - Error flushing` tracebacks while its database went away.
  The cost is that this throwaway server does not keep task-run rows, which nobody can
  look at after the command exits anyway; flow runs, logs and artifacts are still
  recorded. With `PREFECT_API_URL` set (a real server), nothing here is changed, so a
  real server records everything.
Every value is a default: an explicit environment variable wins.
"""

from __future__ import annotations

import os

QUIET_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_LOGGING_LOG_PRINTS": "false",
    "PREFECT_UI_ENABLED": "false",
    "PREFECT_CLI_COLORS": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "60",
    # A local Dask cluster (HISTORIAN_TASK_RUNNER=dask) logs every worker at INFO.
    "DASK_LOGGING__DISTRIBUTED": "warning",
    "DASK_DISTRIBUTED__LOGGING__DISTRIBUTED": "warning",
}
EPHEMERAL_ONLY = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED": "false",
}


def configure_prefect() -> None:
    """Set quiet, offline defaults (never overriding what the user set)."""
    for key, value in QUIET_DEFAULTS.items():
        os.environ.setdefault(key, value)
    if not os.environ.get("PREFECT_API_URL"):
        for key, value in EPHEMERAL_ONLY.items():
            os.environ.setdefault(key, value)
