"""Where a one-off run runs: in this process unless a Prefect server is configured
(`PREFECT_API_URL`, or the active Prefect profile), then as a flow run on it; `--prefect`
asks for a flow run, `--direct` for this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from tests.cli.test_cli import assert_clean_failure, historian, small_flow
from tests.fixtures import write_config


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with run_server(SimulatedNode(SimConfig(seed=9, tags=12)), https_port=None) as handle:
        yield handle.http_url


# The command as its entry point runs it, reporting at exit which big packages it imported.
PROBE = """
import atexit, json, sys
from pipelines.cli.app import main
atexit.register(lambda: print(json.dumps(sorted({m.split('.')[0] for m in sys.modules}
                                                & {'prefect', 'pandas'})), file=sys.stderr))
sys.argv = ["historian", *sys.argv[1:]]
main()
"""


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), **extra}
    for name in ("PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH"):
        if name not in extra:
            env.pop(name, None)
    return env


def test_a_run_without_a_configured_server_runs_in_process_without_prefect(
    tmp_path: Path, sim_url: str
) -> None:
    write_config(tmp_path, node={"url": sim_url}, flows={"f": small_flow()}, sinks=["lake"])
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, "run", "f"],
        cwd=tmp_path,
        env=clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stderr.strip().splitlines()[-1]) == ["pandas"], probe.stderr
    assert "historian run" in probe.stdout
    assert not (tmp_path / "prefect").exists(), "no Prefect home, no temporary server"
    assert list((tmp_path / "lake").rglob("*.parquet")), "the rows were written"


def test_direct_and_prefect_together_are_refused(tmp_path: Path, sim_url: str) -> None:
    write_config(tmp_path, node={"url": sim_url}, flows={"f": small_flow()}, sinks=["lake"])
    for command in (["run", "f"], ["backfill", "f", "--start", "-1h"]):
        result = historian(*command, "--direct", "--prefect", cwd=tmp_path)
        assert_clean_failure(result, 2, "give --direct or --prefect, not both")
    assert not (tmp_path / "lake").exists()


PROFILES = """
active = "{active}"
[profiles.local]
PREFECT_API_URL = "http://127.0.0.1:4200/api"
[profiles.offline]
PREFECT_LOGGING_LEVEL = "ERROR"
[profiles.blank]
PREFECT_API_URL = ""
"""

CASES: dict[str, tuple[dict[str, str], str | None]] = {
    "no profiles file": ({}, None),
    "active profile names a server": ({}, "local"),
    "active profile names none": ({}, "offline"),
    "active profile names an empty one": ({}, "blank"),
    "PREFECT_PROFILE picks the server": ({"PREFECT_PROFILE": "local"}, "offline"),
    "PREFECT_PROFILE picks none": ({"PREFECT_PROFILE": "offline"}, "local"),
    "PREFECT_API_URL set": ({"PREFECT_API_URL": "http://127.0.0.1:4200/api"}, "offline"),
    "PREFECT_API_URL empty": ({"PREFECT_API_URL": ""}, "local"),
}

AGREE = """
import json
from pipelines.orchestration.env import prefect_server_configured
ours = prefect_server_configured()
from prefect.settings import get_current_settings
print(json.dumps([ours, bool(get_current_settings().api.url)]))
"""


@pytest.mark.parametrize(("extra", "active"), CASES.values(), ids=CASES.keys())
def test_a_configured_server_is_read_as_prefect_reads_it(
    tmp_path: Path, extra: dict[str, Any], active: str | None
) -> None:
    """What makes a run go to Prefect is exactly what makes Prefect's client use a server:
    read here without importing Prefect, held to Prefect's own settings."""
    if active is not None:
        (tmp_path / "prefect").mkdir()
        (tmp_path / "prefect" / "profiles.toml").write_text(PROFILES.format(active=active))
    probe = subprocess.run(
        [sys.executable, "-c", AGREE],
        cwd=tmp_path,
        env=clean_env(tmp_path, **extra),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    ours, prefects = json.loads(probe.stdout)
    assert ours == prefects
