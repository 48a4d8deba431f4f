"""Which HTTP proxy, if any, stands between the client and a node.

A node's `proxy` setting is one of:

* unset: the environment decides, as for any HTTP tool: `HTTPS_PROXY` / `HTTP_PROXY` /
  `ALL_PROXY` (either case) by the node URL's scheme, `NO_PROXY` naming hosts reached
  directly. A loopback node (`localhost`, 127.0.0.0/8, ::1) is always reached directly,
  so the built-in simulator works on a machine whose environment names a proxy.
* `direct`: no proxy, whatever the environment says.
* a URL (`http://proxy.plant:3128`): that proxy, also for loopback. Proxy credentials
  belong in the environment (`HTTPS_PROXY=http://user:pass@host:port`), never in
  flows.yaml, and are never repeated in a message.

The client needs one answer per node (it talks to one base URL), so it is decided once,
when the client is built, with the standard library's reading of the variables.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

DIRECT = "direct"
_SCHEMES = ("http", "https", "socks5", "socks5h")


def check_proxy_setting(value: str) -> None:
    """ValueError unless `value` is `direct` or a proxy URL without credentials."""
    if value == DIRECT:
        return
    parts = urlsplit(value)
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise ValueError(
            f"{value!r} is not {DIRECT!r} or a proxy URL (http://host:port, socks5://host:port)"
        )
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "proxy credentials belong in the environment (HTTPS_PROXY=http://user:pass@host:port)"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError when out of range
    except ValueError as exc:
        raise ValueError(f"proxy {value!r}: {exc}") from None


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback address: never sent to a proxy from the environment."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def proxy_for(node_url: str, setting: str | None, environ: Mapping[str, str]) -> str | None:
    """The proxy URL to reach `node_url` through, or None to connect directly."""
    if setting == DIRECT:
        return None
    if setting is not None:
        return setting
    parts = urlsplit(node_url)
    host = parts.hostname or ""
    if is_loopback(host):
        return None
    proxies = _environment_proxies(environ)
    if not proxies or _bypassed(host, parts.port, environ):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


def describe_proxy(proxy: str | None) -> str:
    """`via proxy host:port` (never its credentials), or '' for a direct connection."""
    if proxy is None:
        return ""
    parts = urlsplit(proxy)
    port = f":{parts.port}" if parts.port else ""
    return f"via proxy {parts.scheme}://{parts.hostname}{port}"


def _environment_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """What the standard library reads from the variables, but from `environ`."""
    proxies: dict[str, str] = {}
    for name, value in environ.items():
        lowered = name.lower()
        if value and lowered.endswith("_proxy") and lowered != "no_proxy":
            scheme = lowered[: -len("_proxy")]
            # The lower-case variable wins over the upper-case one, as in urllib.
            if name == lowered or scheme not in proxies:
                proxies[scheme] = value
    return proxies


def _bypassed(host: str, port: int | None, environ: Mapping[str, str]) -> bool:
    """Whether `NO_PROXY` names the host: `*`, the host, a domain it is in (`plant.local`
    or `.plant.local`), either with the port, or a network of its address (`10.0.0.0/8`)."""
    no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    host = host.lower().strip("[]")
    for entry in (part.strip().lower() for part in no_proxy.split(",")):
        if not entry:
            continue
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if _has_port(entry) else (entry, "", "")
        if entry_port and port is not None and entry_port != str(port):
            continue
        name = name.strip("[]")
        if "/" in name and _in_network(host, name):
            return True
        domain = name.lstrip(".")
        if host == domain or host.endswith("." + domain):
            return True
    return False


def _has_port(entry: str) -> bool:
    """`host:port` or `[v6]:port`, not a bare IPv6 address."""
    if entry.startswith("["):
        return "]:" in entry
    return entry.count(":") == 1


def _in_network(host: str, network: str) -> bool:
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(network, strict=False)
    except ValueError:
        return False
