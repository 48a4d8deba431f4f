"""Optimistic commits of the table formats, tried again when another writer won the race.

Delta Lake and Iceberg commit a new table version only if nobody else committed since
the version a write was planned on (Delta: a conditional put of the next log entry;
Iceberg: the catalog's compare-and-swap of the metadata location). Writers of disjoint
scopes of one dataset in several processes therefore lose a race now and then: the
loser plans again on the new version and commits, which replaces exactly its scope, so
nothing is lost and nothing is doubled.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

_JITTER = random.Random()  # not the global generator, which callers may be drawing from

T = TypeVar("T")

# Enough for tens of writers committing to one table at once; each try re-plans.
COMMIT_ATTEMPTS = 50


def retry_conflicts(
    commit: Callable[[], T], conflict: Callable[[BaseException], bool], *, attempts: int = 0
) -> T:
    """`commit()`, called again (after a short jittered pause) while it fails with an
    exception `conflict` says is a lost race; the last failure is raised as it is."""
    tries = attempts or COMMIT_ATTEMPTS
    delay = 0.02
    for attempt in range(1, tries + 1):
        try:
            return commit()
        except Exception as exc:
            if attempt == tries or not conflict(exc):
                raise
        time.sleep(delay * _JITTER.uniform(0.5, 1.5))
        delay = min(delay * 1.5, 1.0)
    raise AssertionError("unreachable")
