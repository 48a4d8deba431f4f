"""Hostile nodes and configs through the `historian` command: one line, a non-zero exit,
bounded time, nothing written (issue 21)."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.simulator import SimConfig, SimulatedNode, run_server
from tests.cli.test_cli import START, assert_clean_failure, historian, small_flow
from tests.fixtures import write_config
from tests.hostile_node import trickling_node

LONG = 100_000


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    with run_server(SimulatedNode(SimConfig(seed=5, tags=12)), https_port=None) as handle:
        yield handle.http_url


def nothing_written(where: Path) -> bool:
    return not (where / "lake").exists() and not (where / "warehouse.duckdb").exists()


def test_a_trickling_node_stops_the_run_in_bounded_time_and_frees_the_flow(
    tmp_path: Path, sim_url: str
) -> None:
    flow = small_flow(tags={"paths": ["/Plant A/Line 1/Temp"]})
    with trickling_node(interval_s=0.2) as node:
        write_config(
            tmp_path,
            node={"url": node.url, "read_timeout": "2s", "request_deadline": "1s", "retries": 1},
            flows={"f": flow},
            sinks=["lake"],
        )
        # The subprocess timeout is the bound: without a deadline the trickle lasts 30 s
        # per attempt, then ends in a connection error, not in this line.
        result = historian("run", "f", "--direct", cwd=tmp_path, timeout=60)
    line = assert_clean_failure(result, 1, "flow f: node n: ", "request deadline (1 s)")
    assert "gave up after 2 attempts" in line, line
    assert node.requests == 2
    # The flow's lock went with the run: the next run (on a node that answers) completes.
    write_config(tmp_path, node={"url": sim_url}, flows={"f": small_flow()}, sinks=["lake"])
    again = historian("run", "f", "--direct", cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def config_with(tmp_path: Path, change: dict[str, Any], node: dict[str, Any] | None = None) -> None:
    flow = small_flow()
    flow.update(change)
    write_config(
        tmp_path,
        node=node or {"url": "http://127.0.0.1:1"},
        flows={"f": flow},
        sinks=["lake", "duck"],
    )


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (
            {"window": "99999999999999d"},
            "flows.f.window: duration '99999999999999d' is too long (at most 999,999,999 days)",
        ),
        (
            {"start": "-99999999999d"},
            "flows.f.start: duration '99999999999d' is too long",
        ),
        ({"window": "1.0005s"}, "flows.f.window: '1.0005s' is not a whole number of milliseconds"),
        ({"settle": "99999999d"}, "flows.f.settle: '99999999d' is longer than 36,525 days"),
        ({"start": "1969-12-31T23:59:59Z"}, "flows.f.start: '1969-12-31T23:59:59Z' is before 1970"),
        (
            {"tags": {"paths": ["x" * LONG]}},
            f"flows.f.tags.paths: tag path {'x' * 80!r}... ({LONG:,} characters) does not start",
        ),
    ],
    ids=["huge-window", "huge-start", "sub-ms-window", "huge-settle", "before-1970", "long-path"],
)
def test_a_hostile_flow_value_is_one_short_line_and_nothing_is_written(
    tmp_path: Path, change: dict[str, Any], needle: str
) -> None:
    config_with(tmp_path, change)
    line = assert_clean_failure(historian("run", "f", "--direct", cwd=tmp_path), 2, needle)
    assert len(line) < 400, len(line)
    assert nothing_written(tmp_path)


def test_a_100000_character_node_url_fails_before_any_sink_is_created(tmp_path: Path) -> None:
    config_with(tmp_path, {}, node={"url": "http://127.0.0.1:1/" + "a" * LONG})
    line = assert_clean_failure(
        historian("run", "f", "--direct", cwd=tmp_path),
        2,
        f"nodes.n.url: 'http://127.0.0.1:1/{'a' * 61}'... ({LONG + 19:,} characters) is longer "
        "than a node URL may be (2,048)",
    )
    assert len(line) < 400
    assert nothing_written(tmp_path)


def test_a_duplicate_flows_block_names_the_key_and_both_lines(tmp_path: Path) -> None:
    config_with(tmp_path, {})
    text = (tmp_path / "flows.yaml").read_text()
    second = yaml.safe_dump({"flows": {"g": small_flow(sinks=["lake"])}}, sort_keys=False)
    (tmp_path / "flows.yaml").write_text(text + second)
    first_line = text.splitlines().index("flows:") + 1
    second_line = len(text.splitlines()) + 1
    assert_clean_failure(
        historian("run", "g", "--direct", cwd=tmp_path),
        2,
        f"flows.yaml: flows: duplicate key at lines {first_line} and {second_line}",
    )
    assert nothing_written(tmp_path)


def test_an_alias_bomb_fails_in_bounded_time_with_one_line(tmp_path: Path) -> None:
    config_with(tmp_path, {})
    levels = ['  l0: &l0 ["${HOME}", "${HOME}", "${HOME}", "${HOME}", "${HOME}"]']
    for level in range(1, 10):
        refs = ", ".join([f"*l{level - 1}"] * 9)
        levels.append(f"  l{level}: &l{level} [{refs}]")
    text = (tmp_path / "flows.yaml").read_text()
    (tmp_path / "flows.yaml").write_text(text + "sinks_extra:\n" + "\n".join(levels) + "\n")
    assert_clean_failure(
        historian("run", "f", "--direct", cwd=tmp_path, timeout=60),
        2,
        "flows.yaml: sinks_extra (line",
        "unknown key",
    )


def test_an_unknown_long_tag_path_at_run_time_is_cut_in_the_line(
    tmp_path: Path, sim_url: str
) -> None:
    config_with(tmp_path, {"tags": {"paths": ["/" + "x" * LONG]}}, node={"url": sim_url})
    line = assert_clean_failure(
        historian("run", "f", "--direct", cwd=tmp_path),
        1,
        f"flows.f.tags.paths: tag {'/' + 'x' * 79!r}... ({LONG + 1:,} characters) not found on node n",
    )
    assert len(line) < 400


def test_a_long_flow_name_on_the_command_line_is_cut_in_the_line(tmp_path: Path) -> None:
    config_with(tmp_path, {})
    line = assert_clean_failure(
        historian("run", "f" * LONG, "--direct", cwd=tmp_path),
        2,
        f"no flow named {'f' * 80!r}... ({LONG:,} characters) (flows: f)",
    )
    assert len(line) < 400


@pytest.mark.parametrize(
    "command",
    [
        ["run", "f"],
        ["deploy", "--pool", "plant"],
        ["backfill", "f", "--start", "-1d", "--shards", "2", "--pool", "plant"],
    ],
    ids=["run", "deploy", "sharded-backfill"],
)
def test_a_prefect_api_that_cannot_be_reached_is_one_line_naming_it(
    tmp_path: Path, sim_url: str, command: list[str]
) -> None:
    write_config(tmp_path, node={"url": sim_url}, flows={"f": small_flow()}, sinks=["lake"])
    down = "http://127.0.0.1:9/api"  # the discard port: nothing listens
    result = historian(*command, cwd=tmp_path, env={"PREFECT_API_URL": down}, timeout=120)
    assert_clean_failure(
        result,
        1,
        "the Prefect API at http://127.0.0.1:9/api",
        "PREFECT_API_URL",
        "cannot be reached",
    )
    assert nothing_written(tmp_path)


TOKEN_ENV = ({"token_env": "T" * LONG}, "lake", "T")
LAKE_PATH = ({}, "l" * LONG, "l")


@pytest.mark.parametrize(
    ("command", "node", "lake", "letter"),
    [
        (("run", "f", "--direct"), *TOKEN_ENV),
        (("check",), *TOKEN_ENV),
        (("run", "f", "--direct"), *LAKE_PATH),
        (("state",), *LAKE_PATH),
        (("flows",), *LAKE_PATH),
        (("check",), *LAKE_PATH),
    ],
    ids=["run-token-env", "check-token-env", "run-lake", "state-lake", "flows-lake", "check-lake"],
)
def test_a_100000_character_value_from_anywhere_is_cut_in_the_error_line(
    tmp_path: Path,
    sim_url: str,
    command: tuple[str, ...],
    node: dict[str, Any],
    lake: str,
    letter: str,
) -> None:
    """The value is cut to its start and its length (the lake's as a path under tmp_path)."""
    path = write_config(tmp_path, node={"url": sim_url, **node}, flows={"f": small_flow()})
    document = yaml.safe_load(path.read_text())
    document["sinks"] = {"lake": {"type": "parquet", "url": lake}}
    document["flows"]["f"]["sinks"] = ["lake"]
    path.write_text(yaml.safe_dump(document))
    result = historian(*command, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert max(len(line) for line in output.splitlines()) < 300, output[:600]
    flat = re.sub(r"[\s│]+", " ", output)  # a table cell's wrapped lines joined
    said = re.search(rf"{letter}\.\.\. \(([\d,]+) characters\)", flat)
    assert said is not None, output[:600]
    assert int(said[1].replace(",", "")) >= LONG


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cells(table: str, column: int) -> dict[str, str]:
    """A rich table's `column` per row, keyed by the row's first cell (wrapped lines
    joined)."""
    found: dict[str, str] = {}
    row = ""
    for line in table.splitlines():
        parts = [part.strip() for part in line.split("│")[1:-1]]
        if len(parts) <= column:
            continue
        row = parts[0] or row
        found[row] = " ".join(filter(None, [found.get(row, ""), parts[column]]))
    return found


def test_an_unreachable_sink_is_shown_in_its_flows_row_and_the_others_are_listed(
    tmp_path: Path, sim_url: str
) -> None:
    down = f"postgresql+psycopg://postgres@127.0.0.1:{closed_port()}/test"
    flows = {"good": small_flow(sinks=["lake"]), "bad": small_flow(sinks=["pg"])}
    write_config(tmp_path, node={"url": sim_url}, flows=flows, pg=(down, "historian"))
    ran = historian("run", "good", "--direct", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr

    listed = historian("flows", cwd=tmp_path)
    assert_clean_failure(listed, 1, "cannot read the sinks of flow bad (the rows say why)")
    marks = cells(listed.stdout, 7)
    assert marks["good"].startswith(START[:4]), listed.stdout
    assert marks["bad"].startswith("sink pg: connect"), listed.stdout

    state = historian("state", cwd=tmp_path)
    assert_clean_failure(state, 1, "cannot read the sinks of flow bad (the rows say why)")
    complete = cells(state.stdout, 3)
    assert complete["good"].startswith(START[:4]), state.stdout
    assert cells(state.stdout, 4)["bad"].startswith("sink pg: connect"), state.stdout


def test_a_temporary_prefect_server_that_does_not_start_in_time_is_one_line() -> None:
    """Prefect raises a RuntimeError carrying the server's whole output when its ephemeral
    server does not answer within its start-up timeout: the user reads one line saying
    which setting to raise and the ways around it, never that traceback."""
    from prefect.settings import (
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    from pipelines.cli.base import prefect_api_error

    output = "INFO: Started server process\n" * 50
    error = RuntimeError(
        f"Timed out while attempting to connect to ephemeral Prefect API server. stdout: {output}"
    )
    with temporary_settings(updates={PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: 7}):
        line = prefect_api_error(error)
    assert line is not None
    assert "\n" not in line
    assert "within 7 s" in line
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in line
    assert "without --prefect" in line
