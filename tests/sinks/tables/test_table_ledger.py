"""The table formats' ledger (sinks/tables/ledger.py): a chunk whose data commit landed but
whose ledger did not (a writer killed between the two) is folded in on the next open."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as pads
import pytest

from sinks.tables.delta import DeltaLake
from sinks.tables.iceberg import IcebergLake
from sinks.tables.ledger import TableLedger
from sinks.tables.table_sink import TableSink
from tests.sinks.contract_ledger import assert_ledger_holds
from tests.sinks.sql.sql_frames import history, hours, scope

TAGS = ["a", "b"]


def make(kind: str, root: Path) -> TableSink:
    return DeltaLake(str(root)) if kind == "delta" else IcebergLake(str(root))


def on_disk(root: Path) -> set[tuple[str, str]]:
    """(chunk, tag) of the ledger files as a plain reader finds them (nothing folded)."""
    folder = root / "hist.coverage"
    if not folder.exists():
        return set()
    table = pads.dataset(str(folder), format="parquet").to_table(columns=["chunk_id", "tag"])
    return set(zip(table["chunk_id"].to_pylist(), table["tag"].to_pylist(), strict=True))


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_commit_whose_ledger_was_not_written_is_folded_on_open(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / kind
    sink = make(kind, root)
    sink.open()
    first, second = scope(TAGS, hours(0, 1)), scope(TAGS, hours(1, 2))
    frame = history(TAGS, hours(0, 1))
    sink.write(first, frame, len(frame))
    real_fold = TableLedger.fold
    monkeypatch.setattr(TableLedger, "fold", lambda *args, **kwargs: None)  # killed here
    frame = history(TAGS, hours(1, 2))
    sink.write(second, frame, len(frame))
    sink.close()
    assert on_disk(root) == {(first.chunk_id, t) for t in TAGS}, "only the first chunk's"
    monkeypatch.setattr(TableLedger, "fold", real_fold)
    reopened = make(kind, root)
    reopened.open()  # folds the log into the ledger
    try:
        assert on_disk(root) == {(c.chunk_id, t) for c in (first, second) for t in TAGS}
        ledger = assert_ledger_holds(reopened, "hist")
        assert set(ledger["status"]) == {"complete"}
    finally:
        reopened.close()
