"""The `historian` process keeps Arrow buffers on the system allocator (flat memory)."""

from __future__ import annotations

import subprocess
import sys


def test_bound_memory_moves_arrow_to_the_system_pool_and_is_idempotent() -> None:
    code = (
        "from pipelines.memory import bound_memory; import pyarrow as pa; "
        "bound_memory(); bound_memory(); print(pa.default_memory_pool().backend_name)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "system"
