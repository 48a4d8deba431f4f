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
it over (that takeover is the one best-effort step: two runs taking over the
same lapsed lease at one instant may both delete and recreate it).

A dataset's write lock on object storage (`dataset_lease`) is such a lease too, held for
one chunk's commit and deleted after it; writers of other lock keys and nodes wait their
turn, polling. A holder killed meanwhile leaves it until it expires
(`DATASET_LEASE_TTL_S`, renewed while held); then the next writer takes it over.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import IO

import orjson

from sinks.base import FlowLocked, SinkError
from sinks.lake_store import LakeStore, token

LEASE_TTL_S = 60.0
DATASET_LEASE_TTL_S = 30.0


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


class Lease:
    """A flow's lease object on object storage (see the module docstring)."""

    def __init__(self, store: LakeStore, path: str, flow: str, ttl_s: float = LEASE_TTL_S) -> None:
        self.store = store
        self.path = path
        self.flow = flow
        self.ttl_s = ttl_s
        self.owner = token()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return orjson.dumps({**_holder(), "owner": self.owner, "expires": time.time() + self.ttl_s})

    def _current(self) -> dict[str, object] | None:
        raw = self.store.read_bytes(self.path)
        if raw is None:
            return None
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None

    def _refuse(self, current: dict[str, object]) -> FlowLocked:
        holder = _describe_holder(orjson.dumps(current))
        return FlowLocked(
            f"flow '{self.flow}' is already running "
            f"(lease held in {self.store.display(self.path)}{holder})"
        )

    def acquire(self) -> None:
        while not self.store.create_new(self.path, self._body()):
            current = self._current()
            expires = current.get("expires") if current else None
            if current and isinstance(expires, int | float) and expires > time.time():
                raise self._refuse(current)
            self.store.remove(self.path)  # lapsed (its holder died) or torn: take it over
        self._thread = threading.Thread(target=self._renew, name="lake-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            with contextlib.suppress(Exception):
                current = self._current()
                if current and current.get("owner") == self.owner:
                    self.store.write_bytes(self.path, self._body())

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            current = self._current()
            if current and current.get("owner") == self.owner:
                self.store.remove(self.path)


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


class DatasetLease:
    """One writer of a dataset at a time on object storage (module docstring)."""

    def __init__(self, store: LakeStore, path: str, ttl_s: float = DATASET_LEASE_TTL_S) -> None:
        self.store = store
        self.path = path
        self.ttl_s = ttl_s
        self.owner = token()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return orjson.dumps({**_holder(), "owner": self.owner, "expires": time.time() + self.ttl_s})

    def _owned(self) -> bool:
        """Is the lease object still this holder's? A holder that stalled past its time to
        live may find another writer's lease in its place: that one it must not renew or
        delete."""
        raw = self.store.read_bytes(self.path)
        try:
            return raw is not None and orjson.loads(raw).get("owner") == self.owner
        except (orjson.JSONDecodeError, AttributeError):
            return False

    def _expired(self) -> bool:
        raw = self.store.read_bytes(self.path)
        if raw is None:
            return False
        try:
            expires = orjson.loads(raw).get("expires")
        except (orjson.JSONDecodeError, AttributeError):
            return True
        return not isinstance(expires, int | float) or expires < time.time()

    def acquire(self, timeout_s: float) -> None:
        """Wait (polling, with jitter) until the lease is ours; SinkError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while not self.store.create_new(self.path, self._body()):
            if self._expired():  # its holder died: take it over
                self.store.remove(self.path)
                continue
            if time.monotonic() > deadline:
                raise SinkError(
                    f"no turn to write in {timeout_s:.0f} s: {self.store.display(self.path)} "
                    "is held by another writer"
                )
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 1.5, 0.5)
        self._thread = threading.Thread(target=self._renew, name="dataset-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            with contextlib.suppress(Exception):
                if self._owned():
                    self.store.write_bytes(self.path, self._body())

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            if self._owned():
                self.store.remove(self.path)


@contextlib.contextmanager
def dataset_lease(store: LakeStore, path: str, timeout_s: float = 600.0) -> Iterator[None]:
    """Hold a dataset's write lease on object storage for the block (waits its turn)."""
    lease = DatasetLease(store, path)
    lease.acquire(timeout_s)
    try:
        yield
    finally:
        lease.release()
