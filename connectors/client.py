"""The node client: the reading operations of the REST interface, on one httpx.Client.

Tags, their history, alarms and the node's status, which the extraction reads; the same
request path serves the administration operations (`connectors/admin.py`) and change
subscriptions (`connectors/subscriptions.py`), which take a client.

* One sync client (pooling, keep-alive, per-request timeouts); it is thread-safe, and the
  engine's thread pool gives concurrency, bounded by `max_connections`.
* Retries (tenacity, exponential backoff with full jitter), per request, of exactly the
  `TransientNodeError`s: connection errors, timeouts, 429 (at least `Retry-After`), 502,
  503, 504, 500 unless `retry_server_errors` is off, a 200 that is a proxy's page, and a
  200 that is the node's error (`{"error": "..."}`, named in the message). A
  4xx or a malformed answer from the node is never retried. This is the only retry of a
  request; above it, only a whole chunk is re-run (`pipelines/core/engine.py`).
* Errors are `connectors.errors` types (decided in `connectors/failures.py`) naming the
  operation, the HTTP status and the start of the body. Credentials travel in headers
  only and never appear in logs, reprs or messages.
* `*_bytes` methods return the raw answer body for the extraction engine's fast path; a
  history answer is read up to the node's `max_answer_bytes` and no further
  (`AnswerTooLarge`: the fetcher asks again in smaller pieces).
"""

from __future__ import annotations

import logging
import random
import ssl
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx
import orjson
from pydantic import ValidationError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
)

from connectors import models
from connectors.answers import (
    json_of,
    model_map_of,
    model_of,
    models_of,
    number_of,
    read_capped,
    string_list,
)
from connectors.deadline import deadline_transport, request_deadline
from connectors.errors import (
    MalformedAnswer,
    NodeError,
    NotTheNodesAnswer,
    RateLimited,
    RetriesExhausted,
    TransientNodeError,
)
from connectors.failures import answered_error, is_markup, status_error, transport_error
from connectors.options import AlarmFilter, HistoryOptions
from connectors.params import encode_query, list_param, on_base
from connectors.proxy import describe_proxy
from connectors.settings import NodeSettings, SettingsError

_JITTER = random.Random()  # not the global generator, which callers may be drawing from

log = logging.getLogger("historian.client")

# Retry-After is honoured up to this many seconds per wait, so that a node asking for an
# hour cannot park a worker thread; the retry budget still bounds the attempts.
MAX_RETRY_AFTER_S = 120.0

_warned_unverified: set[str] = set()


# What this thread's requests are for (`flow f node n window ...`), named in retry warnings.
_ASKING: ContextVar[str] = ContextVar("historian_asking", default="")


@contextmanager
def asking_for(what: str) -> Iterator[None]:
    """Name what the requests made inside are for in their retry warnings (the caller
    knows the flow and the window; the client knows only the operation)."""
    token = _ASKING.set(what)
    try:
        yield
    finally:
        _ASKING.reset(token)


def _log_retry(operation: str, state: RetryCallState, attempts: int) -> None:
    """One WARNING per retry: what it is for, operation, status, attempt; never headers,
    URL or body."""
    exc = state.outcome.exception() if state.outcome else None
    status = getattr(exc, "status", None)
    message = exc.message if isinstance(exc, NodeError) else type(exc).__name__
    sleep_s = state.next_action.sleep if state.next_action else 0.0
    asking = _ASKING.get()
    log.warning(
        "%s%s: %s%s; attempt %d of %d failed, retrying in %.2fs",
        f"{asking}: " if asking else "",
        operation,
        f"HTTP {status} " if status is not None else "",
        message,
        state.attempt_number,
        attempts,
        sleep_s,
    )


def _no_tls(settings: NodeSettings, proxy: str | None) -> bool:
    """Whether no connection of this client can be TLS, with the default checks asked
    for: the node and its proxy (if any) are plain HTTP (requests go to the base URL only;
    redirects are not followed). `verify: false` and a `ca_bundle` keep their own path
    (its warning, its errors)."""
    return (
        settings.verify
        and not settings.ca_bundle
        and settings.base_url.startswith("http://")
        and (proxy is None or not proxy.lower().startswith("https://"))
    )


def _trusting_none() -> ssl.SSLContext:
    """A TLS context that verifies and trusts no certificate: for a client that makes no
    TLS connection. Loading the system's CAs costs a one-off run ~50-90 ms of CPU; this
    context would fail any TLS handshake rather than let it through unverified."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname


def _tls_verify(settings: NodeSettings) -> ssl.SSLContext | bool:
    """How the node's certificate is checked: the system's CAs, the node's `ca_bundle`, or
    not at all (`verify: false`, warned once per node name)."""
    if not settings.verify:
        if settings.name not in _warned_unverified:
            _warned_unverified.add(settings.name)
            log.warning(
                "node %s: TLS certificate verification is OFF; anyone on the path can "
                "read and alter the data",
                settings.name,
            )
        return False
    if not settings.ca_bundle:
        return True
    try:
        return ssl.create_default_context(cafile=settings.ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise SettingsError(
            f"node {settings.name}: cannot load ca_bundle {settings.ca_bundle}: "
            f"{exc.strerror or exc}"
        ) from None


def _default_transport(
    settings: NodeSettings,
    verify: ssl.SSLContext | bool,
    limits: httpx.Limits,
    proxy: str | None,
) -> httpx.BaseTransport:
    """Directly or through the node's proxy (connectors/proxy.py), on a transport that
    enforces each request's total deadline."""
    try:
        return deadline_transport(verify=verify, limits=limits, proxy=proxy)
    except ImportError:
        raise SettingsError(
            f"node {settings.name}: a SOCKS proxy needs socksio (pip install 'httpx[socks]')"
        ) from None


class NodeClient:
    """A client of one node. Use as a context manager, or call `close()`."""

    def __init__(
        self, settings: NodeSettings, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.settings = settings
        self._proxy = settings.proxy_url()
        headers = {"Accept": "application/json", "User-Agent": "historian-extract/0.1"}
        token = settings.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        credentials = settings.basic_credentials()
        auth = httpx.BasicAuth(*credentials) if credentials is not None else None
        verify = _trusting_none() if _no_tls(settings, self._proxy) else _tls_verify(settings)
        timeout = httpx.Timeout(
            settings.read_timeout_s, connect=settings.connect_timeout_s, pool=None
        )
        limits = httpx.Limits(
            max_connections=settings.max_connections,
            max_keepalive_connections=settings.max_connections,
        )
        # In-flight requests are bounded here, not only by the pool: httpcore 1.0.9's sync
        # pool can close a connection it has just handed to a *queued* request (encode/
        # httpcore#1110), which hangs that request until its read timeout or fails it with
        # EBADF. With at most `max_connections` requests in the pool, none is ever queued.
        self._slots = threading.BoundedSemaphore(settings.max_connections)
        if transport is None:
            transport = _default_transport(settings, verify, limits, self._proxy)
        self._http = httpx.Client(
            base_url=settings.base_url,
            headers=headers,
            auth=auth,
            verify=verify,
            timeout=timeout,
            limits=limits,
            transport=transport,
            follow_redirects=False,
        )
        self._base_url = httpx.URL(str(self._http.base_url).removesuffix("/") + "/")
        # The history answers the extraction reads are read up to this; see `read_capped`.
        self._max_answer = settings.max_answer_bytes

    def __repr__(self) -> str:
        return f"NodeClient(name={self.settings.name!r}, url={self.settings.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- transport, errors and retries ---------------------------------------------------

    def request(
        self,
        operation: str,
        method: str,
        resource: str,
        cmd: str,
        params: Mapping[str, Any] | None = None,
        body: object | None = None,
        *,
        max_bytes: int | None = None,
    ) -> httpx.Response:
        """One operation, retried while transient; a 200 response or a typed error.

        `settings.retries` is the number of retries after the first attempt (0: no retry).
        Exactly the `TransientNodeError`s are retried; after the last attempt the failure
        is wrapped in `RetriesExhausted` (fatal: nothing above retries it again). An answer
        longer than `max_bytes` is `AnswerTooLarge`, read no further than that.
        """
        query = encode_query({"cmd": cmd, **(params or {})})
        url = f"/{resource}?{query}"
        content = None if body is None else orjson.dumps(body)
        attempts = max(1, self.settings.retries + 1)
        retrying = Retrying(
            stop=stop_after_attempt(attempts),
            wait=self._backoff_s,
            retry=retry_if_exception_type(TransientNodeError),
            before_sleep=lambda state: _log_retry(operation, state, attempts),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self._send(operation, method, url, content, max_bytes)
        except TransientNodeError as exc:
            if attempts > 1:
                raise RetriesExhausted(exc, attempts) from None
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _backoff_s(self, state: RetryCallState) -> float:
        """Exponential backoff with full jitter; a 429 waits at least its Retry-After."""
        ceiling = min(
            self.settings.backoff_max_s,
            self.settings.backoff_base_s * (2 ** (state.attempt_number - 1)),
        )
        delay = _JITTER.uniform(0, ceiling)
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, RateLimited) and exc.retry_after_s is not None:
            delay = max(delay, min(exc.retry_after_s, MAX_RETRY_AFTER_S))
        return delay

    def _send(
        self, operation: str, method: str, url: str, content: bytes | None, max_bytes: int | None
    ) -> httpx.Response:
        """One attempt: a 200 response from the node, or the typed error of what happened."""
        headers = {"Content-Type": "application/json"} if content is not None else None
        deadline_s = self.settings.deadline_s
        try:
            target = self._absolute(url)
        except httpx.InvalidURL as exc:
            raise transport_error(operation, exc, target=self._target()) from None
        try:
            with self._slots, request_deadline(deadline_s) as deadline:
                request = self._http.build_request(method, target, content=content, headers=headers)
                response = self._http.send(request, stream=True)
                try:
                    # An error's body is read whole, as before: it says what went wrong.
                    cap = max_bytes if response.status_code == 200 else None
                    read_capped(operation, response, cap)
                finally:
                    response.close()
                    # httpx binds a response's stream to the response, a reference cycle:
                    # unbound, an answer's bytes go with the last reference to them, not
                    # at the next cyclic collection (a whole answer per request, stacked).
                    response.stream = httpx.ByteStream(b"")
        except (httpx.TransportError, httpx.DecodingError, httpx.InvalidURL) as exc:
            expired = f"the request deadline ({deadline_s:g} s)" if deadline.expired else None
            raise transport_error(
                operation, exc, target=self._target(), deadline=expired, settings=self.settings
            ) from None
        if response.status_code == 200:
            if is_markup(response.content):
                raise NotTheNodesAnswer(
                    operation, "a web page, not the node's answer", body=response.content
                )
            error = answered_error(operation, response)
            if error is not None:
                raise error
            return response
        raise status_error(operation, response, self.settings.retry_server_errors)

    def _absolute(self, url: str) -> httpx.URL:
        """`url` (relative) on the node's base URL, built once and not parsed again where
        it is what `encode_query` wrote (`on_base`): httpx parses a relative URL twice
        (alone, then joined to the base), and parsing is Python work per character of a
        history query's long percent-encoded paths."""
        resource, _, query = url.lstrip("/").partition("?")
        return on_base(self._base_url, resource, query)

    def _target(self) -> str:
        """The node's URL, and the proxy it is reached through (never its credentials)."""
        via = describe_proxy(self._proxy)
        return f"{self.settings.base_url} {via}" if via else self.settings.base_url

    # -- alarm, system -------------------------------------------------------------------------------

    def alarm_get(
        self, path: str = "/", filt: AlarmFilter | None = None
    ) -> list[models.AlarmRecord]:
        params = {"path": path, **(filt.query_params() if filt else {})}
        response = self.request("alarm.get", "GET", "alarm", "get", params)
        return models_of("alarm.get", response, models.AlarmRecord)

    def alarm_count(self, path: str = "/", filt: AlarmFilter | None = None) -> int:
        params = {"path": path, **(filt.query_params() if filt else {})}
        return number_of(
            "alarm.count", self.request("alarm.count", "GET", "alarm", "count", params)
        )

    def alarm_history_bytes(
        self, path: str, start: datetime, end: datetime, filt: AlarmFilter | None = None
    ) -> bytes:
        params = {"path": path, "start": start, "end": end, **(filt.query_params() if filt else {})}
        response = self.request(
            "alarm.history", "GET", "alarm", "history", params, max_bytes=self._max_answer
        )
        return response.content

    def alarm_history(
        self, path: str, start: datetime, end: datetime, filt: AlarmFilter | None = None
    ) -> models.AlarmHistory:
        params = {"path": path, "start": start, "end": end, **(filt.query_params() if filt else {})}
        response = self.request("alarm.history", "GET", "alarm", "history", params)
        return model_of("alarm.history", response, models.AlarmHistory)

    def system_status(self) -> models.SystemStatus:
        response = self.request("system.status", "GET", "system", "status")
        data = json_of("system.status", response)
        if isinstance(data, dict) and any("." in key for key in data):
            data = _undot(data)
        try:
            return models.SystemStatus.model_validate(data)
        except ValidationError as exc:
            raise MalformedAnswer(
                "system.status", str(exc.errors()[0]["msg"]), where="system"
            ) from None

    # -- tag ---------------------------------------------------------------------------------

    def tag_browse(
        self,
        path: str = "/",
        *,
        filter_regex: str | None = None,
        flat: bool | None = None,
        recurrent: bool | None = None,
        hide_tags: bool | None = None,
        hide_groups: bool | None = None,
    ) -> models.TagBrowse | list[Any]:
        """The tree under `path`: an object with `groups`, or an array when `flat`."""
        params = _browse_params(path, filter_regex, flat, recurrent, hide_tags, hide_groups)
        response = self.request("tag.browse", "GET", "tag", "browse", params)
        data = json_of("tag.browse", response)
        if isinstance(data, list):
            return data
        try:
            return models.TagBrowse.model_validate(data)
        except ValidationError as exc:
            raise MalformedAnswer(
                "tag.browse", str(exc.errors()[0]["msg"]), where=path, body=response.content
            ) from None

    def tag_browse_bytes(
        self,
        path: str = "/",
        *,
        filter_regex: str | None = None,
        flat: bool | None = None,
        recurrent: bool | None = None,
        hide_tags: bool | None = None,
        hide_groups: bool | None = None,
    ) -> bytes:
        """The browse answer as sent, for a reader of shapes the spec leaves open (the
        flat listing's: pipelines/selection.py)."""
        params = _browse_params(path, filter_regex, flat, recurrent, hide_tags, hide_groups)
        return self.request("tag.browse", "GET", "tag", "browse", params).content

    def tag_read(
        self, path: str, *, filter_regex: str | None = None, recurrent: bool | None = None
    ) -> models.TagRead:
        params = _tree_params(path, filter_regex, recurrent)
        return model_of(
            "tag.read", self.request("tag.read", "GET", "tag", "read", params), models.TagRead
        )

    def tag_details(
        self, path: str, *, filter_regex: str | None = None, recurrent: bool | None = None
    ) -> models.TagDetails:
        params = _tree_params(path, filter_regex, recurrent)
        response = self.request("tag.details", "GET", "tag", "details", params)
        return model_of("tag.details", response, models.TagDetails)

    def tag_details_bytes(
        self, path: str, *, filter_regex: str | None = None, recurrent: bool | None = None
    ) -> bytes:
        """The details answer as sent, for `normalise.parse_tag_details` (keyed by name)."""
        params = _tree_params(path, filter_regex, recurrent)
        return self.request("tag.details", "GET", "tag", "details", params).content

    @staticmethod
    def _history_params(
        start: datetime, end: datetime, options: HistoryOptions | None
    ) -> dict[str, Any]:
        return {"start": start, "end": end, **(options or HistoryOptions()).query_params()}

    def tag_history(
        self, path: str, start: datetime, end: datetime, options: HistoryOptions | None = None
    ) -> models.TagHistory:
        params = {"path": path, **self._history_params(start, end, options)}
        response = self.request("tag.history", "GET", "tag", "history", params)
        return model_of("tag.history", response, models.TagHistory)

    def tag_history_many_bytes(
        self, paths: Sequence[str], start: datetime, end: datetime, options: HistoryOptions
    ) -> bytes:
        params = {"paths": list_param(paths), **self._history_params(start, end, options)}
        response = self.request(
            "tag.historyMany", "GET", "tag", "historyMany", params, max_bytes=self._max_answer
        )
        return response.content

    def tag_history_many(
        self,
        paths: Sequence[str],
        start: datetime,
        end: datetime,
        options: HistoryOptions | None = None,
    ) -> models.HistoryMany:
        params = {"paths": list_param(paths), **self._history_params(start, end, options)}
        response = self.request("tag.historyMany", "GET", "tag", "historyMany", params)
        return model_map_of("tag.historyMany", response, models.TagHistory)

    def _filter_params(
        self,
        paths: Sequence[str],
        start: datetime,
        end: datetime,
        options: HistoryOptions | None,
        filter_regex: str | None,
        recurrent: bool | None,
    ) -> dict[str, Any]:
        # The spec shows `path` in the URL shape and names `paths` in the parameter list:
        # send both, so either reading finds the list (node-facts.md).
        listed = list_param(paths)
        return {
            "path": listed,
            "paths": listed,
            **self._history_params(start, end, options),
            "options.filter": filter_regex,
            "options.recurrent": recurrent,
        }

    def tag_history_filter_bytes(
        self,
        paths: Sequence[str],
        start: datetime,
        end: datetime,
        options: HistoryOptions,
        *,
        filter_regex: str | None = None,
        recurrent: bool | None = None,
    ) -> bytes:
        params = self._filter_params(paths, start, end, options, filter_regex, recurrent)
        response = self.request(
            "tag.historyFilter", "GET", "tag", "historyFilter", params, max_bytes=self._max_answer
        )
        return response.content

    def tag_history_filter(
        self,
        paths: Sequence[str],
        start: datetime,
        end: datetime,
        options: HistoryOptions | None = None,
        *,
        filter_regex: str | None = None,
        recurrent: bool | None = None,
    ) -> models.HistoryMany:
        params = self._filter_params(paths, start, end, options, filter_regex, recurrent)
        response = self.request("tag.historyFilter", "GET", "tag", "historyFilter", params)
        return model_map_of("tag.historyFilter", response, models.TagHistory)

    def tag_get_views(self) -> list[str]:
        data = json_of("tag.getViews", self.request("tag.getViews", "GET", "tag", "getViews"))
        return string_list("tag.getViews", data)


def _tree_params(path: str, filter_regex: str | None, recurrent: bool | None) -> dict[str, Any]:
    """The parameters of an operation on the tag tree under `path` (read, details)."""
    return {"path": path, "options.filter": filter_regex, "options.recurrent": recurrent}


def _browse_params(
    path: str,
    filter_regex: str | None,
    flat: bool | None,
    recurrent: bool | None,
    hide_tags: bool | None,
    hide_groups: bool | None,
) -> dict[str, Any]:
    return {
        "path": path,
        "options.filter": filter_regex,
        "options.flat": flat,
        "options.recurrent": recurrent,
        "options.hideTags": hide_tags,
        "options.hideGroups": hide_groups,
    }


def _undot(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"n3.pid": 1} -> {"n3": {"pid": 1}}: tolerate a flat rendering of nested fields."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        target = nested
        parts = key.split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = value
    return nested
