"""Rows per window, as chunk records say and as a sink holds them: what the sinks whose
records name a member count, not the members (the warehouse, Delta, Iceberg), compare.

Chunks of one window are tag batches whose member counts add up; a chunk re-written for
some of its tags only (`state reset --tag`) is newer and covers part of an older chunk:
taken newest first, a chunk is counted while the members counted so far plus its own do
not exceed the flow's, so an older chunk overlapped that way is not counted (its window is
then checked against the newer chunks only: a loss there could go unseen). A window
holding fewer rows than counted lost rows; more is no loss (a later chunk whose window
overlaps it, a look-back, may have added late samples).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from connectors.timewindow import Window
from sinks.base import Damage


@dataclass(frozen=True)
class Record:
    """One committed chunk as its sink recorded it."""

    chunk_id: str
    dataset: str
    window: Window
    members: int
    rows: int  # committed
    committed_at: datetime


@dataclass
class Expected:
    """A dataset window's chunks, and the rows they committed (those counted)."""

    dataset: str
    window: Window
    rows: int = 0
    members: int = 0
    chunks: list[str] = field(default_factory=list)


def expected_rows(records: Sequence[Record], flow_members: int) -> list[Expected]:
    """Per (dataset, window): rows committed by its chunks, newest first, counting a
    chunk only while members add up to at most the flow's (module docstring)."""
    groups: dict[tuple[str, Window], Expected] = {}
    for record in sorted(records, key=lambda r: r.committed_at, reverse=True):
        key = (record.dataset, record.window)
        group = groups.setdefault(key, Expected(record.dataset, record.window))
        group.chunks.append(record.chunk_id)
        if group.members + record.members <= max(flow_members, record.members):
            group.members += record.members
            group.rows += record.rows
    return sorted(groups.values(), key=lambda g: (g.dataset, g.window))


def bucket_ms(windows: Sequence[Window]) -> tuple[int, int]:
    """(origin, width) of buckets every window is a whole number of: the windows' common
    divisor (an hour for hourly chunks; a minute for look-backs cut at minutes)."""
    origin = min(w.start_ms for w in windows)
    width = 0
    for window in windows:
        width = math.gcd(width, window.start_ms - origin, window.end_ms - origin)
    return origin, max(width, 1)


def short_windows(
    expected: Sequence[Expected], counts: Mapping[int, int], buckets: tuple[int, int], where: str
) -> list[Damage]:
    """The windows holding fewer rows than counted, from rows per bucket (`bucket_ms`)."""
    origin, width = buckets
    damages = []
    for group in expected:
        first = (group.window.start_ms - origin) // width
        last = (group.window.end_ms - origin) // width
        held = sum(counts.get(b, 0) for b in range(first, last))
        if held < group.rows:
            problem = f"holds {held:,} rows, recorded {group.rows:,}"
            damages.append(Damage(where, group.window, problem, tuple(group.chunks)))
    return damages
