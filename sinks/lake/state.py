"""The lake's bookkeeping: chunk markers and a compacted progress snapshot per flow.

A marker (`_historian/_flows/<flow>/markers/<chunk_id>.json`) is the proof that a chunk is
committed: it lands only after the chunk's data files are in place. Progress is the union
of the markers' windows per member. Reading 10,000 markers at every `progress()` call
would be slow (and, on object storage, 10,000 GETs), so each flow keeps a snapshot
(`progress.json`) of the markers it has already folded, keyed by each marker's change
token; a call lists the markers (one listing), reads only markers that are new or changed
since the snapshot and saves the snapshot again. A marker that disappeared (a rolled-back
write) makes the snapshot be rebuilt from the markers, which are the truth.

Forgetting one member (`reset(flow, member)`) records the moment in `resets.json`: markers
committed before it no longer count for that member, without rewriting any marker.

A marker names its members by the digest of a file holding the list
(`_historian/_flows/<flow>/members/<digest>.json`, `sinks.store.member_lists`): an hourly
run of 10,000 tags commits the same list every hour, which inline made each marker (and
the write's intent) ~360 KB, ~3 GB a year. A marker whose list cannot be read counts as
missing, so its chunk is fetched again. Markers with the list inline (older lakes) are
read as they are.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from connectors.timewindow import Window, iso_utc
from sinks.base import ChunkRecord, Progress, SharedWindows
from sinks.store.layout import FLOWS_DIR, STATE_DIR, join, key_name, key_of_name
from sinks.store.member_lists import MemberLists
from sinks.store.objects import LakeStore

SNAPSHOT_VERSION = 1

# One snapshot entry per marker: [change token, start_ms, end_ms, members, fetched,
# committed, committed_ns, dataset].
Entry = list[Any]


def new_marker(
    *,
    flow: str,
    dataset: str,
    kind: str,
    chunk_id: str,
    window: Window,
    members: Sequence[str],
    files: list[dict[str, object]],
    rows_fetched: int,
    rows_committed: int,
) -> dict[str, Any]:
    """The JSON content of a chunk's marker."""
    now_ns = time.time_ns()
    committed_at = datetime.fromtimestamp(now_ns / 1e9, tz=UTC)
    return {
        "flow": flow,
        "dataset": dataset,
        "kind": kind,
        "chunk_id": chunk_id,
        "window": {
            "start": iso_utc(window.start),
            "end": iso_utc(window.end),
            "start_ms": window.start_ms,
            "end_ms": window.end_ms,
        },
        "members": list(members),
        "files": files,
        "rows_fetched": rows_fetched,
        "rows_committed": rows_committed,
        "committed_at": committed_at.isoformat().replace("+00:00", "Z"),
        "committed_ns": now_ns,
    }


def _entry(version: str, marker: Mapping[str, Any]) -> Entry:
    window = marker["window"]
    return [
        version,
        int(window["start_ms"]),
        int(window["end_ms"]),
        len(marker["members"]),
        int(marker["rows_fetched"]),
        int(marker["rows_committed"]),
        int(marker["committed_ns"]),
        str(marker["dataset"]),
    ]


def _empty_snapshot(flow: str, resets: Mapping[str, int]) -> dict[str, Any]:
    return {
        "version": SNAPSHOT_VERSION,
        "flow": flow,
        "resets": dict(resets),
        "markers": {},
        "completed": {},
    }


class LakeState:
    """Markers, snapshots and resets of every flow in one lake."""

    def __init__(self, store: LakeStore) -> None:
        self.store = store
        # Markers this process wrote, by (flow, chunk): (change token, marker). Lets
        # `progress()` fold a run's own markers without reading them back.
        self._known: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        # The last snapshot this process read or saved, by flow: (its file's change
        # token, snapshot). A run reads progress when it plans and when it ends; the
        # second read then folds the run's own markers into it without reading it back.
        self._snapshots: dict[str, tuple[str, dict[str, Any]]] = {}
        # Without waiting for the disk, like the markers that name them: a list a power
        # cut left torn makes its markers read as missing (their chunks are written again).
        self._member_lists = MemberLists(store, durable=False)

    # -- paths ----------------------------------------------------------------------------

    def flows_dir(self) -> str:
        return self.store.path(STATE_DIR, FLOWS_DIR)

    def flow_dir(self, flow: str) -> str:
        """A progress key's directory (`flow`, `flow@node`: encoded, `key_name`)."""
        return join(self.flows_dir(), key_name(flow))

    def markers_dir(self, flow: str) -> str:
        return join(self.flow_dir(flow), "markers")

    def marker_path(self, flow: str, chunk_id: str) -> str:
        return join(self.markers_dir(flow), f"{chunk_id}.json")

    def members_dir(self, flow: str) -> str:
        return join(self.flow_dir(flow), "members")

    # -- member lists ---------------------------------------------------------------------

    def shared_members(self, marker: dict[str, Any]) -> dict[str, Any]:
        """The marker naming its members by digest, their list saved in the flow's
        `members/` (module docstring); one that names them so already, as it is."""
        members = marker["members"]
        if isinstance(members, str):
            return marker
        digest = self._member_lists.save(self.members_dir(str(marker["flow"])), members)
        return {**marker, "members": digest}

    def _with_members(self, marker: dict[str, Any]) -> dict[str, Any] | None:
        """The marker with its member list in place; None when the list cannot be read."""
        members = marker.get("members")
        if not isinstance(members, str):
            return marker if isinstance(members, list) else None
        listed = self._member_lists.load(self.members_dir(str(marker.get("flow"))), members)
        return None if listed is None else {**marker, "members": listed}

    # -- markers --------------------------------------------------------------------------

    def read_marker(self, flow: str, chunk_id: str) -> dict[str, Any] | None:
        """The marker; None when it is missing or torn (not a committed chunk)."""
        value = self.store.read_json(self.marker_path(flow, chunk_id), torn_is_missing=True)
        if not isinstance(value, dict) or "window" not in value:
            return None
        return self._with_members(value)

    def write_marker(self, marker: dict[str, Any]) -> None:
        """Write a marker atomically but without waiting for the disk.

        The chunk's data files are durable before (the writer syncs their directories
        first), so a power cut can only lose the marker or leave it torn, which reads as
        missing: the chunk is fetched and written again, replacing its own rows. Waiting
        for the disk here would cost a sync per chunk and buy nothing for exactly-once.
        """
        flow, chunk_id = str(marker["flow"]), str(marker["chunk_id"])
        path = self.marker_path(flow, chunk_id)
        self.store.makedirs(self.markers_dir(flow))
        self.store.write_json(path, self.shared_members(marker), durable=False)
        version = self.store.version(path)
        resolved = self._with_members(marker)
        if version is not None and resolved is not None:
            self._known[(flow, chunk_id)] = (version, resolved)

    def remove_marker(self, flow: str, chunk_id: str) -> bool:
        self._known.pop((flow, chunk_id), None)
        return self.store.remove(self.marker_path(flow, chunk_id))

    def update_marker_files(
        self, flow: str, chunk_id: str, remove: Sequence[str], add: Sequence[Mapping[str, object]]
    ) -> None:
        """Point a marker's file list at the files that now hold its rows (idempotent)."""
        known = self._known.get((flow, chunk_id))
        if known is not None and self.store.version(self.marker_path(flow, chunk_id)) == known[0]:
            marker: dict[str, Any] | None = dict(known[1])  # as this process wrote it
        else:
            marker = self.read_marker(flow, chunk_id)
        if marker is None:
            return
        added = {str(item["path"]) for item in add}
        gone = set(remove) | added
        files = [f for f in marker.get("files", []) if str(f.get("path")) not in gone]
        files.extend(dict(item) for item in add)
        files.sort(key=lambda item: str(item["path"]))
        if files != marker.get("files"):
            marker["files"] = files
            self.write_marker(marker)

    # -- progress -------------------------------------------------------------------------

    def _resets(self, flow: str) -> dict[str, int]:
        value = self.store.read_json(join(self.flow_dir(flow), "resets.json"))
        return {str(k): int(v) for k, v in value.items()} if isinstance(value, dict) else {}

    def _snapshot(self, flow: str) -> dict[str, Any] | None:
        path = join(self.flow_dir(flow), "progress.json")
        held = self._snapshots.get(flow)
        version = self.store.version(path)
        if held is not None and version is not None and held[0] == version:
            return held[1]
        value = self.store.read_json(path, torn_is_missing=True)
        if not isinstance(value, dict) or value.get("version") != SNAPSHOT_VERSION:
            return None
        if version is not None:
            self._snapshots[flow] = (version, value)
        return value

    def _save_snapshot(self, flow: str, snapshot: dict[str, Any]) -> None:
        # A cache: a read-only lake still answers progress, just without saving it.
        with contextlib.suppress(OSError):
            self.store.makedirs(self.flow_dir(flow))
            path = join(self.flow_dir(flow), "progress.json")
            self.store.write_json(path, snapshot, durable=False)
            version = self.store.version(path)
            if version is not None:
                self._snapshots[flow] = (version, snapshot)

    def snapshot(self, flow: str) -> dict[str, Any]:
        """The flow's snapshot brought up to date with its markers (saved when it changed)."""
        listing = {
            name[: -len(".json")]: entry.version
            for entry in self.store.listdir(self.markers_dir(flow))
            if not entry.is_dir
            and (name := entry.name).endswith(".json")
            and not name.startswith(".")
        }
        resets = self._resets(flow)
        snapshot = self._snapshot(flow)
        if (
            snapshot is None
            or snapshot.get("resets") != resets
            or any(chunk not in listing for chunk in snapshot["markers"])
        ):
            snapshot = _empty_snapshot(flow, resets)
        changed = self._fold(flow, snapshot, listing, resets)
        if changed is None:  # a folded marker is torn now: its windows must go
            snapshot = _empty_snapshot(flow, resets)
            changed = self._fold(flow, snapshot, listing, resets)
        if changed:
            self._save_snapshot(flow, snapshot)
        return snapshot

    def _fold(
        self,
        flow: str,
        snapshot: dict[str, Any],
        listing: Mapping[str, str],
        resets: Mapping[str, int],
    ) -> bool | None:
        """Fold new and changed markers into `snapshot`: whether it changed, None when a
        marker it holds can no longer be read (the snapshot must be rebuilt)."""
        entries: dict[str, Entry] = snapshot["markers"]
        # Members' window lists may be shared (`SharedWindows`): replaced, never appended to.
        completed: dict[str, list[list[int]]] = snapshot["completed"]
        touched: set[str] = set()
        changed = False
        for chunk_id, version in listing.items():
            held = entries.get(chunk_id)
            if held is not None and held[0] == version:
                continue
            known = self._known.get((flow, chunk_id))
            marker = known[1] if known and known[0] == version else self.read_marker(flow, chunk_id)
            if marker is None:
                if held is not None:
                    return None
                continue
            entries[chunk_id] = _entry(version, marker)
            changed = True
            window = [int(marker["window"]["start_ms"]), int(marker["window"]["end_ms"])]
            committed_ns = int(marker["committed_ns"])
            counted = [
                member
                for member in marker["members"]
                if not resets or committed_ns > resets.get(member, -1)
            ]
            for member in counted:
                completed[member] = [*completed.get(member, ()), window]
            touched.update(counted)
        shared = SharedWindows()
        for member in touched:
            completed[member] = shared.merged_ms(completed[member])
        return changed

    def progress(self, flow: str) -> Progress:
        snapshot = self.snapshot(flow)
        # Members of a flow share their windows (every batch covers the same span): one
        # list per distinct set of windows, not one per member.
        shared = SharedWindows()
        completed = {
            member: shared.from_ms(windows)
            for member, windows in snapshot["completed"].items()
            if windows
        }
        return Progress(flow=flow, completed=completed)

    def chunk_log(self, flow: str, limit: int) -> list[ChunkRecord]:
        entries = self.snapshot(flow)["markers"]
        newest = sorted(entries.items(), key=lambda item: (item[1][6], item[0]), reverse=True)
        return [
            ChunkRecord(
                flow=flow,
                chunk_id=chunk_id,
                window=Window.from_ms(entry[1], entry[2]),
                members=entry[3],
                rows_fetched=entry[4],
                rows_committed=entry[5],
                committed_at=datetime.fromtimestamp(entry[6] / 1e9, tz=UTC),
            )
            for chunk_id, entry in newest[: max(0, limit)]
        ]

    def flows(self) -> list[str]:
        """The progress keys with at least one marker (a shortened directory name is
        read back from one of its markers)."""
        names = []
        for entry in self.store.listdir(self.flows_dir()):
            if not entry.is_dir:
                continue
            markers = join(self.flows_dir(), entry.name, "markers")
            first = next(iter(self.store.iter_names(markers, ".json")), None)
            if first is None:
                continue
            key = key_of_name(entry.name)
            if key is None:
                marker = self.store.read_json(join(markers, first), torn_is_missing=True)
                key = str(marker["flow"]) if isinstance(marker, dict) else None
            if key is not None:
                names.append(key)
        return sorted(names)

    def forget_after(self, flow: str, moment_ms: int) -> int:
        """Forget every chunk whose window ends after `moment_ms` (its marker goes; the
        snapshot is rebuilt from the markers left); returns the chunks forgotten. Rows stay,
        and the next run fetches those windows again, replacing them."""
        entries = self.snapshot(flow)["markers"]
        forgotten = [chunk for chunk, entry in entries.items() if int(entry[2]) > moment_ms]
        for chunk_id in forgotten:
            self.remove_marker(flow, chunk_id)
        return len(forgotten)

    def reset(self, flow: str, member: str | None) -> int:
        """Forget a flow's progress (or one member's); returns markers or windows removed."""
        if member is None:
            removed = sum(1 for _ in self.store.iter_names(self.markers_dir(flow), ".json"))
            self._known = {key: value for key, value in self._known.items() if key[0] != flow}
            self._snapshots.pop(flow, None)
            self.store.rmtree(self.flow_dir(flow))
            return removed
        snapshot = self.snapshot(flow)
        removed = len(snapshot["completed"].get(member, []))
        resets = self._resets(flow)
        resets[member] = time.time_ns()
        self.store.makedirs(self.flow_dir(flow))
        self.store.write_json(join(self.flow_dir(flow), "resets.json"), resets)
        snapshot["completed"].pop(member, None)
        snapshot["resets"] = resets
        self._save_snapshot(flow, snapshot)
        return removed
