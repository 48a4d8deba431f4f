"""Progress of the table-format sinks (Delta Lake, Iceberg), read back from their commit logs.

A chunk's record (flow, chunk id, window, members, row counts, commit time) travels in
the very commit that replaces the chunk's rows: in Delta's commit info, in an Iceberg
snapshot's summary. The table's log is therefore the truth about what is complete, and
a killed run can never leave rows without a record or a record without rows.

Folding thousands of commits at every `progress()` would be slow (and, on object
storage, a GET per commit), so each dataset keeps a cache, `_historian/progress/
<dataset>.json`: the log version folded so far and, per flow, the merged windows per
member and a short entry per chunk. A call folds only the commits after that version.
The cache is only a cache: lost or torn, it is rebuilt from the log.

Forgetting is a rule, not a rewrite of history: `_historian/flows/<key>/rules.json` (the
progress key, `sinks.store.layout.key_name`)
holds the moment of a whole-flow reset, per-member reset moments and `forget_after`
cuts (a moment and a cut: chunks committed before the moment whose window ends after
the cut no longer count). A cache built under other rules is rebuilt from the log; so
the sinks keep their logs (they never expire the commits that carry records).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from connectors.timewindow import Window
from sinks.base import ChunkRecord, ChunkScope, Progress, SharedWindows, SinkError, merge_ms
from sinks.store.layout import STATE_DIR, check_flow, key_name
from sinks.store.objects import LakeStore

CACHE_VERSION = 1
RECORD_KEY = "historian.chunk"

# A chunk entry in the cache: [start_ms, end_ms, members, fetched, committed, committed_ns].
Entry = list[int]
Record = dict[str, Any]


def chunk_record(
    *,
    flow: str,
    dataset: str,
    chunk_id: str,
    window: Window,
    members: Sequence[str],
    rows_fetched: int,
    rows_committed: int,
    scope: ChunkScope | None = None,
) -> Record:
    """The record a chunk's commit carries (JSON-serialisable); with the `scope`'s node,
    kind and held members, from which the ledger is folded (`sinks.tables.ledger`)."""
    about: Record = {}
    if scope is not None:
        about = {"node": scope.node, "kind": scope.kind, "held": dict(scope.held)}
    return {
        **about,
        "flow": flow,
        "dataset": dataset,
        "chunk_id": chunk_id,
        "start_ms": window.start_ms,
        "end_ms": window.end_ms,
        "members": list(members),
        "fetched": int(rows_fetched),
        "committed": int(rows_committed),
        "committed_ns": time.time_ns(),
    }


class CommitLog(Protocol):
    """What a table-format sink tells the progress keeper about its tables."""

    def datasets(self) -> list[str]:
        """Datasets that hold tables (the tag dimension aside)."""

    def records_since(self, dataset: str, version: int) -> tuple[int, list[Record]]:
        """The latest version of the dataset's log and the chunk records of commits after
        `version` (-1: from the first), oldest first."""


def _empty_rules() -> dict[str, Any]:
    return {"all": 0, "members": {}, "forgets": []}


def _forgotten(rules: Mapping[str, Any], committed_ns: int, end_ms: int, chunk: str) -> bool:
    if committed_ns <= int(rules.get("all", 0)):
        return True
    if committed_ns <= int(rules.get("chunks", {}).get(chunk, -1)):  # `forget_chunks`
        return True
    return any(
        committed_ns <= int(at) and end_ms > int(cut) for at, cut in rules.get("forgets", [])
    )


class TableProgress:
    """Progress, chunk log, resets of every flow of one table-format sink."""

    def __init__(self, store: LakeStore, log: CommitLog) -> None:
        self.store = store
        self.log = log
        self._lock = threading.RLock()
        self._caches: dict[str, dict[str, Any]] = {}
        self._rules: dict[str, dict[str, Any]] = {}

    # -- rules ----------------------------------------------------------------------------

    def _rules_path(self, flow: str) -> str:
        return self.store.path(STATE_DIR, "flows", key_name(flow), "rules.json")

    def rules(self, flow: str) -> dict[str, Any]:
        if flow not in self._rules:
            value = self.store.read_json(self._rules_path(flow))
            self._rules[flow] = value if isinstance(value, dict) else _empty_rules()
        return self._rules[flow]

    def _save_rules(self, flow: str, rules: dict[str, Any]) -> None:
        self.store.makedirs(self.store.path(STATE_DIR, "flows", key_name(flow)))
        self.store.write_json(self._rules_path(flow), rules)
        self._rules[flow] = rules

    # -- the cache ------------------------------------------------------------------------

    def _cache_path(self, dataset: str) -> str:
        return self.store.path(STATE_DIR, "progress", f"{dataset}.json")

    def _load(self, dataset: str) -> dict[str, Any]:
        cache = self._caches.get(dataset)
        if cache is None:
            value = self.store.read_json(self._cache_path(dataset), torn_is_missing=True)
            ok = isinstance(value, dict) and value.get("format") == CACHE_VERSION
            cache = value if ok else {"format": CACHE_VERSION, "version": -1, "flows": {}}
        return cache

    def _stale(self, cache: Mapping[str, Any]) -> bool:
        return any(part.get("rules") != self.rules(flow) for flow, part in cache["flows"].items())

    def _fold(self, cache: dict[str, Any], records: list[Record]) -> None:
        touched: dict[str, set[str]] = {}
        for record in records:
            flow = str(record["flow"])
            rules = self.rules(flow)
            part = cache["flows"].setdefault(flow, {"rules": rules, "completed": {}, "chunks": {}})
            ns, start, end = (
                int(record["committed_ns"]),
                int(record["start_ms"]),
                int(record["end_ms"]),
            )
            if _forgotten(rules, ns, end, str(record["chunk_id"])):
                continue
            members = [str(m) for m in record["members"]]
            part["chunks"][str(record["chunk_id"])] = [
                start, end, len(members), int(record["fetched"]), int(record["committed"]), ns,
            ]  # fmt: skip
            resets = rules.get("members", {})
            held = record.get("held") or {}  # written, not proven complete (ChunkScope.held)
            for member in members:
                if member not in held and ns > int(resets.get(member, 0)):
                    part["completed"].setdefault(member, []).append([start, end])
                    touched.setdefault(flow, set()).add(member)
        for flow, names in touched.items():
            completed = cache["flows"][flow]["completed"]
            for member in names:
                completed[member] = merge_ms(completed[member])

    def refresh(self, dataset: str) -> dict[str, Any]:
        """The dataset's cache brought up to date with its log (saved when it changed)."""
        with self._lock:
            cache = self._load(dataset)
            if self._stale(cache):
                cache = {"format": CACHE_VERSION, "version": -1, "flows": {}}
            latest, records = self.log.records_since(dataset, int(cache["version"]))
            changed = latest != cache["version"]
            if latest < int(cache["version"]):  # the table was recreated: start over
                cache = {"format": CACHE_VERSION, "version": -1, "flows": {}}
                latest, records = self.log.records_since(dataset, -1)
            self._fold(cache, records)
            cache["version"] = latest
            self._caches[dataset] = cache
            if changed:
                # A cache: a read-only sink still answers, it just folds again next time.
                with contextlib.suppress(OSError):
                    self.store.makedirs(self.store.path(STATE_DIR, "progress"))
                    self.store.write_json(self._cache_path(dataset), cache, durable=False)
            return cache

    def _parts(self, flow: str) -> list[dict[str, Any]]:
        check_flow(flow)
        self._rules.clear()  # another process may have reset a flow since
        parts = []
        for dataset in self.log.datasets():
            part = self.refresh(dataset)["flows"].get(flow)
            if part is not None:
                parts.append(part)
        return parts

    # -- answers --------------------------------------------------------------------------

    def progress(self, flow: str) -> Progress:
        windows: dict[str, list[list[int]]] = {}
        for part in self._parts(flow):
            for member, found in part["completed"].items():
                windows.setdefault(member, []).extend(found)
        shared = SharedWindows()
        completed: dict[str, list[Window]] = {}
        for member, found in windows.items():
            merged = shared.merged_ms(found)
            if merged:
                completed[member] = shared.from_ms(merged)
        return Progress(flow=flow, completed=completed)

    def chunk_log(self, flow: str, limit: int) -> list[ChunkRecord]:
        entries: dict[str, Entry] = {}
        for part in self._parts(flow):
            entries.update(part["chunks"])
        newest = sorted(entries.items(), key=lambda item: (item[1][5], item[0]), reverse=True)
        return [
            ChunkRecord(
                flow=flow,
                chunk_id=chunk_id,
                window=Window.from_ms(entry[0], entry[1]),
                members=entry[2],
                rows_fetched=entry[3],
                rows_committed=entry[4],
                committed_at=datetime.fromtimestamp(entry[5] / 1e9, tz=UTC),
            )
            for chunk_id, entry in newest[: max(0, limit)]
        ]

    def flows(self) -> list[str]:
        self._rules.clear()
        names: set[str] = set()
        for dataset in self.log.datasets():
            cache = self.refresh(dataset)
            names.update(flow for flow, part in cache["flows"].items() if part["chunks"])
        return sorted(names)

    def reset(self, flow: str, member: str | None) -> int:
        """Forget a flow's progress (or one member's); returns chunks or windows forgotten."""
        with self._lock:
            parts = self._parts(flow)
            rules = {**self.rules(flow)}
            if member is None:
                removed = sum(len(part["chunks"]) for part in parts)
                rules = {**_empty_rules(), "all": time.time_ns()}
            else:
                removed = sum(len(part["completed"].get(member, [])) for part in parts)
                rules["members"] = {**rules.get("members", {}), member: time.time_ns()}
            self._save_rules(flow, rules)
            return removed

    def forget_after(self, flow: str, moment_ms: int) -> int:
        """Forget the chunks whose window ends after `moment_ms`; returns how many."""
        with self._lock:
            parts = self._parts(flow)
            forgotten = sum(
                1 for part in parts for entry in part["chunks"].values() if entry[1] > moment_ms
            )
            if forgotten:
                rules = {**self.rules(flow)}
                rules["forgets"] = [*rules.get("forgets", []), [time.time_ns(), int(moment_ms)]]
                self._save_rules(flow, rules)
            return forgotten

    def forget_chunks(self, flow: str, chunks: Sequence[str]) -> int:
        """Forget these chunks as committed so far (`historian verify --repair`: their
        rows are damaged); a later commit of one counts again. Returns how many."""
        with self._lock:
            if not chunks:
                return 0
            rules = {**self.rules(flow)}
            now = time.time_ns()
            rules["chunks"] = {**rules.get("chunks", {}), **dict.fromkeys(chunks, now)}
            self._save_rules(flow, rules)
            return len(chunks)

    def records(self, flow: str) -> dict[str, dict[str, Entry]]:
        """The flow's chunk entries per dataset (`Entry`)."""
        self._rules.clear()
        found = {}
        for dataset in self.log.datasets():
            part = self.refresh(dataset)["flows"].get(flow)
            if part is not None and part["chunks"]:
                found[dataset] = part["chunks"]
        return found


def check_record(value: object) -> Record | None:
    """A record read back from a commit, or None when it is not one of ours."""
    if not isinstance(value, dict):
        return None
    needed = ("flow", "chunk_id", "start_ms", "end_ms", "members", "committed_ns")
    if any(key not in value for key in needed):
        raise SinkError(f"a commit carries a malformed chunk record ({sorted(value)[:6]})")
    return value
