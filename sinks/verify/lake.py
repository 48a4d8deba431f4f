"""Is every committed chunk of the lake still there? Its markers against the files' footers.

A marker lists the files holding its chunk's rows, each with the file's row count at the
commit (kept true by every later write and compaction that changes the file:
`sinks.lake.journal`). Checking a chunk therefore costs one footer per file, never its
rows: a file gone, unreadable (truncated, overwritten) or holding another row count than
recorded is damage, and every chunk whose marker lists it is named.

Repairing moves unreadable files aside, never deleting them (`<root>/_quarantine/
<dataset>/<path in the dataset>`: hidden from readers of the dataset, beside it), and
removes the damaged chunks' markers, so the next run fetches exactly those chunks again
and replaces whatever rows of theirs are left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from connectors.timewindow import Window
from sinks.base import Damage, UnreadableFile, Verified
from sinks.lake.state import LakeState
from sinks.store.layout import ledger_file

QUARANTINE_DIR = "_quarantine"
# Footers and markers are read this many at a time: on object storage each is a GET.
READERS = 16


@dataclass
class Recorded:
    """A data file as the markers record it: rows, and the chunks (and windows) it holds."""

    dataset: str
    path: str  # inside the dataset, as markers list it
    rows: int
    chunks: list[str] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)


def overlaps(start_ms: int, end_ms: int, window: Window | None) -> bool:
    """Does [start_ms, end_ms) meet `window` (None: everything)?"""
    return window is None or (start_ms < window.end_ms and end_ms > window.start_ms)


class LakeVerifier:
    """Checks (and repairs) one progress key's chunks in a lake's store."""

    def __init__(
        self, state: LakeState, dataset_lock: Callable[[str], AbstractContextManager[None]]
    ) -> None:
        self.state = state
        self.store = state.store
        self.dataset_lock = dataset_lock

    def verify(self, flow: str, window: Window | None, *, repair: bool) -> Verified:
        entries = self.state.snapshot(flow)["markers"]
        chunks = [c for c, e in entries.items() if overlaps(int(e[1]), int(e[2]), window)]
        files = self._recorded(flow, chunks)
        found = Verified(chunks=len(chunks))
        with ThreadPoolExecutor(READERS) as pool:
            problems = list(pool.map(self._problem, files))
        damaged = [
            (item, self._damage(item, *problem))
            for item, problem in zip(files, problems, strict=True)
            if problem is not None
        ]
        found.damages = [damage for _, damage in damaged]
        if repair:
            for dataset in sorted({item.dataset for item, _ in damaged}):
                hit = {c for item, _ in damaged if item.dataset == dataset for c in item.chunks}
                self._repair(flow, dataset, hit, found)
        return found

    def _repair(self, flow: str, dataset: str, chunks: set[str], found: Verified) -> None:
        """Under the dataset's commit lock, the damaged chunks checked again (a write or
        a compaction of another key may have moved their rows meanwhile): unreadable
        files moved aside, then the markers of chunks still damaged removed; the rows
        they still have stay until the next run fetches them again and replaces them."""
        with self.dataset_lock(dataset):
            files = self._recorded(flow, chunks)
            problems = [(item, self._problem(item)) for item in files]
            for item, problem in problems:
                if problem is not None and problem[1]:
                    self._quarantine(item, found)
            forget = sorted({c for item, problem in problems if problem for c in item.chunks})
            store = self.state.store
            for chunk in forget:
                self.state.remove_marker(flow, chunk)
                # Its ledger rows go with it: they vouched for rows no longer all there.
                store.remove(store.path(ledger_file(dataset, flow, chunk)))
            found.forgotten += len(forget)

    def _recorded(self, flow: str, chunks: Iterable[str]) -> list[Recorded]:
        """The files the chunks' markers list, each once (a compacted file holds many)."""
        paths = [self.state.marker_path(flow, chunk) for chunk in chunks]
        with ThreadPoolExecutor(READERS) as pool:
            markers = list(pool.map(lambda p: self.store.read_json(p, torn_is_missing=True), paths))
        files: dict[tuple[str, str], Recorded] = {}
        for marker in markers:
            if not isinstance(marker, Mapping) or "window" not in marker:
                continue  # gone or torn since the listing: not a committed chunk
            span = Window.from_ms(
                int(marker["window"]["start_ms"]), int(marker["window"]["end_ms"])
            )
            dataset = str(marker["dataset"])
            for listed in marker.get("files", []):
                key = (dataset, str(listed["path"]))
                item = files.setdefault(key, Recorded(dataset, key[1], int(listed["rows"])))
                item.chunks.append(str(marker["chunk_id"]))
                item.windows.append(span)
        return list(files.values())

    def _problem(self, item: Recorded) -> tuple[str, bool] | None:
        """What is wrong with a recorded file (and whether it is unreadable), or None."""
        path = self.store.path(item.dataset, item.path)
        try:
            rows = self.store.read_parquet_metadata(path).num_rows
        except FileNotFoundError:
            return f"missing (recorded with {item.rows:,} rows)", False
        except UnreadableFile as exc:
            return f"unreadable: {exc.reason}", True
        if rows != item.rows:
            return f"holds {rows:,} rows, recorded {item.rows:,}", False
        return None

    def _damage(self, item: Recorded, problem: str, unreadable: bool) -> Damage:
        span = Window(min(w.start for w in item.windows), max(w.end for w in item.windows))
        where = self.store.display(self.store.path(item.dataset, item.path))
        return Damage(where, span, problem, tuple(sorted(set(item.chunks))), unreadable)

    def quarantine_path(self, dataset: str, path: str) -> str:
        """Where an unreadable file of a dataset is moved: beside the dataset, hidden."""
        return self.store.path(QUARANTINE_DIR, dataset, path)

    def _quarantine(self, item: Recorded, found: Verified) -> None:
        """Move an unreadable file aside (the caller holds its dataset's commit lock)."""
        source = self.store.path(item.dataset, item.path)
        target = self.quarantine_path(item.dataset, item.path)
        if self.store.exists(target):  # one quarantined before: keep both
            target = f"{target}.{len(found.quarantined)}"
        self.store.replace(source, target)
        found.quarantined.append((self.store.display(source), self.store.display(target)))
