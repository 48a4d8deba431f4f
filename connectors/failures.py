"""What one failed exchange with the node means, decided once at the HTTP boundary.

A status (`status_error`) or a transport failure (`transport_error`) becomes one
`connectors.errors` type, transient or fatal; the client retries exactly the transient
ones. A 200 whose body is a web page (`is_markup`) came from something in front of the
node, a proxy's login or error page, and is transient too. An error body
(`{"error": "..."}`, `node_error_of`) is the node's own word at any status: named in the
message, and at 200 (web frameworks answer errors so) a transient `NodeAnsweredError`.
"""

from __future__ import annotations

import email.utils
import ssl
import time
from datetime import UTC

import httpx
import orjson

from connectors.errors import (
    AuthenticationError,
    NodeAnsweredError,
    NodeBusy,
    NodeConnectionError,
    NodeError,
    NodeRequestError,
    NodeServerError,
    NodeTimeout,
    NodeUnavailable,
    RateLimited,
    TLSVerificationError,
    UnknownTag,
    quoted,
)
from connectors.settings import NodeSettings

# An error body is small: one longer than this is an answer, never parsed here twice; one
# longer than ERROR_SEARCHED_BYTES is an error only when `error` is its first key (searching
# a long answer for `"error"` costs a tenth of parsing it: digits defeat the search's skips).
ERROR_BODY_MAX_BYTES = 64 * 1024
ERROR_SEARCHED_BYTES = 4 * 1024
# The keys an error envelope may hold beside `error` (Express, Fastify, Koa, Spring, ...).
_ERROR_ENVELOPE = frozenset(
    {"error", "message", "msg", "code", "status", "statusCode", "success", "ok", "details"}
    | {"stack", "timestamp", "path"}
)


def node_error_of(body: bytes) -> str | None:
    """The node's error message when `body` is an error envelope: a JSON object whose
    `error` is a non-empty string (or an object or `true` with a string `message`) and whose
    other keys are an envelope's. None for anything else, read without parsing when the
    body is long or cannot be one (the spec shows no error body: node-facts.md, Errors)."""
    head = body[:64].lstrip()
    if len(body) > ERROR_BODY_MAX_BYTES or head[:1] != b"{":
        return None
    first = head[1:].lstrip().startswith(b'"error"')
    if not first and (len(body) > ERROR_SEARCHED_BYTES or b'"error"' not in body):
        return None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not _ERROR_ENVELOPE.issuperset(data):
        return None
    error = data.get("error")
    if isinstance(error, dict):
        error = error.get("message")
    elif error is True:
        error = data.get("message")
    return error if isinstance(error, str) and error.strip() else None


def answered_error(operation: str, response: httpx.Response) -> NodeAnsweredError | None:
    """A 200 that holds the node's error instead of an answer, as a transient error."""
    message = node_error_of(response.content)
    if message is None:
        return None
    return NodeAnsweredError(operation, f"the node answered an error: {quoted(message)}")


def status_error(operation: str, response: httpx.Response, retry_server_errors: bool) -> NodeError:
    """The error a non-200 status means: transient (429, 502-504, and 500 when
    `retry_server_errors`) or fatal (every other 4xx and 5xx). An error body is named as
    the node's (`...; the node says '...'`) in place of the body's start."""
    status = response.status_code
    said = node_error_of(response.content)
    body = response.content if said is None else None
    tail = "" if said is None else f"; the node says {quoted(said)}"
    if status in (401, 403):
        return AuthenticationError(
            operation,
            f"credentials refused (check the token or user){tail}",
            status=status,
            body=body,
        )
    if status == 429:
        return RateLimited(
            operation,
            f"rate limited{tail}",
            body=body,
            retry_after_s=retry_after_seconds(response.headers.get("Retry-After")),
        )
    if status in (502, 503, 504):
        return NodeUnavailable(operation, f"node unavailable{tail}", status=status, body=body)
    if status == 404 and operation.startswith("tag."):
        return UnknownTag(operation, f"not found{tail}", status=status, body=body)
    if 400 <= status < 500:
        return NodeRequestError(operation, f"request refused{tail}", status=status, body=body)
    if status == 500 and retry_server_errors:
        return NodeBusy(operation, f"server error{tail}", status=status, body=body)
    return NodeServerError(operation, f"unexpected status {status}{tail}", status=status, body=body)


def transport_error(
    operation: str,
    exc: Exception,
    *,
    target: str,
    deadline: str | None = None,
    settings: NodeSettings | None = None,
) -> NodeError:
    """What a failed exchange means: a timeout, a broken connection, or a TLS failure or
    a URL too long to send (fatal). `target` names the node (and its proxy) as a message
    may show it; `deadline` names the request deadline if it passed; `settings` give the
    timeout a message names (and the setting that sets it)."""
    if isinstance(exc, httpx.TimeoutException):
        return _timeout(operation, exc, deadline, settings)
    if isinstance(exc, httpx.ConnectError):
        if _is_tls_failure(exc):
            return TLSVerificationError(
                operation,
                "the node's TLS certificate could not be verified; set ca_bundle to the "
                "CA that signed it",
            )
        return NodeConnectionError(operation, f"cannot connect to {target}")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return NodeConnectionError(operation, f"connection broke: {type(exc).__name__}")
    if isinstance(exc, httpx.DecodingError):
        # A compressed body that ends early: a network artefact, like a short read.
        return NodeConnectionError(operation, "answer body could not be decoded")
    if isinstance(exc, httpx.ProxyError):  # the proxy refused to open a tunnel
        return NodeConnectionError(operation, f"the proxy refused {target}: {exc}")
    if isinstance(exc, httpx.InvalidURL):  # a URL past what httpx sends (65,536 chars)
        return NodeRequestError(operation, f"request not sent: {exc}")
    return NodeConnectionError(operation, f"transport error: {type(exc).__name__}")


def _timeout(
    operation: str, exc: Exception, deadline: str | None, settings: NodeSettings | None
) -> NodeTimeout:
    """A timeout naming how long was waited, and the node setting that says so."""
    if deadline is not None:
        return NodeTimeout(
            operation, f"no complete answer within {deadline}", setting="request_deadline"
        )
    if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
        waited = f"{settings.connect_timeout_s:g} s" if settings else "the timeout"
        return NodeTimeout(operation, f"no connection within {waited}", setting="connect_timeout")
    waited = f"{settings.read_timeout_s:g} s" if settings else "the timeout"
    return NodeTimeout(operation, f"no answer within {waited}", setting="read_timeout")


def retry_after_seconds(value: str | None) -> float | None:
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


def is_markup(body: bytes) -> bool:
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
