"""How `historian check` names the unit of a node's row stamps (connectors/probes.py)."""

from __future__ import annotations

import pytest

from connectors.probes import describe_unit


@pytest.mark.parametrize(
    ("stamps", "unit"),
    [
        ([1_795_000_000_000, 1_795_000_001_000], "epoch milliseconds"),
        ([1_795_000_000, 1_795_000_001], "epoch seconds"),
        ([1_795_000_000.25, 1_795_000_001.5], "epoch seconds with a fraction"),
        (["2026-11-20T12:00:00Z"], "ISO 8601 text"),
        ([1_795_000_000_000_000], "an unknown unit (beyond epoch milliseconds): answers refused"),
        ([1_795_000_000_000, "2026-11-20T12:00:00Z"], None),
        ([True], None),
    ],
)
def test_the_unit_of_row_stamps_is_named_as_the_node_writes_them(
    stamps: list[object], unit: str | None
) -> None:
    assert describe_unit(stamps) == unit
