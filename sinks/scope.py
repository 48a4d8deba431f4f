"""The one check every sink makes before a write: no row may fall outside the chunk's scope.

A chunk's write replaces exactly its scope (its node's rows of its members inside its
window); a row outside it would escape that replace, so a re-run would keep it twice or a
later chunk would delete it (a row of another node would even replace that node's). Every
sink refuses such a frame with this check, before it writes anything.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from connectors.schema import KIND_TAG_HISTORY, SCOPE_COLUMN, names_of
from sinks.base import ChunkScope, SinkError


def rows_outside(scope: ChunkScope, table: pa.Table) -> list[str]:
    """What in `table` lies outside `scope`, in words (empty when every row is inside).

    Alarm scopes are the node's whole selection within the window: only their time and
    node are checked.
    """
    if table.num_rows == 0:
        return []
    problems = []
    bounds = pc.min_max(pc.cast(table["ts"], pa.int64()))
    low, high = int(bounds["min"].as_py()), int(bounds["max"].as_py())
    if low < scope.window.start_ms or high >= scope.window.end_ms:
        problems.append(f"timestamps outside {scope.window}")
    other_nodes = names_of(table["node"]) - {scope.node}
    if other_nodes:
        problems.append(f"rows of node {_shown(min(other_nodes))}, not {_shown(scope.node)}")
    if scope.kind == KIND_TAG_HISTORY:
        outside = names_of(table[SCOPE_COLUMN[scope.kind]]) - set(scope.members)
        if outside:
            problems.append(f"{len(outside)} tag(s) not in the chunk, e.g. {_shown(min(outside))}")
    return problems


def _shown(name: str) -> str:
    """A name quoted for a one-line error, cut when long."""
    return repr(name if len(name) <= 80 else name[:77] + "...")


def check_scope(scope: ChunkScope, table: pa.Table, sink: str) -> None:
    """Raise a one-line SinkError naming the sink, chunk and dataset when rows lie outside
    the scope (`rows_outside`); nothing has been written at that point."""
    problems = rows_outside(scope, table)
    if problems:
        raise SinkError(
            f"{sink}: chunk {scope.chunk_id} of dataset '{scope.dataset}' has rows outside its "
            f"scope ({'; '.join(problems)}); filter them before writing"
        )
