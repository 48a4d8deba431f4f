"""The simulator on the wire: HTTP/1.1 with keep-alive, HTTPS with its own CA, faults.

Standard-library `ThreadingHTTPServer`: one thread per connection, quiet (no request
log). HTTPS uses a certificate for 127.0.0.1 and localhost signed by a CA that `trustme`
makes at start; `ca_pem_path` is where a client finds that CA.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hmac
import os
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson

from connectors.simulator.config import SimConfig
from connectors.simulator.node import SimulatedNode
from connectors.simulator.protocol import (
    Answer,
    RequestError,
    error_answer,
    parse_list,
    parse_time,
)

# Replay mode serves these from memory: the history a benchmark reads, and the details of
# the tags it names (a details answer of 10,000 tags renders each tag's current value).
_REPLAYED = {"tag.history", "tag.historyMany", "tag.historyFilter", "tag.details"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self, address: tuple[str, int], node: SimulatedNode, tls: ssl.SSLContext | None = None
    ) -> None:
        self.node = node
        self.tls = tls
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet when a client hangs up or fails the TLS handshake; loud for real bugs."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without TCP_NODELAY, Nagle's algorithm and
    # delayed ACKs add ~40 ms to every small keep-alive answer.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the simulator does not log requests."""

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            try:
                self.connection.do_handshake()
            except (ssl.SSLError, OSError):
                self.close_connection = True
                raise ConnectionAbortedError from None

    def handle(self) -> None:
        with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError, OSError):
            super().handle()

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _authorised(self) -> bool:
        config = self.server.node.config
        if config.token is None and config.username is None:
            return True
        header = self.headers.get("Authorization") or ""
        if config.token is not None and header.startswith("Bearer "):
            return hmac.compare_digest(header[7:].encode(), config.token.encode())
        if config.username is not None and header.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            return hmac.compare_digest(user, config.username) and hmac.compare_digest(
                password, config.password or ""
            )
        return False

    def _serve(self, method: str) -> None:
        with self.server.node.answering():
            self._answer(method)

    def _answer(self, method: str) -> None:
        node = self.server.node
        parts = urlsplit(self.path)
        resource = parts.path.strip("/")
        params = dict(parse_qsl(parts.query, keep_blank_values=True))
        cmd = params.pop("cmd", "")
        raw_body = self._read_body()
        if raw_body is None:
            self.close_connection = True
            self._send(error_answer(400, "invalid Content-Length"))
            return
        if not self._authorised():
            answer = error_answer(401, "unauthorised")
            answer.headers["WWW-Authenticate"] = 'Bearer realm="node"'
            self._send(answer)
            return
        fault = node.faults.decide(f"{resource}.{cmd}")
        if fault is not None and self._inject(fault):
            return
        try:
            body = orjson.loads(raw_body) if raw_body.strip() else None
        except orjson.JSONDecodeError:
            self._send(error_answer(400, "the body is not JSON"))
            return
        answer = _altered(self._handle(method, resource, cmd, params, body), fault)
        self._send(answer, truncate=fault == "truncate" and len(answer.body) > 1)

    def _read_body(self) -> bytes | None:
        """The request's body, or None when its Content-Length is not a length."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            return None
        if length < 0:
            return None
        return self.rfile.read(length) if length else b""

    def _handle(
        self, method: str, resource: str, cmd: str, params: dict[str, str], body: Any
    ) -> Answer:
        """The node's answer; a replayed GET (`_REPLAYED`) from the node's cache."""
        node = self.server.node
        if f"{resource}.{cmd}" in _REPLAYED and method == "GET":
            key = _replay_key(resource, cmd, params)
            return node.cached(key, lambda: node.handle(method, resource, cmd, params, body))
        return node.handle(method, resource, cmd, params, body)

    def _inject(self, fault: str) -> bool:
        """Inject a fault that replaces the answer (True), or prepare one that alters it."""
        faults = self.server.node.faults
        if fault in ("500", "502", "503", "504"):
            self._send(error_answer(int(fault), f"injected {fault}"))
            return True
        if fault == "429":
            answer = error_answer(429, "too many requests")
            answer.headers["Retry-After"] = f"{faults.retry_after_s:g}"
            self._send(answer)
            return True
        if fault == "reset":
            self._reset()
            return True
        if fault == "slow":
            time.sleep(faults.slow_s)
        return False

    def _reset(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _send(self, answer: Answer, *, truncate: bool = False) -> None:
        self.send_response(answer.status)
        self.send_header("Content-Type", answer.content_type)
        self.send_header("Content-Length", str(len(answer.body)))
        for key, value in answer.headers.items():
            self.send_header(key, value)
        if truncate:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        body = answer.body[: len(answer.body) // 2] if truncate else answer.body
        with contextlib.suppress(OSError):
            self.wfile.write(body)
            self.wfile.flush()
        if truncate:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)


class ServerHandle:
    """Running HTTP (and HTTPS) servers of one simulated node."""

    def __init__(
        self, node: SimulatedNode, host: str, http_port: int, https_port: int | None
    ) -> None:
        self.node = node
        self.host = host
        self._tls: ssl.SSLContext | None = None
        self.ca_pem_path: str | None = None
        if https_port is not None:
            self._tls, self.ca_pem_path = _tls_context(host)
        self._https: _Server | None = None
        try:
            self._http = _bind(host, http_port, node)
            if https_port is not None:
                self._https = _bind(host, https_port, node, self._tls)
        except BaseException:
            if self._https is None and hasattr(self, "_http"):
                self._http.server_close()
            self._remove_ca()
            raise
        self._threads: list[threading.Thread] = []
        self._start()

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self._http.server_address[1]}"

    @property
    def https_url(self) -> str | None:
        if self._https is None:
            return None
        return f"https://{self.host}:{self._https.server_address[1]}"

    def _start(self) -> None:
        self._threads = []
        for server in (self._http, self._https):
            if server is None:
                continue
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="simulator",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        for server in (self._http, self._https):
            if server is not None:
                server.shutdown()
                server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)

    def close(self) -> None:
        """Stop the servers and remove the CA file written for HTTPS clients."""
        try:
            self.stop()
        finally:
            self._remove_ca()

    def _remove_ca(self) -> None:
        if self.ca_pem_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.ca_pem_path)

    def restart(self, down_s: float = 0.0) -> None:
        """Kill the servers and start them again on the same ports (state is kept, but
        not the subscriptions, unless `subscriptions_survive_restart`)."""
        self.node.subscriptions.restart()
        http_port = self._http.server_address[1]
        https_port = self._https.server_address[1] if self._https is not None else None
        self.stop()
        time.sleep(down_s)
        self._http = _Server((self.host, http_port), self.node)
        self._https = _Server((self.host, https_port), self.node, self._tls) if https_port else None
        self._start()


class PortInUse(OSError):
    """The simulator's port is taken by another process."""

    def __init__(self, host: str, port: int) -> None:
        self.port = port
        super().__init__(errno.EADDRINUSE, f"port {port} on {host} is already in use")


def _bind(host: str, port: int, node: SimulatedNode, tls: ssl.SSLContext | None = None) -> _Server:
    try:
        return _Server((host, port), node, tls)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(host, port) from None
        raise


def _tls_context(host: str) -> tuple[ssl.SSLContext, str]:
    import trustme

    ca = trustme.CA()
    names = sorted({host, "127.0.0.1", "localhost"})
    certificate = ca.issue_cert(*names)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    certificate.configure_cert(context)
    with tempfile.NamedTemporaryFile(
        "wb", prefix="historian-sim-ca-", suffix=".pem", delete=False
    ) as handle:
        handle.write(ca.cert_pem.bytes())
    return context, handle.name


@contextlib.contextmanager
def run_server(
    node: SimulatedNode, http_port: int = 0, https_port: int | None = 0, host: str = "127.0.0.1"
) -> Iterator[ServerHandle]:
    """Serve `node` in background threads for the duration of the block."""
    handle = ServerHandle(node, host, http_port, https_port)
    try:
        yield handle
    finally:
        handle.close()


def serve_forever(
    config: SimConfig, http_port: int = 3003, https_port: int | None = 3443, host: str = "127.0.0.1"
) -> None:
    """Serve a simulator until interrupted (the `historian simulate` command)."""
    node = SimulatedNode(config)
    with run_server(node, http_port, https_port, host) as handle:
        if handle.ca_pem_path:
            print(f"HTTPS CA certificate: {handle.ca_pem_path}", flush=True)
        while True:
            time.sleep(3600)


def _replay_key(resource: str, cmd: str, params: dict[str, str]) -> str:
    """What a replayed query asks, whatever its spelling: times as epoch ms, lists parsed.

    Clients spell one question differently (`...00Z` or `...00.000Z`, `["/a", "/b"]` with or
    without spaces); replay mode keys its cache by the question, so every client asking it
    is served the same rendered answer.
    """
    normal: dict[str, object] = {}
    for name, value in params.items():
        try:
            if name in ("start", "end"):
                normal[name] = parse_time(value, name)
            elif name in ("path", "paths"):
                normal[name] = parse_list(value)
            else:
                normal[name] = value
        except RequestError:  # a bad value: the handler answers 400; the key only has to differ
            normal[name] = value
    return orjson.dumps([resource, cmd, normal], option=orjson.OPT_SORT_KEYS).decode()


def _altered(answer: Answer, fault: str | None) -> Answer:
    """A good answer as a `nonjson` fault (a proxy's page) or a `cutjson` one (half the
    body) leaves it; any other answer as it is."""
    if answer.status != 200:
        return answer
    if fault == "nonjson":
        return Answer(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
    if fault == "cutjson":
        return Answer(200, answer.body[: len(answer.body) // 2], answer.content_type)
    return answer
