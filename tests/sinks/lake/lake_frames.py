"""Small builders of typed frames and scopes for the Parquet lake's tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pyarrow as pa

from connectors import schema
from connectors.timewindow import Window
from sinks.base import ChunkScope

T0 = datetime(2024, 3, 1, tzinfo=UTC)
ATTRS: dict[str, object] = {
    "kind": "tag_history",
    "node": "n1",
    "mode": "raw",
    "method": None,
    "interval_ms": None,
    "deadband": None,
    "invalid_as_null": None,
}
HOSTILE_TAGS = (
    "..",
    "../../etc/passwd",
    "/",
    "/a/b/c",
    'it\'s "quoted"',
    "'; drop table x; --",
    "a,b.c d",
    "Température/Δ/温度/🚀",
    "x" * 1000,
    "é" * 1000,
    "\\back\\slash",
    "*?[glob]{x}",
    "date=2024-01-01/part-x.parquet",
)


def window(start_h: float, end_h: float) -> Window:
    return Window(T0 + timedelta(hours=start_h), T0 + timedelta(hours=end_h))


def value_of(tag: str, ms: int) -> float:
    """A deterministic value per (tag, ms), so that every writer of a row agrees on it."""
    return float((ms // 1000) % 997) + (sum(map(ord, tag[:50])) % 100) / 100


def history_frame(
    tags: Sequence[str], win: Window, step_s: int = 600, node: str = "n1", twins: bool = False
) -> pd.DataFrame:
    """Rows of every tag every `step_s` in `win`, of mixed value types; `twins` adds seq 1."""
    rows: list[dict[str, Any]] = []
    ms = win.start_ms
    while ms < win.end_ms:
        for tag in sorted(tags):
            kind = sum(map(ord, tag)) % 3  # by tag, so every writer of a row agrees
            rows.append(
                {
                    "node": node,
                    "tag": tag,
                    "ts": ms,
                    "seq": 0,
                    "value": value_of(tag, ms) if kind == 0 else None,
                    "value_bool": (ms // 1000) % 2 == 0 if kind == 1 else None,
                    "value_str": f"s{ms % 7}" if kind == 2 else None,
                    "quality": 192 if ms % 3 else 0,
                    "extra": ms % 5 if ms % 2 else None,
                }
            )
            if twins:
                rows.append({**rows[-1], "seq": 1, "quality": 64})
        ms += step_s * 1000
    return typed(rows, schema.KIND_TAG_HISTORY)


def alarm_frame(paths: Sequence[str], win: Window, step_s: int = 900) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    ms = win.start_ms
    while ms < win.end_ms:
        for path in sorted(paths):
            rows.append(
                {
                    "node": "n1",
                    "path": path,
                    "ts": ms,
                    "status": (ms // 1000) % 4,
                    "priority": 2,
                    "value": "true",
                    "description": "pump trip",
                    "ack_ts": ms + 1000 if ms % 2 == 0 else None,
                    "ack_user": "op" if ms % 2 == 0 else None,
                    "ack_msg": None,
                    "ack_info": None,
                    "extra": '{"k": 1}',
                }
            )
        ms += step_s * 1000
    return typed(rows, schema.KIND_ALARM_HISTORY)


def metadata_frame(tags: Sequence[str], description: str = "d", node: str = "n1") -> pd.DataFrame:
    rows = [
        {
            "node": node,
            "tag": tag,
            "description": f"{description} {tag[:20]}",
            "type": "number",
            "number_type": "Float64",
            "eng_units": "°C",
            "format": None,
            "deadband": None,
            "client_access": "R",
            "history_enabled": True,
            "history_mode": "raw",
            "history_deadband": None,
            "views": None,
            "config": "{}",
            "updated_at": T0,
        }
        for tag in tags
    ]
    return typed(rows, schema.KIND_TAG_METADATA)


def typed(rows: list[dict[str, Any]], kind: str) -> pd.DataFrame:
    """Rows as a DataFrame with the kind's exact Arrow-backed dtypes."""
    target = schema.SCHEMAS[kind]
    if not rows:
        return schema.empty_frame(kind)
    columns = {}
    for item in target:
        values = [row[item.name] for row in rows]
        if pa.types.is_timestamp(item.type):
            columns[item.name] = pa.array(
                [
                    None if v is None else (v if isinstance(v, int) else int(v.timestamp() * 1000))
                    for v in values
                ],
                pa.int64(),
            ).cast(item.type)
        else:
            columns[item.name] = pa.array(values, item.type)
    return schema.frame_from_table(pa.table(columns, schema=target))


def scope(
    members: Sequence[str],
    win: Window,
    chunk_id: str,
    *,
    flow: str = "f",
    dataset: str = "hist",
    kind: str = schema.KIND_TAG_HISTORY,
    attrs: Mapping[str, object] | None = None,
    node: str = "n1",
) -> ChunkScope:
    return ChunkScope(
        flow=flow,
        dataset=dataset,
        kind=kind,
        members=tuple(members),
        window=win,
        chunk_id=chunk_id,
        attrs=dict(ATTRS if attrs is None else attrs),
        node=node,
    )


def in_scope(frame: pd.DataFrame, members: Sequence[str], win: Window) -> pd.DataFrame:
    """The rows of `frame` a scope covers (tag history)."""
    ms = _ms(frame)
    keep = frame["tag"].isin(list(members)) & (ms >= win.start_ms) & (ms < win.end_ms)
    return frame[keep.to_numpy(dtype=bool)]


def _ms(frame: pd.DataFrame) -> pd.Series:
    table = pa.Table.from_pandas(frame[["ts"]], preserve_index=False)
    return pd.Series(table.column("ts").cast(pa.int64()).to_numpy(), index=frame.index)


def rows_of(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Rows as comparable tuples (NA -> None, ts -> epoch ms), sorted."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if "ts" in table.column_names:
        table = table.set_column(table.column_names.index("ts"), "ts", table["ts"].cast(pa.int64()))
    if "ack_ts" in table.column_names:
        i = table.column_names.index("ack_ts")
        table = table.set_column(i, "ack_ts", table["ack_ts"].cast(pa.int64()))
    columns = [table.column(name).to_pylist() for name in table.column_names]
    return sorted(zip(*columns, strict=True), key=repr)


def concat(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(list(frames), ignore_index=True)
