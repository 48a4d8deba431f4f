"""Opening the sinks a config names: how long each kind of command waits for them."""

from __future__ import annotations

from pathlib import Path

from pipelines.config.destinations import SinkSet, make_sink
from pipelines.config.models import Config, parse_config
from sinks.sql.warehouse import RETRY_S, SqlWarehouse


def _config(url: str) -> Config:
    return parse_config(
        {
            "nodes": {"n": {"simulator": {}}},
            "sinks": {"wh": {"type": "sql", "url": url}},
            "flows": {
                "f": {
                    "node": "n",
                    "sinks": ["wh"],
                    "tags": {"paths": ["/a"]},
                    "start": "2026-01-01",
                }
            },
        },
        env={},
    )


def test_a_run_waits_out_a_database_that_is_away_a_look_does_not(tmp_path: Path) -> None:
    """A run (and any library caller) retries a warehouse that is away for `retry_s`; the
    commands that only look pass patient=False and hear at once that it is away."""
    config = _config(f"duckdb:///{tmp_path / 'w.duckdb'}")
    patient = make_sink("wh", config.sinks["wh"], tmp_path)
    looking = make_sink("wh", config.sinks["wh"], tmp_path, patient=False)
    assert isinstance(patient, SqlWarehouse)
    assert isinstance(looking, SqlWarehouse)
    assert (patient.retry_s, looking.retry_s) == (RETRY_S, 0.0)
    with SinkSet(config, tmp_path, patient=False) as sinks:
        opened = sinks.get("wh")
        assert isinstance(opened, SqlWarehouse)
        assert opened.retry_s == 0.0
