"""How to reach a node: URL, TLS, credentials by environment variable name, limits.

Settings hold the *names* of the variables with secrets, never the secrets; the client
reads them when it is built, so nothing printable here ever contains a token.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from connectors.errors import FatalNodeError, quoted

DEFAULT_HTTP_PORT = 3003
DEFAULT_HTTPS_PORT = 3443
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@")


def url_has_credentials(url: str) -> bool:
    """`user[:password]@` before the host: a secret, so such a URL is never repeated."""
    return _USERINFO.match(url) is not None


class SettingsError(FatalNodeError):
    """The settings cannot work: a malformed URL or a missing environment variable."""

    def __init__(self, message: str) -> None:
        super().__init__("settings", message)


@dataclass(frozen=True)
class NodeSettings:
    """One node's connection settings (frozen and hashable: a key for pooled clients).

    `*_env` fields name environment variables; their values are read by `NodeClient`
    when it is built. `retries` counts retries after the first attempt.
    """

    url: str
    name: str = "node"
    verify: bool = True
    ca_bundle: str | None = None
    token_env: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    # Names of Prefect Secret blocks, the alternative to environment variables.
    token_block: str | None = None
    password_block: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    # The whole request (connect, wait, read every byte); None: see `deadline_s`.
    request_deadline_s: float | None = None
    max_connections: int = 8
    retries: int = 5
    backoff_base_s: float = 0.25
    backoff_max_s: float = 10.0
    # A 500 from a node under load is often transient; retried unless turned off.
    retry_server_errors: bool = True

    def __post_init__(self) -> None:
        if url_has_credentials(self.url):
            raise SettingsError(
                f"node {self.name}: put credentials in environment variables, not in the URL"
            )
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - raises ValueError when out of range
            httpx.URL(self.url)
        except (ValueError, httpx.InvalidURL) as exc:
            raise SettingsError(
                f"node {self.name}: {quoted(self.url)} is not a valid URL: {exc}"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(f"node {self.name}: {quoted(self.url)} is not an http(s) URL")
        if self.max_connections < 1:
            raise SettingsError(f"node {self.name}: max_connections must be at least 1")
        has_password = self.password_env is not None or self.password_block is not None
        if (self.username_env is None) == has_password:
            raise SettingsError(
                f"node {self.name}: username_env and password_env (or password_block) go together"
            )
        if self.token_env and self.token_block:
            raise SettingsError(f"node {self.name}: give token_env or token_block, not both")
        if self.password_env and self.password_block:
            raise SettingsError(f"node {self.name}: give password_env or password_block, not both")
        if (self.token_env or self.token_block) and self.username_env:
            raise SettingsError(
                f"node {self.name}: give token_env or username_env/password_env, not both"
            )
        if self.retries < 0:
            raise SettingsError(f"node {self.name}: retries must be 0 or more")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise SettingsError(f"node {self.name}: timeouts must be positive")
        if self.request_deadline_s is not None and self.request_deadline_s <= 0:
            raise SettingsError(f"node {self.name}: request_deadline must be positive")

    @property
    def deadline_s(self) -> float:
        """Seconds one request may take in all: the setting, or `connect_timeout_s` plus
        twice `read_timeout_s` (a whole read timeout to start answering, as long again to
        finish)."""
        if self.request_deadline_s is not None:
            return self.request_deadline_s
        return self.connect_timeout_s + 2 * self.read_timeout_s

    @property
    def base_url(self) -> str:
        """The URL with the documented default port when none is given."""
        parts = urlsplit(self.url)
        port = parts.port or (DEFAULT_HTTPS_PORT if parts.scheme == "https" else DEFAULT_HTTP_PORT)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        path = parts.path.rstrip("/")
        return f"{parts.scheme}://{host}:{port}{path}"

    def _env(self, variable: str) -> str:
        value = os.environ.get(variable)
        if value is None or value == "":
            raise SettingsError(f"node {self.name}: environment variable {variable} is not set")
        return value

    def _block(self, name: str) -> str:
        """The value of a Prefect Secret block (read now, never stored here)."""
        try:
            from prefect.blocks.system import Secret

            block: Any = Secret.load(name)  # sync here: no event loop runs in this thread
            value = block.get()
        except Exception as exc:
            raise SettingsError(
                f"node {self.name}: Prefect Secret block {quoted(name)} cannot be read "
                f"({type(exc).__name__})"
            ) from None
        if not isinstance(value, str) or not value:
            raise SettingsError(f"node {self.name}: Prefect Secret block {quoted(name)} is empty")
        return value

    def bearer_token(self) -> str | None:
        """The token from `token_env` or `token_block`, if configured (read now, never kept)."""
        if self.token_block:
            return self._block(self.token_block)
        return self._env(self.token_env) if self.token_env else None

    def basic_credentials(self) -> tuple[str, str] | None:
        """(user, password) from `username_env`/`password_env`, if configured."""
        if self.username_env and self.password_block:
            return self._env(self.username_env), self._block(self.password_block)
        if self.username_env and self.password_env:
            return self._env(self.username_env), self._env(self.password_env)
        return None
