"""What the sinks that keep files in a `LakeStore` share: the store, open, probe, locks, errors.

The Parquet lake, Delta Lake and Iceberg sinks differ in how a chunk becomes files and
a commit; reaching their root, telling whether it could be written, taking a flow's lock
(a flock on local disk, a lease on object storage: `sinks.store.locks`), taking turns per
dataset for a commit, and turning any failure below into a one-line SinkError naming the
sink are the same, and live here once.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path

import pandas as pd
import pyarrow as pa

from connectors import schema as tables
from sinks.base import SinkError, SinkUnavailable
from sinks.store.layout import LOCKS_DIR, STATE_DIR, check_dataset, check_flow, key_name
from sinks.store.locks import dataset_flock, dataset_lease, flow_flock, flow_lease
from sinks.store.objects import LakeStore, redacted_url
from sinks.store.progress import ProgressMethods


class FileSink(ProgressMethods):
    """A sink over a `LakeStore`; a subclass says how it writes, reads and keeps progress.

    `store`: a store to use instead of one made from `url` (tests inject one that
    counts, fails or pauses at a step; the store is what every file operation goes through).
    """

    # How the sink's errors name it: "<label> '<name>': ...".
    label = "sink"
    # Chunk writes of one dataset take turns under its lock (`dataset_lock`), across
    # processes too (other nodes, other shards): a second write at once would only wait.
    write_concurrency: int = 1

    def __init__(
        self,
        url: str,
        *,
        name: str,
        storage_options: Mapping[str, object] | None = None,
        store: LakeStore | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self._storage_options = dict(storage_options or {})
        self._given_store = store
        self._store: LakeStore | None = store
        self._threads_lock = threading.Lock()
        self._thread_locks: dict[str, threading.Lock] = {}

    # -- the store ----------------------------------------------------------------------

    def _new_store(self) -> LakeStore:
        """The injected store, else a new one over `url`."""
        if self._given_store is not None:
            return self._given_store
        return LakeStore(self.url, self._storage_options)

    @property
    def store(self) -> LakeStore:
        if self._store is None:
            self._store = self._new_store()
        return self._store

    def _reach(self) -> LakeStore:
        """A store whose root can be written: on local disk the state directory made, on
        object storage the bucket found (SinkError when it does not exist)."""
        store = self._new_store()
        if store.local:
            store.makedirs(store.path(STATE_DIR, LOCKS_DIR))
        else:
            self._bucket(store)
        return store

    def _bucket(self, store: LakeStore) -> str:
        """The bucket of a root on object storage, SinkError when it does not exist."""
        bucket = store.root.split("/", 1)[0]
        try:
            store.fs.info(bucket)  # raises when unreachable, unlike fs.exists
        except FileNotFoundError:
            raise SinkError(
                f"{self.label} '{self.name}': {store.display(bucket)} does not exist"
            ) from None
        return bucket

    # -- errors -------------------------------------------------------------------------

    def _transient(self, exc: BaseException) -> bool:
        """Is this failure of the storage worth a retry later (SinkUnavailable)?"""
        raise NotImplementedError

    def _reason(self, exc: BaseException) -> str:
        """The failure as one short line for the user."""
        raise NotImplementedError

    def _error(self, action: str, exc: BaseException) -> SinkError:
        cls = SinkUnavailable if self._transient(exc) else SinkError
        return cls(f"{self.label} '{self.name}': {action}: {self._reason(exc)}")

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Any failure below becomes a one-line SinkError naming the sink and the action."""
        try:
            yield
        except SinkError:
            raise
        except Exception as exc:
            raise self._error(action, exc) from exc

    # -- lifecycle ----------------------------------------------------------------------

    def open(self) -> None:
        """Reach the root (`_reach`), then whatever the sink needs (`_opened`)."""
        with self._errors(f"open {redacted_url(self.url)}"):
            self._store = self._reach()
            self._opened()

    def _opened(self) -> None:
        """After the root is reached: the sink's own opening steps."""

    def probe(self) -> str:
        """Whether the sink could be written, found without creating or writing anything
        (`historian check`): a local root that exists must be a writable directory, else
        its nearest existing parent; object storage must have its bucket."""
        with self._errors(f"check {redacted_url(self.url)}"):
            store = self._new_store()
            if not store.local:
                return f"bucket {store.display(self._bucket(store))} reachable"
            root = Path(store.root)
            where = next((p for p in (root, *root.parents) if p.exists()), Path(root.anchor))
            if not where.is_dir():
                raise SinkError(f"{self.label} '{self.name}': {where} is not a directory")
            if not os.access(where, os.W_OK | os.X_OK):
                raise SinkError(f"{self.label} '{self.name}': {where} is not writable")
            if where == root:
                return "exists, writable"
            return f"does not exist yet; {where} is writable"

    # -- reading ------------------------------------------------------------------------

    def _scan(self, dataset: str, target: pa.Schema) -> pa.Table | None:
        """The dataset's latest rows in the `target` schema, None when it holds none yet."""
        raise NotImplementedError

    def read(self, dataset: str, kind: str) -> pd.DataFrame:
        """The whole dataset, sorted by the kind's key, with the kind's exact types."""
        check_dataset(dataset, metadata=kind == tables.KIND_TAG_METADATA)
        if kind not in tables.SCHEMAS:
            raise SinkError(f"{self.label} '{self.name}': unknown kind {kind!r}")
        with self._errors(f"read dataset '{dataset}'"):
            table = self._scan(dataset, tables.SCHEMAS[kind])
            if table is None:
                return tables.empty_frame(kind)
            table = table.sort_by([(key, "ascending") for key in tables.KEYS[kind]])
            return tables.frame_from_table(table)

    # -- locks --------------------------------------------------------------------------

    def lock(self, flow: str) -> AbstractContextManager[None]:
        check_flow(flow)
        store = self.store
        if store.local:
            return flow_flock(store.path(STATE_DIR, LOCKS_DIR, f"{key_name(flow)}.lock"), flow)
        return flow_lease(
            store, store.path(STATE_DIR, LOCKS_DIR, f"{key_name(flow)}.lease.json"), flow
        )

    def _write_lock(self, dataset: str) -> str:
        """The path, without its suffix, of the dataset's commit lock (`.lock`, `.lease`)."""
        return self.store.path(STATE_DIR, LOCKS_DIR, f"{dataset}.write")

    @contextlib.contextmanager
    def _dataset_lock(self, dataset: str) -> Iterator[None]:
        """One writer per dataset at a time, whatever its flow key or node: threads here,
        processes by flock on local disk, by a lease object on object storage. Held for
        one chunk's commit only; the fetches of every writer stay parallel. On object
        storage, conditional commits alone let a merge and a write (or two writes that
        rewrite one file) both land, each keeping the rows the other rewrote."""
        with self._threads_lock:
            lock = self._thread_locks.setdefault(dataset, threading.Lock())
        with lock:
            path = self._write_lock(dataset)
            if self.store.local:
                with dataset_flock(f"{path}.lock"):
                    yield
            else:
                with dataset_lease(self.store, f"{path}.lease"):
                    yield
