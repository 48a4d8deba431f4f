"""The lake's completeness ledger: a Parquet dataset beside each dataset, in the same commit.

`<root>/<dataset>.coverage/<key>/part-<chunk_id>.parquet` holds a chunk's ledger rows
(`sinks.ledger`). The file is one more `place` operation of the chunk's own journal plan,
so it lands with the chunk's data files and before its marker, and recovery rolls it
forward or back with them: after a crash there is a ledger file exactly for the chunks
whose marker is there (a rolled-back plan removes it). A re-written chunk replaces its
file; a chunk over another window size (or tag batch) also takes out of the other chunks'
ledger files, in the same plan, the rows of its node and tags in windows it overlaps
(those chunks' rows outside its window stay in the data, unledgered, until their windows
are written again). `<key>` is the chunk's progress key as a file name (`sinks.store.layout.key_name`). The
dot keeps the folder out of every dataset's glob (`<root>/<dataset>/**`) and away from
dataset names (letters, digits and `_` only).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sinks.base import ChunkScope
from sinks.lake.journal import Journal, Plan
from sinks.ledger import LEDGER_SCHEMA, overlapped
from sinks.store.layout import LEDGER_SUFFIX, is_data_file, ledger_file
from sinks.store.objects import LakeStore


def ledger_dir(dataset: str) -> str:
    """The ledger's folder, relative to the lake's root."""
    return dataset + LEDGER_SUFFIX


def stage_ledger(journal: Journal, plan: Plan, scope: ChunkScope, rows: pa.Table) -> None:
    """Stage the chunk's ledger rows and add their place operation to the plan (after its
    data files; recovery and roll back know it by `ledger`). The ledger rows of other
    chunks whose files the plan changes lose what this chunk's scope overlaps."""
    _place(journal, plan, ledger_file(plan.dataset, scope.flow, plan.ident), rows)
    owners = set(plan.updates) | {tuple(o) for op in plan.ops for o in op.get("owners", [])}
    for flow, chunk in sorted({(str(o[0]), str(o[1])) for o in owners}):
        if (flow, chunk) != (scope.flow, plan.ident):
            _trim(journal, plan, scope, ledger_file(plan.dataset, flow, chunk))


def _place(journal: Journal, plan: Plan, dest: str, rows: pa.Table) -> None:
    temp = journal.stage(plan, rows, dest, {})
    was = journal.store.version(journal.store.path(dest))
    plan.ops.append(
        {
            "op": "place",
            "tmp": temp,
            "dest": dest,
            "owners": [],
            "new": was is None,
            "was": was,
            "ledger": True,
        }
    )


def _trim(journal: Journal, plan: Plan, scope: ChunkScope, dest: str) -> None:
    """Another chunk's ledger file without the rows the scope replaces (dropped when none
    is left)."""
    path = journal.store.path(dest)
    if not journal.store.exists(path):
        return
    table = _read_file(journal.store, path)
    gone = overlapped(table, scope)
    if not pc.any(gone).as_py():
        return
    kept = table.filter(pc.invert(gone))
    if kept.num_rows:
        _place(journal, plan, dest, kept)
    else:
        plan.ops.append({"op": "drop", "dest": dest, "owners": []})


def _read_file(store: LakeStore, path: str) -> pa.Table:
    with store.pafs.open_input_file(path) as handle:
        return pq.read_table(handle).select(LEDGER_SCHEMA.names).cast(LEDGER_SCHEMA)


def read_ledger(store: LakeStore, dataset: str) -> pa.Table:
    """Every ledger row of a dataset (LEDGER_SCHEMA), file by file."""
    parts = []
    for key in sorted(store.listdir(store.path(ledger_dir(dataset))), key=lambda e: e.name):
        if not key.is_dir:
            continue
        for entry in sorted(store.listdir(key.path), key=lambda e: e.name):
            if not entry.is_dir and is_data_file(entry.name):
                parts.append(_read_file(store, entry.path))
    return pa.concat_tables(parts) if parts else LEDGER_SCHEMA.empty_table()
