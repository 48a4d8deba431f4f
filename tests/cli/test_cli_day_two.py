"""Day-two operations through the `historian` command (issue 17): `run --all` runs every
flow and says which failed, `state reset --tag` re-extracts that tag only, a warehouse
held by another process is named as busy."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pytest

from connectors.simulator import SimConfig, SimulatedNode, run_server
from tests.cli.test_cli import HISTORIAN, assert_clean_failure, historian, small_flow
from tests.fixtures import load, write_config

# A fixed past range: every command extracts the same rows, whatever the time.
END = (datetime.now(UTC) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
START = END - timedelta(hours=3)


@pytest.fixture(scope="module")
def node() -> Iterator[Any]:
    with run_server(SimulatedNode(SimConfig(seed=11, tags=12)), http_port=0, https_port=0) as h:
        yield h


def group_flow() -> dict[str, Any]:
    return small_flow(
        tags={"group": "/Plant A/", "recurrent": True}, window="1h", start=START.isoformat()
    )


def lake_rows(tmp_path: Path, dataset: str) -> pd.DataFrame:
    return pd.read_parquet(tmp_path / "lake" / dataset)


def duck_count(tmp_path: Path, dataset: str) -> tuple[int, int]:
    """Rows, and distinct (tag, ts, seq) keys, in the DuckDB warehouse."""
    with duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True) as conn:
        found = conn.sql(f"select count(*), count(distinct (tag, ts, seq)) from {dataset}")
        rows, keys = found.fetchone() or (0, 0)
    return int(rows), int(keys)


def newest_chunks(tmp_path: Path, flow: str, sink: str, count: int) -> list[Any]:
    from pipelines.config.destinations import SinkSet

    config = load(tmp_path / "flows.yaml")
    with SinkSet(config, tmp_path) as sinks:
        return sinks.get(sink).chunk_log(flow, count)


def statuses(table: str) -> dict[str, str]:
    """flow -> status, from the summary table's rows."""
    rows = [line.split("│") for line in table.splitlines() if line.startswith("│")]
    return {cells[1].strip(): cells[-2].strip() for cells in rows}


def test_run_all_runs_every_flow_and_names_the_one_that_failed(tmp_path: Path, node: Any) -> None:
    flows = {
        "broken": small_flow(tags={"paths": ["/No/Such tag"]}, start=START.isoformat()),
        "good": group_flow(),
    }
    write_config(tmp_path, node={"url": node.http_url}, flows=flows, sinks=["lake"])
    result = historian("run", "--all", "--direct", "--end", END.isoformat(), cwd=tmp_path)
    line = assert_clean_failure(result, 1, "1 of 2 flows failed: broken")
    assert "reasons above" in line
    table = result.stdout
    assert statuses(table) == {"broken": "failed", "good": "ok"}
    assert "failed flow broken: node n: " in table
    assert "'/No/Such tag' not found" in table
    assert len(lake_rows(tmp_path, "good")) > 0, "the flow after the failed one ran"
    assert not (tmp_path / "lake" / "broken").exists()


def test_run_all_that_succeeds_exits_0_with_a_status_per_flow(tmp_path: Path, node: Any) -> None:
    flows = {"a": group_flow(), "b": group_flow()}
    write_config(tmp_path, node={"url": node.http_url}, flows=flows, sinks=["lake"])
    result = historian("run", "--all", "--direct", "--end", END.isoformat(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert statuses(result.stdout) == {"a": "ok", "b": "ok"}


def test_state_reset_of_one_tag_re_extracts_that_tag_only(tmp_path: Path, node: Any) -> None:
    write_config(tmp_path, node={"url": node.http_url}, flows={"f": group_flow()})
    end = END.isoformat()
    first = historian("run", "f", "--direct", "--end", end, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    before = lake_rows(tmp_path, "f")
    tags = sorted(before["tag"].unique())
    assert len(tags) > 2
    tag = tags[1]
    tag_rows = int((before["tag"] == tag).sum())

    unknown = historian("state", "reset", "f", "--tag", "/Plant A/nope", "-y", cwd=tmp_path)
    assert_clean_failure(unknown, 2, "--tag", "'/Plant A/nope' is not a tag of flow 'f'")

    for command in (["run", "f"], ["backfill", "f", "--start", START.isoformat()]):
        reset = historian("state", "reset", "f", "--tag", tag, "-y", cwd=tmp_path)
        assert reset.returncode == 0, reset.stderr
        again = historian(*command, "--direct", "--end", end, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        for sink in ("lake", "duck"):
            chunks = newest_chunks(tmp_path, "f", sink, 3)
            # One tag, and the record of the node it came from (pipelines/state.py).
            assert [c.members for c in chunks] == [1 + 1] * 3, (command, sink)
            assert sum(c.rows_fetched for c in chunks) == tag_rows, (command, sink)
        after = lake_rows(tmp_path, "f")
        key = ["tag", "ts", "seq"]
        assert len(after) == len(before) == len(after.drop_duplicates(key))
        assert duck_count(tmp_path, "f") == (len(before), len(before))


def read_back_lines(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    return [line.strip() for line in lines[lines.index("Read it back:") + 1 :]]


@pytest.mark.parametrize("kind", ["tag_history", "alarm_history"])
def test_read_it_back_lines_run_as_printed(tmp_path: Path, node: Any, kind: str) -> None:
    flow = group_flow()
    if kind == "alarm_history":
        flow = small_flow(kind=kind, alarms={"path": "/"}, window="1h", start=START.isoformat())
        del flow["tags"], flow["mode"], flow["batch"]
    write_config(tmp_path, node={"url": node.http_url}, flows={"f": flow})
    result = historian("run", "f", "--direct", "--end", END.isoformat(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = read_back_lines(result.stdout)
    assert len(lines) == 2
    for line in lines:
        assert line.startswith(sys.executable), "the interpreter that has pandas and duckdb"
        shown = subprocess.run(line, shell=True, cwd=tmp_path, capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        if "duckdb" in line:  # grouped by the dataset's key column: tag, or path for alarms
            assert ("path" if kind == "alarm_history" else "tag") in shown.stdout.split()[1:3]
            assert "count_star()" in shown.stdout
        else:
            assert " rows x " in shown.stdout


# Holds the DuckDB warehouse and flow f's lock in it, as a run of f does while it writes.
HOLDER = """
import sys
from sinks.sql.warehouse import SqlWarehouse
sink = SqlWarehouse("duckdb:///" + sys.argv[1], name="duck")
sink.open()
with sink.lock("f"):
    print("holding", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def held_warehouse(tmp_path: Path, node: Any) -> Iterator[subprocess.Popen[str]]:
    """Flows f and g (lake and DuckDB), f extracted once, then the warehouse held by
    another process as if f were running."""
    flows = {"f": group_flow(), "g": group_flow()}
    # The warehouse first: `report` reads a flow's first sink, so it has to fall back.
    write_config(tmp_path, node={"url": node.http_url}, flows=flows, sinks=["duck", "lake"])
    first = historian("run", "f", "--direct", "--end", END.isoformat(), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "warehouse.duckdb")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        yield holder
    finally:
        holder.kill()
        holder.wait(timeout=10)


def test_a_held_warehouse_is_named_busy_and_readers_still_work(
    tmp_path: Path, held_warehouse: subprocess.Popen[str]
) -> None:
    busy = f"warehouse duck busy: flow f is writing (pid {held_warehouse.pid})"
    state = historian("state", cwd=tmp_path)
    assert state.returncode == 0, state.stderr
    assert busy in state.stdout
    lake_row = [line for line in state.stdout.splitlines() if "│ lake" in line and "│ f " in line]
    assert len(lake_row) == 1
    assert END.strftime("%Y-%m-%d %H:%M:%SZ") in lake_row[0], "the lake's progress is shown"

    report = historian("report", "f", "--out", "f.html", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert f"sink duck: {busy}; try again when it ends; reading sink lake instead" in report.stderr
    assert "Read from parquet lake" in (tmp_path / "f.html").read_text(encoding="utf-8")

    other = historian("run", "g", "--direct", "--end", END.isoformat(), cwd=tmp_path)
    assert_clean_failure(other, 1, f"flow g: {busy}; try again when it ends")
    assert not (tmp_path / "lake" / "g").exists(), "nothing of g written"

    reset = historian("state", "reset", "f", "-y", cwd=tmp_path)
    assert_clean_failure(reset, 1, f"{busy}; try again when it ends")
    assert len(lake_rows(tmp_path, "f")) > 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_help_shows_plain_flags_and_says_what_they_do(tmp_path: Path) -> None:
    for command in ("run", "backfill"):
        shown = historian(command, "--help", cwd=tmp_path, env={"COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        assert "<bool>" not in shown.stdout
        verbose = [line for line in shown.stdout.splitlines() if "--verbose" in line]
        assert len(verbose) == 1
        assert "Log progress" in verbose[0]
        text = " ".join(shown.stdout.split())
        assert "or relative: -2d, now-90m" in text.split("--end <str>", 1)[1][:100]


def test_backfill_summary_is_titled_backfill(tmp_path: Path, node: Any) -> None:
    write_config(tmp_path, node={"url": node.http_url}, flows={"f": group_flow()}, sinks=["lake"])
    start, end = START.isoformat(), (START + timedelta(hours=1)).isoformat()
    result = historian("backfill", "f", "--direct", "--start", start, "--end", end, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].strip() == "historian backfill"


def test_simulate_names_the_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        temp = tmp_path / "temp"
        temp.mkdir()
        env = {"TMPDIR": str(temp)}
        result = historian("simulate", "--port", str(port), cwd=tmp_path, env=env)
        assert_clean_failure(result, 1, f"--port: port {port} on 127.0.0.1 is already in use")
        https = historian(
            "simulate", "--port", str(free_port()), "--https-port", str(port), cwd=tmp_path, env=env
        )
        assert_clean_failure(https, 1, f"--https-port: port {port} on 127.0.0.1")
    assert list(temp.iterdir()) == [], "no CA file left behind"


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_simulate_stops_cleanly_and_removes_its_ca_file(tmp_path: Path, stop: int) -> None:
    command = ["simulate", "--port", str(free_port()), "--https-port", str(free_port())]
    temp = tmp_path / "temp"
    temp.mkdir()
    process = subprocess.Popen(
        [HISTORIAN, *command, "--tags", "10"],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(temp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("HTTPS CA certificate: "), line
        ca = Path(line.split(": ", 1)[1].strip())
        assert ca.is_file()
        process.send_signal(stop)
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait(timeout=10)
    assert process.returncode == 0, stderr
    assert "simulator stopped" in stderr
    assert ca.parent == temp
    assert not ca.exists(), "the CA file goes with the simulator"
