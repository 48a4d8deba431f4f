"""Lake compaction's memory and the cost of re-extracting compacted data, side by side.

    .venv/bin/python bench/bench_compaction.py --against REV [--runs 3] [--tags 40]

Workloads (issue 21), each measured in a fresh child process (peak RSS is that process's
own, imports included; `base` is its RSS before the measured step):

* `compact-day`: 1,440 one-minute chunks of one day (partition `date`), then `compact()`.
* `compact-2days`: 2,880 one-minute chunks of two days under `partition: month`.
* `compact-rows`: 240 chunks of 4,000 rows (960,000 rows, each file under the small-file
  size, so all are merged: the rows one merge holds).
* `reextract-empty`: the day's 1,440 chunks written into an empty lake (seconds).
* `reextract-compacted`: the same chunks written again over the compacted day (seconds).

Lakes are prepared once by this tree (the file layout is the same at both revisions) and
copied for every measurement. `--against REV` runs the same steps with sinks/ of git
revision REV, alternating with this tree run by run (the machine is shared: compare
ratios within one run). Without it, only this tree is measured.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.bench_parquet import START_MS, chunk_frame  # noqa: E402
from bench.revisions import sinks_module_at  # noqa: E402
from connectors import schema  # noqa: E402
from connectors.timewindow import Window  # noqa: E402
from sinks.base import ChunkScope  # noqa: E402

MINUTE_MS = 60_000
THIS = "this tree"


def tag_names(count: int) -> list[str]:
    return [f"/Plant A/Line {i // 10}/Temp {i:03d}" for i in range(count)]


def chunks(tags: list[str], minutes: int, rows_per_tag: int, step_ms: int) -> list[Any]:
    """(scope, frame) of `minutes` consecutive chunks of `step_ms` each, every tag."""
    found = []
    for m in range(minutes):
        start = START_MS + m * step_ms
        frame = chunk_frame(tags, start, start + step_ms, rows_per_tag)
        scope = ChunkScope(
            flow="bench",
            dataset="hist",
            kind=schema.KIND_TAG_HISTORY,
            members=tuple(tags),
            window=Window.from_ms(start, start + step_ms),
            chunk_id=f"m{m:05d}",
            attrs={"mode": "raw"},
            node="node1",
            window_size=timedelta(milliseconds=step_ms),
        )
        found.append((scope, frame))
    return found


WORKLOADS: dict[str, dict[str, Any]] = {
    "compact-day": {"minutes": 1440, "partition": "date", "rows_per_tag": 3, "step": MINUTE_MS},
    "compact-2days": {
        "minutes": 2880,
        "partition": "month",
        "rows_per_tag": 3,
        "step": MINUTE_MS,
    },
    "compact-rows": {"minutes": 240, "partition": "month", "rows_per_tag": 100, "step": 360_000},
}


def lake_class(revision: str | None) -> Any:
    """ParquetLake of this tree, or of sinks/ at a git revision."""
    if revision is None:
        from sinks.lake.sink import ParquetLake

        return ParquetLake
    return sinks_module_at(revision, "lake.sink", "parquet").ParquetLake


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args: argparse.Namespace) -> None:
    """One measured step in this process; prints one JSON line."""
    lake_type = lake_class(args.revision)
    spec = WORKLOADS.get(args.workload, WORKLOADS["compact-day"])
    result: dict[str, Any] = {}
    if args.step == "compact":
        lake = lake_type(args.lake, partition=spec["partition"])
        lake.open()
        base = peak_mb()
        began = time.perf_counter()
        result["merged"] = lake.compact("hist")
    else:  # write the day's chunks (into whatever the lake holds)
        work = chunks(tag_names(args.tags), spec["minutes"], spec["rows_per_tag"], spec["step"])
        lake = lake_type(args.lake, partition=spec["partition"])
        lake.open()
        base = peak_mb()
        began = time.perf_counter()
        for scope, frame in work:
            lake.write(scope, frame, len(frame))
    result["seconds"] = time.perf_counter() - began
    result["base_mb"] = base
    result["peak_mb"] = peak_mb()
    print(json.dumps(result))


def step(name: str, workload: str, lake: Path, revision: str | None, tags: int) -> dict[str, Any]:
    """Run one measured step (`compact` or `write`) in a fresh child process."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", "--step", name]
    command += ["--workload", workload, "--lake", str(lake), "--tags", str(tags)]
    command += ["--revision", revision] if revision else []
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def prepare(work: Path, workload: str, tags: int) -> Path:
    """A lake holding the workload's chunk files, written once by this tree."""
    lake = work / f"template-{workload}"
    if not lake.exists():
        step("write", workload, lake, None, tags)
    return lake


def fresh(lake: Path, template: Path | None = None) -> Path:
    """`lake` emptied, or a copy of `template`."""
    shutil.rmtree(lake, ignore_errors=True)
    if template is not None:
        shutil.copytree(template, lake)
    return lake


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="alternate with sinks/ at this revision")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--tags", type=int, default=40, help="tags per chunk (3 rows each a minute)"
    )
    parser.add_argument("--workloads", default=",".join([*WORKLOADS, "reextract"]))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--step", default="compact", help=argparse.SUPPRESS)
    parser.add_argument("--workload", default="compact-day", help=argparse.SUPPRESS)
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    parser.add_argument("--revision", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    contenders: list[str | None] = [None] + ([args.against] if args.against else [])
    chosen = args.workloads.split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-compaction-"))
    lake = work / "lake"
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def record(workload: str, revision: str | None, found: dict[str, Any]) -> None:
        results.setdefault((workload, revision or THIS), []).append(found)

    try:
        for run in range(args.runs):
            order = contenders if run % 2 == 0 else contenders[::-1]
            for workload in [w for w in chosen if w in WORKLOADS]:
                template = prepare(work, workload, args.tags)
                for revision in order:
                    fresh(lake, template)
                    record(workload, revision, step("compact", workload, lake, revision, args.tags))
            if "reextract" in chosen:
                template = prepare(work, "compact-day", args.tags)
                for revision in order:
                    fresh(lake)
                    found = step("write", "compact-day", lake, revision, args.tags)
                    record("reextract-empty", revision, found)
                    fresh(lake, template)
                    step("compact", "compact-day", lake, revision, args.tags)
                    found = step("write", "compact-day", lake, revision, args.tags)
                    record("reextract-compacted", revision, found)
            print(f"run {run + 1} of {args.runs} done", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"| workload | sinks/ | seconds (median of {args.runs}) | peak RSS MB | base RSS MB |")
    print("|---|---|---:|---:|---:|")
    for (workload, who), found in results.items():
        seconds = statistics.median(f["seconds"] for f in found)
        peak = statistics.median(f["peak_mb"] for f in found)
        base = statistics.median(f["base_mb"] for f in found)
        print(f"| {workload} | {who} | {seconds:.2f} | {peak:.0f} | {base:.0f} |")


if __name__ == "__main__":
    main()
