"""What the live tail's end-to-end tests and its benchmarks share: a tail started as the
user starts it (`historian tail`), the sink's rows over a span, a backfill of the same
span into a sink of its own, the two compared row for row, and the processes a run left.

Exactness is counted as the soaks count it: rows the backfill has and the sink lacks
(missing), rows the sink has and the backfill lacks (extra), and rows the sink holds more
than once under one key (node, tag, ts, seq: duplicated).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from tests.fixtures import history_rows, load

HISTORIAN = str(Path(sys.executable).with_name("historian"))
# Every process a live test or bench starts carries this in its environment, with a value
# of its own: what is still alive with it afterwards was left behind.
MARK = "HISTORIAN_LIVE_RUN"


@dataclass(frozen=True)
class Exactness:
    rows: int
    missing: int
    extra: int
    duplicated: int
    # A few of each, for the failure's message.
    examples: tuple[tuple[Any, ...], ...] = ()

    @property
    def exact(self) -> bool:
        return self.missing == self.extra == self.duplicated == 0

    def __str__(self) -> str:
        shown = f" (e.g. {list(self.examples)})" if self.examples else ""
        return (
            f"{self.rows:,} rows: {self.missing} missing, {self.extra} extra, "
            f"{self.duplicated} duplicated{shown}"
        )


def exactness(got: Sequence[tuple[Any, ...]], want: Sequence[tuple[Any, ...]]) -> Exactness:
    """`got` (a sink's rows) against `want` (a backfill's), as multisets of whole rows.

    A tail's row leaves `extra` null (an event has no such element, pipelines/live/rows.py)
    until history replaces it: a null `extra` in `got` stands for the backfill's."""
    extras = {row[:3]: row[5] for row in want}
    filled = [
        (*row[:5], extras.get(row[:3]), *row[6:]) if row[5] is None else tuple(row) for row in got
    ]
    have, expected = Counter(filled), Counter(map(tuple, want))
    keys = Counter(row[:3] for row in got)  # (tag, ts, seq): `history_rows`' key
    missing, extra = expected - have, have - expected
    return Exactness(
        rows=len(want),
        missing=sum(missing.values()),
        extra=sum(extra.values()),
        duplicated=sum(count - 1 for count in keys.values() if count > 1),
        examples=tuple(
            [("missing", *row) for row in sorted(missing)[:3]]
            + [("extra", *row) for row in sorted(extra)[:3]]
        ),
    )


def in_span(frame: pd.DataFrame, span: Window) -> pd.DataFrame:
    """The rows of `frame` stamped inside `span` (half-open)."""
    if frame.empty:
        return frame
    stamps = frame["ts"]
    return frame[(stamps >= span.start) & (stamps < span.end)].reset_index(drop=True)


def sink_frame(config: Path, sink: str, flow: str) -> pd.DataFrame:
    """Everything `sink` holds of `flow`'s dataset (read as any reader reads it)."""
    cfg = load(config)
    dataset = cfg.flows[flow].dataset or flow
    with SinkSet(cfg, config.parent) as sinks:
        reader: Any = sinks.get(sink)
        frame: pd.DataFrame = reader.read(dataset, "tag_history")
    return frame


def sink_rows(config: Path, sink: str, flow: str, span: Window) -> list[tuple[Any, ...]]:
    """The sink's rows of `flow` inside `span`, as `exactness` compares them (one node's:
    `history_rows` shows every sink's rows alike, so a warehouse compares with a lake)."""
    return history_rows(in_span(sink_frame(config, sink, flow), span))


def backfill_rows(config: Path, flow: str, span: Window, folder: Path) -> list[tuple[Any, ...]]:
    """A backfill of `span` by `flow` into a lake of its own in `folder` (the same node
    and selection, nothing else of the flow's state), its rows inside `span`."""
    folder.mkdir(parents=True, exist_ok=True)
    document = yaml.safe_load(config.read_text(encoding="utf-8"))
    document["sinks"] = {"reference": {"type": "parquet", "url": str(folder / "lake")}}
    for spec in document["flows"].values():
        spec["sinks"] = ["reference"]
        spec.pop("live", None)
        spec.pop("schedule", None)
    reference = folder / "flows.yaml"
    reference.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
    done = subprocess.run(
        [
            HISTORIAN,
            "backfill",
            flow,
            "--config",
            str(reference),
            "--direct",
            "--start",
            _iso(span.start),
            "--end",
            _iso(span.end),
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise AssertionError(f"the reference backfill failed: {done.stdout}{done.stderr}")
    return sink_rows(reference, "reference", flow, span)


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def start_tail(
    config: Path, flow: str, *args: str, mark: str, out: Path, json_logs: bool = False
) -> subprocess.Popen[bytes]:
    """`historian tail FLOW` as a user starts it, its output appended to `out`
    (`json_logs`: one JSON object per commit, `--log-format json`)."""
    env = {**os.environ, MARK: mark, "COLUMNS": "200"}
    env.pop("HISTORIAN_DEBUG", None)
    with out.open("ab") as sink:
        return subprocess.Popen(
            [
                HISTORIAN,
                *(["--log-format", "json"] if json_logs else []),
                *("tail", flow, "--config", str(config), *args),
            ],
            cwd=config.parent,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def interrupt(process: subprocess.Popen[bytes], signum: int = signal.SIGINT) -> int:
    """Signal the process and wait (bounded) for its exit code."""
    process.send_signal(signum)
    return process.wait(timeout=60)


def marked(mark: str) -> list[int]:
    """Live processes whose environment carries `MARK=mark` (Linux /proc)."""
    wanted = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if wanted not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if "\nState:\tZ" in (entry / "status").read_text():
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.2) -> Any:
    """Poll `check` until it returns something true (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(every_s)


def local_tags(node: Any, count: int | None = None) -> list[str]:
    """The node's tags whose samples arrive as they are stamped (no link lag behind them:
    a lagging tag's events arrive later than any tail window, and history has them)."""
    specs = [spec for spec in node.tree().specs if not spec.remote_lag_ms]
    return [spec.path for spec in specs][:count]


def linked_tags(node: Any, count: int | None = None) -> list[str]:
    """The node's tags over its link (`remote` in details): late by the link's lag, and
    kept on the remote side while the link is down."""
    specs = [spec for spec in node.tree().specs if spec.remote_lag_ms]
    return [spec.path for spec in specs][:count]
