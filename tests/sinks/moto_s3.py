"""A moto S3 server for the table-format sinks' tests."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

STARTUP_S = 60  # a busy machine (the suite runs in several processes) starts it slower


def moto_process() -> tuple[subprocess.Popen[bytes], str]:
    """A moto S3 server in a process of its own on a loopback port it chose itself.

    Not ThreadedMotoServer: delta-rs and pyiceberg calls that hold the GIL while they wait
    for S3 would then wait for a server that needs the GIL to answer (a deadlock that
    shows as request timeouts). Port 0 and the port the server prints, not a port probed
    free beforehand: with tests in parallel another server may take a probed port first,
    and a test would then talk to another test's S3."""
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert server.stderr is not None
    ports: queue.Queue[int | None] = queue.Queue()
    threading.Thread(target=_read_log, args=(server.stderr, ports), daemon=True).start()
    try:
        port = ports.get(timeout=STARTUP_S)
    except queue.Empty:
        port = None
    if port is None:
        server.kill()
        server.wait(timeout=30)
        raise AssertionError("moto server did not start")
    return server, f"http://127.0.0.1:{port}"


@contextmanager
def moto_bucket(*buckets: str) -> Iterator[str]:
    """A moto S3 server with `buckets` created; its endpoint URL. Stopped on the way out."""
    import boto3

    server, endpoint = moto_process()
    try:
        client = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x",
            region_name="us-east-1",
        )  # fmt: skip
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)
        yield endpoint
    finally:
        server.kill()
        server.wait(timeout=30)


def fsspec_options(endpoint: str) -> dict[str, object]:
    """s3fs storage options for a lake on the moto server at `endpoint`."""
    return {"client_kwargs": {"endpoint_url": endpoint}, "key": "x", "secret": "x"}


def _read_log(stream: IO[bytes], ports: queue.Queue[int | None]) -> None:
    """Put the port of werkzeug's ` * Running on http://127.0.0.1:PORT` line (None if the
    server ends first), then keep reading: the server logs every request to stderr, and a
    full pipe would block it."""
    announced = False
    for line in stream:
        found = None if announced else re.search(rb"Running on http://127\.0\.0\.1:(\d+)", line)
        if found:
            announced = True
            ports.put(int(found.group(1)))
    if not announced:
        ports.put(None)
