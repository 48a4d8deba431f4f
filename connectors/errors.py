"""Errors of talking to a node, split once at the HTTP boundary: transient or fatal.

Every error names the operation (`tag.historyMany`), the HTTP status when there is one,
and the start of the answer body, so that a one-line message tells the user what failed.
Nothing here ever holds a credential: messages are built from the operation name, the
status and the body, never from headers or URLs with userinfo.
"""

from __future__ import annotations

BODY_START_CHARS = 200


def body_start(body: bytes | str | None, limit: int = BODY_START_CHARS) -> str:
    """The first characters of a body, on one line, for error messages."""
    if body is None:
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    text = " ".join(text[: limit * 2].split())
    return text[:limit] + ("..." if len(text) > limit else "")


QUOTED_CHARS = 80


def quoted(value: object, limit: int = QUOTED_CHARS) -> str:
    """A user's value as an error message quotes it: its repr, and when longer than
    `limit` characters, its start and its length (`'/Plant/xxxx'... (100,000 characters)`),
    so that a hostile value never makes a 100 KB error line."""
    if isinstance(value, str | bytes) and len(value) > limit:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:limit]!r}... ({len(value):,} {unit})"
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit for str()
        text = f"<{type(value).__name__}>"
    if len(text) > limit:
        return f"{text[:limit]}... ({len(text):,} characters)"
    return text


def one_line(exc: BaseException) -> str:
    """An exception as one line for the user: its message with whitespace collapsed."""
    return " ".join(str(exc).split()) or type(exc).__name__


class NodeError(Exception):
    """Anything that went wrong talking to the node."""

    def __init__(
        self,
        operation: str,
        message: str,
        *,
        status: int | None = None,
        body: bytes | str | None = None,
    ) -> None:
        self.operation = operation
        self.status = status
        self.body_start = body_start(body)
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        parts = [self.operation]
        if self.status is not None:
            parts.append(f"HTTP {self.status}")
        parts.append(self.message)
        if self.body_start:
            parts.append(f"body: {self.body_start}")
        return ": ".join(parts)


class TransientNodeError(NodeError):
    """Worth retrying: connection errors, timeouts, 429, 502, 503, 504."""


class NodeConnectionError(TransientNodeError):
    """The connection could not be made or broke before the answer was complete."""


class NodeTimeout(TransientNodeError):
    """No (complete) answer within the timeout."""


class NodeUnavailable(TransientNodeError):
    """502, 503 or 504: the node or a proxy in front of it is not serving now."""


class RateLimited(TransientNodeError):
    """429: the node asks us to slow down; `retry_after_s` is its Retry-After, if any."""

    def __init__(
        self,
        operation: str,
        message: str,
        *,
        status: int | None = 429,
        body: bytes | str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(operation, message, status=status, body=body)


class RetriesExhausted(NodeError):
    """A transient failure outlasted the client's retry budget; `last` is the final one."""

    def __init__(self, last: TransientNodeError, attempts: int) -> None:
        self.last = last
        self.attempts = attempts
        super().__init__(
            last.operation,
            f"gave up after {attempts} attempts: {last.message}",
            status=last.status,
            body=last.body_start,
        )


class FatalNodeError(NodeError):
    """Retrying will not help: the request, the credentials or the answer is wrong."""


class AuthenticationError(FatalNodeError):
    """401 or 403: the token or credentials were refused."""


class TLSVerificationError(FatalNodeError):
    """The node's certificate could not be verified (wrong CA, self-signed, wrong host)."""


class NodeRequestError(FatalNodeError):
    """Another 4xx: the node refused the request as asked (unknown tag, bad parameter)."""


class NodeServerError(FatalNodeError):
    """500 or another 5xx that is not known to be transient."""


class MalformedAnswer(FatalNodeError):
    """A 200 answer whose body is not what the spec shows: not JSON, truncated, wrong shape.

    `where` names the part of the answer (a tag path, a chunk) that was wrong.
    """

    def __init__(
        self,
        operation: str,
        message: str,
        *,
        where: str | None = None,
        status: int | None = None,
        body: bytes | str | None = None,
    ) -> None:
        self.where = where
        text = f"{message} (in {where})" if where else message
        super().__init__(operation, text, status=status, body=body)


class UnknownTag(FatalNodeError):
    """The node has no such tag (404, or a history answer without the tag's entry)."""
