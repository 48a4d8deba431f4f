"""The tail's rows by window of event time: what each commit writes, and what is too late.

Rows are kept on a grid of `commit_every`-wide windows of their own timestamps, so a late
sample (store-and-forward, a remote link) lands in the window it belongs to. A commit
writes every window that received rows since the last one, each with ALL the rows the
tail holds for it: a tail write replaces its scope, so it never drops a row an earlier
commit wrote. Committed windows stay while they are within `late_within` of the newest
sample committed (memory: that span of rows); a sample older than that, or in a window given to
history (`fence`: a gap history re-reads), is not the tail's to write: it is returned,
and its window becomes a gap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.normalise.history import assign_seq
from connectors.timewindow import Window
from sinks.base import merge_ms


@dataclass
class _Slot:
    tables: list[pa.Table] = field(default_factory=list)
    dirty: bool = False

    def rows(self) -> pa.Table:
        """The slot's rows as one table (kept so: the next commit concatenates less)."""
        if len(self.tables) > 1:
            self.tables = [pa.concat_tables(self.tables)]
        return self.tables[0]


@dataclass(frozen=True)
class Batch:
    """One write of a commit: contiguous windows and every row held for them."""

    window: Window
    rows: pa.Table


class WindowBuffer:
    """Rows per window of event time since they are within `late_within` of the newest."""

    def __init__(self, width: timedelta, late_within: timedelta) -> None:
        self.width_ms = max(1, int(width.total_seconds() * 1000))
        self.late_ms = int(late_within.total_seconds() * 1000)
        self._slots: dict[int, _Slot] = {}
        self._fences: list[list[int]] = []  # [start_ms, end_ms] given to history, merged
        self.newest_ms: int | None = None

    def grid(self, start_ms: int, end_ms: int) -> Window:
        """[start_ms, end_ms) widened to whole windows of the grid."""
        width = self.width_ms
        first = start_ms // width * width
        last = -(-end_ms // width) * width
        return Window.from_ms(first, max(last, first + width))

    def add(self, rows: pa.Table) -> list[Window]:
        """Keep `rows`; the windows of those it cannot write (too late, or fenced)."""
        if not rows.num_rows:
            return []
        ts = rows.column("ts").cast(pa.int64()).to_numpy(zero_copy_only=False)
        slots = ts // self.width_ms * self.width_ms
        late: list[Window] = []
        for start in np.unique(slots).tolist():
            picked = rows.filter(pa.array(slots == start))
            if not self._writable(int(start)):
                late.append(Window.from_ms(int(start), int(start) + self.width_ms))
                continue
            slot = self._slots.setdefault(int(start), _Slot())
            slot.tables.append(picked)
            slot.dirty = True
        return late

    def _writable(self, start: int) -> bool:
        if any(s < start + self.width_ms and start < e for s, e in self._fences):
            return False
        return start in self._slots or start + self.width_ms > self._horizon()

    def _horizon(self) -> int:
        """Windows ending at or before this are no longer the tail's to write: `late_within`
        before the newest sample committed (samples not yet committed are never late)."""
        if self.newest_ms is None:
            return -(1 << 62)
        return self.newest_ms - self.late_ms

    def fence(self, window: Window) -> Window:
        """Give `window` (widened to the grid) to history: its rows are dropped, and the
        tail writes nothing in it from now on. Returns the widened window."""
        whole = self.grid(window.start_ms, window.end_ms)
        for start in [s for s in self._slots if whole.start_ms <= s < whole.end_ms]:
            del self._slots[start]
        self._fences = merge_ms([*self._fences, [whole.start_ms, whole.end_ms]])
        return whole

    def pending(self) -> bool:
        return any(slot.dirty for slot in self._slots.values())

    def take(self) -> Iterator[Batch]:
        """The writes of a commit: runs of contiguous windows holding new rows, each with
        every row held for its windows (seq numbered); marked written as they are taken."""
        run: list[int] = []
        for start in sorted(s for s, slot in self._slots.items() if slot.dirty):
            if run and start != run[-1] + self.width_ms:
                yield self._batch(run)
                run = []
            run.append(start)
        if run:
            yield self._batch(run)

    def _batch(self, starts: list[int]) -> Batch:
        tables = [self._slots[start].rows() for start in starts]
        for start in starts:
            self._slots[start].dirty = False
        window = Window.from_ms(starts[0], starts[-1] + self.width_ms)
        rows = assign_seq(pa.concat_tables(tables))
        newest = int(pc.max(rows.column("ts").cast(pa.int64())).as_py())
        self.newest_ms = newest if self.newest_ms is None else max(self.newest_ms, newest)
        return Batch(window, rows)

    def forget_old(self) -> None:
        """Drop the written windows past the horizon, and fences no sample can reach."""
        horizon = self._horizon()
        for start in [s for s, slot in self._slots.items() if not slot.dirty]:
            if start + self.width_ms <= horizon:
                del self._slots[start]
        self._fences = [f for f in self._fences if f[1] > horizon - self.width_ms]

    def rows_held(self) -> int:
        return sum(t.num_rows for slot in self._slots.values() for t in slot.tables)
