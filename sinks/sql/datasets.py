"""The warehouse's register of datasets: each dataset's kind and identity, fixed by its
first write (`historian_datasets`).

A chunk extracted otherwise (another mode, interval, kind) must never land silently beside
a dataset's rows (sinks/identity.py), so every chunk's transaction reads the facts it is
written under and refuses a difference.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sinks.base import ChunkScope, SinkError
from sinks.identity import differences, identity
from sinks.sql.tables import DATASETS_TABLE, Layout


def check_facts(conn: Connection, layout: Layout, scope: ChunkScope, sink: str) -> None:
    """Register the dataset's facts on first write; refuse a write whose facts differ."""
    datasets = layout.table(DATASETS_TABLE)
    select = sa.text(
        f"SELECT kind, {layout.sql.json_text('attrs')} FROM {datasets} WHERE dataset = :d"
    )
    found = conn.execute(select, {"d": scope.dataset}).one_or_none()
    if found is None:
        # Only the first registration inserts; the chunks after it merely read.
        conn.execute(
            sa.text(
                f"INSERT INTO {datasets} (dataset, kind, attrs, created_at) "
                f"VALUES (:d, :k, {layout.sql.json_param('a')}, :t) "
                + layout.sql.upsert(("dataset",), ())
            ),
            {
                "d": scope.dataset,
                "k": scope.kind,
                "a": json.dumps(identity(scope.attrs)),
                "t": datetime.now(UTC),
            },
        )
        # Another process may have registered it first (the insert then did nothing):
        # MariaDB's snapshot predates that row, a locking read sees it.
        latest = sa.text(select.text + (" LOCK IN SHARE MODE" if layout.dialect == "mysql" else ""))
        found = conn.execute(latest, {"d": scope.dataset}).one()
    kind, raw = found
    problems = differences(kind, json.loads(raw), scope.kind, scope.attrs)
    if problems:
        raise SinkError(
            f"sink {sink}: dataset {scope.dataset} was written with other settings "
            f"({'; '.join(problems)}): use another dataset name or reset it"
        )
