"""Errors of talking to a node, split once: every one is transient or fatal, never both.

* `TransientNodeError`: the same request may succeed if asked again unchanged (the network,
  a proxy, a node under load). The client retries it, per request, within its budget.
* `FatalNodeError`: asking again unchanged will not help (the request, the credentials,
  the answer, or a transient failure that already outlasted the client's retries:
  `RetriesExhausted`). The client does not retry it; neither does anything above it.

Who retries what, per layer, is written down once in docs/architecture.md ("Retries").

Every error names the operation (`tag.historyMany`), the HTTP status when there is one,
and the start of the answer body, so that a one-line message tells the user what failed.
Nothing here ever holds a credential: messages are built from the operation name, the
status and the body, never from headers or URLs with userinfo.
"""

from __future__ import annotations

import re

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


# A run of text with no space longer than a quoted value may be, and the length that
# `quoted` puts after a value it already cut (such a run is left as it is).
_LONG_RUN = re.compile(rf"(\S{{{QUOTED_CHARS + 1},}})( \([\d,]+ (?:characters|bytes)\))?")


def cut_values(text: str) -> str:
    """`text` with every run of more than QUOTED_CHARS non-space characters that `quoted`
    did not already cut cut the same way (its start and its length): the last guard on
    an error line, for values put in a message from wherever (a path in an OSError, a
    name in a library's message)."""

    def cut(match: re.Match[str]) -> str:
        run, length = match.groups()
        if length is not None:
            return match.group(0)
        return f"{run[:QUOTED_CHARS]}... ({len(run):,} characters)"

    return _LONG_RUN.sub(cut, text)


def one_line(exc: BaseException) -> str:
    """An exception as one line for the user: its message with whitespace collapsed and
    long values cut (`cut_values`)."""
    return cut_values(" ".join(str(exc).split())) or type(exc).__name__


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
    """Worth asking again, unchanged: connection errors, timeouts, 429, 502, 503, 504, a
    500 from a node under load, a proxy's page in place of the answer."""


class NodeConnectionError(TransientNodeError):
    """The connection could not be made or broke before the answer was complete."""


class NodeTimeout(TransientNodeError):
    """No (complete) answer within the timeout; `setting` is the node's key that sets it
    (read_timeout, connect_timeout or request_deadline)."""

    def __init__(self, operation: str, message: str, *, setting: str = "read_timeout") -> None:
        self.setting = setting
        super().__init__(operation, message)


class NodeUnavailable(TransientNodeError):
    """502, 503 or 504: the node or a proxy in front of it is not serving now."""


class NodeBusy(TransientNodeError):
    """500 from a node whose server errors are retried (`retry_server_errors`, the default).

    The spec says nothing about 500; a node under load answers it and then succeeds on the
    next try, so retrying it (bounded) loses less than failing the chunk. A deterministic
    500 costs only the retry budget. With the setting off, a 500 is a `NodeServerError`.
    """


class NotTheNodesAnswer(TransientNodeError):
    """A 200 whose body is a markup page (a proxy's or a portal's), not the node's JSON:
    the request did not reach the node, so the next try may."""


class NodeAnsweredError(TransientNodeError):
    """A 200 whose body is the node's own error (`{"error": "..."}`, as web frameworks
    answer): not the answer asked for, and a node that says so with 200 says nothing of
    its cause, so it is asked again (bounded), then named (`connectors/failures.py`)."""


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


class FatalNodeError(NodeError):
    """Retrying will not help: the request, the credentials or the answer is wrong, or the
    client's retries are spent."""


class RetriesExhausted(FatalNodeError):
    """A transient failure that outlasted the client's retry budget; `last` is the final one.

    Fatal by design: the client already asked again with backoff, so a retry above it (a
    chunk re-run) would multiply the attempts on a node that is down.
    """

    def __init__(self, last: TransientNodeError, attempts: int, advice: str = "") -> None:
        self.last = last
        self.attempts = attempts
        super().__init__(
            last.operation,
            f"gave up after {attempts} attempts: {last.message}"
            + (f"; {advice}" if advice else ""),
            status=last.status,
            body=last.body_start,
        )

    def advised(self, advice: str) -> RetriesExhausted:
        """The same failure, its message ending with what to change."""
        return RetriesExhausted(self.last, self.attempts, advice)


class AuthenticationError(FatalNodeError):
    """401 or 403: the token or credentials were refused."""


class TLSVerificationError(FatalNodeError):
    """The node's certificate could not be verified (wrong CA, self-signed, wrong host)."""


class NodeRequestError(FatalNodeError):
    """Another 4xx: the node refused the request as asked (unknown tag, bad parameter)."""


class SubscriptionGone(NodeRequestError):
    """The node does not know the subscription (404 to `subscriptionEvents` or
    `cancelSubscription`): cancelled, or lost when the node restarted. Its events since
    the last poll are lost; subscribe again."""


class NodeServerError(FatalNodeError):
    """A 5xx not known to be transient: 501, 505, ..., and 500 when server errors are not
    retried (`retry_server_errors: false`)."""


class MalformedAnswer(FatalNodeError):
    """A 200 answer from the node whose body is not what the spec shows: not JSON, cut
    short, wrong shape. Never asked again: the node answered, and would answer alike.

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


class AnswerTooLarge(FatalNodeError):
    """A history answer longer than the node's `max_answer_bytes`, left unread past it.

    Not retried: the same question gets the same answer. The fetcher asks again in smaller
    pieces (`connectors/fetch.py`); one that reaches the caller could not be cut smaller.
    """

    def __init__(self, operation: str, limit_bytes: int, detail: str = "") -> None:
        self.limit_bytes = limit_bytes
        message = f"answer over {limit_bytes:,} bytes (max_answer_mb)"
        super().__init__(operation, f"{message}{detail}")

    def cut_to(self, what: str) -> AnswerTooLarge:
        """The same error, saying what could not be asked in smaller pieces."""
        return AnswerTooLarge(
            self.operation,
            self.limit_bytes,
            f"; {what} cannot be asked in smaller pieces: raise max_answer_mb or shorten "
            "the window",
        )
