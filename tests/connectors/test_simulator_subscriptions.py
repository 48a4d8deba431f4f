"""The simulator's subscriptions behave as a node's would: every sample history stores is a
`tag` event once the node's clock has passed it (late ones when they arrive), the queue is
bounded and counts what it drops, `limit` leaves the rest, tags added or removed are a
`model` event, a link flap is a `status` event on the remote tags, a restart loses the
subscriptions; and each profile's reading of what the spec leaves open.

The node's clock is set (`set_clock`), never waited for: every poll sees exactly the
stretch of the clock the test moved it over.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from connectors.options import HistoryOptions
from connectors.simulator import SimConfig, SimulatedNode
from connectors.simulator.subscriptions import DEFAULT_EVENTS_LIMIT, SMALL_EVENT_QUEUE

T0 = 1_780_000_000_000
MINUTE = 60_000
RAW = HistoryOptions(mode="raw", invalid_as_null=False)
Sample = tuple[int, Any, int]


def node_at(
    profile: str = "default", tags: int = 60, period_ms: int | None = None
) -> SimulatedNode:
    config = SimConfig(seed=7, tags=tags, profile=profile, period_ms=period_ms, restart_s=0.0)
    node = SimulatedNode(config)
    node.set_clock(T0)
    return node


def subscribe(node: SimulatedNode, data: Any = None) -> int:
    answer = node.handle("POST", "tag", "subscribe", {}, {"data": data} if data else None)
    assert answer.status == 200, answer.body
    sid: int = orjson.loads(answer.body)["id"]
    return sid


def poll(node: SimulatedNode, sid: int, limit: int | None = None) -> dict[str, Any]:
    params = {"id": str(sid)} | ({"limit": str(limit)} if limit is not None else {})
    answer = node.handle("GET", "tag", "subscriptionEvents", params, None)
    assert answer.status == 200, answer.body
    body: dict[str, Any] = orjson.loads(answer.body)
    return body


def records(node: SimulatedNode) -> dict[int, dict[str, Any]]:
    answer = node.handle("GET", "tag", "subscriptions", {}, None)
    return {record["id"]: record for record in orjson.loads(answer.body)}


def samples_of(events: list[dict[str, Any]]) -> dict[str, list[Sample]]:
    """The samples of the sample events (status null), per tag, in event order."""
    found: dict[str, list[Sample]] = {}
    for event in events:
        if event["type"] == "tag" and event["status"] is None:
            data = event["data"]
            found.setdefault(event["tag"], []).append((data["ts"], data["value"], data["quality"]))
    return found


def history(node: SimulatedNode, path: str, after_ms: int, until_ms: int) -> list[Sample]:
    """A raw history query (invalidAsNull false) of the samples with after < ts <= until."""
    rows = node.ground_truth(path, after_ms + 1, until_ms + 1, RAW)
    return [(row[0], row[1], row[2]) for row in rows]


def expected(node: SimulatedNode, after_ms: int, until_ms: int) -> dict[str, list[Sample]]:
    """What history shows at `until` and did not at `after`, per tag (a tag over the link
    shows its samples `lag` late)."""
    found = {}
    for spec in node.tree().specs:
        lag = spec.remote_lag_ms
        rows = history(node, spec.path, after_ms - lag, until_ms - lag)
        if rows:
            found[spec.path] = rows
    return found


def poll_over(node: SimulatedNode, sid: int, steps: list[int]) -> list[dict[str, Any]]:
    """The events of polls with the clock set to each of `steps` in turn."""
    events: list[dict[str, Any]] = []
    for at in steps:
        node.set_clock(at)
        answer = poll(node, sid)
        assert answer["discardedEvents"] == 0
        assert answer["remainingEvents"] == 0
        events += answer["events"]
    return events


def test_events_are_a_raw_history_query_of_the_same_range_row_for_row() -> None:
    node = node_at()
    sid = subscribe(node)
    end = T0 + 20 * MINUTE
    steps = [T0 + 1, T0 + 999, T0 + 61_234, T0 + 7 * MINUTE, T0 + 7 * MINUTE, end]
    got = samples_of(poll_over(node, sid, steps))
    want = expected(node, T0, end)
    assert got == want
    specs = [node.tree().by_path[path] for path in want]
    # The comparison covers every kind of sample the closed form makes.
    assert any(spec.irregular for spec in specs)
    assert any(spec.remote_lag_ms for spec in specs)
    assert any(len(rows) != len({ts for ts, _, _ in rows}) for rows in want.values())
    qualities = {quality for rows in want.values() for _, _, quality in rows}
    assert {0, 64, 192} <= qualities
    assert {type(v) for rows in want.values() for _, v, _ in rows} >= {float, bool, str}


def test_events_of_one_poll_are_in_time_order() -> None:
    node = node_at()
    sid = subscribe(node)
    node.set_clock(T0 + 5 * MINUTE)
    stamps = [event["data"]["ts"] for event in poll(node, sid)["events"]]
    assert len(stamps) > 100
    assert stamps == sorted(stamps)


def test_the_first_poll_starts_at_subscribe_time_and_nothing_is_sent_twice() -> None:
    node = node_at()
    node.set_clock(T0 + MINUTE)
    sid = subscribe(node)
    assert poll(node, sid)["events"] == []
    node.set_clock(T0 + 2 * MINUTE)
    first = samples_of(poll(node, sid)["events"])
    assert first == expected(node, T0 + MINUTE, T0 + 2 * MINUTE)
    assert poll(node, sid)["events"] == []


def test_a_late_sample_arrives_stamped_at_its_origin() -> None:
    node = node_at()
    path = next(s.path for s in node.tree().specs if s.type == "number" and not s.remote_lag_ms)
    sid = subscribe(node)
    node.set_clock(T0 + MINUTE)
    poll(node, sid)
    node.add_late_sample(path, T0 + 30_500, 4242.5)
    events = poll(node, sid)["events"]
    assert [(e["tag"], e["data"]) for e in events] == [
        (path, {"value": 4242.5, "quality": 192, "ts": T0 + 30_500})
    ]
    assert (T0 + 30_500, 4242.5, 192) in history(node, path, T0, T0 + MINUTE)


def test_a_link_flap_is_status_events_and_the_buffer_drains_late() -> None:
    node = node_at()
    remote = {spec.path for spec in node.tree().specs if spec.remote_lag_ms}
    assert remote
    start = T0 + 5 * MINUTE
    node.link.set_outage(start, offline_s=240, drain_s=300)  # drains slower than the lag
    sid = subscribe(node)
    end = start + 10 * MINUTE
    steps = list(range(T0 + 20_000, end + 1, 20_000))
    events = poll_over(node, sid, steps)
    statuses = [(e["tag"], e["status"]) for e in events if e["status"] is not None]
    assert Counter(status["value"] for _, status in statuses) == {0: len(remote), 1: len(remote)}
    assert {tag for tag, _ in statuses} == remote
    assert {status["ts"] for _, status in statuses} == {start, start + 240_000}
    # Every sample exactly once, those of the outage after it, stamped in the past.
    got = {tag: sorted(rows) for tag, rows in samples_of(events).items()}
    assert got == expected(node, T0, end)
    stamps = [e["data"]["ts"] for e in events if e["tag"] in remote and e["status"] is None]
    assert stamps != sorted(stamps)


def test_a_slow_poller_loses_the_oldest_events_and_is_told_exactly_how_many() -> None:
    node = node_at("events-queue-small")
    sid = subscribe(node)
    end = T0 + 10 * MINUTE
    node.set_clock(end)
    made = sorted((ts, path) for path, rows in expected(node, T0, end).items() for ts, _, _ in rows)
    assert len(made) > 3 * SMALL_EVENT_QUEUE
    assert records(node)[sid]["events"] == SMALL_EVENT_QUEUE
    answer = poll(node, sid)
    assert answer["discardedEvents"] == len(made) - SMALL_EVENT_QUEUE
    # The newest kept: every one after the oldest kept stamp (ties there in either order).
    kept = sorted((e["data"]["ts"], e["tag"]) for e in answer["events"])
    cut = kept[0][0]
    assert made[-SMALL_EVENT_QUEUE][0] == cut
    assert set(kept) <= set(made)
    assert {item for item in made if item[0] > cut} <= set(kept)
    assert poll(node, sid)["discardedEvents"] == 0


def test_discards_cumulative_counts_since_the_subscription_began() -> None:
    node = node_at("events-queue-small+discards-cumulative")
    sid = subscribe(node)
    node.set_clock(T0 + 10 * MINUTE)
    lost = poll(node, sid)["discardedEvents"]
    assert lost > 0
    assert poll(node, sid)["discardedEvents"] == lost
    assert records(node)[sid]["discardedEvents"] == lost


def test_limit_caps_an_answer_and_leaves_the_rest_for_the_next() -> None:
    node = node_at()
    sid = subscribe(node)
    node.set_clock(T0 + 2 * MINUTE)
    total = records(node)[sid]["events"]
    first = poll(node, sid, limit=10)
    assert len(first["events"]) == 10
    assert first["remainingEvents"] == total - 10
    rest = poll(node, sid)
    assert rest["remainingEvents"] == 0
    assert samples_of(first["events"] + rest["events"]) == expected(node, T0, T0 + 2 * MINUTE)


def test_a_node_whose_limit_defaults_answers_at_most_500_without_one() -> None:
    node = node_at("events-limit-default")
    sid = subscribe(node)
    node.set_clock(T0 + 5 * MINUTE)
    answer = poll(node, sid)
    assert len(answer["events"]) == DEFAULT_EVENTS_LIMIT
    assert answer["remainingEvents"] > 0
    assert len(poll(node, sid, limit=2000)["events"]) == 2000


def test_an_unordered_node_sends_the_same_events_out_of_time_order() -> None:
    plain, unordered = node_at(), node_at("events-unordered")
    got = []
    for node in (plain, unordered):
        sid = subscribe(node)
        node.set_clock(T0 + 5 * MINUTE)
        got.append(poll(node, sid)["events"])
    stamps = [event["data"]["ts"] for event in got[1]]
    assert stamps != sorted(stamps)
    assert samples_of(got[1]) == samples_of(got[0])  # each tag's own in order


def test_tags_added_and_removed_are_model_events_and_their_samples_follow() -> None:
    node = node_at(tags=20, period_ms=1000)
    sid = subscribe(node)
    node.set_clock(T0 + 10_000)
    new = "/Plant C/New, tag"
    node.add_tag(new, tag_type="number")
    gone = node.tree().specs[0].path
    node.set_clock(T0 + 20_000)
    node.remove_tag(gone)
    node.set_clock(T0 + 30_000)
    events = poll(node, sid)["events"]
    kinds = [event["type"] for event in events]
    assert kinds.count("model") == 2
    added, removed = (i for i, kind in enumerate(kinds) if kind == "model")
    model_paths = {e["fullPath"] for e in events[added]["model"]["tags"].values()}
    assert new in model_paths
    assert gone not in {e["fullPath"] for e in events[removed]["model"]["tags"].values()}
    samples = samples_of(events)
    assert all(ts > T0 + 10_000 for ts, _, _ in samples[new])
    assert samples[new] == history(node, new, T0, T0 + 30_000)
    assert max(ts for ts, _, _ in samples[gone]) <= T0 + 20_000
    assert all(e["tag"] != gone for e in events[removed:] if e["type"] == "tag")


def test_a_restart_loses_every_subscription_and_polling_one_is_404() -> None:
    node = node_at()
    sid = subscribe(node, {"flow": "f"})
    assert node.handle("POST", "system", "restartService", {}, None).status == 200
    assert records(node) == {}
    answer = node.handle("GET", "tag", "subscriptionEvents", {"id": str(sid)}, None)
    assert answer.status == 404
    assert orjson.loads(answer.body) == {"error": f"subscription {sid} not found"}


def test_a_node_may_keep_its_subscriptions_across_a_restart() -> None:
    node = node_at("subscriptions-survive-restart")
    sid = subscribe(node, {"flow": "f"})
    node.handle("POST", "system", "restartService", {}, None)
    assert records(node)[sid]["data"] == {"flow": "f"}
    node.set_clock(T0 + MINUTE)
    assert samples_of(poll(node, sid)["events"]) == expected(node, T0, T0 + MINUTE)


def test_subscriptions_share_the_samples_and_each_starts_when_it_subscribed() -> None:
    node = node_at()
    first = subscribe(node)
    node.set_clock(T0 + MINUTE)
    second = subscribe(node, {"n": 2})
    node.set_clock(T0 + 2 * MINUTE)
    assert samples_of(poll(node, first)["events"]) == expected(node, T0, T0 + 2 * MINUTE)
    assert samples_of(poll(node, second)["events"]) == expected(node, T0 + MINUTE, T0 + 2 * MINUTE)


@pytest.mark.parametrize("profile", ["null-without-history", "clock-behind"])
def test_events_follow_the_history_the_profile_shows(profile: str) -> None:
    node = node_at(profile)
    sid = subscribe(node)
    node.set_clock(T0 + 3 * MINUTE)
    now = node.now_ms()
    got = samples_of(poll(node, sid)["events"])
    assert got == expected(node, now - 3 * MINUTE, now)


def test_a_node_may_number_subscriptions_from_1_again_after_a_restart() -> None:
    node = node_at("subscription-ids-reused")
    before = subscribe(node, {"flow": "f", "run": 1})
    node.handle("POST", "system", "restartService", {}, None)
    after = subscribe(node, {"flow": "other"})
    assert after == before  # the old id names another client's subscription now
    assert records(node)[after]["data"] == {"flow": "other"}


def test_polls_and_changes_of_history_from_several_threads_never_deadlock() -> None:
    node = node_at(tags=20, period_ms=1000)
    sid = subscribe(node)
    path = node.tag_paths()[0]
    start = threading.Barrier(3)
    failures: list[BaseException] = []

    def keep(action: Callable[[int], None]) -> None:
        start.wait()
        try:
            for n in range(200):
                action(n)
        except BaseException as exc:  # reported below, not lost in the thread
            failures.append(exc)

    seen: list[dict[str, Any]] = []
    actions: list[Callable[[int], None]] = [
        lambda n: seen.extend(poll(node, sid)["events"]),
        lambda n: node.add_late_sample(path, T0 - 1 - n, float(n)),
        lambda n: node.add_tag(f"/New/tag {n}") if n % 20 == 0 else records(node) and None,
    ]
    threads = [threading.Thread(target=keep, args=(action,)) for action in actions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a lock order deadlocked"
    assert failures == []
    seen += poll(node, sid)["events"]
    late = [e for e in seen if e["type"] == "tag" and e["data"]["ts"] < T0]
    assert sorted(e["data"]["value"] for e in late) == [float(n) for n in range(200)]
    assert sum(e["type"] == "model" for e in seen) == 10


def test_a_model_event_shows_each_tags_current_value_as_a_read_does() -> None:
    node = node_at(tags=120)
    sid = subscribe(node)
    node.add_tag("/Plant C/Added")
    model = next(e["model"] for e in poll(node, sid)["events"] if e["type"] == "model")
    for entry in model["tags"].values():
        path = entry["fullPath"]
        read = orjson.loads(node.handle("GET", "tag", "read", {"path": path}, None).body)
        assert {"data": entry["data"], "status": entry["status"]} in read["tags"].values(), path
