"""What a flow's kind means, said once: it agrees with the flow models, the tables, the
chunk labels and the Prefect flows that act on it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from connectors.schema import SCHEMAS, SCOPE_COLUMN
from connectors.timewindow import Window
from pipelines.config.models import FLOW_MODELS, TagHistoryFlow, parse_config
from pipelines.core.kinds import ALARM_HISTORY, KINDS, TAG_HISTORY, Kind, kind_of
from pipelines.planning import plan_chunks

START = datetime(2024, 1, 1, tzinfo=UTC)


def test_every_flow_model_has_a_kind_and_every_kind_a_flow_model() -> None:
    assert set(KINDS) == set(FLOW_MODELS) == {"tag_history", "alarm_history"}
    assert KINDS == {"tag_history": TAG_HISTORY, "alarm_history": ALARM_HISTORY}


@pytest.mark.parametrize("kind", KINDS.values(), ids=list(KINDS))
def test_a_flow_of_a_kind_is_its_model_and_reads_by_tag_when_the_kind_says_so(
    kind: Kind,
) -> None:
    selection = {"tags": {"paths": ["/a"]}} if kind.by_tag else {}
    document = {
        "nodes": {"n": {"url": "https://node:3443"}},
        "sinks": {"lake": {"type": "parquet", "url": "lake"}},
        "flows": {"f": {"node": "n", "kind": kind.name, "start": "-1d", "sinks": ["lake"]}},
    }
    document["flows"]["f"].update(selection)
    flow = parse_config(document, env={}).flows["f"]
    assert isinstance(flow, FLOW_MODELS[kind.name])
    assert kind_of(flow.kind) is kind
    assert isinstance(flow, TagHistoryFlow) == kind.by_tag


@pytest.mark.parametrize("kind", KINDS.values(), ids=list(KINDS))
def test_a_kind_names_the_table_its_rows_go_to(kind: Kind) -> None:
    assert kind.schema.equals(SCHEMAS[kind.name])
    assert kind.member_column == SCOPE_COLUMN[kind.name]
    assert kind.member_column in kind.schema.names
    assert ("tag" in kind.schema.names) == kind.by_tag


@pytest.mark.parametrize("kind", KINDS.values(), ids=list(KINDS))
def test_a_chunk_label_calls_its_members_by_the_kinds_noun(kind: Kind) -> None:
    window = Window(START, START + timedelta(hours=1))
    one, two = plan_chunks(
        "f", "f", kind.name, [("/a",), ("/a", "/b")], window, window.end - window.start, "k"
    )
    assert one.label.startswith(f"1 {kind.member_noun} /a [")
    assert two.label.startswith(f"2 {kind.member_noun}s /a [")


@pytest.mark.parametrize("kind", KINDS.values(), ids=list(KINDS))
def test_a_kind_is_run_by_the_prefect_flow_it_names(kind: Kind) -> None:
    from pipelines.orchestration.flows import prefect_flow_for

    assert prefect_flow_for(kind.name).name == kind.prefect_flow


def test_a_table_kind_that_is_no_flows_kind_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^'tag_metadata' is not a kind of flow "):
        kind_of("tag_metadata")
    with pytest.raises(ValueError, match=r"^'x+'\.\.\. \(1,000 characters\) is not a kind"):
        kind_of("x" * 1000)
