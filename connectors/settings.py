"""How to reach a node: URL, TLS, credentials, limits. The one definition of a node's
connection settings: their defaults and rules are here, and flows.yaml's `nodes.<name>`
(`pipelines/config/models.py`) takes both from here.

Credentials come by environment variable *name* (read by the client when it is built) or
as a value the caller resolved (a Prefect Secret block, read in `pipelines/config/nodes.py`:
nothing here depends on the orchestrator). A value is a `SecretText`, which never shows
in a repr, a str or a log line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from connectors.errors import FatalNodeError, quoted
from connectors.normalise.positions import check_alarm_fields
from connectors.proxy import check_proxy_setting, proxy_for

DEFAULT_HTTP_PORT = 3003
DEFAULT_HTTPS_PORT = 3443
MAX_URL_CHARS = 2048
DEFAULT_MAX_ANSWER_MB = 16
_USERINFO = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@")


def url_has_credentials(url: str) -> bool:
    """`user[:password]@` before the host: a secret, so such a URL is never repeated."""
    return _USERINFO.match(url) is not None


def check_node_url(url: str) -> None:
    """ValueError unless `url` is an http(s) URL the client can use. The message never
    repeats a URL with credentials in it."""
    if url_has_credentials(url):
        raise ValueError("credentials belong in environment variables (token_env, username_env)")
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"{quoted(url)} is longer than a node URL may be ({MAX_URL_CHARS:,})")
    if not re.match(r"^https?://[^/\s]+", url) or re.search(r"[\s\x00-\x1f\x7f]", url):
        raise ValueError(f"{quoted(url)} is not an http:// or https:// URL")
    try:
        urlsplit(url).port  # noqa: B018 - raises ValueError when out of range
        httpx.URL(url)
    except (ValueError, httpx.InvalidURL) as exc:
        raise ValueError(f"{quoted(url)} is not a valid URL: {exc}") from None


def check_credentials(
    *,
    token_env: str | None,
    token: object | None,
    username_env: str | None,
    password_env: str | None,
    password: object | None,
) -> None:
    """ValueError unless the credentials name one way to authenticate: a token (by
    variable or value), or a user with a password (by variable or value), or nothing.
    `token` and `password` are values or the names of the blocks that hold them."""
    if token_env is not None and token is not None:
        raise ValueError("give token_env or token_block, not both")
    if password_env is not None and password is not None:
        raise ValueError("give password_env or password_block, not both")
    if (username_env is None) != (password_env is None and password is None):
        raise ValueError("username_env and password_env (or password_block) go together")
    if (token_env is not None or token is not None) and username_env is not None:
        raise ValueError("give token_env or username_env/password_env, not both")


class SecretText:
    """A credential's value: shown nowhere (repr, str, logs), compared and hashed as itself."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "SecretText('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretText) and other.value == self.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __reduce__(self) -> tuple[type[SecretText], tuple[str]]:
        return SecretText, (self.value,)


class SettingsError(FatalNodeError):
    """The settings cannot work: a malformed URL or a missing environment variable."""

    def __init__(self, message: str) -> None:
        super().__init__("settings", message)


@dataclass(frozen=True)
class NodeSettings:
    """One node's connection settings (frozen and hashable: a key for pooled clients).

    `*_env` fields name environment variables; their values are read by `NodeClient`
    when it is built. `token` and `password` are values resolved by the caller.
    `retries` counts retries after the first attempt. These defaults are flows.yaml's.
    """

    url: str
    name: str = "node"
    verify: bool = True
    ca_bundle: str | None = None
    token_env: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    token: SecretText | None = field(default=None, repr=False)
    password: SecretText | None = field(default=None, repr=False)
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    # The whole request (connect, wait, read every byte); None: see `deadline_s`.
    request_deadline_s: float | None = None
    max_connections: int = 4
    retries: int = 5
    backoff_base_s: float = 0.25
    backoff_max_s: float = 10.0
    # A 500 from a node under load is often transient; retried unless turned off.
    retry_server_errors: bool = True
    # None: the environment's proxy variables; "direct"; or a proxy URL (connectors/proxy.py).
    proxy: str | None = None
    # One history answer is read up to this many bytes; a longer one is asked again in
    # smaller pieces (connectors/fetch.py), so a run's memory follows this, not the data.
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_MB << 20
    # The field at each position of the node's alarm events when they are arrays; None:
    # only an order the answer proves is read (connectors/normalise/positions.py).
    alarm_fields: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        try:
            check_node_url(self.url)
            check_credentials(
                token_env=self.token_env,
                token=self.token,
                username_env=self.username_env,
                password_env=self.password_env,
                password=self.password,
            )
            if self.proxy is not None:
                check_proxy_setting(self.proxy)
        except ValueError as exc:
            raise SettingsError(f"node {self.name}: {exc}") from None
        if self.max_connections < 1:
            raise SettingsError(f"node {self.name}: max_connections must be at least 1")
        if self.retries < 0:
            raise SettingsError(f"node {self.name}: retries must be 0 or more")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise SettingsError(f"node {self.name}: timeouts must be positive")
        if self.request_deadline_s is not None and self.request_deadline_s <= 0:
            raise SettingsError(f"node {self.name}: request_deadline must be positive")
        if self.max_answer_bytes < 1:
            raise SettingsError(f"node {self.name}: max_answer_mb must be positive")
        if self.alarm_fields is not None:
            try:
                check_alarm_fields(self.alarm_fields)
            except ValueError as exc:
                raise SettingsError(f"node {self.name}: alarm_fields: {exc}") from None

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

    def proxy_url(self) -> str | None:
        """The proxy to reach the node through (the environment read now), or None."""
        return proxy_for(self.base_url, self.proxy, os.environ)

    def _env(self, variable: str) -> str:
        value = os.environ.get(variable)
        if value is None or value == "":
            raise SettingsError(f"node {self.name}: environment variable {variable} is not set")
        return value

    def bearer_token(self) -> str | None:
        """The token given, or read from `token_env` now (never kept), if configured."""
        if self.token is not None:
            return self.token.value
        return self._env(self.token_env) if self.token_env else None

    def basic_credentials(self) -> tuple[str, str] | None:
        """(user, password) from `username_env` and `password_env` or the password given."""
        if self.username_env is None:
            return None
        if self.password is not None:
            return self._env(self.username_env), self.password.value
        assert self.password_env is not None  # check_credentials: they go together
        return self._env(self.username_env), self._env(self.password_env)
