"""A real `prefect server start` for the tests that need a full server (a scheduler, work
pools, workers): one per test session (per xdist worker), shared by the tests that ask for
the `prefect_api` fixture (tests/conftest.py), which the suite runs in one xdist group."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

PREFECT = str(Path(sys.executable).with_name("prefect"))
RETRY_S = 60  # how long a test's own API call retries the server's "busy, retry" answer


def prefect_env(folder: Path, **extra: str) -> dict[str, str]:
    """The environment of a Prefect client or worker with its home in `folder`, and no API
    (`PREFECT_API_URL` names one where a test wants it)."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(folder / "prefect"),
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        **extra,
    }
    env.pop("PREFECT_API_URL", None)
    env.pop("HISTORIAN_DEBUG", None)
    return env


@contextmanager
def prefect_server(
    folder: Path, database_url: str | None = None
) -> Iterator[tuple[str, dict[str, str]]]:
    """A real `prefect server start` (`pipelines.orchestration.server.local_server`, as `serve`
    starts one) with its home and log in `folder`; its API and the environment of a
    client or worker that uses it. Its database is SQLite in `folder` unless
    `database_url` names another (`postgresql+asyncpg://...`)."""
    from pipelines.orchestration.server import local_server

    env = prefect_env(folder)
    server_env = {"PREFECT_HOME": env["PREFECT_HOME"]}
    if database_url is not None:
        server_env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    with local_server(folder / "server.log", server_env) as api:
        yield api, {**env, "PREFECT_API_URL": api}


def api_call(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """A test's own request to a Prefect server, retried (bounded) while the server answers
    503: Prefect's "busy, retry" answer (a locked database), which Prefect's own client
    retries too. Any other failure raises at once."""
    deadline = time.monotonic() + RETRY_S
    while True:
        response = httpx.request(method, url, timeout=30, **kwargs)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response.raise_for_status()
        time.sleep(1)


def delete_pool_deployments(api: str, pool: str) -> None:
    """Delete the deployments of work pool `pool`: on a shared server a test's schedules
    must not keep firing after it."""
    body = {"work_pools": {"name": {"any_": [pool]}}}
    for deployment in api_call("POST", f"{api}/deployments/filter", json=body).json():
        api_call("DELETE", f"{api}/deployments/{deployment['id']}")
