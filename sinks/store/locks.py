"""Locks of the lake (and of Delta and Iceberg): one run per lock key, one writer per
dataset at a time.

Local disk: `fcntl.flock` on a file under `_historian/locks/`. The kernel releases it when
the holder's process dies (even by SIGKILL), so a crash never leaves a stale lock.

Object storage has no such primitive. There a flow lock is a *lease*: an object naming
its owner and an expiry, created with a conditional PUT (If-None-Match: of two runs
starting at once, exactly one creates it), renewed by a background thread while held and
deleted on exit. A killed holder's lease lapses after its time to live (`LEASE_TTL_S`,
shorter than the 90 s after which Prefect's crash automation marks a silent run Crashed,
so a backfill re-run once the crash is reported finds it lapsed); the next run then takes
it over. On S3 the takeover, the renewals and the delete are conditional on the ETag the
holder saw (`If-Match`): of two runs taking over one lapsed lease exactly one gets it, and
a holder that stalled past its time to live cannot overwrite or delete its successor's
lease. On other object stores these are a read, then the write: best effort.

A dataset's write lock on object storage (`dataset_lease`) is such a lease too, held for
one chunk's commit and deleted after it; writers of other lock keys and nodes wait their
turn, polling. A holder killed meanwhile leaves it until it expires
(`DATASET_LEASE_TTL_S`, renewed while held); then the next writer takes it over.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import IO

import orjson

from sinks.base import FlowLocked, SinkError
from sinks.store.objects import LakeStore, token

_JITTER = random.Random()  # not the global generator, which callers may be drawing from

log = logging.getLogger("historian.locks")

LEASE_TTL_S = 60.0
DATASET_LEASE_TTL_S = 30.0
# Looks at a lease that changes between a read and the write that depends on it, before
# an attempt gives up (a lease held, for its caller): never a loop on a store that keeps
# refusing a condition.
TAKEOVER_TRIES = 8
# A renewal at most this often, whatever the time to live.
RENEW_MIN_S = 0.05


def _holder() -> dict[str, object]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}


def _describe_holder(raw: bytes | None) -> str:
    if not raw:
        return ""
    try:
        info = orjson.loads(raw)
        return f" by pid {int(info['pid'])} on {str(info['host'])[:64]}"
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return ""


@contextlib.contextmanager
def flow_flock(path: str, flow: str) -> Iterator[None]:
    """Hold an exclusive flock on `path` or raise FlowLocked at once (no waiting)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handle: IO[bytes] = open(path, "a+b")  # noqa: SIM115 - held for the lock's lifetime
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _describe_holder(handle.read(4096))
            raise FlowLocked(
                f"flow '{flow}' is already running (lock held in {path}{holder})"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(orjson.dumps(_holder()))
        handle.flush()
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                handle.truncate(0)
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    finally:
        handle.close()


@contextlib.contextmanager
def dataset_flock(path: str) -> Iterator[None]:
    """Serialise writers of one dataset on local disk (waits; writes are short)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class _LeaseObject:
    """An object on object storage that names its holder and an expiry: created if none
    is there, taken over when it has lapsed, renewed by a background thread while held and
    deleted on release, each step only while the object is still this holder's.

    On S3 (`LakeStore.conditional`) that "only while" is the store's: the takeover, every
    renewal and the delete are conditional on the ETag this holder read or wrote
    (`If-Match`), so of two takers of one lapsed lease exactly one wins, and a holder that
    stalled past its time to live never overwrites or deletes its successor's lease. On
    other object stores it is a read followed by the write (the module docstring)."""

    def __init__(self, store: LakeStore, path: str, ttl_s: float, thread_name: str) -> None:
        self.store = store
        self.path = path
        self.ttl_s = ttl_s
        self.owner = token()
        self._thread_name = thread_name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._etag: str | None = None  # what this holder last wrote (conditional stores)

    def _body(self) -> bytes:
        return orjson.dumps({**_holder(), "owner": self.owner, "expires": time.time() + self.ttl_s})

    def _read(self) -> dict[str, object] | None:
        """The lease in place: None when there is none, {} when it is torn."""
        raw = self.store.read_bytes(self.path)
        if raw is None:
            return None
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return {}
        return value if isinstance(value, dict) else {}

    @staticmethod
    def _live(lease: dict[str, object] | None) -> bool:
        expires = lease.get("expires") if lease else None
        return isinstance(expires, int | float) and expires > time.time()

    def _try(self) -> dict[str, object] | None:
        """One attempt to hold the lease: None when it is ours now, else the live lease
        of another holder (its content). A lapsed or torn one is taken over."""
        current: dict[str, object] = {}
        for _ in range(TAKEOVER_TRIES):
            if self.store.create_new(self.path, self._body()):
                if self.store.conditional:
                    self._etag = self.store.etag(self.path)
                return None
            seen = self._read()
            if seen is None:
                continue  # removed since: try to create it again
            current = seen
            if self._live(current):
                return current
            if not self.store.conditional:
                self.store.remove(self.path)  # lapsed (its holder died) or torn
                continue
            # Lapsed or torn: taken over as it is now. Its ETag first, then the content
            # again: content newer than that ETag makes the conditional write fail.
            etag = self.store.etag(self.path)
            if etag is None or self._live(self._read()):
                continue
            taken = self.store.replace_if(self.path, self._body(), etag)
            if taken is not None:
                self._etag = taken
                return None
            # someone else took it over or removed it first: look again
        return current  # it kept changing under this holder: as good as held

    def _hold(self) -> None:
        self._thread = threading.Thread(target=self._renew, name=self._thread_name, daemon=True)
        self._thread.start()

    def _owned(self) -> bool:
        """Is the lease object still this holder's (a holder that stalled past its time to
        live may find another's in its place: that one it must not renew or delete)?"""
        current = self._read()
        return current is not None and current.get("owner") == self.owner

    def _renew(self) -> None:
        while not self._stop.wait(max(self.ttl_s / 4, RENEW_MIN_S)):
            with contextlib.suppress(Exception):
                if not self.store.conditional:
                    if self._owned():
                        self.store.write_bytes(self.path, self._body())
                    continue
                if self._etag is None:
                    return
                renewed = self.store.replace_if(self.path, self._body(), self._etag)
                if renewed is None:  # lapsed and taken over: it is someone else's now
                    log.warning("%s: the lease lapsed and another holder took it", self.path)
                    self._etag = None
                    return
                self._etag = renewed

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            if not self.store.conditional:
                if self._owned():
                    self.store.remove(self.path)
            elif self._etag is not None:
                self.store.remove_if(self.path, self._etag)


class Lease(_LeaseObject):
    """A flow's lease object on object storage (see the module docstring)."""

    def __init__(self, store: LakeStore, path: str, flow: str, ttl_s: float = LEASE_TTL_S) -> None:
        super().__init__(store, path, ttl_s, "lake-lease")
        self.flow = flow

    def acquire(self) -> None:
        """Hold the lease, or FlowLocked at once when another run holds it."""
        current = self._try()
        if current is not None:
            holder = _describe_holder(orjson.dumps(current))
            raise FlowLocked(
                f"flow '{self.flow}' is already running "
                f"(lease held in {self.store.display(self.path)}{holder})"
            )
        self._hold()


@contextlib.contextmanager
def flow_lease(
    store: LakeStore, path: str, flow: str, ttl_s: float = LEASE_TTL_S
) -> Iterator[None]:
    lease = Lease(store, path, flow, ttl_s)
    lease.acquire()
    try:
        yield
    finally:
        lease.release()


class DatasetLease(_LeaseObject):
    """One writer of a dataset at a time on object storage (module docstring)."""

    def __init__(self, store: LakeStore, path: str, ttl_s: float = DATASET_LEASE_TTL_S) -> None:
        super().__init__(store, path, ttl_s, "dataset-lease")

    def acquire(self, timeout_s: float) -> None:
        """Wait (polling, with jitter) until the lease is ours; SinkError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while self._try() is not None:
            if time.monotonic() > deadline:
                raise SinkError(
                    f"no turn to write in {timeout_s:.0f} s: {self.store.display(self.path)} "
                    "is held by another writer"
                )
            time.sleep(delay * _JITTER.uniform(0.5, 1.5))
            delay = min(delay * 1.5, 0.5)
        self._hold()


@contextlib.contextmanager
def dataset_lease(store: LakeStore, path: str, timeout_s: float = 600.0) -> Iterator[None]:
    """Hold a dataset's write lease on object storage for the block (waits its turn)."""
    lease = DatasetLease(store, path)
    lease.acquire(timeout_s)
    try:
        yield
    finally:
        lease.release()
