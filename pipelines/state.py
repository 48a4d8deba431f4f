"""Pure incremental state: watermarks, look-back and settle, what is left to fetch.

Progress is a set of completed windows per member (tag or alarm selection), kept by each
sink with its data. The watermark is the end of the first unbroken run of completed
windows from the flow's start: chunks may finish in any order, and a gap keeps the
watermark where the gap begins, so a crash never lets the watermark run ahead of data.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from connectors.facts import NodeClock, NodeIdentity, NodeMoved
from connectors.timewindow import Window
from pipelines.planning import Chunk
from sinks.base import (
    IDENTITY_PREFIX,
    MISSING_PREFIX,
    RECORD_PREFIXES,
    ChunkRecord,
    Progress,
    held_of,
    merge_windows,
)

# A window the node left a (group-resolved) tag out of is recorded, in the same atomic
# write as the chunk's rows, as progress of the member `missing:<tag path>`: tag paths
# start with `/`, so it can never be a tag's own progress.
# A window held for a tag behind a link that has not delivered it yet (pipelines/core/
# holds.py) is recorded the same way, as progress of `held:<link, percent-encoded>:<tag>`.
# The node a window was extracted from is recorded the same way, as progress of the member
# `node:<identity key>` (connectors.facts.NodeIdentity.key) in every chunk's write: the
# progress says which node it came from, per window, in the sink that holds the rows.


class _Coverage:
    """Merged completed windows of one member, searchable by start (bisect)."""

    def __init__(self, completed: Sequence[Window]) -> None:
        # One window (most members' progress once a flow runs on schedule) is merged as it is.
        self.merged = list(completed) if len(completed) <= 1 else merge_windows(list(completed))
        self.starts = [window.start for window in self.merged]

    def run_at(self, moment: datetime) -> Window | None:
        """The merged window containing `moment`, if any."""
        index = bisect_right(self.starts, moment) - 1
        if index >= 0 and moment < self.merged[index].end:
            return self.merged[index]
        return None

    def covers(self, window: Window) -> bool:
        run = self.run_at(window.start)
        return run is not None and window.end <= run.end


class _Coverages:
    """One `_Coverage` per distinct window list: a progress shares one list between the
    members with the same windows (`sinks.base.SharedWindows`), so 10,000 tags of one
    flow are mostly one coverage. Each list is held, so its identity stays its own."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Sequence[Window], _Coverage]] = {}

    def of(self, progress: Progress, member: str) -> _Coverage:
        windows = progress.completed.get(member, _NOTHING)
        found = self._by_id.get(id(windows))
        if found is None:
            found = self._by_id[id(windows)] = (windows, _Coverage(windows))
        return found[1]


_NOTHING: list[Window] = []


def watermark(completed: Sequence[Window], origin: datetime) -> datetime | None:
    """End of the unbroken run of completed windows (touching ones join) that contains
    `origin`; None when `origin` itself is not complete."""
    run = _Coverage(completed).run_at(origin)
    return run.end if run is not None else None


def member_watermarks(
    progress: Progress, members: Sequence[str], origin: datetime
) -> dict[str, datetime | None]:
    """The watermark of each member (None for members with nothing complete at origin)."""
    coverages = _Coverages()
    marks: dict[int, datetime | None] = {}

    def mark_of(member: str) -> datetime | None:
        coverage = coverages.of(progress, member)
        if id(coverage) not in marks:
            run = coverage.run_at(origin)
            marks[id(coverage)] = run.end if run is not None else None
        return marks[id(coverage)]

    return {member: mark_of(member) for member in members}


def flow_watermark(progress: Progress, members: Sequence[str], origin: datetime) -> datetime | None:
    """The lowest member watermark: every member is complete from origin up to it.

    None when there are no members or any member has no watermark.
    """
    marks = member_watermarks(progress, members, origin).values()
    lowest: datetime | None = None
    for mark in marks:
        if mark is None:
            return None
        lowest = mark if lowest is None else min(lowest, mark)
    return lowest


def is_covered(completed: Sequence[Window], window: Window) -> bool:
    """True when the completed windows (merged) contain all of `window`."""
    return _Coverage(completed).covers(window)


def pending_chunks(
    chunks: Sequence[Chunk], progress: Progress, *, always: Window | None = None
) -> list[Chunk]:
    """Chunks, in plan order, that some member still lacks; chunks overlapping `always`
    (the look-back span, re-read for late data) are kept even when complete."""
    coverages = _Coverages()

    def covered(member: str, window: Window) -> bool:
        return coverages.of(progress, member).covers(window)

    def wanted(chunk: Chunk) -> bool:
        if always is not None and chunk.window.overlaps(always):
            return True
        return not all(covered(member, chunk.window) for member in chunk.members)

    return [chunk for chunk in chunks if wanted(chunk)]


def lacking_members(
    chunks: Sequence[Chunk], progresses: Sequence[Progress]
) -> dict[str, tuple[str, ...]]:
    """Per chunk id, the chunk's members (in its order) that some sink has not completed
    over the chunk's window."""
    coverages = _Coverages()

    def covered(index: int, member: str, window: Window) -> bool:
        return coverages.of(progresses[index], member).covers(window)

    return {
        chunk.chunk_id: tuple(
            member
            for member in chunk.members
            if not all(covered(i, member, chunk.window) for i in range(len(progresses)))
        )
        for chunk in chunks
    }


def settled_until(now: datetime, node_now: datetime | None, settle: timedelta) -> datetime:
    """Where a run may mark windows complete: `settle` before the earlier of our clock and
    the node's (`sys.ts`). The node stamps its samples with its own clock, so a node behind
    ours holds nothing past its own now yet; a node ahead of ours is not trusted past our
    now (its freshest samples wait for the next run: late, never lost). Without the
    node's time, our clock alone."""
    latest = now if node_now is None else min(now, node_now)
    return latest - settle


def settled_by_clocks(
    now: datetime, settle: timedelta, clock: NodeClock | None, began: float
) -> tuple[datetime, timedelta | None]:
    """`settled_until` with the node's clock as read during a run that started at `now`
    (`began`: `time.monotonic()` then), and the node's clock minus ours (None: unknown)."""
    if clock is None:
        return now - settle, None
    ours_then = now + timedelta(seconds=clock.read_monotonic - began)
    return settled_until(now, clock.node_time, settle), clock.node_time - ours_then


def incremental_span(
    *,
    history_start: datetime,
    watermark: datetime | None,
    now: datetime,
    lookback: timedelta,
    settle: timedelta,
) -> Window | None:
    """What an incremental run reads: [watermark - lookback (never before history_start),
    or history_start without a watermark, up to now - settle); None when that is empty.

    `lookback` re-reads late data (store-and-forward, links); `settle` leaves the newest
    minutes, which may still be filling, for the next run.
    """
    if lookback < timedelta(0) or settle < timedelta(0):
        raise ValueError("lookback and settle must not be negative")
    start = history_start if watermark is None else max(history_start, watermark - lookback)
    end = now - settle
    if end <= start:
        return None
    return Window(start, end)


def missing_member(tag: str) -> str:
    """The progress member that records windows the node left `tag` out of."""
    return MISSING_PREFIX + tag


def held_members(progress: Progress, tag: str) -> list[str]:
    """The members recording windows held for `tag` (behind any link)."""
    return [
        member
        for member in progress.completed
        if (held := held_of(member)) is not None and held[1] == tag
    ]


def tag_members(progress: Progress) -> list[str]:
    """The members of a flow's progress that are tags or alarm selections (not records of
    missing or held windows, or of the node they came from), sorted."""
    return sorted(m for m in progress.completed if not m.startswith(RECORD_PREFIXES))


def stored_watermark(progress: Progress, origin: datetime) -> datetime | None:
    """How far a sink's progress is complete over every member it records (what `historian
    state` shows as complete up to); None with no member or one not complete at `origin`."""
    members = tag_members(progress)
    return flow_watermark(progress, members, origin) if members else None


def held_windows(progress: Progress) -> dict[str, tuple[str, list[Window]]]:
    """Per tag, its link and the windows held for it that are neither complete since nor
    recorded missing (a hold past `hold_max`)."""
    held: dict[str, tuple[str, list[Window]]] = {}
    for member, windows in progress.completed.items():
        if (held_by := held_of(member)) is None:
            continue
        link, tag = held_by
        done = merge_windows([*progress.windows_of(tag), *progress.windows_of(missing_member(tag))])
        own = _Coverage(done)
        left = [window for window in merge_windows(list(windows)) if not own.covers(window)]
        if left:
            before = held.get(tag, ("", []))[1]
            held[tag] = (link, merge_windows([*before, *left]))
    return held


def identity_member(key: str) -> str:
    """The progress member recording the windows extracted from the node of `key`."""
    return IDENTITY_PREFIX + key


def recorded_identity(progress: Progress) -> str | None:
    """The identity key of the node the latest completed window was extracted from; None
    for progress that records none (written before identities were recorded, or empty)."""
    latest: tuple[datetime, str] | None = None
    for member, windows in progress.completed.items():
        if member.startswith(IDENTITY_PREFIX) and windows:
            found = (windows[-1].end, member[len(IDENTITY_PREFIX) :])
            latest = found if latest is None else max(latest, found)
    return latest[1] if latest is not None else None


def check_same_node(
    progresses: Sequence[Progress], current: NodeIdentity, node: str, reset: str
) -> None:
    """Refuse (NodeMoved, one line) a unit whose progress was last extracted from another
    node than `current`: its windows are complete for that node, not this one. Progress
    recording no node (written before identities were) is taken as this node's: its next
    write records it. `node` is its config name; `reset`, the command forgetting progress."""
    for progress in progresses:
        key = recorded_identity(progress)
        if key is None:
            continue
        recorded = NodeIdentity.from_key(key)
        if not recorded.same_node(current):
            raise NodeMoved(
                "node identity",
                f"progress was extracted from node {recorded}, and node {node} answers as "
                f"{current}; nothing fetched. To extract it from this node, forget that "
                f"progress with `{reset}` (rows already written stay)",
            )


def missing_windows(progress: Progress) -> dict[str, list[Window]]:
    """Per tag, the windows the node left it out of that it has not completed since."""
    missing: dict[str, list[Window]] = {}
    for member, windows in progress.completed.items():
        if not member.startswith(MISSING_PREFIX):
            continue
        tag = member[len(MISSING_PREFIX) :]
        own = _Coverage(progress.windows_of(tag))
        left = [window for window in merge_windows(list(windows)) if not own.covers(window)]
        if left:
            missing[tag] = left
    return missing


def poisoned_chunks(records: Iterable[ChunkRecord], settle: timedelta) -> list[ChunkRecord]:
    """Chunks recorded complete past what could be settled when they were written: their
    window ends after `committed_at - settle` (an end in the future, before explicit ends
    were cut at `now - settle`). Their progress claims data the node did not have yet."""
    return [r for r in records if r.window.end > r.committed_at - settle]


def repair_from(records: Iterable[ChunkRecord], settle: timedelta) -> datetime | None:
    """Where to forget progress from to undo poisoned chunks: the earliest moment any of
    them claimed beyond what was settled (never before its own window); None when no
    chunk is poisoned."""
    moments = [
        max(record.window.start, record.committed_at - settle)
        for record in poisoned_chunks(records, settle)
    ]
    return min(moments) if moments else None


def complete_past(progress: Progress, limit: datetime) -> datetime | None:
    """The latest end of any completed window after `limit` (progress that runs into the
    unsettled present or the future), or None."""
    ends = [windows[-1].end for windows in progress.completed.values() if windows]
    latest = max(ends, default=None)
    return latest if latest is not None and latest > limit else None


def common_progress(flow: str, progresses: Sequence[Progress]) -> Progress:
    """What every one of `progresses` holds: per member present in all of them, the
    windows all of them completed (a fleet flow's coverage: extracted on every node)."""
    if len(progresses) == 1:
        return progresses[0]
    if not progresses:
        return Progress(flow)
    members = set(progresses[0].completed)
    for progress in progresses[1:]:
        members &= set(progress.completed)
    common: dict[str, list[Window]] = {}
    for member in sorted(members):
        windows = merge_windows(list(progresses[0].windows_of(member)))
        for progress in progresses[1:]:
            windows = _intersection(windows, merge_windows(list(progress.windows_of(member))))
        if windows:
            common[member] = windows
    return Progress(flow, common)


def _intersection(a: Sequence[Window], b: Sequence[Window]) -> list[Window]:
    """The overlap of two sorted lists of disjoint windows."""
    found: list[Window] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i].start, b[j].start), min(a[i].end, b[j].end)
        if start < end:
            found.append(Window(start, end))
        if a[i].end < b[j].end:
            i += 1
        else:
            j += 1
    return found
