"""The lake's write journal: stage, record the intent, apply it; roll back or recover.

Every change of the lake's data files (a chunk's write, a compaction's merge, the tag
dimension) is a `Plan`: files staged under `_historian/<dataset>/tmp/` (outside the
dataset, so no reader ever globs a partial file), then operations in the order readers
need (`place` a staged file over a path, `empty` a file), the updates of other chunks'
markers and the chunk's own marker. `commit` records the plan as an intent
(`_historian/<dataset>/pending/<id>.json`), applies it, writes the markers and removes
the intent. A write killed half-way leaves, until recovery, every earlier row there and
possibly some of the scope's twice.

Recovery (`recover`, on `open()` and before the next write of the dataset) rolls a
leftover intent forward; if a staged file has vanished it rolls it back instead: the
files it already replaced are removed or emptied and the markers of every chunk whose
files it touched are forgotten, so the pipeline fetches them again. After recovery each
row is there once.

Against a power cut (local disk), a chunk waits for the disk twice: for its staged files,
then for the directories they were renamed into, before its marker is written. Markers
and the intents of plans that only place new files are written without waiting: a power
cut may lose them or leave them torn, which reads as missing, and the chunk is written
again. Intents that rewrite or empty earlier files are synced before their first change.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from connectors import schema as tables
from sinks.base import SinkError
from sinks.lake.dataset import DatasetFacts
from sinks.lake.files import RETIRED_KEY, FileFormat, LakeFiles
from sinks.lake.state import LakeState
from sinks.store.layout import LOCKS_DIR, STATE_DIR, Owner, check_dataset, ledger_file
from sinks.store.objects import Entry, LakeStore, token

Op = dict[str, Any]


@dataclass
class Plan:
    """A write or a merge, staged and ready to be recorded as an intent and applied."""

    ident: str
    dataset: str
    rows: int = 0
    ops: list[Op] = field(default_factory=list)
    staged: list[str] = field(default_factory=list)
    updates: dict[Owner, tuple[set[str], dict[str, int]]] = field(default_factory=dict)
    marker: dict[str, Any] | None = None

    def update(
        self, owner: Owner, *, remove: Sequence[str] = (), add: Mapping[str, int] = {}
    ) -> None:
        """Another chunk's marker loses the files `remove` and gains `add` (path -> rows)."""
        removed, added = self.updates.setdefault(owner, (set(), {}))
        removed.update(remove)
        added.update(add)


def place_op(temp: str, dest: str, owners: Sequence[Owner], there: Entry | None) -> Op:
    """An intent operation moving a staged file to `dest`; `was` is the version of the
    file it replaces, so recovery can tell a rename that happened from one that did not."""
    return {
        "op": "place",
        "tmp": temp,
        "dest": dest,
        "owners": [list(o) for o in owners],
        "new": there is None,
        "was": there.version if there is not None else None,
    }


def empty_op(dest: str, owners: Sequence[Owner]) -> Op:
    """An intent operation emptying `dest` (0 rows; readers that listed it still open it)."""
    return {"op": "empty", "dest": dest, "owners": [list(o) for o in owners]}


def intent_of(plan: Plan) -> dict[str, Any]:
    """The JSON intent recording `plan`."""
    return {
        "id": plan.ident,
        "dataset": plan.dataset,
        "created_ns": time.time_ns(),
        "ops": plan.ops,
        "marker_updates": [
            {
                "flow": flow,
                "chunk": chunk,
                "remove": sorted(removed),
                "add": [{"path": p, "rows": r} for p, r in sorted(added.items())],
            }
            for (flow, chunk), (removed, added) in sorted(plan.updates.items())
        ],
        "marker": plan.marker,
    }


def needs_sync(intent: Mapping[str, Any]) -> bool:
    """Must the intent reach the disk before its first change? Only when it rewrites or
    drops earlier files or repoints other chunks' markers: a power cut must not keep such
    a change and lose the intent that finishes it. A plan that only places new files (a
    chunk into empty partitions, the usual case), lost or torn, is as if the write never
    began - no marker, so the chunk is written again over whatever of its files landed."""
    return bool(intent["marker_updates"]) or any(
        op["op"] != "place" or not op.get("new") for op in intent["ops"]
    )


class Journal:
    """Stages, commits, applies and recovers plans for the lake's datasets."""

    def __init__(
        self,
        store: LakeStore,
        state: LakeState,
        files: LakeFiles,
        datasets: DatasetFacts,
        file_format: FileFormat,
    ) -> None:
        self.store = store
        self.state = state
        self.files = files
        self.datasets = datasets
        self.format = file_format

    def _state_dir(self, dataset: str, *parts: str) -> str:
        return self.store.path(STATE_DIR, dataset, *parts)

    # -- staging --------------------------------------------------------------------------

    def _temp(self, plan: Plan, dest: str) -> str:
        name = dest.rsplit("/", 1)[-1]
        temp = self._state_dir(plan.dataset, "tmp", f"{token()}-{name}.tmp")
        plan.staged.append(temp)
        return temp

    def stage(self, plan: Plan, table: pa.Table, dest: str, metadata: dict[bytes, bytes]) -> str:
        """Write `table` to a temp file of the dataset's state directory; returns its
        lake-relative path (what intents name)."""
        temp = self._temp(plan, dest)
        self.store.write_parquet(
            table.replace_schema_metadata(metadata),
            temp,
            row_group_size=self.format.group_rows,
            **self.format.options(table.schema),
        )
        return self.store.relative(temp)

    def stage_parts(
        self,
        plan: Plan,
        schema: pa.Schema,
        parts: Iterator[pa.Table],
        dest: str,
        metadata: dict[bytes, bytes],
    ) -> str:
        """`stage` of a table made a row group at a time (each part one row group)."""
        temp = self._temp(plan, dest)
        self.store.write_parquet_parts(
            schema.with_metadata(metadata),
            parts,
            temp,
            row_group_size=self.format.group_rows,
            **self.format.options(schema),
        )
        return self.store.relative(temp)

    def discard(self, plan: Plan) -> None:
        """Remove a plan's staged files (it failed before its intent was recorded)."""
        for temp in plan.staged:
            with contextlib.suppress(Exception):
                self.store.remove(temp)

    # -- commit and apply -----------------------------------------------------------------

    def commit(self, plan: Plan) -> None:
        """Record the intent, then apply it; a crash anywhere is finished by recovery."""
        if plan.marker is not None:  # its member list in a file of its own, not the intent
            plan.marker = self.state.shared_members(plan.marker)
        intent = intent_of(plan)
        path = self._state_dir(plan.dataset, "pending", f"{plan.ident}.json")
        try:
            self.store.makedirs(self._state_dir(plan.dataset, "pending"))
            self.store.write_json(path, intent, durable=needs_sync(intent))
        except BaseException:
            self.discard(plan)
            raise
        self.apply(intent, path, fresh=True)

    def apply(self, intent: dict[str, Any], path: str, *, fresh: bool = False) -> None:
        """Roll an intent forward (idempotent); roll it back when a staged file is lost.

        `fresh`: just recorded by this process, so every staged file is there."""
        done: set[str] = set()
        if not fresh:
            for op in intent["ops"]:
                if op["op"] == "place" and not self.store.exists(self.store.path(op["tmp"])):
                    if not self.placed(op):
                        self.roll_back(intent, path)
                        return
                    done.add(op["dest"])
        directories = self._apply_ops(intent, done)
        # The files' new names reach the disk before any marker can claim them (markers
        # are written without waiting for the disk): one sync per directory touched.
        for directory in sorted(directories):
            self.store.sync_dir(directory)
        for update in intent["marker_updates"]:
            self.state.update_marker_files(
                update["flow"], update["chunk"], update["remove"], update["add"]
            )
        if intent.get("marker"):
            self.state.write_marker(intent["marker"])
        self.store.remove(path)

    def _apply_ops(self, intent: Mapping[str, Any], done: set[str]) -> set[str]:
        """The intent's file operations not `done` yet, in order; the directories touched."""
        store = self.store
        ops: list[Op] = intent["ops"]
        template = None
        if any(op["op"] == "empty" for op in ops):
            template = self.empty_template(str(intent["dataset"]))
        directories: set[str] = set()
        placed: list[str] = []
        for op in ops:
            if op["dest"] in done:
                continue
            dest = store.path(op["dest"])
            if op["op"] == "place":
                store.replace(store.path(op["tmp"]), dest)
                placed.append(dest)
            elif op["op"] == "empty":
                assert template is not None
                store.copy_over(template, dest)
                self.files.forget(dest)
            else:  # "drop": intents written before files were emptied instead
                store.remove(dest)
                self.files.forget(dest)
            directories.add(dest.rsplit("/", 1)[0])
        self.files.placed(placed)
        return directories

    def placed(self, op: Mapping[str, Any]) -> bool:
        """Did a place operation whose staged file is gone happen? Its destination exists
        and is no longer the file it replaced (`was`, recorded when it was planned)."""
        version = self.store.version(self.store.path(op["dest"]))
        return version is not None and version != op.get("was")

    def empty_template(self, dataset: str) -> str:
        """`_historian/<dataset>/empty.parquet`: the dataset's schema and no rows, which
        emptied data files become (a reader that listed them still opens them)."""
        path = self._state_dir(dataset, "empty.parquet")
        if self.store.exists(path):
            return path
        temp = self._write_empty(dataset, {})
        self.store.replace(temp, path)
        return path

    def _write_empty(self, dataset: str, extra: dict[bytes, bytes]) -> str:
        """A 0-row file of the dataset's schema in its temp directory, `extra` in its
        metadata; returns its path."""
        facts = self.datasets.get(dataset) or {}
        kind = str(facts.get("kind", tables.KIND_TAG_HISTORY))
        empty = tables.SCHEMAS[kind].empty_table()
        metadata = {**self.datasets.file_metadata(dataset, kind, []), **extra}
        temp = self._state_dir(dataset, "tmp", f"{token()}-empty.parquet.tmp")
        self.store.write_parquet(
            empty.replace_schema_metadata(metadata), temp, **self.format.options(empty.schema)
        )
        return temp

    def retire(self, dataset: str, paths: Sequence[str]) -> None:
        """Retire 0-row data files of `dataset` now: each becomes a 0-row file stamped
        with this moment (`RETIRED_KEY`), atomically, so a reader that listed it still
        opens it; `LakeFiles.swept` removes it once the grace has passed since. Called
        under the dataset's write lock; a crash half-way leaves some files retired and
        the others as they were (retired by the next write)."""
        stamp = str(time.time_ns()).encode()
        template = self._write_empty(dataset, {RETIRED_KEY: stamp})
        try:
            for path in paths:
                self.store.copy_over(template, path)
                self.files.forget(path)
        finally:
            self.store.remove(template)

    # -- roll back and recover ------------------------------------------------------------

    def roll_back(self, intent: dict[str, Any], path: str) -> None:
        """Undo what cannot be finished: every touched chunk is forgotten (the pipeline
        fetches it again), and files the intent already replaced are removed or emptied,
        so that no row is left visible twice meanwhile."""
        forget: set[Owner] = set()
        for op in intent["ops"]:
            forget.update(tuple(owner) for owner in op.get("owners", []))  # type: ignore[misc]
            if op["op"] == "place":
                dest = self.store.path(op["dest"])
                if not self.store.remove(self.store.path(op["tmp"])):  # moved, or lost
                    # A chunk's ledger file goes with its forgotten marker.
                    if op.get("new") or op.get("ledger"):
                        self.store.remove(dest)
                    elif "was" in op and self.placed(op):
                        self.store.copy_over(self.empty_template(str(intent["dataset"])), dest)
                self.files.forget(dest)
        marker = intent.get("marker")
        if marker:
            forget.add((str(marker["flow"]), str(marker["chunk_id"])))
        for flow, chunk in sorted(forget):
            self.state.remove_marker(flow, chunk)
            # Its ledger rows go with it (`sinks.lake.ledger`): they described rows that
            # this roll back may have emptied.
            self.store.remove(self.store.path(ledger_file(str(intent["dataset"]), flow, chunk)))
        self.store.remove(path)

    def recover(self, dataset: str, *, min_age_s: float = 0.0) -> None:
        """Finish interrupted writes of a dataset, then drop orphaned staged files; called
        under the dataset's write lock, so no other writer is staging or committing.

        `min_age_s` > 0: only intents older than that are taken over, and nothing else is
        removed."""
        intents = []
        for entry in self.store.listdir(self._state_dir(dataset, "pending")):
            if entry.is_dir or not entry.name.endswith(".json") or entry.name.startswith("."):
                continue
            # Torn by a power cut: an intent written without waiting for the disk, of new
            # files only; its chunk has no marker and is written again (`needs_sync`).
            intent = self.store.read_json(entry.path, torn_is_missing=True)
            if isinstance(intent, dict) and "ops" in intent:
                intents.append((int(intent.get("created_ns", 0)), entry.path, intent))
            elif min_age_s == 0.0:
                self.store.remove(entry.path)
        cutoff = time.time_ns() - int(min_age_s * 1e9)
        for created, path, intent in sorted(intents, key=lambda item: item[:2]):
            if created <= cutoff:
                self.apply(intent, path)
        if min_age_s == 0.0:
            for entry in self.store.listdir(self._state_dir(dataset, "tmp")):
                self.store.remove(entry.path)

    def recover_all(self, lock: Callable[[str], AbstractContextManager[None]]) -> None:
        """Recover every dataset with leftovers, under `lock(dataset)` (the dataset's write
        lock: another process may be writing it)."""
        store = self.store
        for entry in store.listdir(store.path(STATE_DIR)):
            if not entry.is_dir or entry.name.startswith("_") or entry.name == LOCKS_DIR:
                continue
            try:
                dataset = check_dataset(entry.name, metadata=True)
            except SinkError:
                continue
            if not store.listdir(self._state_dir(dataset, "pending")) and not store.listdir(
                self._state_dir(dataset, "tmp")
            ):
                continue
            with lock(dataset):
                self.recover(dataset)
