"""The commands on a flow over several nodes: check probes every node, flows and plan show
the fleet, run prints a row per node and fails alone for a node that is down."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from connectors.simulator import run_server
from tests.cli.test_cli import assert_clean_failure, historian
from tests.pipelines.core.test_many_nodes import fleet_config, simulator

END = (datetime.now(UTC) - timedelta(hours=2)).replace(minute=0, second=0, microsecond=0)
START = END - timedelta(hours=1)


@pytest.fixture(scope="module")
def urls() -> Iterator[dict[str, str]]:
    """plant_a and plant_c served; plant_b's port closed (a node that is down)."""
    with ExitStack() as stack:
        found = {
            name: stack.enter_context(
                run_server(simulator(name, clock=None), http_port=0, https_port=None)
            ).http_url
            for name in ("plant_a", "plant_c")
        }
        with run_server(simulator("plant_b", clock=None), http_port=0, https_port=None) as gone:
            found["plant_b"] = gone.http_url
        yield dict(sorted(found.items()))


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_check_probes_the_flow_on_every_node_and_names_the_one_down(
    tmp_path: Path, urls: dict[str, str]
) -> None:
    fleet_config(tmp_path, urls, duck=False, start=START)
    checked = historian("check", cwd=tmp_path)
    assert_clean_failure(checked, 1, "1 check failed: node plant_b")
    assert "ok flow f on node plant_a: 9 tags" in checked.stdout
    assert "ok flow f on node plant_c: 9 tags" in checked.stdout
    assert "on node plant_b" not in checked.stdout
    listed = historian("flows", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    row = next(cells(line) for line in listed.stdout.splitlines() if line.startswith("│ f "))
    assert row[:2] == ["f", "plant_* (3 nodes)"]


def test_plan_and_run_per_node_a_node_down_fails_alone_with_one_line(
    tmp_path: Path, urls: dict[str, str]
) -> None:
    fleet_config(tmp_path, urls, duck=False, start=START)
    span = ["--start", START.isoformat(), "--end", END.isoformat()]
    planned = historian("plan", "f", *span, "--node", "plant_c", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.startswith(
        "plan of f@plant_c: what `historian backfill f --node plant_c` would do"
    )
    assert "9 on node plant_c" in planned.stdout
    assert "plant_a" not in planned.stdout

    ran = historian("backfill", "f", *span, "--direct", cwd=tmp_path)
    assert_clean_failure(ran, 1, "error: flow f: 1 of 3 nodes failed: node plant_b: ")
    rows = {cells(line)[0]: cells(line) for line in ran.stdout.splitlines() if "│" in line}
    assert rows["f@plant_a"][-1] == rows["f@plant_c"][-1] == "ok"
    assert rows["f@plant_b"][-1] == "failed"
    assert rows["f@plant_b"][1] == "0"
    assert rows["f"][-1] == "failed"
    assert int(rows["f"][1].replace(",", "")) == sum(
        int(rows[key][1].replace(",", "")) for key in ("f@plant_a", "f@plant_c")
    )

    both = historian(
        "backfill", "f", *span, "--direct", "-n", "plant_a", "-n", "plant_c", cwd=tmp_path
    )
    assert both.returncode == 0, both.stderr
    assert "f@plant_b" not in both.stdout

    usage = historian("run", "--all", "--node", "plant_a", cwd=tmp_path)
    assert_clean_failure(usage, 2, "--node needs a FLOW name")
    unknown = historian("run", "f", "--node", "lab", "--direct", cwd=tmp_path)
    assert_clean_failure(unknown, 2, "--node: 'lab' is not a node of flow 'f'")
