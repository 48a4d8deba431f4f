"""Node facts: identities compared as the node tells them, clocks read, facts shown; and
the pure rules over them in pipelines/state.py (where a run ends, whose progress it is)."""

from __future__ import annotations

from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from connectors.client import NodeClient
from connectors.facts import NodeClock, NodeFacts, NodeIdentity, NodeMoved, read_facts
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, run_server
from connectors.timewindow import Window
from pipelines.state import (
    check_same_node,
    identity_member,
    recorded_identity,
    settled_by_clocks,
    settled_until,
    tag_members,
)
from sinks.base import Progress

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
A = NodeIdentity("plant", "UID-A", "http://a:3003")


@pytest.mark.parametrize(
    ("other", "same"),
    [
        pytest.param(NodeIdentity("plant", "UID-A", "https://new:3443"), True, id="url-moved"),
        pytest.param(NodeIdentity("plant", None, "http://a:3003"), True, id="uid-unread"),
        pytest.param(NodeIdentity("plant", "UID-B", "http://a:3003"), False, id="other-uid"),
        pytest.param(NodeIdentity("other", "UID-A", "http://a:3003"), False, id="renamed"),
        pytest.param(NodeIdentity(None, None, "http://a:3003"), False, id="says-nothing"),
    ],
)
def test_identities_are_the_same_node_when_what_both_say_agrees(
    other: NodeIdentity, same: bool
) -> None:
    assert A.same_node(other) is same
    assert other.same_node(A) is same


def test_an_identity_that_says_nothing_is_its_url_and_keys_round_trip() -> None:
    quiet = NodeIdentity(url="http://a:3003")
    assert quiet.same_node(NodeIdentity(url="http://a:3003"))
    assert not quiet.same_node(NodeIdentity(url="http://b:3003"))
    for identity in (A, quiet, NodeIdentity('n, /ü"', None, "")):
        restored = NodeIdentity.from_key(identity.key())
        assert restored.same_node(identity)
    assert NodeIdentity.from_key("not json") == NodeIdentity()


def test_a_run_ends_at_the_earlier_clock_minus_settle() -> None:
    settle = timedelta(minutes=1)
    behind, ahead = NOW - timedelta(minutes=10), NOW + timedelta(minutes=10)
    assert settled_until(NOW, behind, settle) == behind - settle
    assert settled_until(NOW, ahead, settle) == NOW - settle
    assert settled_until(NOW, None, settle) == NOW - settle


def test_the_skew_is_the_node_clock_minus_ours_when_it_was_read() -> None:
    read = NodeClock(int(NOW.timestamp() * 1000), NOW, read_monotonic=102.0)
    end, skew = settled_by_clocks(NOW - timedelta(seconds=2), timedelta(0), read, began=100.0)
    assert skew == timedelta(0)
    assert end == NOW - timedelta(seconds=2)
    assert settled_by_clocks(NOW, timedelta(0), None, began=0.0) == (NOW, None)


def progress(**windows: list[Window]) -> Progress:
    return Progress("f", dict(windows))


def test_the_recorded_identity_is_the_one_of_the_latest_window() -> None:
    early, late = (
        Window(NOW - timedelta(hours=2), NOW - timedelta(hours=1)),
        Window(NOW - timedelta(hours=1), NOW),
    )
    other = NodeIdentity("other", "UID-B")
    found = Progress(
        "f",
        {
            "/a": [early, late],
            identity_member(A.key()): [early],
            identity_member(other.key()): [late],
        },
    )
    assert recorded_identity(found) == other.key()
    assert tag_members(found) == ["/a"]
    assert recorded_identity(Progress("f", {"/a": [early]})) is None


@pytest.mark.parametrize(
    ("recorded", "expected"),
    [
        pytest.param(None, nullcontext(), id="older-progress"),
        pytest.param(A, nullcontext(), id="same-node"),
        pytest.param(
            NodeIdentity("b", "UID-B"), pytest.raises(NodeMoved, match="state reset"), id="moved"
        ),
    ],
)
def test_progress_of_another_node_is_refused(recorded: NodeIdentity | None, expected: Any) -> None:
    window = [Window(NOW - timedelta(hours=1), NOW)]
    completed = {"/a": window}
    if recorded is not None:
        completed[identity_member(recorded.key())] = window
    with expected:
        check_same_node([Progress("f", completed)], A, "plant_a", "historian state reset f")


def test_facts_read_from_a_node_and_shown_line_by_line() -> None:
    node = SimulatedNode(SimConfig(seed=3, tags=10, profile="clock-behind"))
    node.set_clock(int(NOW.timestamp() * 1000))
    with (
        run_server(node, http_port=0, https_port=None) as server,
        NodeClient(NodeSettings(name="n", url=server.http_url)) as client,
    ):
        facts = read_facts(client, "n", server.http_url)
    assert facts.identity == NodeIdentity("sim-node", node.admin.uid, server.http_url)
    assert facts.clock is not None
    assert facts.clock.node_time == NOW - timedelta(minutes=10)
    lines = NodeFacts(facts.identity, facts.version, None, raw_cap="250 per tag").lines()
    assert "clock: unknown (no sys.ts): runs end at our clock minus settle" in lines
    assert "raw cap: 250 per tag" in lines
    assert "timestamp unit: not probed" in lines
