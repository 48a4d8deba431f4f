"""The lake's file operations, on local disk or any fsspec filesystem, with one interface.

Local disk uses the OS directly (`os.replace` is an atomic rename, files are fsynced
before they are renamed into place). Object storage goes through fsspec: an object PUT
is atomic, a "rename" is a copy then a delete, and nothing is answered from fsspec's
listings cache (its `use_listings_cache` is off): other processes change the lake, and
a cached listing of a directory makes its newer files unknown to `info`, `exists` and
`open` of a long-lived process (a `historian serve`, a worker, a reader that read before).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sinks.base import UnreadableFile
from sinks.store.layout import join

if TYPE_CHECKING:
    import fsspec


@dataclass(frozen=True)
class Entry:
    """One listed file: its full path in the store, name, size and a change token."""

    path: str
    name: str
    size: int
    version: str
    is_dir: bool = False
    # Last change of the file or its name, epoch seconds (0.0 when the store does not
    # say). Local disk: the later of mtime and ctime, as a link or a rename changes only
    # the latter.
    modified_s: float = 0.0


def _local_entry(path: str, name: str, stat: os.stat_result) -> Entry:
    version = f"{stat.st_mtime_ns}-{stat.st_size}"
    return Entry(path, name, stat.st_size, version, modified_s=max(stat.st_mtime, stat.st_ctime))


def redacted_url(url: str) -> str:
    """The URL without userinfo or query (where credentials could hide)."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _plain_local_path(url: str) -> bool:
    """Whether `url` is a plain POSIX path, no protocol (what fsspec's `split_protocol`
    reads as protocol None): such a lake never needs fsspec, whose import costs a one-off
    run ~70 ms of CPU (an hourly run's whole budget is ~1 s)."""
    return os.sep == "/" and "://" not in url and "::" not in url and not url.startswith("data:")


def on_object_storage(url: str) -> bool:
    """Whether `url` names object storage (any fsspec protocol but the local file
    system's): there, flow locks are leases and listings are never cached."""
    if _plain_local_path(url):
        return False
    import fsspec

    protocol, _ = fsspec.core.split_protocol(url)
    return protocol not in (None, "file", "local")


def token() -> str:
    return secrets.token_hex(6)


class LakeStore:
    """File operations rooted at the lake's URL."""

    def __init__(self, url: str, storage_options: Mapping[str, object] | None = None) -> None:
        self.url = url
        self.pafs: pafs.FileSystem
        if _plain_local_path(url):  # the OS directly (fsspec's local paths, made absolute)
            self.local = True
            self.root: str = os.path.abspath(os.path.expanduser(url))
            self.pafs = pafs.LocalFileSystem()
            return
        import fsspec
        from fsspec.implementations.local import LocalFileSystem

        options = dict(storage_options or {})
        if on_object_storage(url):
            options.setdefault("use_listings_cache", False)
        fs, root = fsspec.core.url_to_fs(url, **options)
        self.fs = fs
        self.local = isinstance(fs, LocalFileSystem)
        self.root = os.path.abspath(root) if self.local else str(root).rstrip("/")
        self.pafs = (
            pafs.LocalFileSystem() if self.local else pafs.PyFileSystem(pafs.FSSpecHandler(fs))
        )

    @cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        """fsspec's filesystem of a plain local lake, made on first use (object storage
        sets its own in `__init__`)."""
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem()

    def path(self, *parts: str) -> str:
        return join(self.root, *parts)

    def relative(self, path: str) -> str:
        """A path under the root as relative to it (what intents and markers record)."""
        root = self.root.rstrip("/") + "/"
        return path[len(root) :] if path.startswith(root) else path

    def display(self, path: str) -> str:
        """A path as the user knows it: local path, or protocol URL without secrets."""
        if self.local:
            return path
        protocol = self.fs.protocol
        scheme = protocol[0] if isinstance(protocol, tuple | list) else protocol
        return f"{scheme}://{path}"

    # -- reading ------------------------------------------------------------------------

    def read_bytes(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        try:
            if self.local:
                with open(path, "rb") as handle:
                    return handle.read()
            # One GET: a file replaced between a HEAD and the GET (a lease, a marker
            # rewritten by another process) reads as its newer version, not as an error.
            data: bytes = self.fs.cat_file(path)
            return data
        except FileNotFoundError:
            return None

    def read_json(self, path: str, *, torn_is_missing: bool = False) -> Any:
        """The file's JSON, None when missing; with `torn_is_missing` also when it is not
        valid JSON (a file written without `durable`, cut short by a power cut)."""
        data = self.read_bytes(path)
        if data is None:
            return None
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            if torn_is_missing:
                return None
            raise

    def exists(self, path: str) -> bool:
        if self.local:
            return os.path.exists(path)
        return bool(self.fs.exists(path))

    def version(self, path: str) -> str | None:
        """A token that changes whenever the file is rewritten (None when missing)."""
        try:
            if self.local:
                stat = os.stat(path)
                return f"{stat.st_mtime_ns}-{stat.st_size}"
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        return _fs_version(info)

    def dir_version(self, directory: str) -> str | None:
        """A token that changes when entries of `directory` are added, renamed or removed
        (local disk: its mtime and ctime); None where the store cannot tell (object
        stores) or the directory does not exist."""
        if not self.local:
            return None
        try:
            stat = os.stat(directory)
        except FileNotFoundError:
            return None
        return f"{stat.st_mtime_ns}-{stat.st_ctime_ns}-{stat.st_nlink}"

    def entry(self, path: str) -> Entry | None:
        """The file at `path` as `listdir` lists it: local disk only (None elsewhere, or
        when it is missing)."""
        if not self.local:
            return None
        try:
            return _local_entry(path, os.path.basename(path), os.stat(path))
        except FileNotFoundError:
            return None

    def listdir(self, directory: str) -> list[Entry]:
        """Entries directly in `directory` (empty when it does not exist)."""
        if self.local:
            try:
                with os.scandir(directory) as entries:
                    result = []
                    for entry in entries:
                        if entry.is_dir():
                            result.append(Entry(entry.path, entry.name, 0, "", True))
                        else:
                            result.append(_local_entry(entry.path, entry.name, entry.stat()))
                    return result
            except FileNotFoundError:
                return []
        self.fs.invalidate_cache(directory)
        try:
            infos = self.fs.ls(directory, detail=True)
        except FileNotFoundError:
            return []
        result = []
        for info in infos:
            name = str(info["name"]).rstrip("/")
            if name == directory.rstrip("/"):
                continue
            base = name.rsplit("/", 1)[-1]
            is_dir = info.get("type") == "directory"
            result.append(
                Entry(
                    name,
                    base,
                    int(info.get("size") or 0),
                    _fs_version(info),
                    is_dir,
                    _fs_modified(info),
                )
            )
        return result

    def find(self, directory: str) -> list[Entry]:
        """Every file below `directory`, recursively."""
        if self.local:
            result = []
            for dirpath, _dirs, files in os.walk(directory):
                for name in files:
                    full = os.path.join(dirpath, name)
                    with contextlib.suppress(FileNotFoundError):
                        stat = os.stat(full)
                        result.append(
                            Entry(
                                full,
                                name,
                                stat.st_size,
                                f"{stat.st_mtime_ns}-{stat.st_size}",
                                modified_s=max(stat.st_mtime, stat.st_ctime),
                            )
                        )
            return result
        self.fs.invalidate_cache(directory)
        try:
            infos = self.fs.find(directory, detail=True)
        except FileNotFoundError:
            return []
        return [
            Entry(
                str(name),
                str(name).rsplit("/", 1)[-1],
                int(info.get("size") or 0),
                _fs_version(info),
                modified_s=_fs_modified(info),
            )
            for name, info in infos.items()
            if info.get("type") != "directory"
        ]

    def read_parquet_metadata(self, path: str) -> pq.FileMetaData:
        with self.named_if_unreadable(path):
            return pq.read_metadata(path, filesystem=self.pafs)

    @contextlib.contextmanager
    def named_if_unreadable(self, path: str) -> Iterator[None]:
        """A file that is there but is no Parquet (truncated, overwritten) becomes an
        `UnreadableFile` naming it; a missing one stays FileNotFoundError."""
        try:
            yield
        except (pa.ArrowInvalid, OSError) as exc:
            if not _corrupt(exc):
                raise
            shown = f"{self.relative(path)} in {self.display(self.root)}"
            raise UnreadableFile(self.display(path), str(exc).splitlines()[0], shown=shown) from exc

    def read_table(
        self, path: str, columns: list[str] | None = None, dictionary: Sequence[str] = ()
    ) -> pa.Table:
        """The file's rows; columns named in `dictionary` come back dictionary-encoded (as
        Parquet stores them), which holds repeated strings in a fraction of the memory."""
        # ParquetFile, not pq.read_table: a third of the time on small files (no dataset
        # discovery), which a compaction of thousands of one-minute files feels.
        with (
            self.named_if_unreadable(path),
            pq.ParquetFile(
                path, filesystem=self.pafs, read_dictionary=list(dictionary) or None
            ) as handle,
        ):
            return handle.read(columns=columns)

    # -- writing ------------------------------------------------------------------------

    def makedirs(self, directory: str) -> None:
        """Create a directory (local disk only: object stores have no directories)."""
        if self.local:
            os.makedirs(directory, exist_ok=True)

    def write_bytes(self, path: str, data: bytes, *, durable: bool = True) -> None:
        """Write a whole file in place (callers use temp names and `replace`); `durable`
        flushes it to the disk before returning (local disk)."""
        if self.local:
            self.makedirs(os.path.dirname(path))
            with open(path, "wb") as handle:
                handle.write(data)
                if durable:
                    handle.flush()
                    _sync_data(handle.fileno())
            return
        with self.fs.open(path, "wb") as handle:
            handle.write(data)

    def create_new(self, path: str, data: bytes) -> bool:
        """Write a file only if none is there (local: O_EXCL; object storage: a conditional
        PUT, If-None-Match); False when one already is."""
        try:
            if self.local:
                self.makedirs(os.path.dirname(path))
                with open(path, "xb") as handle:
                    handle.write(data)
                return True
            self.fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        return True

    # -- conditional writes (leases on object storage) -----------------------------------

    @property
    def conditional(self) -> bool:
        """Whether a write or a delete can be made conditional on the ETag a caller read
        (S3 and stores that speak its API: `If-Match`); elsewhere on object storage a
        lease's check and its write are two steps."""
        protocol = self.fs.protocol
        protocols = protocol if isinstance(protocol, tuple | list) else (protocol,)
        return not self.local and any(name in ("s3", "s3a") for name in protocols)

    def etag(self, path: str) -> str | None:
        """The object's ETag as the store has it now (None when it is missing)."""
        self.fs.invalidate_cache(path)
        try:
            tag = self.fs.info(path).get("ETag")
        except FileNotFoundError:
            return None
        return str(tag) if tag else None

    def replace_if(self, path: str, data: bytes, etag: str) -> str | None:
        """Overwrite the object only while its ETag is `etag`: its new ETag, or None when
        someone else changed or removed it first (`conditional` stores only)."""
        done, answer = self._if_match(path, partial(self.fs.pipe_file, path, data, IfMatch=etag))
        if not done:
            return None
        tag = answer.get("ETag") if isinstance(answer, Mapping) else None
        return str(tag) if tag else self.etag(path)

    def remove_if(self, path: str, etag: str) -> bool:
        """Delete the object only while its ETag is `etag`; False when it changed or went
        (`conditional` stores only)."""
        bucket, key, _ = self.fs.split_path(path)
        delete = partial(self.fs.call_s3, "delete_object", Bucket=bucket, Key=key, IfMatch=etag)
        return self._if_match(path, delete)[0]

    def _if_match(self, path: str, call: Callable[[], object]) -> tuple[bool, object]:
        """Make an S3 call conditional on an ETag: (True, its answer), or (False, None)
        when the object changed or went first."""
        try:
            return True, call()
        except FileNotFoundError:
            return False, None
        except OSError as exc:
            if _precondition_failed(exc):
                return False, None
            raise
        finally:
            self.fs.invalidate_cache(path)

    def write_atomic(self, path: str, data: bytes, *, durable: bool = True) -> None:
        """Readers see the old file or the new one, never a part (temp + rename / one PUT).

        `durable` (local disk): the content is on the disk before the rename and the
        rename is when this returns. Without it a power cut may lose the file or leave
        it empty or cut short, which its readers then must take as missing.
        """
        if not self.local:
            self.write_bytes(path, data)  # an object PUT is atomic
            return
        directory, name = os.path.split(path)
        temp = os.path.join(directory, f".{name}.{token()}.tmp")
        try:
            self.write_bytes(temp, data, durable=durable)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(temp)
            raise
        if durable:
            self.sync_dir(directory)

    def write_json(self, path: str, value: Any, *, durable: bool = True) -> None:
        self.write_atomic(path, orjson.dumps(value), durable=durable)

    def sync_dir(self, directory: str) -> None:
        """Make the renames and removals in `directory` durable (local disk; a no-op on
        object stores, whose writes are durable when they return)."""
        if not self.local:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_parquet(self, table: pa.Table, path: str, **options: Any) -> None:
        """Write a Parquet file at `path` (a temp name: not atomic by itself)."""
        if self.local:
            # A path, not a Python file object: Arrow then writes through its own file and
            # never takes the GIL per buffer (a Python handle made every write a call back
            # into Python, which stalled the fetch threads; bench/compare.py).
            self.makedirs(os.path.dirname(path))
            _write_table(table, path, **options)
            _fsync(path)
            return
        with self.fs.open(path, "wb") as handle:
            _write_table(table, handle, **options)

    def write_parquet_parts(
        self,
        schema: pa.Schema,
        parts: Iterable[pa.Table],
        path: str,
        *,
        row_group_size: int,
        **options: Any,
    ) -> None:
        """Like `write_parquet`, from tables made one at a time (only one is held at once)."""

        def write(handle: Any) -> None:
            metadata = schema.metadata or {}
            with pq.ParquetWriter(
                handle, schema.remove_metadata(), store_schema=False, **options
            ) as writer:
                for part in parts:
                    writer.write_table(
                        part.replace_schema_metadata(None), row_group_size=row_group_size
                    )
                    del part  # gone before the next is made (`parts` may free memory)
                if metadata:
                    writer.add_key_value_metadata(metadata)

        if self.local:
            self.makedirs(os.path.dirname(path))
            write(path)
            _fsync(path)
            return
        with self.fs.open(path, "wb") as handle:
            write(handle)

    def replace(self, source: str, target: str) -> None:
        """Move `source` over `target` (atomic on local disk; copy + delete on object stores)."""
        if self.local:
            self.makedirs(os.path.dirname(target))
            os.replace(source, target)
            return
        self.fs.mv(source, target)

    def copy_over(self, source: str, target: str) -> None:
        """Put a copy of `source` (a small file that never changes) at `target` atomically.

        Local disk: a hard link renamed over the target, so the copy shares the source's
        synced content and costs no write (and its inode: every copy's ctime is that of
        the newest); object stores: one PUT of its bytes.
        """
        if self.local:
            directory, name = os.path.split(target)
            temp = os.path.join(directory, f".{name}.{token()}.tmp")
            os.link(source, temp)
            try:
                os.replace(temp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.remove(temp)
                raise
            return
        data = self.read_bytes(source)
        if data is None:
            raise FileNotFoundError(source)
        self.write_bytes(target, data)

    def remove(self, path: str) -> bool:
        """Delete a file; False when it was not there."""
        try:
            if self.local:
                os.remove(path)
            else:
                self.fs.rm_file(path)
        except FileNotFoundError:
            return False
        return True

    def rmtree(self, directory: str) -> None:
        if self.local:
            import shutil

            shutil.rmtree(directory, ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(directory, recursive=True)

    def iter_names(self, directory: str, suffix: str) -> Iterator[str]:
        for entry in self.listdir(directory):
            if not entry.is_dir and entry.name.endswith(suffix):
                yield entry.name


def _corrupt(exc: BaseException) -> bool:
    """Does a Parquet reader's error say the file itself is bad (not missing, not the
    network: those stay what they are, a retry may help)?"""
    if isinstance(exc, pa.ArrowInvalid):
        return True
    if isinstance(exc, FileNotFoundError | ConnectionError | TimeoutError):
        return False
    text = str(exc).lower()  # pyarrow's phrases, not a path that happens to say "parquet"
    return any(phrase in text for phrase in _CORRUPT_PHRASES)


_CORRUPT_PHRASES = (
    "magic bytes",
    "thrift",
    "deserializ",
    "corrupt",
    "parquet file size is 0",
    "not a parquet file",
    "invalid parquet",
)


def _fs_modified(info: Mapping[str, Any]) -> float:
    moment = info.get("mtime") or info.get("LastModified") or info.get("created")
    if isinstance(moment, datetime):
        return moment.timestamp()
    if isinstance(moment, int | float):
        return float(moment)
    return 0.0


def _precondition_failed(exc: BaseException) -> bool:
    """Whether an S3 call failed on its condition (HTTP 412 PreconditionFailed), which
    s3fs raises as an OSError whose cause is botocore's error."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, Mapping):
            code = str(response.get("Error", {}).get("Code", ""))
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code == "PreconditionFailed" or status == 412:
                return True
        seen = seen.__cause__ or seen.__context__
    return "pre-condition" in str(exc).lower() or "precondition" in str(exc).lower()


def _fs_version(info: Mapping[str, Any]) -> str:
    tag = info.get("ETag") or info.get("etag") or ""
    moment = info.get("mtime") or info.get("LastModified") or info.get("created") or ""
    return f"{tag}-{moment}-{info.get('size')}"


def _sync_data(fd: int) -> None:
    """Flush a file's data and size (not its times: fdatasync, where there is one)."""
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def _fsync(path: str) -> None:
    """Flush a file Arrow wrote and closed to the disk before it is renamed into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _sync_data(fd)
    finally:
        os.close(fd)


def _write_table(
    table: pa.Table, where: Any, *, row_group_size: int | None = None, **options: Any
) -> None:
    """Write `table` without Arrow's stored schema, keeping its key-value metadata.

    Without the stored schema every reader takes a column's type from Parquet's own logical
    types, so a dictionary-encoded `tag` (written as Parquet dictionary pages straight from
    its codes, which is cheaper than from strings) reads back as plain strings, as in files
    written from string columns: pandas gets no category, and engines see one type across
    old and new files. Timestamps keep their UTC zone (isAdjustedToUTC). pyarrow's
    `store_schema=False` also drops the metadata, so it is added back explicitly.
    """
    metadata = table.schema.metadata or {}
    with pq.ParquetWriter(
        where, table.schema.remove_metadata(), store_schema=False, **options
    ) as writer:
        writer.write_table(table.replace_schema_metadata(None), row_group_size=row_group_size)
        if metadata:
            writer.add_key_value_metadata(metadata)
