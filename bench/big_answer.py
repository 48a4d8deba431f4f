"""Peak memory of a backfill whose one window is one giant answer.

    .venv/bin/python bench/big_answer.py                  # one tag, 2.43 M rows, one window
    .venv/bin/python bench/big_answer.py --max-answer-mb 1000     # as before: one answer

A node with no raw cap of its own (`raw-uncapped`) and one tag sampled every millisecond
answers a raw `historyMany` for a 42-minute window in one piece: 2.43 M rows, ~66 MB, the
issue's answer (2.5 M rows of one tag in an hour). The simulator runs in a process of its
own; `historian backfill --direct` into a Parquet lake in another, and its peak RSS
(`ru_maxrss`) is printed with the rows written and whether answers were split.
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import simulator

ROOT = Path(__file__).resolve().parents[1]
HISTORIAN = [str(Path(sys.executable).with_name("historian"))]
START = "2026-11-20T00:00:00Z"


def _config(folder: Path, url: str, max_answer: int | None) -> Path:
    node: dict[str, object] = {"url": url, "read_timeout": "300s"}
    if max_answer is not None:
        node["max_answer_mb"] = max_answer
    document = {
        "nodes": {"n": node},
        "sinks": {"lake": {"type": "parquet", "url": "lake"}},
        "flows": {
            "f": {
                "node": "n",
                "tags": {"paths": ["/Plant A/Line 1/Temp. 000"]},
                "mode": "raw",
                "window": "1h",
                "start": START,
                "settle": "0s",
                "sinks": ["lake"],
            }
        },
    }
    path = folder / "flows.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def backfill(config: Path, minutes: int) -> tuple[int, float, str]:
    """(peak RSS in bytes, seconds, its stderr) of one `historian backfill --direct -v`."""
    end = (datetime.fromisoformat(START) + timedelta(minutes=minutes)).isoformat()
    began = time.perf_counter()
    child = subprocess.Popen(
        [
            *HISTORIAN,
            "backfill",
            "f",
            "--direct",
            "-v",
            "-c",
            str(config),
            "--start",
            START,
            "--end",
            end,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = child.communicate()
    seconds = time.perf_counter() - began
    if child.returncode:
        raise RuntimeError(err.decode()[-2000:])
    # The largest of the children waited for: only this one so far (the simulator runs on).
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return peak, seconds, (out + err).decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-answer-mb", type=int, default=None, help="the node's max_answer_mb")
    parser.add_argument("--minutes", type=int, default=42, help="the window: 42 min, 2.5 M rows")
    parser.add_argument("-v", action="store_true", help="show the backfill's log")
    args = parser.parse_args()
    server, url = simulator(
        "--tags", "10", "--period-ms", "1", "--raw-cap", "100000000", "--profile", "raw-uncapped"
    )
    try:
        with tempfile.TemporaryDirectory() as folder:
            config = _config(Path(folder), url, args.max_answer_mb)
            peak, seconds, err = backfill(config, args.minutes)
    finally:
        server.terminate()
        server.wait(30)
    if "-v" in sys.argv[1:]:
        print(err)
    rows = re.findall(r"(\d+) rows", err)
    print(
        f"peak RSS {peak / 2**20:,.0f} MB in {seconds:.1f} s; {int(rows[-1]) if rows else 0:,} "
        f"rows; answers split: {'yes, said once' if 'smaller pieces' in err else 'no'}"
    )


if __name__ == "__main__":
    main()
