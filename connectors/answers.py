"""The node's answers read into Python: JSON, models, numbers, Base64 archives.

One reading per answer shape, shared by the client, the administration operations and
the subscriptions, so that every wrong answer is the same `MalformedAnswer` naming the
operation, wherever it was asked.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

import httpx
import orjson
from pydantic import BaseModel, ValidationError

from connectors.errors import AnswerTooLarge, MalformedAnswer

log = logging.getLogger("historian.client")
M = TypeVar("M", bound=BaseModel)


class Requester(Protocol):
    """What the operations need of a client: one request, retried and typed on failure
    (`NodeClient.request`)."""

    def request(
        self,
        operation: str,
        method: str,
        resource: str,
        cmd: str,
        params: Mapping[str, Any] | None = None,
        body: object | None = None,
    ) -> httpx.Response: ...


def read_capped(operation: str, response: httpx.Response, max_bytes: int | None) -> None:
    """Read a streamed response's body, or raise `AnswerTooLarge` as soon as it (decoded)
    passes `max_bytes`: the rest is never read, so one answer cannot take more memory
    than the cap, however much the node sends."""
    if max_bytes is None:
        response.read()
        return
    pieces: list[bytes] = []
    size = 0
    for piece in response.iter_bytes():
        size += len(piece)
        if size > max_bytes:
            pieces.clear()  # not kept alive by the traceback of what is raised
            raise AnswerTooLarge(operation, max_bytes)
        pieces.append(piece)
    # What `httpx.Response.read` itself keeps, so `content` and `text` work as usual.
    response._content = b"".join(pieces)


def json_of(operation: str, response: httpx.Response) -> Any:
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        raise MalformedAnswer(
            operation, "answer is not JSON", where=operation, body=response.content
        ) from None


def model_of(operation: str, response: httpx.Response, model: type[M]) -> M:
    data = json_of(operation, response)
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


def models_of(operation: str, response: httpx.Response, model: type[M]) -> list[M]:
    data = json_of(operation, response)
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


def model_map_of(operation: str, response: httpx.Response, model: type[M]) -> dict[str, M]:
    data = json_of(operation, response)
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


def number_of(operation: str, response: httpx.Response) -> int:
    text = response.text.strip()
    try:
        value = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MalformedAnswer(operation, "answer is not a plain number", where=operation, body=text)
    return int(value)


def empty(operation: str, response: httpx.Response) -> None:
    """Operations that return nothing: an empty body (a JSON null or {} is tolerated)."""
    if response.content.strip() not in (b"", b"null", b"{}", b'""'):
        log.debug("%s: ignored a non-empty answer of %d bytes", operation, len(response.content))


def base64_zip_of(operation: str, response: httpx.Response) -> bytes:
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


def json_string_of(operation: str, response: httpx.Response) -> Any:
    """'JSON string' answers: a JSON-encoded string holding a JSON document (or the doc)."""
    data = json_of(operation, response)
    if isinstance(data, str):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            return data
    return data


def string_list(operation: str, data: Any) -> list[str]:
    if not isinstance(data, list) or not all(isinstance(item, str) for item in data):
        raise MalformedAnswer(operation, "answer is not an array of strings", where=operation)
    return list(data)
