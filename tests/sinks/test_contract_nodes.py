"""The sink contract for datasets of many nodes, over every sink (contract_sinks.py).

A dataset holds the same tag paths of many nodes (sites): a chunk's write replaces only
its node's rows, progress and locks are per key (`flow@node`, shards `flow@node#i-of-n`,
any text), and several processes writing disjoint scopes of one dataset at once each
commit exactly once and lose nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from connectors import schema
from sinks.base import FlowLocked, Sink, SinkError
from tests.sinks.contract_sinks import SINKS, SinkUnderTest, sink_params
from tests.sinks.contract_writers import assert_every_scope_once, run_writers
from tests.sinks.sql.sql_frames import ATTRS, T0, alarms, history, hours, scope
from tests.sinks.test_contract import assert_holds

HIST = schema.KIND_TAG_HISTORY
ALARM = schema.KIND_ALARM_HISTORY
ALARM_ATTRS = dict(ATTRS, kind=ALARM, mode=None)
HOSTILE_NODES = ["plant a/line 1", "..", "site.eu-1", "ünïcödé 漢字 🙂", "50%", "it's"]


@pytest.fixture(params=sink_params())
def place(request: pytest.FixtureRequest, tmp_path: Path) -> SinkUnderTest:
    factory, _ = SINKS[request.param]
    return factory(request, tmp_path)


@pytest.fixture
def sink(place: SinkUnderTest) -> Iterator[Sink]:
    made = place.make()
    made.open()
    yield made
    made.close()


def put(sink: Sink, node: str, tags: list[str], window: object, **kw: object) -> pd.DataFrame:
    """Write the node's chunk under the key `f1@<node>`; the frame written."""
    frame = history(tags, window, node=node, **kw)  # type: ignore[arg-type]
    chunk = scope(tags, window, flow=f"f1@{node}", node=node)  # type: ignore[arg-type]
    assert sink.write(chunk, frame, len(frame)) == len(frame)
    return frame


def test_replacing_one_nodes_scope_keeps_the_other_nodes_rows(sink: Sink) -> None:
    east = put(sink, "east", ["a", "b"], hours(0, 2))
    west = put(sink, "west", ["a", "b"], hours(0, 2))
    again = history(["a"], hours(0, 1), step_s=300, node="east")
    again["value"] = again["value"] + 1000.0
    sink.write(scope(["a"], hours(0, 1), flow="f1@east", node="east"), again, len(again))
    kept = east[~((east["tag"] == "a") & (east["ts"] < hours(1, 2).start))]
    assert_holds(sink, "hist", HIST, pd.concat([kept, again, west], ignore_index=True))
    assert sink.progress("f1@west").windows_of("a") == [hours(0, 2)]
    assert sink.progress("f1@east").windows_of("a") == [hours(0, 2)]
    assert sink.flows() == ["f1@east", "f1@west"]


def test_an_empty_chunk_of_one_node_leaves_the_others(sink: Sink) -> None:
    west = put(sink, "west", ["a"], hours(0, 1))
    put(sink, "east", ["a"], hours(0, 1))
    empty = schema.empty_frame(HIST)
    assert sink.write(scope(["a"], hours(0, 1), flow="f1@east", node="east"), empty, 0) == 0
    assert_holds(sink, "hist", HIST, west)


def test_alarm_scopes_are_per_node(sink: Sink) -> None:
    def put_alarms(node: str, window: object, step_s: int) -> pd.DataFrame:
        frame = alarms(["Plant/A"], window, step_s=step_s, node=node)  # type: ignore[arg-type]
        chunk = scope(  # type: ignore[arg-type]
            ["*"],
            window,
            dataset="alarms",
            kind=ALARM,
            attrs=ALARM_ATTRS,
            flow=f"a@{node}",
            node=node,
        )
        sink.write(chunk, frame, len(frame))
        return frame

    west = put_alarms("west", hours(0, 2), 900)
    put_alarms("east", hours(0, 2), 900)
    east = put_alarms("east", hours(0, 2), 1800)
    assert_holds(sink, "alarms", ALARM, pd.concat([west, east], ignore_index=True))


def test_rows_of_another_node_are_refused_and_nothing_is_written(sink: Sink) -> None:
    frame = history(["a"], hours(0, 1), node="west")
    with pytest.raises(SinkError, match="rows of node 'west', not 'east'"):
        sink.write(scope(["a"], hours(0, 1), flow="f1@east", node="east"), frame, len(frame))
    assert len(sink.read("hist", HIST)) == 0
    assert sink.progress("f1@east").completed == {}


def test_a_dataset_takes_a_second_node_whatever_node_its_attrs_named(sink: Sink) -> None:
    """Datasets of earlier versions recorded their node among their attrs: they still take
    chunks, of any node."""
    first = history(["a"], hours(0, 1))
    sink.write(scope(["a"], hours(0, 1), attrs=dict(ATTRS, node="node1")), first, len(first))
    second = history(["a"], hours(0, 1), node="node2")
    later = scope(["a"], hours(0, 1), flow="f2", attrs=dict(ATTRS, node="node2"), node="node2")
    sink.write(later, second, len(second))
    assert_holds(sink, "hist", HIST, pd.concat([first, second], ignore_index=True))


def test_hostile_node_names_and_keys_are_data_only(sink: Sink) -> None:
    written = [put(sink, node, ["a", "x/y"], hours(0, 1), step_s=1800) for node in HOSTILE_NODES]
    for node in HOSTILE_NODES:  # again: replaced, not added
        put(sink, node, ["a", "x/y"], hours(0, 1), step_s=1800)
    assert_holds(sink, "hist", HIST, pd.concat(written, ignore_index=True))
    keys = [f"f1@{node}" for node in HOSTILE_NODES]
    assert sink.flows() == sorted(keys)
    for key in keys:
        assert sink.progress(key).windows_of("x/y") == [hours(0, 1)]
        assert [c.window for c in sink.chunk_log(key)] == [hours(0, 1)]
    assert sink.reset(keys[0], "x/y") >= 1
    assert set(sink.progress(keys[0]).completed) == {"a"}
    assert sink.forget_after(keys[1], T0 + timedelta(minutes=30)) >= 1
    assert sink.chunk_log(keys[1]) == []
    assert sink.reset(keys[2]) >= 1
    assert sink.progress(keys[2]).completed == {}
    assert sink.progress(keys[3]).windows_of("a") == [hours(0, 1)]  # the others keep theirs
    assert len(sink.read("hist", HIST)) == len(pd.concat(written))


def test_lock_keys_of_shards_are_separate_locks(sink: Sink, place: SinkUnderTest) -> None:
    other = sink if place.one_process else place.make()
    if other is not sink:
        other.open()
    try:
        shards = [f"f1@{HOSTILE_NODES[0]}#{i}-of-3" for i in (1, 2, 3)]
        with sink.lock(shards[0]), other.lock(shards[1]):
            with pytest.raises(FlowLocked, match="already running"), other.lock(shards[0]):
                pass
            with sink.lock(shards[2]), other.lock(f"f1@{HOSTILE_NODES[1]}"):
                pass
        with other.lock(shards[0]):
            pass
    finally:
        if other is not sink:
            other.close()


def concurrent_params() -> list[object]:
    """Every sink that takes writers in several processes (not DuckDB: one writer per
    database file by design, test_sql_sink.py)."""
    return [p for p in sink_params() if p.id != "duckdb"]  # type: ignore[attr-defined]


@pytest.mark.slow
@pytest.mark.parametrize("name", concurrent_params())
def test_writers_in_several_processes_commit_every_scope_exactly_once(
    request: pytest.FixtureRequest, tmp_path: Path, name: str
) -> None:
    factory, _ = SINKS[name]
    place = factory(request, tmp_path)
    run_writers(place.cls, place.kwargs)
    sink = place.make()
    sink.open()
    try:
        assert_every_scope_once(sink)
    finally:
        sink.close()
