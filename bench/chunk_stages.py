"""Where a chunk's fixed cost goes: CPU per stage, small windows against large ones.

    .venv/bin/python bench/chunk_stages.py --runs 3
    .venv/bin/python bench/chunk_stages.py --target postgres --pg-url postgresql+psycopg://...

The same rows (100 tags x 2 h at 1 s, a replay-mode simulator) extracted twice by
`run_flow` in a fresh process (bench/contenders.py `pipeline`): in 1-minute windows (120
chunks) and in 30-minute ones (4). Each stage below is timed by the CPU clock of the
thread running it (`time.thread_time`, outermost call only), so the fetch threads and the
writer read apart; the difference between the two runs, over the 116 extra chunks, is a
chunk's fixed cost per stage. Medians of `--runs` pairs (one unmeasured pair first: the
node renders its answers). Issue 31's target: 5 ms a chunk.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import resource
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import HERE, PYTHON, WORKLOADS, compiled, start_simulator

# (module, attribute) of each stage; a method is timed wherever it is called from, a
# function where the module named calls it.
STAGES = {
    "fetch (thread)": ("pipelines.core.engine", "HistoryEngine.fetch_chunk"),
    "  http request": ("connectors.client", "NodeClient.request"),
    "  parse answer": ("connectors.fetch", "parse_history_answer"),
    "write (writer)": ("pipelines.core.runner", "FlowRun._write_one"),
    "  lake: rows as table": ("sinks.lake.sink", "table_of"),
    "  lake: scope check": ("sinks.lake.sink", "check_scope"),
    "  lake: sort": ("sinks.lake.sink", "sorted_rows"),
    "  lake: ledger rows": ("sinks.lake.sink", "ledger_rows"),
    "  lake: plan (data files)": ("sinks.lake.overlap", "WritePlanner.plan"),
    "  lake: stage ledger file": ("sinks.lake.sink", "stage_ledger"),
    "  lake: journal commit": ("sinks.lake.journal", "Journal.commit"),
    "  sql: write": ("sinks.sql.warehouse", "SqlWarehouse._write"),
    "compact (end of run)": ("pipelines.core.runner", "FlowRun.compact"),
}
SMALL, LARGE = "chunks-1m", "chunks-30m"


def timed(spent: dict[str, list[float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn`, adding the CPU of its outermost calls on each thread to `spent[name]`."""
    depth = threading.local()

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(depth, "in", False):
            return fn(*args, **kwargs)
        depth.__dict__["in"] = True
        began = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name][0] += time.thread_time() - began
            spent[name][1] += 1
            depth.__dict__["in"] = False

    return wrapper


def child(out: str, argv: list[str]) -> None:
    """Run bench/contenders.py with `argv`, its stages timed; write the times to `out`."""
    spent: dict[str, list[float]] = {}
    for name, (module, attribute) in STAGES.items():
        owner: Any = importlib.import_module(module)
        *path, last = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        if hasattr(owner, last):
            spent[name] = [0.0, 0]
            setattr(owner, last, timed(spent, name, getattr(owner, last)))
    sys.argv = argv
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code:
            raise
    usage = resource.getrusage(resource.RUSAGE_SELF)
    spent["process"] = [usage.ru_utime + usage.ru_stime, 1]
    Path(out).write_text(json.dumps(spent), encoding="utf-8")


def measure(workload: str, url: str, tags_file: Path, args: argparse.Namespace) -> dict:
    """One fresh process extracting `workload`; its stage times."""
    work = WORKLOADS[workload].work()
    out_dir = Path(tempfile.mkdtemp(prefix="bench-stages-"))
    result = out_dir / "stages.json"
    try:
        command = [PYTHON, __file__, "--child", str(result), "--"]
        command += [str(HERE / "contenders.py"), "pipeline", "--url", url]
        command += ["--tags-file", str(tags_file), "--work", work.to_json()]
        command += ["--target", args.target, "--out", str(out_dir / "out")]
        command += ["--pg-url", args.pg_url, "--pg-schema", f"bench_stages_{os.getpid()}"]
        subprocess.run(command, check=True, capture_output=True)
        return dict(json.loads(result.read_text(encoding="utf-8")))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
        if args.target == "postgres":
            import sqlalchemy as sa

            engine = sa.create_engine(args.pg_url)
            with engine.begin() as conn:
                conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS bench_stages_{os.getpid()} CASCADE")
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", choices=["parquet", "postgres"], default="parquet")
    parser.add_argument("--pg-url", default="postgresql+psycopg://root@127.0.0.1:5432/test")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        child(args.child, rest[1:] if rest[:1] == ["--"] else rest)
        return
    compiled(HERE.parent)
    simulator, url = start_simulator(WORKLOADS[SMALL])
    try:
        answer = httpx.get(f"{url}/tag?cmd=details&path=%2F&options.recurrent=true", timeout=120)
        paths = sorted(e["fullPath"] for e in answer.json()["tags"].values())
        tags_file = Path(tempfile.mkstemp(suffix=".json")[1])
        tags_file.write_text(json.dumps(paths[: WORKLOADS[SMALL].tags]), encoding="utf-8")
        for workload in (SMALL, LARGE):  # unmeasured: the node renders its answers
            measure(workload, url, tags_file, args)
        runs = [
            {w: measure(w, url, tags_file, args) for w in (SMALL, LARGE)} for _ in range(args.runs)
        ]
    finally:
        simulator.kill()
    report(runs, args)


def report(runs: list[dict[str, dict]], args: argparse.Namespace) -> None:
    """Medians per stage of both workloads, and their difference over the extra chunks."""
    extra = 120 - 4
    print(f"# a chunk's fixed cost by stage ({args.target}, {args.runs} pairs, medians)")
    print(f"{'stage':28} {'1-min (120)':>12} {'30-min (4)':>11} {'ms a chunk':>11}")
    for name in ["process", *STAGES]:
        if name not in runs[0][SMALL]:
            continue
        small = statistics.median(r[SMALL][name][0] for r in runs)
        large = statistics.median(r[LARGE][name][0] for r in runs)
        if small == large == 0:
            continue
        per_chunk = statistics.median((r[SMALL][name][0] - r[LARGE][name][0]) for r in runs)
        print(f"{name:28} {small:11.3f}s {large:10.3f}s {per_chunk / extra * 1000:10.2f}")


if __name__ == "__main__":
    main()
