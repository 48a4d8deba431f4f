"""Coverage reports of a 1-hour, a 1-day and a 1-year range, screenshot in headless Chromium.

    .venv/bin/python bench/report_screenshot.py [--out report-shots] [--tags 24]

Writes a small project into OUT (flows.yaml and a Parquet lake of made-up history: tags
sampled every second, every 30 s and every hour over the three ranges, with gaps, stretches
of bad quality, a boolean, a text tag, a tag that never reported, hostile paths, and a day
of alarms), renders each flow with `historian report` (the command a user runs), and
screenshots every page with Debian's Chromium (`apt-get install -y chromium`), run
headless, offline, with a fresh profile. Look at the PNGs: that is the check.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from connectors.schema import (
    ALARM_HISTORY_SCHEMA,
    KIND_ALARM_HISTORY,
    KIND_TAG_HISTORY,
    TAG_HISTORY_SCHEMA,
    frame_from_table,
)
from connectors.timewindow import Window
from pipelines.config.destinations import SinkSet
from pipelines.config.models import load_config
from sinks.base import ChunkScope

END = datetime(2026, 11, 1, tzinfo=UTC)
RANGES = {  # flow: (span, sampling period)
    "hour": (timedelta(hours=1), timedelta(seconds=1)),
    "day": (timedelta(days=1), timedelta(seconds=30)),
    "year": (timedelta(days=365), timedelta(hours=1)),
}
HOSTILE = [
    "/Plant <A>/\"Temp\" & 'x' </svg><script>alert(1)</script>",
    "/Plant A/Cost $x$ per m^3",
    "/Plant A/ctrl\x01char",
    "/Usine Süd/Pompe ß/Débit 🌊",
    "/Deep" + "/level" * 40 + "/Flow",
]
PAGE_PX, ROW_PX = 900, 34  # the page without its rows; one tag in the grid and the table
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    # Offline: any host name fails to resolve, so a page that tried to fetch would show it.
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def tag_paths(count: int) -> list[str]:
    plain = [
        f"/Plant {'AB'[i % 2]}/Line {i % 4 + 1}/{('Temp', 'Pressure', 'Flow', 'Level')[i % 4]} {i:02d}"
        for i in range(max(0, count - len(HOSTILE) - 3))
    ]
    return sorted(
        [*plain, *HOSTILE, "/Plant A/Pump running", "/Plant A/Batch id", "/Plant B/never reports"]
    )


def tag_rows(paths: list[str], window: Window, period: timedelta, seed: int) -> pa.Table:
    """Made-up samples: waves with noise, a gap for some tags, bad quality for others."""
    rng = np.random.default_rng(seed)
    start, span = window.start_ms, window.end_ms - window.start_ms
    step = int(period.total_seconds() * 1000)
    parts = []
    for i, path in enumerate(paths):
        if path.endswith("never reports"):
            continue
        ts = np.arange(start, window.end_ms, step, dtype=np.int64)
        if i % 5 == 2:  # a hole from 30 % to 45 % of the range
            ts = ts[(ts < start + span * 0.30) | (ts >= start + span * 0.45)]
        if i % 7 == 3:  # reported only the first 80 % (the rest is not extracted yet)
            ts = ts[ts < start + span * 0.8]
        n = len(ts)
        phase = (ts - start) / span * 2 * np.pi * (1 + i % 3)
        value = 40 + 15 * np.sin(phase) + rng.normal(0, 2, n) + (i % 4) * 30
        quality = np.full(n, 192, np.int16)
        if i % 4 == 1:
            quality[int(n * 0.6) : int(n * 0.66)] = 0
        boolean = text = None
        if path.endswith("Pump running"):
            boolean, value = np.sin(phase * 3) > 0, None
        elif path.endswith("Batch id"):
            text, value = [f"B{int(t // 3_600_000) % 97}" for t in ts], None
        good_value = None if value is None else np.where(quality >= 192, value, np.nan)
        parts.append(
            pa.table(
                {
                    "node": pa.array(["plant"] * n),
                    "tag": pa.array([path] * n),
                    "ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
                    "seq": np.zeros(n, np.int16),
                    "value": pa.array(good_value, pa.float64(), from_pandas=True)
                    if good_value is not None
                    else pa.nulls(n, pa.float64()),
                    "value_bool": pa.array(boolean)
                    if boolean is not None
                    else pa.nulls(n, pa.bool_()),
                    "value_str": pa.array(text) if text is not None else pa.nulls(n, pa.string()),
                    "quality": quality,
                    "extra": np.zeros(n, np.int64),
                },
                schema=TAG_HISTORY_SCHEMA,
            )
        )
    return pa.concat_tables(parts)


def alarm_rows(window: Window, seed: int) -> pa.Table:
    """A day of alarm changes: mostly Low and Medium, bursts of High and Critical."""
    rng = np.random.default_rng(seed)
    count = 900
    paths = [f"/Alarms/Plant {'AB'[i % 2]}/Line {i % 4 + 1}/Alarm {i:02d} HI" for i in range(40)]
    ts = np.sort(rng.integers(window.start_ms, window.end_ms, count))
    priority = rng.choice([1, 2, 3, 4], count, p=[0.45, 0.3, 0.17, 0.08]).astype(np.int16)
    status = rng.choice([3, 1, 2, 0], count, p=[0.3, 0.25, 0.2, 0.25]).astype(np.int16)
    columns = {
        "node": ["plant"] * count,
        "path": [paths[i] for i in rng.integers(0, len(paths), count)],
        "ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
        "status": status,
        "priority": priority,
    }
    rest = {f.name: pa.nulls(count, f.type) for f in ALARM_HISTORY_SCHEMA if f.name not in columns}
    return pa.table({**columns, **rest}, schema=ALARM_HISTORY_SCHEMA)


def make_project(out: Path, tags: int) -> Path:
    """flows.yaml and a lake holding the three tag flows and an alarm flow."""
    paths = tag_paths(tags)
    flows = {
        name: {"node": "plant", "tags": {"paths": paths}, "start": "-400d", "sinks": ["lake"]}
        for name in RANGES
    }
    flows["alarms"] = {"node": "plant", "kind": "alarm_history", "start": "-2d", "sinks": ["lake"]}
    document = {
        "nodes": {"plant": {"url": "http://127.0.0.1:9"}},
        "sinks": {"lake": {"type": "parquet", "url": "lake"}},
        "flows": flows,
    }
    config_path = out / "flows.yaml"
    config_path.write_text(yaml.safe_dump(document, allow_unicode=True), encoding="utf-8")
    config = load_config(config_path, env={})
    with SinkSet(config, out) as sinks:
        lake = sinks.get("lake")
        for seed, (name, (span, period)) in enumerate(RANGES.items()):
            window = Window(END - span, END)
            rows = tag_rows(paths, window, period, seed)
            late = sorted({p for i, p in enumerate(paths) if i % 7 == 3})
            early = tuple(p for p in paths if p not in late)
            for members, part, chunk in (
                (early, window, "a"),
                (tuple(late), Window(window.start, window.start + span * 0.8), "b"),
            ):
                mask = np.isin(rows.column("tag").to_numpy(zero_copy_only=False), list(members))
                table = rows.filter(pa.array(mask))
                scope = ChunkScope(
                    name, name, KIND_TAG_HISTORY, members, part, f"{name}-{chunk}",
                    {"kind": KIND_TAG_HISTORY}, node="plant",
                )  # fmt: skip
                lake.write(scope, frame_from_table(table), table.num_rows)
        window = Window(END - timedelta(days=1), END)
        alarms = alarm_rows(window, 7)
        scope = ChunkScope(
            "alarms", "alarms", KIND_ALARM_HISTORY, ("/",), window, "alarms-a",
            {"kind": KIND_ALARM_HISTORY}, node="plant",
        )  # fmt: skip
        lake.write(scope, frame_from_table(alarms), alarms.num_rows)
    return config_path


def render(config_path: Path, flow: str, page: Path, *extra: str) -> None:
    historian = Path(sys.executable).with_name("historian")
    command = [
        str(historian),
        "report",
        flow,
        "--out",
        str(page),
        "--config",
        str(config_path),
        *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"historian report {flow} failed: {result.stderr.strip()}")


def screenshot(chromium: str, page: Path, png: Path, height: int) -> None:
    with tempfile.TemporaryDirectory(prefix="historian-chromium-") as profile:
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size=1280,{height}",
                f"--screenshot={png}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            check=True,
            timeout=120,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("report-shots"))
    parser.add_argument("--tags", type=int, default=24)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "")
    args = parser.parse_args()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    config_path = make_project(out, args.tags)
    pages = {
        "hour": ("hour", ()),
        "day": ("day", ()),
        "year": ("year", ()),
        "year-march": ("year", ("--start", "2026-03-01", "--end", "2026-04-01")),
        "alarms": ("alarms", ()),
    }
    for name, (flow, extra) in pages.items():
        page = out / f"{name}.html"
        render(config_path, flow, page, *extra)
        line = f"{page} ({page.stat().st_size / 1024:.0f} KB)"
        if args.chromium:
            png = page.with_suffix(".png")
            screenshot(args.chromium, page, png, PAGE_PX + args.tags * ROW_PX)
            line += f" -> {png}"
        print(line)
    if not args.chromium:
        print("chromium not found (apt-get install -y chromium): pages written, no screenshots")


if __name__ == "__main__":
    main()
