"""`historian tags NODE [PATH]`: a node's tag tree as the node's details describe it."""

from __future__ import annotations

from pathlib import Path

from connectors.simulator import SimConfig, SimulatedNode
from tests.cli.test_cli import assert_clean_failure, historian
from tests.fixtures import write_config

SIM = {"seed": 3, "tags": 12}


def project(tmp_path: Path) -> None:
    flow = {"node": "n", "tags": {"paths": ["/x"]}, "mode": "raw", "start": "-1h"}
    write_config(tmp_path, node={"simulator": SIM}, flows={"f": flow}, sinks=["lake"])


def listed_paths(stdout: str) -> list[str]:
    return [line.split("│")[1].strip() for line in stdout.splitlines() if line.startswith("│")]


def test_tags_lists_the_simulators_tree_with_types_units_history_and_remote(
    tmp_path: Path,
) -> None:
    project(tmp_path)
    truth = sorted(SimulatedNode(SimConfig(**SIM)).tag_paths())
    everything = historian("tags", "n", "/", "--recursive", cwd=tmp_path)
    assert everything.returncode == 0, everything.stderr
    assert listed_paths(everything.stdout) == truth  # Unicode, commas, dots, spaces
    assert f"{len(truth)} tags under / on node n" in everything.stdout
    rows = [line for line in everything.stdout.splitlines() if line.startswith("│")]
    assert all("│ yes " in row for row in rows), "history enabled on every simulated tag"
    assert any("°C" in row for row in rows)
    assert any("to-remote" in row for row in rows), "the remote tags name their link"

    group = "/Plant B/Pumps, Main/"
    direct = historian("tags", "n", group, cwd=tmp_path)
    assert listed_paths(direct.stdout) == [p for p in truth if p.startswith(group)]
    only = historian("tags", "n", "/", "-r", "--filter", "Temp", cwd=tmp_path)
    assert listed_paths(only.stdout) == [p for p in truth if "Temp" in p]
    assert not (tmp_path / "lake").exists(), "writes nothing"


def test_tags_of_an_unknown_node_or_path_is_one_line(tmp_path: Path) -> None:
    project(tmp_path)
    assert_clean_failure(historian("tags", "nope", cwd=tmp_path), 2, "no node named 'nope'")
    assert_clean_failure(
        historian("tags", "n", "/Plant A/", cwd=tmp_path),
        1,
        "node n: no tags at '/Plant A/'",
        "--recursive",
    )


def test_flows_tags_prints_what_a_flows_selection_resolves_to_now(tmp_path: Path) -> None:
    flow = {
        "node": "n",
        "tags": {"browse": "/Plant B/", "include": ["."], "exclude": ["Pressure"]},
        "mode": "raw",
        "start": "-1h",
    }
    write_config(tmp_path, node={"simulator": SIM}, flows={"f": flow}, sinks=["lake"])
    truth = sorted(SimulatedNode(SimConfig(**SIM)).tag_paths())
    result = historian("flows", "--tags", "f", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    want = [p for p in truth if p.startswith("/Plant B/") and "Pressure" not in p]
    assert result.stdout.splitlines() == want
    assert result.stderr.strip() == f"flow f on node n: {len(want)} tags"
    assert not (tmp_path / "lake").exists(), "writes nothing"
    assert_clean_failure(historian("flows", "--tags", "g", cwd=tmp_path), 2, "no flow named 'g'")
