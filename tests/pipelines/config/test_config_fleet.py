"""flows.yaml for a fleet: a flow on a list or a pattern of nodes, node defaults, anchors."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pipelines.config.models import ConfigError, load_config, parse_config, unit_key

SITE = {"url": "https://node.example:3443", "token_env": "NODE_TOKEN"}

FLEET: dict[str, Any] = {
    "nodes": {
        "plant_b": dict(SITE),
        "plant_a": dict(SITE),
        "plant_c": dict(SITE),
        "lab": dict(SITE),
    },
    "sinks": {"lake": {"type": "parquet", "url": "data/lake"}},
    "flows": {
        "hourly": {
            "node": "plant_a",
            "tags": {"group": "/Plant/"},
            "start": "2024-01-01T00:00:00Z",
            "sinks": ["lake"],
        }
    },
}


def fleet(node: Any) -> dict[str, Any]:
    data = copy.deepcopy(FLEET)
    data["flows"]["hourly"]["node"] = node
    return data


def error_of(data: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="flows.yaml", env={})
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("plant_a", ["plant_a"]),
        (["plant_b", "plant_a"], ["plant_a", "plant_b"]),
        ("plant_*", ["plant_a", "plant_b", "plant_c"]),
        (["lab", "plant_[ab]", "plant_a"], ["lab", "plant_a", "plant_b"]),
        ("*", ["lab", "plant_a", "plant_b", "plant_c"]),
    ],
)
def test_a_flows_node_is_a_name_a_list_or_patterns_expanded_sorted_once(
    node: Any, expected: list[str]
) -> None:
    assert parse_config(fleet(node), env={}).flow_nodes("hourly") == expected


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ("elsewhere", "flows.yaml: flows.hourly.node: unknown node 'elsewhere' (nodes: "),
        (["plant_a", "nope"], "flows.yaml: flows.hourly.node: unknown node 'nope' (nodes: "),
        ("site_*", "flows.yaml: flows.hourly.node: pattern 'site_*' matches no node (nodes: "),
        ([], "flows.yaml: flows.hourly.node: node is an empty list"),
    ],
)
def test_an_unknown_node_or_a_pattern_matching_nothing_is_one_line_naming_the_key(
    node: Any, expected: str
) -> None:
    assert error_of(fleet(node)).startswith(expected)


def test_state_keys_stay_the_flow_name_for_one_named_node_and_are_per_node_for_a_fleet() -> None:
    one = parse_config(fleet("plant_a"), env={})
    assert unit_key("hourly", "plant_a", one.flows["hourly"]) == "hourly"
    assert one.flow_units("hourly") == [("plant_a", "hourly")]
    # A list or a pattern keys every node apart, even while it matches one: a node joining
    # the fleet later renames nothing.
    for node in (["plant_a"], "plant_[a]", "plant_*"):
        config = parse_config(fleet(node), env={})
        assert unit_key("hourly", "plant_a", config.flows["hourly"]) == "hourly@plant_a"
    config = parse_config(fleet("plant_*"), env={})
    assert config.flow_units("hourly", ["plant_c", "plant_a", "plant_c"]) == [
        ("plant_a", "hourly@plant_a"),
        ("plant_c", "hourly@plant_c"),
    ]


def test_selecting_a_node_that_is_not_the_flows_is_one_line() -> None:
    config = parse_config(fleet("plant_*"), env={})
    with pytest.raises(ConfigError) as caught:
        config.select_nodes("hourly", ["lab"])
    assert str(caught.value) == (
        "--node: 'lab' is not a node of flow 'hourly' (its nodes: plant_a, plant_b, plant_c)"
    )


def test_node_defaults_go_under_every_node_and_each_nodes_own_keys_win() -> None:
    data = copy.deepcopy(FLEET)
    data["node_defaults"] = {"max_connections": 2, "retries": 1, "token_env": "FLEET_TOKEN"}
    data["nodes"] = {
        "plant_a": {"url": "https://a.example:3443"},
        "plant_b": {"url": "https://b.example:3443", "max_connections": 8},
    }
    config = parse_config(data, env={})
    a, b = config.nodes["plant_a"], config.nodes["plant_b"]
    assert (a.max_connections, a.retries, a.token_env) == (2, 1, "FLEET_TOKEN")
    assert (b.max_connections, b.retries, b.token_env) == (8, 1, "FLEET_TOKEN")


def test_node_defaults_merge_nested_simulator_settings() -> None:
    data = copy.deepcopy(FLEET)
    data["node_defaults"] = {"simulator": {"tags": 30, "raw_cap": 500}}
    data["nodes"] = {"plant_a": {"simulator": {"seed": 1}}, "plant_b": {"simulator": {"seed": 2}}}
    config = parse_config(data, env={})
    sims = [config.nodes[n].simulator for n in ("plant_a", "plant_b")]
    assert [(s.seed, s.tags, s.raw_cap) for s in sims if s] == [(1, 30, 500), (2, 30, 500)]


def test_an_unknown_key_in_node_defaults_is_named_there() -> None:
    data = copy.deepcopy(FLEET)
    data["node_defaults"] = {"max_conections": 2}
    assert error_of(data) == (
        "flows.yaml: node_defaults.max_conections: unknown key; did you mean max_connections?"
    )
    data["node_defaults"] = {"max_connections": 0}
    assert error_of(data).startswith("flows.yaml: nodes.")  # a bad value: where it lands


def test_yaml_anchors_and_merge_keys_share_one_site_template(tmp_path: Path) -> None:
    path = tmp_path / "flows.yaml"
    path.write_text(
        """
x-site: &site
  token_env: FLEET_TOKEN
  max_connections: 3
  retries: 2
nodes:
  plant_a: {<<: *site, url: "https://a.example:3443"}
  plant_b:
    <<: *site
    url: https://b.example:3443
    max_connections: 6
sinks:
  lake: {type: parquet, url: data/lake}
flows:
  hourly:
    node: plant_*
    tags: {group: /Plant/}
    start: 2024-01-01T00:00:00Z
    sinks: [lake]
""",
        encoding="utf-8",
    )
    # A top-level key of our own is refused (one line): anchors live under a known key.
    with pytest.raises(ConfigError, match="x-site"):
        load_config(path, env={})
    text = path.read_text(encoding="utf-8").replace("x-site: &site", "node_defaults: &site")
    path.write_text(text, encoding="utf-8")
    config = load_config(path, env={})
    a, b = config.nodes["plant_a"], config.nodes["plant_b"]
    assert (a.max_connections, a.retries, a.token_env, a.url) == (
        3,
        2,
        "FLEET_TOKEN",
        "https://a.example:3443",
    )
    assert (b.max_connections, b.retries) == (6, 2)
    assert config.flow_nodes("hourly") == ["plant_a", "plant_b"]
