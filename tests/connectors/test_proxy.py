"""A node behind an HTTP proxy: which proxy the client picks, and requests through a real one."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest

from connectors.client import NodeClient
from connectors.errors import NodeConnectionError
from connectors.proxy import check_proxy_setting, describe_proxy, proxy_for
from connectors.settings import NodeSettings, SettingsError
from pipelines.config.models import ConfigError, parse_config

PLANT = "http://node.plant.example:3003"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"HTTP_PROXY": "http://p:3128"}, "http://p:3128"),
        ({"HTTPS_PROXY": "http://s:3128"}, None),  # the node speaks http
        ({"ALL_PROXY": "http://a:1"}, "http://a:1"),
        ({"HTTP_PROXY": "http://upper:1", "http_proxy": "http://lower:1"}, "http://lower:1"),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "node.plant.example"}, None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": ".plant.example"}, None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "plant.example:3003"}, None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "plant.example:80"}, "http://p:1"),
        ({"HTTP_PROXY": "http://p:1", "no_proxy": "other.example, *"}, None),
        ({"HTTP_PROXY": "http://p:1", "NO_PROXY": "lant.example"}, "http://p:1"),
    ],
)
def test_the_environment_decides_when_the_node_names_no_proxy(
    environ: dict[str, str], expected: str | None
) -> None:
    assert proxy_for(PLANT, None, environ) == expected


def test_no_proxy_networks_and_loopback() -> None:
    environ = {"HTTP_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}
    assert proxy_for("http://10.2.3.4:3003", None, environ) is None
    assert proxy_for("http://11.2.3.4:3003", None, environ) == "http://p:1"
    for loopback in ("http://127.0.0.1:3003", "http://localhost:3003", "http://[::1]:3003"):
        assert proxy_for(loopback, None, environ) is None


def test_direct_and_an_explicit_proxy_override_the_environment() -> None:
    environ = {"HTTP_PROXY": "http://env:1"}
    assert proxy_for(PLANT, "direct", environ) is None
    assert proxy_for(PLANT, "http://mine:3128", environ) == "http://mine:3128"
    assert proxy_for("http://127.0.0.1:3003", "http://mine:3128", environ) == "http://mine:3128"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://user:secret@proxy:3128", "proxy credentials belong in the environment"),
        ("ftp://proxy:21", "is not 'direct' or a proxy URL"),
        ("proxy:3128", "is not 'direct' or a proxy URL"),
    ],
)
def test_a_proxy_setting_that_cannot_work_is_refused(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        check_proxy_setting(value)
    assert "secret" not in str(caught.value)


def test_describing_a_proxy_never_shows_its_credentials() -> None:
    assert (
        describe_proxy("http://user:secret@proxy.plant:3128") == "via proxy http://proxy.plant:3128"
    )
    assert describe_proxy(None) == ""


def test_flows_yaml_refuses_a_proxy_with_credentials_in_one_line(tmp_path: Any) -> None:
    document = {
        "nodes": {"n": {"url": PLANT, "proxy": "http://user:secret@proxy:3128"}},
        "sinks": {"lake": {"type": "parquet", "url": str(tmp_path)}},
        "flows": {"f": {"node": "n", "tags": {"paths": ["/a"]}, "start": "-1h", "sinks": ["lake"]}},
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(document)
    text = str(caught.value)
    assert "nodes.n.proxy" in text
    assert "credentials" in text
    assert "secret" not in text
    assert "\n" not in text


class _ForwardingProxy(ThreadingHTTPServer):
    """An HTTP forward proxy on loopback that sends every request to one upstream."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = urlsplit(upstream)
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _ForwardingProxy

    def do_GET(self) -> None:
        # A client talking to a proxy sends the absolute URL (absolute-form).
        self.server.requests.append(self.path)
        target = urlsplit(self.path)
        upstream = http.client.HTTPConnection(
            self.server.upstream.hostname or "", self.server.upstream.port, timeout=30
        )
        try:
            upstream.request(
                "GET", f"{target.path}?{target.query}" if target.query else target.path
            )
            answer = upstream.getresponse()
            body = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.getheader("Content-Type") or "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def forwarding_proxy(sim_server: Any) -> Iterator[_ForwardingProxy]:
    proxy = _ForwardingProxy(sim_server.http_url)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_an_explicit_proxy_carries_every_request(
    forwarding_proxy: _ForwardingProxy, sim_server: Any
) -> None:
    direct = NodeSettings(url=sim_server.http_url, name="plant")
    via = NodeSettings(url=sim_server.http_url, name="plant", proxy=forwarding_proxy.url)
    with NodeClient(direct) as client:
        expected = client.tag_browse("/")
    assert forwarding_proxy.requests == []
    with NodeClient(via) as client:
        assert client.tag_browse("/") == expected
    assert len(forwarding_proxy.requests) == 1
    assert forwarding_proxy.requests[0].startswith(sim_server.http_url + "/")


def test_the_environment_proxy_reaches_a_node_by_its_name(
    forwarding_proxy: _ForwardingProxy, sim_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The node's host name does not resolve here: only the proxy can reach it.
    monkeypatch.setenv("HTTP_PROXY", forwarding_proxy.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with NodeClient(NodeSettings(url="http://historian-node.invalid:3003", name="plant")) as client:
        assert client.tag_browse("/")
    assert forwarding_proxy.requests[0].startswith("http://historian-node.invalid:3003/")


def test_a_proxy_that_does_not_answer_is_named_without_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()  # nothing listens there now
    monkeypatch.setenv("HTTP_PROXY", f"http://user:secret@127.0.0.1:{port}")
    settings = NodeSettings(url="http://node.plant.example:3003", name="plant", retries=0)
    with NodeClient(settings) as client, pytest.raises(NodeConnectionError) as caught:
        client.tag_browse("/")
    text = str(caught.value)
    assert f"via proxy http://127.0.0.1:{port}" in text
    assert "secret" not in text


def test_a_socks_proxy_without_its_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_socksio(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "socksio":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_socksio)
    settings = NodeSettings(url=PLANT, name="plant", proxy="socks5://proxy:1080")
    with pytest.raises(SettingsError, match=r"node plant: a SOCKS proxy needs socksio"):
        NodeClient(settings)
