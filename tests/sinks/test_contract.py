"""The sink contract (sinks/base.py), once, over every sink in tests/sinks/contract_sinks.py.

What the runner relies on from any destination: a chunk's write replaces exactly its scope
and records it in one step (a re-write adds nothing, a killed write leaves the chunk whole
or absent), a wrong count or a row outside the scope commits nothing, names are data
whatever they hold, metadata is upserted, progress is read, reset and cut, one run per
flow, and a probe creates nothing. Sink-specific behaviour stays in the sinks' own files.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from connectors import schema
from sinks.base import Compacts, CountMismatch, FlowLocked, Probes, Reads, Sink, SinkError
from tests.sinks.contract_ledger import assert_ledger_holds
from tests.sinks.contract_sinks import (
    COMMIT_STEPS,
    SINKS,
    SinkUnderTest,
    environment_for_children,
    sink_params,
)
from tests.sinks.sql.sql_frames import ATTRS, T0, alarms, history, hours, rows, scope, sort_key

HIST = schema.KIND_TAG_HISTORY
ALARM = schema.KIND_ALARM_HISTORY
META = schema.KIND_TAG_METADATA
ALARM_ATTRS = dict(ATTRS, kind=ALARM, mode=None)
HOSTILE = [
    "/Plant A/Line 1/Temp",
    "a/b c.d,e",
    "..",
    "/",
    "a/b/../../c",
    "'; drop table x; --",
    'say "hi" and it\'s',
    "ünïcödé 漢字 🙂",
    " leading and trailing ",
    "tab\there\nnewline",
    "back\\slash",
    "%s %(x)s :members ?",
    "x' OR '1'='1",
    "back\\'slash'",
    "x" * 300,
]


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


def written(sink: Sink, tags: list[str], window: Any, **kw: Any) -> pd.DataFrame:
    frame = history(tags, window, **kw)
    assert sink.write(scope(tags, window), frame, len(frame)) == len(frame)
    return frame


def plain(frame: pd.DataFrame, kind: str) -> list[dict[str, Any]]:
    """Rows sorted by the kind's key as plain values (NaN spelled out, equal to itself)."""
    out: list[dict[str, Any]] = pa.Table.from_pandas(
        sort_key(frame, kind), preserve_index=False
    ).to_pylist()
    for row in out:
        for key, value in row.items():
            if isinstance(value, float) and value != value:
                row[key] = "NaN"
    return out


def assert_holds(sink: Sink, dataset: str, kind: str, expected: pd.DataFrame) -> None:
    """The sink holds exactly `expected` for the dataset, with the kind's column types."""
    back = sink.read(dataset, kind)
    assert list(back.dtypes.astype(str)) == list(schema.empty_frame(kind).dtypes.astype(str))
    assert plain(back, kind) == plain(expected, kind)


def test_is_a_sink_with_what_the_runner_needs(sink: Sink) -> None:
    assert isinstance(sink, Sink)
    assert isinstance(sink, Probes), "`historian check` probes every sink of this project"
    assert isinstance(sink, Reads), "this suite reads every sink back"
    assert sink.write_concurrency >= 1
    if isinstance(sink, Compacts):
        assert sink.compact("hist") >= 0  # nothing written yet: nothing to merge, no error
    assert "password" not in sink.describe().lower()


def test_a_write_replaces_exactly_its_scope(sink: Sink) -> None:
    first = written(sink, ["a", "b"], hours(0, 2))
    second = history(["a"], hours(0, 1), step_s=300)
    second["value"] = second["value"] + 1000.0
    sink.write(scope(["a"], hours(0, 1)), second, len(second))
    kept = first[~((first["tag"] == "a") & (first["ts"] < hours(1, 2).start))]
    assert_holds(sink, "hist", HIST, pd.concat([kept, second], ignore_index=True))


def test_the_same_chunk_written_twice_holds_each_row_once(sink: Sink) -> None:
    frame = written(sink, ["a", "b"], hours(0, 1))
    written(sink, ["a", "b"], hours(0, 1))
    assert_holds(sink, "hist", HIST, frame)
    assert sink.progress("f1").windows_of("a") == [hours(0, 1)]
    ledger = assert_ledger_holds(sink, "hist")
    assert sorted(ledger["tag"]) == ["a", "b"], "the chunk's ledger rows, replaced"


def test_a_rewrite_over_another_window_size_holds_each_row_once(sink: Sink) -> None:
    for window in (hours(0, 1), hours(1, 2), hours(2, 3)):
        written(sink, ["a"], window)
    written(sink, ["a"], hours(0.5, 2.5))  # a look-back across two earlier chunks
    assert_holds(sink, "hist", HIST, history(["a"], hours(0, 3)))
    assert sink.progress("f1").windows_of("a") == [hours(0, 3)]
    # The ledger rows of the windows it overlaps give way to the look-back's own.
    ledger = assert_ledger_holds(sink, "hist", whole=False)
    look_back = hours(0.5, 2.5)
    assert list(zip(ledger["window_start"], ledger["window_end"], strict=True)) == [
        (look_back.start, look_back.end)
    ]


def test_the_ledger_says_what_each_chunk_wrote_in_the_same_step(sink: Sink) -> None:
    frame = history(["a", "b"], hours(0, 1), step_s=600)
    frame = frame[~((frame["tag"] == "b") & (frame["ts"] >= hours(0.25, 1).start))]
    frame = frame[~((frame["tag"] == "a") & frame["ts"].isin(list(frame["ts"].iloc[2:4])))]
    frame.loc[frame.index[:1], "quality"] = 0
    members = ["a", "b", "quiet", "missing:gone"]
    assert sink.write(scope(members, hours(0, 1)), frame, len(frame)) == len(frame)
    ledger = assert_ledger_holds(sink, "hist").set_index("tag")
    assert sorted(ledger.index) == ["a", "b", "gone", "quiet"]
    a, b = ledger.loc["a"], ledger.loc["b"]
    assert (a["samples"], a["longest_gap_ms"], a["usual_gap_ms"]) == (4, 1_800_000, 600_000)
    assert (a["bad"], a["good"]) == (0.25, 0.75)
    assert (b["samples"], b["longest_gap_ms"]) == (2, 600_000)
    assert ledger.loc["quiet", "samples"] == 0
    assert dict(ledger["status"]) == {
        "a": "complete", "b": "complete", "quiet": "complete", "gone": "missing",
    }  # fmt: skip
    assert set(ledger["chunk_id"]) == {scope(members, hours(0, 1)).chunk_id}


def test_held_members_are_written_but_not_complete_until_a_write_proves_them(
    sink: Sink,
) -> None:
    # A live tail's commit (pipelines/live): rows in place, the window not complete.
    frame = history(["a", "b"], hours(0, 1), step_s=600)
    live = replace(scope(["a", "b", "node:n1"], hours(0, 1)), held={"a": "live", "b": "live"})
    assert sink.write(live, frame, len(frame)) == len(frame)
    assert_holds(sink, "hist", HIST, frame)
    assert sink.progress("f1").windows_of("a") == []
    assert sink.progress("f1").windows_of("node:n1") == [hours(0, 1)]
    ledger = assert_ledger_holds(sink, "hist").set_index("tag")
    assert dict(ledger["status"]) == {"a": "held", "b": "held"}
    assert set(ledger["reason"]) == {"live"}
    # The history run over the window replaces the rows and proves them complete.
    truth = history(["a", "b"], hours(0, 1), step_s=300)
    assert sink.write(scope(["a", "b"], hours(0, 1)), truth, len(truth)) == len(truth)
    assert_holds(sink, "hist", HIST, truth)
    assert sink.progress("f1").windows_of("a") == [hours(0, 1)]
    ledger = assert_ledger_holds(sink, "hist")
    assert set(ledger["status"]) == {"complete"}


def test_a_count_mismatch_commits_nothing_and_keeps_earlier_rows(sink: Sink) -> None:
    earlier = written(sink, ["a"], hours(0, 1))
    frame = history(["a", "b"], hours(1, 2))
    with pytest.raises(CountMismatch):
        sink.write(scope(["a", "b"], hours(1, 2)), frame, len(frame) + 1)
    assert_holds(sink, "hist", HIST, earlier)
    assert sink.progress("f1").windows_of("b") == []
    assert [c.window for c in sink.chunk_log("f1")] == [hours(0, 1)]


@pytest.mark.parametrize(
    ("tags", "window", "problem"),
    [
        (["a", "b"], hours(0, 1), "timestamps outside"),
        (["a"], hours(0, 2), r"1 tag\(s\) not in the chunk, e.g. 'b'"),
    ],
    ids=["late rows", "foreign tag"],
)
def test_rows_outside_the_scope_are_refused_and_nothing_is_written(
    sink: Sink, tags: list[str], window: Any, problem: str
) -> None:
    frame = history(["a", "b"], hours(0, 2))
    with pytest.raises(SinkError, match=f"outside its scope.*{problem}"):
        sink.write(scope(tags, window), frame, len(frame))
    assert sink.read("hist", HIST).empty
    assert sink.progress("f1").completed == {}


def test_an_empty_chunk_is_recorded_complete_and_empties_its_scope(sink: Sink) -> None:
    assert sink.write(scope(["a"], hours(0, 1)), schema.empty_frame(HIST), 0) == 0
    assert sink.progress("f1").windows_of("a") == [hours(0, 1)]
    assert sink.chunk_log("f1")[0].rows_fetched == 0
    # Written again empty over rows it held: the node has none there now, nor has the sink.
    earlier = written(sink, ["a", "b"], hours(1, 3))
    assert sink.write(scope(["a"], hours(1, 2)), schema.empty_frame(HIST), 0) == 0
    kept = earlier[~((earlier["tag"] == "a") & (earlier["ts"] < hours(2, 3).start))]
    assert_holds(sink, "hist", HIST, kept)
    assert sink.progress("f1").windows_of("a") == [hours(0, 3)]


def test_hostile_names_are_data_only(sink: Sink, place: SinkUnderTest) -> None:
    frame = history(HOSTILE, hours(0, 1), step_s=1800)
    for _ in range(2):
        sink.write(scope(HOSTILE, hours(0, 1)), frame, len(frame))
    assert_holds(sink, "hist", HIST, frame)
    assert set(sink.progress("f1").completed) == set(HOSTILE)
    assert sink.reset("f1", "'; drop table x; --") >= 1
    assert set(sink.progress("f1").completed) == set(HOSTILE) - {"'; drop table x; --"}
    paths = alarms(HOSTILE[:4], hours(0, 1))
    alarm_scope = scope(["/"], hours(0, 1), dataset="alarms", kind=ALARM, attrs=ALARM_ATTRS)
    sink.write(alarm_scope, paths, len(paths))
    assert_holds(sink, "alarms", ALARM, paths)


def test_replacing_one_hostile_names_rows_keeps_the_others(sink: Sink) -> None:
    frame = history(HOSTILE, hours(0, 1), step_s=1800)
    sink.write(scope(HOSTILE, hours(0, 1)), frame, len(frame))
    for victim in ("x' OR '1'='1", "back\\'slash'"):
        newer = history([victim], hours(0, 1), step_s=900)
        sink.write(scope([victim], hours(0, 1)), newer, len(newer))
        frame = pd.concat([frame[frame["tag"] != victim], newer], ignore_index=True)
    assert_holds(sink, "hist", HIST, frame)
    assert sink.progress("f1").windows_of("'; drop table x; --") == [hours(0, 1)]


def test_another_sink_object_reads_and_edits_the_same_progress(
    sink: Sink, place: SinkUnderTest
) -> None:
    for start in range(0, 4):
        written(sink, ["a", "b"], hours(start, start + 1))
    if place.one_process:
        sink.close()
    other = place.make()
    other.open()
    try:
        assert other.progress("f1").windows_of("b") == [hours(0, 4)]
        assert [c.window for c in other.chunk_log("f1", limit=1)] == [hours(3, 4)]
        assert other.forget_after("f1", hours(2, 3).start) >= 1
        assert other.reset("f1", "a") >= 1
    finally:
        other.close()
    if place.one_process:
        sink.open()
    assert sink.progress("f1").windows_of("a") == []
    assert sink.progress("f1").windows_of("b") == [hours(0, 2)]


def test_tag_and_alarm_datasets_live_side_by_side(sink: Sink) -> None:
    tags = written(sink, ["a"], hours(0, 2))
    first = alarms(["Plant/A", "Plant/B"], hours(0, 2))
    alarm_scope = scope(["*"], hours(0, 2), dataset="alarms", kind=ALARM, attrs=ALARM_ATTRS)
    sink.write(alarm_scope, first, len(first))
    # An alarm chunk's scope is every path inside its window, whatever paths it brings.
    second = alarms(["Plant/C"], hours(1, 2), step_s=1200)
    later = scope(["*"], hours(1, 2), dataset="alarms", kind=ALARM, attrs=ALARM_ATTRS)
    sink.write(later, second, len(second))
    kept = first[first["ts"] < hours(1, 2).start]
    assert_holds(sink, "alarms", ALARM, pd.concat([kept, second], ignore_index=True))
    assert sink.read("alarms", ALARM)["ack_user"].isna().sum() == 4  # NULL stays NULL
    assert_holds(sink, "hist", HIST, tags)
    assert sink.progress("f1").windows_of("*") == [hours(0, 2)]


def test_a_dataset_written_with_other_settings_is_refused(sink: Sink) -> None:
    written(sink, ["a"], hours(0, 1))
    other = history(["a"], hours(1, 2))
    changed = scope(["a"], hours(1, 2), attrs=dict(ATTRS, deadband=2.0))
    with pytest.raises(SinkError, match="deadband"):
        sink.write(changed, other, len(other))


def test_tag_metadata_is_upserted_by_node_and_tag(sink: Sink) -> None:
    now = datetime(2024, 3, 2, tzinfo=UTC)

    def meta(records: list[dict[str, Any]]) -> pd.DataFrame:
        return rows(META, [dict(r, updated_at=now) for r in records])

    first: list[dict[str, Any]] = [
        {"node": "n", "tag": t, "description": f"old {t}", "eng_units": "bar"} for t in HOSTILE
    ]
    assert sink.write_metadata(meta(first)) == len(HOSTILE)
    newer: list[dict[str, Any]] = [
        {"node": "n", "tag": "a/b c.d,e", "description": "new"},
        {"node": "m", "tag": "a/b c.d,e", "description": "other node", "history_enabled": True},
    ]
    assert sink.write_metadata(meta(newer)) == 2
    back = sink.read("tag_metadata", META)
    expected = [r for r in first if r["tag"] != "a/b c.d,e"] + newer
    assert_holds(sink, "tag_metadata", META, meta(expected))
    assert len(back) == len(HOSTILE) + 1
    assert sink.flows() == [], "metadata is no flow's progress"


def test_progress_merges_and_reset_forgets_it_but_keeps_the_data(sink: Sink) -> None:
    for window, tags in [
        (hours(0, 1), ["a", "b"]),
        (hours(1, 2), ["a"]),
        (hours(3, 4), ["a", "b"]),
        (hours(0.5, 1.5), ["b"]),
    ]:
        written(sink, tags, window)
    progress = sink.progress("f1")
    assert progress.windows_of("a") == [hours(0, 2), hours(3, 4)]
    assert progress.windows_of("b") == [hours(0, 1.5), hours(3, 4)]
    assert sink.flows() == ["f1"]
    assert [c.window for c in sink.chunk_log("f1", limit=2)] == [hours(0.5, 1.5), hours(3, 4)]
    assert sink.chunk_log("f1")[0].rows_committed == 6

    assert sink.reset("f1", "b") >= 1
    assert set(sink.progress("f1").completed) == {"a"}
    assert sink.reset("f1") >= 1
    assert sink.progress("f1").completed == {}
    assert sink.chunk_log("f1") == []
    assert sink.reset("f1") == 0
    assert len(sink.read("hist", HIST)) == 12 + 6 + 9 + 6  # a: [0, 2) [3, 4); b: [0, 1.5) [3, 4)


def test_forget_after_cuts_progress_and_chunks_but_keeps_the_data(sink: Sink) -> None:
    for window in (hours(0, 1), hours(1, 2), hours(2, 3)):
        written(sink, ["a", "b"], window)
    before = len(sink.read("hist", HIST))
    assert sink.forget_after("f1", T0 + timedelta(hours=1, minutes=30)) >= 1
    # Cut at the moment, or (the lake) the chunk across it forgotten whole.
    assert sink.progress("f1").windows_of("a") in ([hours(0, 1.5)], [hours(0, 1)])
    assert [c.window for c in sink.chunk_log("f1")] == [hours(0, 1)]
    assert len(sink.read("hist", HIST)) == before
    assert sink.forget_after("f1", T0 + timedelta(hours=5)) == 0


def test_a_second_run_of_a_flow_is_refused_at_once(sink: Sink, place: SinkUnderTest) -> None:
    other = sink if place.one_process else place.make()
    if other is not sink:
        other.open()
    try:
        with sink.lock("f1"):
            started = time.monotonic()
            with pytest.raises(FlowLocked, match="already running"), other.lock("f1"):
                pass
            assert time.monotonic() - started < 2
            with other.lock("f2"):  # another flow is another lock
                pass
        with other.lock("f1"):  # released with the first run
            pass
    finally:
        if other is not sink:
            other.close()


def test_probe_says_what_it_found_and_creates_nothing(place: SinkUnderTest) -> None:
    made = place.make()
    assert isinstance(made, Probes)
    found = made.probe()
    assert isinstance(found, str)
    assert found
    assert not place.created()


CHILD = """
import json, sys, time
from tests.sinks.contract_sinks import build
from tests.sinks.sql.sql_frames import history, hours, scope
cls, kwargs = json.loads(sys.argv[1])
sink = build(cls, kwargs)
sink.open()
tags = [f"t{i}" for i in range(40)]
frame = history(tags, hours(0, 24), step_s=10)
print(len(frame), flush=True)
sys.stdin.readline()
sink.write(scope(tags, hours(0, 24)), frame, len(frame))
print("done", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [0.1, 0.5])
def test_a_write_killed_between_data_and_state_leaves_the_chunk_whole_or_absent(
    place: SinkUnderTest, delay_s: float
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps([place.cls, place.kwargs])],
        cwd=Path(__file__).resolve().parents[2],
        env=environment_for_children(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        rows_in_chunk = int(child.stdout.readline())
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(delay_s)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        for stream in (child.stdout, child.stdin):
            if stream is not None:
                stream.close()
    sink = place.make()
    sink.open()
    try:
        completed = sink.progress("f1").completed
        held = len(sink.read("hist", HIST))
        ledger = assert_ledger_holds(sink, "hist")
        if completed:
            assert set(completed) == {f"t{i}" for i in range(40)}
            assert held == rows_in_chunk
            assert ledger["samples"].sum() == held
            assert len(ledger) == 40
        else:
            assert held == 0
            assert sink.chunk_log("f1") == []
            assert ledger.empty
    finally:
        sink.close()


STOPPED_AT_COMMIT = """
import importlib, json, sys
from tests.sinks.contract_sinks import build
from tests.sinks.sql.sql_frames import history, hours, scope
cls, kwargs, step, when = json.loads(sys.argv[1])
module, attribute = step.split(":")
*owners, name = attribute.split(".")
holder = importlib.import_module(module)
for owner in owners:
    holder = getattr(holder, owner)
commit = getattr(holder, name)


def stopped(*args, **kwargs):
    if when == "after":
        commit(*args, **kwargs)
    print("stopped", flush=True)
    sys.stdin.readline()  # killed while waiting here
    raise SystemExit("not killed")


sink = build(cls, kwargs)
sink.open()
tags = [f"t{i}" for i in range(5)]
first = history(tags, hours(0, 2))
sink.write(scope(tags, hours(0, 2)), first, len(first))
setattr(holder, name, stopped)
second = history(tags, hours(1, 3), step_s=300)
sink.write(scope(tags, hours(1, 3)), second, len(second))
"""


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("name", sink_params(COMMIT_STEPS))
def test_a_writer_killed_at_its_commit_step_leaves_the_chunk_absent_or_whole(
    request: pytest.FixtureRequest, tmp_path: Path, name: str, when: str
) -> None:
    """The child stops at the step every write commits through (`COMMIT_STEPS`), before or
    after it, and says so; it is killed while it waits there: never at a guessed moment."""
    factory, _ = SINKS[name]
    place = factory(request, tmp_path)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            STOPPED_AT_COMMIT,
            json.dumps([place.cls, place.kwargs, COMMIT_STEPS[name], when]),
        ],
        cwd=Path(__file__).resolve().parents[2],
        env=environment_for_children(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "stopped\n", "the child reached its commit step"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        for stream in (child.stdout, child.stdin):
            if stream is not None:
                stream.close()
    tags = [f"t{i}" for i in range(5)]
    first = history(tags, hours(0, 2))
    second = history(tags, hours(1, 3), step_s=300)
    sink = place.make()
    sink.open()
    try:
        if when == "after":
            kept = first[first["ts"] < hours(1, 2).start]
            assert_holds(sink, "hist", HIST, pd.concat([kept, second], ignore_index=True))
            assert sink.progress("f1").windows_of("t0") == [hours(0, 3)]
            ledger = assert_ledger_holds(sink, "hist", whole=False)
            assert set(ledger["window_start"]) == {hours(1, 3).start}
        else:
            assert_holds(sink, "hist", HIST, first)
            assert sink.progress("f1").windows_of("t0") == [hours(0, 2)]
            ledger = assert_ledger_holds(sink, "hist")
            assert set(ledger["window_start"]) == {hours(0, 2).start}
    finally:
        sink.close()
