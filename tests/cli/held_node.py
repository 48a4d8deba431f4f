"""A node that answers, then holds: a loopback proxy in front of the simulator that passes
the first `answer` history requests through, or every one that ends by `until` (a first
window's end), and holds every later one until `release` (or the block ends). A
test interrupts a command while it waits on the node, at a moment it observes (`held` is
set), instead of guessing one with a sleep."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx


@dataclass
class HeldNode:
    url: str
    answer: int | None
    until: datetime | None
    passed: int = 0
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def may_pass(self, path: str) -> bool:
        """Count a history request; False when it is to be held."""
        if "history" not in path:
            return True
        with self._lock:
            if self._passes(path) or self.release.is_set():
                self.passed += 1
                return True
        self.held.set()
        return False

    def _passes(self, path: str) -> bool:
        if self.answer is not None:
            return self.passed < self.answer
        assert self.until is not None
        # However many requests the window takes (a continuation, a re-asked tag, a
        # single-tag confirmation: connectors/pager.py), each ends at its end. Not its
        # start: a window is asked from a millisecond before it.
        (end,) = parse_qs(urlsplit(path).query)["end"]
        return datetime.fromisoformat(end) <= self.until


@contextmanager
def held_node(
    upstream: str, *, answer: int | None = None, until: datetime | None = None
) -> Iterator[HeldNode]:
    """Serve the proxy on a free loopback port for the block; held requests end with it.
    Exactly one of `answer` (a count of history requests) and `until` says what passes."""
    assert (answer is None) != (until is None), "say what passes: answer or until"
    client = httpx.Client(base_url=upstream, timeout=60)
    ending = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if not node.may_pass(self.path):
                while not (node.release.wait(0.1) or ending.is_set()):
                    pass
                if ending.is_set():
                    return
            token = self.headers.get("Authorization")
            answer = client.get(self.path, headers={"Authorization": token} if token else {})
            self.send_response(answer.status_code)
            self.send_header("Content-Type", answer.headers.get("content-type", "text/plain"))
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            with suppress(OSError):
                self.wfile.write(answer.content)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    node = HeldNode(f"http://127.0.0.1:{server.server_address[1]}", answer, until)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield node
    finally:
        ending.set()
        server.shutdown()
        server.server_close()
        client.close()
