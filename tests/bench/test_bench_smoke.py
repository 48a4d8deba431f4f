"""The benchmark harness runs end to end and every contender writes the same rows.

A smoke test of results, never of times (speed is measured by bench/, not by tests).
dlt is a bench-only extra; contenders that need it are left out when it is missing.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_compare_smoke_gives_equal_rows_for_every_contender(tmp_path: Path) -> None:
    contenders = ["pipeline", "baseline"]
    if importlib.util.find_spec("dlt") is not None:
        contenders.append("dlt")
    out = tmp_path / "measures.json"
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "compare.py"),
            "--smoke",
            "--targets",
            "parquet",
            "--contenders",
            ",".join(contenders),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    measures = json.loads(out.read_text())
    assert {m["contender"] for m in measures} == set(contenders)
    rows = {m["rows"] for m in measures}
    assert len(rows) == 1, measures
    assert rows.pop() > 10_000
