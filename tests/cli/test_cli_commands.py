"""The commands a new user reaches for (issue 17): --version, shell completion, `init`,
`flows`, `plan` (a dry run that writes nothing) and JSON log lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from pipelines.cli.init import STARTER
from pipelines.config.models import load_config
from tests.cli.test_cli import HISTORIAN, assert_clean_failure, historian, small_flow
from tests.fixtures import write_config

END = (datetime.now(UTC) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
START = END - timedelta(hours=3)


@pytest.fixture(scope="module")
def node() -> Iterator[Any]:
    with run_server(SimulatedNode(SimConfig(seed=5, tags=12)), http_port=0, https_port=0) as h:
        yield h


def files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_version_and_shell_completion(tmp_path: Path) -> None:
    shown = historian("--version", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"historian-extract {version('historian-extract')}"
    # Typer detects the shell from the process tree; its own switch names it instead.
    named = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    script = historian("--show-completion", "bash", cwd=tmp_path, env=named)
    assert script.returncode == 0, script.stderr
    assert "_HISTORIAN_COMPLETE=complete_bash" in script.stdout
    # What bash asks the command when completing `historian st<TAB>`.
    env = {"_HISTORIAN_COMPLETE": "complete_bash", "COMP_WORDS": "historian st", "COMP_CWORD": "1"}
    completed = subprocess.run(
        [HISTORIAN], cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True
    )
    assert completed.stdout.split() == ["state"]


def test_init_writes_a_starter_that_loads_and_never_overwrites(tmp_path: Path) -> None:
    missing = historian("run", "--all", cwd=tmp_path)
    assert_clean_failure(missing, 2, "flows.yaml: no such file (`historian init` writes")
    written = historian("init", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    assert "wrote flows.yaml" in written.stdout
    path = tmp_path / "flows.yaml"
    assert path.read_text(encoding="utf-8") == STARTER
    config = load_config(path, env={})
    assert list(config.flows) == ["hourly", "quarter_hour_avg", "alarms"]
    assert STARTER.count("#") > 30, "commented"

    path.write_text("# mine\n", encoding="utf-8")
    again = historian("init", cwd=tmp_path)
    assert_clean_failure(again, 2, "flows.yaml: already exists; nothing written")
    assert path.read_text(encoding="utf-8") == "# mine\n"


def test_the_starter_passes_check_and_writes_nothing(tmp_path: Path) -> None:
    assert historian("init", cwd=tmp_path).returncode == 0
    checked = historian("check", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok flow hourly" in checked.stdout
    assert files(tmp_path) == ["flows.yaml"]


def aggregated_flow() -> dict[str, Any]:
    return small_flow(
        tags={"group": "/Plant A/"},
        mode="aggregated",
        method="avg",
        interval="15m",
        window="1h",
        start=START.isoformat(),
        schedule={"cron": "5 * * * *"},
    )


def test_flows_lists_every_flow_and_its_watermark(tmp_path: Path, node: Any) -> None:
    flows = {
        "avg": aggregated_flow(),
        "alarms": small_flow(kind="alarm_history", alarms={"path": "/"}, start=START.isoformat()),
    }
    del flows["alarms"]["tags"], flows["alarms"]["mode"], flows["alarms"]["batch"]
    write_config(tmp_path, node={"url": node.http_url}, flows=flows)
    before = files(tmp_path)
    listed = historian("flows", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert files(tmp_path) == before, "a listing creates no lake folder or DuckDB file"
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if "│" in line}
    avg = [cell.strip() for cell in rows["avg"].split("│")[1:-1]]
    assert avg == [
        "avg",
        "n",
        "tag_history",
        "group /Plant A/, recurrent",
        "aggregated avg 15m",
        "lake, duck",
        "cron 5 * * * *",
        "-",
    ]
    assert "alarms under /" in rows["alarms"]

    ran = historian("run", "avg", "--direct", "--end", END.isoformat(), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    listed = historian("flows", cwd=tmp_path)
    row = next(line for line in listed.stdout.splitlines() if line.startswith("│ avg"))
    assert row.split("│")[-2].strip() == END.strftime("%Y-%m-%d %H:%M:%SZ")


def test_plan_is_a_dry_run_that_estimates_and_knows_what_is_done(tmp_path: Path, node: Any) -> None:
    write_config(tmp_path, node={"url": node.http_url}, flows={"avg": aggregated_flow()})
    before = files(tmp_path)
    span = ["--start", START.isoformat(), "--end", END.isoformat()]
    planned = historian("plan", "avg", *span, cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert files(tmp_path) == before, "a plan writes nothing"
    text = planned.stdout
    assert "what `historian backfill avg` would do; nothing was written" in text
    assert "3 windows x 1 batch" in text
    assert "chunks: 3 planned, 0 already done in every sink, 3 to fetch" in text
    tags = int(text.split("  tags: ")[1].split()[0])
    estimate = int(text.split("estimated rows: ~")[1].split()[0].replace(",", ""))
    assert estimate == tags * 3 * 4, "3 hours of 15-minute averages per tag"

    ran = historian("backfill", "avg", "--direct", *span, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    rows = len(pd.read_parquet(tmp_path / "lake" / "avg"))
    assert rows == estimate
    again = historian("plan", "avg", *span, cwd=tmp_path)
    assert "chunks: 3 planned, 3 already done in every sink, 0 to fetch" in again.stdout
    assert "estimated rows: ~0" in again.stdout

    unknown = historian("plan", "nope", cwd=tmp_path)
    assert_clean_failure(unknown, 2, "no flow named 'nope'")


def test_log_format_json_is_one_object_per_line(tmp_path: Path, node: Any) -> None:
    write_config(tmp_path, node={"url": node.http_url}, flows={"avg": aggregated_flow()})
    args = ["--log-format", "json", "run", "avg", "--direct", "-v", "--end", END.isoformat()]
    ran = historian(*args, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stderr.splitlines()]
    assert lines, "chunk lines with -v"
    for line in lines:  # a progress line adds its numbers (test_cli_progress)
        assert set(line) - {"progress"} == {"time", "level", "flow", "chunk", "message"}
        assert datetime.fromisoformat(line["time"]).tzinfo is not None
    chunks = [line for line in lines if line["chunk"]]
    assert len(chunks) == 3
    assert {line["flow"] for line in chunks} == {"avg"}
    assert all(line["message"].startswith("committed ") for line in chunks)

    failed = historian("--log-format", "json", "run", "nope", "--direct", cwd=tmp_path)
    assert failed.returncode == 2
    (error,) = [json.loads(line) for line in failed.stderr.splitlines()]
    assert error["level"] == "ERROR"
    assert "no flow named 'nope'" in error["message"]
    bad = historian("--log-format", "xml", "flows", cwd=tmp_path)
    assert_clean_failure(bad, 2, "--log-format: 'xml' is not one of text, json")


def test_prefects_own_console_lines_are_json_lines_too(tmp_path: Path) -> None:
    # What `--log-format json` sets up before Prefect is imported; a Prefect logger then
    # writes (its server's, its workers' and its runs' console lines go the same way).
    script = (
        "from pipelines.cli.base import json_logs_for_prefect\n"
        "json_logs_for_prefect()\n"
        "import logging\nfrom prefect import flow  # Prefect configures its logging here\n"
        "logging.getLogger('prefect.server.api').warning('the server says %s', 'hello')\n"
        "logging.getLogger('uvicorn').error('a request failed')\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stderr.splitlines()]
    assert [(line["level"], line["message"]) for line in lines] == [
        ("WARNING", "the server says hello"),
        ("ERROR", "a request failed"),
    ]
