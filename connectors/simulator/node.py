"""The simulated node: its state, its public test API, and request dispatch (no HTTP).

`SimulatedNode.handle(method, resource, cmd, params, body)` answers one request as an
`Answer`; `server.py` puts it on the wire. The resources live in `tags.py`, `alarms.py`,
`subscriptions.py` and `admin.py`. Choices where the spec is silent are listed in
docs/node-behaviour.md.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from connectors.options import AlarmFilter, HistoryOptions
from connectors.simulator import history
from connectors.simulator.admin import Admin
from connectors.simulator.alarms import AlarmQuery, AlarmService, alarm_in_seconds, build_alarms
from connectors.simulator.config import SimConfig
from connectors.simulator.events import Feed, groups_of
from connectors.simulator.faults import Faults, FirstAsks
from connectors.simulator.links import LinkState
from connectors.simulator.protocol import Answer, Handler, RequestError, error_answer, parse_list
from connectors.simulator.subscriptions import QueueRules, Subscriptions
from connectors.simulator.tags import TagService
from connectors.simulator.tagtree import (
    TagSpec,
    TagTree,
    build_tag,
    build_tags,
    tag_paths,
    without_history,
)

# Remote nodes reachable with `options.remoteNode`: same shapes, a different seed.
REMOTE_NODES = ("sim-remote",)
RESOURCES = frozenset(
    [
        "alarm",
        "backup",
        "certificate",
        "module",
        "link",
        "license",
        "log",
        "redundancy",
        "system",
        "tag",
    ]
)
POSTS = frozenset(
    (
        "alarm.ack",
        "backup.create",
        "backup.rename",
        "backup.delete",
        "backup.import",
        "backup.load",
        "certificate.set",
        "certificate.remove",
        "module.start",
        "module.stop",
        "module.restart",
        "module.setConfigData",
        "license.add",
        "license.remove",
        "system.restartService",
        "tag.write",
        "tag.writeMany",
        "tag.subscribe",
        "tag.cancelSubscription",
    )
)


def _trees(config: SimConfig) -> dict[str, TagTree]:
    """The node's own tag tree and those of the remote nodes it reaches, from `config`."""
    repeated = "repeated_names" in config.behaviours
    paths = list(config.tag_paths) if config.tag_paths is not None else None
    own = paths or tag_paths(config.tags, hostile=config.hostile_names, repeated_names=repeated)
    local = build_tags(
        config.seed,
        config.tags,
        config.hostile_names,
        config.period_ms,
        paths=own,
        remote_lag_ms=config.remote_lag_ms,
    )
    trees = {config.node_name: TagTree(config.node_name, local)}
    for offset, name in enumerate(REMOTE_NODES, start=1):
        specs = build_tags(
            config.seed + 1000 * offset,
            config.tags,
            False,
            config.period_ms,
            paths=paths or tag_paths(config.tags, repeated_names=repeated),
            remote_lag_ms=config.remote_lag_ms,
        )
        trees[name] = TagTree(name, specs)
    return trees


class SimulatedNode:
    """A deterministic node (tags, history, alarms, admin resources), all in memory.

    Thread-safe; everything follows from `config.seed`, the clock and what requests
    changed (writes, acknowledgements, backups, late samples, ...).
    """

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self._lock = threading.RLock()
        self._clock_ms: int | None = None
        self._trees = _trees(self.config)
        self._late: dict[tuple[str, str], list[tuple[int, Any, int]]] = {}
        self._late_log: list[tuple[str, int, Any]] = []  # (path, ts, value), as added
        self._births: dict[str, int] = {}  # tags `add_tag` added: when
        self._cache: dict[str, bytes | tuple[bytes, int]] = {}  # body, or (zstd, size)
        self._cache_bytes = 0
        self.faults = Faults()
        # The link the remote tags come through (`link_outage`: it goes down for a while).
        self.link = LinkState(
            self.now_ms(),
            outage=self.behaves("link_outage"),
            online_only=self.behaves("link_online_only"),
        )
        self.first_asks = FirstAsks()  # `errors_in_200`: the questions asked once
        self.requests_served = 0
        # Requests being answered now, and the most at once since start or `reset_peak`:
        # how a test sees that several workers never asked more than a node's limit.
        self.in_flight = 0
        self.peak_in_flight = 0
        self.tags = TagService(self)
        self.feed = Feed(self)
        self.subscriptions = Subscriptions(
            self.tags.model,
            rules=QueueRules.of(self.config.behaviours),
            feed=self.feed,
            clock=self.now_ms,
            full_model=lambda: self.tags.model(limit=None),
        )
        local = self._trees[self.config.node_name].specs
        self.alarms = AlarmService(self, build_alarms(local, self.config.seed))
        self.admin = Admin(self)
        self._handlers: dict[str, Handler] = {
            **self.tags.handlers(),
            **self.subscriptions.handlers(),
            **self.alarms.handlers(),
            **self.admin.handlers(),
        }

    # -- the public test API -----------------------------------------------------------------

    def tag_paths(self) -> list[str]:
        return [spec.path for spec in self.tree().specs]

    def tag_type(self, path: str) -> str:
        """`number`, `boolean` or `string`; KeyError for an unknown path."""
        return self.tree().by_path[path].type

    def set_clock(self, now_ms: int | None) -> None:
        """Freeze the caller's "now" at `now_ms` (None: the wall clock again); the node's
        own clock is that plus its offset (`clock_behind`: 10 minutes behind)."""
        with self._lock:
            self._clock_ms = now_ms
            self._clear_cache()

    def now_ms(self) -> int:
        """The node's clock: what `sys.ts` says and what its samples are stamped up to."""
        clock = self._clock_ms
        caller = clock if clock is not None else time.time_ns() // 1_000_000
        return caller + self.config.clock_offset_ms()

    def alarm_paths(self) -> list[str]:
        return [alarm.path for alarm in self.alarms.alarms]

    def add_late_sample(self, path: str, ts_ms: int, value: Any) -> None:
        """A store-and-forward sample stamped `ts_ms` (in the past), visible from now on
        (in history, and as an event at the next poll of each subscription)."""
        spec = self.tree().by_path[path]
        # The subscriptions' lock before the node's, as a poll takes them.
        with self.subscriptions.exclusive(), self._lock:
            self.subscriptions.catch_up()  # the samples before it come first
            self._late.setdefault((self.config.node_name, spec.path), []).append(
                (ts_ms, value, self.now_ms())
            )
            self._late_log.append((spec.path, ts_ms, value))
            self._clear_cache()

    def late_count(self) -> int:
        """How many late samples `add_late_sample` has added."""
        with self._lock:
            return len(self._late_log)

    def late_since(self, index: int) -> list[tuple[str, int, Any]]:
        """The late samples (path, ts, value) added after the first `index`."""
        with self._lock:
            return self._late_log[index:]

    def add_tag(self, path: str, *, tag_type: str = "number", period_ms: int | None = None) -> None:
        """A new local tag at `path` whose history begins now (on a grid of `period_ms`,
        default the node's `period_ms` or 1 s); subscriptions get a `model` event."""
        with self.subscriptions.exclusive(), self._lock:
            tree = self.tree()
            if path in tree.by_path:
                raise ValueError(f"tag {path!r} exists")
            self.subscriptions.catch_up()
            index = max((spec.index for spec in tree.specs), default=-1) + 1
            period = period_ms or self.config.period_ms or 1000
            spec = build_tag(
                self.config.seed,
                index,
                path,
                period,
                tag_type=tag_type,
                remote_lag_ms=self.config.remote_lag_ms,
            )
            self._births[path] = self.now_ms() + 1  # after every event queued so far
            tree.add(spec)
            self._tree_changed()

    def remove_tag(self, path: str) -> None:
        """Remove the local tag at `path` (KeyError if none); subscriptions get a `model`
        event, and no more of its samples."""
        with self.subscriptions.exclusive(), self._lock:
            tree = self.tree()
            if path not in tree.by_path:
                raise KeyError(path)
            self.subscriptions.catch_up()
            tree.remove(path)
            self._tree_changed()

    def _tree_changed(self) -> None:
        self.feed.tags_changed()
        self._clear_cache()
        self.subscriptions.publish_model()

    def history_start_of(self, spec: TagSpec) -> int:
        """Where a tag's history begins: the node's `history_start_ms`, or when `add_tag`
        added it (its samples on a grid from then)."""
        return self._births.get(spec.path, self.config.history_start_ms)

    def ground_truth(
        self, path: str, start_ms: int, end_ms: int, options: HistoryOptions
    ) -> list[list[Any]]:
        """Exactly the rows the node holds for [start_ms, end_ms): uncapped, in order.

        Every sample, also those a link's buffer still holds (`link`).
        Raw, delta and filter rows have ts < end_ms (the wire's raw answer also holds a
        sample exactly on `end`); aggregated rows are the buckets whose start is in range.
        `limit` is ignored: this is everything there is.
        """
        tree = self.tree(options.remote_node)
        spec = tree.by_path[path]
        rows = self.history_rows(tree, spec, start_ms, end_ms, options, capped=False)
        return [list(row) for row in rows if row[0] < end_ms]

    def behaves(self, behaviour: str) -> bool:
        """Whether this node's profile has `behaviour` (connectors/simulator/profiles.py)."""
        return behaviour in self.config.behaviours

    def alarm_ground_truth(
        self,
        start_ms: int,
        end_ms: int,
        filt: AlarmFilter | None = None,
        path: str = "/",
    ) -> list[dict[str, Any]]:
        """Alarm history events with start_ms <= ts < end_ms (and ts <= now), in ts order."""
        filt = filt or AlarmFilter()
        tree = self.tree(filt.remote_node)
        query = AlarmQuery.of(path, filt)
        events = self.alarms.events(query, start_ms, end_ms - 1, tree.node_name)
        if self.behaves("epoch_seconds"):  # what the node holds is whole seconds
            events = [alarm_in_seconds(event, to_ms=True) for event in events]
        return events

    # -- shared by the resources ---------------------------------------------------------------

    def tree(self, remote: Any = None) -> TagTree:
        """The local tags, or those of `options.remoteNode` (unknown remote node: 404).

        The parameter may be one name, a forward-slash separated route or a JSON array; the
        last node of a route is the one that answers.
        """
        if remote is None or remote == "" or remote == ():
            return self._trees[self.config.node_name]
        names = [remote] if isinstance(remote, str) else [str(n) for n in remote]
        if len(names) == 1 and names[0].startswith("["):
            names = parse_list(names[0])
        route = [part for name in names for part in name.split("/") if part]
        if not route:
            return self._trees[self.config.node_name]
        tree = self._trees.get(route[-1])
        if tree is None:
            raise RequestError(404, f"unknown remote node {route[-1]!r}")
        return tree

    def samples(
        self,
        tree: TagTree,
        spec: TagSpec,
        start_ms: int,
        end_ms: int,
        max_count: int | None = None,
    ) -> history.Samples:
        """The events with start_ms <= ts <= end_ms visible now (at least the first `max_count`)."""
        with self._lock:
            late = tuple(self._late.get((tree.node_name, spec.path), ()))
        return history.generate(
            spec,
            start_ms,
            end_ms,
            history_start_ms=self.history_start_of(spec),
            visible_until_ms=self.now_ms(),
            late=late,
            max_count=max_count,
        )

    def history_rows(
        self,
        tree: TagTree,
        spec: TagSpec,
        start_ms: int,
        end_ms: int,
        options: HistoryOptions,
        *,
        capped: bool,
    ) -> list[tuple[Any, ...]]:
        """The rows of one tag as the wire holds them (raw/delta/filter: bounds inclusive).

        `capped` (the wire): raw answers stop at `options.limit` and at the node's own cap,
        and a node whose raw start bound is exclusive leaves out a sample on `start`. Rows
        are as wide as the node's profile makes them (2, 3 or 4 elements), on the wire and
        in the ground truth alike.
        """
        if capped and tree is self.tree():  # the wire: what the link has delivered
            spec = self.link.shown(spec, self.now_ms())
        if self.behaves("null_without_history") and without_history(spec):
            return []  # no history at all: answers say `data: null` (tags.py)
        rows = self._rows(tree, spec, start_ms, end_ms, options, capped=capped)
        width = self.row_width()
        if width < 4:
            rows = [row[:width] for row in rows]
        return rows

    def row_width(self) -> int:
        """Elements of a history row: 4, or 2 or 3 on nodes whose profile says so."""
        return 2 if self.behaves("rows_2") else 3 if self.behaves("rows_3") else 4

    def _rows(
        self,
        tree: TagTree,
        spec: TagSpec,
        start_ms: int,
        end_ms: int,
        options: HistoryOptions,
        *,
        capped: bool,
    ) -> list[tuple[Any, ...]]:
        mode = options.mode
        if mode == "aggregated":
            with self._lock:
                late = tuple(self._late.get((tree.node_name, spec.path), ()))
            return history.aggregate(
                spec,
                start_ms,
                end_ms,
                options.interval_ms or 60_000,
                options.method or spec.default_method,
                history_start_ms=self.history_start_of(spec),
                visible_until_ms=self.now_ms(),
                late=late,
            )
        if mode == "raw":
            limit = None
            if capped:
                caps = [cap for cap in (options.limit, self.config.node_raw_cap()) if cap]
                limit = min(caps) if caps else None
                if self.behaves("raw_start_exclusive"):
                    start_ms += 1
            samples = self.samples(tree, spec, start_ms, end_ms, max_count=limit)
            invalid_as_null = True if options.invalid_as_null is None else options.invalid_as_null
            return history.raw_rows(samples, invalid_as_null=invalid_as_null, limit=limit)
        samples = self.samples(tree, spec, start_ms, end_ms)
        deadband = float(options.deadband) if options.deadband is not None else spec.deadband
        if mode == "delta":
            return history.delta_rows(samples, deadband)
        return history.filter_rows(samples, deadband)

    def previous_event(
        self, tree: TagTree, spec: TagSpec, before_ms: int
    ) -> tuple[Any, int] | None:
        """(value, quality) of the last visible event stamped before `before_ms`."""
        with self._lock:
            late = tuple(self._late.get((tree.node_name, spec.path), ()))
        if tree is self.tree():
            spec = self.link.shown(spec, self.now_ms())
        return history.previous_event(
            spec,
            before_ms,
            history_start_ms=self.history_start_of(spec),
            visible_until_ms=self.now_ms(),
            late=late,
        )

    def last_sample(self, spec: TagSpec) -> tuple[Any, int, int]:
        """(value, quality, ts) of the last visible sample of the last hour."""
        now = self.now_ms()
        samples = self.samples(self.tree(), spec, now - 3_600_000, now)
        if not len(samples):
            return None, 0, now
        return samples.value(-1), int(samples.quality[-1]), int(samples.ts[-1])

    def last_samples(self, specs: Sequence[TagSpec]) -> dict[str, tuple[Any, int, int]]:
        """`last_sample` of many tags at once, for those whose last 60 periods hold a
        sample (`history.generate_many`); the others (in a gap, or with late samples) are
        left out, for the caller to ask `last_sample`."""
        now = self.now_ms()
        with self._lock:
            late = {path for _, path in self._late}
        chosen = [spec for spec in specs if spec.path not in late]
        found: dict[str, tuple[Any, int, int]] = {}
        for group in groups_of(chosen, False, self.history_start_of):
            upper = now - group.lag_ms
            lower = max(upper - 60 * group.tags.period_ms, now - 3_600_000)
            start = group.history_start_ms
            rows, samples = history.generate_many(group.tags, lower, upper, history_start_ms=start)
            if not len(rows):
                continue
            last = np.flatnonzero(np.append(rows[1:] != rows[:-1], True))
            for row, value, quality, ts in zip(
                rows[last].tolist(),
                samples.pick(last),
                samples.quality[last].tolist(),
                samples.ts[last].tolist(),
                strict=True,
            ):
                found[group.paths[row]] = (value, quality, ts)
        return found

    # -- dispatch ----------------------------------------------------------------------------

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Count one request in flight while it is answered (`in_flight`, `peak_in_flight`)."""
        with self._lock:
            self.requests_served += 1
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            yield
        finally:
            with self._lock:
                self.in_flight -= 1

    def reset_peak(self) -> None:
        """Start counting the peak of concurrent requests again from those in flight now."""
        with self._lock:
            self.peak_in_flight = self.in_flight

    def request_stats(self) -> dict[str, int]:
        """Requests served, in flight now, and the most in flight at once."""
        with self._lock:
            return {
                "served": self.requests_served,
                "inFlight": self.in_flight,
                "peakInFlight": self.peak_in_flight,
            }

    def handle(
        self, method: str, resource: str, cmd: str, params: Mapping[str, Any], body: Any
    ) -> Answer:
        """Answer one request (already authenticated); errors become `{"error": ...}`."""
        operation = f"{resource}.{cmd}"
        refused = self._refusal(method, resource, cmd, body)
        if refused is not None:
            return refused
        source = (body or {}) if operation in POSTS else params
        if self._errs_first(operation, source):
            return error_answer(200, f"{operation} could not be served now, try again")
        try:
            return self._handlers[operation](source)
        except RequestError as exc:
            status = 200 if self.behaves("errors_in_200") else exc.status
            return error_answer(status, str(exc))
        except Exception as exc:  # a simulator bug: say so, as a node would, with a 500
            traceback.print_exc()
            return error_answer(500, f"internal error in {operation}: {type(exc).__name__}")

    def _refusal(self, method: str, resource: str, cmd: str, body: Any) -> Answer | None:
        """The answer to a request this node does not serve as asked (None: it serves it)."""
        if self.admin.process.restarting():
            return Answer(503, b'{"error":"service restarting"}', headers={"Retry-After": "1"})
        operation = f"{resource}.{cmd}"
        if operation == "tag.getViews" and self.behaves("no_views"):
            return error_answer(404, "unknown command 'getViews' for resource tag")
        if operation not in self._handlers:
            if resource in RESOURCES:
                return error_answer(400, f"unknown command {cmd!r} for resource {resource}")
            return error_answer(404, f"unknown resource {resource!r}")
        expected = "POST" if operation in POSTS else "GET"
        if method != expected:
            return error_answer(405, f"{operation} takes {expected}")
        if expected == "POST" and body is not None and not isinstance(body, dict):
            return error_answer(400, "the body is not a JSON object")
        return None

    def _errs_first(self, operation: str, params: Mapping[str, Any]) -> bool:
        """`errors_in_200`: is this the first ask of the question (answered with an error)?"""
        return self.behaves("errors_in_200") and self.first_asks.first(operation, params)

    def cached(self, key: str, produce: Callable[[], Answer]) -> Answer:
        """Replay mode (`cache_answers`): a history or details answer rendered once per query.

        Its bytes are kept once (zstd-compressed with `cache_compress`; a second render
        of the same query, made while the first was under way, is dropped) while the
        answers kept fit in `cache_limit_bytes`; past that, answers are rendered each
        time and the ones kept stay (a benchmark that repeats more than fits is still
        served from memory as far as it goes, instead of evicting what it asks next).
        """
        if not self.config.cache_answers or self.behaves("flaky_tags") or self.link.outage:
            # a flaky node answers a question differently the second time; a link's
            # outage changes what history holds as time passes
            return produce()
        if self.behaves("errors_in_200"):
            return produce()  # its errors are 200s: none may be replayed as an answer
        with self._lock:
            kept = self._cache.get(key)
        if kept is not None:
            return Answer(body=self._unpack(kept))
        answer = produce()
        if answer.status != 200 or answer.headers or answer.content_type != "application/json":
            return answer
        body = answer.body
        packed: bytes | tuple[bytes, int] = body
        if self.config.cache_compress:
            packed = (self._codec().compress(body, asbytes=True), len(body))
        size = len(packed[0]) if isinstance(packed, tuple) else len(packed)
        with self._lock:
            if key not in self._cache and self._cache_bytes + size <= self.config.cache_limit_bytes:
                self._cache[key] = packed
                self._cache_bytes += size
        return answer

    @staticmethod
    def _codec() -> Any:
        import pyarrow as pa  # only replay mode with compression needs it

        return pa.Codec("zstd", compression_level=1)

    def _unpack(self, kept: bytes | tuple[bytes, int]) -> bytes:
        if isinstance(kept, bytes):
            return kept
        body: bytes = self._codec().decompress(kept[0], decompressed_size=kept[1], asbytes=True)
        return body

    def cache_stats(self) -> tuple[int, int]:
        """(answers, bytes held) by replay mode (compressed sizes with `cache_compress`)."""
        with self._lock:
            return len(self._cache), self._cache_bytes

    def forget_answers(self) -> None:
        """Drop the answers replay mode holds (something they show has changed)."""
        self._clear_cache()

    def _clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()
            self._cache_bytes = 0
