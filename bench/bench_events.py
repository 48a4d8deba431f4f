"""How fast live events are made by the simulator and read by the client.

The simulator's clock is stepped (`set_clock`), never waited for, so a case measures the
work of a stretch of node time, not the stretch itself: "x real time" is node seconds
made (or read) per wall second on one core. Medians of `--repeat` after one warm-up; the
machine is shared, so compare numbers from one run only (`uptime` is printed).

* produce   10,000 tags x 1 Hz (`period_ms=1000`), one poll per `--poll-s` node seconds:
            `subscriptionEvents` answered in process (the feed, the queue and the JSON),
            beside the local tags' samples made tag by tag with `history.generate` (what a feed
            without `generate_many` would cost, before any JSON)
* parse     one answer of 10,000 events read three ways: orjson alone (the floor),
            `parse_events` (pydantic models), `parse_events_page` (the rows a history run
            writes, as Arrow)
* loopback  the same polls over HTTP on 127.0.0.1 with `NodeSubscriptions.poll`: a
            tail's whole cost per poll, node and client together

    .venv/bin/python bench/bench_events.py [--cases produce,parse,loopback] [--poll-s 1,5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import orjson

from connectors.client import NodeClient
from connectors.normalise.events import parse_events_page
from connectors.settings import NodeSettings
from connectors.simulator import SimConfig, SimulatedNode, history, run_server
from connectors.subscriptions import NodeSubscriptions, parse_events

T0 = 1_780_000_000_000
TAGS = 10_000


def _node() -> tuple[SimulatedNode, int]:
    node = SimulatedNode(SimConfig(seed=5, tags=TAGS, period_ms=1000))
    node.set_clock(T0)
    answer = node.handle("POST", "tag", "subscribe", {}, None)
    return node, orjson.loads(answer.body)["id"]


def _median(run: Callable[[], int], repeat: int) -> tuple[float, int]:
    """(median seconds, events of the last run) of `repeat` timed runs after a warm-up."""
    run()
    times, events = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        events = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), events


def _line(name: str, seconds: float, events: int, node_s: float) -> None:
    print(
        f"  {name:<34} {seconds * 1000:9.1f} ms  {events:>7} events  "
        f"{events / seconds:>11,.0f} events/s  {node_s / seconds:7.1f}x real time"
    )


class _Clock:
    """The node's clock, moved `step_s` at each poll."""

    def __init__(self, node: SimulatedNode, step_s: int) -> None:
        self.node, self.step_ms, self.now = node, step_s * 1000, T0

    def step(self) -> int:
        self.now += self.step_ms
        self.node.set_clock(self.now)
        return self.now


def _poll_in_process(clock: _Clock, sid: int) -> int:
    clock.step()
    answer = clock.node.handle("GET", "tag", "subscriptionEvents", {"id": str(sid)}, None)
    return len(orjson.loads(answer.body)["events"])


def _tag_by_tag(clock: _Clock) -> int:
    """The same samples made one `history.generate` call per tag (no JSON, no queue)."""
    now = clock.step()
    node = clock.node
    start = node.config.history_start_ms
    return sum(
        len(
            history.generate(
                spec, now - clock.step_ms + 1, now, history_start_ms=start, visible_until_ms=now
            ).values
        )
        for spec in node.tree().specs
    )


def case_produce(poll_s: list[int], repeat: int) -> None:
    print(f"produce: {TAGS:,} tags x 1 Hz, in process")
    for step_s in poll_s:
        node, sid = _node()
        clock = _Clock(node, step_s)
        seconds, events = _median(partial(_poll_in_process, clock, sid), repeat)
        _line(f"feed, a poll every {step_s} s", seconds, events, step_s)
        seconds, events = _median(partial(_tag_by_tag, clock), max(1, repeat // 3))
        _line(f"tag by tag, {step_s} s (no JSON)", seconds, events, step_s)


def _answer(events: int) -> bytes:
    node, sid = _node()
    node.set_clock(T0 + 1000 * (events // TAGS + 1))
    params = {"id": str(sid), "limit": str(events)}
    return node.handle("GET", "tag", "subscriptionEvents", params, None).body


def case_parse(repeat: int) -> None:
    body = _answer(10_000)
    count = len(orjson.loads(body)["events"])
    types = {f"/t{i}": "number" for i in range(10)}
    print(f"parse: one answer of {count:,} events, {len(body) / 1e6:.1f} MB")
    readers: dict[str, Callable[[], int]] = {
        "orjson.loads (floor)": lambda: len(orjson.loads(body)["events"]),
        "parse_events (pydantic models)": lambda: len(parse_events(orjson.loads(body)).events),
        "parse_events_page (Arrow rows)": lambda: (
            parse_events_page(body, "n", types=types).rows.num_rows
        ),
    }
    results = {name: _median(read, repeat) for name, read in readers.items()}
    floor = results["orjson.loads (floor)"][0]
    for name, (seconds, events) in results.items():
        _line(name, seconds, events, 1.0 * events / TAGS)
        print(f"  {'':<34} {seconds / floor:9.2f}x the floor")


def _poll_over_http(clock: _Clock, live: NodeSubscriptions, sid: int) -> int:
    clock.step()
    return int(live.poll(sid, limit=200_000, node="bench").rows.num_rows)


def case_loopback(poll_s: list[int], repeat: int) -> None:
    print(f"loopback: {TAGS:,} tags x 1 Hz, NodeSubscriptions.poll over HTTP")
    for step_s in poll_s:
        node = SimulatedNode(SimConfig(seed=5, tags=TAGS, period_ms=1000))
        node.set_clock(T0)
        with run_server(node, https_port=None) as server:
            settings = NodeSettings(url=server.http_url, name="bench")
            with NodeClient(settings) as client:
                live = NodeSubscriptions(client)
                with live.subscribed({"bench": "events"}) as subscription:
                    poll = partial(_poll_over_http, _Clock(node, step_s), live, subscription.id)
                    seconds, events = _median(poll, repeat)
                _line(f"poll every {step_s} s", seconds, events, step_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", default="produce,parse,loopback")
    parser.add_argument("--poll-s", default="1,5")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    poll_s = [int(part) for part in args.poll_s.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}, {os.cpu_count()} cores")
    cases = args.cases.split(",")
    if "produce" in cases:
        case_produce(poll_s, args.repeat)
    if "parse" in cases:
        case_parse(args.repeat)
    if "loopback" in cases:
        case_loopback(poll_s, args.repeat)


if __name__ == "__main__":
    main()
