"""Pure incremental state: watermarks, look-back and settle, what is left to fetch.

Progress is a set of completed windows per member (tag or alarm selection), kept by each
sink with its data. The watermark is the end of the first unbroken run of completed
windows from the flow's start: chunks may finish in any order, and a gap keeps the
watermark where the gap begins.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from connectors.timewindow import Window
from pipelines.planning import Chunk
from sinks.base import Progress, merge_windows


def watermark(completed: Sequence[Window], origin: datetime) -> datetime | None:
    """End of the unbroken completed run that covers `origin`; None when nothing does."""
    for window in merge_windows(list(completed)):
        if window.start <= origin < window.end:
            return window.end
        if window.start > origin:
            return None
    return None


def member_watermarks(
    progress: Progress, members: Sequence[str], origin: datetime
) -> dict[str, datetime | None]:
    return {member: watermark(progress.windows_of(member), origin) for member in members}


def flow_watermark(progress: Progress, members: Sequence[str], origin: datetime) -> datetime | None:
    """The lowest member watermark: every member is complete up to it."""
    marks = member_watermarks(progress, members, origin)
    if not marks or any(mark is None for mark in marks.values()):
        return None
    return min(mark for mark in marks.values() if mark is not None)


def is_covered(completed: Sequence[Window], window: Window) -> bool:
    """True when the merged completed windows contain all of `window`."""
    for merged in merge_windows(list(completed)):
        if merged.start <= window.start and window.end <= merged.end:
            return True
    return False


def pending_chunks(
    chunks: Sequence[Chunk], progress: Progress, *, always: Window | None = None
) -> list[Chunk]:
    """Chunks some member still lacks; chunks overlapping `always` (look-back) are kept."""
    merged = {member: merge_windows(list(windows)) for member, windows in progress.completed.items()}
    pending: list[Chunk] = []
    for chunk in chunks:
        if always is not None and chunk.window.overlaps(always):
            pending.append(chunk)
            continue
        if not all(is_covered(merged.get(member, []), chunk.window) for member in chunk.members):
            pending.append(chunk)
    return pending


def incremental_span(
    *,
    history_start: datetime,
    watermark: datetime | None,
    now: datetime,
    lookback: timedelta,
    settle: timedelta,
) -> Window | None:
    """[watermark - lookback (not before history_start), now - settle); None when empty."""
    start = history_start if watermark is None else max(history_start, watermark - lookback)
    end = now - settle
    if end <= start:
        return None
    return Window(start, end)
