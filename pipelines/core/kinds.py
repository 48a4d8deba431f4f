"""What a flow's kind means: the one place the steps that differ by kind consult.

A flow's `kind:` in flows.yaml (the discriminator of its model, pipelines/config/models.py)
also names the table its rows go to (connectors/schema.py). What differs between tag and
alarm history beyond their fields - what a chunk's members are, how they are named, which
Prefect flow runs them - is said here once instead of in a branch at each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from connectors.errors import quoted
from connectors.schema import SCHEMAS, SCOPE_COLUMN

FlowKind = Literal["tag_history", "alarm_history"]


@dataclass(frozen=True)
class Kind:
    """One kind of flow, as planning, fetching, counting and the words shown see it."""

    # flows.yaml's `kind:`, and the table kind of the flow's dataset (connectors/schema.py).
    name: FlowKind
    # Members are tags: resolved from a selection (kept current in tag_metadata), batched
    # per request, narrowed to what a sink lacks, counted per tag and missing per tag. An
    # alarm flow's one member is its alarm path, fetched whole.
    by_tag: bool
    # One chunk member in chunk labels and logs.
    member_noun: str
    # One progress member in `historian state` and `state reset --tag`.
    selection_noun: str
    # The Prefect flow that runs flows of this kind (pipelines/orchestration/flows.py).
    prefect_flow: str

    @property
    def schema(self) -> pa.Schema:
        """The columns of the flow's dataset."""
        return SCHEMAS[self.name]

    @property
    def member_column(self) -> str:
        """The column a chunk's members are values of (`tag`, or an alarm's `path`)."""
        return SCOPE_COLUMN[self.name]


TAG_HISTORY = Kind(
    name="tag_history",
    by_tag=True,
    member_noun="tag",
    selection_noun="tag",
    prefect_flow="tag-history",
)
ALARM_HISTORY = Kind(
    name="alarm_history",
    by_tag=False,
    member_noun="alarm path",
    selection_noun="alarm selection",
    prefect_flow="alarm-history",
)
KINDS: dict[str, Kind] = {kind.name: kind for kind in (TAG_HISTORY, ALARM_HISTORY)}


def kind_of(name: str) -> Kind:
    """The kind a flow's, a chunk's or a run summary's `kind` names; ValueError for another
    name (a table kind such as tag_metadata is not a flow's)."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"{quoted(name)} is not a kind of flow ({' or '.join(KINDS)})") from None
