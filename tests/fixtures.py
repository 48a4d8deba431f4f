"""Shared helpers of the end-to-end tests: configs on the simulator, and sink contents."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import pyarrow as pa
import pytest
import yaml

from connectors.options import AlarmFilter, HistoryOptions
from connectors.schema import KEYS
from connectors.timewindow import Window
from pipelines.config.models import Config, load_config


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
    # The table formats, defined only when named (tests read every defined sink).
    tables = {
        "delta": {"type": "delta", "url": "delta"},
        "ice": {"type": "iceberg", "url": "iceberg"},
    }
    sink_defs.update({name: tables[name] for name in sinks or [] if name in tables})
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


def _value(number: Any, flag: Any, text: Any) -> Any:
    """One sample's value as (kind, value): the column it is in says its type."""
    if flag is not None:
        return ("bool", bool(flag))
    if text is not None:
        return ("str", text)
    return None if number is None else ("num", float(number))


def history_rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Tag-history rows of a sink as sorted (tag, ts ms, seq, value, quality, extra)."""
    if frame.empty:
        return []
    table = pa.Table.from_pandas(frame, preserve_index=False)
    wanted = ("tag", "seq", "value", "value_bool", "value_str", "quality", "extra")
    columns = {name: table.column(name).to_pylist() for name in wanted}  # not ts as datetimes
    stamps = table.column("ts").cast(pa.int64()).to_pylist()
    rows = [
        (str(tag), ts, int(seq), _value(number, flag, text), quality, extra)
        for tag, ts, seq, number, flag, text, quality, extra in zip(
            columns["tag"],
            stamps,
            columns["seq"],
            columns["value"],
            columns["value_bool"],
            columns["value_str"],
            columns["quality"],
            columns["extra"],
            strict=True,
        )
    ]
    return sorted(rows, key=lambda row: (row[0], row[1], row[2]))


def truth_history_rows(
    node: Any, tags: Sequence[str], windows: Sequence[Window], options: HistoryOptions
) -> list[tuple[Any, ...]]:
    """What the node holds for `tags`, asked window by window as the pipeline asks (delta
    and filter depend on where a query starts), as `history_rows` shows a sink's rows."""
    rows = []
    for tag in tags:
        for window in windows:
            seen: dict[int, int] = {}
            for row in node.ground_truth(tag, window.start_ms, window.end_ms, options):
                ts, value, quality, extra = [*row, None, None, None][:4]
                seq = seen.get(ts, 0)
                seen[ts] = seq + 1
                if isinstance(value, bool):
                    shown: Any = ("bool", value)
                elif isinstance(value, str):
                    shown = ("str", value)
                else:
                    shown = None if value is None else ("num", float(value))
                rows.append((tag, int(ts), seq, shown, quality, extra))
    return sorted(rows, key=lambda row: (row[0], row[1], row[2]))


def alarm_rows(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Alarm-history rows of a sink as sorted (path, ts ms, status, priority)."""
    if frame.empty:
        return []
    table = pa.Table.from_pandas(frame, preserve_index=False)
    stamps = table.column("ts").cast(pa.int64()).to_pylist()
    return sorted(
        zip(
            table.column("path").to_pylist(),
            stamps,
            table.column("status").to_pylist(),
            table.column("priority").to_pylist(),
            strict=True,
        )
    )


def truth_alarm_rows(
    node: Any, span: Window, filt: AlarmFilter | None = None, path: str = "/"
) -> list[tuple[Any, ...]]:
    """The node's alarm events in `span`, as `alarm_rows` shows a sink's."""
    events = node.alarm_ground_truth(span.start_ms, span.end_ms, filt, path)
    return sorted({(e["path"], e["ts"], e["status"], e["priority"]) for e in events})


def in_windows(rows: set[Any], done: dict[str, list[Window]]) -> set[Any]:
    """The alarm rows (path, ts, ...) stamped inside any window of `done`."""
    windows = [window for member in done.values() for window in member]
    return {r for r in rows if any(w.start_ms <= r[1] < w.end_ms for w in windows)}


def server_missing(reason: str) -> NoReturn:
    """Skip a test whose server is missing here, but fail it where HISTORIAN_REQUIRE_SERVERS=1
    (CI, `.ci/run`; HISTORIAN_REQUIRE_PG=1 is its older name): there a missing server is a
    defect, not a reason."""
    for variable in ("HISTORIAN_REQUIRE_SERVERS", "HISTORIAN_REQUIRE_PG"):
        if os.environ.get(variable) == "1":
            pytest.fail(f"{reason} ({variable}=1)")
    pytest.skip(reason)


@contextmanager
def own_database(pg_url: str, prefix: str) -> Iterator[str]:
    """A database of the test's own (`<prefix>_<random>`) in the real PostgreSQL at
    `pg_url`, dropped after (connections still open included); yields its URL."""
    import sqlalchemy as sa

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'create database "{name}"'))
    try:
        yield pg_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'drop database if exists "{name}" with (force)'))
        admin.dispose()


class HeldWriter:
    """A run's `on_chunk` that holds the writer after each write until the fetch stage is
    at rest (nothing fetching and, with `until`, at least `until(n)` chunks held after the
    n-th write), then notes the chunks the process holds (`engine.HELD`): how far fetching
    ran ahead of a writer that stopped."""

    def __init__(self, until: Callable[[int], int] | None = None, within_s: float = 30) -> None:
        import gc

        from pipelines.core.engine import HELD

        gc.collect()  # what earlier tests left for the collector is not this run's
        self.base = HELD.now
        HELD.reset_peak()
        self.until = until
        self.within_s = within_s
        self.seen: list[int] = []

    def __call__(self, outcome: object, summary: object) -> None:
        import time

        from pipelines.core.engine import FETCHING, HELD

        wanted = self.until(len(self.seen) + 1) if self.until is not None else 0
        deadline = time.monotonic() + self.within_s
        while FETCHING.now or HELD.now - self.base < wanted:
            assert time.monotonic() < deadline, f"fetching did not come to rest: {self.seen}"
            time.sleep(0.01)  # a condition waited for, bounded: not a fixed sleep
        self.seen.append(HELD.now - self.base)

    @property
    def peak(self) -> int:
        """The most chunks held at once during the run."""
        from pipelines.core.engine import HELD

        return HELD.peak - self.base
