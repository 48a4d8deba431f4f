"""Typed frames and scopes for the warehouse tests (tag history, alarms, tag metadata)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa

from connectors import schema
from connectors.timewindow import Window, to_ms
from sinks.base import ChunkScope

T0 = datetime(2024, 3, 1, tzinfo=UTC)
ATTRS: dict[str, object] = {
    "kind": schema.KIND_TAG_HISTORY,
    "node": "node1",
    "mode": "raw",
    "method": None,
    "interval_ms": None,
    "deadband": 0.5,
    "invalid_as_null": False,
}


def hours(start: float, end: float) -> Window:
    """The window [T0 + start h, T0 + end h)."""
    return Window(T0 + timedelta(hours=start), T0 + timedelta(hours=end))


def history(
    tags: Sequence[str], window: Window, step_s: int = 600, node: str = "node1"
) -> pd.DataFrame:
    """Samples every `step_s` for each tag in the window; values derive from (tag, ts)."""
    ts = np.arange(window.start_ms, window.end_ms, step_s * 1000, dtype=np.int64)
    n_tags, n_ts = len(tags), len(ts)
    all_ts = np.tile(ts, n_tags)
    tag_index = np.repeat(np.arange(n_tags), n_ts)
    n = len(all_ts)
    value = (all_ts % 86_400_000) / 1000.0 + tag_index
    keys = (all_ts // 60_000 + tag_index).tolist()  # per (tag, ts): same in any chunking
    columns = {
        "node": pa.array([node] * n, pa.string()),
        "tag": pa.array([tags[i] for i in tag_index], pa.string()),
        "ts": pa.array(all_ts).cast(schema.TS_TYPE),
        "seq": pa.array(np.zeros(n, dtype=np.int16)),
        "value": pa.array(value),
        "value_bool": pa.array((all_ts // 1000) % 2 == 0),
        "value_str": pa.array([None if k % 3 == 0 else f"v{k % 5}" for k in keys], pa.string()),
        "quality": pa.array(np.full(n, 192, dtype=np.int16)),
        "extra": pa.array([None if k % 2 else k for k in keys], pa.int64()),
    }
    return schema.frame_from_table(pa.table(columns, schema=schema.TAG_HISTORY_SCHEMA))


def rows(kind: str, records: list[dict[str, object]]) -> pd.DataFrame:
    """A frame of the kind's schema from explicit records (missing fields are null)."""
    target = schema.SCHEMAS[kind]
    data = {f.name: pa.array([r.get(f.name) for r in records], type=f.type) for f in target}
    return schema.frame_from_table(pa.table(data, schema=target))


def alarms(
    paths: Sequence[str], window: Window, step_s: int = 900, node: str = "node1"
) -> pd.DataFrame:
    """One alarm event per path every `step_s` in the window."""
    records: list[dict[str, object]] = []
    for ms in range(window.start_ms, window.end_ms, step_s * 1000):
        for index, path in enumerate(paths):
            records.append(
                {
                    "node": node,
                    "path": path,
                    "ts": datetime.fromtimestamp(ms / 1000, tz=UTC),
                    "status": index % 3,
                    "priority": 2,
                    "value": '{"v": 1.5}',
                    "description": "",
                    "ack_ts": None,
                    "ack_user": None if index % 2 else "",
                    "extra": "{}",
                }
            )
    return rows(schema.KIND_ALARM_HISTORY, records)


def scope(
    members: Sequence[str],
    window: Window,
    *,
    dataset: str = "hist",
    flow: str = "f1",
    kind: str = schema.KIND_TAG_HISTORY,
    attrs: dict[str, object] | None = None,
    node: str = "node1",
) -> ChunkScope:
    """A chunk scope with a chunk id derived from what it covers."""
    chunk_id = f"{dataset}-{to_ms(window.start)}-{to_ms(window.end)}-{len(members)}"
    base = dict(ATTRS, kind=kind) if attrs is None else attrs
    return ChunkScope(flow, dataset, kind, tuple(members), window, chunk_id, base, node=node)


def sort_key(frame: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Sorted by the kind's key with a fresh index (comparisons independent of order)."""
    return frame.sort_values(list(schema.KEYS[kind]), kind="stable").reset_index(drop=True)
