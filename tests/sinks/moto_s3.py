"""A moto S3 server for the table-format sinks' tests."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time


def moto_process() -> tuple[subprocess.Popen[bytes], str]:
    """A moto S3 server in a process of its own on a free loopback port.

    Not ThreadedMotoServer: delta-rs and pyiceberg calls that hold the GIL while they wait
    for S3 would then wait for a server that needs the GIL to answer (a deadlock that
    shows as request timeouts)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return server, f"http://127.0.0.1:{port}"
        assert server.poll() is None, "moto server exited"
        time.sleep(0.05)
    server.kill()
    raise AssertionError("moto server did not start")
