"""A node that answers, then holds: a loopback proxy in front of the simulator that passes
the first `answer` history requests through and holds every later one until `release`
(or the block ends). A test interrupts a command while it waits on the node, at a moment
it observes (`held` is set), instead of guessing one with a sleep."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

# History requests the first chunk of the tests' flows makes before it commits: its
# answer, and the continuation the pager asks when that answer's last tag stops short of
# the window's end (a cap counted per answer is suspected until refuted: connectors/pager.py).
FIRST_CHUNK = 2


@dataclass
class HeldNode:
    url: str
    answer: int
    passed: int = 0
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def may_pass(self, path: str) -> bool:
        """Count a history request; False when it is to be held."""
        if "history" not in path:
            return True
        with self._lock:
            if self.passed < self.answer or self.release.is_set():
                self.passed += 1
                return True
        self.held.set()
        return False


@contextmanager
def held_node(upstream: str, *, answer: int) -> Iterator[HeldNode]:
    """Serve the proxy on a free loopback port for the block; held requests end with it."""
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
    node = HeldNode(f"http://127.0.0.1:{server.server_address[1]}", answer)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield node
    finally:
        ending.set()
        server.shutdown()
        server.server_close()
        client.close()
