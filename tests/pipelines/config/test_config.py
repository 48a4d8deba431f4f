"""flows.yaml validation: every error path is one line naming the file and the key."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.config.models import (
    AlarmHistoryFlow,
    AlarmSelectionConfig,
    ConfigError,
    ParquetSinkConfig,
    SqlSinkConfig,
    TagHistoryFlow,
    load_config,
    parse_config,
    parse_moment,
)

REPO = Path(__file__).resolve().parents[3]

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
    from pipelines.config.nodes import NodePool

    simulated = with_change("nodes.plant", {"simulator": {"tags": 10, "profile": "node-1.21.12"}})
    with NodePool(parse_config(simulated, env={})) as nodes:
        version = nodes.get("plant").version()
    assert str(version) == "1.21.12"


# -- hostile values: one line, cut when long (issue 21) ---------------------------------


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            "flows.hourly.window",
            "99999999999999d",
            "flows.yaml: flows.hourly.window: duration '99999999999999d' is too long "
            "(at most 999,999,999 days)",
        ),
        (
            "flows.hourly.window",
            10**30,
            "flows.yaml: flows.hourly.window: duration 1000000000000000000000000000000 is too "
            "long (at most 999,999,999 days)",
        ),
        (
            "flows.hourly.window",
            "99999999d",
            "flows.yaml: flows.hourly.window: '99999999d' is longer than 36,525 days",
        ),
        (
            "flows.hourly.lookback",
            "36526d",
            "flows.yaml: flows.hourly.lookback: '36526d' is longer than 36,525 days",
        ),
        (
            "flows.hourly.window",
            "1.0005s",
            "flows.yaml: flows.hourly.window: '1.0005s' is not a whole number of milliseconds",
        ),
        (
            "flows.hourly.settle",
            0.0005,
            "flows.yaml: flows.hourly.settle: 0.0005 is not a whole number of milliseconds",
        ),
        (
            "flows.hourly.start",
            "-99999999999d",
            "flows.yaml: flows.hourly.start: duration '99999999999d' is too long",
        ),
        (
            "flows.hourly.start",
            "-999999d",
            "flows.yaml: flows.hourly.start: '-999999d' is before 1970-01-01T00:00:00Z",
        ),
        (
            "flows.hourly.start",
            "0001-01-01T00:00:00Z",
            "flows.yaml: flows.hourly.start: '0001-01-01T00:00:00Z' is before 1970-01-01",
        ),
        (
            "nodes.plant.url",
            "https://node:99999",
            "flows.yaml: nodes.plant.url: 'https://node:99999' is not a valid URL: Port out of "
            "range 0-65535",
        ),
        (
            "nodes.plant.url",
            "https://no de:3443",
            "flows.yaml: nodes.plant.url: 'https://no de:3443' is not an http:// or https:// URL",
        ),
        (
            "nodes.plant.url",
            "https://etl:hunter2@node:3443",
            "flows.yaml: nodes.plant.url: credentials belong in environment variables",
        ),
        ("nodes.plant.request_deadline", "0s", "flows.yaml: nodes.plant.request_deadline: must"),
    ],
)
def test_hostile_values_are_one_line_naming_the_key(path: str, value: Any, expected: str) -> None:
    message = error_of(with_change(path, value))
    assert message.startswith(expected), message
    assert "hunter2" not in message


def test_a_100000_character_value_is_quoted_cut_with_its_length() -> None:
    long_path = "x" * 100_000
    message = error_of(with_change("flows.hourly.tags", {"paths": [long_path]}))
    assert message == (
        f"flows.yaml: flows.hourly.tags.paths: tag path {'x' * 80!r}... (100,000 characters) "
        "does not start with /"
    )
    message = error_of(with_change("nodes.plant.url", "https://node/" + "a" * 100_000))
    assert message.endswith("(100,013 characters) is longer than a node URL may be (2,048)")
    assert len(message) < 300
    message = error_of(with_change("flows.hourly.mode", "r" * 100_000))
    assert message.endswith("... (100,000 characters) is not one of raw, filter, delta, aggregated")


def test_a_long_unknown_key_is_cut_in_the_key_path() -> None:
    message = error_of(with_change("flows.hourly." + "k" * 100_000, 1))
    assert message == f"flows.yaml: flows.hourly.{'k' * 40!r}... (100,000 characters): unknown key"


def test_the_request_deadline_reaches_the_client_settings() -> None:
    from pipelines.config.nodes import node_settings

    config = parse_config(with_change("nodes.plant.request_deadline", "90s"), env={})
    node = config.nodes["plant"]
    assert node_settings("plant", node).deadline_s == 90
    default = parse_config(BASE, env={}).nodes["plant"]
    assert node_settings("plant", default).deadline_s == 125


def test_max_answer_mb_reaches_the_client_settings_in_bytes() -> None:
    from pipelines.config.nodes import node_settings

    config = parse_config(with_change("nodes.plant.max_answer_mb", 4), env={})
    assert node_settings("plant", config.nodes["plant"]).max_answer_bytes == 4 << 20
    with pytest.raises(ConfigError, match=r"nodes\.plant\.max_answer_mb"):
        parse_config(with_change("nodes.plant.max_answer_mb", 0), env={})


def test_a_node_by_default_is_the_clients_default_settings() -> None:
    """One source: what flows.yaml leaves out, the client's settings leave out too."""
    import dataclasses

    from connectors.settings import NodeSettings
    from pipelines.config.nodes import node_settings

    node = parse_config(BASE, env={}).nodes["plant"]
    assert set(BASE["nodes"]["plant"]) == {"url", "token_env"}
    derived = node_settings("plant", node)
    client = NodeSettings(url=derived.url, name="plant", token_env="NODE_TOKEN")
    assert dataclasses.asdict(derived) == dataclasses.asdict(client)
    assert derived.max_connections == 4


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"token_env": "T", "username_env": "U", "password_env": "P"}, "not both"),
        ({"token_env": "T", "token_block": "b"}, "not both"),
        ({"password_env": "P", "password_block": "b", "username_env": "U"}, "not both"),
        ({"username_env": "U"}, "go together"),
        ({"password_block": "b"}, "go together"),
    ],
)
def test_credentials_follow_the_clients_rules_when_the_file_loads(
    node: dict[str, str], message: str
) -> None:
    data = copy.deepcopy(BASE)
    data["nodes"]["plant"] = {"url": "https://node.example:3443", **node}
    assert message in error_of(data)


def test_a_huge_integer_in_the_file_is_named_with_its_line(tmp_path: Path) -> None:
    file = tmp_path / "flows.yaml"
    document = yaml.safe_dump(BASE, sort_keys=False)
    file.write_text(document.replace("window: 1h", "window: " + "9" * 5000))
    with pytest.raises(ConfigError) as caught:
        load_config(file, env={})
    line = document.splitlines().index("    window: 1h") + 1
    assert str(caught.value).endswith(
        f"flows.yaml: flows.hourly.window (line {line}): a number of 5,000 digits"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-99999999999d", "duration '99999999999d' is too long (at most 999,999,999 days)"),
        ("now-999999d", "'now-999999d' is before 1970-01-01T00:00:00Z"),
        ("1969-07-20T20:17:00Z", "'1969-07-20T20:17:00Z' is before 1970-01-01T00:00:00Z"),
        (
            "9999-12-31T23:00:00-02:00",
            "'9999-12-31T23:00:00-02:00' is past the end of the calendar",
        ),
    ],
)
def test_moments_before_1970_or_past_the_calendar_are_value_errors(
    text: str, expected: str
) -> None:
    now = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    with pytest.raises(ValueError, match=r"\d") as caught:
        parse_moment(text, now=now)
    assert str(caught.value) == expected
    assert parse_moment("1970-01-01T00:00:00Z", now=now) == datetime(1970, 1, 1, tzinfo=UTC)


def test_busy_wait_is_a_duration_for_duckdb_files_only() -> None:
    data = with_change("sinks.wh", {"type": "sql", "url": "duckdb:///w.duckdb", "busy_wait": "10m"})
    sink = parse_config(data).sinks["wh"]
    assert isinstance(sink, SqlSinkConfig)
    assert sink.busy_wait == timedelta(minutes=10)
    assert error_of(with_change("sinks.wh.busy_wait", "5m")) == (
        "flows.yaml: sinks.wh: busy_wait is for DuckDB files (a server takes many writers)"
    )


# -- kinds: one model per kind, chosen by `kind:` -----------------------------------------

ALARM_FLOW: dict[str, Any] = {
    "node": "plant",
    "kind": "alarm_history",
    "alarms": {"path": "/Alarms/", "min_priority": 2},
    "start": "2024-01-01T00:00:00Z",
    "sinks": ["lake"],
}


def with_alarm_flow(**keys: Any) -> dict[str, Any]:
    """BASE with a flow `al` of kind alarm_history, holding these keys too."""
    data = copy.deepcopy(BASE)
    data["flows"]["al"] = {**copy.deepcopy(ALARM_FLOW), **keys}
    return data


def test_a_flow_is_the_model_of_its_kind_and_tag_history_is_the_default() -> None:
    flows = parse_config(with_alarm_flow(), env={}).flows
    tag, alarm = flows["hourly"], flows["al"]
    assert isinstance(tag, TagHistoryFlow)
    assert tag.kind == "tag_history"
    assert (tag.mode, tag.batch, tag.metadata) == ("raw", 200, True)
    assert isinstance(alarm, AlarmHistoryFlow)
    assert alarm.kind == "alarm_history"
    assert alarm.alarm_filter().query_params() == {
        "options.recurrent": "true",
        "options.filter.minPriority": "2",
    }


@pytest.mark.parametrize("alarms", [..., None])
def test_an_alarm_flow_without_a_selection_reads_every_alarm(alarms: Any) -> None:
    data = with_alarm_flow()
    if alarms is ...:
        del data["flows"]["al"]["alarms"]
    else:
        data["flows"]["al"]["alarms"] = alarms
    flow = parse_config(data, env={}).flows["al"]
    assert isinstance(flow, AlarmHistoryFlow)
    assert flow.alarms == AlarmSelectionConfig(path="/")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tags", {"paths": ["/a"]}),
        ("mode", "raw"),
        ("method", "avg"),
        ("interval", "15m"),
        ("deadband", 0.5),
        ("invalid_as_null", True),
        ("limit", 100),
        ("batch", 50),
        ("metadata", False),
    ],
)
def test_a_tag_key_in_an_alarm_flow_is_named_as_belonging_to_tag_flows(
    key: str, value: Any
) -> None:
    assert error_of(with_alarm_flow(**{key: value})) == (
        f"flows.yaml: flows.al.{key}: belongs to tag_history flows; "
        "this flow's kind is alarm_history"
    )


def test_an_alarm_flow_that_forgot_its_kind_is_told_so_first() -> None:
    data = with_alarm_flow()
    del data["flows"]["al"]["kind"]
    assert error_of(data) == (
        "flows.yaml: flows.al.alarms: belongs to alarm_history flows; "
        "this flow's kind is tag_history (and 1 more)"
    )


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("flows.hourly.kind", "alarms", "flows.hourly.kind: 'alarms' is not one of tag_history, "),
        ("flows.hourly.kind", None, "flows.hourly.kind: None is not one of tag_history, "),
        ("flows.hourly", "raw", "flows.hourly: must be a mapping of flow keys (node, kind, "),
        ("flows.hourly.tags", ..., "flows.hourly.tags: is required"),
        ("flows.hourly.tags", None, "flows.hourly.tags: is required"),
        ("flows.hourly.window", "500ms", "flows.hourly.window: must be at least 1s"),
        ("flows.hourly.sinks", ["lake", "lake"], "flows.hourly.sinks: lists a sink twice"),
    ],
)
def test_flow_shape_errors_name_their_key(path: str, value: Any, expected: str) -> None:
    assert error_of(with_change(path, value)).startswith(f"flows.yaml: {expected}")


@pytest.mark.parametrize(
    ("tags", "key"),
    [
        ({"browse": "/", "exclude": ["Temp", r"(a)\1"]}, "flows.hourly.tags.exclude[1]"),
        ({"browse": "/", "include": ["(?=Temp)"]}, "flows.hourly.tags.include[0]"),
        ({"group": "/Plant/", "regex": r"(?<!x)Temp"}, "flows.hourly.tags.regex"),
    ],
)
def test_a_pattern_the_linear_engine_cannot_take_is_one_line_naming_its_key(
    tags: dict[str, Any], key: str
) -> None:
    message = error_of(with_change("flows.hourly.tags", tags))
    assert message.startswith(f"flows.yaml: {key}: ")
    assert "(matched by RE2, in linear time" in message
    assert "\n" not in message
