"""A total deadline per request, on top of httpx's per-operation timeouts.

httpx's `read` timeout bounds each socket read, not the request: a node that sends its
headers and then one byte every few seconds keeps a request (and the run, and the flow's
lock) alive for as long as it trickles. The client sets a deadline around each request
(`request_deadline`); the network backend below caps every connect, TLS handshake, read
and write of that request at the time left before it, so the request ends with an
ordinary httpx timeout once the deadline has passed, however the bytes arrive.

The deadline is thread-local: a sync httpx client does all of one request's I/O in the
thread that sent it, and the client is shared by the engine's threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

_local = threading.local()


@dataclass(frozen=True)
class Deadline:
    """The monotonic instant a request must be complete by."""

    seconds: float
    at: float

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.at


@contextmanager
def request_deadline(seconds: float) -> Iterator[Deadline]:
    """Every socket operation in this block, in this thread, ends by `seconds` from now."""
    deadline = Deadline(seconds, time.monotonic() + seconds)
    outer = getattr(_local, "deadline", None)
    _local.deadline = deadline
    try:
        yield deadline
    finally:
        _local.deadline = outer


def _capped(timeout: float | None, expired: type[httpcore.TimeoutException]) -> float | None:
    """`timeout` cut to the time left before this thread's deadline; raises once it passed."""
    deadline: Deadline | None = getattr(_local, "deadline", None)
    if deadline is None:
        return timeout
    left = deadline.at - time.monotonic()
    if left <= 0:
        raise expired(f"request deadline of {deadline.seconds:g} s passed")
    return left if timeout is None else min(timeout, left)


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every operation is bounded by the current request's deadline."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _capped(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _capped(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        capped = _capped(timeout, httpcore.ConnectTimeout)
        return DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, capped))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network backend with each request's deadline applied to its connections."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        capped = _capped(timeout, httpcore.ConnectTimeout)
        return DeadlineStream(
            self._inner.connect_tcp(host, port, capped, local_address, socket_options)
        )

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        capped = _capped(timeout, httpcore.ConnectTimeout)
        return DeadlineStream(self._inner.connect_unix_socket(path, capped, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def deadline_transport(
    *, verify: Any, limits: httpx.Limits, proxy: str | None = None
) -> httpx.HTTPTransport:
    """httpx's own transport, its connection pool on a `DeadlineBackend`.

    httpx 0.28 has no total timeout (encode/httpx#1450) and no seam for the network
    backend, which httpcore's pool takes; the pool the transport built is given the
    wrapped backend before it opens any connection. A change of those internals fails
    here, at construction, never by silently losing the deadline. Through a `proxy` the
    pool is httpcore's proxy pool, on the same backend.
    """
    transport = httpx.HTTPTransport(
        verify=verify, limits=limits, proxy=httpx.Proxy(proxy) if proxy else None
    )
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if not isinstance(backend, httpcore.NetworkBackend):
        raise RuntimeError("httpx/httpcore internals changed: cannot apply request deadlines")
    pool._network_backend = DeadlineBackend(backend)  # type: ignore[union-attr]
    return transport
