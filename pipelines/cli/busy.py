"""`warehouse busy: flow X is writing (pid N)`: what a command says when an embedded
DuckDB file is held by another process.

DuckDB lets one process open a database file for writing and then refuses every other
process, even a read-only one, with `IO Error: Could not set lock on file ...`. The
process and the flow are found from that message's PID and from the flow locks the
warehouse keeps beside the file (`<file>.<flow>.lock`, flocked by the run that writes).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from pipelines.config.destinations import SinkSet

_SINK = re.compile(r"^sink (?P<sink>[A-Za-z0-9_.-]+):")


def held_flows(database: str) -> list[tuple[str, int | None]]:
    """Flows whose lock beside `database` some process holds now, with its pid (from the
    lock file) when written; flows with hashed lock names are shown as `?`."""
    found: list[tuple[str, int | None]] = []
    prefix = database + "."
    for path in sorted(glob.glob(glob.escape(prefix) + "*.lock")):
        name = path[len(prefix) : -len(".lock")]
        try:
            handle = open(path, "rb")  # noqa: SIM115 - closed below
        except OSError:
            continue
        with handle:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                pid: int | None = None
                with contextlib.suppress(Exception):
                    pid = int(orjson.loads(handle.read(4096))["pid"])
                found.append(("?" if name.startswith("flow-") else name, pid))
                continue
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return found


def busy_line(exc: BaseException) -> str | None:
    """The project's one line for an error that is a DuckDB file held by another
    process; None for any other error."""
    from sinks.sql.errors import duckdb_holder

    holder = duckdb_holder(exc)
    if holder is None:
        return None
    path, pid = holder
    sink = _SINK.match(" ".join(str(exc).split()))
    what = (
        "warehouse" if sink is None or sink["sink"] == "warehouse" else f"warehouse {sink['sink']}"
    )
    flows = [flow for flow, holder in held_flows(path) if holder in (None, pid)]
    if flows:
        return f"{what} busy: flow {flows[0]} is writing (pid {pid}); try again when it ends"
    return f"{what} busy: another process has it open (pid {pid}); try again when it ends"


def first_open_sink(sinks: SinkSet, names: Sequence[str]) -> tuple[str, list[str]]:
    """The first of `names` that opens, skipping DuckDB files another process holds (a
    run writing): a reader falls back to another sink of the flow. Returns its name and
    the busy lines of the sinks skipped; raises the first sink's error when none opens."""
    from sinks.base import SinkError

    skipped: list[str] = []
    first: SinkError | None = None
    for name in names:
        try:
            sinks.get(name)
            return name, skipped
        except SinkError as exc:
            busy = busy_line(exc)
            if busy is None:
                raise
            first = first or exc
            skipped.append(f"sink {name}: {busy}")
    assert first is not None
    raise first
