"""Shared helpers of the end-to-end tests: configs on the simulator, and sink contents."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import pyarrow as pa
import pytest
import yaml

from connectors.schema import KEYS
from pipelines.config import Config, load_config


def write_config(
    tmp_path: Path,
    *,
    node: dict[str, Any],
    flows: dict[str, dict[str, Any]],
    pg: tuple[str, str] | None = None,
    sinks: list[str] | None = None,
) -> Path:
    """A flows.yaml in tmp_path with a lake, a DuckDB warehouse and optionally PostgreSQL."""
    sink_defs: dict[str, Any] = {
        "lake": {"type": "parquet", "url": "lake"},
        "duck": {"type": "sql", "url": "duckdb:///warehouse.duckdb"},
    }
    if pg is not None:
        sink_defs["pg"] = {"type": "sql", "url": pg[0], "schema": pg[1]}
    names = sinks or list(sink_defs)
    for flow in flows.values():
        flow.setdefault("sinks", names)
    document = {"nodes": {"n": node}, "sinks": sink_defs, "flows": flows}
    path = tmp_path / "flows.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def load(path: Path) -> Config:
    return load_config(path, env={})


def canonical(frame: pd.DataFrame, kind: str = "tag_history") -> list[tuple[Any, ...]]:
    """Rows as sorted plain tuples: equal lists mean the same rows, each exactly once."""
    if frame.empty:
        return []
    table = pa.Table.from_pandas(frame, preserve_index=False)
    columns = [name for name in table.column_names]
    rows = list(zip(*[table.column(name).to_pylist() for name in columns], strict=True))
    key = [columns.index(k) for k in KEYS[kind]]
    return sorted(rows, key=lambda row: tuple(str(row[i]) for i in key))


def keys_of(frame: pd.DataFrame, kind: str = "tag_history") -> list[tuple[Any, ...]]:
    table = pa.Table.from_pandas(frame[list(KEYS[kind])], preserve_index=False)
    return list(zip(*[table.column(k).to_pylist() for k in KEYS[kind]], strict=True))


def server_missing(reason: str) -> NoReturn:
    """Skip a test whose server is missing here, but fail it where HISTORIAN_REQUIRE_PG=1
    (CI, `.ci/run`): there a missing server is a defect, not a reason."""
    if os.environ.get("HISTORIAN_REQUIRE_PG") == "1":
        pytest.fail(f"{reason} (HISTORIAN_REQUIRE_PG=1)")
    pytest.skip(reason)
