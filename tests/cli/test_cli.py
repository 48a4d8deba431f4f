"""The `historian` command as a user meets it: exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from connectors.simulator import SimConfig, SimulatedNode, run_server
from tests.fixtures import write_config

HISTORIAN = str(Path(sys.executable).with_name("historian"))
START = (datetime.now(UTC) - timedelta(minutes=40)).replace(microsecond=0).isoformat()


def historian(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 180,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "COLUMNS": "200", **(env or {})}
    environment.pop("HISTORIAN_DEBUG", None)
    return subprocess.run(
        [HISTORIAN, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
    )


def assert_clean_failure(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == code, output
    assert "Traceback" not in output
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, result.stderr
    for needle in needles:
        assert needle in error_lines[0], error_lines[0]
    return error_lines[0]


@pytest.fixture(scope="module")
def token_server() -> Iterator[Any]:
    node = SimulatedNode(SimConfig(seed=4, tags=12, token="s3cret-t0ken-value"))
    with run_server(node, http_port=0, https_port=0) as handle:
        yield handle


def small_flow(**extra: Any) -> dict[str, Any]:
    flow = {
        "node": "n",
        "tags": {"browse": "/", "include": ["."]},
        "mode": "raw",
        "window": "15m",
        "start": START,
        "settle": "0s",
        "batch": 50,
    }
    flow.update(extra)
    return flow


def test_help_lists_every_command(tmp_path: Path) -> None:
    result = historian("--help", cwd=tmp_path)
    assert result.returncode == 0
    commands = ("run", "backfill", "state", "check", "simulate", "serve", "report", "flows")
    for command in (*commands, "plan", "init", "runs", "tags"):
        assert command in result.stdout


def test_bad_config_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "flows.yaml").write_text(
        "nodes: {n: {url: 'http://127.0.0.1:1'}}\n"
        "sinks: {lake: {type: parquet, url: lake}}\n"
        "flows: {hourly: {node: n, tags: {paths: ['/a']}, mode: rwa, start: -1h, sinks: [lake]}}\n"
    )
    result = historian("run", "hourly", "--direct", cwd=tmp_path)
    assert_clean_failure(
        result,
        2,
        "flows.yaml: flows.hourly.mode: 'rwa' is not one of raw, filter, delta, aggregated",
    )
    assert not (tmp_path / "lake").exists(), "nothing written"


def test_unknown_flow_and_missing_file(tmp_path: Path) -> None:
    write_config(
        tmp_path, node={"url": "http://127.0.0.1:1"}, flows={"f": small_flow()}, sinks=["lake"]
    )
    assert_clean_failure(
        historian("run", "nope", "--direct", cwd=tmp_path), 2, "no flow named 'nope'"
    )
    assert_clean_failure(
        historian("run", "f", "-c", "absent.yaml", cwd=tmp_path), 2, "no such file"
    )
    assert_clean_failure(historian("run", cwd=tmp_path), 2, "FLOW name or --all")


def test_a_mistyped_flow_or_node_name_suggests_the_closest_in_one_line_exit_2(
    tmp_path: Path,
) -> None:
    flow = {**small_flow(), "windw": "1h"}
    write_config(
        tmp_path, node={"url": "http://127.0.0.1:1"}, flows={"ho_raw": flow}, sinks=["lake"]
    )
    assert_clean_failure(
        historian("check", cwd=tmp_path), 2, "flows.ho_raw.windw: unknown key; did you mean window?"
    )
    path = write_config(
        tmp_path, node={"url": "http://127.0.0.1:1"}, flows={"ho_raw": small_flow()}, sinks=["lake"]
    )
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["nodes"] = {"ho": document["nodes"]["n"]}
    document["flows"]["ho_raw"]["node"] = "ho"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    for args in (["run", "ho_rwa"], ["plan", "ho_rwa"], ["run", "ho_rwa", "--prefect"]):
        line = assert_clean_failure(historian(*args, cwd=tmp_path), 2, "no flow named 'ho_rwa'")
        assert line.endswith("; did you mean ho_raw?"), line
    line = assert_clean_failure(historian("run", "qqqq", cwd=tmp_path), 2, "no flow named 'qqqq'")
    assert "did you mean" not in line
    line = assert_clean_failure(historian("run", "ho_raw", "--node", "hoo", cwd=tmp_path), 2)
    assert line.endswith(
        "--node: 'hoo' is not a node of flow 'ho_raw' (its nodes: ho); did you mean ho?"
    )
    line = assert_clean_failure(historian("tags", "hoo", cwd=tmp_path), 2, "no node named 'hoo'")
    assert line.endswith("; did you mean ho?"), line
    line = assert_clean_failure(historian("tags", "plant", cwd=tmp_path), 2, "no node named")
    assert "did you mean" not in line


def test_unreachable_node_is_one_line_exit_1(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    write_config(
        tmp_path,
        node={"url": f"http://127.0.0.1:{port}", "retries": 1},
        flows={"f": small_flow()},
        sinks=["lake"],
    )
    assert_clean_failure(historian("run", "f", "--direct", cwd=tmp_path), 1, "node")


def test_wrong_token_is_401_and_the_token_never_shows(tmp_path: Path, token_server: Any) -> None:
    write_config(
        tmp_path,
        node={"url": token_server.http_url, "token_env": "NODE_TOKEN"},
        flows={"f": small_flow()},
        sinks=["lake"],
    )
    result = historian("run", "f", "--direct", cwd=tmp_path, env={"NODE_TOKEN": "wrong-token-xyz"})
    assert_clean_failure(result, 1, "401")
    assert "wrong-token-xyz" not in result.stdout + result.stderr


def test_missing_token_variable_is_named(tmp_path: Path, token_server: Any) -> None:
    write_config(
        tmp_path,
        node={"url": token_server.http_url, "token_env": "NODE_TOKEN_UNSET"},
        flows={"f": small_flow()},
        sinks=["lake"],
    )
    for path in ("--direct", "--prefect"):
        result = historian("run", "f", path, cwd=tmp_path, timeout=300)
        line = assert_clean_failure(result, 2, "NODE_TOKEN_UNSET")
        # A configuration error (exit 2), its prefixes once.
        assert line == "error: flow f: node n: environment variable NODE_TOKEN_UNSET is not set"


def test_tls_without_the_ca_fails_clearly_and_with_it_works(
    tmp_path: Path, token_server: Any
) -> None:
    write_config(
        tmp_path,
        node={"url": token_server.https_url, "token_env": "NODE_TOKEN"},
        flows={"f": small_flow()},
        sinks=["lake"],
    )
    env = {"NODE_TOKEN": "s3cret-t0ken-value"}
    assert_clean_failure(historian("check", cwd=tmp_path, env=env), 1, "node n")
    write_config(
        tmp_path,
        flows={"f": small_flow()},
        sinks=["lake"],
        node={
            "url": token_server.https_url,
            "token_env": "NODE_TOKEN",
            "ca_bundle": token_server.ca_pem_path,
        },
    )
    result = historian("check", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_direct_run_with_a_token_writes_data_and_leaks_no_secret(
    tmp_path: Path, token_server: Any
) -> None:
    secret = "s3cret-t0ken-value"
    write_config(
        tmp_path,
        flows={"f": small_flow()},
        sinks=["lake", "duck"],
        node={
            "url": token_server.https_url,
            "token_env": "NODE_TOKEN",
            "ca_bundle": token_server.ca_pem_path,
        },
    )
    env = {"NODE_TOKEN": secret}
    result = historian("run", "f", "--direct", "-v", cwd=tmp_path, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output
    assert "historian run" in result.stdout
    assert "Read it back" in result.stdout
    assert secret not in output
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in files)
    for file in files:
        assert secret.encode() not in file.read_bytes(), file
    state = historian("state", cwd=tmp_path, env=env)
    assert state.returncode == 0, state.stderr
    assert "f" in state.stdout
    assert "MISMATCH" not in state.stdout
    report = historian("report", "f", "--out", "cov.html", cwd=tmp_path, env=env)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "cov.html").read_text(encoding="utf-8").count("<svg") >= 1


def test_state_reset_asks_and_then_forgets(tmp_path: Path, token_server: Any) -> None:
    write_config(
        tmp_path,
        flows={"f": small_flow()},
        sinks=["lake"],
        node={"url": token_server.http_url, "token_env": "NODE_TOKEN"},
    )
    env = {"NODE_TOKEN": "s3cret-t0ken-value"}
    assert historian("run", "f", "--direct", cwd=tmp_path, env=env).returncode == 0
    refused = historian("state", "reset", "f", cwd=tmp_path, env=env, stdin="n\n")
    assert refused.returncode == 1
    assert "nothing reset" in refused.stderr
    done = historian("state", "reset", "f", "--yes", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "progress entries removed" in done.stdout
    rerun = historian("run", "f", "--direct", cwd=tmp_path, env=env)
    assert rerun.returncode == 0
    assert "0/0" not in rerun.stdout, "after a reset the flow is extracted again"


def test_simulate_serves_the_interface(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            HISTORIAN,
            "simulate",
            "--port",
            str(port),
            "--https-port",
            "0",
            "--tags",
            "20",
            "--profile",
            "node-1.21.12+repeated-names",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/system?cmd=status", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise
                time.sleep(0.2)
        assert answer.status_code == 200
        assert answer.json()["n3"]["tags"]["total"] >= 20
        assert answer.json()["n3"]["versions"] == ["1.21.12"]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_simulate_lists_its_profiles_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    listed = historian("simulate", "--profile", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "repeated-names: repeated_names" in listed.stdout
    assert "raw_start_exclusive:" in listed.stdout
    unknown = historian("simulate", "--profile", "default+nope", cwd=tmp_path)
    assert_clean_failure(unknown, 2, "--profile", "unknown simulator profile 'nope'")


@pytest.fixture(scope="module")
def old_node() -> Iterator[Any]:
    node = SimulatedNode(SimConfig(seed=4, tags=12, profile="node-1.21.5"))
    with run_server(node, http_port=0, https_port=None) as handle:
        yield handle


def test_check_resolves_each_flows_tags_shows_the_version_and_writes_nothing(
    tmp_path: Path, old_node: Any
) -> None:
    flows = {
        "good": small_flow(tags={"group": "/Plant A/", "regex": "Line"}),
        "gone": small_flow(tags={"group": "/No such group/"}),
        "stddev": small_flow(mode="aggregated", method="stddev", interval="15m"),
    }
    write_config(tmp_path, flows=flows, node={"url": old_node.http_url})
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = historian("check", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert "version 1.21.5 ('N3uron exe v1.21.5 (build 2406)')" in output
    assert "ok flow good: 4 tags" in output
    assert "flows.gone.tags.group: group '/No such group/' not found" in output
    assert "flows.stddev.method: method 'stddev' needs node version 1.21.10" in output
    assert "ok sink lake" in output
    assert "ok sink duck" in output
    assert_clean_failure(result, 1, "2 checks failed: flow gone, flow stddev")
    assert output.count("group '/No such group/' not found") == 1, "each failure once"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before, "no folder, file or schema"


def test_a_prefect_run_from_the_cli_is_quiet(tmp_path: Path, token_server: Any) -> None:
    write_config(
        tmp_path,
        flows={"f": small_flow()},
        sinks=["lake", "duck"],
        node={"url": token_server.http_url, "token_env": "NODE_TOKEN"},
    )
    home = tmp_path / "prefect-home"  # the ephemeral server's database, read below
    env = {"NODE_TOKEN": "s3cret-t0ken-value", "PREFECT_HOME": str(home)}
    result = historian("run", "f", "--prefect", cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.strip() == "", result.stderr
    assert "historian run" in result.stdout
    assert "s3cret-t0ken-value" not in result.stdout
    backfill = historian(
        "backfill", "f", "--start", START, "--prefect", cwd=tmp_path, env=env, timeout=300
    )
    assert backfill.returncode == 0, backfill.stderr
    assert backfill.stderr.strip() == "", backfill.stderr
    # Both runs are on record; their task runs are not: the recorder, whose write in
    # flight at the server's shutdown printed a traceback, does not run for the CLI.
    with closing(sqlite3.connect(home / "prefect.db")) as db:
        flow_runs = db.execute("select count(*) from flow_run").fetchone()[0]
        task_runs = db.execute("select count(*) from task_run").fetchone()[0]
    assert (flow_runs, task_runs) == (2, 0)


def test_a_prefect_run_uses_the_server_prefect_api_url_names(
    tmp_path: Path, token_server: Any, prefect_api: tuple[str, dict[str, str]]
) -> None:
    api, _ = prefect_api  # a `prefect server start` left running (shared by a few tests)
    # A flow name of this test's own: the server also holds other tests' runs.
    write_config(
        tmp_path,
        flows={"named_api": small_flow()},
        sinks=["lake"],
        node={"url": token_server.http_url, "token_env": "NODE_TOKEN"},
    )
    env = {
        "NODE_TOKEN": "s3cret-t0ken-value",
        "PREFECT_API_URL": api,
        "PREFECT_HOME": str(tmp_path / "prefect"),
    }
    for _ in range(2):  # two commands, one server
        result = historian("run", "named_api", cwd=tmp_path, env=env, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Traceback" not in result.stdout + result.stderr
        assert result.stderr.strip() == "", result.stderr
    runs = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=30).json()
    ours = [run for run in runs if run["parameters"].get("flow_name") == "named_api"]
    assert [run["state_type"] for run in ours] == ["COMPLETED", "COMPLETED"]


def test_an_unknown_tag_path_is_named(tmp_path: Path, token_server: Any) -> None:
    flow = small_flow(tags={"paths": ["/Plant A/Line 1/Temp. 000", "/No/Such tag"]})
    write_config(
        tmp_path,
        flows={"f": flow},
        sinks=["lake"],
        node={"url": token_server.http_url, "token_env": "NODE_TOKEN"},
    )
    result = historian(
        "run", "f", "--direct", cwd=tmp_path, env={"NODE_TOKEN": "s3cret-t0ken-value"}
    )
    assert_clean_failure(result, 1, "flows.f.tags", "'/No/Such tag' not found")
    assert not list(tmp_path.glob("lake/f/**/*.parquet")), "nothing written"


def test_the_command_starts_without_the_data_stack_or_prefect() -> None:
    """Imported lazily, so a Prefect run starts its server first and --help is quick."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pipelines.cli.app; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pandas', 'prefect'}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "[]"
    from pipelines.cli import app
    from pipelines.config import models

    assert app.DEFAULT_CONFIG == models.DEFAULT_CONFIG
