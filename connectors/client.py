"""The node client: one method per operation of the REST interface, on one httpx.Client.

* One sync client (pooling, keep-alive, per-request timeouts); it is thread-safe, and the
  engine's thread pool gives concurrency, bounded by `max_connections`.
* Retries (tenacity, exponential backoff with full jitter), per request, of exactly the
  `TransientNodeError`s: connection errors, timeouts, 429 (at least `Retry-After`), 502,
  503, 504, 500 unless `retry_server_errors` is off, and a 200 that is a proxy's page. A
  4xx or a malformed answer from the node is never retried. This is the only retry of a
  request; above it, only a whole chunk is re-run (`pipelines/core/engine.py`).
* Errors are `connectors.errors` types naming the operation, the HTTP status and the
  start of the body. Credentials travel in headers only and never appear in logs,
  reprs or messages.
* `*_bytes` methods return the raw answer body for the extraction engine's fast path.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import logging
import random
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx
import orjson
from pydantic import BaseModel, ValidationError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
)

from connectors import models
from connectors.deadline import deadline_transport, request_deadline
from connectors.errors import (
    AuthenticationError,
    MalformedAnswer,
    NodeBusy,
    NodeConnectionError,
    NodeError,
    NodeRequestError,
    NodeServerError,
    NodeTimeout,
    NodeUnavailable,
    NotTheNodesAnswer,
    RateLimited,
    RetriesExhausted,
    TLSVerificationError,
    TransientNodeError,
    UnknownTag,
)
from connectors.options import AlarmFilter, HistoryOptions
from connectors.params import encode_query, list_param
from connectors.proxy import describe_proxy
from connectors.settings import NodeSettings, SettingsError

_JITTER = random.Random()  # not the global generator, which callers may be drawing from

log = logging.getLogger("historian.client")
M = TypeVar("M", bound=BaseModel)

# Retry-After is honoured up to this many seconds per wait, so that a node asking for an
# hour cannot park a worker thread; the retry budget still bounds the attempts.
MAX_RETRY_AFTER_S = 120.0

_warned_unverified: set[str] = set()


def _log_retry(operation: str, state: RetryCallState, attempts: int) -> None:
    """One WARNING per retry: operation, status, attempt; never headers, URL or body."""
    exc = state.outcome.exception() if state.outcome else None
    status = getattr(exc, "status", None)
    message = exc.message if isinstance(exc, NodeError) else type(exc).__name__
    sleep_s = state.next_action.sleep if state.next_action else 0.0
    log.warning(
        "%s: %s%s; attempt %d of %d failed, retrying in %.2fs",
        operation,
        f"HTTP {status} " if status is not None else "",
        message,
        state.attempt_number,
        attempts,
        sleep_s,
    )


def _retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds: a number of seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:  # "-0000": UTC without a stated offset
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, moment.timestamp() - time.time())


class NodeClient:
    """A client of one node. Use as a context manager, or call `close()`."""

    def __init__(
        self, settings: NodeSettings, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.settings = settings
        self._proxy = settings.proxy_url()
        headers = {"Accept": "application/json", "User-Agent": "historian-extract/0.1"}
        token = settings.bearer_token()
        auth: httpx.BasicAuth | None = None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        credentials = settings.basic_credentials()
        if credentials is not None:
            auth = httpx.BasicAuth(*credentials)
        verify: ssl.SSLContext | bool = True
        if not settings.verify:
            verify = False
            if settings.name not in _warned_unverified:
                _warned_unverified.add(settings.name)
                log.warning(
                    "node %s: TLS certificate verification is OFF; anyone on the path can "
                    "read and alter the data",
                    settings.name,
                )
        elif settings.ca_bundle:
            try:
                verify = ssl.create_default_context(cafile=settings.ca_bundle)
            except (OSError, ssl.SSLError) as exc:
                raise SettingsError(
                    f"node {settings.name}: cannot load ca_bundle {settings.ca_bundle}: "
                    f"{exc.strerror or exc}"
                ) from None
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
            # Directly or through the node's proxy (connectors/proxy.py), on a transport
            # that enforces each request's total deadline.
            try:
                transport = deadline_transport(verify=verify, limits=limits, proxy=self._proxy)
            except ImportError:
                raise SettingsError(
                    f"node {settings.name}: a SOCKS proxy needs socksio "
                    "(pip install 'httpx[socks]')"
                ) from None
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
        self._base = str(self._http.base_url).removesuffix("/") + "/"

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
    ) -> httpx.Response:
        """One operation, retried while transient; a 200 response or a typed error.

        `settings.retries` is the number of retries after the first attempt (0: no retry).
        Exactly the `TransientNodeError`s are retried; after the last attempt the failure
        is wrapped in `RetriesExhausted` (fatal: nothing above retries it again).
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
                    return self._send(operation, method, url, content)
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

    def _send(self, operation: str, method: str, url: str, content: bytes | None) -> httpx.Response:
        """One attempt: a 200 response from the node, or the typed error of what happened."""
        headers = {"Content-Type": "application/json"} if content is not None else None
        deadline_s = self.settings.deadline_s
        try:
            target = self._absolute(url)
        except httpx.InvalidURL as exc:
            raise self._transport_error(operation, exc, None) from None
        try:
            with self._slots, request_deadline(deadline_s) as deadline:
                response = self._http.request(method, target, content=content, headers=headers)
        except (httpx.TransportError, httpx.DecodingError, httpx.InvalidURL) as exc:
            expired = f"the request deadline ({deadline_s:g} s)" if deadline.expired else None
            raise self._transport_error(operation, exc, expired) from None
        if response.status_code == 200:
            if _is_markup(response.content):
                raise NotTheNodesAnswer(
                    operation, "a web page, not the node's answer", body=response.content
                )
            return response
        raise _status_error(operation, response, self.settings.retry_server_errors)

    def _absolute(self, url: str) -> httpx.URL:
        """`url` (relative) on the node's base URL, parsed once: httpx parses a relative URL
        twice (alone, then joined to the base), and parsing is Python work per character of
        a history query's long percent-encoded paths."""
        return httpx.URL(f"{self._base}{url.lstrip('/')}")

    def _transport_error(self, operation: str, exc: Exception, deadline: str | None) -> NodeError:
        """What a failed exchange means: a timeout, a broken connection, or a TLS failure or
        a URL too long to send (fatal). `deadline` names the request deadline if it passed."""
        if isinstance(exc, httpx.TimeoutException):
            if deadline is not None:
                return NodeTimeout(operation, f"no complete answer within {deadline}")
            return NodeTimeout(operation, "no answer within the timeout")
        if isinstance(exc, httpx.ConnectError):
            if _is_tls_failure(exc):
                return TLSVerificationError(
                    operation,
                    "the node's TLS certificate could not be verified; set ca_bundle to the "
                    "CA that signed it",
                )
            return NodeConnectionError(operation, f"cannot connect to {self._target()}")
        if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
            return NodeConnectionError(operation, f"connection broke: {type(exc).__name__}")
        if isinstance(exc, httpx.DecodingError):
            # A compressed body that ends early: a network artefact, like a short read.
            return NodeConnectionError(operation, "answer body could not be decoded")
        if isinstance(exc, httpx.ProxyError):  # the proxy refused to open a tunnel
            return NodeConnectionError(operation, f"the proxy refused {self._target()}: {exc}")
        if isinstance(exc, httpx.InvalidURL):  # a URL past what httpx sends (65,536 chars)
            return NodeRequestError(operation, f"request not sent: {exc}")
        return NodeConnectionError(operation, f"transport error: {type(exc).__name__}")

    def _target(self) -> str:
        """The node's URL, and the proxy it is reached through (never its credentials)."""
        via = describe_proxy(self._proxy)
        return f"{self.settings.base_url} {via}" if via else self.settings.base_url

    # -- decoding --------------------------------------------------------------------------

    def _json(self, operation: str, response: httpx.Response) -> Any:
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise MalformedAnswer(
                operation, "answer is not JSON", where=operation, body=response.content
            ) from None

    def _model(self, operation: str, response: httpx.Response, model: type[M]) -> M:
        data = self._json(operation, response)
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or operation
            raise MalformedAnswer(
                operation,
                f"unexpected answer shape: {first['msg']}",
                where=where,
                body=response.content,
            ) from None

    def _models(self, operation: str, response: httpx.Response, model: type[M]) -> list[M]:
        data = self._json(operation, response)
        if not isinstance(data, list):
            raise MalformedAnswer(
                operation, "answer is not an array", where=operation, body=response.content
            )
        try:
            return [model.model_validate(item) for item in data]
        except ValidationError as exc:
            raise MalformedAnswer(
                operation, f"unexpected element: {exc.errors()[0]['msg']}", where=operation
            ) from None

    def _model_map(self, operation: str, response: httpx.Response, model: type[M]) -> dict[str, M]:
        data = self._json(operation, response)
        if not isinstance(data, dict):
            raise MalformedAnswer(
                operation, "answer is not an object", where=operation, body=response.content
            )
        try:
            return {key: model.model_validate(value) for key, value in data.items()}
        except ValidationError as exc:
            raise MalformedAnswer(
                operation, f"unexpected entry: {exc.errors()[0]['msg']}", where=operation
            ) from None

    def _number(self, operation: str, response: httpx.Response) -> int:
        text = response.text.strip()
        try:
            value = orjson.loads(text) if text else None
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise MalformedAnswer(
                operation, "answer is not a plain number", where=operation, body=text
            )
        return int(value)

    def _empty(self, operation: str, response: httpx.Response) -> None:
        """Operations that return nothing: an empty body (a JSON null or {} is tolerated)."""
        if response.content.strip() not in (b"", b"null", b"{}", b'""'):
            log.debug(
                "%s: ignored a non-empty answer of %d bytes", operation, len(response.content)
            )

    def _base64_zip(self, operation: str, response: httpx.Response) -> bytes:
        text = response.text.strip()
        if text.startswith('"'):
            with contextlib.suppress(orjson.JSONDecodeError):
                text = orjson.loads(text)
        try:
            data = base64.b64decode(text, validate=True)
        except (ValueError, TypeError):
            raise MalformedAnswer(
                operation, "answer is not Base64 text", where=operation, body=text
            ) from None
        if not data.startswith(b"PK"):
            raise MalformedAnswer(operation, "answer is not a Base64 ZIP archive", where=operation)
        return data

    def _json_string(self, operation: str, response: httpx.Response) -> Any:
        """'JSON string' answers: a JSON-encoded string holding a JSON document (or the doc)."""
        data = self._json(operation, response)
        if isinstance(data, str):
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                return data
        return data

    # -- alarm -------------------------------------------------------------------------------

    def alarm_get(
        self, path: str = "/", filt: AlarmFilter | None = None
    ) -> list[models.AlarmRecord]:
        params = {"path": path, **(filt.query_params() if filt else {})}
        response = self.request("alarm.get", "GET", "alarm", "get", params)
        return self._models("alarm.get", response, models.AlarmRecord)

    def alarm_count(self, path: str = "/", filt: AlarmFilter | None = None) -> int:
        params = {"path": path, **(filt.query_params() if filt else {})}
        return self._number(
            "alarm.count", self.request("alarm.count", "GET", "alarm", "count", params)
        )

    def alarm_history_bytes(
        self, path: str, start: datetime, end: datetime, filt: AlarmFilter | None = None
    ) -> bytes:
        params = {"path": path, "start": start, "end": end, **(filt.query_params() if filt else {})}
        return self.request("alarm.history", "GET", "alarm", "history", params).content

    def alarm_history(
        self, path: str, start: datetime, end: datetime, filt: AlarmFilter | None = None
    ) -> models.AlarmHistory:
        params = {"path": path, "start": start, "end": end, **(filt.query_params() if filt else {})}
        response = self.request("alarm.history", "GET", "alarm", "history", params)
        return self._model("alarm.history", response, models.AlarmHistory)

    def alarm_ack(self, paths: Sequence[str], msg: str | None = None) -> None:
        body: dict[str, Any] = {"paths": list(paths)}
        if msg is not None:
            body["msg"] = msg
        self._empty("alarm.ack", self.request("alarm.ack", "POST", "alarm", "ack", body=body))

    # -- backup ------------------------------------------------------------------------------

    def backup_get(self) -> dict[str, models.Backup]:
        response = self.request("backup.get", "GET", "backup", "get")
        return self._model_map("backup.get", response, models.Backup)

    def backup_export(self, name: str) -> bytes:
        response = self.request("backup.export", "GET", "backup", "export", {"name": name})
        return self._base64_zip("backup.export", response)

    def backup_create(self, name: str, description: str | None = None) -> None:
        body: dict[str, Any] = {"name": name}
        if description is not None:
            body["metadata"] = {"description": description}
        self._empty(
            "backup.create", self.request("backup.create", "POST", "backup", "create", body=body)
        )

    def backup_rename(self, name: str, new_name: str) -> None:
        body = {"name": name, "rename": new_name}
        self._empty(
            "backup.rename", self.request("backup.rename", "POST", "backup", "rename", body=body)
        )

    def backup_delete(self, name: str) -> None:
        self._empty(
            "backup.delete",
            self.request("backup.delete", "POST", "backup", "delete", body={"name": name}),
        )

    def backup_import(self, name: str, data: bytes | str) -> None:
        text = base64.b64encode(data).decode() if isinstance(data, bytes) else data
        body = {"name": name, "data": text}
        self._empty(
            "backup.import", self.request("backup.import", "POST", "backup", "import", body=body)
        )

    def backup_load(self, name: str) -> models.BackupLoadResult:
        response = self.request("backup.load", "POST", "backup", "load", body={"name": name})
        return self._model("backup.load", response, models.BackupLoadResult)

    # -- certificate ---------------------------------------------------------------------------

    @staticmethod
    def _cert_options(
        module_name: str | None, cert_type: str | None, cert_id: str | None = None
    ) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if module_name is not None:
            options["options.moduleName"] = module_name
        if cert_type is not None:
            options["options.type"] = cert_type
        if cert_id is not None:
            options["options.id"] = cert_id
        return options

    def certificate_get(
        self, cert_type: str | None = None, module_name: str | None = None
    ) -> list[models.Certificate]:
        params = self._cert_options(module_name, cert_type)
        response = self.request("certificate.get", "GET", "certificate", "get", params)
        return self._models("certificate.get", response, models.Certificate)

    def certificate_export(
        self, cert_id: str, cert_type: str | None = None, module_name: str | None = None
    ) -> bytes:
        """The certificate content (the node answers a JSON string of Base64)."""
        params = self._cert_options(module_name, cert_type, cert_id)
        response = self.request("certificate.export", "GET", "certificate", "export", params)
        text = self._json("certificate.export", response)
        if not isinstance(text, str):
            raise MalformedAnswer(
                "certificate.export", "answer is not a JSON string", where=cert_id
            )
        try:
            return base64.b64decode(text, validate=True)
        except (ValueError, TypeError):
            raise MalformedAnswer(
                "certificate.export", "answer is not Base64", where=cert_id
            ) from None

    def certificate_set(
        self,
        cert_id: str,
        action: str,
        cert_type: str | None = None,
        module_name: str | None = None,
    ) -> None:
        if action not in ("trust", "untrust"):
            raise ValueError(f"action {action!r} is not trust or untrust")
        options = {**_certificate(cert_id, cert_type, module_name), "action": action}
        response = self.request(
            "certificate.set", "POST", "certificate", "set", body={"options": options}
        )
        self._empty("certificate.set", response)

    def certificate_remove(
        self, cert_id: str, cert_type: str | None = None, module_name: str | None = None
    ) -> None:
        options = _certificate(cert_id, cert_type, module_name)
        response = self.request(
            "certificate.remove", "POST", "certificate", "remove", body={"options": options}
        )
        self._empty("certificate.remove", response)

    # -- module ------------------------------------------------------------------------------

    def module_details(self) -> models.ModuleDetails:
        response = self.request("module.details", "GET", "module", "details")
        return self._model("module.details", response, models.ModuleDetails)

    def module_get_installed(self) -> list[str]:
        data = self._json(
            "module.getInstalled",
            self.request("module.getInstalled", "GET", "module", "getInstalled"),
        )
        return _string_list("module.getInstalled", data)

    def module_get_instances(self, names: Sequence[str] | None = None) -> list[str]:
        params = {"filter": list_param(names)} if names else None
        response = self.request("module.getInstances", "GET", "module", "getInstances", params)
        return _string_list("module.getInstances", self._json("module.getInstances", response))

    def module_get_config_list(
        self, module_type: str | None = None
    ) -> dict[str, models.ConfigListEntry]:
        params = {"moduleType": module_type} if module_type else None
        response = self.request("module.getConfigList", "GET", "module", "getConfigList", params)
        return self._model_map("module.getConfigList", response, models.ConfigListEntry)

    def module_get_config_present(self, module_name: str | None = None) -> dict[str, bool]:
        params = {"moduleName": module_name} if module_name else None
        response = self.request(
            "module.getConfigPresent", "GET", "module", "getConfigPresent", params
        )
        data = self._json("module.getConfigPresent", response)
        if not isinstance(data, dict):
            raise MalformedAnswer(
                "module.getConfigPresent", "answer is not an object", where="module"
            )
        return {str(key): bool(value) for key, value in data.items()}

    def module_get_config_data(self, config_name: str, module_name: str | None = None) -> Any:
        params: dict[str, Any] = {"configName": config_name}
        if module_name:
            params["moduleName"] = module_name
        response = self.request("module.getConfigData", "GET", "module", "getConfigData", params)
        return self._json_string("module.getConfigData", response)

    def _module_post(self, cmd: str, module_name: str) -> None:
        operation = f"module.{cmd}"
        self._empty(
            operation,
            self.request(operation, "POST", "module", cmd, body={"moduleName": module_name}),
        )

    def module_start(self, module_name: str) -> None:
        self._module_post("start", module_name)

    def module_stop(self, module_name: str) -> None:
        self._module_post("stop", module_name)

    def module_restart(self, module_name: str) -> None:
        self._module_post("restart", module_name)

    def module_set_config_data(
        self,
        module_name: str,
        config_name: str,
        data: str | Mapping[str, Any],
        *,
        restart: bool | None = None,
        delete_data: Sequence[str] | None = None,
    ) -> None:
        text = data if isinstance(data, str) else orjson.dumps(data).decode()
        body: dict[str, Any] = {"moduleName": module_name, "configName": config_name, "data": text}
        options: dict[str, Any] = {}
        if restart is not None:
            options["restart"] = restart
        if delete_data:
            options["deleteData"] = list(delete_data)
        if options:
            body["options"] = options
        response = self.request(
            "module.setConfigData", "POST", "module", "setConfigData", body=body
        )
        self._empty("module.setConfigData", response)

    # -- link, license, log, redundancy, system ------------------------------------------------

    def link_get(self, remote_node: str | Sequence[str] | None = None) -> models.Links:
        params: dict[str, Any] = {}
        if remote_node is not None:
            params["options.remoteNode"] = (
                remote_node if isinstance(remote_node, str) else list_param(remote_node)
            )
        return self._model(
            "link.get", self.request("link.get", "GET", "link", "get", params), models.Links
        )

    def license_get_uid(self) -> models.NodeUid:
        response = self.request("license.getUid", "GET", "license", "getUid")
        return self._model("license.getUid", response, models.NodeUid)

    def license_get(self) -> list[models.LicenseFile]:
        response = self.request("license.get", "GET", "license", "get")
        return self._models("license.get", response, models.LicenseFile)

    def license_read(self, name: str) -> Any:
        response = self.request("license.read", "GET", "license", "read", {"name": name})
        return self._json_string("license.read", response)

    def license_add(self, data: str | Mapping[str, Any]) -> None:
        text = data if isinstance(data, str) else orjson.dumps(data).decode()
        self._empty(
            "license.add",
            self.request("license.add", "POST", "license", "add", body={"data": text}),
        )

    def license_remove(self, name: str) -> None:
        response = self.request("license.remove", "POST", "license", "remove", body={"name": name})
        self._empty("license.remove", response)

    def log_browse(self) -> models.LogBrowse:
        """Log files per module as (date, integer) pairs (`/log/?cmd=browse`)."""
        data = self._json("log.browse", self.request("log.browse", "GET", "log/", "browse"))
        if not isinstance(data, dict):
            raise MalformedAnswer("log.browse", "answer is not an object", where="log")
        result: models.LogBrowse = {}
        for module, pairs in data.items():
            try:
                result[str(module)] = [(str(day), int(size)) for day, size in pairs]
            except (TypeError, ValueError):
                raise MalformedAnswer(
                    "log.browse", "entry is not a list of [date, integer]", where=str(module)
                ) from None
        return result

    def log_export(self, selection: Sequence[str]) -> bytes:
        response = self.request(
            "log.export", "GET", "log/", "export", {"selection": list_param(selection)}
        )
        return self._base64_zip("log.export", response)

    def redundancy_status(self) -> models.RedundancyStatus:
        response = self.request("redundancy.status", "GET", "redundancy", "status")
        return self._model("redundancy.status", response, models.RedundancyStatus)

    def system_status(self) -> models.SystemStatus:
        response = self.request("system.status", "GET", "system", "status")
        data = self._json("system.status", response)
        if isinstance(data, dict) and any("." in key for key in data):
            data = _undot(data)
        try:
            return models.SystemStatus.model_validate(data)
        except ValidationError as exc:
            raise MalformedAnswer(
                "system.status", str(exc.errors()[0]["msg"]), where="system"
            ) from None

    def system_error_count(self) -> int:
        return self._number(
            "system.errorCount", self.request("system.errorCount", "GET", "system", "errorCount")
        )

    def system_restart_service(self) -> None:
        response = self.request("system.restartService", "POST", "system", "restartService")
        self._empty("system.restartService", response)

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
        params = {
            "path": path,
            "options.filter": filter_regex,
            "options.flat": flat,
            "options.recurrent": recurrent,
            "options.hideTags": hide_tags,
            "options.hideGroups": hide_groups,
        }
        response = self.request("tag.browse", "GET", "tag", "browse", params)
        data = self._json("tag.browse", response)
        if isinstance(data, list):
            return data
        try:
            return models.TagBrowse.model_validate(data)
        except ValidationError as exc:
            raise MalformedAnswer(
                "tag.browse", str(exc.errors()[0]["msg"]), where=path, body=response.content
            ) from None

    def tag_read(
        self, path: str, *, filter_regex: str | None = None, recurrent: bool | None = None
    ) -> models.TagRead:
        params = {"path": path, "options.filter": filter_regex, "options.recurrent": recurrent}
        return self._model(
            "tag.read", self.request("tag.read", "GET", "tag", "read", params), models.TagRead
        )

    def tag_details(
        self, path: str, *, filter_regex: str | None = None, recurrent: bool | None = None
    ) -> models.TagDetails:
        params = {"path": path, "options.filter": filter_regex, "options.recurrent": recurrent}
        response = self.request("tag.details", "GET", "tag", "details", params)
        return self._model("tag.details", response, models.TagDetails)

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
        return self._model("tag.history", response, models.TagHistory)

    def tag_history_many_bytes(
        self, paths: Sequence[str], start: datetime, end: datetime, options: HistoryOptions
    ) -> bytes:
        params = {"paths": list_param(paths), **self._history_params(start, end, options)}
        return self.request("tag.historyMany", "GET", "tag", "historyMany", params).content

    def tag_history_many(
        self,
        paths: Sequence[str],
        start: datetime,
        end: datetime,
        options: HistoryOptions | None = None,
    ) -> models.HistoryMany:
        params = {"paths": list_param(paths), **self._history_params(start, end, options)}
        response = self.request("tag.historyMany", "GET", "tag", "historyMany", params)
        return self._model_map("tag.historyMany", response, models.TagHistory)

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
        return self.request("tag.historyFilter", "GET", "tag", "historyFilter", params).content

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
        return self._model_map("tag.historyFilter", response, models.TagHistory)

    def tag_get_views(self) -> list[str]:
        data = self._json("tag.getViews", self.request("tag.getViews", "GET", "tag", "getViews"))
        return _string_list("tag.getViews", data)

    def tag_write(self, path: str, value: float | bool | str) -> None:
        self._empty(
            "tag.write",
            self.request("tag.write", "POST", "tag", "write", body={"path": path, "value": value}),
        )

    def tag_write_many(self, values: Mapping[str, float | bool | str]) -> None:
        """`paths` is a comma-separated string (spec); paths holding a comma cannot be written here."""
        for path in values:
            if "," in path:
                raise ValueError(f"tag path {path!r} holds a comma: write it with tag_write")
        body = {"paths": ",".join(values), "values": list(values.values())}
        self._empty(
            "tag.writeMany", self.request("tag.writeMany", "POST", "tag", "writeMany", body=body)
        )

    def tag_subscribe(self, data: Any = None) -> models.Subscription:
        body = {"data": data} if data is not None else None
        response = self.request("tag.subscribe", "POST", "tag", "subscribe", body=body)
        return self._model("tag.subscribe", response, models.Subscription)

    def tag_subscriptions(self) -> list[models.SubscriptionRecord]:
        response = self.request("tag.subscriptions", "GET", "tag", "subscriptions")
        return self._models("tag.subscriptions", response, models.SubscriptionRecord)

    def tag_subscription_events(
        self, subscription_id: int, limit: int | None = None
    ) -> models.SubscriptionEvents:
        params = {"id": subscription_id, "limit": limit}
        response = self.request(
            "tag.subscriptionEvents", "GET", "tag/", "subscriptionEvents", params
        )
        data = self._json("tag.subscriptionEvents", response)
        if not isinstance(data, dict):
            raise MalformedAnswer(
                "tag.subscriptionEvents", "answer is not an object", where="events"
            )
        events: list[Any] = []
        for event in data.get("events") or []:
            kind = event.get("type") if isinstance(event, dict) else None
            try:
                if kind == "tag":
                    events.append(models.TagEvent.model_validate(event))
                elif kind == "model":
                    events.append(models.ModelEvent.model_validate(event))
                else:
                    events.append(event)
            except ValidationError as exc:
                raise MalformedAnswer(
                    "tag.subscriptionEvents",
                    f"unexpected event: {exc.errors()[0]['msg']}",
                    where="events",
                ) from None
        try:
            return models.SubscriptionEvents(
                discarded_events=data.get("discardedEvents") or 0,
                remaining_events=data.get("remainingEvents") or 0,
                events=events,
            )
        except ValidationError as exc:
            raise MalformedAnswer(
                "tag.subscriptionEvents", str(exc.errors()[0]["msg"]), where="counts"
            ) from None

    def tag_cancel_subscription(self, subscription_id: int) -> None:
        response = self.request(
            "tag.cancelSubscription",
            "POST",
            "tag/",
            "cancelSubscription",
            body={"id": subscription_id},
        )
        self._empty("tag.cancelSubscription", response)


def _string_list(operation: str, data: Any) -> list[str]:
    if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
        raise MalformedAnswer(operation, "answer is not an array of strings", where=operation)
    return list(data)


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


def _certificate(cert_id: str, cert_type: str | None, module_name: str | None) -> dict[str, Any]:
    """The options naming one certificate (type and module only when given)."""
    options: dict[str, Any] = {"id": cert_id}
    if module_name is not None:
        options["moduleName"] = module_name
    if cert_type is not None:
        options["type"] = cert_type
    return options


def _status_error(operation: str, response: httpx.Response, retry_server_errors: bool) -> NodeError:
    """The error a non-200 status means: transient (429, 502-504, and 500 when
    `retry_server_errors`) or fatal (every other 4xx and 5xx)."""
    status = response.status_code
    body = response.content
    if status in (401, 403):
        return AuthenticationError(
            operation, "credentials refused (check the token or user)", status=status, body=body
        )
    if status == 429:
        return RateLimited(
            operation,
            "rate limited",
            body=body,
            retry_after_s=_retry_after_seconds(response.headers.get("Retry-After")),
        )
    if status in (502, 503, 504):
        return NodeUnavailable(operation, "node unavailable", status=status, body=body)
    if status == 404 and operation.startswith("tag."):
        return UnknownTag(operation, "not found", status=status, body=body)
    if 400 <= status < 500:
        return NodeRequestError(operation, "request refused", status=status, body=body)
    if status == 500 and retry_server_errors:
        return NodeBusy(operation, "server error", status=status, body=body)
    return NodeServerError(operation, f"unexpected status {status}", status=status, body=body)


def _is_markup(body: bytes) -> bool:
    """Does the body start like an HTML or XML page? No answer of the node does (JSON,
    Base64 or plain numbers), so such a 200 came from something in front of it. Only the
    first bytes are read: the check costs nothing on a large answer."""
    return body[:64].lstrip()[:1] == b"<"


def _is_tls_failure(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        if isinstance(current, ssl.SSLError):
            return True
        current = current.__cause__ or current.__context__
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)
