"""The overlap planner: which earlier files a chunk's scope touches, and how they change.

A write replaces its scope's rows partition by partition - in a dataset with a node level
(`sinks.lake.dataset`), the partitions under its node's directory only. The earlier files
holding rows of the scope are found by their footers (ts and tag ranges, owner chunks); a file only
this chunk owns is all in the scope, any other is read (and kept decoded while unchanged,
so the chunks of a re-extraction read a compacted file once). When those files already
hold exactly the new rows, written by this chunk, nothing is written but the marker: a
re-extraction of unchanged data over a compacted partition moves no file. Otherwise the
new rows join the last of those files (by name): one file, the earlier rows outside the
scope and the new ones, renamed over it - a chunk's own file is swapped, a compacted file
is rewritten once per changed chunk. Where there is no such file, or the result outgrows
`target_file_rows`, the new rows go to new files named after the chunk. The other earlier
files then lose the scope's rows: rewritten without them, or emptied.

The operations are ordered for readers of the plain folder: files of new rows first,
then the file the new rows join, then the other earlier files. No instant lacks a row
that was complete before the write began, and a read in name order that starts before
and ends after never misses one (the new rows go into the last of the files; see
`sinks.lake.sink` for the exceptions).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from connectors import schema as tables
from connectors.timewindow import Window
from sinks.base import ChunkScope, SinkError
from sinks.lake.dataset import DatasetFacts
from sinks.lake.files import FileInfo, LakeFiles
from sinks.lake.journal import Journal, Op, Plan, empty_op, place_op
from sinks.lake.rows import plain, scope_mask, sorted_rows
from sinks.lake.state import new_marker
from sinks.store.layout import (
    Owner,
    in_dataset,
    join,
    part_name,
    partition_of_rows,
    partitions_of_window,
)
from sinks.store.objects import Entry, token


@dataclass
class Hit:
    """An earlier file of a partition that holds rows of a write's scope."""

    entry: Entry
    info: FileInfo
    table: pa.Table | None = None  # its rows; None: a file of this chunk alone, not read
    mask: pa.Array | None = None  # which of them are in the scope

    @property
    def rows(self) -> int:
        return self.info.rows

    def in_scope(self) -> pa.Table:
        assert self.table is not None
        assert self.mask is not None
        return self.table.filter(self.mask)

    def kept(self) -> pa.Table:
        assert self.table is not None
        assert self.mask is not None
        return self.table.filter(pc.invert(self.mask))


@dataclass
class Ops:
    """A write's file operations, grouped so that readers never miss a row: new files
    first, then the file the new rows join, then earlier files losing the scope's rows."""

    new: list[Op] = field(default_factory=list)
    join: list[Op] = field(default_factory=list)
    trim: list[Op] = field(default_factory=list)

    def ordered(self) -> list[Op]:
        return self.new + self.join + self.trim


def may_overlap(info: FileInfo, kind: str, window: Window, members: Sequence[str]) -> bool:
    """False only when the footer proves no row of the file is in the scope
    (`members` sorted: one bisection, not a pass over them per file)."""
    if info.rows == 0:
        return False
    if (
        info.ts_min is not None
        and info.ts_max is not None
        and (info.ts_max < window.start_ms or info.ts_min >= window.end_ms)
    ):
        return False
    if kind == tables.KIND_TAG_HISTORY and info.key_min is not None and info.key_max is not None:
        at = bisect.bisect_left(members, info.key_min)
        return at < len(members) and members[at] <= info.key_max
    return True


def unchanged(hits: list[Hit], new: pa.Table, owner: Owner, kind: str) -> bool:
    """Do the files already hold exactly `new` as the scope's rows, written by this chunk
    (a re-extraction of unchanged data, typically over a compacted partition)?"""
    if not hits or any(h.table is None or owner not in h.info.owners for h in hits):
        return False
    old = pa.concat_tables([plain(h.in_scope(), kind) for h in hits])
    if old.num_rows != new.num_rows:
        return False
    if len(hits) > 1:
        old = sorted_rows(old, tables.KEYS[kind])
    return bool(old.equals(plain(new, kind)))


class WritePlanner:
    """Plans a chunk's write: stages its files through the journal, orders the operations."""

    def __init__(
        self,
        files: LakeFiles,
        journal: Journal,
        datasets: DatasetFacts,
        *,
        target_file_rows: int,
        lake: str,
    ) -> None:
        self.files = files
        self.journal = journal
        self.datasets = datasets
        self.store = journal.store
        self.target_file_rows = target_file_rows
        self.lake = lake

    def plan(self, plan: Plan, scope: ChunkScope, table: pa.Table) -> None:
        """Stage the chunk's rows (sorted), partition by partition, and what leaves earlier
        files; set the plan's operations, updates and the chunk's marker."""
        dataset, kind = scope.dataset, scope.kind
        owner: Owner = (scope.flow, scope.chunk_id)
        scheme = self.datasets.scheme(dataset)
        index, labels = partition_of_rows(table["ts"], scheme)
        rows_of: dict[str, pa.Table] = {}
        if table.num_rows:
            for position, label in enumerate(labels):
                rows_of[label] = (
                    table if len(labels) == 1 else table.filter(pa.array(index == position))
                )
        ops = Ops()
        files: list[dict[str, object]] = []
        members = sorted(scope.members)
        top = self.datasets.node_dir(dataset, scope.node)  # "" in datasets of one node
        for period in sorted(set(partitions_of_window(scope.window, scheme)) | set(rows_of)):
            new = rows_of.get(period, table.slice(0, 0))
            label = join(top, period)
            listing = self.files.listing(
                self.store.path(dataset, label),
                kind,
                lambda paths: self.journal.retire(dataset, paths),
            )
            hits = self.hits(scope, listing, members)
            if unchanged(hits, new, owner, kind):
                # The rows are already there, as this chunk wrote them: nothing to move.
                for hit in hits:
                    rel = in_dataset(self.store.relative(hit.entry.path))
                    files.append({"path": rel, "rows": hit.rows})
                plan.rows += new.num_rows
                continue
            self._partition(plan, scope, label, new, hits, listing, ops, files)
        plan.ops = ops.ordered()
        if plan.rows != table.num_rows:
            raise SinkError(f"lake '{self.lake}': staged {plan.rows} rows of {table.num_rows}")
        plan.updates.pop(owner, None)  # this chunk's marker is rewritten whole
        plan.marker = new_marker(
            flow=scope.flow,
            dataset=dataset,
            kind=kind,
            chunk_id=scope.chunk_id,
            window=scope.window,
            members=scope.completed_members,
            files=sorted(files, key=lambda f: str(f["path"])),
            rows_fetched=table.num_rows,
            rows_committed=plan.rows,
        )

    def hits(self, scope: ChunkScope, listing: list[Entry], members: Sequence[str]) -> list[Hit]:
        """Earlier files of a partition holding rows of the scope, sorted by name.

        A file that only this chunk owns is all in the scope and is not read; any other
        file that may overlap (by its footer) is read, once per version (`LakeFiles.decoded`).
        """
        kind, owner = scope.kind, (scope.flow, scope.chunk_id)
        hits = []
        for listed in sorted(listing, key=lambda e: e.name):
            if not may_overlap(self.files.info(listed, kind), kind, scope.window, members):
                continue
            entry = self.files.current(listed)
            info = self.files.info(entry, kind)
            if set(info.owners) == {owner}:
                hits.append(Hit(entry, info))
                continue
            old = self.files.decoded(entry, kind)
            mask = scope_mask(old, kind, scope.window, scope.members, scope.node)
            if pc.sum(mask).as_py():
                hits.append(Hit(entry, info, old, mask))
        return hits

    def _partition(
        self,
        plan: Plan,
        scope: ChunkScope,
        label: str,
        new: pa.Table,
        hits: list[Hit],
        listing: list[Entry],
        ops: Ops,
        files: list[dict[str, object]],
    ) -> None:
        """One partition's changes. The new rows join the last earlier file that holds rows
        of the scope, in one atomic rename (a re-written chunk's own file, a compacted
        file); when there is none, or the result outgrows target_file_rows, they go to new
        files. The other earlier files then lose the scope's rows."""
        dataset, kind = scope.dataset, scope.kind
        owner: Owner = (scope.flow, scope.chunk_id)
        joined = hits[-1] if hits else None
        carried: tuple[Owner, ...] = ()
        body = new
        if joined is not None and joined.table is not None:
            carried = joined.info.owners  # its rows outside the scope travel with the new
            body = sorted_rows(
                pa.concat_tables([plain(joined.kept(), kind), plain(new, kind)]),
                tables.KEYS[kind],
            )
        plan.rows += new.num_rows
        owners = sorted({owner, *carried})
        rest = hits
        if joined is not None and 0 < body.num_rows <= self.target_file_rows:
            rel = self.store.relative(joined.entry.path)
            metadata = self.datasets.file_metadata(dataset, kind, owners)
            temp = self.journal.stage(plan, body, rel, metadata)
            ops.join.append(place_op(temp, rel, owners, joined.entry))
            placed = [(rel, body.num_rows)]
            rest = hits[:-1]
        else:
            placed = self._new_files(plan, scope, label, body, owners, listing, ops)
        if new.num_rows:
            files.extend({"path": in_dataset(rel), "rows": rows} for rel, rows in placed)
        for item in carried:
            plan.update(item, add={in_dataset(rel): rows for rel, rows in placed})
        for hit in rest:
            self._trim(plan, hit, kind, ops, emptied=hit is joined)

    def _trim(self, plan: Plan, hit: Hit, kind: str, ops: Ops, *, emptied: bool) -> None:
        """An earlier file loses the scope's rows: rewritten without them, or emptied (all
        its rows were in the scope, or went into the chunk's new files)."""
        rel = self.store.relative(hit.entry.path)
        kept = None if hit.table is None or emptied else hit.kept()
        if kept is None or kept.num_rows == 0:
            ops.trim.append(empty_op(rel, hit.info.owners))
            for item in hit.info.owners:
                plan.update(item, remove=[in_dataset(rel)])
            return
        metadata = self.datasets.file_metadata(plan.dataset, kind, hit.info.owners)
        temp = self.journal.stage(plan, kept, rel, metadata)
        ops.trim.append(place_op(temp, rel, hit.info.owners, hit.entry))
        for item in hit.info.owners:
            plan.update(item, add={in_dataset(rel): kept.num_rows})

    def _new_files(
        self,
        plan: Plan,
        scope: ChunkScope,
        label: str,
        body: pa.Table,
        owners: Sequence[Owner],
        listing: list[Entry],
        ops: Ops,
    ) -> list[tuple[str, int]]:
        """Stage `body` as new files of a partition (pieces of at most target_file_rows),
        named after the chunk; a name another file holds rows under gets a suffix."""
        if body.num_rows == 0:
            return []
        dataset, kind, chunk = scope.dataset, scope.kind, scope.chunk_id
        metadata = self.datasets.file_metadata(dataset, kind, owners)
        taken = {e.name: e for e in listing}
        pieces = max(1, math.ceil(body.num_rows / self.target_file_rows))
        size = math.ceil(body.num_rows / pieces)
        placed = []
        for piece in range(pieces):
            part = body.slice(piece * size, size)
            name = part_name(chunk, piece + 1, pieces)
            there = taken.get(name)
            if there is not None and self.files.info(there, kind).rows:
                name = part_name(f"{chunk}-{token()}", piece + 1, pieces)
                there = None
            rel = join(dataset, label, name)
            temp = self.journal.stage(plan, part, rel, metadata)
            ops.new.append(place_op(temp, rel, owners, there))
            placed.append((rel, part.num_rows))
        return placed
