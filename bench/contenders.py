"""The contenders of bench/compare.py: the same extraction, written four ways.

Run as `python bench/contenders.py NAME --url URL --tags-file F --start S --end E
--target parquet|postgres --out DIR [--pg-url URL]`; prints one JSON line
`{"rows": N}`. The parent process measures wall time, CPU time and peak RSS of this
process (os.wait4), so every contender pays its own imports and start-up.

* `pipeline` — this project's runner, direct (no Prefect): `run_flow` backfill.
* `dlt` — the dlt library as its docs show it: a resource that fetches `historyMany`
  answers with httpx and yields one dict per sample; filesystem (Parquet) or postgres
  destination.
* `baseline` — what a user writes by hand: httpx + json + pandas.DataFrame +
  `to_parquet` / `to_sql`.
The `cli` contender (this project through `historian backfill`, Prefect included) is
launched by the parent directly.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote

BATCH = 100
WINDOW = timedelta(hours=1)


def windows(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    cursor = start
    while cursor < end:
        upper = min(end, cursor + WINDOW)
        yield cursor, upper
        cursor = upper


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def history_url(base: str, paths: list[str], start: datetime, end: datetime) -> str:
    query = (
        f"cmd=historyMany&paths={quote(json.dumps(paths), safe='')}"
        f"&start={quote(iso(start))}&end={quote(iso(end))}&options.mode=raw"
    )
    return f"{base}/tag?{query}"


def run_pipeline(args: argparse.Namespace, tags: list[str]) -> int:
    from pipelines.memory import bound_memory

    bound_memory()  # as the `historian` command does at start
    from pipelines.config import parse_config
    from pipelines.destinations import SinkSet
    from pipelines.nodes import NodePool
    from pipelines.runner import RunRequest, run_flow

    sink = (
        {"type": "parquet", "url": str(Path(args.out) / "lake")}
        if args.target == "parquet"
        else {"type": "sql", "url": args.pg_url, "schema": args.pg_schema}
    )
    config = parse_config(
        {
            "nodes": {"n": {"url": args.url, "max_connections": args.concurrency}},
            "sinks": {"s": sink},
            "flows": {
                "bench": {
                    "node": "n",
                    "tags": {"paths": tags},
                    "mode": "raw",
                    "window": "1h",
                    "batch": BATCH,
                    "start": args.start,
                    "settle": "0s",
                    "metadata": False,
                    "sinks": ["s"],
                }
            },
        },
        env={},
    )
    start = datetime.fromisoformat(args.start.replace("Z", "+00:00"))
    end = datetime.fromisoformat(args.end.replace("Z", "+00:00"))
    with NodePool(config) as nodes, SinkSet(config, Path(args.out)) as sinks:
        summary = run_flow(
            config, "bench", nodes=nodes, sinks=sinks, request=RunRequest(start=start, end=end)
        )
    return summary.rows


def run_dlt(args: argparse.Namespace, tags: list[str]) -> int:
    import dlt
    import httpx

    start = datetime.fromisoformat(args.start.replace("Z", "+00:00"))
    end = datetime.fromisoformat(args.end.replace("Z", "+00:00"))

    @dlt.resource(name="tag_history", write_disposition="append")
    def tag_history() -> Iterator[dict[str, object]]:
        with httpx.Client(timeout=120) as client:
            for lower, upper in windows(start, end):
                for i in range(0, len(tags), BATCH):
                    batch = tags[i : i + BATCH]
                    answer = client.get(history_url(args.url, batch, lower, upper)).json()
                    for tag, entry in answer.items():
                        for row in entry.get("data") or []:
                            if lower.timestamp() * 1000 <= row[0] < upper.timestamp() * 1000:
                                yield {
                                    "node": "n",
                                    "tag": tag,
                                    "ts": datetime.fromtimestamp(row[0] / 1000, tz=UTC),
                                    "value": row[1],
                                    "quality": row[2] if len(row) > 2 else None,
                                    "extra": row[3] if len(row) > 3 else None,
                                }

    if args.target == "parquet":
        destination = dlt.destinations.filesystem(bucket_url=str(Path(args.out) / "dlt_lake"))
        file_format = "parquet"
    else:
        import sqlalchemy as sa

        url = sa.engine.make_url(args.pg_url.replace("+psycopg", ""))
        # dlt insists on a password; a trust-auth server ignores it.
        url = url.set(password=url.password or "unused")
        destination = dlt.destinations.postgres(
            credentials=url.render_as_string(hide_password=False)
        )
        file_format = None
    pipeline = dlt.pipeline(
        pipeline_name="bench_dlt",
        destination=destination,
        dataset_name=args.pg_schema or "bench",
        pipelines_dir=str(Path(args.out) / "dlt_pipelines"),
    )
    info = pipeline.run(tag_history(), loader_file_format=file_format)
    info.raise_on_failed_jobs()
    counts = pipeline.last_trace.last_normalize_info.row_counts  # type: ignore[union-attr]
    return int(counts.get("tag_history", 0))


def run_baseline(args: argparse.Namespace, tags: list[str]) -> int:
    import httpx
    import pandas as pd

    start = datetime.fromisoformat(args.start.replace("Z", "+00:00"))
    end = datetime.fromisoformat(args.end.replace("Z", "+00:00"))
    out = Path(args.out) / "baseline"
    out.mkdir(parents=True, exist_ok=True)
    engine = None
    if args.target == "postgres":
        import sqlalchemy as sa

        engine = sa.create_engine(args.pg_url)
    rows = 0
    part = 0
    with httpx.Client(timeout=120) as client:
        for lower, upper in windows(start, end):
            for i in range(0, len(tags), BATCH):
                batch = tags[i : i + BATCH]
                answer = json.loads(client.get(history_url(args.url, batch, lower, upper)).text)
                records = []
                for tag, entry in answer.items():
                    for row in entry.get("data") or []:
                        records.append((tag, *row))
                frame = pd.DataFrame(records, columns=["tag", "ts", "value", "quality", "extra"])
                frame["ts"] = pd.to_datetime(frame["ts"], unit="ms", utc=True)
                frame = frame[(frame["ts"] >= lower) & (frame["ts"] < upper)]
                frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
                rows += len(frame)
                if engine is None:
                    frame.to_parquet(out / f"part-{part:06d}.parquet", index=False)
                else:
                    frame.to_sql(
                        "baseline",
                        engine,
                        schema=args.pg_schema,
                        if_exists="append",
                        index=False,
                        method="multi",
                        chunksize=5000,
                    )
                part += 1
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name", choices=["pipeline", "dlt", "baseline"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--tags-file", required=True)
    parser.add_argument("--start", required=True)
    parser.add_argument("--end", required=True)
    parser.add_argument("--target", choices=["parquet", "postgres"], default="parquet")
    parser.add_argument("--out", required=True)
    parser.add_argument("--pg-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--pg-schema", default=None)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    tags = json.loads(Path(args.tags_file).read_text(encoding="utf-8"))
    runner = {"pipeline": run_pipeline, "dlt": run_dlt, "baseline": run_baseline}[args.name]
    rows = runner(args, tags)
    sys.stdout.write(json.dumps({"rows": rows}) + "\n")


if __name__ == "__main__":
    main()
