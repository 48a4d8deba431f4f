"""flows.yaml validation: every error path is one line naming the file and the key."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.config import (
    ConfigError,
    ParquetSinkConfig,
    SqlSinkConfig,
    load_config,
    parse_config,
    parse_moment,
)

REPO = Path(__file__).resolve().parents[2]

BASE: dict[str, Any] = {
    "nodes": {"plant": {"url": "https://node.example:3443", "token_env": "NODE_TOKEN"}},
    "sinks": {
        "lake": {"type": "parquet", "url": "data/lake"},
        "wh": {"type": "sql", "url": "postgresql+psycopg://etl@db/plant", "schema": "historian"},
    },
    "flows": {
        "hourly": {
            "node": "plant",
            "tags": {"paths": ["/Plant/Line 1/Temp. 1,2", "/Plant/Débit"]},
            "mode": "raw",
            "window": "1h",
            "start": "2024-01-01T00:00:00Z",
            "sinks": ["lake", "wh"],
            "schedule": {"cron": "0 * * * *"},
        }
    },
}


def with_change(path: str, value: Any) -> dict[str, Any]:
    """BASE with the value at a dotted key path replaced (or deleted when value is ...)."""
    data = copy.deepcopy(BASE)
    keys = path.split(".")
    target = data
    for key in keys[:-1]:
        target = target[key]
    if value is ...:
        del target[keys[-1]]
    else:
        target[keys[-1]] = value
    return data


def error_of(data: Any, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(data, source="flows.yaml", env=env or {})
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_repository_flows_yaml_is_valid_and_self_contained() -> None:
    config = load_config(REPO / "flows.yaml", env={})
    assert set(config.flows) == {"raw_history", "quarter_hour_avg", "alarm_history"}
    assert config.nodes["demo"].simulator is not None
    kinds = {name: flow.kind for name, flow in config.flows.items()}
    assert kinds["alarm_history"] == "alarm_history"
    assert config.flows["quarter_hour_avg"].mode == "aggregated"
    assert config.flows["quarter_hour_avg"].interval == timedelta(minutes=15)
    assert isinstance(config.sinks["lake"], ParquetSinkConfig)
    assert isinstance(config.sinks["warehouse"], SqlSinkConfig)


def test_a_valid_config_parses_into_typed_values() -> None:
    config = parse_config(BASE, env={})
    flow = config.flows["hourly"]
    assert flow.window == timedelta(hours=1)
    assert flow.start == datetime(2024, 1, 1, tzinfo=UTC)
    assert flow.history_options().query_params() == {"options.mode": "raw"}
    assert config.sinks["wh"].schema_ == "historian"  # type: ignore[union-attr]


def test_mode_typo_names_file_key_and_choices() -> None:
    message = error_of(with_change("flows.hourly.mode", "rwa"))
    assert message == (
        "flows.yaml: flows.hourly.mode: 'rwa' is not one of raw, filter, delta, aggregated"
    )


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("flows.hourly.colour", "blue", "flows.yaml: flows.hourly.colour: unknown key"),
        (
            "flows.hourly.node",
            "elsewhere",
            "flows.yaml: flows.hourly.node: unknown node 'elsewhere'",
        ),
        ("flows.hourly.sinks", ["lake", "s3"], "flows.yaml: flows.hourly.sinks: unknown sink 's3'"),
        ("flows.hourly.batch", "many", "flows.yaml: flows.hourly.batch: "),
        ("flows.hourly.window", "soon", "flows.yaml: flows.hourly.window: "),
        (
            "flows.hourly.start",
            "yesterday-ish",
            "flows.yaml: flows.hourly.start: 'yesterday-ish' is not a time",
        ),
        ("flows.hourly.start", ..., "flows.yaml: flows.hourly.start: is required"),
        (
            "flows.hourly.method",
            "median",
            "flows.yaml: flows.hourly.method: 'median' is not one of",
        ),
        ("flows.hourly.limit", 0, "flows.yaml: flows.hourly.limit: "),
        (
            "flows.hourly.tags",
            {"group": "/Plant/", "regex": "([unclosed"},
            "flows.yaml: flows.hourly.tags.regex: invalid regex",
        ),
        (
            "flows.hourly.tags",
            {"paths": ["no-slash"]},
            "flows.yaml: flows.hourly.tags.paths: tag path 'no-slash' does not start with /",
        ),
        (
            "flows.hourly.tags",
            {"paths": ["/a"], "group": "/g/"},
            "flows.yaml: flows.hourly.tags: give exactly one of",
        ),
        (
            "flows.hourly.schedule",
            {"cron": "every hour"},
            "flows.yaml: flows.hourly.schedule.cron: ",
        ),
        (
            "flows.hourly.dataset",
            "../../etc",
            "flows.yaml: flows.hourly.dataset: '../../etc' is not a plain name",
        ),
        (
            "nodes.plant.url",
            "ftp://node",
            "flows.yaml: nodes.plant.url: 'ftp://node' is not an http",
        ),
        ("nodes.plant.max_connections", -1, "flows.yaml: nodes.plant.max_connections: "),
        ("sinks.lake.type", "csv", "flows.yaml: sinks.lake"),
        ("sinks.wh.schema", "x; drop table y", "flows.yaml: sinks.wh.schema: "),
    ],
)
def test_each_error_names_its_key(path: str, value: Any, expected: str) -> None:
    assert error_of(with_change(path, value)).startswith(expected)


def test_aggregated_needs_an_interval_and_a_window_multiple() -> None:
    data = with_change("flows.hourly.mode", "aggregated")
    assert "needs interval" in error_of(data)
    data["flows"]["hourly"]["interval"] = "7m"
    assert "window must be a multiple of interval" in error_of(data)


def test_limit_is_only_for_raw() -> None:
    data = with_change("flows.hourly.mode", "delta")
    data["flows"]["hourly"]["limit"] = 100
    assert error_of(data).endswith("limit is only for mode raw")


def test_two_flows_may_not_share_a_dataset_in_one_sink() -> None:
    data = copy.deepcopy(BASE)
    data["flows"]["again"] = copy.deepcopy(data["flows"]["hourly"])
    data["flows"]["again"]["dataset"] = "hourly"
    assert "dataset 'hourly' in sink 'lake' is already written by flow 'hourly'" in error_of(data)


def test_environment_references_are_resolved_and_a_missing_one_is_named() -> None:
    data = with_change("nodes.plant.url", "https://${NODE_HOST}:3443")
    config = parse_config(data, env={"NODE_HOST": "10.0.0.5"})
    assert config.nodes["plant"].url == "https://10.0.0.5:3443"
    assert (
        error_of(data) == "flows.yaml: nodes.plant.url: environment variable NODE_HOST is not set"
    )


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    file = tmp_path / "flows.yaml"
    file.write_text("nodes:\n  plant: [unclosed\n")
    with pytest.raises(ConfigError) as caught:
        load_config(file, env={})
    assert "YAML syntax error" in str(caught.value)
    assert "line " in str(caught.value)


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml")
    file = tmp_path / "flows.yaml"
    file.write_text(yaml.safe_dump(["a", "b"]))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(file)


def test_relative_and_absolute_moments() -> None:
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert parse_moment("-2d", now=now) == now - timedelta(days=2)
    assert parse_moment("now-90m", now=now) == now - timedelta(minutes=90)
    assert parse_moment("2024-03-01T10:00:00+02:00", now=now) == datetime(2024, 3, 1, 8, tzinfo=UTC)
    assert parse_moment("2024-03-01T10:00:00", now=now) == datetime(2024, 3, 1, 10, tzinfo=UTC)
    with pytest.raises(ValueError, match="is not a time"):
        parse_moment("tomorrow", now=now)


def test_a_simulator_node_takes_a_profile_and_an_unknown_one_is_named() -> None:
    simulated = with_change("nodes.plant", {"simulator": {"profile": ["node-1.21.12", "rows-3"]}})
    config = parse_config(simulated, env={})
    assert config.nodes["plant"].simulator is not None
    assert config.nodes["plant"].simulator.profile == "node-1.21.12+rows-3"
    message = error_of(with_change("nodes.plant", {"simulator": {"profile": "ancient"}}))
    assert message.startswith("flows.yaml: nodes.plant.simulator.profile: unknown simulator")


def test_the_configured_profile_is_the_node_the_run_talks_to() -> None:
    from pipelines.nodes import NodePool

    simulated = with_change("nodes.plant", {"simulator": {"tags": 10, "profile": "node-1.21.12"}})
    with NodePool(parse_config(simulated, env={})) as nodes:
        version = nodes.get("plant").version()
    assert str(version) == "1.21.12"
