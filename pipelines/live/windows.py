"""The tail's rows by window of event time: what each commit writes, and what is too late.

Rows are kept on a grid of `commit_every`-wide windows of their own timestamps, so a late
sample (store-and-forward, a remote link) lands in the window it belongs to. A commit
writes every window that received rows since the last one, each with ALL the rows the
tail holds for it, and its scope names the tags of those rows only: a tail write replaces
its scope, so it never drops a row an earlier commit wrote. A tag's committed rows stay
while they are within `late_within` of that tag's newest committed sample (a tag behind a
link with a steady lag is late for everyone but itself), and at most `KEEP` behind the
newest of all (memory: a tag that went quiet). A sample in a window whose rows of its
tag were let go, or in a window given to history (`fence`: a gap history re-reads), is
not the tail's to write: it is returned, and its window becomes a gap.
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

# How long behind the newest sample a quiet (or far behind) tag's rows are kept at most.
KEEP = timedelta(minutes=10)
MIN_MS = -(1 << 62)


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
    """Rows per window of event time, each tag's while within `late_within` of its newest."""

    def __init__(self, width: timedelta, late_within: timedelta) -> None:
        self.width_ms = max(1, int(width.total_seconds() * 1000))
        self.late_ms = int(late_within.total_seconds() * 1000)
        self.keep_ms = max(self.late_ms, int(KEEP.total_seconds() * 1000))
        self._slots: dict[int, _Slot] = {}
        self._fences: list[list[int]] = []  # [start_ms, end_ms] given to history, merged
        self._newest: dict[str, int] = {}  # tag -> its newest committed sample (ms)
        self._dropped: dict[str, int] = {}  # tag -> end of the last window its rows left
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
        late = self._let_go(rows.column("tag"), slots)
        windows: set[int] = set()
        for start in np.unique(slots).tolist():
            here = slots == start
            if self._fenced(int(start)):
                windows.add(int(start))
                continue
            if late is not None and late[here].any():
                windows.add(int(start))
                here &= ~late
                if not here.any():
                    continue
            slot = self._slots.setdefault(int(start), _Slot())
            slot.tables.append(rows.filter(pa.array(here)))
            slot.dirty = True
        return [Window.from_ms(s, s + self.width_ms) for s in sorted(windows)]

    def _let_go(self, tags: pa.ChunkedArray, slots: np.ndarray) -> np.ndarray | None:
        """Which rows fall in a window whose rows of their tag were let go, or `KEEP`
        behind the newest sample (None: none)."""
        late = np.zeros(len(slots), dtype=bool)
        if self.newest_ms is not None:
            late |= slots + self.width_ms <= self.newest_ms - self.keep_ms
        if self._dropped:
            names = pc.unique(tags)
            until = np.array([self._dropped.get(str(n), MIN_MS) for n in names.to_pylist()])
            at = pc.index_in(tags, value_set=names).to_numpy(zero_copy_only=False)
            late |= slots < until[at]
        return late if late.any() else None

    def _fenced(self, start: int) -> bool:
        return any(s < start + self.width_ms and start < e for s, e in self._fences)

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
        newest = rows.group_by("tag").aggregate([("ts", "max")])
        for tag, ts in zip(
            newest.column("tag").to_pylist(),
            newest.column("ts_max").cast(pa.int64()).to_pylist(),
            strict=True,
        ):
            self._newest[tag] = max(self._newest.get(tag, ts), ts)
            self.newest_ms = ts if self.newest_ms is None else max(self.newest_ms, ts)
        return Batch(window, rows)

    def forget_old(self) -> None:
        """Let go of each tag's written rows past its horizon (all rows `KEEP` behind the
        newest), and of fences no sample can reach."""
        if self.newest_ms is None:
            return
        for start in [s for s, slot in self._slots.items() if not slot.dirty]:
            end = start + self.width_ms
            if end <= self.newest_ms - self.late_ms:
                self._thin(start, end)
        reach = self.newest_ms - self.keep_ms  # older samples are let go whatever their tag
        self._fences = [f for f in self._fences if f[1] > reach - self.width_ms]

    def _thin(self, start: int, end: int) -> None:
        """The slot without the rows of tags past their horizon (gone when none is left)."""
        rows = self._slots[start].rows()
        names = pc.unique(rows.column("tag"))
        listed = [str(n) for n in names.to_pylist()]
        every = end <= self.newest_ms - self.keep_ms if self.newest_ms is not None else False
        done = [t for t in listed if every or end <= self._newest.get(t, MIN_MS) - self.late_ms]
        if not done:
            return
        for tag in done:
            self._dropped[tag] = max(self._dropped.get(tag, end), end)
        if len(done) == len(listed):
            del self._slots[start]
            return
        kept = pc.invert(pc.is_in(rows.column("tag"), value_set=pa.array(done, pa.string())))
        self._slots[start].tables = [rows.filter(kept)]

    def newest_of(self, tag: str) -> int | None:
        """The newest committed sample of `tag` (ms), if any."""
        return self._newest.get(tag)

    def rows_held(self) -> int:
        return sum(t.num_rows for slot in self._slots.values() for t in slot.tables)
