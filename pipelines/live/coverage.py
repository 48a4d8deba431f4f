"""What history already proved: per tag, the windows the unit's progress holds complete.

A tail write replaces its scope, so a tail commit over a window history proved would
put the tail's rows (often fewer: those since the tail started) in place of history's.
The tail never writes there: samples inside a tag's complete coverage are dropped
(history has them), and a commit's windows are clipped to the part of each tag's
timeline not complete. Tags with the same coverage (history completes many at once)
share one group, so clipping costs per group, not per tag.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.timewindow import Window
from sinks.base import merge_ms

Spans = tuple[tuple[int, int], ...]  # merged, sorted [start_ms, end_ms)


class Coverage:
    """The complete windows of each tag, in any of the unit's sinks (never rewritten)."""

    def __init__(self) -> None:
        self._spans: dict[str, Spans] = {}
        self._names = pa.array([], pa.string())
        self._group_of = np.zeros(0, dtype=np.int64)
        self._groups: list[tuple[np.ndarray, np.ndarray]] = []

    def update(self, completed: Iterable[Mapping[str, Sequence[Window]]]) -> None:
        """Take the complete windows of every sink's progress (members not tags ignored
        by the caller's rows: only tags the rows name are looked up)."""
        merged: dict[str, list[list[int]]] = {}
        for progress in completed:
            for member, windows in progress.items():
                merged.setdefault(member, []).extend([w.start_ms, w.end_ms] for w in windows)
        self._spans = {m: tuple((s, e) for s, e in merge_ms(v)) for m, v in merged.items() if v}
        keys: dict[Spans, int] = {}
        group_of = [keys.setdefault(spans, len(keys)) for spans in self._spans.values()]
        self._names = pa.array(list(self._spans), pa.string())
        self._group_of = np.array(group_of, dtype=np.int64)
        self._groups = [
            (np.array([s for s, _ in spans]), np.array([e for _, e in spans])) for spans in keys
        ]

    def _inside(self, tags: pa.ChunkedArray | pa.Array, ts: np.ndarray) -> np.ndarray:
        """Which rows (tag, ts ms) fall inside their tag's complete coverage."""
        inside = np.zeros(len(ts), dtype=bool)
        if not self._groups or not len(ts):
            return inside
        at = pc.index_in(tags, value_set=self._names).to_numpy(zero_copy_only=False)
        known = ~np.isnan(at) if at.dtype.kind == "f" else np.ones(len(at), dtype=bool)
        if not known.any():
            return inside
        group = np.full(len(ts), -1, dtype=np.int64)
        group[known] = self._group_of[at[known].astype(np.int64)]
        for index in np.unique(group[known]).tolist():
            starts, ends = self._groups[index]
            rows = group == index
            i = np.searchsorted(starts, ts[rows], side="right") - 1
            inside[rows] = (i >= 0) & (ts[rows] < ends[np.maximum(i, 0)])
        return inside

    def drop(self, rows: pa.Table) -> pa.Table:
        """`rows` without those inside their tag's complete coverage (history has them)."""
        if not self._groups or not rows.num_rows:
            return rows
        ts = rows.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
        inside = self._inside(rows.column("tag"), ts)
        return rows.filter(pa.array(~inside)) if inside.any() else rows

    def clip(self, window: Window, rows: pa.Table) -> list[tuple[Window, pa.Table]]:
        """The writes that put `rows` in `window` without touching complete coverage:
        per set of tags with the same free parts of `window`, each part and its rows."""
        tags = [str(t) for t in pc.unique(rows.column("tag")).to_pylist()]
        by_free: dict[Spans, list[str]] = {}
        for tag in tags:
            by_free.setdefault(self._free(tag, window), []).append(tag)
        if len(by_free) == 1 and next(iter(by_free)) == ((window.start_ms, window.end_ms),):
            return [(window, rows)]
        ts = rows.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
        writes: list[tuple[Window, pa.Table]] = []
        for free, members in by_free.items():
            mine = pc.is_in(rows.column("tag"), value_set=pa.array(members, pa.string()))
            mine_np = mine.to_numpy(zero_copy_only=False)
            for start, end in free:
                here = mine_np & (ts >= start) & (ts < end)
                if here.any():
                    writes.append((Window.from_ms(start, end), rows.filter(pa.array(here))))
        return writes

    def _free(self, tag: str, window: Window) -> Spans:
        """The parts of `window` outside `tag`'s complete coverage."""
        free: list[tuple[int, int]] = []
        cursor = window.start_ms
        for start, end in self._spans.get(tag, ()):
            if end <= cursor or start >= window.end_ms:
                continue
            if start > cursor:
                free.append((cursor, start))
            cursor = max(cursor, end)
        if cursor < window.end_ms:
            free.append((cursor, window.end_ms))
        return tuple(free)
