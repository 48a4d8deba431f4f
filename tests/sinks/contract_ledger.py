"""The contract suite's check of the completeness ledger (sinks/ledger.py) against the data.

Whatever happened before (re-writes over other window sizes, kills at any step, writers
in several processes), every ledger row must say what the sink holds in its window: as
many rows, the same first and last time; and no two ledger rows of one series overlap.
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from connectors import schema
from sinks.base import Reads, ReadsLedger, Sink


def ledger_of(sink: Sink, dataset: str) -> pd.DataFrame:
    """The dataset's ledger rows as a plain frame (every sink of the suite keeps one)."""
    assert isinstance(sink, ReadsLedger), f"{sink.name} keeps no completeness ledger"
    table: pa.Table = sink.read_ledger(dataset)
    return table.to_pandas()


def assert_ledger_holds(
    sink: Sink, dataset: str, kind: str = schema.KIND_TAG_HISTORY, *, whole: bool = True
) -> pd.DataFrame:
    """Every ledger row matches the data in its window; `whole`: every data row lies in
    a ledger row's window too. Returns the ledger."""
    ledger = ledger_of(sink, dataset)
    assert isinstance(sink, Reads)
    data = sink.read(dataset, kind)
    member = "tag" if kind == schema.KIND_TAG_HISTORY else None
    epoch_ms = pa.array(data["ts"], type=schema.TS_TYPE).cast(pa.int64())
    ts = pd.Series(epoch_ms.to_numpy(zero_copy_only=False), index=data.index, dtype="int64")
    covered = pd.Series(False, index=data.index)
    for row in ledger.itertuples(index=False):
        start, end = (pd.Timestamp(row.window_start).value // 1_000_000,
                      pd.Timestamp(row.window_end).value // 1_000_000)  # fmt: skip
        inside = (data["node"] == row.node) & (ts >= start) & (ts < end)
        if member is not None:
            inside &= data[member] == row.tag
        found = ts[inside]
        covered |= inside
        where = f"ledger row {row.node}/{row.tag} [{row.window_start}, {row.window_end})"
        assert row.samples == len(found), f"{where}: {row.samples} samples, data {len(found)}"
        if len(found):
            assert pd.Timestamp(row.first_ts).value // 1_000_000 == found.min(), where
            assert pd.Timestamp(row.last_ts).value // 1_000_000 == found.max(), where
    for _, series in ledger.groupby(["node", "tag"]):
        ordered = series.sort_values("window_start")
        starts, ends = ordered["window_start"].to_numpy(), ordered["window_end"].to_numpy()
        assert (starts[1:] >= ends[:-1]).all(), f"overlapping ledger rows: {ordered}"
    if whole:
        assert covered.all(), f"{int((~covered).sum())} rows outside every ledger window"
    return ledger
