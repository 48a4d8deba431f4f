"""Fault switches: error statuses, 429, resets, truncated or non-JSON bodies, slow answers.

`truncate` cuts the body short of its Content-Length (a broken transfer), `nonjson`
answers a proxy's HTML page with 200, `cutjson` answers the first half of the node's
JSON with a Content-Length that matches it (the node's own answer, malformed).

Decisions come from a seeded random generator, so a test with a fixed seed sees the same
faults in the same order of requests.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

KINDS = ("500", "502", "503", "504", "429", "reset", "truncate", "nonjson", "cutjson", "slow")


class Faults:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rate = 0.0
        self.kinds: tuple[str, ...] = ()
        self.operations: frozenset[str] | None = None
        self.retry_after_s = 0.05
        self.slow_s = 2.0
        self._random = random.Random(0)
        self._queue: list[tuple[str, frozenset[str] | None]] = []
        self.injected: Counter[str] = Counter()

    def configure(
        self,
        *,
        rate: float,
        kinds: Sequence[str],
        seed: int = 0,
        retry_after_s: float = 0.05,
        slow_s: float = 2.0,
        operations: Sequence[str] | None = None,
    ) -> None:
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        with self._lock:
            self.rate = rate
            self.kinds = tuple(kinds)
            self._random = random.Random(seed)
            self.retry_after_s = retry_after_s
            self.slow_s = slow_s
            self.operations = frozenset(operations) if operations is not None else None

    def fail_next(self, kind: str, count: int = 1, operations: Sequence[str] | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        with self._lock:
            scope = frozenset(operations) if operations is not None else None
            self._queue.extend([(kind, scope)] * count)

    def clear(self) -> None:
        with self._lock:
            self.rate = 0.0
            self.kinds = ()
            self._queue.clear()

    def decide(self, operation: str) -> str | None:
        """The fault to inject into this request, if any."""
        with self._lock:
            for index, (kind, scope) in enumerate(self._queue):
                if scope is None or operation in scope:
                    del self._queue[index]
                    self.injected[kind] += 1
                    return kind
            if not self.kinds or self.rate <= 0:
                return None
            if self.operations is not None and operation not in self.operations:
                return None
            if self._random.random() >= self.rate:
                return None
            kind = self._random.choice(self.kinds)
            self.injected[kind] += 1
            return kind


class FirstAsks:
    """The questions asked so far (operation and parameters): an `errors_in_200` node
    answers the first ask of each with `200 {"error": ...}` and the next one truly, so a
    client that asks again gets every answer and one that does not gets none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[bytes] = set()

    def first(self, operation: str, params: Mapping[str, Any]) -> bool:
        """Whether this is the first time this question is asked (and remember it)."""
        key = operation.encode() + orjson.dumps(
            dict(params), option=orjson.OPT_SORT_KEYS, default=str
        )
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True
