"""A hostile node on loopback: a raw socket server that answers every request by trickling.

It reads the request head, then either sends a complete head promising a large body and
trickles the body one byte per `interval_s` (`stage="body"`), or trickles the head itself
(`stage="head"`). Each byte comes well within any read timeout, so only a deadline on the
whole request ends it. A trickle stops after `give_up_s` (the connection is closed), so a
client without a deadline fails a test with a connection error instead of hanging it.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Literal

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"


@dataclass
class TrickleNode:
    url: str
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self) -> None:
        with self._lock:
            self.requests += 1


def _serve(
    conn: socket.socket,
    node: TrickleNode,
    stage: str,
    interval_s: float,
    give_up_s: float,
    body: bytes | None,
) -> None:
    try:
        head = b""
        while b"\r\n\r\n" not in head:
            part = conn.recv(65536)
            if not part:
                return
            head += part
        node.count()
        if body is not None:  # an honest, slow answer: its bytes end before the deadline
            whole = (
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            )
            conn.sendall(whole)
            for byte in body:
                time.sleep(interval_s)
                conn.sendall(bytes([byte]))
            return
        ends = time.monotonic() + give_up_s
        if stage == "body":
            conn.sendall(HEAD)
        trickle = HEAD if stage == "head" else b" " * 1_000_000
        for byte in trickle:
            if time.monotonic() > ends:
                return
            conn.sendall(bytes([byte]))
            time.sleep(interval_s)
    except OSError:
        pass
    finally:
        with suppress(OSError):
            conn.close()


@contextmanager
def trickling_node(
    *,
    stage: Literal["head", "body"] = "body",
    interval_s: float = 0.2,
    give_up_s: float = 30.0,
    tls: ssl.SSLContext | None = None,
    body: bytes | None = None,
) -> Iterator[TrickleNode]:
    """Serve on a free loopback port until the block ends; `body` makes it honest but slow."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    node = TrickleNode(f"{'https' if tls else 'http'}://127.0.0.1:{port}")
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(give_up_s + 5)
            if tls is not None:
                try:
                    conn = tls.wrap_socket(conn, server_side=True)
                except (OSError, ssl.SSLError):
                    conn.close()
                    continue
            threading.Thread(
                target=_serve,
                args=(conn, node, stage, interval_s, give_up_s, body),
                daemon=True,
            ).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield node
    finally:
        stop.set()
        acceptor.join(5)
        listener.close()
