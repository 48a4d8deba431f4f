"""Where a backfill's memory goes: Arrow's pool, malloc's heap, Python objects, chunks held.

    .venv/bin/python bench/memory_attribution.py --hours 1,12,48     # 100 tags at 1 s
    .venv/bin/python bench/memory_attribution.py --hours 12 --tracemalloc

One replay-mode simulator (100 tags sampled every second) in its own process; for each
span a fresh child process runs the `pipeline` contender's backfill (`run_flow`, direct,
Parquet lake) with a sampler thread beside it that reads, every few milliseconds: the
process's resident memory (`/proc/self/status`: VmRSS, RssAnon), the bytes Arrow's pool
holds (`pa.total_allocated_bytes()`), glibc's heap (`mallinfo2`: bytes in use in its
arena, free bytes it keeps, bytes in mmapped blocks), the Python objects traced
(`tracemalloc`, with `--tracemalloc`: it slows the run) and the chunks held (fetched or
fetching, not yet written: the engine's `HELD` counter). It prints the peak of each and,
at the sample of the highest RSS, what made it up.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare import PYTHON, Workload, start_simulator

MB = 1 << 20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _status() -> dict[str, int]:
    fields: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024
    return fields


def _held() -> int:
    """Chunks the run holds (the engine's counter; absent at revisions before it: -1)."""
    engine = sys.modules.get("pipelines.core.engine")
    held = getattr(engine, "HELD", None)
    return int(held.now) if held is not None else -1


def sample(traced: bool) -> dict[str, int]:
    import pyarrow as pa

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    row = _status()
    row.update(
        arrow=pa.total_allocated_bytes(),
        malloc_used=info.uordblks,
        malloc_free=info.fordblks,
        malloc_mmapped=info.hblkhd,
        held=_held(),
    )
    if traced:
        import tracemalloc

        row["python"] = tracemalloc.get_traced_memory()[0]
    return row


def _variant(name: str) -> None:
    """Memory settings to try instead of `bound_memory`'s ("" keeps them): Arrow's pool
    (system, mimalloc, jemalloc), then `+` options: `trim` (malloc_trim(0) after each
    chunk), `release` (the pool's release_unused after each chunk), `decay0` (jemalloc
    hands pages back at once), `keep` (never), `mmapN` / `trimN` (glibc's mmap / trim threshold, N MB)."""
    if not name:
        return
    import pyarrow as pa

    from pipelines.core import memory, runner

    memory._applied = True
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-8, 1)  # M_ARENA_MAX
    pool_name, *options = name.split("+")
    pool = {
        "system": pa.system_memory_pool,
        "mimalloc": pa.mimalloc_memory_pool,
        "jemalloc": pa.jemalloc_memory_pool,
    }[pool_name]()
    pa.set_memory_pool(pool)
    if "decay0" in options:
        pa.jemalloc_set_decay_ms(0)
    if "keep" in options:
        pa.jemalloc_set_decay_ms(-1)
    steps = []
    for option in options:
        if option.startswith("mmap"):
            libc.mallopt(-3, int(option[4:]) * MB)  # M_MMAP_THRESHOLD
        elif option.startswith("trim") and option != "trim":
            libc.mallopt(-1, int(option[4:]) * MB)  # M_TRIM_THRESHOLD
        elif option == "trim":
            steps.append(lambda: libc.malloc_trim(0))
        elif option == "release":
            steps.append(pool.release_unused)

    def release() -> None:
        for step in steps:
            step()

    write = runner.FlowRun.write

    def write_then_release(self: runner.FlowRun, result: runner.ChunkResult) -> Any:
        outcome = write(self, result)
        release()
        return outcome

    runner.FlowRun.write = write_then_release  # type: ignore[method-assign]


def child(args: argparse.Namespace) -> None:
    """Run the backfill here, sampling beside it; print the peaks as one JSON line."""
    import resource

    import contenders

    _variant(args.variant)

    if args.tracemalloc:
        import tracemalloc

        tracemalloc.start()
    samples: list[dict[str, int]] = []
    done = threading.Event()

    biggest: list[Any] = [0, None]  # the most Python memory traced, its snapshot

    def sampler() -> None:
        while not done.is_set():
            row = sample(args.tracemalloc)
            samples.append(row)
            if args.tracemalloc and row["python"] > biggest[0] + 4 * MB:
                import tracemalloc

                biggest[:] = [row["python"], tracemalloc.take_snapshot()]
            done.wait(args.every_ms / 1000)

    thread = threading.Thread(target=sampler, daemon=True)
    began = time.perf_counter()
    thread.start()
    run = argparse.Namespace(
        url=args.url,
        target="parquet",
        out=args.out,
        pg_url="",
        pg_schema=None,
        concurrency=2,
        incremental=False,
    )
    tags = json.loads(Path(args.tags_file).read_text(encoding="utf-8"))
    rows = contenders.run_pipeline(run, tags, contenders.Work.from_json(args.work))
    done.set()
    thread.join()
    top = max(samples, key=lambda row: row["VmRSS"])
    peaks = {name: max(row.get(name, 0) for row in samples) for name in top}
    lines = []
    if biggest[1] is not None:
        for stat in biggest[1].statistics("lineno")[:12]:
            frame = stat.traceback[0]
            lines.append(f"{stat.size / MB:7.1f} MB  {frame.filename}:{frame.lineno}")
    result = {
        "rows": rows,
        "seconds": time.perf_counter() - began,
        "peak": peaks,
        "at_top": top,
        "hwm": _status()["VmHWM"],
        "python_top": lines,
        "user": resource.getrusage(resource.RUSAGE_SELF).ru_utime,
        "system": resource.getrusage(resource.RUSAGE_SELF).ru_stime,
        "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
    }
    print(json.dumps(result))


def measure(
    url: str, tags_file: Path, hours: int, traced: bool, variant: str = ""
) -> dict[str, Any]:
    work = Workload("attribution", 100, timedelta(hours=hours), "").work()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as out:
        command = [
            *(PYTHON, __file__, "--child", "--url", url, "--tags-file", str(tags_file)),
            *("--work", work.to_json(), "--out", out),
            *(["--tracemalloc"] if traced else []),
            *(["--variant", variant] if variant else []),
        ]
        done = subprocess.run(command, capture_output=True, check=False, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", default="1,12,48")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--every-ms", type=float, default=5.0)
    parser.add_argument("--variants", default="", help="memory settings to try, comma-separated")
    parser.add_argument("--variant", default="", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--url", "--tags-file", "--work", "--out"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    node = Workload("attribution", 100, timedelta(hours=1), "", period_ms=1000)
    simulator, url = start_simulator(node)
    try:
        import httpx

        answer = httpx.get(f"{url}/tag?cmd=details&path=%2F&options.recurrent=true", timeout=60)
        paths = sorted(entry["fullPath"] for entry in answer.json()["tags"].values())[:100]
        tags_file = Path(tempfile.mkstemp(suffix=".json")[1])
        tags_file.write_text(json.dumps(paths), encoding="utf-8")
        columns = ("VmRSS", "RssAnon", "arrow", "malloc_used", "malloc_free", "malloc_mmapped")
        extra = ("python",) if args.tracemalloc else ()
        print(
            "| variant | hours | rows | s | CPU s | system % | minor faults | "
            + " | ".join(f"{c} peak / at top MB" for c in columns + extra)
            + " | chunks held peak / at top | VmHWM MB |"
        )
        print("|---" * (8 + len(columns) + len(extra)) + "|")
        for hours in [int(h) for h in args.hours.split(",")]:
            measure(url, tags_file, hours, False)  # fills the node's replay cache
            for variant in args.variants.split(","):
                result = measure(url, tags_file, hours, args.tracemalloc, variant)
                peak, top = result["peak"], result["at_top"]
                cells = [f"{peak[c] / MB:,.0f} / {top[c] / MB:,.0f}" for c in columns + extra]
                cpu = result["user"] + result["system"]
                print(
                    f"| {variant or 'as configured'} | {hours} | {result['rows']:,} | "
                    f"{result['seconds']:.1f} | {cpu:.2f} | {100 * result['system'] / cpu:.0f} | "
                    f"{result['faults']:,} | "
                    + " | ".join(cells)
                    + f" | {peak['held']} / {top['held']} | {result['hwm'] / MB:,.0f} |",
                    flush=True,
                )
                for line in result["python_top"]:
                    print("    ", line, flush=True)
        tags_file.unlink()
    finally:
        simulator.terminate()
        simulator.wait(timeout=30)


if __name__ == "__main__":
    main()
