"""The lake's data files: how they are written, what their footers say, what is remembered.

A write must learn which earlier files of a partition hold rows of its scope. Reading
every file would cost a partition's rows per chunk, so the lake asks the footers first
(`FileInfo`: rows, `ts` and scope-column ranges, owner chunks) and remembers, while a file
or directory is unchanged (its version): footers, partition listings and, within a row
budget, the decoded rows of files a write had to read. A re-extraction over a compacted
partition then reads the compacted file once, not once per chunk.

A 0-row file (an emptied one) goes in two steps, so that a reader that listed it still
opens it: the first write or compaction of its partition that finds it retires it (puts
a 0-row file stamped with that moment over it, `RETIRED_KEY`), and one after
`grace_s` from that stamp removes it (`LakeFiles.swept`). The grace counts from the
commit that retired it, never from the file's own age: a lake left alone for hours
keeps its 0-row files through the grace of the re-extraction that finds them.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from connectors import schema as tables
from sinks.store.layout import Owner, is_data_file
from sinks.store.objects import Entry, LakeStore

ROW_GROUP_ROWS = 256 * 1024
# Earlier files a write reads to learn which of their rows are in its scope are kept
# decoded, while unchanged, up to this many rows (at least one file), so the chunks of a
# re-extraction over a compacted partition read that file once, not once each.
DECODED_MAX_ROWS = 2_000_000
OWNERS_KEY = b"historian.owners"
DATASET_KEY = b"historian"
# In a retired 0-row file: when a commit retired it (epoch ns); removed `grace_s` after.
RETIRED_KEY = b"historian.retired_ns"

# Retire 0-row files (paths in the store) now: a 0-row file stamped with this moment
# replaces each (`Journal.retire`).
Retire = Callable[[Sequence[str]], None]


@dataclass(frozen=True)
class FileInfo:
    """What a data file's footer says: rows, ts range, scope-column range, owner chunks."""

    rows: int
    ts_min: int | None
    ts_max: int | None
    key_min: str | None
    key_max: str | None
    owners: tuple[Owner, ...]
    retired_ns: int | None = None


def _column_range(meta: pq.FileMetaData, index: int, *, raw: bool) -> tuple[Any, Any] | None:
    """(min, max) of one column over the file's non-empty row groups, from their
    statistics (`raw`: the physical values, e.g. epoch ms of a timestamp); None when the
    column is missing, the file has no rows, or a row group lacks statistics for it."""
    if index < 0:
        return None
    lows: list[Any] = []
    highs: list[Any] = []
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        if row_group.num_rows == 0:
            continue
        stats = row_group.column(index).statistics
        if stats is None or not stats.has_min_max:
            return None
        lows.append(stats.min_raw if raw else stats.min)
        highs.append(stats.max_raw if raw else stats.max)
    return (min(lows), max(highs)) if lows else None


def footer_info(meta: pq.FileMetaData, kind: str) -> FileInfo:
    """A file's facts from its footer alone; a range is None unless every non-empty row
    group has statistics for it (a file without them is read, never skipped)."""
    names = meta.schema.names
    scope_col = tables.SCOPE_COLUMN[kind]
    ts = _column_range(meta, names.index("ts") if "ts" in names else -1, raw=True)
    key = _column_range(meta, names.index(scope_col) if scope_col in names else -1, raw=False)
    if ts is None or key is None:
        ts = key = None  # one range without statistics: the file is read, not skipped
    owners_raw = (meta.metadata or {}).get(OWNERS_KEY)
    owners = tuple(tuple(o) for o in orjson.loads(owners_raw)) if owners_raw else ()
    retired = (meta.metadata or {}).get(RETIRED_KEY)
    return FileInfo(
        rows=meta.num_rows,
        ts_min=ts[0] if ts else None,
        ts_max=ts[1] if ts else None,
        key_min=key[0] if key else None,
        key_max=key[1] if key else None,
        owners=owners,  # type: ignore[arg-type]
        retired_ns=int(retired) if retired and retired.isdigit() else None,
    )


def file_metadata(
    dataset: str, kind: str, attrs: object, owners: Sequence[Owner]
) -> dict[bytes, bytes]:
    """A data file's schema metadata: the dataset's facts, and the chunks owning its rows
    (what lets a later write skip files by their footer alone)."""
    about = {"dataset": dataset, "kind": kind, "attrs": attrs}
    return {DATASET_KEY: orjson.dumps(about), OWNERS_KEY: orjson.dumps(sorted(set(owners)))}


@dataclass(frozen=True)
class FileFormat:
    """How the lake writes Parquet: compression, row groups, encodings."""

    compression: str = "zstd"
    target_file_rows: int = 1_000_000

    @property
    def group_rows(self) -> int:
        return min(ROW_GROUP_ROWS, self.target_file_rows)

    def options(self, schema: pa.Schema) -> dict[str, Any]:
        """Dictionary pages for strings only (tag paths repeat; timestamps and values do
        not, and trying costs time and space) and delta encoding for `ts` (BENCHMARKS.md)."""
        options: dict[str, Any] = {
            "compression": None if self.compression == "none" else self.compression,
            "version": "2.6",
            "write_statistics": True,
            "use_dictionary": [
                f.name
                for f in schema
                if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)
            ],
        }
        if "ts" in schema.names and pa.types.is_timestamp(schema.field("ts").type):
            options["column_encoding"] = {"ts": "DELTA_BINARY_PACKED"}
        return options


class LakeFiles:
    """Footers, partition listings and decoded rows, each kept while unchanged.

    Only the dataset's writer (its lock) changes its files, and it calls `forget` for
    every path it changes; the versions guard against the rest.
    """

    def __init__(self, store: LakeStore, *, grace_s: float, decoded_rows: int) -> None:
        self.store = store
        self.grace_s = grace_s
        self.decoded_rows = decoded_rows
        self._infos: dict[str, tuple[str, FileInfo]] = {}
        self._listings: dict[str, tuple[str, list[Entry]]] = {}  # directory -> version, files
        self._decoded_lock = threading.Lock()
        self._decoded: OrderedDict[str, tuple[str, pa.Table]] = OrderedDict()

    def info(self, entry: Entry, kind: str) -> FileInfo:
        """The file's footer facts, read once per version."""
        cached = self._infos.get(entry.path)
        if cached is not None and cached[0] == entry.version:
            return cached[1]
        info = footer_info(self.store.read_parquet_metadata(entry.path), kind)
        self._infos[entry.path] = (entry.version, info)
        return info

    def current(self, entry: Entry) -> Entry:
        """`entry` as the disk has it now (one stat; as listed where the store cannot
        tell, or the file is gone). A held listing is guarded by its directory's version,
        which a file changed in place (truncated, overwritten by hand) leaves alone: a file
        about to be read for a merge is checked on its own."""
        return self.store.entry(entry.path) or entry

    def data_files(self, directory: str) -> list[Entry]:
        """The data files of a directory as listed now (no sweeping, no cache)."""
        return [e for e in self.store.listdir(directory) if not e.is_dir and is_data_file(e.name)]

    def listing(self, directory: str, kind: str, retire: Retire) -> list[Entry]:
        """A partition's data files, 0-row ones retired or removed (`swept`); listed again
        only when the directory changed. Writes that change nothing (a re-extraction over
        a compacted partition, whose emptied inputs are still there) would otherwise list
        and stat every file of the partition per chunk. The directory's own version (local
        disk) guards against changes not made through `forget`."""
        version = self.store.dir_version(directory)
        held = self._listings.get(directory)
        if held is not None and version is not None and held[0] == version:
            return held[1]
        listing, retired = self.swept(self.store.listdir(directory), kind, retire)
        if retired:  # their new versions (a write may place its rows over one)
            listing = self.data_files(directory)
        version = self.store.dir_version(directory)
        if version is not None:
            self._listings[directory] = (version, listing)
        return listing

    def swept(self, entries: list[Entry], kind: str, retire: Retire) -> tuple[list[Entry], bool]:
        """The data files of `entries` once 0-row files are dealt with, and whether some
        were retired: one not retired yet is retired now (`retire`), one retired at least
        `grace_s` ago is removed - a reader that listed it before it was retired has had
        the grace to open it. Stray link temps older than the grace are removed too. With
        no grace, a 0-row file is removed at once."""
        grace_ns = int(self.grace_s * 1e9)
        now_ns = time.time_ns()
        kept: list[Entry] = []
        unretired: list[str] = []
        for entry in entries:
            if entry.is_dir:
                continue
            if entry.name.startswith(".part-") and entry.name.endswith(".tmp"):
                if entry.modified_s <= now_ns / 1e9 - self.grace_s:
                    self.store.remove(entry.path)
                continue
            if not is_data_file(entry.name):
                continue
            info = self.info(entry, kind)
            if info.rows == 0 and info.retired_ns is None and grace_ns > 0:
                unretired.append(entry.path)
            elif info.rows == 0 and (info.retired_ns or 0) + grace_ns <= now_ns:
                self.store.remove(entry.path)
                self.forget(entry.path)
                continue
            kept.append(entry)
        if unretired:
            retire(unretired)
        return kept, bool(unretired)

    def decoded(self, entry: Entry, kind: str) -> pa.Table:
        """A file's rows, strings dictionary-encoded, kept while the file is unchanged and
        within the row budget (least recently used first out, one file at least)."""
        with self._decoded_lock:
            held = self._decoded.get(entry.path)
            if held is not None and held[0] == entry.version:
                self._decoded.move_to_end(entry.path)
                return held[1]
        strings = [f.name for f in tables.SCHEMAS[kind] if pa.types.is_string(f.type)]
        table = self.store.read_table(entry.path, dictionary=strings)
        with self._decoded_lock:
            self._decoded[entry.path] = (entry.version, table)
            while len(self._decoded) > 1 and (
                sum(t.num_rows for _, t in self._decoded.values()) > self.decoded_rows
            ):
                self._decoded.popitem(last=False)
        return table

    def forget(self, path: str) -> None:
        """Drop what is known of a file and of its directory's listing (it changed)."""
        self._forget_file(path)
        self._listings.pop(path.rsplit("/", 1)[0], None)

    def placed(self, paths: Sequence[str]) -> None:
        """Files this writer just moved in whole (under the dataset's lock, nothing else
        changed their directory): what was known of them is dropped, and a held listing of
        their directory takes their new entries, one stat each, instead of being listed
        again. A partition written chunk by chunk (a day of 1-minute windows) otherwise
        listed and stat-ed all its files per chunk: a fixed cost growing with the
        partition. Where the store cannot tell (object stores), this is `forget`."""
        by_directory: dict[str, list[str]] = {}
        for path in paths:
            self._forget_file(path)
            by_directory.setdefault(path.rsplit("/", 1)[0], []).append(path)
        for directory, moved in by_directory.items():
            held = self._listings.pop(directory, None)
            version = self.store.dir_version(directory)
            entries = [self.store.entry(path) for path in moved]
            if held is None or version is None or None in entries:
                continue
            names = set(moved)
            kept = [entry for entry in held[1] if entry.path not in names]
            self._listings[directory] = (version, kept + cast(list[Entry], entries))

    def _forget_file(self, path: str) -> None:
        self._infos.pop(path, None)
        with self._decoded_lock:
            self._decoded.pop(path, None)

    def clear(self) -> None:
        self._infos.clear()
        self._listings.clear()
        with self._decoded_lock:
            self._decoded.clear()


def visible_files(store: LakeStore, dataset: str) -> list[str]:
    """The dataset's data files a plain reader sees (pyarrow.dataset, DuckDB, pandas), in
    name order: directories starting with `.` or `_` are hidden from them, and skipped."""
    top = store.path(dataset)
    prefix = top.rstrip("/") + "/"
    return sorted(
        entry.path
        for entry in store.find(top)
        if is_data_file(entry.name)
        and not any(p.startswith((".", "_")) for p in entry.path[len(prefix) :].split("/")[:-1])
    )
