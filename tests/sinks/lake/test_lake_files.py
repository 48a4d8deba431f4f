"""The lake's file facts on their own: footers, the format, and what is remembered when."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from connectors import schema
from sinks.lake.files import RETIRED_KEY, FileFormat, LakeFiles, file_metadata, footer_info
from sinks.store.objects import Entry, LakeStore
from tests.sinks.lake.lake_frames import T0, history_frame, window
from tests.sinks.lake.stores import HookedStore

KIND = schema.KIND_TAG_HISTORY
MS0 = int(T0.timestamp() * 1000)


def history(tags: list[str], start_h: int, end_h: int) -> pa.Table:
    frame = history_frame(tags, window(start_h, end_h), step_s=3600)
    return schema.table_from_frame(frame, KIND)


def put(path: Path, table: pa.Table, owners: list[tuple[str, str]], **options: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = file_metadata("hist", KIND, {}, owners)
    pq.write_table(table.replace_schema_metadata(metadata), path, **options)


def entry(store: LakeStore, path: Path) -> Entry:
    (found,) = [e for e in store.listdir(str(path.parent)) if e.name == path.name]
    return found


def test_a_footer_gives_rows_ranges_and_owners(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    put(
        path, history(["/b", "/a"], 0, 3), [("f", "k2"), ("f", "k1"), ("f", "k1")], row_group_size=2
    )
    info = footer_info(pq.read_metadata(path), KIND)
    assert (info.rows, info.ts_min, info.ts_max) == (6, MS0, MS0 + 2 * 3_600_000)
    assert (info.key_min, info.key_max) == ("/a", "/b")
    assert info.owners == (("f", "k1"), ("f", "k2"))


def test_a_footer_without_statistics_has_no_ranges_so_the_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    put(path, history(["/a"], 0, 3), [], write_statistics=False)
    info = footer_info(pq.read_metadata(path), KIND)
    assert info.rows == 3
    assert (info.ts_min, info.ts_max, info.key_min, info.key_max) == (None,) * 4
    assert info.owners == ()


def test_the_format_dictionary_encodes_strings_only_and_delta_encodes_ts() -> None:
    options = FileFormat("none", target_file_rows=1000).options(schema.TAG_HISTORY_SCHEMA)
    assert options["compression"] is None
    assert options["use_dictionary"] == ["node", "tag", "value_str"]
    assert options["column_encoding"] == {"ts": "DELTA_BINARY_PACKED"}
    assert FileFormat(target_file_rows=1000).group_rows == 1000
    assert FileFormat().group_rows == 256 * 1024


def counting(store: HookedStore, name: str) -> list[str]:
    """The paths the store's `name` is called with, from now on."""
    calls: list[str] = []

    def counted(operation: Any, path: str, *args: Any, **kw: Any) -> Any:
        calls.append(path)
        return operation(path, *args, **kw)

    store.hook(name, counted)
    return calls


def test_a_footer_is_read_once_per_version_of_its_file(
    tmp_path: Path,
) -> None:
    store = HookedStore(str(tmp_path))
    files = LakeFiles(store, grace_s=60.0, decoded_rows=100)
    path = tmp_path / "d" / "part-a.parquet"
    put(path, history(["/a"], 0, 3), [("f", "a")])
    reads = counting(store, "read_parquet_metadata")
    first = entry(store, path)
    assert files.info(first, KIND).rows == 3
    assert files.info(first, KIND).rows == 3
    assert len(reads) == 1
    time.sleep(0.01)
    put(path, history(["/a"], 0, 5), [("f", "a")])
    assert files.info(entry(store, path), KIND).rows == 5, "a new version is read again"
    assert len(reads) == 2


def test_decoded_rows_are_kept_within_the_budget_least_recent_out(
    tmp_path: Path,
) -> None:
    store = HookedStore(str(tmp_path))
    files = LakeFiles(store, grace_s=60.0, decoded_rows=8)
    for name in "abc":
        put(tmp_path / "d" / f"part-{name}.parquet", history(["/a"], 0, 4), [("f", name)])
    a, b, c = (entry(store, tmp_path / "d" / f"part-{n}.parquet") for n in "abc")
    reads = counting(store, "read_table")
    for item in (a, b, a, c, a, b):  # 4 rows each: two files fit
        table = files.decoded(item, KIND)
        assert pa.types.is_dictionary(table.schema.field("tag").type)
    assert [Path(p).name for p in reads] == [
        "part-a.parquet",
        "part-b.parquet",
        "part-c.parquet",  # evicts b (a was used since)
        "part-b.parquet",
    ]
    files.forget(a.path)
    files.decoded(a, KIND)
    assert len(reads) == 5, "a forgotten file is read again"


def retired_empty(path: Path, ago_s: float) -> None:
    """A 0-row file retired `ago_s` seconds ago (`RETIRED_KEY`)."""
    put(path, schema.TAG_HISTORY_SCHEMA.empty_table(), [])
    stamp = str(time.time_ns() - int(ago_s * 1e9)).encode()
    table = pq.read_table(path)
    metadata = {**(table.schema.metadata or {}), RETIRED_KEY: stamp}
    pq.write_table(table.replace_schema_metadata(metadata), path)


def test_a_listing_is_kept_until_its_directory_changes_and_retires_then_removes_empty_files(
    tmp_path: Path,
) -> None:
    store = HookedStore(str(tmp_path))
    listings: list[str] = []

    def aged(listdir: Any, path: str) -> list[Entry]:
        """Every file looks an hour old: a 0-row file's age does not count, its retirement
        does (a stray link temp goes by its age)."""
        listings.append(path)
        return [replace(e, modified_s=e.modified_s - 3600) for e in listdir(path)]

    store.hook("listdir", aged)
    files = LakeFiles(store, grace_s=60.0, decoded_rows=100)
    directory = tmp_path / "d"
    put(directory / "part-a.parquet", history(["/a"], 0, 3), [("f", "a")])
    put(directory / "part-new.parquet", schema.TAG_HISTORY_SCHEMA.empty_table(), [])
    retired_empty(directory / "part-gone.parquet", ago_s=61)
    retired_empty(directory / "part-late.parquet", ago_s=59)
    (directory / ".part-x.parquet.1.tmp").write_bytes(b"")
    (directory / "notes.txt").write_text("not data")
    retired: list[str] = []
    names = [e.name for e in files.listing(str(directory), KIND, retired.extend)]
    assert sorted(names) == ["part-a.parquet", "part-late.parquet", "part-new.parquet"]
    assert [Path(p).name for p in retired] == ["part-new.parquet"], "retired, not removed"
    assert sorted(p.name for p in directory.iterdir()) == [
        "notes.txt",
        "part-a.parquet",
        "part-late.parquet",
        "part-new.parquet",
    ], "a 0-row file retired longer ago than the grace and a stray link temp are removed"
    assert len(listings) == 2, "listed again after retiring (the retired files changed)"
    files.listing(str(directory), KIND, retired.extend)
    assert len(listings) == 2, "unchanged directory: listed once"
    put(directory / "part-b.parquet", history(["/b"], 0, 3), [("f", "b")])
    assert len(files.listing(str(directory), KIND, retired.extend)) == 4
    assert len(listings) == 4


def test_files_a_writer_placed_join_the_held_listing_without_listing_again(
    tmp_path: Path,
) -> None:
    store = HookedStore(str(tmp_path))
    listings: list[str] = []

    def counted(listdir: Any, path: str) -> list[Entry]:
        listings.append(path)
        return list(listdir(path))

    store.hook("listdir", counted)
    files = LakeFiles(store, grace_s=60.0, decoded_rows=100)
    directory = tmp_path / "d"
    put(directory / "part-a.parquet", history(["/a"], 0, 3), [("f", "a")])
    assert [e.name for e in files.listing(str(directory), KIND, print)] == ["part-a.parquet"]
    put(directory / "part-b.parquet", history(["/b"], 0, 3), [("f", "b")])
    put(directory / "part-a.parquet", history(["/a"], 0, 5), [("f", "a")])  # rewritten
    files.placed([str(directory / "part-b.parquet"), str(directory / "part-a.parquet")])
    listing = files.listing(str(directory), KIND, print)
    assert len(listings) == 1, "the placed files joined the listing: not listed again"
    assert {e.name: e for e in listing} == {e.name: e for e in store.listdir(str(directory))}, (
        "the same entries (versions included) as a fresh listing"
    )
    assert files.info(next(e for e in listing if e.name == "part-a.parquet"), KIND).rows == 5
    # A change the writer did not announce is still seen by the directory's version.
    put(directory / "part-c.parquet", history(["/c"], 0, 3), [("f", "c")])
    assert len(files.listing(str(directory), KIND, print)) == 3


def test_a_local_lake_never_imports_fsspec_and_matches_its_paths(tmp_path: Path) -> None:
    """A plain path is the OS's (fsspec's import is ~70 ms of a one-off run); its root is
    the one fsspec gives, and the store works from it without fsspec."""
    import subprocess
    import sys

    code = (
        "import sys, os, pyarrow as pa\n"
        "from sinks.store.objects import LakeStore, on_object_storage\n"
        f"store = LakeStore({str(tmp_path / 'lake')!r})\n"
        "part = store.path('d', 'p')\n"
        "store.makedirs(part)\n"
        "store.write_parquet(pa.table({'x': [1, 2]}), store.path('d', 'p', 'a.parquet'))\n"
        "store.write_atomic(store.path('d', 'p', 'b.json'), b'{}')\n"
        "assert sorted(e.name for e in store.listdir(part)) == ['a.parquet', 'b.json']\n"
        "assert store.read_table(store.path('d', 'p', 'a.parquet')).num_rows == 2\n"
        "assert not on_object_storage(store.url) and store.local\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'fsspec'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    import fsspec

    for url in (str(tmp_path / "lake"), "rel/../lake", "~/lake", "./lake"):
        _, root = fsspec.core.url_to_fs(url)
        assert LakeStore(url).root == os.path.abspath(root), url
