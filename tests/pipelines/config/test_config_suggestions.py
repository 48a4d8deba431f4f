"""A typo in flows.yaml is answered with the name it was probably meant to be, in one line;
a name close to nothing gets no guess."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.config.models import Config, ConfigError, load_config
from pipelines.config.names import closest, keys_at
from tests.pipelines.config.test_config import error_of, with_change


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            "flows.hourly.windw",
            "1h",
            "flows.yaml: flows.hourly.windw: unknown key; did you mean window?",
        ),
        (
            "flows.hourly.tags.pahts",
            ["/a"],
            "flows.yaml: flows.hourly.tags.pahts: unknown key; did you mean paths?",
        ),
        (
            "flows.hourly.schedule.timezon",
            "UTC",
            "flows.yaml: flows.hourly.schedule.timezon: unknown key; did you mean timezone?",
        ),
        (
            "nodes.plant.read_timout",
            "30s",
            "flows.yaml: nodes.plant.read_timout: unknown key; did you mean read_timeout?",
        ),
        (
            "sinks.wh.shema",
            "x",
            "flows.yaml: sinks.wh.shema: unknown key; did you mean schema?",
        ),
        (
            "sinks.lake.partiton",
            "date",
            "flows.yaml: sinks.lake.partiton: unknown key; did you mean partition?",
        ),
        ("flows.hourly.colour", "blue", "flows.yaml: flows.hourly.colour: unknown key"),
    ],
)
def test_an_unknown_key_at_any_level_suggests_the_closest_key_of_that_level(
    path: str, value: Any, expected: str
) -> None:
    assert error_of(with_change(path, value)) == expected


def test_an_unknown_flow_node_or_sink_named_in_the_file_suggests_the_closest_name() -> None:
    assert error_of(with_change("flows.hourly.node", "plnat")) == (
        "flows.yaml: flows.hourly.node: unknown node 'plnat' (nodes: plant); did you mean plant?"
    )
    assert error_of(with_change("flows.hourly.sinks", ["lake", "lkae"])) == (
        "flows.yaml: flows.hourly.sinks: unknown sink 'lkae' (sinks: lake, wh); did you mean lake?"
    )


def test_a_reference_close_to_no_name_gets_no_suggestion() -> None:
    message = error_of(with_change("flows.hourly.node", "elsewhere"))
    assert message == "flows.yaml: flows.hourly.node: unknown node 'elsewhere' (nodes: plant)"
    assert "did you mean" not in error_of(with_change("flows.hourly.sinks", ["s3"]))


def test_an_unknown_top_level_key_suggests_the_closest_and_names_its_line(tmp_path: Path) -> None:
    file = tmp_path / "flows.yaml"
    file.write_text("nodes: {}\nflos: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(file, env={})
    assert str(caught.value) == f"{file}: flos (line 2): unknown key; did you mean flows?"
    file.write_text(yaml.safe_dump({"nodes": {}, "zzz": 1}), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(file, env={})
    assert "did you mean" not in str(caught.value)


def test_keys_at_walks_maps_discriminated_branches_and_aliases() -> None:
    assert "window" in keys_at(Config, ("flows", "f", "tag_history"))
    assert "alarms" in keys_at(Config, ("flows", "f", "alarm_history"))
    assert "schema" in keys_at(Config, ("sinks", "w", "sql"))
    assert keys_at(Config, ("flows", "f", "tag_history", "tags"))[0] == "paths"
    assert keys_at(Config, ("nowhere",)) == []
    assert closest("ho_rwa", ["ho_raw", "ho_alarms"]) == "ho_raw"
    assert closest("qqqq", ["ho_raw", "ho_alarms"]) is None
