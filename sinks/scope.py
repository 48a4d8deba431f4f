"""The one check every sink makes before a write: no row may fall outside the chunk's scope.

A chunk's write replaces exactly its scope (its members inside its window); a row outside
it would escape that replace, so a re-run would keep it twice or a later chunk would
delete it. Every sink refuses such a frame with this check, before it writes anything.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from connectors.schema import KIND_TAG_HISTORY, SCOPE_COLUMN, names_of
from sinks.base import ChunkScope, SinkError


def rows_outside(scope: ChunkScope, table: pa.Table) -> list[str]:
    """What in `table` lies outside `scope`, in words (empty when every row is inside).

    Alarm scopes are the whole selection within the window: only their time is checked.
    """
    if table.num_rows == 0:
        return []
    problems = []
    bounds = pc.min_max(pc.cast(table["ts"], pa.int64()))
    low, high = int(bounds["min"].as_py()), int(bounds["max"].as_py())
    if low < scope.window.start_ms or high >= scope.window.end_ms:
        problems.append(f"timestamps outside {scope.window}")
    if scope.kind == KIND_TAG_HISTORY:
        outside = names_of(table[SCOPE_COLUMN[scope.kind]]) - set(scope.members)
        if outside:
            example = min(outside)
            shown = example if len(example) <= 80 else example[:77] + "..."
            problems.append(f"{len(outside)} tag(s) not in the chunk, e.g. {shown!r}")
    return problems


def check_scope(scope: ChunkScope, table: pa.Table, sink: str) -> None:
    """Raise a one-line SinkError naming the sink, chunk and dataset when rows lie outside
    the scope (`rows_outside`); nothing has been written at that point."""
    problems = rows_outside(scope, table)
    if problems:
        raise SinkError(
            f"{sink}: chunk {scope.chunk_id} of dataset '{scope.dataset}' has rows outside its "
            f"scope ({'; '.join(problems)}); filter them before writing"
        )
